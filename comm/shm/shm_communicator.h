// Intra-node fast path for a tensor-parallel group: small fp32 all-reduces and gathers go
// through one shared-memory segment instead of the MPI library; everything else is delegated to
// the communicator it wraps.
//
// Why: a decode step of SmolLM2 at tp = 2 runs 60 all-reduces of 576 floats. Through OpenMPI's
// shared-memory transport each costs ~1.5 us inside the forward pass (the bytes go through
// MPI's FIFOs, which the matrix work has pushed out of cache) against 0.55 us in a hot loop.
// Here a rank writes its values into its own slot, publishes a sequence number, waits for every
// peer's number and adds the slots in rank order, so every rank gets the same bits.
//
// Slots are double-buffered: a rank can only start call k + 2 after every peer has published
// call k + 1, which they do only after they finished reading call k. Waiting spins briefly, then
// yields the CPU (ranks may share cores), and checks that the peers' processes are alive, so a
// lost rank is an Unavailable error naming it, not a hang.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace kvmesh::comm {

// Collective over `group` (every rank calls it). FailedPrecondition if the ranks are not all on
// this machine (the caller keeps using `group` then). `group` must outlive the result.
absl::StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(Communicator& group);

}  // namespace kvmesh::comm
