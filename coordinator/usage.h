// The kvmesh command line's usage text: printed on stdout for `kvmesh help`, `--help` or `-h`
// (after the command too: `kvmesh run --help`), on stderr when no command is given.
#pragma once

namespace kvmesh::coordinator {

extern const char kUsage[];

// Prints kUsage on stdout (the answer to a request for help); returns 0, the exit status.
int PrintHelp();

}  // namespace kvmesh::coordinator
