// The AMX table: the AVX-512 table with the packed products run on AMX tiles.
//
// A packed group-block (16 rows x 32 elements, kernels/packed.h) against 16 tokens is one tile
// product with K = 32: C[token, row] = sum_e A[token, e] * B[e, row]. AMX multiplies bytes, and
// the 16-bit activations are split exactly into bytes, a = 256 * hi + lo with hi signed and lo
// unsigned, so per block
//   s = 256 * (A_hi . B) + (A_lo . B)
// with both int32 sums exact (|s| < 2^28): the block's dot product to the bit, as VPDPWSSD
// leaves it. The fp32 steps after it are PackedTileReference's, lane for lane, so this table
// gives the same bits as every other one.
//
// A product splits its activations once into [lo x 32 | hi x 32] rows (split_a16, one VPERMB
// per block; matmul.cc), which the A tiles load directly, and copies each block's scales into a
// 16-byte head: the pass reads those, not a 76-byte BlockA16 a block and token, which kept the
// pass's working set past L1 (in-process A/B, the 16-sequence decode step at 1K: 0.959-0.975x,
// median 0.968x, seven windows). Per block: the group-block's weights widened into B's layout
// (8 rows of 16 columns x 4 bytes: row p, column r = row r's elements 4p..4p+3), two TDPB*D
// products, the two C tiles stored and each token's 16 lanes scaled as the AVX-512 kernel
// scales its registers. Products of fewer than kTileMinTokens tokens, and tails under it, run
// the AVX-512 kernel (the tile work does not pay for itself there); so does
// packed_tile, which callers use only without split rows.
//
// Q4_0 / Q4_1 packed for 8-bit activations (packed_tile_a8) run a pass of the same shape
// (AmxPassA8; the minimums, the pipeline and the stores shared) on the int8 values as they are:
// one product and one C tile a block instead of two, B laid out from the 8-bit packing's
// nibbles (WeightsAsBA8), the same scaling (PackedTileA8Reference's bits).
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

// Before primitives.h: the first <immintrin.h> of this file, with its pragma.
#include "kernels/cpu/avx512_intrinsics.h"
#include "kernels/cpu/primitives.h"
#include "kernels/packed.h"

// The kernels' ISA, for everything up to the end of the anonymous namespace (lambdas included);
// the detection and the table after it run on any CPU.
// clang-format off
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi,f16c,fma,amx-tile,amx-int8,amx-bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi,f16c,fma,amx-tile,amx-int8,amx-bf16")
#endif
// clang-format on

namespace kvmesh::kernels::cpu {
namespace {

constexpr int kTileTokens = 16;

// Tiles: 0 / 1 the C tiles of lo and hi (even blocks), 5 / 6 (odd blocks), 2 / 3 A's lo and hi,
// 4 B.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Which configuration this thread's tiles hold (it is per thread and survives context switches;
// nothing else here loads one): the products' (tokens, 1-16) or bf16 attention's (kBf16Key + the
// last group's rows).
thread_local int t_configured = 0;
constexpr int kBf16Key = 64;

// Loads the tile configuration for `tokens` A / C rows unless this thread's is already it.
void Configure(int tokens) {
  int& configured = t_configured;
  if (configured == tokens) return;
  TileConfig c;
  c.colsb[0] = c.colsb[1] = 64;  // C: tokens x 16 int32
  c.rows[0] = c.rows[1] = static_cast<uint8_t>(tokens);
  c.colsb[5] = c.colsb[6] = 64;
  c.rows[5] = c.rows[6] = static_cast<uint8_t>(tokens);
  c.colsb[2] = c.colsb[3] = 32;  // A: tokens x 32 bytes
  c.rows[2] = c.rows[3] = static_cast<uint8_t>(tokens);
  c.colsb[4] = 64;  // B: 8 rows (K / 4) x 16 columns of 4 bytes
  c.rows[4] = 8;
  // GCC 12's _tile_loadconfig tells the compiler it reads only the record's first 8 bytes, so
  // nothing kept the stores above before it but GCC's choice not to move or drop them.
  __asm__ volatile("" : : "m"(c) : "memory");
  _tile_loadconfig(&c);
  configured = tokens;
}

// The group-block's quants as B: row p, column r holds row r's elements 4p..4p+3.
template <DType T>
inline void WeightsAsB(const uint8_t* q, uint8_t* b) {
  if constexpr (PackedBytesQuants(T)) {
    // Chunk k's bytes 2r, 2r + 1 are row r's elements 2k, 2k + 1: chunks 2p and 2p + 1 side by
    // side per row.
    for (int p = 0; p < 8; ++p) {
      const __m512i lo =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * p)));
      const __m512i hi = _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * p + 32)));
      _mm512_store_si512(b + 64 * p, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  } else {
    // Chunk p's byte 2r + j holds row r's element 4p + j (low nibble) and 4p + 2 + j (high):
    // widened, dword r = b0 | b1 << 8 becomes lo(b0) | lo(b1) << 8 | hi(b0) << 16 | hi(b1) << 24.
    const __m512i mask = _mm512_set1_epi32(0x0F0F0F0F);
    for (int p = 0; p < 8; ++p) {
      const __m512i t =
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * p)));
      // (t | t << 12) & mask
      _mm512_store_si512(b + 64 * p,
                         _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(t, 12), mask, 0xA8));
    }
  }
}

