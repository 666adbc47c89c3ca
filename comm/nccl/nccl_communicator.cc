#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "util/str_cat.h"

// Convert CUDA and NCCL return codes once, at the call, naming the expression and place.
#define KVMESH_CUDA_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                             \
    const cudaError_t kvmesh_cuda_rc = (expr);                                                     \
    if (kvmesh_cuda_rc != cudaSuccess) {                                                           \
      return absl::UnavailableError(::kvmesh::StrCat("CUDA error in ", #expr, " (", __FILE__, ":", \
                                                     __LINE__,                                     \
                                                     "): ", cudaGetErrorString(kvmesh_cuda_rc)));  \
    }                                                                                              \
  } while (0)

#define KVMESH_NCCL_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                             \
    const ncclResult_t kvmesh_nccl_rc = (expr);                                                    \
    if (kvmesh_nccl_rc != ncclSuccess) {                                                           \
      return absl::UnavailableError(::kvmesh::StrCat("NCCL error in ", #expr, " (", __FILE__, ":", \
                                                     __LINE__,                                     \
                                                     "): ", ncclGetErrorString(kvmesh_nccl_rc)));  \
    }                                                                                              \
  } while (0)

namespace kvmesh::comm {
namespace {

// Move-only owners of the C handles.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t c) : c_(c) {}
  NcclComm(NcclComm&& o) noexcept : c_(o.c_) { o.c_ = nullptr; }
  NcclComm& operator=(NcclComm&& o) noexcept {
    std::swap(c_, o.c_);
    return *this;
  }
  ~NcclComm() {
    if (c_ != nullptr) ncclCommDestroy(c_);
  }
  ncclComm_t get() const { return c_; }

