// AVX2 + FMA + F16C versions of the dot primitives. Compiled with target attributes so the
// binary runs on any x86-64; Prims() selects them only when CPUID reports the features.
#include "kernels/cpu/primitives_avx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/q6_k_groups.h"

namespace kvmesh::kernels::cpu {
namespace {

KVMESH_AVX2 inline float H2F(uint16_t h) { return _cvtsh_ss(h); }

// 8 int32 lanes whose sum is sum_j w[j] * a[j] over 32 elements: w as two vectors of 16 int16
// (elements 0..15, 16..31), a the activation block's 32 int16.
KVMESH_AVX2 inline __m256i Madd32(__m256i w_lo, __m256i w_hi, const int16_t* a) {
  const __m256i a_lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i a_hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16));
  return _mm256_add_epi32(_mm256_madd_epi16(w_lo, a_lo), _mm256_madd_epi16(w_hi, a_hi));
}

// The 32 4-bit values of a block as int16: low nibbles are elements 0..15, high nibbles 16..31.
KVMESH_AVX2 inline void Nibbles16(const uint8_t* p, __m256i* lo, __m256i* hi) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  *lo = _mm256_cvtepu8_epi16(_mm_and_si128(packed, mask));
  *hi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), mask));
}

KVMESH_AVX2 float DotQ4_0A16(const BlockQ4_0* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i lo, hi;
    Nibbles16(x[i].qs, &lo, &hi);
    const __m256i off = _mm256_set1_epi16(8);
    const __m256i s = Madd32(_mm256_sub_epi16(lo, off), _mm256_sub_epi16(hi, off), y[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(x[i].d) * y[i].d), _mm256_cvtepi32_ps(s), acc);
  }
  return HSum(acc);
}

KVMESH_AVX2 float DotQ4_1A16(const BlockQ4_1* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    __m256i lo, hi;
    Nibbles16(x[i].qs, &lo, &hi);
    const __m256i s = Madd32(lo, hi, y[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(x[i].d) * y[i].d), _mm256_cvtepi32_ps(s), acc);
    mins += H2F(x[i].m) * y[i].d * static_cast<float>(y[i].sum);
  }
  return HSum(acc) + mins;
}

KVMESH_AVX2 float DotQ8_0A16(const BlockQ8_0* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qs + 16));
    const __m256i s = Madd32(_mm256_cvtepi8_epi16(q0), _mm256_cvtepi8_epi16(q1), y[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(H2F(x[i].d) * y[i].d), _mm256_cvtepi32_ps(s), acc);
  }
  return HSum(acc);
}

// Q4_K: per 64 elements, 32 bytes of nibbles: the low nibbles are one activation block, the
// high nibbles the next, each with its own 6-bit scale and min (as the AVX-512 dot, in 8-lane
// halves). Q5_K: the same with a fifth bit per value, bit j of qh[l] for sub-block j.
template <typename Block>
KVMESH_AVX2 float DotK4A16(const Block* x, const BlockA16* y, int64_t nb) {
  constexpr bool kFifth = std::is_same_v<Block, BlockQ5_K>;
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  const __m128i mask = _mm_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb / 8; ++i) {
    const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    __m128i qh0 = _mm_setzero_si128(), qh1 = _mm_setzero_si128();
    if constexpr (kFifth) {
      qh0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qh));
      qh1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].qh + 16));
    }
    for (int c = 0; c < 4; ++c) {
      const uint8_t* qs = x[i].qs + 32 * c;
      const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
      const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16));
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * c + half;
        const BlockA16& a = y[i * 8 + j];
        uint8_t sc, mn;
        UnpackScaleMinK4(j, x[i].scales, &sc, &mn);
        __m128i w0 = half ? _mm_and_si128(_mm_srli_epi16(q0, 4), mask) : _mm_and_si128(q0, mask);
        __m128i w1 = half ? _mm_and_si128(_mm_srli_epi16(q1, 4), mask) : _mm_and_si128(q1, mask);
        if constexpr (kFifth) {  // bit j of each byte, moved to bit 4 of its byte
          const __m128i one = _mm_set1_epi8(1);
          w0 = _mm_or_si128(w0, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh0, j), one), 4));
          w1 = _mm_or_si128(w1, _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh1, j), one), 4));
        }
        const __m256i s = Madd32(_mm256_cvtepu8_epi16(w0), _mm256_cvtepu8_epi16(w1), a.qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc * a.d), _mm256_cvtepi32_ps(s), acc);
        mins += dmin * mn * a.d * static_cast<float>(a.sum);
      }
    }
  }
  return HSum(acc) - mins;
}

