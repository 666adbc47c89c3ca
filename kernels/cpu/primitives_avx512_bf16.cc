// The AVX-512 table's bf16 attention (primitives.h to_bf16, qk_bf16, pv_bf16; the opt-in
// --attention-bits 16): q.k and p.v over bf16 pairs with fused multiply-adds, or with VDPBF16PS
// where the CPU has it and it gives the reference's bits.
#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/primitives_avx512.h"

namespace kvmesh::kernels::cpu {
namespace {

// bf16 attention (primitives.h). Bf16High: Bf16Of on 16 lanes, each result's bits in its lane's
// high half (the low half zero).
KVMESH_AVX512 inline __m512i Bf16High(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
  const __mmask16 tiny = _mm512_cmplt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7F800000)),
                                                 _mm512_set1_epi32(67 << 23));
  r = _mm512_mask_and_epi32(r, tiny, u, _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

KVMESH_AVX512 void ToBf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h = _mm512_srli_epi32(Bf16High(_mm512_loadu_ps(src + i)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(h));
  }
  for (; i < n; ++i) dst[i] = Bf16Of(src[i]);
}

// bf16 pairs as fp32 vectors: the low elements (x << 16) and the high ones (x's high halves).
KVMESH_AVX512 inline __m512 PairLo(__m512i x) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
}
KVMESH_AVX512 inline __m512 PairHi(__m512i x) {
  return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// n bf16 values (pairs read as 2n elements) as floats.
KVMESH_AVX512 void Bf16ToFloats(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
  for (; i < n; ++i) dst[i] = Bf16ToFloat(src[i]);
}

KVMESH_AVX512 inline __mmask16 KeysMask(int64_t m) {
  return static_cast<__mmask16>(m >= 16 ? 0xFFFF : m <= 0 ? 0 : (1u << m) - 1);
}

// A group's low and high chains added into GN heads x VN vectors of 16 keys' scores (q.k sums run
// from 0: the first group's sums are stored as they are); keys past n (mask) are left alone.
template <int GN, int VN>
KVMESH_AVX512 inline void AddGroupScores(const __m512 (&ev)[GN][VN], const __m512 (&od)[GN][VN],
                                         bool first, const __mmask16 (&mask)[VN], float* scores,
                                         int64_t ss) {
  for (int g = 0; g < GN; ++g) {
    for (int c = 0; c < VN; ++c) {
      float* out = scores + g * ss + 16 * c;
      const __m512 prev = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[c], out);
      _mm512_mask_storeu_ps(out, mask[c], _mm512_add_ps(prev, _mm512_add_ps(ev[g][c], od[g][c])));
    }
  }
}

// row_max[g] = the larger of it and head g's scores over the VN vectors' keys below n.
template <int GN, int VN>
KVMESH_AVX512 inline void MaxScores(const __mmask16 (&mask)[VN], const float* scores, int64_t ss,
                                    float* row_max) {
  for (int g = 0; g < GN; ++g) {
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int c = 0; c < VN; ++c) {
      mx = _mm512_mask_max_ps(mx, mask[c], mx,
                              _mm512_maskz_loadu_ps(mask[c], scores + g * ss + 16 * c));
    }
    row_max[g] = std::max(row_max[g], _mm512_reduce_max_ps(mx));
  }
}

// A group's low and high chains added into GN heads' outputs, 2 vectors of 16 dims from c0.
template <int GN>
KVMESH_AVX512 inline void AddGroupOutputs(const __m512 (&ev)[GN][2], const __m512 (&od)[GN][2],
                                          float* o, int64_t os, int c0) {
  for (int g = 0; g < GN; ++g) {
    for (int c = 0; c < 2; ++c) {
      float* out = o + g * os + 16 * (c0 + c);
      _mm512_storeu_ps(out, _mm512_add_ps(_mm512_loadu_ps(out), _mm512_add_ps(ev[g][c], od[g][c])));
    }
  }
}

