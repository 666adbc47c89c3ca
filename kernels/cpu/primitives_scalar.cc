#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"

namespace kvmesh::kernels::cpu {
namespace {

float DotQ4_0A16(const BlockQ4_0* x, const BlockA16* y, int64_t nb) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      s += (x[i].qs[j] & 0xF) * y[i].qs[j];
      s += (x[i].qs[j] >> 4) * y[i].qs[j + kQK / 2];
    }
    s -= 8 * y[i].sum;  // the format's -8 offset, applied once per block
    sum += Fp16ToFloat(x[i].d) * y[i].d * static_cast<float>(s);
  }
  return sum;
}

float DotQ4_1A16(const BlockQ4_1* x, const BlockA16* y, int64_t nb) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      s += (x[i].qs[j] & 0xF) * y[i].qs[j];
      s += (x[i].qs[j] >> 4) * y[i].qs[j + kQK / 2];
    }
    // sum_j (d_x q_j + m_x) * d_y a_j = d_x d_y sum(q a) + m_x d_y sum(a).
    sum += y[i].d * (Fp16ToFloat(x[i].d) * static_cast<float>(s) +
                     Fp16ToFloat(x[i].m) * static_cast<float>(y[i].sum));
  }
  return sum;
}

// Q5_0 / Q5_1: Q4_0 / Q4_1's steps over 5-bit values (Q5_0's offset is 16).
template <typename Block>
float DotQ5A16(const Block* x, const BlockA16* y, int64_t nb) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    // Q5Value's values first, in two loops without branches (the compiler vectorises both).
    int16_t v[kQK];
    for (int e = 0; e < kQK / 2; ++e) {
      v[e] = static_cast<int16_t>((x[i].qs[e] & 0xF) | (qh >> e & 1) << 4);
      v[e + kQK / 2] = static_cast<int16_t>((x[i].qs[e] >> 4) | (qh >> (e + kQK / 2) & 1) << 4);
    }
    int32_t s = 0;
    for (int e = 0; e < kQK; ++e) s += v[e] * y[i].qs[e];
    if constexpr (std::is_same_v<Block, BlockQ5_0>) {
      s -= 16 * y[i].sum;
      sum += Fp16ToFloat(x[i].d) * y[i].d * static_cast<float>(s);
    } else {
      sum += y[i].d * (Fp16ToFloat(x[i].d) * static_cast<float>(s) +
                       Fp16ToFloat(x[i].m) * static_cast<float>(y[i].sum));
    }
  }
  return sum;
}

float DotQ8_0A16(const BlockQ8_0* x, const BlockA16* y, int64_t nb) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t s = 0;
    for (int j = 0; j < kQK; ++j) s += x[i].qs[j] * y[i].qs[j];
    sum += Fp16ToFloat(x[i].d) * y[i].d * static_cast<float>(s);
  }
  return sum;
}

// Sub-block j of a Q4_K or Q5_K super-block (32 elements, one activation block): values
// d*sc*q - dmin*m, so its dot is d*sc*d_a*sum(q a) - dmin*m*d_a*sum(a).
template <typename Block>
float DotK4A16(const Block* x, const BlockA16* y, int64_t nb) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb / 8; ++i) {
    const float d = Fp16ToFloat(x[i].d), dmin = Fp16ToFloat(x[i].dmin);
    const uint8_t* q = x[i].qs;
    // Chunk c's 32 bytes: the low nibbles are sub-block 2c, the high ones 2c + 1 (KQuantValue),
    // taken with constant shifts so that the loops vectorise.
    for (int c = 0; c < 4; ++c) {
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * c + half;
        const BlockA16& a = y[i * 8 + j];
        uint8_t sc, mn;
        UnpackScaleMinK4(j, x[i].scales, &sc, &mn);
        int32_t s = 0;
        if constexpr (std::is_same_v<Block, BlockQ5_K>) {
          int16_t v[kQK];
          for (int l = 0; l < kQK; ++l) {
            v[l] =
                static_cast<int16_t>((half ? q[l] >> 4 : q[l] & 0xF) | (x[i].qh[l] >> j & 1) << 4);
          }
          for (int l = 0; l < kQK; ++l) s += v[l] * a.qs[l];
        } else {
          for (int l = 0; l < kQK; ++l) s += (half ? (q[l] >> 4) : (q[l] & 0xF)) * a.qs[l];
        }
        sum += a.d * (d * sc * static_cast<float>(s) - dmin * mn * static_cast<float>(a.sum));
      }
      q += 32;
    }
  }
  return sum;
}