// Q6_K: 6-bit values from 4 low bits (ql) and 2 high bits (qh), minus 32; a 16-element scale, so
// an activation block's two 16-element halves take one scale each.
KVMESH_AVX2 float DotQ6_KA16(const BlockQ6_K* x, const BlockA16* y, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i bias = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb / 8; ++i) {
    const float d = H2F(x[i].d);
    for (int h = 0; h < 2; ++h) {
      __m256i g[4];
      Q6KGroups(x[i], h, g);
      for (int k = 0; k < 4; ++k) {
        const int b = h * 4 + k;  // activation block within the super-block
        const BlockA16& a = y[i * 8 + b];
        const __m256i w = _mm256_sub_epi8(g[k], bias);
        const __m256i s0 =
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(w)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)));
        const __m256i s1 =
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(w, 1)),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + 16)));
        const __m256 da = _mm256_set1_ps(d * a.d);
        acc = _mm256_fmadd_ps(
            _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(x[i].scales[2 * b])), da),
            _mm256_cvtepi32_ps(s0), acc);
        acc = _mm256_fmadd_ps(
            _mm256_mul_ps(_mm256_set1_ps(static_cast<float>(x[i].scales[2 * b + 1])), da),
            _mm256_cvtepi32_ps(s1), acc);
      }
    }
  }
  return HSum(acc);
}

KVMESH_AVX2 float DotF32F32(const float* x, const float* y, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
  float s = HSum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += x[i] * y[i];
  return s;
}

KVMESH_AVX2 void ExpShifted(const float* x, float shift, float* y, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  if (i < n) {
    alignas(32) float buf[8] = {};
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    _mm256_store_ps(buf, Exp8(_mm256_sub_ps(_mm256_load_ps(buf), s)));
    for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}

// 8 lanes of partial sums over the vectors, then the lanes added pairwise (HSum).
KVMESH_AVX2 float ExpShiftedSum(const float* x, float shift, float* y, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {
    alignas(32) float buf[8] = {};
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    alignas(32) float e[8];
    _mm256_store_ps(e, Exp8(_mm256_sub_ps(_mm256_load_ps(buf), s)));
    for (int64_t j = i; j < n; ++j) y[j] = e[j - i];
    for (int64_t j = n - i; j < 8; ++j) e[j] = 0.0f;
    acc = _mm256_add_ps(acc, _mm256_load_ps(e));
  }
  return HSum(acc);
}

KVMESH_AVX2 void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, Exp8(_mm256_sub_ps(zero, g))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

KVMESH_AVX2 void ToFp16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

KVMESH_AVX2 void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

// One 32-element block at a time: scale from the absolute maximum, values rounded half to even,
// as QuantizeRowA16 / QuantizeRowA8 (kMax 32767 / 127). 8 bits are clamped in int32 (so the sum
// is of the stored values) and packed to bytes.
template <typename Block, int kMax>
KVMESH_AVX2 void QuantizeTo(const float* x, Block* y, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(xb + 8 * j);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / static_cast<float>(kMax);
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], id));  // nearest even
    if constexpr (kMax == 127) {
      for (int j = 0; j < 4; ++j) {
        q[j] = _mm256_min_epi32(_mm256_set1_epi32(127),
                                _mm256_max_epi32(_mm256_set1_epi32(-127), q[j]));
      }
      // Bytes per 128-bit lane: elements 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, 20-23, 28-31.
      const __m256i bytes =
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(y[b].qs),
          _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    } else {
      // Pack to int16 (packs works within 128-bit lanes; permute restores element order).
      const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
      const __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), p01);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs + 16), p23);
    }
    const __m256i s32 =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    y[b].d = d;
    y[b].sum = _mm_cvtsi128_si32(s);
    y[b].dsum = d * static_cast<float>(y[b].sum);
  }
}

