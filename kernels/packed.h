// Weights repacked for the CPU integer kernels: 16 rows interleaved per 32-element block.
//
// The row-major GGUF layout makes a row's block dot product 16 int32 lanes of partial sums that
// must be converted, scaled and accumulated in fp32 per block and reduced at the end: three
// float operations per integer one. Packed, one 512-bit register holds one element pair of 16
// rows, so 16 multiply-adds against broadcast activation pairs leave each lane holding a whole
// block's integer dot product for its own row, and the fp32 work is one conversion and two
// fused operations per 16 rows. Every ISA computes a packed product with the same operations
// in the same order (same bits); see PackedTile in kernels/cpu/primitives.h.
//
// Layout of a matrix's first rows / 16 * 16 rows: groups of 16 rows one after another; each
// group is its nb = cols / 32 blocks one after another; a group-block is
//   uint16_t d[16]          fp16 scales of the 16 rows (the K-quants: fp32, below)
//   uint16_t m[16]          fp16 minimums (Q4_1 only)
//   quants                  Q4_0/Q4_1/Q4_K: 8 chunks of 32 bytes; byte i of chunk p holds row
//                           i / 2's element 4p + i % 2 in its low nibble and 4p + 2 + i % 2 in
//                           its high one. The byte-quant types (PackedBytesQuants): 16 chunks
//                           of 32 bytes; byte i of chunk k is row i / 2's element 2k + i % 2.
// so a Q4_0, Q4_1 or Q8_0 group-block is exactly 16 of the type's blocks in size.
//
// Q4_K packs as Q4_1 does, one 32-element sub-block per group-block: a sub-block's values are
// d * sc * q - dmin * m (q its nibbles, sc and m its six-bit scale and minimum, d and dmin its
// super-block's fp16 scales), so its scale d * sc and minimum -dmin * m are stored as fp32
// (float d[16], float m[16]: exact, 11 by 6 bits) in place of Q4_1's fp16 ones, and the product
// is Q4_1's. A group-block is 384 bytes (6 bits a weight against the GGUF's 4.5), so a product
// reads a third more bytes and runs the integer kernels instead of the row-major dots.
//
// Q6_K packs as Q8_0 does, one 32-element block (two of its 16-element sub-blocks) per
// group-block: the values d * sc * (q - 32) become int8 quants q - 32 in Q8_0's layout, and the
// two sub-blocks' scales d * sc (exact in fp32: 11 by 8 bits) are stored as float d[16] (the
// block's first 16 elements) and float d2[16] (its last 16). Its product takes each half's
// integer sum on its own: acc = fma(float(s_lo) * a.d, d, acc), then the same with s_hi and d2.
// A group-block is 640 bytes, 10 bits a weight against the file's 6.56.
//
// Q5_K packs as Q8_0's quants with Q4_K's fp32 scale and minimum: a sub-block's values d * sc *
// q - dmin * m, q of 5 bits, as int8 quants q in Q8_0's layout (640 bytes a group-block, 10 bits
// a weight against the file's 5.5); its product is Q4_1's steps over Q8_0's integer sums.
//
// For 8-bit activations (ActBits::k8, Q4_0 and Q4_1 only) the quants are laid out for
// VPMADDUBSW instead: chunk p (32 bytes, elements 4p..4p+3) holds in byte 4j + e row j's
// element 4p + e in its low nibble and row 8 + j's in its high one, so one register of low
// (high) nibbles is 8 rows x 4 elements, multiplied against a broadcast 4-byte activation quad.
// The scales are where they are in the 16-bit layout.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/matmul.h"

