// `kvmesh serve`: the OpenAI-compatible HTTP server on rank 0, workers on the other ranks.
#pragma once

namespace kvmesh::coordinator {

// Runs until SIGTERM/SIGINT, then stops accepting, finishes (or after 25 s cancels) the requests
// in flight and exits 0 on every rank. Returns the process exit code.
int Serve(int argc, char** argv);

}  // namespace kvmesh::coordinator
