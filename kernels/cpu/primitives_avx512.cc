// AVX-512 (F, BW, VL, VNNI) versions of the integer dot primitives: one 512-bit register holds
// a whole 32-element block as int16, so a block is one VPDPWSSD. The fp32 primitives reuse the
// AVX2 versions (a head of 64 values fills 256-bit registers well).
#include "kernels/cpu/primitives_avx512.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/q6_k_groups.h"

namespace kvmesh::kernels::cpu {
namespace {

KVMESH_AVX512 inline float H2F(uint16_t h) { return _cvtsh_ss(h); }

// The 32 4-bit values of a block, in element order, as 32 int16.
KVMESH_AVX512 inline __m512i Nibbles32x16(const uint8_t* p) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm512_cvtepu8_epi16(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)));
}

KVMESH_AVX512 inline __m512i LoadA(const int16_t* a) { return _mm512_loadu_si512(a); }

// acc += (float(s) * da) * dw, lane by lane. The 4x4 tiles below accumulate with exactly these
// operations in the same block order, so a row's result does not depend on whether it was
// computed alone or in a tile: outputs are independent of how requests are batched.
KVMESH_AVX512 inline __m512 AccumulateBlock(__m512i s, float da, float dw, __m512 acc) {
  return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(da)),
                         _mm512_set1_ps(dw), acc);
}

KVMESH_AVX512 float DotQ4_0A16(const BlockQ4_0* x, const BlockA16* y, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  const __m512i eight = _mm512_set1_epi16(8);
  for (int64_t i = 0; i < nb; ++i) {
    const __m512i w = _mm512_sub_epi16(Nibbles32x16(x[i].qs), eight);
    const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, LoadA(y[i].qs));
    acc = AccumulateBlock(s, y[i].d, H2F(x[i].d), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

KVMESH_AVX512 float DotQ4_1A16(const BlockQ4_1* x, const BlockA16* y, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const __m512i s =
        _mm512_dpwssd_epi32(_mm512_setzero_si512(), Nibbles32x16(x[i].qs), LoadA(y[i].qs));
    acc = AccumulateBlock(s, y[i].d, H2F(x[i].d), acc);
    mins = std::fma(H2F(x[i].m), y[i].dsum, mins);
  }
  return _mm512_reduce_add_ps(acc) + mins;
}

KVMESH_AVX512 float DotQ8_0A16(const BlockQ8_0* x, const BlockA16* y, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m512i w =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs)));
    const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, LoadA(y[i].qs));
    acc = AccumulateBlock(s, y[i].d, H2F(x[i].d), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Q4_K: per 64 elements, 32 bytes of nibbles: the low nibbles are one activation block, the
// high nibbles the next; each with its own 6-bit scale and min. Q5_K: the same with a fifth
// bit per value, bit j of qh[l] for sub-block j.
template <typename Block>
KVMESH_AVX512 float DotK4A16(const Block* x, const BlockA16* y, int64_t nb) {
  constexpr bool kFifth = std::is_same_v<Block, BlockQ5_K>;
  __m512 acc = _mm512_setzero_ps();
  float mins = 0.0f;
  const __m256i mask = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb / 8; ++i) {
    const float d = H2F(x[i].d), dmin = H2F(x[i].dmin);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifth) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh));
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * c));
      const __m512i lo = _mm512_cvtepu8_epi16(_mm256_and_si256(q, mask));
      const __m512i hi = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask));
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * c + half;
        const BlockA16& a = y[i * 8 + j];
        uint8_t sc, mn;
        UnpackScaleMinK4(j, x[i].scales, &sc, &mn);
        __m512i w = half ? hi : lo;
        if constexpr (kFifth) {
          const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
          w = _mm512_or_si512(w, _mm512_slli_epi16(_mm512_cvtepu8_epi16(bit), 4));
        }
        const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(a.qs));
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d * sc * a.d), _mm512_cvtepi32_ps(s), acc);
        mins += dmin * mn * a.d * static_cast<float>(a.sum);
      }
    }
  }
  return _mm512_reduce_add_ps(acc) - mins;
}