// A group-block's 16 scales, or its 16 minimums, as fp32 (kernels/packed.h).
template <DType T>
inline __m512 PackedScales(const uint8_t* blk, bool minimum) {
  if constexpr (PackedScalesF32(T)) return _mm512_loadu_ps(blk + (minimum ? 64 : 0));
  return _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (minimum ? 32 : 0))));
}

// Q4_1's minimums of N tokens over a group, each token's in block order:
// min_sums[t] = sum over b of the group-block's minimums times dsum(t, b).
template <DType T, int N, typename Dsum>
__attribute__((always_inline)) inline void MinSums(const uint8_t* group, int64_t nb,
                                                   const Dsum& dsum, float (&min_sums)[N][16]) {
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  __m512 mins[N];
#pragma GCC unroll 16
  for (int t = 0; t < N; ++t) mins[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 m = PackedScales<T>(group + b * kGroupBlock, true);
#pragma GCC unroll 16
    for (int t = 0; t < N; ++t) mins[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(dsum(t, b)), mins[t]);
  }
#pragma GCC unroll 16
  for (int t = 0; t < N; ++t) _mm512_store_ps(min_sums[t], mins[t]);
}

// The passes' software pipeline over nb blocks. Iteration i: lay out block i + 2, multiply
// i + 1, store i, scale i - 1.
template <typename Prepare, typename Issue, typename Store, typename Scale>
__attribute__((always_inline)) inline void Pipeline(int64_t nb, const Prepare& prepare,
                                                    const Issue& issue, const Store& store,
                                                    const Scale& scale) {
  prepare(0);
  if (nb > 1) prepare(1);
  issue(0);
  for (int64_t i = 0; i <= nb; ++i) {
    if (i + 2 < nb) prepare(i + 2);
    if (i + 1 < nb) issue(i + 1);
    if (i < nb) store(i);
    if (i >= 1) scale(i - 1);
  }
}

// out[t] = acc[t] (+ the minimums' sums) for N tokens.
template <int N, bool kMin>
__attribute__((always_inline)) inline void StoreOut(const __m512 (&acc)[N],
                                                    const float (&min_sums)[N][16], float* out,
                                                    int64_t ldo) {
#pragma GCC unroll 16
  for (int t = 0; t < N; ++t) {
    _mm512_storeu_ps(out + t * ldo,
                     kMin ? _mm512_add_ps(acc[t], _mm512_load_ps(min_sums[t])) : acc[t]);
  }
}

