// The AVX2 table's packed products (primitives.h packed_tile, packed_tile_a8; kernels/packed.h):
// 16-row groups of Q4_0 / Q4_1 / Q8_0 / K-quant weights against 16-bit activations (VPMADDWD),
// and Q4_0 / Q4_1 against 8-bit ones (VPMADDUBSW), the fp32 steps those of PackedTileReference
// and PackedTileA8Reference, lane for lane (same bits).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/primitives.h"
#include "kernels/cpu/primitives_avx2.h"
#include "kernels/packed.h"

namespace kvmesh::kernels::cpu {
namespace {

// Packed 16-row groups (kernels/packed.h): a register of 8 int32 / fp32 lanes holds one 8-row
// half of the group. VPMADDWD sums each element pair into its row's lane (an exact int32 dot
// product, however it is ordered); the fp32 steps are PackedTileReference's, lane for lane
// (same bits).
KVMESH_AVX2 inline __m256i Broadcast32(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

KVMESH_AVX2 inline __m128i Load16(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The pass's share of the next group's lines (`ahead`): its bytes are cut into passes * nb
// equal shares, share k for block k % nb of pass k / nb, each line asked for once (by the share
// its start falls in), so the group's lines are spread evenly over every pass (asked for at
// once, in the first pass only, they overran the core's miss buffers when the group streams
// from memory). Share k's end is kept as quotient and remainder, stepped without a division
// per block.
class AheadShares {
 public:
  AheadShares(const uint8_t* ahead, int64_t size, int64_t nb, int64_t pass, int64_t passes)
      : base_(reinterpret_cast<uintptr_t>(ahead)),
        shares_(passes * nb),
        step_(size / shares_),
        step_rem_(size % shares_),
        end_(pass * nb * size / shares_),
        end_rem_(pass * nb * size % shares_) {
    if (ahead != nullptr && pass == 0) {
      _mm_prefetch(reinterpret_cast<const char*>(base_), _MM_HINT_T0);
    }
  }
  // Asks for the next block's share.
  KVMESH_AVX2 void Next() {
    if (base_ == 0) return;
    const int64_t begin = end_;
    end_ += step_;
    end_rem_ += step_rem_;
    if (end_rem_ >= shares_) {
      ++end_;
      end_rem_ -= shares_;
    }
    for (uintptr_t l = (base_ + begin + 63) & ~uintptr_t{63}; l < base_ + end_; l += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
    }
  }

 private:
  uintptr_t base_;
  int64_t shares_, step_, step_rem_, end_, end_rem_;
};

// The int32 sums of a whole group (both 8-row halves, h) for 4 tokens (t): s[h][t].
struct Sums4 {
  __m256i s00, s01, s02, s03, s10, s11, s12, s13;
};

// The 4-token steps of the packed kernel in assembly: GCC's allocation of the 8 sums, 4 weight
// vectors and 2 temporaries spilled (16 registers). Tokens' blocks are at a0, a0 + st,
// a0 + 2 st and a3 (bytes); each step reads broadcast activation pairs at offset `ao` of them.
// First: the block's first step, which writes the sums instead of adding to them.
constexpr int kQsOffset = offsetof(BlockA16, qs);
// clang-format off
#define KVMESH_TOKENS4(TOKEN)                                                    \
  TOKEN("(%[a0])", s00, s10) TOKEN("(%[a0],%[st],1)", s01, s11)                  \
  TOKEN("(%[a0],%[st],2)", s02, s12) TOKEN("(%[a3])", s03, s13)
#define KVMESH_SUMS4_OUT(C)                                                      \
  [s00] C(s00), [s01] C(s01), [s02] C(s02), [s03] C(s03),                        \
  [s10] C(s10), [s11] C(s11), [s12] C(s12), [s13] C(s13)
// The sums as separate variables (a struct's members would be stored back after every step).
#define KVMESH_SUMS4_PARAMS                                                      \
  __m256i &s00, __m256i &s01, __m256i &s02, __m256i &s03,                        \
  __m256i &s10, __m256i &s11, __m256i &s12, __m256i &s13
#define KVMESH_SUMS4_ARGS s00, s01, s02, s03, s10, s11, s12, s13

// Q4_0 / Q4_1 step p (elements 4p..4p+3 of 16 rows): the chunk's bytes as int16, their low
// nibbles (elements 4p, 4p + 1 of each row) and high ones (4p + 2, 4p + 3); each broadcast
// activation pair is multiplied into both halves.
#define KVMESH_Q4_UNPACK                                                         \
  "vpmovzxbw %c[qo](%[q]), %[hi0]\n\t"                                           \
  "vpmovzxbw 16+%c[qo](%[q]), %[hi1]\n\t"                                        \
  "vpand %[m], %[hi0], %[lo0]\n\t"                                               \
  "vpsrlw $4, %[hi0], %[hi0]\n\t"                                                \
  "vpand %[m], %[hi1], %[lo1]\n\t"                                               \
  "vpsrlw $4, %[hi1], %[hi1]\n\t"
#define KVMESH_Q4_PAIR(A, W0, W1, S0, S1, OFF)                                   \
  "vpbroadcastd " OFF "+%c[ao]" A ", %[x]\n\t"                                   \
  "vpmaddwd %[x], %[" #W0 "], %[y]\n\t"                                          \
  "vpaddd %[y], %[" #S0 "], %[" #S0 "]\n\t"                                      \
  "vpmaddwd %[x], %[" #W1 "], %[x]\n\t"                                          \
  "vpaddd %[x], %[" #S1 "], %[" #S1 "]\n\t"
#define KVMESH_Q4_TOKEN(A, S0, S1)                                               \
  KVMESH_Q4_PAIR(A, lo0, lo1, S0, S1, "0") KVMESH_Q4_PAIR(A, hi0, hi1, S0, S1, "4")
#define KVMESH_Q4_TOKEN_FIRST(A, S0, S1)                                         \
  "vpbroadcastd %c[ao]" A ", %[x]\n\t"                                           \
  "vpmaddwd %[x], %[lo0], %[" #S0 "]\n\t"                                        \
  "vpmaddwd %[x], %[lo1], %[" #S1 "]\n\t"                                        \
  KVMESH_Q4_PAIR(A, hi0, hi1, S0, S1, "4")
// clang-format on

// One step's asm statement: TOKEN is the first step's or a later one's, SUMS the sums'
// constraint ("=&x": written; "+x": added to).
#define KVMESH_Q4_STEP(TOKEN, SUMS)                                                            \
  asm(KVMESH_Q4_UNPACK KVMESH_TOKENS4(TOKEN)                                                   \
      : KVMESH_SUMS4_OUT(SUMS), [lo0] "=&x"(lo0), [hi0] "=&x"(hi0), [lo1] "=&x"(lo1),          \
        [hi1] "=&x"(hi1), [x] "=&x"(x), [y] "=&x"(y)                                           \
      : [q] "r"(q), [a0] "r"(a0), [st] "r"(st), [a3] "r"(a3), [m] "x"(mask), [qo] "i"(32 * P), \
        [ao] "i"(kQsOffset + 8 * P)                                                            \
      : "memory")

template <int P, bool First>
KVMESH_AVX2_INLINE void Q4Step4(const uint8_t* q, const BlockA16* a0, int64_t st,
                                const BlockA16* a3, __m256i mask, KVMESH_SUMS4_PARAMS) {
  __m256i lo0, hi0, lo1, hi1, x, y;
  if constexpr (First) {
    KVMESH_Q4_STEP(KVMESH_Q4_TOKEN_FIRST, "=&x");
  } else {
    KVMESH_Q4_STEP(KVMESH_Q4_TOKEN, "+x");
  }
}

// Q8_0 step k (elements 2k, 2k + 1 of 16 rows).
// clang-format off
#define KVMESH_Q8_UNPACK                                                         \
  "vpmovsxbw %c[qo](%[q]), %[w0]\n\t"                                            \
  "vpmovsxbw 16+%c[qo](%[q]), %[w1]\n\t"
#define KVMESH_Q8_TOKEN(A, S0, S1)                                               \
  "vpbroadcastd %c[ao]" A ", %[x]\n\t"                                           \
  "vpmaddwd %[x], %[w0], %[y]\n\t"                                               \
  "vpaddd %[y], %[" #S0 "], %[" #S0 "]\n\t"                                      \
  "vpmaddwd %[x], %[w1], %[x]\n\t"                                               \
  "vpaddd %[x], %[" #S1 "], %[" #S1 "]\n\t"
#define KVMESH_Q8_TOKEN_FIRST(A, S0, S1)                                         \
  "vpbroadcastd %c[ao]" A ", %[x]\n\t"                                           \
  "vpmaddwd %[x], %[w0], %[" #S0 "]\n\t"                                         \
  "vpmaddwd %[x], %[w1], %[" #S1 "]\n\t"
// clang-format on

#define KVMESH_Q8_STEP(TOKEN, SUMS)                                                        \
  asm(KVMESH_Q8_UNPACK KVMESH_TOKENS4(TOKEN)                                               \
      : KVMESH_SUMS4_OUT(SUMS), [w0] "=&x"(w0), [w1] "=&x"(w1), [x] "=&x"(x), [y] "=&x"(y) \
      : [q] "r"(q), [a0] "r"(a0), [st] "r"(st), [a3] "r"(a3), [qo] "i"(32 * K),            \
        [ao] "i"(kQsOffset + 4 * K)                                                        \
      : "memory")

template <int K, bool First>
KVMESH_AVX2_INLINE void Q8Step4(const uint8_t* q, const BlockA16* a0, int64_t st,
                                const BlockA16* a3, KVMESH_SUMS4_PARAMS) {
  __m256i w0, w1, x, y;
  if constexpr (First) {
    KVMESH_Q8_STEP(KVMESH_Q8_TOKEN_FIRST, "=&x");
  } else {
    KVMESH_Q8_STEP(KVMESH_Q8_TOKEN, "+x");
  }
}

// Steps Base + P (the first of them writes the sums).
template <int Base, int... P>
KVMESH_AVX2_INLINE void Q4Steps4(const uint8_t* q, const BlockA16* a0, int64_t st,
                                 const BlockA16* a3, __m256i mask, KVMESH_SUMS4_PARAMS,
                                 std::integer_sequence<int, P...>) {
  (Q4Step4<Base + P, P == 0>(q, a0, st, a3, mask, KVMESH_SUMS4_ARGS), ...);
}
// Steps Base + K (the first of them writes the sums).
template <int Base, int... K>
KVMESH_AVX2_INLINE void Q8Steps4(const uint8_t* q, const BlockA16* a0, int64_t st,
                                 const BlockA16* a3, KVMESH_SUMS4_PARAMS,
                                 std::integer_sequence<int, K...>) {
  (Q8Step4<Base + K, K == 0>(q, a0, st, a3, KVMESH_SUMS4_ARGS), ...);
}

// Rows 8 half .. 8 half + 7's scales, or (second) their minimums or second half's scales, of a
// packed group-block as fp32 (kernels/packed.h).
template <DType T>
KVMESH_AVX2_INLINE __m256 PackedScales8(const uint8_t* blk, int half, bool second) {
  if constexpr (PackedScalesF32(T)) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(blk + (second ? 64 : 0) + 32 * half));
  }
  return _mm256_cvtph_ps(Load16(blk + (second ? 32 : 0) + 16 * half));
}

// A block's int32 sums for 4 tokens, both halves of the rows (nibbles: of the stored values,
// before their offset). Half 0 / 1: the sums over elements 16 Half .. 16 Half + 15 alone.
template <DType T, int Half = -1>
KVMESH_AVX2_INLINE Sums4 BlockSums4(const uint8_t* q, const BlockA16* a0, int64_t st,
                                    const BlockA16* a3) {
  __m256i s00, s01, s02, s03, s10, s11, s12, s13;
  if constexpr (PackedBytesQuants(T) && Half >= 0) {
    Q8Steps4<8 * Half>(q, a0, st, a3, KVMESH_SUMS4_ARGS, std::make_integer_sequence<int, 8>{});
  } else if constexpr (PackedBytesQuants(T)) {
    Q8Steps4<0>(q, a0, st, a3, KVMESH_SUMS4_ARGS, std::make_integer_sequence<int, 16>{});
  } else if constexpr (Half >= 0) {  // nibble chunks 4 Half .. 4 Half + 3
    const __m256i mask = _mm256_set1_epi16(15);
    Q4Steps4<4 * Half>(q, a0, st, a3, mask, KVMESH_SUMS4_ARGS,
                       std::make_integer_sequence<int, 4>{});
  } else {
    const __m256i mask = _mm256_set1_epi16(15);
    Q4Steps4<0>(q, a0, st, a3, mask, KVMESH_SUMS4_ARGS, std::make_integer_sequence<int, 8>{});
  }
  return {s00, s01, s02, s03, s10, s11, s12, s13};
}

// acc[t] = fma(float(s) * a_t.d, w.d, acc[t]) for 4 tokens' sums of rows 0-7 (s0, scales dw0)
// and 8-15 (s1, dw1): PackedTileReference's step.
KVMESH_AVX2_INLINE void AddScaled4(const __m256i (&s0)[4], const __m256i (&s1)[4],
                                   const BlockA16* const (&ab)[4], __m256 dw0, __m256 dw1,
                                   float (&acc)[4][16]) {
  for (int t = 0; t < 4; ++t) {
    const __m256 ad = _mm256_set1_ps(ab[t]->d);
    _mm256_store_ps(acc[t], _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s0[t]), ad), dw0,
                                            _mm256_load_ps(acc[t])));
    _mm256_store_ps(acc[t] + 8, _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s1[t]), ad), dw1,
                                                _mm256_load_ps(acc[t] + 8)));
  }
}