// Q6_K: 16 sub-blocks of 16 with int8 scales; an activation block covers two of them.
float DotQ6_KA16(const BlockQ6_K* x, const BlockA16* y, int64_t nb) {
  float sum = 0.0f;
  for (int64_t i = 0; i < nb / 8; ++i) {
    const float d = Fp16ToFloat(x[i].d);
    int8_t qv[kQKK];
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        qv[h * 128 + l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
        qv[h * 128 + l + 32] =
            static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
        qv[h * 128 + l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        qv[h * 128 + l + 96] =
            static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
      ql += 64;
      qh += 32;
    }
    for (int b = 0; b < 8; ++b) {
      const BlockA16& a = y[i * 8 + b];
      int32_t s0 = 0, s1 = 0;
      for (int l = 0; l < 16; ++l) s0 += qv[b * 32 + l] * a.qs[l];
      for (int l = 16; l < 32; ++l) s1 += qv[b * 32 + l] * a.qs[l];
      sum += d * a.d *
             (x[i].scales[2 * b] * static_cast<float>(s0) +
              x[i].scales[2 * b + 1] * static_cast<float>(s1));
    }
  }
  return sum;
}

float DotF32F32(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

void ExpShifted(const float* x, float shift, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i] - shift);
}

float ExpShiftedSum(const float* x, float shift, float* y, int64_t n) {
  ExpShifted(x, shift, y, n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += y[i];
  return sum;
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// In two passes the compiler turns into vector code: the maximum over 16 lanes, then the first
// position holding it.
int64_t ArgMax(const float* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] = x[i + j] > lanes[j] ? x[i + j] : lanes[j];
  }
  float m = *std::max_element(lanes, lanes + kLanes);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int64_t k = 0; k < n; ++k) {
    if (x[k] == m) return k;
  }
  return 0;  // every value is NaN
}

void ToFp16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToFp16(src[i]);
}

void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}

}  // namespace

void GenericQkT(const float* q, int64_t G, int64_t d, const float* kt, int64_t kts, int64_t n,
                float scale, float* scores, int64_t ss, float* row_max) {
  for (int64_t g = 0; g < G; ++g) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      float s = (q[g * d] * scale) * kt[j];
      for (int64_t i = 1; i < d; ++i) s = std::fma(q[g * d + i] * scale, kt[i * kts + j], s);
      scores[g * ss + j] = s;
      mx = std::max(mx, s);
    }
    row_max[g] = mx;
  }
}

void GenericF16ToF32Tile(const uint16_t* src, int64_t src_stride, float* dst, int64_t dst_stride,
                         int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      dst[r * dst_stride + c] = Fp16ToFloat(src[r * src_stride + c]);
  }
}

void GenericQkTF16(const Primitives& p, const float* q, int64_t G, int64_t d,
                   const uint16_t* const* groups, int64_t dim_stride, int64_t n, float scale,
                   float* scores, int64_t ss, float* row_max, Ahead* ahead) {
  AskAll(ahead);
  thread_local std::vector<float> kt;
  const int64_t kts = (n + 15) / 16 * 16;
  kt.resize(static_cast<size_t>(d * kts));
  for (int64_t j0 = 0; j0 < n; j0 += 16) {
    for (int64_t i = 0; i < d; ++i) {
      p.f16_to_f32(groups[j0 / 16] + i * dim_stride, kt.data() + i * kts + j0,
                   std::min<int64_t>(16, n - j0));
    }
  }
  p.qk_t(q, G, d, kt.data(), kts, n, scale, scores, ss, row_max);
}

void GenericPv(const float* pr, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n,
               float* o, int64_t os) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g = 0; g < G; ++g) {
      const float w = pr[g * ps + j];
      for (int64_t i = 0; i < d; ++i) o[g * os + i] += w * v[j * d + i];
    }
  }
}

void GenericPvF16(const Primitives& p, const float* pr, int64_t ps, int64_t G, int64_t d,
                  const uint16_t* const* rows, int64_t n, float* o, int64_t os, Ahead* ahead) {
  AskAll(ahead);
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(d));
  for (int64_t j = 0; j < n; ++j) {
    p.f16_to_f32(rows[j], row.data(), d);
    GenericPv(pr + j, ps, G, d, row.data(), 1, o, os);
  }
}