// N (kTileMinTokens..16) tokens against one group; see the file comment. Software-pipelined:
// block b + 1's tile products are issued before block b's C tiles are scaled, so the tile unit
// and the vector units work at once (C tiles and buffers alternate between even and odd blocks).
// N is a constant so that the N accumulators stay in registers; Q4_1's minimums, which do not
// depend on the tiles, are summed in a pass of their own first (each token's in block order).
template <DType T, int N>
void AmxPass(const uint8_t* group, int64_t nb, const uint8_t* a_split, const BlockA16Head* heads,
             int64_t a_stride, float* out, int64_t ldo, const uint8_t* ahead) {
  constexpr bool kQ8 = PackedBytesQuants(T), kMin = PackedHasMins(T), kOffset = T == DType::kQ4_0;
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int64_t kScales = PackedScaleBytes(T);
  alignas(64) uint8_t bt[3][8][64];
  alignas(64) int32_t c[2][2][kTileTokens][16];  // [parity][lo, hi][token][row]
  alignas(64) float min_sums[N][16];
  auto head = [&](int t, int64_t b) __attribute__((always_inline))->const BlockA16Head& {
    return heads[t * a_stride + b];
  };
  if constexpr (kMin) {
    MinSums<T, N>(
        group, nb, [&](int t, int64_t b) { return head(t, b).dsum; }, min_sums);
  }
  __m512 acc[N];
#pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  Configure(N);
  // Lays out block b's B rows in buffer b % 3. Two blocks ahead of their tile load: a tile load
  // does not take data from the store buffer, so it waits for the stores to reach L1.
  auto prepare = [&](int64_t b) __attribute__((always_inline)) {
    const int buf = static_cast<int>(b % 3);
    AskAhead(ahead, b * kGroupBlock, kGroupBlock);
    WeightsAsB<T>(group + b * kGroupBlock + kScales, &bt[buf][0][0]);
  };
  // Issues block b's products into C tiles 0 / 1 (b even) or 5 / 6 (odd).
  auto issue = [&](int64_t b) __attribute__((always_inline)) {
    const int par = static_cast<int>(b & 1), buf = static_cast<int>(b % 3);
    // A: the tokens' split rows of block b, a_stride blocks apart.
    _tile_loadd(2, a_split + 64 * b, 64 * a_stride);
    _tile_loadd(3, a_split + 64 * b + 32, 64 * a_stride);
    _tile_loadd(4, &bt[buf][0][0], 64);
    if (par == 0) {
      _tile_zero(0);
      _tile_zero(1);
      if constexpr (kQ8) {  // weights signed
        _tile_dpbusd(0, 2, 4);
        _tile_dpbssd(1, 3, 4);
      } else {  // nibbles 0..15 (Q4_0's offset of 8 comes off in the scaling)
        _tile_dpbuud(0, 2, 4);
        _tile_dpbsud(1, 3, 4);
      }
    } else {
      _tile_zero(5);
      _tile_zero(6);
      if constexpr (kQ8) {
        _tile_dpbusd(5, 2, 4);
        _tile_dpbssd(6, 3, 4);
      } else {
        _tile_dpbuud(5, 2, 4);
        _tile_dpbsud(6, 3, 4);
      }
    }
  };
  // Stores block b's C tiles, an iteration after their products were issued (a tile store waits
  // for its product; issued at once, it held up everything after it).
  auto store = [&](int64_t b) __attribute__((always_inline)) {
    if ((b & 1) == 0) {
      _tile_stored(0, &c[0][0][0][0], 64);
      _tile_stored(1, &c[0][1][0][0], 64);
    } else {
      _tile_stored(5, &c[1][0][0][0], 64);
      _tile_stored(6, &c[1][1][0][0], 64);
    }
  };
  // Scales block b's stored sums into the accumulators (PackedTileReference's steps).
  auto scale = [&](int64_t b) __attribute__((always_inline)) {
    const int par = static_cast<int>(b & 1);
    const uint8_t* blk = group + b * kGroupBlock;
    const __m512 dw = PackedScales<T>(blk, false);
#pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const BlockA16Head& ab = head(t, b);
      __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(c[par][1][t]), 8),
                                   _mm512_load_si512(c[par][0][t]));
      if constexpr (kOffset) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * ab.sum));
      acc[t] =
          _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(ab.d)), dw, acc[t]);
    }
  };
  Pipeline(nb, prepare, issue, store, scale);
  StoreOut<N, kMin>(acc, min_sums, out, ldo);
}

