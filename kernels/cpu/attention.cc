#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {

namespace {
constexpr int64_t kKeyChunk = 64;  // scores kept per step of the online softmax
}

void AttentionCpu(const AttentionArgs& a, ThreadPool& pool) {
  const auto& dots = cpu::Dots();
  const int64_t group = a.n_heads / a.n_kv_heads;
  const int64_t d = a.head_dim;
  // One unit of work = one (token, query head); both cores split them.
  pool.ParallelFor(a.tokens * a.n_heads, 1, [&](int64_t u0, int64_t u1) {
    float scores[kKeyChunk];
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t t = u / a.n_heads, h = u % a.n_heads;
      const int64_t kvh = h / group;
      const float* q = a.q + u * d;
      const uint16_t* kbase = a.k + kvh * d;
      const uint16_t* vbase = a.v + kvh * d;
      float* o = a.out + u * d;
      std::fill(o, o + d, 0.0f);
      const int64_t n_keys = a.pos0 + t + 1;
      float m = -std::numeric_limits<float>::infinity();  // running max
      float l = 0.0f;                                     // running sum of exp(s - m)
      for (int64_t j0 = 0; j0 < n_keys; j0 += kKeyChunk) {
        const int64_t n = std::min(kKeyChunk, n_keys - j0);
        float cmax = m;
        for (int64_t j = 0; j < n; ++j) {
          scores[j] = dots.f32_f16(q, kbase + (j0 + j) * a.kv_pos_stride, d) * a.scale;
          cmax = std::max(cmax, scores[j]);
        }
        // Rescale what was accumulated under the old max once per chunk.
        float rescale = std::exp(m - cmax);
        l *= rescale;
        m = cmax;
        for (int64_t j = 0; j < n; ++j) {
          const float p = std::exp(scores[j] - m);
          l += p;
          dots.scale_axpy_f16(o, rescale, p, vbase + (j0 + j) * a.kv_pos_stride, d);
          rescale = 1.0f;
        }
      }
      const float inv = 1.0f / l;
      for (int64_t i = 0; i < d; ++i) o[i] *= inv;
    }
  });
}

}  // namespace kvmesh::kernels