// The passes of both bf16 q.k kernels (fused multiply-adds, VDPBF16PS): heads kMaxG at a time,
// prepare(g0, gn) readying their query operands, keys 32 at a time, tile<GN, VN>(g0, j0) running
// GN heads from g0 over VN vectors of 16 keys from j0.
template <typename Prepare, typename Tile>
KVMESH_AVX512 void QkBf16Passes(int64_t G, int64_t n, float* row_max, const Prepare& prepare,
                                const Tile& tile) {
  for (int64_t g = 0; g < G; ++g) row_max[g] = -std::numeric_limits<float>::infinity();
  for (int64_t g0 = 0; g0 < G; g0 += kMaxG) {
    const int64_t gn = std::min<int64_t>(kMaxG, G - g0);
    prepare(g0, gn);
    for (int64_t j0 = 0; j0 < n; j0 += 32) {
      WithCount<1, kMaxG>(gn, [&]<int GN>() KVMESH_AVX512 {
        if (n - j0 > 16) {
          tile.template operator()<GN, 2>(g0, j0);
        } else {
          tile.template operator()<GN, 1>(g0, j0);
        }
      });
    }
  }
}

// The passes of both bf16 p.v kernels: heads kMaxG at a time (prepare(g0, gn) readies their
// weights and flushes their subnormal accumulators), d 32 dims at a time (tile<GN>(g0, c0)).
template <typename Prepare, typename Tile>
KVMESH_AVX512 void PvBf16Passes(int64_t G, int64_t d, const Prepare& prepare, const Tile& tile) {
  for (int64_t g0 = 0; g0 < G; g0 += kMaxG) {
    const int64_t gn = std::min<int64_t>(kMaxG, G - g0);
    prepare(g0, gn);
    WithCount<1, kMaxG>(gn, [&]<int GN>() KVMESH_AVX512 {
      for (int c0 = 0; c0 < d / 16; c0 += 2) tile.template operator()<GN>(g0, c0);
    });
  }
}

// q.k over bf16 pairs in the tiles' order (primitives.h) with fused multiply-adds: GN heads x VN
// vectors of 16 keys, each group's low and high sums in registers (24 for 6 x 2), added into the
// scores at the group's end. qf: head g's elements as floats at qf[g * 2 * dp + e].
template <int GN, int VN>
KVMESH_AVX512 void QkBf16Tile(const float* qf, int64_t dp, const uint32_t* const* kg, int64_t kps,
                              int64_t n, float* scores, int64_t ss, float* row_max, Ahead& ahead) {
  Ahead a = ahead;  // in registers for the loop
  __mmask16 mask[VN];
  for (int c = 0; c < VN; ++c) mask[c] = KeysMask(n - 16 * c);
  for (int64_t i0 = 0; i0 < dp; i0 += kBf16Group) {
    const int64_t i1 = std::min(dp, i0 + kBf16Group);
    __m512 ev[GN][VN], od[GN][VN];
    for (int g = 0; g < GN; ++g) {
      for (int c = 0; c < VN; ++c) ev[g][c] = od[g][c] = _mm512_setzero_ps();
    }
    for (int64_t i = i0; i < i1; ++i) {
      a.One();  // one line of those ahead per dim pair
      __m512 klo[VN], khi[VN];
      for (int c = 0; c < VN; ++c) {
        const __m512i k = _mm512_loadu_si512(kg[c] + i * kps);
        klo[c] = InRegister(PairLo(k));
        khi[c] = InRegister(PairHi(k));
      }
      for (int g = 0; g < GN; ++g) {
        const __m512 ql = _mm512_set1_ps(qf[g * 2 * dp + 2 * i]);
        const __m512 qh = _mm512_set1_ps(qf[g * 2 * dp + 2 * i + 1]);
        for (int c = 0; c < VN; ++c) {
          ev[g][c] = _mm512_fmadd_ps(ql, klo[c], ev[g][c]);
          od[g][c] = _mm512_fmadd_ps(qh, khi[c], od[g][c]);
        }
      }
    }
    AddGroupScores<GN, VN>(ev, od, i0 == 0, mask, scores, ss);
  }
  MaxScores<GN, VN>(mask, scores, ss, row_max);
  ahead = a;
}

