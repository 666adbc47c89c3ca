#include "comm/mpi/mpi_communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "kernels/fp16.h"
#include "util/str_cat.h"

// Converts an MPI return code into a status naming the call, once, at the call site.
#define KVMESH_MPI_RETURN_IF_ERROR(expr)                                         \
  do {                                                                           \
    const int kvmesh_mpi_rc = (expr);                                            \
    if (kvmesh_mpi_rc != MPI_SUCCESS)                                            \
      return ::kvmesh::comm::MpiError(kvmesh_mpi_rc, #expr, __FILE__, __LINE__); \
  } while (0)

namespace kvmesh::comm {

absl::Status MpiError(int rc, const char* expr, const char* file, int line) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return absl::UnavailableError(
      StrCat("MPI error in ", expr, " (", file, ":", line, "): ", std::string(msg, len)));
}

namespace {

// MPI has no 16-bit float types: sums of binary16 / bfloat16 are user-defined reductions over
// MPI_UINT16_T that add in fp32 and round back.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void SumHalves(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FromFloat(ToFloat(a[i]) + ToFloat(b[i]));
}

// The two reductions, created after MPI_Init and freed before MPI_Finalize (MpiRuntime).
MPI_Op g_sum_f16 = MPI_OP_NULL, g_sum_bf16 = MPI_OP_NULL;

// A receive of `want` floats from `src` got as many.
absl::Status CheckCount(const MPI_Status& st, size_t want, int src) {
  int got = 0;
  MPI_Get_count(&st, MPI_FLOAT, &got);
  if (got != static_cast<int>(want)) {
    return absl::InternalError(
        StrCat("recv: got ", got, " floats from rank ", src, ", want ", want));
  }
  return absl::OkStatus();
}

// MPI_Wait that stops holding the core once the wait is long: Open MPI's blocking calls poll
// without sleeping, so a follower waiting for an idle server's next step kept a core busy. The
// spin outlasts the gaps between the steps of a busy server (a decode step here is 5-30 ms; a
// 2 ms spin gave dp = 2 a median of 574 tokens/s against 627 in three runs of 8 sequences),
// so only idle waits sleep.
absl::Status WaitPatiently(MPI_Request* req, MPI_Status* st) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::milliseconds(50);
  constexpr auto kLongestNap = std::chrono::microseconds(1000);
  const Clock::time_point spin_until = Clock::now() + kSpin;
  std::chrono::microseconds nap(25);
  for (;;) {
    int done = 0;
    KVMESH_MPI_RETURN_IF_ERROR(MPI_Test(req, &done, st));
    if (done) return absl::OkStatus();
    if (Clock::now() < spin_until) continue;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::duration_cast<std::chrono::microseconds>(kLongestNap));
  }
}

// A posted MPI_Irecv of floats.
class MpiPendingRecv final : public PendingRecv {
 public:
  // patient: Wait polls, then sleeps between polls (WaitPatiently), instead of MPI_Wait.
  MpiPendingRecv(MPI_Request req, size_t want, int src, bool patient)
      : req_(req), want_(want), src_(src), patient_(patient) {}
  ~MpiPendingRecv() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (req_ != MPI_REQUEST_NULL && !finalized) {
      MPI_Cancel(&req_);
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
  }
  absl::Status Wait() override {
    if (req_ == MPI_REQUEST_NULL) return absl::FailedPreconditionError("recv: already waited");
    MPI_Status st;
    if (patient_) {
      if (auto s = WaitPatiently(&req_, &st); !s.ok()) return s;
    } else {
      KVMESH_MPI_RETURN_IF_ERROR(MPI_Wait(&req_, &st));
    }
    return CheckCount(st, want_, src_);
  }