namespace kvmesh::kernels {

inline constexpr int64_t kPackRows = 16;

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q3_K, IQ4_NL and IQ4_XS have a packed form.
bool PackableType(DType t);

// The width of the activations the packed products of a model run against. 16 (the default)
// keeps the logits within ~1e-3 of an exact evaluation; 8 is ggml's choice for Q4_0 / Q4_1,
// ~1e-2 away, and about twice as fast when the products are bound by arithmetic (batched
// decode, prefill). Q8_0 and the other types keep 16 bits either way.
enum class ActBits : uint8_t { k16 = 16, k8 = 8 };

// Whether rows of type t packed for `bits` run against 8-bit activations.
constexpr bool PacksForA8(DType t, ActBits bits) {
  return bits == ActBits::k8 && (t == DType::kQ4_0 || t == DType::kQ4_1);
}

// Whether a packed type stores its scales as fp32 (the K-quants, IQ4_XS), adds minimums (Q4_1,
// Q4_K, Q5_K), scales each 16-element half of a block on its own (Q6_K, Q3_K), and has int8
// quants (all but Q4_0, Q4_1, Q4_K and Q3_K, whose are nibbles).
// Q5_0 / Q5_1 pack as Q8_0 does, their values (Q5_0: q - 16; Q5_1: q, 0..31) as int8 quants,
// with their fp16 scales (and Q5_1's fp16 minimums) where Q8_0 / Q4_1 keep theirs: 544 / 576
// bytes a group-block, 8.5 / 9 bits a weight against the file's 5.5 / 6.
// Q3_K packs as Q4_0's nibbles with Q6_K's scales: its values in [-4, 3] stored as q + 4 (the
// offset comes off as Q4_0's 8 does), an fp32 scale d * (sc - 32) per 16-element half: 6 bits a
// weight against 3.44. IQ4_NL packs as Q8_0 (its grid values kIq4Values as the quants, its fp16
// scale): 8.5 bits against 4.5. IQ4_XS as Q8_0's quants with an fp32 scale d * (ls - 32) a
// sub-block: 9 bits against 4.25. Q2_K (a minimum per 16 elements) has no packed form.
constexpr bool PackedScalesF32(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K || t == DType::kQ3_K ||
         t == DType::kIQ4_XS;
}
constexpr bool PackedHasMins(DType t) {
  return t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K;
}
constexpr bool PackedHalfScales(DType t) { return t == DType::kQ6_K || t == DType::kQ3_K; }
constexpr bool PackedBytesQuants(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ5_0 || t == DType::kQ5_1 || t == DType::kQ5_K ||
         t == DType::kQ6_K || t == DType::kIQ4_NL || t == DType::kIQ4_XS;
}
// What a nibble type's stored values are above its integers (Q4_0: 8, Q3_K: 4; else 0).
constexpr int PackedNibbleOffset(DType t) {
  return t == DType::kQ4_0 ? 8 : (t == DType::kQ3_K ? 4 : 0);
}

// Bytes of a packed group-block's scales, before its quants: 16 of each scale (and minimum).
constexpr int64_t PackedScaleBytes(DType t) {
  return kPackRows * (PackedScalesF32(t) ? 4 : 2) *
         (PackedHasMins(t) || PackedHalfScales(t) ? 2 : 1);
}

// Bytes of one packed group-block of a packable type t: 16 rows of one 32-element block (the
// size of 16 of the type's blocks for Q4_0, Q4_1 and Q8_0).
constexpr int64_t PackedGroupBlockBytes(DType t) {
  return PackedScaleBytes(t) + kPackRows * (PackedBytesQuants(t) ? kQK : kQK / 2);
}

// Whether the active ISA has a vector kernel for packed products (AVX-512, AVX2); the scalar
// table runs the plain C++ reference, slower than the row-major kernels, so callers should not
// pack there.
bool PackedKernelIsFast();

// w with its first w.rows / 16 * 16 rows also packed into `storage` (w.packed, w.packed_rows);
// w unchanged if its type has no packed form or it has fewer than 16 rows. The plain rows stay
// where they were (the rows past the last group, and row ranges that do not start on a group,
// are read from them). With a pool, the groups are packed in parallel.
// With bits = ActBits::k8, Q4_0 / Q4_1 are laid out for 8-bit activations (w.packed_a8).
WeightMatrix PackWeights(const WeightMatrix& w, std::vector<uint8_t>& storage,
                         ThreadPool* pool = nullptr, ActBits bits = ActBits::k16);

// Bytes PackWeights stores for w (0 if it packs nothing).
int64_t PackedBytes(const WeightMatrix& w);
// The same, packed into dst (PackedBytes(w) bytes; the caller's memory, e.g. one huge-page
// region for every matrix of a model: util/huge_pages.h).
WeightMatrix PackWeights(const WeightMatrix& w, uint8_t* dst, ThreadPool* pool = nullptr,
                         ActBits bits = ActBits::k16);

}  // namespace kvmesh::kernels