// Q4_0 / Q4_1 packed for 8-bit activations (kernels/packed.h): chunk p's byte 4j + e holds row
// j's element 4p + e in its low nibble and row 8 + j's in its high one, so B row p is the chunk's
// low nibbles (columns 0-7) then its high ones (columns 8-15).
inline void WeightsAsBA8(const uint8_t* q, uint8_t* b) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  for (int p = 0; p < 8; ++p) {
    const __m512i x =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * p)));
    // The upper copy's 16-bit lanes shifted down a nibble, then both halves masked.
    _mm512_store_si512(b + 64 * p,
                       _mm512_and_si512(_mm512_mask_srli_epi16(x, 0xFFFF0000u, x, 4), mask));
  }
}

// AmxPass for 8-bit activations: a block's int8 values are A as they are (no split, one tile
// product and one store a block), so s is the block's exact dot product, VPMADDUBSW's sums
// widened as PackedTileA8Reference takes them, and the fp32 steps are AmxPass's.
template <DType T, int N>
void AmxPassA8(const uint8_t* group, int64_t nb, const BlockA8* a, int64_t a_stride, float* out,
               int64_t ldo, const uint8_t* ahead) {
  constexpr bool kMin = PackedHasMins(T), kOffset = T == DType::kQ4_0;
  constexpr int64_t kGroupBlock = PackedGroupBlockBytes(T);
  constexpr int64_t kScales = PackedScaleBytes(T);
  alignas(64) uint8_t bt[3][8][64];
  alignas(64) int32_t c[2][kTileTokens][16];  // [parity][token][row]
  alignas(64) float min_sums[N][16];
  auto block = [&](int t, int64_t b) __attribute__((always_inline))->const BlockA8& {
    return a[t * a_stride + b];
  };
  if constexpr (kMin) {
    MinSums<T, N>(
        group, nb, [&](int t, int64_t b) { return block(t, b).dsum; }, min_sums);
  }
  __m512 acc[N];
#pragma GCC unroll 16
  for (int t = 0; t < N; ++t) acc[t] = _mm512_setzero_ps();
  Configure(N);
  auto prepare = [&](int64_t b) __attribute__((always_inline)) {
    AskAhead(ahead, b * kGroupBlock, kGroupBlock);
    WeightsAsBA8(group + b * kGroupBlock + kScales, &bt[b % 3][0][0]);
  };
  // Block b's product into C tile 0 (b even) or 5 (odd): A the tokens' int8 values, blocks
  // a_stride apart.
  auto issue = [&](int64_t b) __attribute__((always_inline)) {
    _tile_loadd(2, a[b].qs, static_cast<int64_t>(sizeof(BlockA8)) * a_stride);
    _tile_loadd(4, &bt[b % 3][0][0], 64);
    if ((b & 1) == 0) {
      _tile_zero(0);
      _tile_dpbsud(0, 2, 4);
    } else {
      _tile_zero(5);
      _tile_dpbsud(5, 2, 4);
    }
  };
  auto store = [&](int64_t b) __attribute__((always_inline)) {
    if ((b & 1) == 0) {
      _tile_stored(0, &c[0][0][0], 64);
    } else {
      _tile_stored(5, &c[1][0][0], 64);
    }
  };
  auto scale = [&](int64_t b) __attribute__((always_inline)) {
    const int par = static_cast<int>(b & 1);
    const __m512 dw = PackedScales<T>(group + b * kGroupBlock, false);
#pragma GCC unroll 16
    for (int t = 0; t < N; ++t) {
      const BlockA8& ab = block(t, b);
      __m512i s = _mm512_load_si512(c[par][t]);
      if constexpr (kOffset) s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * ab.sum));
      acc[t] =
          _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(ab.d)), dw, acc[t]);
    }
  };
  Pipeline(nb, prepare, issue, store, scale);
  StoreOut<N, kMin>(acc, min_sums, out, ldo);
}

