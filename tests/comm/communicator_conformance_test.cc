// One conformance suite for every Communicator backend the machine can run. Launched by ctest
// as `mpirun -np 3 comm_conformance_test` (and `-np 1`); the self backend runs in every rank.
// Every rank checks the same properties; gtest's exit code is collected by mpirun.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "comm/shm/shm_communicator.h"
#include "kernels/fp16.h"
#include "tests/util/mpi_test_main.h"

namespace kvmesh::comm {
namespace {

comm::MpiRuntime* g_mpi = nullptr;  // set by main()

struct Backend {
  const char* name;
  std::unique_ptr<Communicator> (*make)();
};

std::unique_ptr<Communicator> MakeSelf() { return CreateSelfCommunicator(); }
std::unique_ptr<Communicator> MakeWorld() { return *CreateMpiCommunicator(0, g_mpi->world_rank()); }
// Ranks split into groups of two (a TP group per pipeline stage, as kvmesh run builds them).
std::unique_ptr<Communicator> MakePairs() {
  const int r = g_mpi->world_rank();
  return *CreateMpiCommunicator(r / 2, r % 2);
}
// The shared-memory fast path over an MPI group (which it also delegates to); the group lives
// as long as the process (one per test).
std::unique_ptr<Communicator> OverShm(std::unique_ptr<Communicator> group) {
  auto shm = CreateShmCommunicator(*group);
  EXPECT_TRUE(shm.ok()) << shm.status();
  static std::vector<std::unique_ptr<Communicator>> groups;
  groups.push_back(std::move(group));
  return shm.ok() ? std::move(*shm) : nullptr;
}
std::unique_ptr<Communicator> MakeShmWorld() { return OverShm(MakeWorld()); }
std::unique_ptr<Communicator> MakeShmPairs() { return OverShm(MakePairs()); }

class Conformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    c_ = GetParam().make();
    ASSERT_NE(c_, nullptr);
  }
  std::unique_ptr<Communicator> c_;
};

TEST_P(Conformance, RankAndSize) {
  EXPECT_GE(c_->size(), 1);
  EXPECT_GE(c_->rank(), 0);
  EXPECT_LT(c_->rank(), c_->size());
}

TEST_P(Conformance, AllReduceSumsEveryRanksValues) {
  const int n = c_->size(), r = c_->rank();
  // 300,000 floats: beyond the shared-memory slots, delegated to MPI there.
  for (size_t len : {size_t{1}, size_t{576}, size_t{576 * 37}, size_t{300000}}) {
    std::vector<float> buf(len);
    for (size_t i = 0; i < len; ++i) buf[i] = static_cast<float>((r + 1) * 1000 + i % 97);
    ASSERT_TRUE(c_->AllReduceSum(buf).ok());
    for (size_t i = 0; i < len; ++i) {
      // sum over ranks q of (q + 1) * 1000 + i % 97
      const float want = 1000.0f * n * (n + 1) / 2 + static_cast<float>(n * (i % 97));
      ASSERT_EQ(buf[i], want) << "len " << len << " index " << i;
    }
  }
}

// 16-bit sums: every value and partial sum is exact in both formats (multiples of 1/4 below
// 256), so the result must be exact whatever order the backend adds in.
TEST_P(Conformance, HalfAllReduceSumsBinary16AndBfloat16) {
  const int n = c_->size(), r = c_->rank();
  for (HalfType type : {HalfType::kF16, HalfType::kBF16}) {
    const auto to = type == HalfType::kF16 ? kernels::FloatToFp16 : kernels::FloatToBf16;
    const auto from = type == HalfType::kF16 ? kernels::Fp16ToFloat : kernels::Bf16ToFloat;
    std::vector<uint16_t> buf(576 * 3);
    for (size_t i = 0; i < buf.size(); ++i)
      buf[i] = to(static_cast<float>(r + 1) * (i % 2 ? -1.0f : 1.0f) + 0.25f * (i % 3));
    ASSERT_TRUE(c_->AllReduceSum(buf, type).ok());
    for (size_t i = 0; i < buf.size(); ++i) {
      const float want =
          (i % 2 ? -1.0f : 1.0f) * n * (n + 1) / 2.0f + n * 0.25f * static_cast<float>(i % 3);
      ASSERT_EQ(from(buf[i]), want) << (type == HalfType::kF16 ? "fp16" : "bf16") << " " << i;
    }
  }
}

// Sums of inexact values: every rank must end with the same bits (the ranks' activations must
// not drift apart).
TEST_P(Conformance, AllReduceGivesEveryRankTheSameBits) {
  const int n = c_->size(), r = c_->rank();
  std::vector<float> buf(1000);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = 1.0f / static_cast<float>(3 + r * 7 + i);
  ASSERT_TRUE(c_->AllReduceSum(buf).ok());
  std::vector<float> all(buf.size() * n);
  ASSERT_TRUE(c_->GatherV(buf, all, std::vector<int>(n, static_cast<int>(buf.size())), 0).ok());
  if (r != 0) return;
  for (int q = 1; q < n; ++q) {
    ASSERT_EQ(std::memcmp(all.data(), all.data() + q * buf.size(), buf.size() * sizeof(float)), 0)
        << "rank " << q;
  }
}