// Where qk_t reads K: a staged fp32 tile, or fp16 groups of 16 keys in the cache converted in
// registers (the same floats: the conversion is exact). Both read whole vectors: a staged tile's
// stride covers its last vector, and a cache group always holds 16 positions per dim.
struct KtF32 {
  const float* kt;
  int64_t kts;
  KVMESH_AVX2 __m256 Load(int64_t i, int c) const { return _mm256_loadu_ps(kt + i * kts + 8 * c); }
  void Ask() const {}
};
// In the cache; `ahead` (may be null): lines asked for spread over the kernel's loop steps
// (Ask, once a step).
struct KtF16 {
  const uint16_t* const* groups;
  int64_t stride;
  Spread* ahead = nullptr;
  void Ask() const {
    if (ahead != nullptr) ahead->Step();
  }
  KVMESH_AVX2 __m256 Load(int64_t i, int c) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(groups[c / 2] + i * stride + 8 * (c & 1))));
  }
};

// Lanes [0, m) of a vector of 8 (m in [1, 8]).
KVMESH_AVX2 inline __m256i FirstLanes(int64_t m) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(m)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// qk_t, 8 keys per register: one fused multiply-add chain per key in dim order, as the scalar
// reference (same bits). GN heads x VN vectors of accumulators stay in the 16 registers (sizes
// fixed at compile time) with every chain independent, so the two FMA pipes never wait on a
// chain's latency: per dim, either the GN query values are broadcast once and each K vector is
// loaded into one register in turn (GN + 1 registers beside the accumulators), or the VN K
// vectors are loaded once and each query value broadcast in turn (VN + 1), whichever is fewer.
// Stores keys [0, n) of the tile (n <= 8 * VN) and folds their maximum into row_max.
template <int GN, int VN, typename Kt>
KVMESH_AVX2 void QkTile(const float* qs, int64_t d, const Kt& k, int64_t n, float* scores,
                        int64_t ss, float* row_max) {
  static_assert(GN * VN + std::min(GN, VN) + 1 <= 16, "the tile must fit the 16 registers");
  __m256 acc[GN][VN];
  for (int c = 0; c < VN; ++c) {
    const __m256 k0 = InRegister(k.Load(0, c));
    for (int g = 0; g < GN; ++g) acc[g][c] = _mm256_mul_ps(_mm256_set1_ps(qs[g * d]), k0);
  }
  for (int64_t i = 1; i < d; ++i) {
    k.Ask();  // one line of those ahead per dim
    if constexpr (GN <= VN) {
      __m256 qv[GN];
      for (int g = 0; g < GN; ++g) qv[g] = InRegister(_mm256_set1_ps(qs[g * d + i]));
      for (int c = 0; c < VN; ++c) {
        const __m256 kv = InRegister(k.Load(i, c));
        for (int g = 0; g < GN; ++g) acc[g][c] = _mm256_fmadd_ps(qv[g], kv, acc[g][c]);
      }
    } else {
      __m256 ki[VN];
      for (int c = 0; c < VN; ++c) ki[c] = InRegister(k.Load(i, c));
      for (int g = 0; g < GN; ++g) {
        const __m256 qv = InRegister(_mm256_set1_ps(qs[g * d + i]));
        for (int c = 0; c < VN; ++c) acc[g][c] = _mm256_fmadd_ps(qv, ki[c], acc[g][c]);
      }
    }
  }
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int g = 0; g < GN; ++g) {
    __m256 mx = neg_inf;
    for (int c = 0; c < VN; ++c) {
      const int64_t m = std::min<int64_t>(8, n - 8 * c);
      if (m == 8) {
        _mm256_storeu_ps(scores + g * ss + 8 * c, acc[g][c]);
        mx = _mm256_max_ps(mx, acc[g][c]);
      } else if (m > 0) {
        const __m256i lanes = FirstLanes(m);
        _mm256_maskstore_ps(scores + g * ss + 8 * c, lanes, acc[g][c]);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, acc[g][c], _mm256_castsi256_ps(lanes)));
      }
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    row_max[g] = std::max(row_max[g], _mm_cvtss_f32(m4));
  }
}

