// A fixed group of ranks running collectives on host memory.
//
// Backends: "self" (one rank; collectives are identities), MPI (comm/mpi/); NCCL arrives with
// the CUDA backend. Thread-compatible: one thread drives a communicator. Every call blocks until
// the collective is complete on this rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"

namespace kvmesh::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks.
  virtual absl::Status AllReduceSum(std::span<float> buf) = 0;
  // Copies root's bytes into every rank's buf (same length everywhere).
  virtual absl::Status Broadcast(std::span<uint8_t> buf, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // Point to point (pipeline stages): blocks until `buf` is sent / filled. `tag` separates
  // streams; a Recv must match the Send's length.
  virtual absl::Status Send(std::span<const float> buf, int dst, int tag) = 0;
  virtual absl::Status Recv(std::span<float> buf, int src, int tag) = 0;
  // The root receives every rank's `mine` concatenated in rank order into `all`; counts[r] is
  // rank r's length and must be the same list on every rank. `all` is unused on other ranks.
  virtual absl::Status GatherV(std::span<const float> mine, std::span<float> all,
                               std::span<const int> counts, int root) = 0;
};

// The one-rank communicator used by the single-process engine.
std::unique_ptr<Communicator> CreateSelfCommunicator();

}  // namespace kvmesh::comm