// Q6_K: 6-bit values from 4 low bits (ql) and 2 high bits (qh), minus 32; a 16-element scale,
// so an activation block's 16 int32 lanes take two scales (lanes 0-7 and 8-15).
KVMESH_AVX512 float DotQ6_KA16(const BlockQ6_K* x, const BlockA16* y, int64_t nb) {
  __m512 acc = _mm512_setzero_ps();
  const __m256i bias = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb / 8; ++i) {
    const float d = H2F(x[i].d);
    for (int h = 0; h < 2; ++h) {
      __m256i g[4];
      Q6KGroups(x[i], h, g);
      for (int k = 0; k < 4; ++k) {
        const int b = h * 4 + k;  // activation block within the super-block
        const BlockA16& a = y[i * 8 + b];
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_sub_epi8(g[k], bias));
        const __m512i s = _mm512_dpwssd_epi32(_mm512_setzero_si512(), w, _mm512_loadu_si512(a.qs));
        const __m512 scale =
            _mm512_insertf32x8(_mm512_set1_ps(static_cast<float>(x[i].scales[2 * b])),
                               _mm256_set1_ps(static_cast<float>(x[i].scales[2 * b + 1])), 1);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(d * a.d)), _mm512_cvtepi32_ps(s),
                              acc);
      }
    }
  }
  return _mm512_reduce_add_ps(acc);
}

// A weight block as 32 int16, and its scale.
KVMESH_AVX512 inline __m512i LoadW(const BlockQ4_0& b) {
  return _mm512_sub_epi16(Nibbles32x16(b.qs), _mm512_set1_epi16(8));
}
KVMESH_AVX512 inline __m512i LoadW(const BlockQ4_1& b) { return Nibbles32x16(b.qs); }
KVMESH_AVX512 inline __m512i LoadW(const BlockQ8_0& b) {
  return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)));
}

// 4 rows x 4 tokens per pass over the blocks: each weight block is unpacked once for 4 tokens
// and each activation block loaded once for 4 rows; 16 fp32 accumulators stay in registers.
template <typename Block>
KVMESH_AVX512 void Tile4x4(const uint8_t* w, size_t w_stride, const BlockA16* a, int64_t a_stride,
                           int64_t nb, float* out, int64_t ldo) {
  constexpr bool kHasMin = std::is_same_v<Block, BlockQ4_1>;
  __m512 acc[4][4];
  for (auto& row : acc) {
    for (auto& v : row) v = _mm512_setzero_ps();
  }
  __m128 mins[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
  const Block* rows[4];
  for (int r = 0; r < 4; ++r) rows[r] = reinterpret_cast<const Block*>(w + r * w_stride);
  for (int64_t b = 0; b < nb; ++b) {
    __m512i wv[4];
    __m512 dw[4];
    for (int r = 0; r < 4; ++r) {
      wv[r] = LoadW(rows[r][b]);
      dw[r] = _mm512_set1_ps(H2F(rows[r][b].d));
    }
    alignas(16) float asum[4];
    for (int t = 0; t < 4; ++t) {
      const BlockA16& ab = a[t * a_stride + b];
      const __m512i av = _mm512_loadu_si512(ab.qs);
      const __m512 da = _mm512_set1_ps(ab.d);
      if constexpr (kHasMin) asum[t] = ab.dsum;
      for (int r = 0; r < 4; ++r) {
        const __m512 p = _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(_mm512_setzero_si512(), wv[r], av));
        acc[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(p, da), dw[r], acc[r][t]);
      }
    }
    if constexpr (kHasMin) {
      const __m128 s = _mm_load_ps(asum);
      for (int r = 0; r < 4; ++r)
        mins[r] = _mm_fmadd_ps(_mm_set1_ps(H2F(rows[r][b].m)), s, mins[r]);
    }
  }
  for (int r = 0; r < 4; ++r) {
    alignas(16) float m[4];
    _mm_store_ps(m, mins[r]);
    for (int t = 0; t < 4; ++t) out[t * ldo + r] = _mm512_reduce_add_ps(acc[r][t]) + m[t];
  }
}

