// The Communicator conformance properties on the NCCL backend (device buffers), run by mpirun
// over 1 and 2 ranks. Every test reports itself skipped, with the reason, where there is no GPU
// or fewer GPUs on a node than ranks on it (NCCL takes one GPU per rank).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <numeric>
#include <vector>

#include "comm/mpi/mpi_communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "kernels/fp16.h"
#include "tests/util/cuda_buffers.h"
#include "tests/util/mpi_test_main.h"

namespace kvmesh::comm {
namespace {

MpiRuntime* g_mpi = nullptr;  // set by main()

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device (" << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices")
                   << "): the NCCL backend is compiled but can only run where a GPU is present";
    }
    // This node's ranks: NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU
    // detected"). The count is the same on every rank of a node, so all of them skip or none.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int local_rank = 0, local_size = 1;
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    if (n < local_size) {
      GTEST_SKIP() << local_size << " ranks on this node but " << n
                   << " CUDA device(s): NCCL needs one GPU per rank";
    }
    bootstrap_ = *CreateMpiCommunicator(0, g_mpi->world_rank());
    auto c = CreateNcclCommunicator(*bootstrap_, local_rank);
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }
  std::unique_ptr<Communicator> bootstrap_, c_;
  testing::DeviceBuffers dev_;
};

TEST_F(Nccl, AllReduceBroadcastGatherSendRecv) {
  const int n = c_->size(), r = c_->rank();
  std::vector<float> h(576);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>((r + 1) * 1000 + i % 97);
  float* d = dev_.Upload(h);
  ASSERT_TRUE(c_->AllReduceSum({d, h.size()}).ok());
  const auto got = dev_.Download(d, h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(got[i], 1000.0f * n * (n + 1) / 2 + static_cast<float>(n * (i % 97)));
  }
  std::vector<uint8_t> b(100, static_cast<uint8_t>(r));
  if (r == 0) std::iota(b.begin(), b.end(), uint8_t{0});
  uint8_t* db = dev_.Upload(b);
  ASSERT_TRUE(c_->Broadcast({db, b.size()}, 0).ok());
  const auto gb = dev_.Download(db, b.size());
  for (size_t i = 0; i < gb.size(); ++i) ASSERT_EQ(gb[i], static_cast<uint8_t>(i));
  std::vector<int> counts(n);
  for (int q = 0; q < n; ++q) counts[q] = 3 + q;
  float* mine = dev_.Upload(std::vector<float>(counts[r], static_cast<float>(r)));
  float* all =
      dev_.Upload(std::vector<float>(std::accumulate(counts.begin(), counts.end(), 0), -1.0f));
  ASSERT_TRUE(
      c_->GatherV({mine, static_cast<size_t>(counts[r])},
                  {all, static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), 0))},
                  counts, 0)
          .ok());
  if (r == 0) {
    const auto ga = dev_.Download(all, std::accumulate(counts.begin(), counts.end(), 0));
    size_t at = 0;
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < counts[q]; ++i) ASSERT_EQ(ga[at++], static_cast<float>(q));
    }
  }
  if (n >= 2 && r < 2) {
    float* buf = dev_.Upload(std::vector<float>(64, static_cast<float>(r)));
    if (r == 0) {
      ASSERT_TRUE(c_->Send({buf, 64}, 1, 0).ok());
    } else {
      ASSERT_TRUE(c_->Recv({buf, 64}, 0, 0).ok());
      for (float v : dev_.Download(buf, 64)) ASSERT_EQ(v, 0.0f);
    }
  }
  {
    float* mine64 = dev_.Upload(std::vector<float>(64, static_cast<float>(r)));
    float* all64 = dev_.Upload(std::vector<float>(64 * n, -1.0f));
    ASSERT_TRUE(c_->AllGather({mine64, 64}, {all64, static_cast<size_t>(64 * n)}).ok());
    const auto got64 = dev_.Download(all64, 64 * n);
    for (int q = 0; q < n; ++q) {
      for (int i = 0; i < 64; ++i) ASSERT_EQ(got64[q * 64 + i], static_cast<float>(q));
    }
  }
  // 16-bit sums, exact in both formats.
  for (HalfType type : {HalfType::kF16, HalfType::kBF16}) {
    const auto to = type == HalfType::kF16 ? kernels::FloatToFp16 : kernels::FloatToBf16;
    const auto from = type == HalfType::kF16 ? kernels::Fp16ToFloat : kernels::Bf16ToFloat;
    std::vector<uint16_t> hh(576);
    for (size_t i = 0; i < hh.size(); ++i) hh[i] = to(static_cast<float>(r + 1) + 0.25f * (i % 3));
    uint16_t* dh = dev_.Upload(hh);
    ASSERT_TRUE(c_->AllReduceSum({dh, hh.size()}, type).ok());
    const auto gh = dev_.Download(dh, hh.size());
    for (size_t i = 0; i < gh.size(); ++i)
      ASSERT_EQ(from(gh[i]), n * (n + 1) / 2.0f + n * 0.25f * static_cast<float>(i % 3));
  }
  if (n >= 2 && r < 2) {
    float* buf = dev_.Upload(std::vector<float>(64, static_cast<float>(r)));
    if (r == 1) {
      auto pending = c_->RecvAsync({buf, 64}, 0, 0);
      ASSERT_TRUE(pending.ok()) << pending.status();
      ASSERT_TRUE((*pending)->Wait().ok());
      for (float v : dev_.Download(buf, 64)) ASSERT_EQ(v, 0.0f);
    } else {
      ASSERT_TRUE(c_->Send({buf, 64}, 1, 0).ok());
    }
  }
  EXPECT_TRUE(c_->Barrier().ok());
}

}  // namespace
}  // namespace kvmesh::comm

int main(int argc, char** argv) {
  return kvmesh::testing::RunMpiTests(argc, argv, &kvmesh::comm::g_mpi);
}