// A tile of vn <= VN vectors (the last, narrower tile of a row of keys).
template <int GN, int VN, typename Kt>
KVMESH_AVX2 void QkTileUpTo(int64_t vn, const float* qs, int64_t d, const Kt& k, int64_t n,
                            float* scores, int64_t ss, float* row_max) {
  if constexpr (VN > 1) {
    if (vn < VN) return QkTileUpTo<GN, VN - 1>(vn, qs, d, k, n, scores, ss, row_max);
  }
  QkTile<GN, VN>(qs, d, k, n, scores, ss, row_max);
}

// GN heads over keys [0, n) in tiles of 8 * VN keys (VN even: every tile starts a 16-key group);
// tile(j0) gives the loader for the keys from j0.
template <int GN, int VN, typename TileAt>
KVMESH_AVX2 void QkHeads(const float* qs, int64_t d, int64_t n, float* scores, int64_t ss,
                         float* row_max, const TileAt& tile) {
  static_assert(VN % 2 == 0);
  for (int64_t j0 = 0; j0 < n; j0 += 8 * VN) {
    const int64_t m = std::min<int64_t>(8 * VN, n - j0);
    QkTileUpTo<GN, VN>((m + 7) / 8, qs, d, tile(j0), m, scores + j0, ss, row_max);
  }
}

// Per pass of gn (1-4) heads: q.k's tile width in vectors of 8 keys (QkAllHeads), and p.v's
// accumulator vectors per head, W of the head dim's 8 (PvRows). QkSteps / PvSteps count the
// loops' steps from the same tables.
constexpr int kQkTileVectors[5] = {0, 8, 4, 4, 2};
constexpr int kPvPassVectors[5] = {0, 8, 4, 4, 2};

// Heads in passes of up to 4, tiles sized per pass. q (head g's value i at q[g * d + i]) is read
// in place when scale is 1 (the caller scaled it), else scaled into a buffer once per pass: x * 1
// is x, so both give the same bits.
template <typename TileAt>
KVMESH_AVX2 void QkAllHeads(const float* q, int64_t G, int64_t d, int64_t n, float scale,
                            float* scores, int64_t ss, float* row_max, const TileAt& tile) {
  for (int64_t g = 0; g < G; ++g) row_max[g] = -std::numeric_limits<float>::infinity();
  alignas(32) float buf[4 * 256];
  for (int64_t g0 = 0; g0 < G; g0 += 4) {
    const int64_t gn = std::min<int64_t>(4, G - g0);
    const float* qs = ScaledQuery(q + g0 * d, gn * d, scale, buf);
    float* out = scores + g0 * ss;
    float* mx = row_max + g0;
    switch (gn) {
      case 1:
        QkHeads<1, kQkTileVectors[1]>(qs, d, n, out, ss, mx, tile);
        break;
      case 2:
        QkHeads<2, kQkTileVectors[2]>(qs, d, n, out, ss, mx, tile);
        break;
      case 3:
        QkHeads<3, kQkTileVectors[3]>(qs, d, n, out, ss, mx, tile);
        break;
      default:
        QkHeads<4, kQkTileVectors[4]>(qs, d, n, out, ss, mx, tile);
        break;
    }
  }
}