// A whole group (both 8-row halves) against 4 tokens: each broadcast activation pair feeds
// both halves' multiply-adds. On Zen 3 a broadcast costs about as much issue bandwidth as the
// VPMADDWD it feeds (one broadcast per multiply-add: ~1 VPMADDWD per cycle; one per two:
// ~1.2-1.6), and the 8 int32 sums leave no registers for the fp32 accumulators: those
// live in L1 (touched once per block), and the Q4_1 minimums are summed in a second pass over
// the group's scales (fma in block order, as the reference).
template <DType T>
KVMESH_AVX2 void PackedGroup4(const uint8_t* group, int64_t nb, const BlockA16* a, int64_t a_stride,
                              float* out, int64_t ldo, const uint8_t* ahead, int64_t pass,
                              int64_t passes) {
  constexpr int N = 4;
  constexpr bool kMin = PackedHasMins(T);
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int64_t kScales = PackedScaleBytes(T);
  alignas(32) float acc[N][16] = {};
  AheadShares shares(ahead, nb * kGroupBlock, nb, pass, passes);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlock;
    const uint8_t* q = blk + kScales;
    shares.Next();
    const BlockA16* ab[N];
    for (int t = 0; t < N; ++t) ab[t] = a + t * a_stride + b;
    const int64_t st = a_stride * static_cast<int64_t>(sizeof(BlockA16));
    if constexpr (PackedHalfScales(T)) {  // Q6_K, Q3_K: each 16-element half with its scales
      for (int h = 0; h < 2; ++h) {
        const Sums4 u =
            h == 0 ? BlockSums4<T, 0>(q, ab[0], st, ab[3]) : BlockSums4<T, 1>(q, ab[0], st, ab[3]);
        __m256i s0[N] = {u.s00, u.s01, u.s02, u.s03}, s1[N] = {u.s10, u.s11, u.s12, u.s13};
        if constexpr (PackedNibbleOffset(T) != 0) {
          // sum (w - off) a = sum w a - off * (the half's sum of a), exactly in int32.
          for (int t = 0; t < N; ++t) {
            int32_t half_sum = 0;
            for (int e = 0; e < 16; ++e) half_sum += ab[t]->qs[16 * h + e];
            const __m256i off = _mm256_set1_epi32(PackedNibbleOffset(T) * half_sum);
            s0[t] = _mm256_sub_epi32(s0[t], off);
            s1[t] = _mm256_sub_epi32(s1[t], off);
          }
        }
        AddScaled4(s0, s1, ab, PackedScales8<T>(blk, 0, h == 1), PackedScales8<T>(blk, 1, h == 1),
                   acc);
      }
      continue;
    }
    const Sums4 u = BlockSums4<T>(q, ab[0], st, ab[3]);
    __m256i s0[N] = {u.s00, u.s01, u.s02, u.s03}, s1[N] = {u.s10, u.s11, u.s12, u.s13};
    if constexpr (T == DType::kQ4_0) {
      // sum (w - 8) a = sum w a - 8 sum a, exactly in int32 (the shift in a vector: a sum from
      // non-finite activations must not overflow in C++).
      for (int t = 0; t < N; ++t) {
        const __m256i off = _mm256_slli_epi32(_mm256_set1_epi32(ab[t]->sum), 3);
        s0[t] = _mm256_sub_epi32(s0[t], off);
        s1[t] = _mm256_sub_epi32(s1[t], off);
      }
    }
    AddScaled4(s0, s1, ab, PackedScales8<T>(blk, 0, false), PackedScales8<T>(blk, 1, false), acc);
  }
  __m256 mins0[N], mins1[N];
  for (int t = 0; t < N; ++t) mins0[t] = mins1[t] = _mm256_setzero_ps();
  if constexpr (kMin) {
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = group + b * kGroupBlock;
      const __m256 m0 = PackedScales8<T>(blk, 0, true);
      const __m256 m1 = PackedScales8<T>(blk, 1, true);
      for (int t = 0; t < N; ++t) {
        const __m256 ds = _mm256_set1_ps(a[t * a_stride + b].dsum);
        mins0[t] = _mm256_fmadd_ps(m0, ds, mins0[t]);
        mins1[t] = _mm256_fmadd_ps(m1, ds, mins1[t]);
      }
    }
  }
  for (int t = 0; t < N; ++t) {
    const __m256 r0 = _mm256_load_ps(acc[t]), r1 = _mm256_load_ps(acc[t] + 8);
    _mm256_storeu_ps(out + t * ldo, kMin ? _mm256_add_ps(r0, mins0[t]) : r0);
    _mm256_storeu_ps(out + t * ldo + 8, kMin ? _mm256_add_ps(r1, mins1[t]) : r1);
  }
}

