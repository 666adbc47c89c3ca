// CUDA twins against the CPU kernels (NMSE-style relative L2 limits as ggml's test-backend-ops).
// Skipped, with the reason, where no CUDA device is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cuda/ops_cuda.h"
#include "tests/util/cuda_buffers.h"

namespace kvmesh::kernels {
namespace {

double RelL2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> Randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device (" << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices")
                   << "): the CUDA kernels are compiled but can only run where a GPU is present";
    }
  }
  testing::DeviceBuffers dev_;
};

TEST_F(CudaOps, RmsNormMatchesCpu) {
  for (int64_t cols : {1, 33, 576, 4097}) {
    const int64_t rows = 5;
    const auto x = Randn(rows * cols, 1), w = Randn(cols, 2);
    std::vector<float> ref(x.size());
    RmsNormCpu({x.data(), w.data(), ref.data(), rows, cols, 1e-5f});
    float* dx = dev_.Upload(x);
    float* dw = dev_.Upload(w);
    float* dout = dev_.Upload(std::vector<float>(x.size()));
    ASSERT_EQ(RmsNormCuda({dx, dw, dout, rows, cols, 1e-5f}, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LT(RelL2(dev_.Download(dout, x.size()), ref), 1e-6) << cols;
  }
}

TEST_F(CudaOps, RopeMatchesCpu) {
  const int64_t tokens = 7, heads = 9, hd = 64;
  auto x = Randn(tokens * heads * hd, 3);
  std::vector<int32_t> pos = {0, 1, 2, 100, 1000, 4095, 8191};
  float* dx = dev_.Upload(x);
  int32_t* dpos = dev_.Upload(pos);
  RopeCpu({x.data(), pos.data(), tokens, heads, hd, hd, 100000.0f});
  ASSERT_EQ(RopeCuda({dx, dpos, tokens, heads, hd, hd, 100000.0f}, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LT(RelL2(dev_.Download(dx, x.size()), x), 1e-6);
}

}  // namespace
}  // namespace kvmesh::kernels