constexpr int64_t kBf16MaxD = 256;  // larger head dims run the scalar entries

KVMESH_AVX512 void QkBf16(const uint32_t* qp, int64_t G, int64_t d, const uint32_t* const* kp,
                          int64_t kps, int64_t n, float* scores, int64_t ss, float* row_max,
                          Ahead* ahead) {
  if (d > kBf16MaxD) return GenericQkBf16(qp, G, d, kp, kps, n, scores, ss, row_max, ahead);
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  const int64_t dp = d / 2;
  alignas(64) float qf[kMaxG * kBf16MaxD];
  QkBf16Passes(
      G, n, row_max,
      [&](int64_t g0, int64_t gn) {
        Bf16ToFloats(reinterpret_cast<const uint16_t*>(qp + g0 * dp), qf, gn * 2 * dp);
      },
      [&]<int GN, int VN>(int64_t g0, int64_t j0) KVMESH_AVX512 {
        QkBf16Tile<GN, VN>(qf, dp, kp + j0 / 16, kps, n - j0, scores + g0 * ss + j0, ss,
                           row_max + g0, a);
      });
  a.All();
}

// p.v over bf16 pairs of keys in the tiles' order (primitives.h) with fused multiply-adds: GN
// heads x 2 vectors of 16 dims (from vector c0), each group's low and high sums in registers,
// added into o at the group's end. wf: head g's weights as floats at wf[g * wfs + key]. An odd
// n's last pair has its second key's V read as zero (a stale slot may hold anything).
template <int GN>
KVMESH_AVX512 void PvBf16G(const float* wf, int64_t wfs, const uint32_t* const* vp, int64_t n,
                           float* o, int64_t os, int c0, Ahead& ahead) {
  const int64_t n_pairs = (n + 1) / 2;
  Ahead a = ahead;  // in registers for the loop
  for (int64_t j0 = 0; j0 < n_pairs; j0 += kBf16Group) {
    const int64_t j1 = std::min(n_pairs, j0 + kBf16Group);
    __m512 ev[GN][2], od[GN][2];
    for (int g = 0; g < GN; ++g) ev[g][0] = ev[g][1] = od[g][0] = od[g][1] = _mm512_setzero_ps();
    for (int64_t jp = j0; jp < j1; ++jp) {
      a.One();  // one line of those ahead per key pair
      const __m512i keep = _mm512_set1_epi32(static_cast<int>(2 * jp + 1 < n ? 0xFFFF0000u : 0u));
      __m512 vlo[2], vhi[2];
      for (int c = 0; c < 2; ++c) {
        const __m512i v = _mm512_loadu_si512(vp[jp] + 16 * (c0 + c));
        vlo[c] = InRegister(PairLo(v));
        vhi[c] = InRegister(_mm512_castsi512_ps(_mm512_and_si512(v, keep)));
      }
      for (int g = 0; g < GN; ++g) {
        const __m512 wl = _mm512_set1_ps(wf[g * wfs + 2 * jp]);
        const __m512 wh = _mm512_set1_ps(wf[g * wfs + 2 * jp + 1]);
        for (int c = 0; c < 2; ++c) {
          ev[g][c] = _mm512_fmadd_ps(wl, vlo[c], ev[g][c]);
          od[g][c] = _mm512_fmadd_ps(wh, vhi[c], od[g][c]);
        }
      }
    }
    AddGroupOutputs<GN>(ev, od, o, os, c0);
  }
  ahead = a;
}