// One 8-row half of a group against N < 4 tokens (the tail after the 4-token passes, and
// decode of up to 3 sequences, where the weights stream from memory): the sums, fp32
// accumulators and minimums of N tokens stay in registers.
template <DType T, int N>
KVMESH_AVX2 void PackedHalf(const uint8_t* group, int half, int64_t nb, const BlockA16* a,
                            int64_t a_stride, float* out, int64_t ldo, const uint8_t* ahead,
                            int64_t pass, int64_t passes) {
  constexpr bool kQ8 = PackedBytesQuants(T), kMin = PackedHasMins(T), kHalves = PackedHalfScales(T);
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int64_t kScales = PackedScaleBytes(T);
  __m256 acc[N], mins[N];
  for (int t = 0; t < N; ++t) acc[t] = mins[t] = _mm256_setzero_ps();
  AheadShares shares(ahead, nb * kGroupBlock, nb, pass, passes);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlock;
    const uint8_t* q = blk + kScales + 16 * half;
    shares.Next();
    const BlockA16* ab[N];
    __m256i s[N], s2[N];  // Q6_K: elements 16..31 sum apart, into s2
    for (int t = 0; t < N; ++t) {
      ab[t] = a + t * a_stride + b;
      s[t] = s2[t] = _mm256_setzero_si256();
    }
    if constexpr (kQ8) {
      for (int k = 0; k < 16; ++k) {
        const __m256i w = _mm256_cvtepi8_epi16(Load16(q + 32 * k));
        for (int t = 0; t < N; ++t) {
          __m256i& acc_k = kHalves && k >= 8 ? s2[t] : s[t];
          acc_k = _mm256_add_epi32(acc_k, _mm256_madd_epi16(w, Broadcast32(ab[t]->qs + 2 * k)));
        }
      }
    } else {
      for (int p = 0; p < 8; ++p) {
        const __m256i v = _mm256_cvtepu8_epi16(Load16(q + 32 * p));
        __m256i lo = _mm256_and_si256(v, _mm256_set1_epi16(15));
        __m256i hi = _mm256_srli_epi16(v, 4);
        if constexpr (PackedNibbleOffset(T) != 0) {
          lo = _mm256_sub_epi16(lo, _mm256_set1_epi16(PackedNibbleOffset(T)));
          hi = _mm256_sub_epi16(hi, _mm256_set1_epi16(PackedNibbleOffset(T)));
        }
        for (int t = 0; t < N; ++t) {
          __m256i& sp = kHalves && p >= 4 ? s2[t] : s[t];  // Q3_K: elements 16..31 apart
          sp = _mm256_add_epi32(sp, _mm256_madd_epi16(lo, Broadcast32(ab[t]->qs + 4 * p)));
          sp = _mm256_add_epi32(sp, _mm256_madd_epi16(hi, Broadcast32(ab[t]->qs + 4 * p + 2)));
        }
      }
    }
    const __m256 dw = PackedScales8<T>(blk, half, false);
    for (int t = 0; t < N; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[t]), _mm256_set1_ps(ab[t]->d)),
                               dw, acc[t]);
    }
    if constexpr (kHalves) {
      const __m256 dw2 = PackedScales8<T>(blk, half, true);
      for (int t = 0; t < N; ++t) {
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s2[t]), _mm256_set1_ps(ab[t]->d)),
                                 dw2, acc[t]);
      }
    }
    if constexpr (kMin) {
      const __m256 m = PackedScales8<T>(blk, half, true);
      for (int t = 0; t < N; ++t) {
        mins[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(ab[t]->dsum), mins[t]);
      }
    }
  }
  for (int t = 0; t < N; ++t) {
    _mm256_storeu_ps(out + t * ldo + 8 * half, kMin ? _mm256_add_ps(acc[t], mins[t]) : acc[t]);
  }
}

