// The AVX-512 table's packed products (primitives.h packed_tile, packed_tile_a8; kernels/packed.h):
// 16-row groups against 16-bit activations (VPDPWSSD) and, for Q4_0 / Q4_1, 8-bit ones
// (VPDPBUSD), the fp32 steps those of PackedTileReference and PackedTileA8Reference, lane for
// lane (same bits).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/primitives_avx512.h"
#include "kernels/packed.h"

namespace kvmesh::kernels::cpu {
namespace {

// Packed 16-row groups (kernels/packed.h) against N tokens: lane r of every register is row r.
// Per block, each token's int32 dot products build up in P independent chains (more chains for
// fewer tokens, so the multiply-add latency is hidden) and are then scaled into acc exactly as
// PackedTileReference does.
KVMESH_AVX512 inline __m512i Broadcast32(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// A packed group-block's 16 scales, or (second) its 16 minimums or second half's scales, as
// fp32 (kernels/packed.h).
template <DType T>
KVMESH_AVX512 inline __m512 PackedScales(const uint8_t* blk, bool second) {
  if constexpr (PackedScalesF32(T)) return _mm512_loadu_ps(blk + (second ? 64 : 0));
  return _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (second ? 32 : 0))));
}

template <DType T, int N>
KVMESH_AVX512 void PackedTokens(const uint8_t* group, int64_t nb, const BlockA16* a,
                                int64_t a_stride, float* out, int64_t ldo, const uint8_t* ahead) {
  constexpr bool kQ8 = PackedBytesQuants(T), kMin = PackedHasMins(T), kHalves = PackedHalfScales(T);
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int64_t kScales = PackedScaleBytes(T);
  constexpr int P = N >= 4 ? 1 : (N >= 2 ? 2 : 4);
  __m512 acc[N], mins[N];
  for (int t = 0; t < N; ++t) acc[t] = mins[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlock;
    const uint8_t* q = blk + kScales;
    AskAhead(ahead, b * kGroupBlock, kGroupBlock);
    const BlockA16* ab[N];
    for (int t = 0; t < N; ++t) ab[t] = a + t * a_stride + b;
    // Q6_K: elements 16..31 (k >= 8) sum apart, into s2.
    __m512i s[N][P], s2[N][P];
    for (int t = 0; t < N; ++t) {
      for (int c = 0; c < P; ++c) s[t][c] = _mm512_setzero_si512();
      if constexpr (kHalves) {
        for (int c = 0; c < P; ++c) s2[t][c] = _mm512_setzero_si512();
      }
    }
    if constexpr (kQ8) {
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) {
        const __m512i w =
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * k)));
        for (int t = 0; t < N; ++t) {
          __m512i& acc_k = kHalves && k >= 8 ? s2[t][k % P] : s[t][k % P];
          acc_k = _mm512_dpwssd_epi32(acc_k, w, Broadcast32(ab[t]->qs + 2 * k));
        }
      }
    } else {
#pragma GCC unroll 8
      for (int p = 0; p < 8; ++p) {
        const __m512i v =
            _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * p)));
        __m512i lo = _mm512_and_si512(v, _mm512_set1_epi16(15));
        __m512i hi = _mm512_srli_epi16(v, 4);
        if constexpr (PackedNibbleOffset(T) != 0) {
          lo = _mm512_sub_epi16(lo, _mm512_set1_epi16(PackedNibbleOffset(T)));
          hi = _mm512_sub_epi16(hi, _mm512_set1_epi16(PackedNibbleOffset(T)));
        }
        for (int t = 0; t < N; ++t) {
          // Q3_K: elements 16..31 (p >= 4) sum apart, into s2.
          auto& sp = kHalves && p >= 4 ? s2[t] : s[t];
          sp[(2 * p) % P] =
              _mm512_dpwssd_epi32(sp[(2 * p) % P], lo, Broadcast32(ab[t]->qs + 4 * p));
          sp[(2 * p + 1) % P] =
              _mm512_dpwssd_epi32(sp[(2 * p + 1) % P], hi, Broadcast32(ab[t]->qs + 4 * p + 2));
        }
      }
    }
    const __m512 dw = PackedScales<T>(blk, false);
    for (int t = 0; t < N; ++t) {
      __m512i st = s[t][0];
      for (int c = 1; c < P; ++c) st = _mm512_add_epi32(st, s[t][c]);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(st), _mm512_set1_ps(ab[t]->d)), dw,
                               acc[t]);
    }
    if constexpr (kHalves) {
      const __m512 dw2 = PackedScales<T>(blk, true);
      for (int t = 0; t < N; ++t) {
        __m512i st = s2[t][0];
        for (int c = 1; c < P; ++c) st = _mm512_add_epi32(st, s2[t][c]);
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(st), _mm512_set1_ps(ab[t]->d)),
                                 dw2, acc[t]);
      }
    }
    if constexpr (kMin) {
      const __m512 m = PackedScales<T>(blk, true);
      for (int t = 0; t < N; ++t) {
        mins[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(ab[t]->dsum), mins[t]);
      }
    }
  }
  // Unrolled, as every loop over the tokens here: left a loop, GCC kept acc and mins in memory
  // for it and cleared both with REP STOSQ on every call (~2% of the 16-token Q4_1 kernel's
  // samples; the 16-sequence decode step 0.962-0.994x without it, in-process A/B).