// The steps of QkAllHeads' loops (a dim of a tile, the first dim of each tile excepted) for G
// heads over n keys.
int64_t QkSteps(int64_t G, int64_t d, int64_t n) {
  int64_t steps = 0;
  for (int64_t g0 = 0; g0 < G; g0 += 4) {
    const int64_t keys = 8 * kQkTileVectors[std::min<int64_t>(4, G - g0)];
    steps += (n + keys - 1) / keys * (d - 1);
  }
  return steps;
}

KVMESH_AVX2 void QkT(const float* q, int64_t G, int64_t d, const float* kt, int64_t kts, int64_t n,
                     float scale, float* scores, int64_t ss, float* row_max) {
  if (d > 256) return GenericQkT(q, G, d, kt, kts, n, scale, scores, ss, row_max);
  QkAllHeads(q, G, d, n, scale, scores, ss, row_max, [&](int64_t j0) {
    return KtF32{kt + j0, kts};
  });
}

KVMESH_AVX2 void QkTF16(const float* q, int64_t G, int64_t d, const uint16_t* const* groups,
                        int64_t dim_stride, int64_t n, float scale, float* scores, int64_t ss,
                        float* row_max, Ahead* ahead) {
  if (d > 256) {
    AskAll(ahead);
    return GenericQkTF16(Avx2Primitives(), q, G, d, groups, dim_stride, n, scale, scores, ss,
                         row_max, nullptr);
  }
  Spread spread(ahead != nullptr ? *ahead : Ahead{}, QkSteps(G, d, n));
  QkAllHeads(q, G, d, n, scale, scores, ss, row_max, [&](int64_t j0) {
    return KtF16{groups + j0 / 16, dim_stride, &spread};
  });
  if (ahead != nullptr) *ahead = spread.a;
  AskAll(ahead);  // what the loop's steps did not take
}

// dst[r * dst_stride + c] = float(src[r * src_stride + c]) for r < rows, c < cols.
KVMESH_AVX2 void F16ToF32Tile(const uint16_t* src, int64_t src_stride, float* dst,
                              int64_t dst_stride, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) F16ToF32(src + r * src_stride, dst + r * dst_stride, cols);
}

// p.v for head_dim 64: o[g][i] = fma(p[g][j], v[j][i], o[g][i]) for j in order (every path of
// this table the same bits: staged fp32 rows and fp16 rows converted in registers). The 8
// vectors of a head run in passes of W so G x W accumulators fit the registers.
struct F32Rows {
  const float* p;
  KVMESH_AVX2 __m256 Load(int64_t j, int c) const { return _mm256_loadu_ps(p + j * 64 + 8 * c); }
  void Ask() const {}
};
struct F16Rows {  // `ahead` as KtF16's, over the key steps
  const uint16_t* const* rows;
  Spread* ahead = nullptr;
  void Ask() const {
    if (ahead != nullptr) ahead->Step();
  }
  KVMESH_AVX2 __m256 Load(int64_t j, int c) const {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + 8 * c)));
  }
};

template <int G, int W, typename Rows>
KVMESH_AVX2 void PvRowsG(const float* p, int64_t ps, Rows v, int64_t n, float* o, int64_t os) {
  for (int c0 = 0; c0 < 8; c0 += W) {
    __m256 acc[G][W];
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < W; ++c) acc[g][c] = _mm256_loadu_ps(o + g * os + 8 * (c0 + c));
    }
    for (int64_t j = 0; j < n; ++j) {
      v.Ask();  // one line of those ahead per key
      for (int c = 0; c < W; ++c) {
        const __m256 vv = InRegister(v.Load(j, c0 + c));
        for (int g = 0; g < G; ++g)
          acc[g][c] = _mm256_fmadd_ps(_mm256_set1_ps(p[g * ps + j]), vv, acc[g][c]);
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int c = 0; c < W; ++c) _mm256_storeu_ps(o + g * os + 8 * (c0 + c), acc[g][c]);
    }
  }
}

// The steps of PvRows' loops (a key of a pass over the head dim) for G heads over n keys.
int64_t PvSteps(int64_t G, int64_t n) {
  int64_t steps = 0;
  for (int64_t g0 = 0; g0 < G; g0 += 4) {
    steps += 8 / kPvPassVectors[std::min<int64_t>(4, G - g0)] * n;
  }
  return steps;
}