 private:
  MPI_Request req_;
  size_t want_;
  int src_;
  bool patient_;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(std::span<float> buf) override {
    if (size_ == 1) return absl::OkStatus();
    KVMESH_MPI_RETURN_IF_ERROR(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()),
                                             MPI_FLOAT, MPI_SUM, comm_));
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(std::span<uint16_t> buf, HalfType type) override {
    if (size_ == 1) return absl::OkStatus();
    KVMESH_MPI_RETURN_IF_ERROR(
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_UINT16_T,
                      type == HalfType::kF16 ? g_sum_f16 : g_sum_bf16, comm_));
    return absl::OkStatus();
  }
  absl::Status Broadcast(std::span<uint8_t> buf, int root) override {
    if (auto s = CheckRoot(root); !s.ok()) return s;
    KVMESH_MPI_RETURN_IF_ERROR(
        MPI_Bcast(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, root, comm_));
    return absl::OkStatus();
  }
  absl::Status BroadcastPatiently(std::span<uint8_t> buf, int root) override {
    if (auto s = CheckRoot(root); !s.ok()) return s;
    MPI_Request req;
    KVMESH_MPI_RETURN_IF_ERROR(
        MPI_Ibcast(buf.data(), static_cast<int>(buf.size()), MPI_BYTE, root, comm_, &req));
    return WaitPatiently(&req, MPI_STATUS_IGNORE);
  }
  absl::Status RecvPatiently(std::span<float> buf, int src, int tag) override {
    auto pending = PostRecv(buf, src, tag, /*patient=*/true);
    if (!pending.ok()) return pending.status();
    return (*pending)->Wait();
  }
  absl::Status Send(std::span<const float> buf, int dst, int tag) override {
    if (dst < 0 || dst >= size_ || dst == rank_)
      return absl::InvalidArgumentError(StrCat("send: bad peer ", dst));
    KVMESH_MPI_RETURN_IF_ERROR(
        MPI_Send(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, dst, tag, comm_));
    return absl::OkStatus();
  }
  absl::Status Recv(std::span<float> buf, int src, int tag) override {
    if (src < 0 || src >= size_ || src == rank_)
      return absl::InvalidArgumentError(StrCat("recv: bad peer ", src));
    MPI_Status st;
    KVMESH_MPI_RETURN_IF_ERROR(
        MPI_Recv(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, src, tag, comm_, &st));
    return CheckCount(st, buf.size(), src);
  }
  absl::StatusOr<std::unique_ptr<PendingRecv>> RecvAsync(std::span<float> buf, int src,
                                                         int tag) override {
    return PostRecv(buf, src, tag, /*patient=*/false);
  }
  absl::Status AllGather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() < mine.size() * size_) {
      return absl::InvalidArgumentError("all-gather: receive buffer too small");
    }
    KVMESH_MPI_RETURN_IF_ERROR(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT,
                                             all.data(), static_cast<int>(mine.size()), MPI_FLOAT,
                                             comm_));
    return absl::OkStatus();
  }
  absl::Status GatherV(std::span<const float> mine, std::span<float> all,
                       std::span<const int> counts, int root) override {
    if (static_cast<int>(counts.size()) != size_ ||
        counts[rank_] != static_cast<int>(mine.size())) {
      return absl::InvalidArgumentError("gather: counts do not match the group");
    }
    std::vector<int> displs(size_, 0);
    for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + counts[r - 1];
    if (rank_ == root && all.size() < static_cast<size_t>(displs[size_ - 1] + counts[size_ - 1])) {
      return absl::InvalidArgumentError("gather: receive buffer too small");
    }
    KVMESH_MPI_RETURN_IF_ERROR(MPI_Gatherv(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT,
                                           all.data(), counts.data(), displs.data(), MPI_FLOAT,
                                           root, comm_));
    return absl::OkStatus();
  }
  absl::Status Barrier() override {
    KVMESH_MPI_RETURN_IF_ERROR(MPI_Barrier(comm_));
    return absl::OkStatus();
  }

 private:
  absl::Status CheckRoot(int root) const {
    if (root >= 0 && root < size_) return absl::OkStatus();
    return absl::InvalidArgumentError(
        StrCat("broadcast root ", root, " outside a ", size_, "-rank group"));
  }
  // RecvAsync, and RecvPatiently's receive before it waits.
  absl::StatusOr<std::unique_ptr<PendingRecv>> PostRecv(std::span<float> buf, int src, int tag,
                                                        bool patient) {
    if (src < 0 || src >= size_ || src == rank_)
      return absl::InvalidArgumentError(StrCat("recv: bad peer ", src));
    MPI_Request req;
    KVMESH_MPI_RETURN_IF_ERROR(
        MPI_Irecv(buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, src, tag, comm_, &req));
    return std::unique_ptr<PendingRecv>(new MpiPendingRecv(req, buf.size(), src, patient));
  }
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool MpiRuntime::LaunchedWithMultipleRanks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}) {
    if (const char* s = std::getenv(v); s && std::atoi(s) > 1) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<MpiRuntime>> MpiRuntime::Init(int* argc, char*** argv) {
  int provided = 0;
  KVMESH_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    return absl::FailedPreconditionError("MPI does not provide MPI_THREAD_FUNNELED");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  using kernels::Bf16ToFloat, kernels::FloatToBf16, kernels::Fp16ToFloat, kernels::FloatToFp16;
  MPI_Op_create(&SumHalves<Fp16ToFloat, FloatToFp16>, /*commute=*/1, &g_sum_f16);
  MPI_Op_create(&SumHalves<Bf16ToFloat, FloatToBf16>, /*commute=*/1, &g_sum_bf16);
  std::unique_ptr<MpiRuntime> r(new MpiRuntime());
  MPI_Comm_rank(MPI_COMM_WORLD, &r->rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &r->size_);
  return r;
}

MpiRuntime::~MpiRuntime() {
  MPI_Op_free(&g_sum_f16);
  MPI_Op_free(&g_sum_bf16);
  MPI_Finalize();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(int color, int key) {
  MPI_Comm comm;
  KVMESH_MPI_RETURN_IF_ERROR(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return std::unique_ptr<Communicator>(new MpiCommunicator(comm));
}

}  // namespace kvmesh::comm