// Q4_0 / Q4_1 groups packed for 8-bit activations (kernels/packed.h): per 4 elements, one
// register of low nibbles (rows 0-7 x 4 elements) and one of high (rows 8-15), each
// VPMADDUBSW'd against the token's broadcast activation quad into int16 pair sums of its rows,
// which stay in int16 for the whole block (8 quads x 2 x 15 x 127 = 30,480 < 2^15: exact) and
// are widened once per block by a VPMADDWD against ones. Both halves per pass, N <= 4 tokens;
// the fp32 steps are PackedTileA8Reference's, lane for lane (same bits).
// Q4_1: a group-block's minimums times each token's scale x sum (a: the tokens' blocks of it).
template <int N>
KVMESH_AVX2_INLINE void AddMinsA8(const uint8_t* blk, const BlockA8* a, int64_t a_stride,
                                  __m256 (&mins)[N][2]) {
  const __m256 m[2] = {_mm256_cvtph_ps(Load16(blk + 32)), _mm256_cvtph_ps(Load16(blk + 48))};
  for (int t = 0; t < N; ++t) {
    const __m256 ds = _mm256_set1_ps(a[t * a_stride].dsum);
    for (int h = 0; h < 2; ++h) mins[t][h] = _mm256_fmadd_ps(m[h], ds, mins[t][h]);
  }
}