// A subnormal accumulator read as zero, its sign kept (the tiles read C so).
KVMESH_AVX512 inline void FlushSubnormal(float* o, int64_t n) {
  int64_t i = 0;
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(o + i);
    const __mmask16 sub = _mm512_fpclass_ps_mask(x, 0x20);
    if (sub != 0) {
      _mm512_mask_storeu_ps(o + i, sub,
                            _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), sign)));
    }
  }
  for (; i < n; ++i) {
    if (std::fpclassify(o[i]) == FP_SUBNORMAL) o[i] = std::copysign(0.0f, o[i]);
  }
}

KVMESH_AVX512 void PvBf16(const uint32_t* pp, int64_t pps, int64_t G, int64_t d,
                          const uint32_t* const* vp, int64_t n, float* o, int64_t os,
                          Ahead* ahead) {
  if (d % 32 != 0 || n > 64) return GenericPvBf16(pp, pps, G, d, vp, n, o, os, ahead);
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  const int64_t n_pairs = (n + 1) / 2;
  alignas(64) float wf[kMaxG * 64];
  PvBf16Passes(
      G, d,
      [&](int64_t g0, int64_t gn) {
        for (int64_t g = 0; g < gn; ++g) {
          Bf16ToFloats(reinterpret_cast<const uint16_t*>(pp + (g0 + g) * pps), wf + g * 64,
                       2 * n_pairs);
          FlushSubnormal(o + (g0 + g) * os, d);
        }
      },
      [&]<int GN>(int64_t g0, int c0)
          KVMESH_AVX512 { PvBf16G<GN>(wf, 64, vp, n, o + g0 * os, os, c0, a); });
  a.All();
}

// bf16 products on VDPBF16PS (AVX512_BF16: Zen 4 / 5, Cooper Lake, Sapphire Rapids): where it
// issues at the fused multiply-add's rate it does two of the tiles' chain steps at once. Per
// lane it adds its pairs' element-1 product to the accumulator, rounds, adds the element-0
// product and rounds again (two fused multiply-adds: the products of bf16 values are exact),
// so one instruction advances a chain by two pairs when element 1 holds the earlier pair's
// element and element 0 the later one's. Chain operands (ChainLo / ChainHi) pack pairs a, b
// (a first) so: the low elements' chain (a.lo, b.lo) and the high elements' (a.hi, b.hi). Its
// flush of subnormal inputs and results never applies: Bf16Of keeps operands and their products'
// sums normal (primitives.h); the one subnormal value a kernel sees, a record's accumulator, is
// flushed before the chains as the reference does.
#define KVMESH_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512bf16,f16c,fma")))

// acc = VDPBF16PS(acc, x, y) with y one 32-bit value broadcast from memory. As inline asm: with
// the intrinsic GCC 12 kept a copy of every accumulator on the stack, a store per instruction
// (twentieth session: twice p.v's time).
KVMESH_AVX512_BF16 inline __m512 DotPairsB(__m512 acc, __m512i x, const uint32_t* y) {
  __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*y));
  return acc;
}

KVMESH_AVX512 inline __m512i InRegisterI(__m512i v) {
  __asm__("" : "+v"(v));
  return v;
}
// (a.lo, b.lo) and (a.hi, b.hi) as a VDPBF16PS operand's elements 1 and 0, lane by lane: a shift
// and a word blend under a mask register (no vector constant: the p.v tile's 24 accumulators and
// 4 operands leave few registers).
constexpr __mmask32 kLowWords = 0x55555555u;
KVMESH_AVX512 inline __m512i ChainLo(__m512i a, __m512i b) {
  return _mm512_mask_blend_epi16(kLowWords, _mm512_slli_epi32(a, 16), b);
}
KVMESH_AVX512 inline __m512i ChainHi(__m512i a, __m512i b) {
  return _mm512_mask_blend_epi16(kLowWords, a, _mm512_srli_epi32(b, 16));
}
// Consecutive pairs (a, b) of each 64-bit element as their chain operands in their place:
// ChainLo(a, b) in a's lane, ChainHi(a, b) in b's (a word shuffle). n dwords from src to dst; the
// dwords from n to the vector's end are written as zeros.
KVMESH_AVX512 inline void ChainOperands(const uint32_t* src, uint32_t* dst, int64_t n) {
  const __m512i order =
      _mm512_broadcast_i32x4(_mm_setr_epi8(4, 5, 0, 1, 6, 7, 2, 3, 12, 13, 8, 9, 14, 15, 10, 11));
  for (int64_t i = 0; i < n; i += 16) {
    const __m512i x = _mm512_maskz_loadu_epi32(KeysMask(n - i), src + i);
    _mm512_storeu_si512(dst + i, _mm512_shuffle_epi8(x, order));
  }
}