// Attention for head_dim 64 over fp32-staged K/V rows (four 16-float registers per row), in
// passes of kMaxG heads or one of kWideG (primitives_avx512.h). Other shapes take the generic
// path.

// K/V rows as qk/pv read them: fp32 (staged) or fp16 (in the cache, converted in registers).
// Both give the same floats, so the two entry points are bit-identical.
struct F32Rows {
  const float* p;
  int64_t stride;
  KVMESH_AVX512 __m512 Load(int64_t j, int c) const {
    return _mm512_loadu_ps(p + j * stride + 16 * c);
  }
};
struct F16Rows {
  const uint16_t* const* rows;
  KVMESH_AVX512 __m512 Load(int64_t j, int c) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[j] + 16 * c)));
  }
};

// Where qk_t reads K: a staged fp32 tile, or fp16 groups of 16 keys in the cache converted in
// registers (the same floats: the conversion is exact).
struct KtF32 {
  const float* kt;
  int64_t kts;
  KVMESH_AVX512 __m512 Load(int64_t i, int c) const {
    return _mm512_loadu_ps(kt + i * kts + 16 * c);
  }
};
struct KtF16 {
  const uint16_t* const* groups;
  int64_t stride;
  KVMESH_AVX512 __m512 Load(int64_t i, int c) const {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(groups[c] + i * stride)));
  }
};

// qk_t, 16 keys per register: one fused multiply-add chain per key in dim order, as the scalar
// reference (same bits). GN heads x VN vectors of 16 keys of accumulators stay in registers
// (sizes fixed at compile time); each dim's K vectors are loaded once for all heads. Head g's
// scaled query is qs[g * d + i]. K is read in whole vectors (the loaders' contract), so lanes
// past key n hold whatever the cache has there; the stores and the maximum drop them.
// D: d at compile time (QkHeads), else 0.
template <int GN, int VN, int D = 0, typename Kt>
KVMESH_AVX512 void QkTile(const float* qs, int64_t d_arg, const Kt& k, int64_t n, float* scores,
                          int64_t ss, float* row_max, Ahead& ahead) {
  const int64_t d = D > 0 ? D : d_arg;
  __m512 acc[GN][VN];
  for (int c = 0; c < VN; ++c) {
    const __m512 k0 = k.Load(0, c);
    for (int g = 0; g < GN; ++g) acc[g][c] = _mm512_mul_ps(_mm512_set1_ps(qs[g * d]), k0);
  }
  Ahead a = ahead;  // in registers for the loop
  for (int64_t i = 1; i < d; ++i) {
    a.One();  // one line of those ahead per dim
    __m512 ki[VN];
    for (int c = 0; c < VN; ++c) ki[c] = InRegister(k.Load(i, c));
    for (int g = 0; g < GN; ++g) {
      const __m512 qv = _mm512_set1_ps(qs[g * d + i]);
      for (int c = 0; c < VN; ++c) acc[g][c] = _mm512_fmadd_ps(qv, ki[c], acc[g][c]);
    }
  }
  for (int g = 0; g < GN; ++g) {
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int c = 0; c < VN; ++c) {
      const int64_t m = std::min<int64_t>(16, n - 16 * c);
      if (m == 16) {
        _mm512_storeu_ps(scores + g * ss + 16 * c, acc[g][c]);
        mx = _mm512_max_ps(mx, acc[g][c]);
      } else {
        const auto mask = static_cast<__mmask16>((1u << m) - 1);
        _mm512_mask_storeu_ps(scores + g * ss + 16 * c, mask, acc[g][c]);
        mx = _mm512_mask_max_ps(mx, mask, mx, acc[g][c]);
      }
    }
    row_max[g] = std::max(row_max[g], _mm512_reduce_max_ps(mx));
  }
  ahead = a;
}

