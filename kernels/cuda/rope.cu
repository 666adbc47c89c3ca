#include "kernels/cuda/ops_cuda.h"

namespace kvmesh::kernels {
namespace {

// One thread per (token, head, pair): adjacent pairs, as RopeCpu.
__global__ void RopeKernel(float* __restrict__ x, const int32_t* __restrict__ pos, int64_t tokens,
                           int64_t heads, int64_t head_dim, int64_t rot_dim, float theta_base) {
  const int64_t half = rot_dim / 2;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= tokens * heads * half) return;
  const int64_t i = idx % half;
  const int64_t th = idx / half;  // token * heads + head
  const int64_t t = th / heads;
  // The angle in double, as RopeTableCpu: a float angle is off by ~5e-4 rad at position 8191.
  const double theta = static_cast<double>(pos[t]) * pow(static_cast<double>(theta_base),
                                                         -2.0 * static_cast<double>(i) / rot_dim);
  double sd, cd;
  sincos(theta, &sd, &cd);
  const float s = static_cast<float>(sd), c = static_cast<float>(cd);
  float* p = x + th * head_dim + 2 * i;
  const float x0 = p[0], x1 = p[1];
  p[0] = x0 * c - x1 * s;
  p[1] = x0 * s + x1 * c;
}

}  // namespace

cudaError_t RopeCuda(const RopeArgs& a, cudaStream_t stream) {
  const int64_t n = a.tokens * a.heads * (a.rot_dim / 2);
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  RopeKernel<<<blocks, threads, 0, stream>>>(a.x, a.pos, a.tokens, a.heads, a.head_dim, a.rot_dim,
                                             a.theta_base);
  return cudaGetLastError();
}

}  // namespace kvmesh::kernels