template <DType T, int N>
KVMESH_AVX2 void PackedA8Pass(const uint8_t* group, int64_t nb, const BlockA8* a, int64_t a_stride,
                              float* out, int64_t ldo, const uint8_t* ahead, int64_t pass,
                              int64_t passes) {
  constexpr bool kMin = T == DType::kQ4_1;
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int kScales = kMin ? 64 : 32;
  const __m256i mask = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[N][2], mins[N][2];
  for (int t = 0; t < N; ++t) {
    for (int h = 0; h < 2; ++h) acc[t][h] = mins[t][h] = _mm256_setzero_ps();
  }
  AheadShares shares(ahead, nb * kGroupBlock, nb, pass, passes);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = group + b * kGroupBlock;
    const uint8_t* q = blk + kScales;
    shares.Next();
    const BlockA8* ab[N];
    for (int t = 0; t < N; ++t) ab[t] = a + t * a_stride + b;
    __m256i s16[N][2];
    for (int t = 0; t < N; ++t) s16[t][0] = s16[t][1] = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * p));
      const __m256i lo = _mm256_and_si256(v, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      for (int t = 0; t < N; ++t) {
        int32_t quad;
        std::memcpy(&quad, ab[t]->qs + 4 * p, 4);
        const __m256i x = _mm256_set1_epi32(quad);
        s16[t][0] = _mm256_add_epi16(s16[t][0], _mm256_maddubs_epi16(lo, x));
        s16[t][1] = _mm256_add_epi16(s16[t][1], _mm256_maddubs_epi16(hi, x));
      }
    }
    const __m256 dw[2] = {_mm256_cvtph_ps(Load16(blk)), _mm256_cvtph_ps(Load16(blk + 16))};
    for (int t = 0; t < N; ++t) {
      const __m256 ad = _mm256_set1_ps(ab[t]->d);
      for (int h = 0; h < 2; ++h) {
        __m256i s = _mm256_madd_epi16(s16[t][h], ones);
        if constexpr (T == DType::kQ4_0) {
          s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_set1_epi32(ab[t]->sum), 3));
        }
        acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), ad), dw[h], acc[t][h]);
      }
    }
    if constexpr (kMin && N < 3) AddMinsA8(blk, a + b, a_stride, mins);
  }
  // From 3 tokens the Q4_1 minimums are a second pass over the scales (fma in block order, as
  // the reference), so the first pass keeps only the int16 sums and the fp32 accumulators
  // (one thread, 9 alternating rounds, minimum / median: 16 tokens 1.05x / 1.17x, 64 tokens
  // 1.02x / 1.02x).
  if constexpr (kMin && N >= 3) {
    for (int64_t b = 0; b < nb; ++b) AddMinsA8(group + b * kGroupBlock, a + b, a_stride, mins);
  }
  for (int t = 0; t < N; ++t) {
    for (int h = 0; h < 2; ++h) {
      _mm256_storeu_ps(out + t * ldo + 8 * h,
                       kMin ? _mm256_add_ps(acc[t][h], mins[t][h]) : acc[t][h]);
    }
  }
}