#pragma GCC unroll 8
  for (int t = 0; t < N; ++t) {
    _mm512_storeu_ps(out + t * ldo, kMin ? _mm512_add_ps(acc[t], mins[t]) : acc[t]);
  }
}

// A packed kernel of N tokens (N = 1..8) over one group.
template <typename Block>
using PackedTokensFn = void (*)(const uint8_t* group, int64_t nb, const Block* a, int64_t a_stride,
                                float* out, int64_t ldo, const uint8_t* ahead);

// Tokens in passes of 8 (Full) and a tail of 1-7 (tail[n]); the first pass asks for
// the next group's bytes, block by block (the weights stream from memory; at 16 tokens the
// hardware prefetcher alone leaves the kernel waiting: BM_MatMulQ4_1/1536/576/16/2/1/128
// against /1).
template <typename Block, PackedTokensFn<Block> Full>
KVMESH_AVX512 void InPassesOf8(const PackedTokensFn<Block> (&tail)[8], const uint8_t* group,
                               int64_t nb, const Block* a, int64_t a_stride, int64_t tokens,
                               float* out, int64_t ldo, const uint8_t* next_group) {
  int64_t t = 0;
  for (; t + 8 <= tokens; t += 8) {
    Full(group, nb, a + t * a_stride, a_stride, out + t * ldo, ldo, t == 0 ? next_group : nullptr);
  }
  if (t < tokens) {
    tail[tokens - t](group, nb, a + t * a_stride, a_stride, out + t * ldo, ldo,
                     t == 0 ? next_group : nullptr);
  }
}

template <DType T>
KVMESH_AVX512 void PackedTileOf(const uint8_t* group, int64_t nb, const BlockA16* a,
                                int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                                const uint8_t* next_group) {
  static constexpr PackedTokensFn<BlockA16> k[8] = {nullptr,
                                                    PackedTokens<T, 1>,
                                                    PackedTokens<T, 2>,
                                                    PackedTokens<T, 3>,
                                                    PackedTokens<T, 4>,
                                                    PackedTokens<T, 5>,
                                                    PackedTokens<T, 6>,
                                                    PackedTokens<T, 7>};
  InPassesOf8<BlockA16, PackedTokens<T, 8>>(k, group, nb, a, a_stride, tokens, out, ldo,
                                            next_group);
}