template <DType T>
void AmxTileA8(const uint8_t* group, int64_t nb, const BlockA8* a, int64_t a_stride, int64_t tokens,
               float* out, int64_t ldo, const uint8_t* next_group) {
  using Pass =
      void (*)(const uint8_t*, int64_t, const BlockA8*, int64_t, float*, int64_t, const uint8_t*);
  static constexpr Pass kPass[kTileTokens - kTileMinTokens + 1] = {
      AmxPassA8<T, 8>,  AmxPassA8<T, 9>,  AmxPassA8<T, 10>, AmxPassA8<T, 11>, AmxPassA8<T, 12>,
      AmxPassA8<T, 13>, AmxPassA8<T, 14>, AmxPassA8<T, 15>, AmxPassA8<T, 16>};
  int64_t t = 0;
  for (; tokens - t >= kTileMinTokens; t += kTileTokens) {
    const int64_t n = std::min<int64_t>(kTileTokens, tokens - t);
    kPass[n - kTileMinTokens](group, nb, a + t * a_stride, a_stride, out + t * ldo, ldo,
                              t == 0 ? next_group : nullptr);
  }
  if (t < tokens) {
    Avx512Primitives().packed_tile_a8(T, group, nb, a + t * a_stride, a_stride, tokens - t,
                                      out + t * ldo, ldo, t == 0 ? next_group : nullptr);
  }
}

// Block i of a's 32 values as 64 bytes at out + 64 i: their low bytes (qs byte 2e), then their
// high bytes (qs byte 2e + 1); its scales at heads[i].
void SplitA16(const BlockA16* a, int64_t blocks, uint8_t* out, BlockA16Head* heads) {
  alignas(64) static constexpr uint8_t kSplit[64] = {
      0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
      44, 46, 48, 50, 52, 54, 56, 58, 60, 62, 1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23,
      25, 27, 29, 31, 33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i split = _mm512_load_si512(kSplit);
  for (int64_t i = 0; i < blocks; ++i) {
    _mm512_storeu_si512(out + 64 * i, _mm512_permutexvar_epi8(split, _mm512_loadu_si512(a[i].qs)));
    heads[i] = {a[i].d, a[i].sum, a[i].dsum, 0};
  }
}

template <DType T>
void AmxTileSplit(const uint8_t* group, int64_t nb, const BlockA16* a, const uint8_t* a_split,
                  const BlockA16Head* heads, int64_t a_stride, int64_t tokens, float* out,
                  int64_t ldo, const uint8_t* next_group) {
  using Pass = void (*)(const uint8_t*, int64_t, const uint8_t*, const BlockA16Head*, int64_t,
                        float*, int64_t, const uint8_t*);
  static constexpr Pass kPass[kTileTokens - kTileMinTokens + 1] = {
      AmxPass<T, 8>,  AmxPass<T, 9>,  AmxPass<T, 10>, AmxPass<T, 11>, AmxPass<T, 12>,
      AmxPass<T, 13>, AmxPass<T, 14>, AmxPass<T, 15>, AmxPass<T, 16>};
  static_assert(kTileMinTokens == 8);
  int64_t t = 0;
  for (; tokens - t >= kTileMinTokens; t += kTileTokens) {
    const int64_t n = std::min<int64_t>(kTileTokens, tokens - t);
    kPass[n - kTileMinTokens](group, nb, a_split + 64 * t * a_stride, heads + t * a_stride,
                              a_stride, out + t * ldo, ldo, t == 0 ? next_group : nullptr);
  }
  if (t < tokens) {
    Avx512Primitives().packed_tile(T, group, nb, a + t * a_stride, a_stride, tokens - t,
                                   out + t * ldo, ldo, t == 0 ? next_group : nullptr);
  }
}

using SplitFn = void (*)(const uint8_t* group, int64_t nb, const BlockA16* a,
                         const uint8_t* a_split, const BlockA16Head* heads, int64_t a_stride,
                         int64_t tokens, float* out, int64_t ldo, const uint8_t* next_group);
}  // namespace