// q.k: GN heads x VN vectors of 16 keys, each group's low and high chains in registers, added
// into the scores at the group's end. qx: head g's chain operands, step s (dim pairs 2s, 2s + 1)
// at qx[g * 2 * steps + 2 * s] (low) and + 1 (high).
template <int GN, int VN>
KVMESH_AVX512_BF16 void QkDpTile(const uint32_t* qx, int64_t steps, const uint32_t* const* kg,
                                 int64_t kps, int64_t n, float* scores, int64_t ss, float* row_max,
                                 Ahead& ahead) {
  Ahead a = ahead;  // in registers for the loop
  __mmask16 mask[VN];
  for (int c = 0; c < VN; ++c) mask[c] = KeysMask(n - 16 * c);
  for (int64_t s0 = 0; s0 < steps; s0 += kBf16Group / 2) {
    const int64_t s1 = std::min(steps, s0 + kBf16Group / 2);
    __m512 ev[GN][VN], od[GN][VN];
    for (int g = 0; g < GN; ++g) {
      for (int c = 0; c < VN; ++c) ev[g][c] = od[g][c] = _mm512_setzero_ps();
    }
    for (int64_t s = s0; s < s1; ++s) {
      a.One();  // one line of those ahead per dim pair, as the other kernels
      a.One();
      __m512i klo[VN], khi[VN];
      for (int c = 0; c < VN; ++c) {
        const __m512i k0 = _mm512_loadu_si512(kg[c] + 2 * s * kps);
        const __m512i k1 = _mm512_loadu_si512(kg[c] + (2 * s + 1) * kps);
        klo[c] = InRegisterI(ChainLo(k0, k1));
        khi[c] = InRegisterI(ChainHi(k0, k1));
      }
      for (int g = 0; g < GN; ++g) {
        const uint32_t* q = qx + g * 2 * steps + 2 * s;
        for (int c = 0; c < VN; ++c) {
          ev[g][c] = DotPairsB(ev[g][c], klo[c], q);
          od[g][c] = DotPairsB(od[g][c], khi[c], q + 1);
        }
      }
    }
    AddGroupScores<GN, VN>(ev, od, s0 == 0, mask, scores, ss);
  }
  MaxScores<GN, VN>(mask, scores, ss, row_max);
  ahead = a;
}

// Head dims whose pairs a step takes two at a time (a multiple of 4) up to kBf16MaxD; others take
// the fused multiply-add kernels.
KVMESH_AVX512_BF16 void QkDpBf16(const uint32_t* qp, int64_t G, int64_t d,
                                 const uint32_t* const* kp, int64_t kps, int64_t n, float* scores,
                                 int64_t ss, float* row_max, Ahead* ahead) {
  if (d % 4 != 0 || d > kBf16MaxD) return QkBf16(qp, G, d, kp, kps, n, scores, ss, row_max, ahead);
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  const int64_t dp = d / 2, steps = dp / 2;
  alignas(64) uint32_t qx[kMaxG * kBf16MaxD / 2 + 16];
  QkBf16Passes(
      G, n, row_max, [&](int64_t g0, int64_t gn) { ChainOperands(qp + g0 * dp, qx, gn * dp); },
      [&]<int GN, int VN>(int64_t g0, int64_t j0) KVMESH_AVX512_BF16 {
        QkDpTile<GN, VN>(qx, steps, kp + j0 / 16, kps, n - j0, scores + g0 * ss + j0, ss,
                         row_max + g0, a);
      });
  a.All();
}

