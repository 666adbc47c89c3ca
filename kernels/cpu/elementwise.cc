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
    // double: the mean of squares of 576+ values loses bits in fp32. Eight partial sums, joined
    // in a fixed order (a row's result depends on nothing but the row), so that the adds do
    // not wait on each other: one chain of 576 dependent adds cost 1.4% of a 16-sequence
    // decode step.
    double part[8] = {};
    int64_t c = 0;
    for (; c + 8 <= a.cols; c += 8) {
      for (int k = 0; k < 8; ++k) part[k] += static_cast<double>(x[c + k]) * x[c + k];
    }
    double ss =
        ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    for (; c < a.cols; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float scale = 1.0f / std::sqrt(static_cast<float>(ss / a.cols) + a.eps);
    for (int64_t c = 0; c < a.cols; ++c) o[c] = x[c] * scale * a.w[c];
  }
}

void RopeTableCpu(const int32_t* pos, int64_t tokens, int64_t rot_dim, float theta_base,
                  float* cs) {
  // theta_i = pos * base^(-2i/rot_dim), in double: at position 8191 one float ulp of the
  // frequency moves the angle by ~5e-4 rad, so a float angle is off in the 4th digit. In double
  // the table is cos/sin of the exact angle rounded once to float, which kernels/cuda/rope.cu
  // matches within a float ulp (its double pow and sincos are within 2 double ulps). Once per
  // step, so its cost does not matter.
  thread_local std::vector<double> freq;
  freq.resize(static_cast<size_t>(rot_dim / 2));
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    freq[i] = std::pow(static_cast<double>(theta_base), -2.0 * static_cast<double>(i) / rot_dim);
  }
  for (int64_t t = 0; t < tokens; ++t) {
    const double p = pos[t];
    float* c = cs + t * rot_dim;
    for (int64_t i = 0; i < rot_dim / 2; ++i) {
      const double theta = p * freq[i];
      c[2 * i] = static_cast<float>(std::cos(theta));
      c[2 * i + 1] = static_cast<float>(std::sin(theta));
    }
  }
}

void RopeApplyCpu(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rot_dim,
                  const float* cs) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cs + t * rot_dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* xh = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < rot_dim / 2; ++i) {
        const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
        xh[2 * i] = x0 * c[2 * i] - x1 * c[2 * i + 1];
        xh[2 * i + 1] = x0 * c[2 * i + 1] + x1 * c[2 * i];
      }
    }
  }
}

void RopeCpu(const RopeArgs& a) {
  std::vector<float> cs(static_cast<size_t>(a.tokens * a.rot_dim));
  RopeTableCpu(a.pos, a.tokens, a.rot_dim, a.theta_base, cs.data());
  RopeApplyCpu(a.x, a.tokens, a.heads, a.head_dim, a.rot_dim, cs.data());
}

void SwiGluCpu(const float* gate, const float* up, float* out, int64_t n) {
  cpu::Prims().silu_mul(gate, up, out, n);
}

void AddInPlaceCpu(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void ConvertToBf16Cpu(const float* src, uint16_t* dst, int64_t n) {
  cpu::Prims().to_bf16(src, dst, n);
}

void ConvertToFp16Cpu(const float* src, uint16_t* dst, int64_t n) {
  cpu::Prims().to_fp16(src, dst, n);
}

int64_t ArgMaxCpu(const float* x, int64_t n) { return cpu::Prims().argmax(x, n); }

}  // namespace kvmesh::kernels