template <int GN, int D, typename Kt>
KVMESH_AVX512 void QkTileVn(int vn, const float* qs, int64_t d, const Kt& k, int64_t n,
                            float* scores, int64_t ss, float* row_max, Ahead& ahead) {
  switch (vn) {
    case 1:
      return QkTile<GN, 1, D>(qs, d, k, n, scores, ss, row_max, ahead);
    case 2:
      return QkTile<GN, 2, D>(qs, d, k, n, scores, ss, row_max, ahead);
    case 3:
      return QkTile<GN, 3, D>(qs, d, k, n, scores, ss, row_max, ahead);
    default:
      return QkTile<GN, 4, D>(qs, d, k, n, scores, ss, row_max, ahead);
  }
}

// kMaxG < G <= kWideG heads in one pass: tiles of G heads x 2 vectors of 16 keys.
template <int D, typename TileAt>
KVMESH_AVX512 void QkWide(const float* qs, int64_t G, int64_t d, int64_t n, float* scores,
                          int64_t ss, float* row_max, const TileAt& tile, Ahead& ahead) {
  WithCount<kMaxG + 1, kWideG>(G, [&]<int GN>() KVMESH_AVX512 {
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      const auto k = tile(j0);
      if (n - j0 > 16) {
        QkTile<GN, 2, D>(qs, d, k, n - j0, scores + j0, ss, row_max, ahead);
      } else {
        QkTile<GN, 1, D>(qs, d, k, n - j0, scores + j0, ss, row_max, ahead);
      }
    }
  });
}

// Heads in passes of up to kMaxG (a 6 x 4 tile: 24 accumulators); `tile(j0)` gives the K loader for
// keys [j0, j0 + 64). q is read in place when scale is 1 (the caller scaled it: attention does so
// once per call, not per chunk), else scaled into a buffer once per pass; x * 1 is x, so both give
// the same bits. The lines ahead are asked for one per dim of each tile, the rest at the end.
template <int D, typename TileAt>
KVMESH_AVX512 void QkHeadsD(const float* q, int64_t G, int64_t d, int64_t n, float scale,
                            float* scores, int64_t ss, float* row_max, const TileAt& tile,
                            Ahead& a) {
  for (int64_t g = 0; g < G; ++g) row_max[g] = -std::numeric_limits<float>::infinity();
  alignas(64) float buf[kWideG * 256];
  if (G > kMaxG && G <= kWideG) {
    QkWide<D>(ScaledQuery(q, G * d, scale, buf), G, d, n, scores, ss, row_max, tile, a);
    return;
  }
  for (int64_t g0 = 0; g0 < G; g0 += kMaxG) {
    const int64_t gn = std::min<int64_t>(kMaxG, G - g0);
    const float* qs = ScaledQuery(q + g0 * d, gn * d, scale, buf);
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
      const int vn = static_cast<int>(std::min<int64_t>(4, (n - j0 + 15) / 16));
      const auto k = tile(j0);
      float* out = scores + g0 * ss + j0;
      float* mx = row_max + g0;
      WithCount<1, kMaxG>(gn, [&]<int GN>() KVMESH_AVX512 {
        QkTileVn<GN, D>(vn, qs, d, k, n - j0, out, ss, mx, a);
      });
    }
  }
}

// Head g's query at qs + g * d: with d a compile-time 64 (this model's head dim, the common one)
// the tiles' broadcasts of the heads' q values are one base register plus constant offsets; with
// d known only at run time GCC kept a pointer per head, some of them in vector registers moved
// back for each dim (VMOVQ, on a port the fused multiply-adds use). With p.v's weights' stride
// at compile time too (PvRows), in-process A/B: BM_PagedAttentionSharedDecode
// 1024|4096/16/2/0|16|100 0.950-0.969x, one row (1024|4096/1/2/100, 0/16/2/100) 0.989-0.995x.
template <typename TileAt>
KVMESH_AVX512 void QkHeads(const float* q, int64_t G, int64_t d, int64_t n, float scale,
                           float* scores, int64_t ss, float* row_max, const TileAt& tile,
                           Ahead* ahead) {
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  if (d == 64) {
    QkHeadsD<64>(q, G, d, n, scale, scores, ss, row_max, tile, a);
  } else {
    QkHeadsD<0>(q, G, d, n, scale, scores, ss, row_max, tile, a);
  }
  a.All();
}