// Q4_0 / Q4_1 groups packed for 8-bit activations (kernels/packed.h): a chunk's 32 bytes hold 4
// elements of rows 0-7 in their low nibbles and of rows 8-15 in their high ones, so the low
// nibbles in the lower half of a register and the high ones in the upper make dword lane r row
// r's 4 elements: one VPDPBUSD against the token's broadcast activation quad adds row r's 4
// products to lane r (u8 weights x s8 activations into int32, exact). 8 per token and block
// where the 16-bit kernel issues 16 VPDPWSSD. Each token's block sum builds up in P chains
// (the multiply-add latency), the fp32 steps are PackedTileA8Reference's lane for lane (same
// bits), and the Q4_1 minimums are a second pass over the scales, in block order.
template <DType T, int N>
KVMESH_AVX512 void PackedA8Tokens(const uint8_t* group, int64_t nb, const BlockA8* a,
                                  int64_t a_stride, float* out, int64_t ldo, const uint8_t* ahead) {
  constexpr bool kMin = T == DType::kQ4_1;
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int kScales = kMin ? 64 : 32;
  constexpr int P = N >= 4 ? 2 : 4;
  const __m256i mask = _mm256_set1_epi8(15);
  __m512 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlock;
    const uint8_t* q = blk + kScales;
    AskAhead(ahead, b * kGroupBlock, kGroupBlock);
    const BlockA8* ab[N];
    for (int t = 0; t < N; ++t) ab[t] = a + t * a_stride + b;
    __m512i s[N][P];
    for (int t = 0; t < N; ++t) {
      for (int c = 0; c < P; ++c) s[t][c] = _mm512_setzero_si512();
    }
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * p));
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, mask)),
                                           _mm256_and_si256(_mm256_srli_epi16(v, 4), mask), 1);
      for (int t = 0; t < N; ++t) {
        int32_t quad;
        std::memcpy(&quad, ab[t]->qs + 4 * p, 4);
        s[t][p % P] = _mm512_dpbusd_epi32(s[t][p % P], w, _mm512_set1_epi32(quad));
      }
    }
    const __m512 dw = PackedScales<T>(blk, false);
    for (int t = 0; t < N; ++t) {
      __m512i st = s[t][0];
      for (int c = 1; c < P; ++c) st = _mm512_add_epi32(st, s[t][c]);
      if constexpr (T == DType::kQ4_0) {
        st = _mm512_sub_epi32(st, _mm512_slli_epi32(_mm512_set1_epi32(ab[t]->sum), 3));
      }
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(st), _mm512_set1_ps(ab[t]->d)), dw,
                               acc[t]);
    }
  }
  if constexpr (kMin) {
    __m512 mins[N];
    for (int t = 0; t < N; ++t) mins[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const __m512 m = _mm512_cvtph_ps(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + b * kGroupBlock + 32)));
      for (int t = 0; t < N; ++t) {
        mins[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(a[t * a_stride + b].dsum), mins[t]);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < N; ++t) acc[t] = _mm512_add_ps(acc[t], mins[t]);
  }
#pragma GCC unroll 8  // as PackedTokens's last loop
  for (int t = 0; t < N; ++t) _mm512_storeu_ps(out + t * ldo, acc[t]);
}

template <DType T>
KVMESH_AVX512 void PackedA8TileOf(const uint8_t* group, int64_t nb, const BlockA8* a,
                                  int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                                  const uint8_t* next_group) {
  static constexpr PackedTokensFn<BlockA8> k[8] = {nullptr,
                                                   PackedA8Tokens<T, 1>,
                                                   PackedA8Tokens<T, 2>,
                                                   PackedA8Tokens<T, 3>,
                                                   PackedA8Tokens<T, 4>,
                                                   PackedA8Tokens<T, 5>,
                                                   PackedA8Tokens<T, 6>,
                                                   PackedA8Tokens<T, 7>};
  InPassesOf8<BlockA8, PackedA8Tokens<T, 8>>(k, group, nb, a, a_stride, tokens, out, ldo,
                                             next_group);
}

}  // namespace

// This ISA's packed kernels by type (PackedTileOfTypes), in a namespace of this file's own name:
// a template instantiated with a class template from an anonymous namespace was merged with
// the other ISA file's instantiation by GCC 12 (primitives.h).
namespace avx512_table {
template <DType T>
struct Packed16 {
  static constexpr PackedTypeTile<BlockA16> kFn = PackedTileOf<T>;
};
template <DType T>
struct Packed8 {
  static constexpr PackedTypeTile<BlockA8> kFn = PackedA8TileOf<T>;
};
}  // namespace avx512_table

void SetPackedEntries(Primitives& d) {
  d.packed_tile = PackedTileOfTypes<BlockA16, avx512_table::Packed16>;
  d.packed_tile_a8 = PackedTileOfTypes<BlockA8, avx512_table::Packed8>;
}

}  // namespace kvmesh::kernels::cpu