// The tile kernels by type, in a namespace of this file's own name (KernelFor, primitives.h).
namespace amx_table {
template <DType T>
struct AmxSplit {
  static constexpr SplitFn kFn = AmxTileSplit<T>;
};
template <DType T>
struct AmxA8 {
  static constexpr PackedTypeTile<BlockA8> kFn = AmxTileA8<T>;
};
}  // namespace amx_table

namespace {

void PackedTileSplitAmx(DType type, const uint8_t* group, int64_t nb, const BlockA16* a,
                        const uint8_t* a_split, const BlockA16Head* heads, int64_t a_stride,
                        int64_t tokens, float* out, int64_t ldo, const uint8_t* next_group) {
  // Q6_K and Q3_K (two scales a block) keep the AVX-512 kernel: the tiles multiply 32 elements at
  // once.
  const SplitFn k = KernelFor<SplitFn, amx_table::AmxSplit, DType::kQ4_0, DType::kQ4_1,
                              DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                              DType::kIQ4_NL, DType::kIQ4_XS>(type);
  if (k != nullptr) return k(group, nb, a, a_split, heads, a_stride, tokens, out, ldo, next_group);
  Avx512Primitives().packed_tile(type, group, nb, a, a_stride, tokens, out, ldo, next_group);
}

void PackedTileA8Amx(DType type, const uint8_t* group, int64_t nb, const BlockA8* a,
                     int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                     const uint8_t* next_group) {
  const auto k = PackedKernels8<amx_table::AmxA8>(type);
  if (k != nullptr && tokens >= kTileMinTokens) {
    return k(group, nb, a, a_stride, tokens, out, ldo, next_group);
  }
  Avx512Primitives().packed_tile_a8(type, group, nb, a, a_stride, tokens, out, ldo, next_group);
}

// bf16 attention on tiles (primitives.h qk_bf16 / pv_bf16: one TDPBF16PS sums a group of
// kBf16Group pairs exactly as the reference does, so the bits are every table's). Heads go in
// groups of 16 A / C rows, the last with `tail` rows: tiles 0 / 1 a full group's A / C, 2 / 3 the
// last group's, 4 / 5 B (16 pair rows of 16 columns, one per k step).
// tail 0: no last group (tiles 2 / 3 unused), so any of these configurations serves (calls of 48
// heads and of 3 alternate in a 16-sequence step).
void ConfigureBf16(int tail) {
  if (t_configured == kBf16Key + tail) return;
  if (tail == 0 && t_configured > kBf16Key && t_configured <= kBf16Key + 16) return;
  if (tail == 0) tail = 16;
  TileConfig c;
  for (int t = 0; t < 6; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = 16;
  }
  c.rows[2] = c.rows[3] = static_cast<uint8_t>(tail);
  __asm__ volatile("" : : "m"(c) : "memory");  // as in Configure
  _tile_loadconfig(&c);
  t_configured = kBf16Key + tail;
}

// The lines ahead are asked for spread evenly over a call's steps (a group of heads over 16
// keys, or over 16 dims): a burst of them at once stalls on the core's miss buffers (as one at
// the call's start or end: ~7-30% of these kernels' samples on the prefetches).
inline int64_t LinesPerStep(const Ahead& a, int64_t steps) { return (a.n + steps - 1) / steps; }

// The first `rows` rows of a 16 x 16 fp32 tile stored at `part`, their first m columns, to dst
// (row stride ds).
inline void CopyPartialRows(const float* part, int64_t rows, int64_t m, float* dst, int64_t ds) {
  const auto mask = static_cast<__mmask16>((1u << m) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    _mm512_mask_storeu_ps(dst + r * ds, mask, _mm512_load_ps(part + 16 * r));
  }
}

// One group of heads (A tile a_t, C tile c_t: literals, which the intrinsics paste into the
// instruction text) over 16 keys: C = 0, then both k steps (B in tiles 4 and 5), then stored.
#define KVMESH_QK_BF16_GROUP(a_t, c_t, first, rows)      \
  do {                                                   \
    for (int64_t l = 0; l < per_step; ++l) ask.One();    \
    const uint32_t* q_ = qp + (first)*dp;                \
    float* out_ = scores + (first)*ss + 16 * c;          \
    _tile_zero(c_t);                                     \
    _tile_loadd(a_t, q_, dp * 4);                        \
    _tile_dpbf16ps(c_t, a_t, 4);                         \
    _tile_loadd(a_t, q_ + 16, dp * 4);                   \
    _tile_dpbf16ps(c_t, a_t, 5);                         \
    if (n - 16 * c >= 16) {                              \
      _tile_stored(c_t, out_, ss * 4);                   \
    } else {                                             \
      _tile_stored(c_t, part, 64);                       \
      CopyPartialRows(part, rows, n - 16 * c, out_, ss); \
    }                                                    \
  } while (0)

// q.k, head dim 64 (others take the AVX-512 entry): per 16 keys, both k steps' B once, then each
// group of heads. Every call runs on tiles: against vectors for fewer than 6 heads (two builds
// alternating), one sequence over 1K keys with 100 of its own 30.4-32.0 against 33.1-33.2 us a
// layer (BM_PagedAttentionSharedDecode/1024/1/2/100/1).
void QkBf16Amx(const uint32_t* qp, int64_t G, int64_t d, const uint32_t* const* kp, int64_t kps,
               int64_t n, float* scores, int64_t ss, float* row_max, Ahead* ahead) {
  if (d != 64) return Avx512Primitives().qk_bf16(qp, G, d, kp, kps, n, scores, ss, row_max, ahead);
  Ahead none;
  Ahead& ask = ahead != nullptr ? *ahead : none;
  constexpr int64_t dp = 32;
  const int64_t full = G / 16, tail = G % 16;
  ConfigureBf16(static_cast<int>(tail));
  alignas(64) float part[16 * 16];  // a partial last block's scores, before the masked copy
  const int64_t per_step = LinesPerStep(ask, (n + 15) / 16 * (full + (tail > 0)));
  for (int64_t c = 0; c * 16 < n; ++c) {
    _tile_loadd(4, kp[c], kps * 4);
    _tile_loadd(5, kp[c] + 16 * kps, kps * 4);
    for (int64_t m = 0; m < full; ++m) KVMESH_QK_BF16_GROUP(0, 1, 16 * m, 16);
    if (tail > 0) KVMESH_QK_BF16_GROUP(2, 3, 16 * full, tail);
  }
  for (int64_t g = 0; g < G; ++g) {
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < n; j += 16) {
      const int64_t left = n - j;
      const auto mask = static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
      mx = _mm512_mask_max_ps(mx, mask, mx, _mm512_maskz_loadu_ps(mask, scores + g * ss + j));
    }
    row_max[g] = _mm512_reduce_max_ps(mx);
  }
  ask.All();
}
#undef KVMESH_QK_BF16_GROUP

