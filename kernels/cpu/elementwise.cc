#include <cmath>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/fp16.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {

void RmsNormCpu(const RmsNormArgs& a) {
  for (int64_t r = 0; r < a.rows; ++r) {
    const float* x = a.x + r * a.cols;
    float* o = a.out + r * a.cols;
    double ss = 0.0;  // double: the mean of squares of 576+ values loses bits in fp32
    for (int64_t c = 0; c < a.cols; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float scale = 1.0f / std::sqrt(static_cast<float>(ss / a.cols) + a.eps);
    for (int64_t c = 0; c < a.cols; ++c) o[c] = x[c] * scale * a.w[c];
  }
}

void RopeCpu(const RopeArgs& a) {
  const int64_t half = a.rot_dim / 2;
  // theta_i = pos * base^(-2i/rot_dim), computed per pair; cos/sin per token and pair are shared
  // by every head, so compute them once per token.
  std::vector<float> cs(static_cast<size_t>(2 * half));
  for (int64_t t = 0; t < a.tokens; ++t) {
    const float p = static_cast<float>(a.pos[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float theta = p * std::pow(a.theta_base, -2.0f * static_cast<float>(i) / a.rot_dim);
      cs[2 * i] = std::cos(theta);
      cs[2 * i + 1] = std::sin(theta);
    }
    for (int64_t h = 0; h < a.heads; ++h) {
      float* x = a.x + (t * a.heads + h) * a.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = x[2 * i], x1 = x[2 * i + 1];
        x[2 * i] = x0 * cs[2 * i] - x1 * cs[2 * i + 1];
        x[2 * i + 1] = x0 * cs[2 * i + 1] + x1 * cs[2 * i];
      }
    }
  }
}

void SwiGluCpu(const float* gate, const float* up, float* out, int64_t n) {
  cpu::Prims().silu_mul(gate, up, out, n);
}

void AddInPlaceCpu(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void ConvertToFp16Cpu(const float* src, uint16_t* dst, int64_t n) {
  cpu::Prims().to_fp16(src, dst, n);
}

}  // namespace kvmesh::kernels