KVMESH_AVX512 void QkT(const float* q, int64_t G, int64_t d, const float* kt, int64_t kts,
                       int64_t n, float scale, float* scores, int64_t ss, float* row_max) {
  if (d > 256) return GenericQkT(q, G, d, kt, kts, n, scale, scores, ss, row_max);
  QkHeads(
      q, G, d, n, scale, scores, ss, row_max,
      [&](int64_t j0) {
        return KtF32{kt + j0, kts};
      },
      nullptr);
}

KVMESH_AVX512 void QkTF16(const float* q, int64_t G, int64_t d, const uint16_t* const* groups,
                          int64_t dim_stride, int64_t n, float scale, float* scores, int64_t ss,
                          float* row_max, Ahead* ahead) {
  if (d > 256) {
    return GenericQkTF16(Avx512Primitives(), q, G, d, groups, dim_stride, n, scale, scores, ss,
                         row_max, ahead);
  }
  QkHeads(
      q, G, d, n, scale, scores, ss, row_max,
      [&](int64_t j0) {
        return KtF16{groups + j0 / 16, dim_stride};
      },
      ahead);
}

// dst[r * dst_stride + c] = float(src[r * src_stride + c]) for r < rows, c < cols.
KVMESH_AVX512 void F16ToF32Tile(const uint16_t* src, int64_t src_stride, float* dst,
                                int64_t dst_stride, int64_t rows, int64_t cols) {
  const int64_t full = cols / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (cols - full)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * src_stride;
    float* d = dst + r * dst_stride;
    for (int64_t c = 0; c < full; c += 16) {
      _mm512_storeu_ps(
          d + c, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + c))));
    }
    if (tail != 0) {
      _mm512_mask_storeu_ps(d + full, tail,
                            _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, s + full)));
    }
  }
}

// silu(gate) * up, 16 lanes: AVX2's SiluMul's operations lane for lane (Exp16 gives Exp8's bits),
// the last n % 16 values by it (its 8-lane step, then std::exp), so the same bits for any n.
// Against AVX2's 8 lanes, in-process A/B: the 16-sequence decode step at 1K 0.981-1.003x
// (median 0.984x, seven windows of 48 steps each).
KVMESH_AVX512 void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, Exp16(_mm512_sub_ps(zero, g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sig), _mm512_loadu_ps(up + i)));
  }
  if (i < n) Avx2Primitives().silu_mul(gate + i, up + i, out + i, n - i);
}

// The sum of v's 16 lanes in a tree written out here (GCC's _mm512_reduce_add_ps order, which
// another compiler may lower differently): lane l + 8 onto l, then + 4, then (0 + 2) + (1 + 3).
// exp_shifted_sum's order, which the lane kernels (ExpLanes) reproduce across vectors.
KVMESH_AVX512 inline float SumOfLanes(__m512 v) {
  const __m256 h8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  const __m128 h4 = _mm_add_ps(_mm256_extractf128_ps(h8, 1), _mm256_castps256_ps128(h8));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));  // lanes 0 + 2, 1 + 3
  return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

// y = exp(x - shift) with its sum, for GN rows at once (row g at x + g * xs, y + g * xs): per
// row 16 lanes of partial sums (the tail's unused lanes add zero), then one reduction. The rows'
// vectors are independent, so their exps overlap instead of each row's few vectors waiting on
// the polynomial's latency (a head's 64 scores are only 4 vectors); each row's operations are
// the same whatever GN is.
template <int GN>
KVMESH_AVX512 void ExpShiftedSumsG(const float* x, float* y, int64_t xs, const float* shift,
                                   int64_t n, float* sums) {
  __m512 acc[GN], s[GN];
  for (int g = 0; g < GN; ++g) {
    acc[g] = _mm512_setzero_ps();
    s[g] = _mm512_set1_ps(shift[g]);
  }
  for (int64_t i = 0; i < n; i += 16) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    for (int g = 0; g < GN; ++g) {
      const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + g * xs + i), s[g]));
      _mm512_mask_storeu_ps(y + g * xs + i, m, e);
      acc[g] = _mm512_mask_add_ps(acc[g], m, acc[g], e);
    }
  }
  for (int g = 0; g < GN; ++g) sums[g] = SumOfLanes(acc[g]);
}

