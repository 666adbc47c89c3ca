// The MPI backend of Communicator (host memory), and the process-wide MPI runtime.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace kvmesh::comm {

// Initialises MPI (MPI_THREAD_FUNNELED) on creation and finalises it on destruction. One per
// process. Errors on MPI_COMM_WORLD return codes instead of aborting, so failures become
// statuses.
class MpiRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<MpiRuntime>> Init(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // True when this process was started by an MPI launcher (mpirun / srun) with more than one
  // rank; single-process runs do not need MPI at all.
  static bool LaunchedWithMultipleRanks();

 private:
  MpiRuntime() = default;
  int rank_ = 0, size_ = 1;
};

// A communicator over the world ranks with the same `color`, ordered by `key` (MPI_Comm_split).
// Collective over the world: every rank must call it.
absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(int color, int key);

}  // namespace kvmesh::comm
