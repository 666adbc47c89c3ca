// The NCCL backend of Communicator: buffers are device memory (a std::span over a device
// pointer). Each call is enqueued on the communicator's own CUDA stream and waited for before
// it returns, so the blocking contract of Communicator holds; overlapping with compute is for
// the CUDA backend's stream-ordered API, later.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace kvmesh::comm {

// Collective over `bootstrap` (every rank calls it): rank 0 creates the NCCL unique id and
// broadcasts it over `bootstrap` (MPI); each rank then joins on CUDA device `device`.
// Unavailable if CUDA or NCCL fail (no device, driver mismatch); the message names the call.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                                     int device);

}  // namespace kvmesh::comm