template <DType T>
KVMESH_AVX2 void PackedA8TileOf(const uint8_t* group, int64_t nb, const BlockA8* a,
                                int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                                const uint8_t* next_group) {
  using Pass = void (*)(const uint8_t*, int64_t, const BlockA8*, int64_t, float*, int64_t,
                        const uint8_t*, int64_t, int64_t);
  static constexpr Pass kTail[4] = {nullptr, PackedA8Pass<T, 1>, PackedA8Pass<T, 2>,
                                    PackedA8Pass<T, 3>};
  const int64_t rest = tokens % 4, passes = tokens / 4 + (rest > 0 ? 1 : 0);
  int64_t pass = 0, t = 0;
  for (; t + 4 <= tokens; t += 4) {
    PackedA8Pass<T, 4>(group, nb, a + t * a_stride, a_stride, out + t * ldo, ldo, next_group,
                       pass++, passes);
  }
  if (rest > 0) {
    kTail[rest](group, nb, a + t * a_stride, a_stride, out + t * ldo, ldo, next_group, pass,
                passes);
  }
}

template <DType T>
KVMESH_AVX2 void PackedTileOf(const uint8_t* group, int64_t nb, const BlockA16* a, int64_t a_stride,
                              int64_t tokens, float* out, int64_t ldo, const uint8_t* next_group) {
  using Tail = void (*)(const uint8_t*, int, int64_t, const BlockA16*, int64_t, float*, int64_t,
                        const uint8_t*, int64_t, int64_t);
  static constexpr Tail kTail[4] = {nullptr, PackedHalf<T, 1>, PackedHalf<T, 2>, PackedHalf<T, 3>};
  const int64_t rest = tokens % 4, passes = tokens / 4 + (rest > 0 ? 2 : 0);
  int64_t pass = 0, t = 0;
  for (; t + 4 <= tokens; t += 4) {
    PackedGroup4<T>(group, nb, a + t * a_stride, a_stride, out + t * ldo, ldo, next_group, pass++,
                    passes);
  }
  for (int half = 0; rest > 0 && half < 2; ++half) {
    kTail[rest](group, half, nb, a + t * a_stride, a_stride, out + t * ldo, ldo, next_group, pass++,
                passes);
  }
}

}  // namespace

// This ISA's packed kernels by type (PackedTileOfTypes), in a namespace of this file's own name:
// a template instantiated with a class template from an anonymous namespace was merged with
// the other ISA file's instantiation by GCC 12 (primitives.h).
namespace avx2_table {
template <DType T>
struct Packed16 {
  static constexpr PackedTypeTile<BlockA16> kFn = PackedTileOf<T>;
};
template <DType T>
struct Packed8 {
  static constexpr PackedTypeTile<BlockA8> kFn = PackedA8TileOf<T>;
};
}  // namespace avx2_table

void SetAvx2PackedEntries(Primitives& d) {
  d.packed_tile = PackedTileOfTypes<BlockA16, avx2_table::Packed16>;
  d.packed_tile_a8 = PackedTileOfTypes<BlockA8, avx2_table::Packed8>;
}

}  // namespace kvmesh::kernels::cpu