namespace {
inline float Lo(uint32_t x) { return Bf16ToFloat(static_cast<uint16_t>(x)); }
inline float Hi(uint32_t x) { return Bf16ToFloat(static_cast<uint16_t>(x >> 16)); }
// One group of up to kBf16Group pairs (primitives.h): the low elements' products summed from 0
// by fused multiply-adds in pair order, the high elements' likewise, and the two sums added.
// x(i), y(i) give pair i's operands.
template <typename X, typename Y>
inline float GroupSum(int64_t pairs, const X& x, const Y& y) {
  float even = 0.0f, odd = 0.0f;
  for (int64_t i = 0; i < pairs; ++i) {
    even = std::fma(Lo(x(i)), Lo(y(i)), even);
    odd = std::fma(Hi(x(i)), Hi(y(i)), odd);
  }
  return even + odd;
}
}  // namespace

void GenericQkBf16(const uint32_t* qp, int64_t G, int64_t d, const uint32_t* const* groups,
                   int64_t pair_stride, int64_t n, float* scores, int64_t ss, float* row_max,
                   Ahead* ahead) {
  AskAll(ahead);
  const int64_t dp = d / 2;
  for (int64_t g = 0; g < G; ++g) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      const uint32_t* k = groups[j / 16] + j % 16;
      float s = 0.0f;
      for (int64_t i0 = 0; i0 < dp; i0 += kBf16Group) {
        s += GroupSum(
            std::min(kBf16Group, dp - i0), [&](int64_t i) { return qp[g * dp + i0 + i]; },
            [&](int64_t i) { return k[(i0 + i) * pair_stride]; });
      }
      scores[g * ss + j] = s;
      mx = std::max(mx, s);
    }
    row_max[g] = mx;
  }
}

void GenericPvBf16(const uint32_t* pp, int64_t pps, int64_t G, int64_t d,
                   const uint32_t* const* pairs, int64_t n, float* o, int64_t os, Ahead* ahead) {
  AskAll(ahead);
  const int64_t n_pairs = (n + 1) / 2;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t i = 0; i < d; ++i) {
      float acc = o[g * os + i];
      // The tiles read a subnormal accumulator as zero (a record rescaled by a tiny factor).
      if (std::fpclassify(acc) == FP_SUBNORMAL) acc = std::copysign(0.0f, acc);
      for (int64_t j0 = 0; j0 < n_pairs; j0 += kBf16Group) {
        acc += GroupSum(
            std::min(kBf16Group, n_pairs - j0), [&](int64_t jp) { return pp[g * pps + j0 + jp]; },
            [&](int64_t jp) {
              const uint32_t v = pairs[j0 + jp][i];
              return 2 * (j0 + jp) + 1 < n ? v : v & 0xFFFFu;
            });
      }
      o[g * os + i] = acc;
    }
  }
}

void GenericToBf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = Bf16Of(src[i]);
}

const Primitives& ScalarPrimitives() {
  static const Primitives t{.q4_0_a16 = DotQ4_0A16,
                            .q4_1_a16 = DotQ4_1A16,
                            .q8_0_a16 = DotQ8_0A16,
                            .q4_k_a16 = DotK4A16<BlockQ4_K>,
                            .q5_k_a16 = DotK4A16<BlockQ5_K>,
                            .q6_k_a16 = DotQ6_KA16,
                            .q5_0_a16 = DotQ5A16<BlockQ5_0>,
                            .q5_1_a16 = DotQ5A16<BlockQ5_1>,
                            .f32_f32 = DotF32F32,
                            .packed_tile = PackedTileReference,
                            .packed_tile_a8 = PackedTileA8Reference,
                            .quantize_a16 = QuantizeRowA16,
                            .quantize_a8 = QuantizeRowA8,
                            .exp_shifted = ExpShifted,
                            .exp_shifted_sum = ExpShiftedSum,
                            .silu_mul = SiluMul,
                            .qk_t = GenericQkT,
                            .qk_t_f16 = GenericQkTF16Of<ScalarPrimitives>,
                            .pv = GenericPv,
                            .pv_f16 = GenericPvF16Of<ScalarPrimitives>,
                            .qk_bf16 = GenericQkBf16,
                            .pv_bf16 = GenericPvBf16,
                            .to_bf16 = GenericToBf16,
                            .f16_to_f32 = F16ToF32,
                            .f16_to_f32_tile = GenericF16ToF32Tile,
                            .to_fp16 = ToFp16,
                            .argmax = ArgMax};
  return t;
}

const Primitives& Prims() {
  switch (ActiveIsa()) {
    case Isa::kAmx:
      return AmxPrimitives();
    case Isa::kAvx512:
      return Avx512Primitives();
    case Isa::kAvx2:
      return Avx2Primitives();
    case Isa::kScalar:
      break;
  }
  return ScalarPrimitives();
}

}  // namespace kvmesh::kernels::cpu
