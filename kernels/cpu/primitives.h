// Internal: the vector primitives under the CPU kernels (dot products, tiled products,
// activation quantisation, exp), as a table per ISA: scalar, AVX2, AVX-512. nb counts
// 32-element blocks; n counts elements.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/quant.h"

namespace kvmesh::kernels::cpu {

// Cache lines a qk_t_f16 / pv_f16 call asks for while it runs, for work after it (attention's
// next chunk, the next units' keys): a hint, on which no result depends. The kernel asks for all
// of them before it returns, spread over its loop where it can (a burst of prefetches stalls on
// the core's miss buffers: attention's bursts of up to 64 lines took ~6% of a 16-sequence
// layer), else at its start, and leaves n at 0. Null: none. A kernel's loop steps call One() on
// a local copy (kept in registers) and store it back after the loop. l2: into L2 only
// (prefetcht1), for lines whose use comes after more data than L1 holds has passed through it.
struct Ahead {
  const void* const* lines = nullptr;
  int64_t n = 0;
  bool l2 = false;
  void One() {
    if (n > 0) {
      if (l2) {
        __builtin_prefetch(*lines, 0, 2);
      } else {
        __builtin_prefetch(*lines);
      }
      ++lines;
      --n;
    }
  }
  void All() {
    while (n > 0) One();
  }
};
inline void AskAll(Ahead* a) {
  if (a != nullptr) a->All();
}

// Asks for bytes [at, at + n) of the next packed group (null: none), a line at a time, into L1.
// Always inlined: as a call it made the kernels around it save and restore their accumulators
// every block (the 16-bit product at 16 tokens from memory took 1.6x as long).
__attribute__((always_inline)) inline void AskAhead(const uint8_t* ahead, int64_t at, int64_t n) {
  if (ahead == nullptr) return;
  for (int64_t l = 0; l < n; l += 64) __builtin_prefetch(ahead + at + l);
}

// Fewest tokens a product runs on tiles (packed_tile_split) where the table has them.
inline constexpr int64_t kTileMinTokens = 8;

// A BlockA16's scales as split_a16 copies them for packed_tile_split, 16 bytes a block.
struct BlockA16Head {
  float d;
  int32_t sum;
  float dsum;
  uint32_t unused;
};

struct Primitives {
  // Weight blocks x against activation blocks y (see BlockA16).
  float (*q4_0_a16)(const BlockQ4_0* x, const BlockA16* y, int64_t nb);
  float (*q4_1_a16)(const BlockQ4_1* x, const BlockA16* y, int64_t nb);
  float (*q8_0_a16)(const BlockQ8_0* x, const BlockA16* y, int64_t nb);
  // K-quant super-blocks (256 elements = 8 activation blocks); nb still counts 32-element
  // activation blocks (a multiple of 8).
  float (*q4_k_a16)(const BlockQ4_K* x, const BlockA16* y, int64_t nb);
  float (*q5_k_a16)(const BlockQ5_K* x, const BlockA16* y, int64_t nb);
  float (*q6_k_a16)(const BlockQ6_K* x, const BlockA16* y, int64_t nb);
  // Q5_0 / Q5_1 (the rows past the packed groups of llama.cpp's fallback matrices): plain C++
  // on every ISA.
  float (*q5_0_a16)(const BlockQ5_0* x, const BlockA16* y, int64_t nb);
  float (*q5_1_a16)(const BlockQ5_1* x, const BlockA16* y, int64_t nb);
  float (*f32_f32)(const float* x, const float* y, int64_t n);
  // Register-tiled products for prefill: out[t * ldo + r] = dot(row r, token t) for 4 rows
  // (w + r * w_stride bytes) and 4 tokens (a + t * a_stride blocks). Null where the ISA has
  // no tiled kernel; callers then use the single dots.
  using Tile4x4 = void (*)(const uint8_t* w, size_t w_stride, const BlockA16* a, int64_t a_stride,
                           int64_t nb, float* out, int64_t ldo);
  Tile4x4 q4_0_tile = nullptr, q4_1_tile = nullptr, q8_0_tile = nullptr;
  // One packed group of 16 rows (kernels/packed.h; a PackableType) against
  // `tokens` tokens: out[t * ldo + r] for r < 16, token t's nb blocks at a + t * a_stride. Per
  // row and token, in block order: s = the block's exact int32 dot product (Q4_0 weights minus
  // 8), acc = fma(float(s) * a.d, w.d, acc) (Q6_K: for each 16-element half, its sum and scale),
  // and for the types with minimums (PackedHasMins) mins = fma(w.m, a.dsum, mins);
  // the result is acc + mins. Every table's entry gives the same bits. next_group: the group
  // the caller takes next, whose bytes a kernel may ask for while it computes (null: none).
  using PackedTile = void (*)(DType type, const uint8_t* group, int64_t nb, const BlockA16* a,
                              int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                              const uint8_t* next_group);
  PackedTile packed_tile = nullptr;
  // The same over Q4_0 / Q4_1 groups packed for 8-bit activations (kernels/packed.h ActBits).
  using PackedTileA8 = void (*)(DType type, const uint8_t* group, int64_t nb, const BlockA8* a,
                                int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                                const uint8_t* next_group);
  PackedTileA8 packed_tile_a8 = nullptr;
  // Optional (the AMX table): packed_tile against activations also split once per product input,
  // for products of at least kTileMinTokens tokens (below it the split would go unused).
  // split_a16 writes block i of a as 64 bytes at out + 64 i, the 32 values' low bytes then their
  // high bytes, and its scales at heads[i]. packed_tile_split is packed_tile with those beside a
  // (same indexing: block b of token t at a_split + 64 * (t * a_stride + b), its scales at
  // heads[t * a_stride + b]), the same bits: its loop reads the scales from the heads, 16 bytes a
  // block, not from a's 76-byte blocks.
  void (*split_a16)(const BlockA16* a, int64_t blocks, uint8_t* out, BlockA16Head* heads) = nullptr;
  using PackedTileSplit = void (*)(DType type, const uint8_t* group, int64_t nb, const BlockA16* a,
                                   const uint8_t* a_split, const BlockA16Head* heads,
                                   int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                                   const uint8_t* next_group);
  PackedTileSplit packed_tile_split = nullptr;
  // QuantizeRowA16 (round half to even; the scalar reference rounds the same way).
  void (*quantize_a16)(const float* x, BlockA16* y, int64_t n) = nullptr;
  void (*quantize_a8)(const float* x, BlockA8* y, int64_t n) = nullptr;  // QuantizeRowA8
  // y[i] = exp(x[i] - shift) (relative error < 2e-7 for arguments in [-87, 88]).
  void (*exp_shifted)(const float* x, float shift, float* y, int64_t n) = nullptr;
  // The same, returning the sum of the y[i] (added in an order fixed per ISA).
  float (*exp_shifted_sum)(const float* x, float shift, float* y, int64_t n) = nullptr;
  // exp_shifted_sum in place over G rows of n (row g at x + g * xs, shifted by shift[g], its sum
  // to sums[g]), each row the same bits as exp_shifted_sum alone; a kernel interleaves the rows
  // (independent chains). Optional (null: callers loop over exp_shifted_sum).
  void (*exp_shifted_sums)(float* x, int64_t xs, int64_t G, const float* shift, int64_t n,
                           float* sums) = nullptr;
  // out[i] = silu(gate[i]) * up[i].
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n) = nullptr;
  // Attention over a chunk of n keys for the G query heads sharing one KV head (head dim d).
  // qk: K staged transposed as fp32, key j's dim i at kt[i * kts + j]:
  //   scores[g * ss + j] = dot(scale * q_g, k_j), summed in dim order as one fused multiply-add
  //   chain (s = qs_0 * k_0; s = fma(qs_i, k_i, s)), so every ISA gives the same bits;
  //   row_max[g] = the largest of scores[g * ss + j], j < n. qs_i = q_i * scale, rounded; a
  //   caller that scales q once for many chunks passes scale 1 (x * 1 is x: the same bits), which
  //   lets a kernel read q in place instead of scaling it per call.
  // pv: V staged as fp32 rows [n, d]: o[g * os + i] += sum_j p[g * ps + j] * (v + j * d)[i]
  void (*qk_t)(const float* q, int64_t G, int64_t d, const float* kt, int64_t kts, int64_t n,
               float scale, float* scores, int64_t ss, float* row_max) = nullptr;
  // qk_t over fp16 K in place: key j's dim i at groups[j / 16][i * dim_stride + j % 16] (each
  // group's 16 keys contiguous per dim: the cache's transposed blocks). Bit-identical to
  // staging it with f16_to_f32 and calling qk_t. Every group must hold 16 readable positions
  // per dim, also past key n (a kernel may load them; their lanes are dropped): true of any
  // 16-aligned group inside a cache block of a multiple of 16 positions. qk_t likewise reads
  // whole vectors of kt: kts must cover n rounded up to 16.
  // For both, row_max is the maximum of scores that are not NaN (a NaN may or may not win).
  void (*qk_t_f16)(const float* q, int64_t G, int64_t d, const uint16_t* const* groups,
                   int64_t dim_stride, int64_t n, float scale, float* scores, int64_t ss,
                   float* row_max, Ahead* ahead) = nullptr;
  void (*pv)(const float* p, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n, float* o,
             int64_t os) = nullptr;
  // pv over fp16 V rows in place (row j at rows[j]): bit-identical to staging them with
  // f16_to_f32 and calling pv (paged attention reads V this way for every task).
  void (*pv_f16)(const float* p, int64_t ps, int64_t G, int64_t d, const uint16_t* const* rows,
                 int64_t n, float* o, int64_t os, Ahead* ahead) = nullptr;
  // Up to how many query heads qk_t / pv run in one pass at their best (their tiles' widths):
  // attention gives them several rows' heads in one call, as many as fit (0: never). The bits
  // are the same either way.
  int64_t pair_heads = 0;
  // The same chunk step with the query heads in vector lanes, for many heads over the same keys
  // (a shared prefix's rows, or prefill rows below the diagonal): H heads, head h's values at
  // [x * hs + h] of a [d][hs] array (hs a multiple of 16 holding H), K staged as qk_t's kt, V
  // staged as fp32 rows vf [n][d] (d a multiple of 16), scores st [n][hs]. Each head's bits are
  // those of qk_t, exp_shifted_sum and pv over the same chunk where pv is a fused multiply-add
  // chain (the AVX-512 and AVX2 tables' at d = 64; attention takes lanes only there): a
  // multiply-add chain per (head, key) in dim order, the exps' sum in this table's exp_shifted_sum
  // order, and per (head, dim) a fused multiply-add chain over the keys in order. With heads in
  // lanes, a K or V value is one broadcast for a vector of heads and no vector is converted inside
  // the loops (qk_t_f16 / pv_f16 convert one per 12-24 multiply-adds), so the loops are the fused
  // multiply-adds and their operands' loads.
  //   qk_lanes: st[j * hs + h] = dot(qt_h, k_j) for j < n; chunk_max[h] = max of them.
  //   exp_lanes: st[j * hs + h] = exp(st[j * hs + h] - shift[h]) in place; sums[h] = their sum.
  //   pv_lanes: ot[x * hs + h] = ot[x * hs + h] * rescale[h], then += st[j * hs + h] * vf[j * d +
  //     x] over j < n.
  // Lanes past H are computed too (a caller keeps them finite: zero queries). qk_lanes and
  // pv_lanes ask for the lines in *ahead (may be null) as qk_t_f16 does. Optional (null: the
  // table has none; attention then runs pair_heads passes).
  void (*qk_lanes)(const float* qt, int64_t hs, int64_t H, int64_t d, const float* kt, int64_t kts,
                   int64_t n, float* st, float* chunk_max, Ahead* ahead) = nullptr;
  void (*exp_lanes)(float* st, int64_t hs, int64_t H, const float* shift, int64_t n,
                    float* sums) = nullptr;
  void (*pv_lanes)(const float* st, int64_t hs, int64_t H, int64_t d, const float* vf, int64_t n,
                   const float* rescale, float* ot, Ahead* ahead) = nullptr;
  // dst[c * ds + r] = src[r * ss + c] for r < rows, c < cols: the lane path's queries into lanes
  // and its outputs back. Set with the lane kernels.
  void (*transpose_f32)(const float* src, int64_t ss, float* dst, int64_t ds, int64_t rows,
                        int64_t cols) = nullptr;
  // Fewest heads (rows x their query heads) for which attention takes the lane kernels.
  int64_t lane_heads = 0;
  // bf16 attention (opt-in: PagedAttentionArgs::bf16), over a cache that holds bf16 pairs
  // (kernels/ops.h). Operands are bf16 (Bf16Of below), held as pairs in a uint32 (element 2i in
  // the low half, 2i + 1 in the high half); products are exact in fp32. Sums run in groups of
  // kBf16Group pairs, as an AMX TDPBF16PS sums one tile product (measured to the bit on an
  // AMX-BF16 CPU): per group, the low elements' products are summed from 0 by fused
  // multiply-adds in pair order, the high elements' likewise, the two sums are added, and that
  // is added to the running fp32 sum. Every table's entries give the same bits, so each call may
  // take tiles or vectors by its size (the AMX table does).
  // qk_bf16: scores[g * ss + j] = that sum, from 0, over dim pairs i < d / 2 of qp[g * d / 2 + i]
  //   and key j's dims 2i, 2i + 1 at groups[j / 16][i * pair_stride + j % 16]; row_max[g] =
  //   their most over j < n. Groups are read whole (16 readable keys per pair).
  // pv_bf16: o[g * os + i] += that sum over key pairs jp < (n + 1) / 2 of pp[g * pps + jp] (the
  //   weights of keys 2jp, 2jp + 1) and pairs[jp][i] (their V elements i), o's value first (a
  //   subnormal one read as zero). For an odd n the last pair's second key is read as zero (its
  //   weight must be zero too).
  // Both ask for the lines in *ahead (may be null) a few per step of their loops, the rest at
  // their end (as qk_t_f16 / pv_f16).
  void (*qk_bf16)(const uint32_t* qp, int64_t G, int64_t d, const uint32_t* const* groups,
                  int64_t pair_stride, int64_t n, float* scores, int64_t ss, float* row_max,
                  Ahead* ahead) = nullptr;
  void (*pv_bf16)(const uint32_t* pp, int64_t pps, int64_t G, int64_t d,
                  const uint32_t* const* pairs, int64_t n, float* o, int64_t os,
                  Ahead* ahead) = nullptr;
  // dst[i] = Bf16Of(src[i]).
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  // pair_heads for qk_bf16 / pv_bf16 (0: never several rows in one call).
  int64_t pair_heads_bf16 = 0;
  // dst[i] = float(fp16 src[i]) (exact).
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  // The same over a 2-D tile: dst[r * dst_stride + c] = float(src[r * src_stride + c]).
  void (*f16_to_f32_tile)(const uint16_t* src, int64_t src_stride, float* dst, int64_t dst_stride,
                          int64_t rows, int64_t cols) = nullptr;
  // dst[i] = fp16(src[i]), round to nearest even.
  void (*to_fp16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  // The first index of the largest of x[0, n) (greedy sampling over the vocabulary). A NaN
  // compares false and is never chosen; 0 when every value is NaN.
  int64_t (*argmax)(const float* x, int64_t n) = nullptr;
};

// The vector exp (Exp8 in primitives_avx2.h, Exp16 in primitives_avx512.h; the same bits):
// x clamped to [kLo, kHi], n = round(x * kLog2e), r = x - n * kLn2Hi - n * kLn2Lo, exp(r) by the
// polynomial kPoly (highest degree first, then r^2 * p + r + 1), times 2^n (Exp8 builds 2^n in
// the exponent bits, Exp16 scales by it in one VSCALEFPS: one rounding of the same product, so
// the same result while 2^n is a normal float: -126 <= n <= 127, which the clamp keeps; with
// kHi = 88.7, n = 128 made Exp8's 2^n an Inf where VSCALEFPS gives the finite product).
namespace vexp {
constexpr float kLo = -87.3f, kHi = 88.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace vexp

// Pairs per group of the bf16 sums (qk_bf16 / pv_bf16): one TDPBF16PS's depth (a 64-byte row).
constexpr int64_t kBf16Group = 16;

// x rounded to bf16, to nearest even; a NaN stays a (quiet) NaN; magnitudes below 2^-60 become
// (signed) zero, so that no product of two operands (|x| >= 2^-60 or an fp16 value) and no sum of
// such products is ever subnormal: the hardware's flush of subnormals then never applies.
inline uint16_t Bf16Of(float x) {
  uint32_t u;
  static_assert(sizeof u == sizeof x);
  __builtin_memcpy(&u, &x, sizeof u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  if ((u & 0x7F800000u) < (67u << 23)) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// The bf16 entries in plain C++ (the scalar table's; the reference for the AVX-512 ones).
void GenericQkBf16(const uint32_t* qp, int64_t G, int64_t d, const uint32_t* const* groups,
                   int64_t pair_stride, int64_t n, float* scores, int64_t ss, float* row_max,
                   Ahead* ahead = nullptr);
void GenericPvBf16(const uint32_t* pp, int64_t pps, int64_t G, int64_t d,
                   const uint32_t* const* pairs, int64_t n, float* o, int64_t os,
                   Ahead* ahead = nullptr);
void GenericToBf16(const float* src, uint16_t* dst, int64_t n);

// PackedTile in plain C++ (the scalar table's entry; the reference for the vector kernels).
void PackedTileReference(DType type, const uint8_t* group, int64_t nb, const BlockA16* a,
                         int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                         const uint8_t* next_group = nullptr);

void PackedTileA8Reference(DType type, const uint8_t* group, int64_t nb, const BlockA8* a,
                           int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                           const uint8_t* next_group = nullptr);

// A PackedTile (Block = BlockA16) or PackedTileA8 (BlockA8) entry from an ISA's kernel for each
// packed type (KernelFor; null for a type it has none for, which runs the reference).
template <typename Block>
using PackedTypeTile = void (*)(const uint8_t* group, int64_t nb, const Block* a, int64_t a_stride,
                                int64_t tokens, float* out, int64_t ldo, const uint8_t* next_group);
// An ISA's kernel (a pointer of type Fn) for one of the types Ts (K<T>::kFn, the kernel template
// instantiated at T), null for any other type. K must be a class template in a namespace named
// for its ISA file, not an anonymous one: GCC 12 mangles every file's anonymous namespace alike
// and emits templates instantiated over such a K as weak symbols, so two files' instantiations
// over same-named Ks became one (PackedTileOfTypes, below, in the twenty-eighth session).
template <typename Fn, template <DType> class K, DType... Ts>
Fn KernelFor(DType t) {
  Fn k = nullptr;
  (void)((t == Ts ? (k = K<Ts>::kFn, true) : false) || ...);
  return k;
}
// The kernels of every packed type (16-bit activations), and of those packed for 8-bit ones.
template <template <DType> class K>
PackedTypeTile<BlockA16> PackedKernels16(DType t) {
  return KernelFor<PackedTypeTile<BlockA16>, K, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                   DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                   DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS>(t);
}
template <template <DType> class K>
PackedTypeTile<BlockA8> PackedKernels8(DType t) {
  return KernelFor<PackedTypeTile<BlockA8>, K, DType::kQ4_0, DType::kQ4_1>(t);
}

// An ISA's packed_tile (Block = BlockA16, K its Packed16) or packed_tile_a8 (BlockA8, Packed8)
// entry: its kernel for the type, else the reference. K as KernelFor's: with the AVX2 and
// AVX-512 files' Packed16 in anonymous namespaces, the linker kept one instantiation for both
// tables, so one ISA's kernels ran under the other's name (the AVX-512 kernels in the AVX2 table
// of some binaries: illegal instructions on an AVX2-only CPU; the AVX2 ones in the AVX-512 table
// of others).
template <typename Block, template <DType> class K>
void PackedTileOfTypes(DType type, const uint8_t* group, int64_t nb, const Block* a,
                       int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                       const uint8_t* next_group) {
  PackedTypeTile<Block> k;
  if constexpr (std::is_same_v<Block, BlockA8>) {
    k = PackedKernels8<K>(type);
  } else {
    k = PackedKernels16<K>(type);
  }
  if (k != nullptr) return k(group, nb, a, a_stride, tokens, out, ldo, next_group);
  if constexpr (std::is_same_v<Block, BlockA8>) {
    PackedTileA8Reference(type, group, nb, a, a_stride, tokens, out, ldo, next_group);
  } else {
    PackedTileReference(type, group, nb, a, a_stride, tokens, out, ldo, next_group);
  }
}

const Primitives& ScalarPrimitives();
const Primitives& Avx2Primitives();
const Primitives& Avx512Primitives();
// The AVX-512 table with the 16-bit packed products on AMX tiles (primitives_amx.cc); only where
// AmxUsable(): the CPU has AMX-TILE, AMX-INT8 and AVX-512 VBMI, and the OS granted this process
// the tile state (asked for on the first call).
const Primitives& AmxPrimitives();
bool AmxUsable();
// AmxUsable() and the CPU has AMX-BF16 (the AMX table's bf16 attention then runs on tiles).
bool AmxBf16Usable();
// The AVX-512 table's two kernels for the bf16 products: fused multiply-adds (any AVX-512 CPU)
// and VDPBF16PS (null where !CpuHasDpBf16()); the table takes the second where DpBf16Usable().
// The tests check both against the scalar entries.
struct Bf16Products {
  decltype(Primitives::qk_bf16) qk = nullptr;
  decltype(Primitives::pv_bf16) pv = nullptr;
};
Bf16Products Avx512FmaBf16();
Bf16Products Avx512DpBf16();
// The CPU has AVX512_BF16 (CPUID 7.1 EAX bit 5) with AVX-512 F and the OS's AVX-512 state.
bool CpuHasDpBf16();
// CpuHasDpBf16() and its VDPBF16PS kernels gave the reference's bits on random operands (checked
// once, on first use: a CPU whose instruction rounded differently keeps the other kernels).
bool DpBf16Usable();
// The table of the active ISA.
const Primitives& Prims();

// The scaled query values a qk_t kernel multiplies by: q itself at scale 1 (the caller scaled
// it: x * 1 is x, the same bits), else buf[i] = q[i] * scale for i < n.
inline const float* ScaledQuery(const float* q, int64_t n, float scale, float* buf) {
  if (scale == 1.0f) return q;
  for (int64_t i = 0; i < n; ++i) buf[i] = q[i] * scale;
  return buf;
}

// ISA-independent qk_t / pv: plain loops (qk_t with std::fma: the reference chain).
void GenericQkT(const float* q, int64_t G, int64_t d, const float* kt, int64_t kts, int64_t n,
                float scale, float* scores, int64_t ss, float* row_max);
void GenericF16ToF32Tile(const uint16_t* src, int64_t src_stride, float* dst, int64_t dst_stride,
                         int64_t rows, int64_t cols);
// qk_t_f16 by staging the groups with the table's f16_to_f32 and calling its qk_t (the lines
// ahead asked for first).
void GenericQkTF16(const Primitives& p, const float* q, int64_t G, int64_t d,
                   const uint16_t* const* groups, int64_t dim_stride, int64_t n, float scale,
                   float* scores, int64_t ss, float* row_max, Ahead* ahead);
template <const Primitives& (*Table)()>
void GenericQkTF16Of(const float* q, int64_t G, int64_t d, const uint16_t* const* groups,
                     int64_t dim_stride, int64_t n, float scale, float* scores, int64_t ss,
                     float* row_max, Ahead* ahead) {
  GenericQkTF16(Table(), q, G, d, groups, dim_stride, n, scale, scores, ss, row_max, ahead);
}
void GenericPv(const float* pr, int64_t ps, int64_t G, int64_t d, const float* v, int64_t n,
               float* o, int64_t os);
// fp16 rows: each row converted with the table's f16_to_f32, then as above (bit-identical).
void GenericPvF16(const Primitives& p, const float* pr, int64_t ps, int64_t G, int64_t d,
                  const uint16_t* const* rows, int64_t n, float* o, int64_t os, Ahead* ahead);
// The same, bound to one ISA's table, as entries for that table.
template <const Primitives& (*Table)()>
void GenericPvF16Of(const float* pr, int64_t ps, int64_t G, int64_t d, const uint16_t* const* rows,
                    int64_t n, float* o, int64_t os, Ahead* ahead) {
  GenericPvF16(Table(), pr, ps, G, d, rows, n, o, os, ahead);
}

}  // namespace kvmesh::kernels::cpu