// Any number of heads, in passes of 4 (each head's sums are its own: same bits for any G).
template <typename Rows>
KVMESH_AVX2 void PvRows(const float* p, int64_t ps, int64_t G, Rows v, int64_t n, float* o,
                        int64_t os) {
  for (int64_t g0 = 0; g0 < G; g0 += 4, p += 4 * ps, o += 4 * os) {
    switch (std::min<int64_t>(4, G - g0)) {
      case 1:
        PvRowsG<1, kPvPassVectors[1]>(p, ps, v, n, o, os);
        break;
      case 2:
        PvRowsG<2, kPvPassVectors[2]>(p, ps, v, n, o, os);
        break;
      case 3:
        PvRowsG<3, kPvPassVectors[3]>(p, ps, v, n, o, os);
        break;
      default:
        PvRowsG<4, kPvPassVectors[4]>(p, ps, v, n, o, os);
        break;
    }
  }
}

KVMESH_AVX2 void Pv(const float* p, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n,
                    float* o, int64_t os) {
  if (d == 64) return PvRows(p, ps, G, F32Rows{v}, n, o, os);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t i = 0; i < d; ++i)
        o[g * os + i] = std::fma(p[g * ps + j], v[j * d + i], o[g * os + i]);
    }
  }
}

KVMESH_AVX2 void PvF16(const float* p, int64_t ps, int64_t G, int64_t d,
                       const uint16_t* const* rows, int64_t n, float* o, int64_t os, Ahead* ahead) {
  if (d == 64) {
    Spread spread(ahead != nullptr ? *ahead : Ahead{}, PvSteps(G, n));
    PvRows(p, ps, G, F16Rows{rows, &spread}, n, o, os);
    if (ahead != nullptr) *ahead = spread.a;
    return AskAll(ahead);  // what the loop's steps did not take
  }
  AskAll(ahead);
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(d));
  for (int64_t j = 0; j < n; ++j) {
    F16ToF32(rows[j], row.data(), d);
    Pv(p + j, ps, G, d, row.data(), 1, o, os);
  }
}

}  // namespace

const Primitives& Avx2Primitives() {
  static const Primitives t = [] {
    Primitives d{
        .q4_0_a16 = DotQ4_0A16,
        .q4_1_a16 = DotQ4_1A16,
        .q8_0_a16 = DotQ8_0A16,
        .q4_k_a16 = DotK4A16<BlockQ4_K>,
        .q5_k_a16 = DotK4A16<BlockQ5_K>,
        .q6_k_a16 = DotQ6_KA16,
        .q5_0_a16 = ScalarPrimitives().q5_0_a16,
        .q5_1_a16 = ScalarPrimitives().q5_1_a16,
        .f32_f32 = DotF32F32,
        .quantize_a16 = QuantizeTo<BlockA16, 32767>,
        .quantize_a8 = QuantizeTo<BlockA8, 127>,
        .exp_shifted = ExpShifted,
        .exp_shifted_sum = ExpShiftedSum,
        .silu_mul = SiluMul,
        .qk_t = QkT,
        .qk_t_f16 = QkTF16,
        .pv = Pv,
        .pv_f16 = PvF16,
        .qk_bf16 = GenericQkBf16,
        .pv_bf16 = GenericPvBf16,
        .to_bf16 = GenericToBf16,
        .f16_to_f32 = F16ToF32,
        .f16_to_f32_tile = F16ToF32Tile,
        .to_fp16 = ToFp16,
        .argmax = ScalarPrimitives().argmax};  // the scalar loops, vectorised by the compiler
    SetAvx2PackedEntries(d);                   // primitives_avx2_packed.cc
    SetAvx2LaneEntries(d);                     // primitives_avx2_lanes.cc
    return d;
  }();
  return t;
}

}  // namespace kvmesh::kernels::cpu