// p.v: GN heads x 2 vectors of 16 dims (from vector c0), each group's chains in registers,
// added into o at the group's end. wx: head g's chain operands, step s (key pairs 2s, 2s + 1)
// at wx[g * wxs + 2 * s] (low: the even keys) and + 1 (high: the odd keys). A step past the
// last pair reads zeros for its second pair, and an odd n's key n (a stale slot) is zeroed: a
// weight of zero times an infinity there would be NaN.
template <int GN>
KVMESH_AVX512_BF16 void PvDpG(const uint32_t* wx, int64_t wxs, const uint32_t* const* vp, int64_t n,
                              float* o, int64_t os, int c0, Ahead& ahead) {
  const int64_t n_pairs = (n + 1) / 2;
  Ahead a = ahead;  // in registers for the loop
  for (int64_t j0 = 0; j0 < n_pairs; j0 += kBf16Group) {
    const int64_t j1 = std::min(n_pairs, j0 + kBf16Group);
    __m512 ev[GN][2], od[GN][2];
    for (int g = 0; g < GN; ++g) ev[g][0] = ev[g][1] = od[g][0] = od[g][1] = _mm512_setzero_ps();
    auto step = [&]<bool kEdge>(int64_t jp) KVMESH_AVX512_BF16 {
      a.One();  // one line of those ahead per key pair
      a.One();
      __m512i vlo[2], vhi[2];
      const uint32_t* r1 = vp[kEdge && jp + 1 >= j1 ? jp : jp + 1];
      for (int c = 0; c < 2; ++c) {
        __m512i v0 = _mm512_loadu_si512(vp[jp] + 16 * (c0 + c));
        __m512i v1 = _mm512_loadu_si512(r1 + 16 * (c0 + c));
        if constexpr (kEdge) {
          auto keep = [&](int64_t p) {  // pair p's elements that are keys below n
            return static_cast<int>(p >= j1 ? 0u : 2 * p + 1 < n ? 0xFFFFFFFFu : 0xFFFFu);
          };
          v0 = _mm512_and_si512(v0, _mm512_set1_epi32(keep(jp)));
          v1 = _mm512_and_si512(v1, _mm512_set1_epi32(keep(jp + 1)));
        }
        vlo[c] = InRegisterI(ChainLo(v0, v1));
        vhi[c] = InRegisterI(ChainHi(v0, v1));
      }
      for (int g = 0; g < GN; ++g) {
        const uint32_t* w = wx + g * wxs + jp;  // step jp / 2's operands at 2 * (jp / 2) = jp
        for (int c = 0; c < 2; ++c) {
          ev[g][c] = DotPairsB(ev[g][c], vlo[c], w);
          od[g][c] = DotPairsB(od[g][c], vhi[c], w + 1);
        }
      }
    };
    int64_t jp = j0;
    for (; jp + 1 < j1 && 2 * jp + 3 < n; jp += 2) step.template operator()<false>(jp);
    for (; jp < j1; jp += 2) step.template operator()<true>(jp);
    AddGroupOutputs<GN>(ev, od, o, os, c0);
  }
  ahead = a;
}

