#include "kernels/cuda/ops_cuda.h"

namespace kvmesh::kernels {
namespace {

constexpr int kThreads = 256;

// One block per row: a block-wide sum of squares, then the scaled write.
__global__ void RmsNormKernel(const float* __restrict__ x, const float* __restrict__ w,
                              float* __restrict__ out, int64_t cols, float eps) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float* orow = out + row * cols;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
  __shared__ float partial[kThreads / 32];
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (threadIdx.x == 0) partial[0] = ss;
  }
  __syncthreads();
  const float scale = rsqrtf(partial[0] / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = xr[c] * scale * w[c];
}

}  // namespace

cudaError_t RmsNormCuda(const RmsNormArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  RmsNormKernel<<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a.x, a.w, a.out, a.cols,
                                                                        a.eps);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