TEST_P(Conformance, BroadcastCopiesTheRootsBytes) {
  for (int root = 0; root < c_->size(); ++root) {
    std::vector<uint8_t> buf(1000, static_cast<uint8_t>(c_->rank()));
    if (c_->rank() == root) std::iota(buf.begin(), buf.end(), static_cast<uint8_t>(root));
    ASSERT_TRUE(c_->Broadcast(buf, root).ok());
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], static_cast<uint8_t>(root + i));
  }
  std::vector<uint8_t> b(4);
  EXPECT_EQ(c_->Broadcast(b, c_->size()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(Conformance, GatherVConcatenatesInRankOrder) {
  const int n = c_->size(), r = c_->rank();
  std::vector<int> counts(n);
  for (int q = 0; q < n; ++q) counts[q] = 3 + q;  // uneven, like vocabulary slices
  std::vector<float> mine(counts[r], static_cast<float>(r));
  std::vector<float> all(std::accumulate(counts.begin(), counts.end(), 0), -1.0f);
  ASSERT_TRUE(c_->GatherV(mine, all, counts, 0).ok());
  if (r == 0) {
    size_t at = 0;
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < counts[q]; ++i) ASSERT_EQ(all[at++], static_cast<float>(q));
    }
  }
  std::vector<int> wrong(n, 1);
  EXPECT_FALSE(c_->GatherV(mine, all, wrong, 0).ok());
}

TEST_P(Conformance, AllGatherGivesEveryRankEveryRanksValues) {
  const int n = c_->size(), r = c_->rank();
  // 300,000 floats: beyond the shared-memory slots, delegated to MPI there.
  for (size_t len : {size_t{1}, size_t{576}, size_t{300000}}) {
    std::vector<float> mine(len), all(len * n, -1.0f);
    for (size_t i = 0; i < len; ++i) mine[i] = static_cast<float>(r * 1000 + i % 101);
    ASSERT_TRUE(c_->AllGather(mine, all).ok());
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < len; ++i)
        ASSERT_EQ(all[q * len + i], static_cast<float>(q * 1000 + i % 101)) << q << " " << i;
    }
  }
  std::vector<float> small(1);
  std::vector<float> mine(2);
  EXPECT_EQ(c_->AllGather(mine, small).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(Conformance, SendRecvAroundARing) {
  const int n = c_->size(), r = c_->rank();
  std::vector<float> out(64, static_cast<float>(r)), in(64, -1.0f);
  if (n == 1) {
    EXPECT_FALSE(c_->Send(out, 0, 7).ok());  // no peer to talk to
    return;
  }
  // Even ranks send first, odd ranks receive first: no deadlock with blocking calls.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    ASSERT_TRUE(c_->Send(out, next, 7).ok());
    ASSERT_TRUE(c_->Recv(in, prev, 7).ok());
  } else {
    ASSERT_TRUE(c_->Recv(in, prev, 7).ok());
    ASSERT_TRUE(c_->Send(out, next, 7).ok());
  }
  for (float v : in) ASSERT_EQ(v, static_cast<float>(prev));
}

// A receive posted before the peer sends, waited for after this rank's own send: both
// directions of the ring in flight at once, which blocking calls could not do in this order.
TEST_P(Conformance, RecvAsyncIsPostedBeforeTheSend) {
  const int n = c_->size(), r = c_->rank();
  std::vector<float> out(5000, static_cast<float>(r)), in(5000, -1.0f);
  if (n == 1) {
    EXPECT_FALSE(c_->RecvAsync(in, 0, 9).ok());
    return;
  }
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto pending = c_->RecvAsync(in, prev, 9);
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_TRUE(c_->Send(out, next, 9).ok());
  ASSERT_TRUE((*pending)->Wait().ok());
  for (float v : in) ASSERT_EQ(v, static_cast<float>(prev));
  // A receive that is never waited for is cancelled when dropped; the group stays usable.
  { auto dropped = c_->RecvAsync(in, prev, 10); }
  EXPECT_TRUE(c_->Barrier().ok());
}

// The calls a follower waits in between steps: the same bytes as Broadcast / Recv, also when
// the root comes late, past the MPI backend's spin (50 ms), so the wait has slept.
TEST_P(Conformance, PatientCallsDeliverAfterALongWait) {
  const int n = c_->size(), r = c_->rank();
  for (int root = 0; root < n; ++root) {
    std::vector<uint8_t> buf(4, static_cast<uint8_t>(r));
    if (r == root) {
      std::this_thread::sleep_for(std::chrono::milliseconds(120));
      std::iota(buf.begin(), buf.end(), static_cast<uint8_t>(10 + root));
    }
    ASSERT_TRUE(c_->BroadcastPatiently(buf, root).ok());
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], static_cast<uint8_t>(10 + root + i));
  }
  std::vector<uint8_t> b(4);
  EXPECT_EQ(c_->BroadcastPatiently(b, n).code(), absl::StatusCode::kInvalidArgument);
  if (n == 1) return;
  std::vector<float> out(3, static_cast<float>(r)), in(3, -1.0f);
  if (r == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    ASSERT_TRUE(c_->Send(out, 1, 11).ok());
  } else if (r == 1) {
    ASSERT_TRUE(c_->RecvPatiently(in, 0, 11).ok());
    for (float v : in) ASSERT_EQ(v, 0.0f);
    ASSERT_TRUE(c_->Send(out, 0, 12).ok());
  }
  if (r == 0) {
    std::vector<float> four(4);
    EXPECT_EQ(c_->RecvPatiently(four, 1, 12).code(), absl::StatusCode::kInternal);
  }
  EXPECT_TRUE(c_->Barrier().ok());
}

TEST_P(Conformance, BarrierReturns) { EXPECT_TRUE(c_->Barrier().ok()); }

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Values(Backend{"self", MakeSelf},
                                           Backend{"mpi_world", MakeWorld},
                                           Backend{"mpi_pairs", MakePairs},
                                           Backend{"shm_world", MakeShmWorld},
                                           Backend{"shm_pairs", MakeShmPairs}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvmesh::comm

int main(int argc, char** argv) {
  return kvmesh::testing::RunMpiTests(argc, argv, &kvmesh::comm::g_mpi);
}
