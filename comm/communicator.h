// A fixed group of ranks running collectives on host memory.
//
// Backends: "self" (one rank; collectives are identities), MPI (comm/mpi/), NCCL (comm/nccl/,
// device memory). Thread-compatible: one thread drives a communicator. Every call blocks until
// the collective is complete on this rank, except RecvAsync, which posts a receive to be waited
// for later (pipeline stages keep a step's logits receive open while they compute the next).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvmesh::comm {

// 16-bit floating-point element formats of AllReduceSum (raw bits in uint16_t).
enum class HalfType { kF16, kBF16 };

// A receive posted by RecvAsync. Wait() blocks until the buffer is filled (OK) or the peer is
// gone; destroying an unwaited receive cancels it (MPI) or waits for it (NCCL, which cannot
// cancel).
class PendingRecv {
 public:
  virtual ~PendingRecv() = default;
  virtual absl::Status Wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over all ranks.
  virtual absl::Status AllReduceSum(std::span<float> buf) = 0;
  // In-place sum of IEEE binary16 or bfloat16 values (half the bytes of fp32). Partial sums
  // are added in fp32 and rounded to the 16-bit format after each addition (MPI) or as NCCL
  // does; exact while every partial sum is representable.
  virtual absl::Status AllReduceSum(std::span<uint16_t> buf, HalfType type) = 0;
  // Copies root's bytes into every rank's buf (same length everywhere).
  virtual absl::Status Broadcast(std::span<uint8_t> buf, int root) = 0;
  // Broadcast and Recv for a message that may be long in coming (a follower waiting for the
  // leader's next step): they poll as the blocking calls do for a moment, then sleep between
  // polls, so an idle rank does not hold a core. At most ~1 ms later than the blocking calls
  // once the wait has lasted 50 ms; the same otherwise. Every rank of a broadcast must call the
  // same one: MPI does not match a nonblocking collective with a blocking one.
  virtual absl::Status BroadcastPatiently(std::span<uint8_t> buf, int root) {
    return Broadcast(buf, root);
  }
  virtual absl::Status RecvPatiently(std::span<float> buf, int src, int tag) {
    return Recv(buf, src, tag);
  }
  virtual absl::Status Barrier() = 0;
  // Point to point (pipeline stages): blocks until `buf` is sent / filled. `tag` separates
  // streams; a Recv must match the Send's length.
  virtual absl::Status Send(std::span<const float> buf, int dst, int tag) = 0;
  virtual absl::Status Recv(std::span<float> buf, int src, int tag) = 0;
  // Posts a receive and returns at once; `buf` must stay valid until Wait() returns. Receives
  // from one peer and tag match its sends in order.
  virtual absl::StatusOr<std::unique_ptr<PendingRecv>> RecvAsync(std::span<float> buf, int src,
                                                                 int tag) = 0;
  // Every rank receives every rank's `mine` (the same length everywhere) concatenated in rank
  // order into `all` (size() x mine.size()).
  virtual absl::Status AllGather(std::span<const float> mine, std::span<float> all) = 0;
  // The root receives every rank's `mine` concatenated in rank order into `all`; counts[r] is
  // rank r's length and must be the same list on every rank. `all` is unused on other ranks.
  virtual absl::Status GatherV(std::span<const float> mine, std::span<float> all,
                               std::span<const int> counts, int root) = 0;
};

// The one-rank communicator used by the single-process engine.
std::unique_ptr<Communicator> CreateSelfCommunicator();

}  // namespace kvmesh::comm