KVMESH_AVX512 float ExpShiftedSum(const float* x, float shift, float* y, int64_t n) {
  float sum;
  ExpShiftedSumsG<1>(x, y, 0, &shift, n, &sum);
  return sum;
}

KVMESH_AVX512 void ExpShiftedSums(float* x, int64_t xs, int64_t G, const float* shift, int64_t n,
                                  float* sums) {
  for (int64_t g0 = 0; g0 < G; g0 += 4) {
    float* r = x + g0 * xs;
    switch (std::min<int64_t>(4, G - g0)) {
      case 1:
        ExpShiftedSumsG<1>(r, r, xs, shift + g0, n, sums + g0);
        break;
      case 2:
        ExpShiftedSumsG<2>(r, r, xs, shift + g0, n, sums + g0);
        break;
      case 3:
        ExpShiftedSumsG<3>(r, r, xs, shift + g0, n, sums + g0);
        break;
      default:
        ExpShiftedSumsG<4>(r, r, xs, shift + g0, n, sums + g0);
        break;
    }
  }
}

// G heads' outputs over C of d's four 16-float vectors, from vector c0: G and C are compile-time
// counts so the G x C accumulators stay in registers.
// PS: ps at compile time (PvRows), else 0.
template <int G, int C, int PS = 0, typename Rows>
KVMESH_AVX512 void PvRowsG(const float* p, int64_t ps_arg, Rows v, int64_t n, float* o, int64_t os,
                           int c0, Ahead& ahead) {
  const int64_t ps = PS > 0 ? PS : ps_arg;
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_loadu_ps(o + g * os + 16 * (c0 + c));
  }
  Ahead a = ahead;  // in registers for the loop
  for (int64_t j = 0; j < n; ++j) {
    a.One();  // one line of those ahead per key
    __m512 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = InRegister(v.Load(j, c0 + c));
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * ps + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(w, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + g * os + 16 * (c0 + c), acc[g][c]);
  }
  ahead = a;
}

// Any number of heads (each head's sums are its own: same bits for any G): kMaxG < G <= kWideG
// in one pass over each half of d (G x 2 accumulators), else passes of up to kMaxG over all of
// d. PS: the weights' row stride at compile time (attention's 64, as QkHeads's d), else 0.
template <int PS, typename Rows>
KVMESH_AVX512 void PvRowsP(const float* p, int64_t ps, int64_t G, Rows v, int64_t n, float* o,
                           int64_t os, Ahead& a) {
  if (G > kMaxG && G <= kWideG) {
    return WithCount<kMaxG + 1, kWideG>(G, [&]<int GN>() KVMESH_AVX512 {
      for (int c0 = 0; c0 < 4; c0 += 2) PvRowsG<GN, 2, PS>(p, ps, v, n, o, os, c0, a);
    });
  }
  for (int64_t g0 = 0; g0 < G; g0 += kMaxG, p += kMaxG * ps, o += kMaxG * os) {
    WithCount<1, kMaxG>(std::min(kMaxG, G - g0), [&]<int GN>() KVMESH_AVX512 {
      PvRowsG<GN, 4, PS>(p, ps, v, n, o, os, 0, a);
    });
  }
}

// The lines ahead are asked for one per key of each pass, the rest at the end.
template <typename Rows>
KVMESH_AVX512 void PvRows(const float* p, int64_t ps, int64_t G, Rows v, int64_t n, float* o,
                          int64_t os, Ahead* ahead) {
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  if (ps == 64) {
    PvRowsP<64>(p, ps, G, v, n, o, os, a);
  } else {
    PvRowsP<0>(p, ps, G, v, n, o, os, a);
  }
  a.All();
}

