// Tensor element types and their block layouts, numbered as GGUF/ggml number them.
//
// A quantized row of n elements is n / block_elems blocks laid end to end; every block is
// self-describing (scales inside), so a row's bytes are block_bytes * n / block_elems.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

namespace kvmesh::kernels {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_elems;  // elements per block
  int64_t block_bytes;  // bytes per block
};

// Traits of a supported type, or nullopt for any other type id (including ids that exist in
// ggml but that kvmesh does not read).
std::optional<DTypeTraits> TraitsOf(uint32_t type_id);
DTypeTraits TraitsOf(DType t);  // t must be a supported type.

inline constexpr int kQK = 32;    // elements per block of the 32-wide formats
inline constexpr int kQKK = 256;  // elements per K-quant super-block

// Block layouts (bit-compatible with ggml).
struct BlockQ4_0 {
  uint16_t d;           // fp16 scale
  uint8_t qs[kQK / 2];  // element j in low nibble of qs[j], element j+16 in the high nibble
};
struct BlockQ4_1 {
  uint16_t d, m;  // fp16 scale and minimum: x = d * q + m
  uint8_t qs[kQK / 2];
};
// Q5_0 / Q5_1: Q4_0 / Q4_1's nibbles with a fifth bit per element, bit e of qh for element e;
// x = d * (q - 16) (Q5_0) or d * q + m (Q5_1). What llama.cpp's K-quant files use for matrices
// whose rows are not a multiple of 256 (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
// Activations quantised on the fly for the integer dot products: 16-bit values with an fp32
// scale per 32 elements. (ggml uses 8 bits here; 16 bits keep the logits within ~1e-3 of an
// exact float64 evaluation instead of ~2e-2, at a small cost in decode speed.)
struct BlockA16 {
  float d;      // scale: x ~= d * qs[j]
  int32_t sum;  // sum of qs, for the weight formats with an offset (Q4_0's -8, Q4_1's m)
  float dsum;   // d * float(sum), computed once here rather than per weight row group
  int16_t qs[kQK];
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 six-bit scales and 8 six-bit mins, packed
  uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];    // as Q4_K's
  uint8_t qh[kQKK / 8];  // element 64c + 32h + l's fifth bit: bit 2c + h of qh[l]
  uint8_t qs[kQKK / 2];  // its low four bits: Q4_K's nibble of that element
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
// Q2_K: 16 sub-blocks of 16 elements, x = d * sc * q - dmin * m with q of 2 bits and a 4-bit
// scale sc (low nibble of scales[s]) and minimum m (high nibble) per sub-block.
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];  // element 128h + 32j + l: bits 2j of qs[32h + l]
  uint16_t d, dmin;
};
// Q3_K: 16 sub-blocks of 16, x = d * (sc - 32) * q with q in [-4, 3]: its low two bits as Q2_K's,
// minus 4 where bit i / 32 of hmask[i % 32] is clear; sc of 6 bits (Q3KScale).
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
// IQ4_NL: Q4_0's nibbles (element e < 16 the low nibble of qs[e], else the high one of
// qs[e - 16]) index kIq4Values, a non-uniform grid: x = d * kIq4Values[nibble]. llama.cpp's
// fallback for IQ4_XS matrices whose rows are not a multiple of 256.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
// IQ4_XS: 8 sub-blocks of 32, each IQ4_NL's nibbles (sub-block j's at qs + 16 j) with scale
// d * (ls - 32), ls of 6 bits: a nibble of scales_l and two bits of scales_h (IQ4XSScale).
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQKK / 64];
  uint8_t qs[kQKK / 2];
};
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};
// 8-bit activations (what ggml uses for Q4_0 / Q4_1; opt-in here, kernels/packed.h ActBits):
// the same fields as BlockA16 with int8 values in [-127, 127].
struct BlockA8 {
  float d;
  int32_t sum;
  float dsum;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockA16) == 76);
static_assert(sizeof(BlockA8) == 44);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

// Q4_K (and Q5_K) packs 8 (scale, min) pairs of 6 bits into 12 bytes: pairs 0..3 in the low 6 bits
// of bytes 0..3 / 4..7; pairs 4..7 split into a low nibble in bytes 8..11 and 2 high bits taken
// from the top of bytes 0..3 / 4..7.
inline void UnpackScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Element l (0..31) of sub-block j (0..7) of a Q4_K or Q5_K super-block, before its scale and
// minimum: the nibble (sub-blocks 2c and 2c + 1 take the low and high nibbles of bytes
// 32c .. 32c + 31) and, for Q5_K, bit j of qh[l] as its fifth bit.
template <typename Block>
inline int KQuantValue(const Block& x, int j, int l) {
  int v = x.qs[32 * (j / 2) + l] >> (4 * (j % 2)) & 0xF;
  if constexpr (std::is_same_v<Block, BlockQ5_K>) v |= (x.qh[l] >> j & 1) << 4;
  return v;
}

// Element e (0..31) of a Q5_0 / Q5_1 block without its offset: the nibble (e < 16: the low one
// of qs[e], else the high one of qs[e - 16]) and bit e of qh as its fifth bit.
inline int Q5Value(const uint8_t* qs, uint32_t qh, int e) {
  const int nibble = e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
  return nibble | static_cast<int>(qh >> e & 1) << 4;
}

// Q2_K, Q3_K, IQ4_NL and IQ4_XS read as small integers with an fp32 scale and minimum per 16
// elements: element e of a block is scale[e / 16] * v[e] + min[e / 16] (min 0 but for Q2_K), the
// value the gguf package's dequantisation gives. The scales and minimums are exact (an fp16 times
// an integer of at most 7 bits), so the products run on the integers v. These types' dots,
// dequantisation and packing all read their blocks through this.
struct SmallValues {
  int8_t v[kQKK];
  float scale[kQKK / 16], min[kQKK / 16];
};
constexpr bool HasSmallValues(DType t) {
  return t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kIQ4_NL || t == DType::kIQ4_XS;
}
// The block at src of such a type (its block_elems elements) into *out.
void UnpackSmallValues(DType t, const uint8_t* src, SmallValues* out);

// Bytes of a row of n elements of type t; n must be a multiple of the block size.
inline int64_t RowBytes(DType t, int64_t n) {
  const DTypeTraits tr = TraitsOf(t);
  return n / tr.block_elems * tr.block_bytes;
}

// dst[0..n) = the n elements of the row at src. n must be a multiple of t's block size.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Quantises n floats (n % 32 == 0) into n / 32 activation blocks (round to nearest).
void QuantizeRowA16(const float* x, BlockA16* y, int64_t n);
// The same into 8-bit blocks (d = max |x| / 127, values clamped to [-127, 127]).
void QuantizeRowA8(const float* x, BlockA8* y, int64_t n);

}  // namespace kvmesh::kernels