// One group of heads (A tile a_t, C tile c_t) over 16 dims (slice s): C loaded from o, the k
// steps' products (B in tiles 4 and 5), C stored back.
#define KVMESH_PV_BF16_GROUP(a_t, c_t, first)         \
  do {                                                \
    for (int64_t l = 0; l < per_step; ++l) ask.One(); \
    float* c_ = o + (first)*os + 16 * s;              \
    const uint32_t* w_ = a + (first)*as;              \
    _tile_loadd(c_t, c_, os * 4);                     \
    _tile_loadd(a_t, w_, as * 4);                     \
    _tile_dpbf16ps(c_t, a_t, 4);                      \
    if (steps > 1) {                                  \
      _tile_loadd(a_t, w_ + 16, as * 4);              \
      _tile_dpbf16ps(c_t, a_t, 5);                    \
    }                                                 \
    _tile_stored(c_t, c_, os * 4);                    \
  } while (0)

// p.v, head dim 64, at most 64 keys: V's pair rows staged contiguous as B (16 pair rows per k
// step; past the last pair zero, an odd n's last second key zero), the weights too when a k step
// is partial (pairs past the last zero: the stale ones might be anything).
void PvBf16Amx(const uint32_t* pp, int64_t pps, int64_t G, int64_t d, const uint32_t* const* vp,
               int64_t n, float* o, int64_t os, Ahead* ahead) {
  if (d != 64 || n > 64 || G > 64) {  // (the staging buffers' sizes)
    return Avx512Primitives().pv_bf16(pp, pps, G, d, vp, n, o, os, ahead);
  }
  Ahead none;
  Ahead& ask = ahead != nullptr ? *ahead : none;
  constexpr int64_t dv = 64;
  const int64_t n_pairs = (n + 1) / 2, steps = (n_pairs + 15) / 16;
  alignas(64) uint32_t vb[32 * dv];
  for (int64_t jp = 0; jp < 16 * steps; ++jp) {
    for (int c = 0; c < dv / 16; ++c) {
      __m512i v = _mm512_setzero_si512();
      if (jp < n_pairs) {
        v = _mm512_loadu_si512(vp[jp] + 16 * c);
        if (2 * jp + 1 >= n) v = _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF));
      }
      _mm512_store_si512(vb + jp * dv + 16 * c, v);
    }
  }
  alignas(64) uint32_t ab[64 * 32];  // the weights, zero-padded, when n_pairs % 16 != 0
  const uint32_t* a = pp;
  int64_t as = pps;
  if (n_pairs % 16 != 0) {
    const __mmask16 keep = static_cast<__mmask16>((1u << (n_pairs % 16)) - 1);
    for (int64_t g = 0; g < G; ++g) {
      for (int64_t k = 0; k < steps; ++k) {
        const __mmask16 m = k + 1 < steps ? static_cast<__mmask16>(0xFFFF) : keep;
        _mm512_store_si512(ab + g * 32 + 16 * k,
                           _mm512_maskz_loadu_epi32(m, pp + g * pps + 16 * k));
      }
    }
    a = ab;
    as = 32;
  }
  // A subnormal C needs no flush here: the tiles read it as zero themselves, as the reference
  // does (Bf16ProductsMatchScalarReference/amx, its subnormal accumulators without weights).
  const int64_t full = G / 16, tail = G % 16;
  ConfigureBf16(static_cast<int>(tail));
  const int64_t per_step = LinesPerStep(ask, dv / 16 * (full + (tail > 0)));
  for (int64_t s = 0; s < dv / 16; ++s) {
    _tile_loadd(4, vb + 16 * s, dv * 4);
    if (steps > 1) _tile_loadd(5, vb + 16 * dv + 16 * s, dv * 4);
    for (int64_t m = 0; m < full; ++m) KVMESH_PV_BF16_GROUP(0, 1, 16 * m);
    if (tail > 0) KVMESH_PV_BF16_GROUP(2, 3, 16 * full);
  }
  ask.All();
}
#undef KVMESH_PV_BF16_GROUP

}  // namespace
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool AmxUsable() {
  static const bool usable = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    // AMX-TILE (EDX 24), AMX-INT8 (EDX 25); AVX-512 VBMI (ECX 1) for the byte split.
    if (!(d & (1u << 24)) || !(d & (1u << 25)) || !(c & (1u << 1))) return false;
    unsigned xcr0_lo, xcr0_hi;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG, XTILEDATA
    // Linux hands out the tile data state on request, once per process (arch_prctl
    // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
    constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return usable;
}

bool AmxBf16Usable() {
  unsigned a, b, c, d;
  // AMX-BF16: CPUID 7.0 EDX bit 22 (the tile state itself: AmxUsable).
  return AmxUsable() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) != 0;
}

const Primitives& AmxPrimitives() {
  static const Primitives t = [] {
    Primitives d = Avx512Primitives();
    d.split_a16 = SplitA16;
    d.packed_tile_split = PackedTileSplitAmx;
    d.packed_tile_a8 = PackedTileA8Amx;
    if (AmxBf16Usable()) {
      d.qk_bf16 = QkBf16Amx;
      d.pv_bf16 = PvBf16Amx;
      d.pair_heads_bf16 = 48;  // 16 rows of 3 query heads (SmolLM2's): three full groups of 16
    }
    return d;
  }();
  return t;
}

}  // namespace kvmesh::kernels::cpu