KVMESH_AVX512_BF16 void PvDpBf16(const uint32_t* pp, int64_t pps, int64_t G, int64_t d,
                                 const uint32_t* const* vp, int64_t n, float* o, int64_t os,
                                 Ahead* ahead) {
  if (d % 32 != 0 || n > 64) return PvBf16(pp, pps, G, d, vp, n, o, os, ahead);
  Ahead none;
  Ahead& a = ahead != nullptr ? *ahead : none;
  const int64_t n_pairs = (n + 1) / 2;
  alignas(64) uint32_t wx[kMaxG * 32];
  PvBf16Passes(
      G, d,
      [&](int64_t g0, int64_t gn) {
        for (int64_t g = 0; g < gn; ++g) {
          ChainOperands(pp + (g0 + g) * pps, wx + g * 32, n_pairs);  // past n_pairs: zeros
          FlushSubnormal(o + (g0 + g) * os, d);
        }
      },
      [&]<int GN>(int64_t g0, int c0)
          KVMESH_AVX512_BF16 { PvDpG<GN>(wx, 32, vp, n, o + g0 * os, os, c0, a); });
  a.All();
}

// Whether the kernels above give the scalar entries' bits on this CPU (CpuHasDpBf16): random
// operands of varied exponents, 7 heads (a full tile and one more), odd and even key counts. A CPU
// whose instruction rounded a pair's two products once, or added element 0's first, fails it and
// keeps the fused multiply-add kernels.
KVMESH_AVX512_BF16 bool DpBf16MatchesReference() {
  uint32_t rng = 12345;
  auto next = [&] {
    rng = rng * 1664525u + 1013904223u;
    return rng >> 8;
  };
  auto operand = [&] {  // a pair of normal bf16 values, exponents 2^-15..2^16
    auto one = [&] { return (next() & 0x807Fu) | ((112u + next() % 32u) << 7); };
    return one() | one() << 16;
  };
  constexpr int64_t G = 7, d = 64;
  std::vector<uint32_t> qp(G * d / 2), kp(d / 2 * 64), pp(G * 32), vp(32 * d);
  for (auto* v : {&qp, &kp, &pp, &vp}) {
    for (auto& x : *v) x = operand();
  }
  const uint32_t* groups[4];
  for (int c = 0; c < 4; ++c) groups[c] = kp.data() + 16 * c;
  const uint32_t* pairs[32];
  for (int jp = 0; jp < 32; ++jp) pairs[jp] = vp.data() + jp * d;
  for (const int64_t n : {64, 45}) {
    if (n % 2 != 0) {
      for (int64_t g = 0; g < G; ++g) pp[g * 32 + n / 2] &= 0xFFFFu;  // key n's weight: zero
    }
    std::vector<float> s1(G * 64), s2(G * 64), o1(G * d, 0.5f), o2(G * d, 0.5f);
    float m1[G], m2[G];
    QkDpBf16(qp.data(), G, d, groups, 64, n, s1.data(), 64, m1, nullptr);
    GenericQkBf16(qp.data(), G, d, groups, 64, n, s2.data(), 64, m2);
    PvDpBf16(pp.data(), 32, G, d, pairs, n, o1.data(), d, nullptr);
    GenericPvBf16(pp.data(), 32, G, d, pairs, n, o2.data(), d);
    if (std::memcmp(s1.data(), s2.data(), s1.size() * sizeof(float)) != 0 ||
        std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool CpuHasDpBf16() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16))) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    return (xcr0_lo & 0xE6u) == 0xE6u;
  }();
  return has;
}

bool DpBf16Usable() {
  static const bool usable = CpuHasDpBf16() && DpBf16MatchesReference();
  return usable;
}

Bf16Products Avx512FmaBf16() { return {QkBf16, PvBf16}; }
Bf16Products Avx512DpBf16() {
  return CpuHasDpBf16() ? Bf16Products{QkDpBf16, PvDpBf16} : Bf16Products{};
}

void SetBf16Entries(Primitives& d) {
  d.to_bf16 = ToBf16;
  d.qk_bf16 = QkBf16;
  d.pv_bf16 = PvBf16;
  if (DpBf16Usable()) {  // two chain steps an instruction where the CPU has VDPBF16PS
    d.qk_bf16 = QkDpBf16;
    d.pv_bf16 = PvDpBf16;
  }
  d.pair_heads_bf16 = kWideG;
}

}  // namespace kvmesh::kernels::cpu