 private:
  ncclComm_t c_ = nullptr;
};

class CudaStream {
 public:
  CudaStream() = default;
  explicit CudaStream(cudaStream_t s) : s_(s) {}
  CudaStream(CudaStream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  CudaStream& operator=(CudaStream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~CudaStream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// A receive enqueued on the stream, marked by an event. NCCL cannot cancel an enqueued
// receive: dropping an unwaited one waits for it, so it never writes into a freed buffer.
class NcclPendingRecv final : public PendingRecv {
 public:
  explicit NcclPendingRecv(cudaEvent_t done) : done_(done) {}
  ~NcclPendingRecv() override {
    if (!waited_) cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  absl::Status Wait() override {
    waited_ = true;
    KVMESH_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_));
    return absl::OkStatus();
  }

 private:
  cudaEvent_t done_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(NcclComm comm, CudaStream stream, int rank, int size, int device)
      : comm_(std::move(comm)),
        stream_(std::move(stream)),
        rank_(rank),
        size_(size),
        device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(std::span<float> buf) override {
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32,
                                              ncclSum, comm_.get(), stream_.get()));
    return Wait();
  }
  absl::Status AllReduceSum(std::span<uint16_t> buf, HalfType type) override {
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(ncclAllReduce(buf.data(), buf.data(), buf.size(),
                                              type == HalfType::kF16 ? ncclFloat16 : ncclBfloat16,
                                              ncclSum, comm_.get(), stream_.get()));
    return Wait();
  }
  absl::Status Broadcast(std::span<uint8_t> buf, int root) override {
    if (root < 0 || root >= size_)
      return absl::InvalidArgumentError(
          StrCat("broadcast root ", root, " outside a ", size_, "-rank group"));
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(ncclBroadcast(buf.data(), buf.data(), buf.size(), ncclUint8, root,
                                              comm_.get(), stream_.get()));
    return Wait();
  }
  absl::Status Barrier() override {
    float* one = nullptr;
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_CUDA_RETURN_IF_ERROR(
        cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_.get()));
    const ncclResult_t rc =
        ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_.get(), stream_.get());
    cudaFreeAsync(one, stream_.get());
    KVMESH_NCCL_RETURN_IF_ERROR(rc);
    return Wait();
  }
  absl::Status Send(std::span<const float> buf, int dst, int) override {
    if (dst < 0 || dst >= size_ || dst == rank_)
      return absl::InvalidArgumentError(StrCat("send: bad peer ", dst));
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(
        ncclSend(buf.data(), buf.size(), ncclFloat32, dst, comm_.get(), stream_.get()));
    return Wait();
  }
  absl::Status Recv(std::span<float> buf, int src, int) override {
    if (src < 0 || src >= size_ || src == rank_)
      return absl::InvalidArgumentError(StrCat("recv: bad peer ", src));
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(
        ncclRecv(buf.data(), buf.size(), ncclFloat32, src, comm_.get(), stream_.get()));
    return Wait();
  }
  // Enqueued on the communicator's stream: later calls on this communicator run after it.
  absl::StatusOr<std::unique_ptr<PendingRecv>> RecvAsync(std::span<float> buf, int src,
                                                         int) override {
    if (src < 0 || src >= size_ || src == rank_)
      return absl::InvalidArgumentError(StrCat("recv: bad peer ", src));
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(
        ncclRecv(buf.data(), buf.size(), ncclFloat32, src, comm_.get(), stream_.get()));
    cudaEvent_t done = nullptr;
    KVMESH_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    if (const cudaError_t e = cudaEventRecord(done, stream_.get()); e != cudaSuccess) {
      cudaEventDestroy(done);
      KVMESH_CUDA_RETURN_IF_ERROR(e);
    }
    return std::unique_ptr<PendingRecv>(new NcclPendingRecv(done));
  }
  absl::Status AllGather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() < mine.size() * size_) {
      return absl::InvalidArgumentError("all-gather: receive buffer too small");
    }
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(ncclAllGather(mine.data(), all.data(), mine.size(), ncclFloat32,
                                              comm_.get(), stream_.get()));
    return Wait();
  }
  // NCCL has no gatherv: the root posts one receive per peer inside a group.
  absl::Status GatherV(std::span<const float> mine, std::span<float> all,
                       std::span<const int> counts, int root) override {
    if (static_cast<int>(counts.size()) != size_ ||
        counts[rank_] != static_cast<int>(mine.size())) {
      return absl::InvalidArgumentError("gather: counts do not match the group");
    }
    KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KVMESH_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    if (rank_ == root) {
      size_t at = 0;
      for (int r = 0; r < size_; ++r) {
        if (r == root) {
          cudaMemcpyAsync(all.data() + at, mine.data(), mine.size() * sizeof(float),
                          cudaMemcpyDeviceToDevice, stream_.get());
        } else {
          ncclRecv(all.data() + at, counts[r], ncclFloat32, r, comm_.get(), stream_.get());
        }
        at += counts[r];
      }
    } else {
      ncclSend(mine.data(), mine.size(), ncclFloat32, root, comm_.get(), stream_.get());
    }
    KVMESH_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return Wait();
  }

 private:
  absl::Status Wait() {
    KVMESH_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_.get()));
    return absl::OkStatus();
  }

  NcclComm comm_;
  CudaStream stream_;
  int rank_, size_, device_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap,
                                                                     int device) {
  ncclUniqueId id{};
  // Every rank must reach the broadcast, so a failure on rank 0 is reported after it.
  const ncclResult_t id_rc = bootstrap.rank() == 0 ? ncclGetUniqueId(&id) : ncclSuccess;
  if (auto s = bootstrap.Broadcast({reinterpret_cast<uint8_t*>(&id), sizeof(id)}, 0); !s.ok()) {
    return s;
  }
  KVMESH_NCCL_RETURN_IF_ERROR(id_rc);
  KVMESH_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  KVMESH_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CudaStream owned_stream(stream);
  ncclComm_t comm = nullptr;
  KVMESH_NCCL_RETURN_IF_ERROR(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return std::unique_ptr<Communicator>(new NcclCommunicator(
      NcclComm(comm), std::move(owned_stream), bootstrap.rank(), bootstrap.size(), device));
}

}  // namespace kvmesh::comm
