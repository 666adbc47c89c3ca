// The kvmesh command-line interface: `kvmesh run | tokenize | logits | model pull`.
// Results go to stdout, diagnostics to stderr; returns the process exit code.
#pragma once

namespace kvmesh::coordinator {

int CliMain(int argc, char** argv);

}  // namespace kvmesh::coordinator