KVMESH_AVX512 void Pv(const float* p, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n,
                      float* o, int64_t os) {
  if (d != 64) return GenericPv(p, ps, G, d, v, n, o, os);
  PvRows(p, ps, G, F32Rows{v, 64}, n, o, os, nullptr);
}

KVMESH_AVX512 void PvF16(const float* p, int64_t ps, int64_t G, int64_t d,
                         const uint16_t* const* rows, int64_t n, float* o, int64_t os,
                         Ahead* ahead) {
  if (d != 64) return GenericPvF16(Avx512Primitives(), p, ps, G, d, rows, n, o, os, ahead);
  PvRows(p, ps, G, F16Rows{rows}, n, o, os, ahead);
}

// argmax in one pass: per lane the largest value so far and its first index (a strict >, which
// a NaN never passes), then the smallest index among the lanes holding the maximum. Against the
// scalar table's two passes (the second up to the maximum's position): 16 rows of 49,152 logits
// (3 MB, a 16-sequence decode step's) in 95 against 320 us on this session's Intel Xeon.
KVMESH_AVX512 int64_t ArgMax(const float* x, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (n >= (int64_t{1} << 31)) return ScalarPrimitives().argmax(x, n);  // int32 lane indices
  __m512 best = _mm512_set1_ps(kNegInf);
  __m512i best_at = _mm512_setzero_si512();
  __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __mmask16 gt = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
    best = _mm512_mask_mov_ps(best, gt, v);
    best_at = _mm512_mask_mov_epi32(best_at, gt, at);
    at = _mm512_add_epi32(at, _mm512_set1_epi32(16));
  }
  float m = _mm512_reduce_max_ps(best);
  int64_t k = _mm512_mask_reduce_min_epi32(_mm512_cmp_ps_mask(best, _mm512_set1_ps(m), _CMP_EQ_OQ),
                                           best_at);
  for (; i < n; ++i) {  // the tail's positions come after every lane's
    if (x[i] > m) {
      m = x[i];
      k = i;
    }
  }
  // Nothing above -inf: the first -inf, if any, as the scalar loops find it.
  return m == kNegInf ? ScalarPrimitives().argmax(x, n) : k;
}

KVMESH_AVX512 void F16ToF32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(
        dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

}  // namespace

const Primitives& Avx512Primitives() {
  static const Primitives t = [] {
    Primitives d = Avx2Primitives();
    d.q4_0_a16 = DotQ4_0A16;
    d.q4_1_a16 = DotQ4_1A16;
    d.q8_0_a16 = DotQ8_0A16;
    d.q4_k_a16 = DotK4A16<BlockQ4_K>;
    d.q5_k_a16 = DotK4A16<BlockQ5_K>;
    d.q6_k_a16 = DotQ6_KA16;
    d.q4_0_tile = Tile4x4<BlockQ4_0>;
    d.q4_1_tile = Tile4x4<BlockQ4_1>;
    d.q8_0_tile = Tile4x4<BlockQ8_0>;
    SetPackedEntries(d);  // primitives_avx512_packed.cc
    d.qk_t = QkT;
    d.qk_t_f16 = QkTF16;
    d.f16_to_f32_tile = F16ToF32Tile;
    d.exp_shifted_sum = ExpShiftedSum;
    d.exp_shifted_sums = ExpShiftedSums;
    d.pv = Pv;
    d.pv_f16 = PvF16;
    d.pair_heads = kWideG;  // 12 heads' q.k and p.v in one pass
    SetLaneEntries(d);      // primitives_avx512_lanes.cc
    d.f16_to_f32 = F16ToF32;
    d.argmax = ArgMax;
    d.silu_mul = SiluMul;
    SetBf16Entries(d);  // primitives_avx512_bf16.cc
    return d;
  }();
  return t;
}

}  // namespace kvmesh::kernels::cpu
