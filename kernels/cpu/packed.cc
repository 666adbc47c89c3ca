// Packing of the packable types' rows (PackableType) into 16-row groups
// (kernels/packed.h) and the reference product over a packed group.
#include "kernels/packed.h"

#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/primitives.h"
#include "kernels/fp16.h"

namespace kvmesh::kernels {
namespace {

// Element e (0..31) of a Q4 block's nibbles: e < 16 low nibble of qs[e], else high of qs[e - 16].
int Nibble(const uint8_t* qs, int e) { return e < 16 ? qs[e] & 15 : qs[e - 16] >> 4; }

// 32 values v[e] + offset (each 0..15) as a Q4 block's 16 bytes of nibbles (Nibble's layout: e
// in the low nibble of byte e, e + 16 in its high one).
template <typename V>
void AsNibbles(const V* v, int offset, uint8_t* qs) {
  for (int e = 0; e < kQK / 2; ++e) {
    qs[e] = static_cast<uint8_t>((v[e] + offset) | (v[e + kQK / 2] + offset) << 4);
  }
}

// Row r's sub-block b (32 elements) of a Q4_K or Q5_K row: its values in element order (Q4_K
// 0..15; Q5_K 0..31, bit j of qh[l] the fifth bit of sub-block j's element l) and its scale
// d * sc and minimum -dmin * m, exact in fp32.
template <typename Block>
void KSubBlock(const uint8_t* row, int64_t b, uint8_t* v, float* d, float* m) {
  const auto* x = reinterpret_cast<const Block*>(row) + b / 8;
  const int j = static_cast<int>(b % 8);
  uint8_t sc, mn;
  UnpackScaleMinK4(j, x->scales, &sc, &mn);
  *d = Fp16ToFloat(x->d) * static_cast<float>(sc);
  *m = -(Fp16ToFloat(x->dmin) * static_cast<float>(mn));
  for (int l = 0; l < kQK; ++l) v[l] = static_cast<uint8_t>(KQuantValue(*x, j, l));
}

// Q4_0, Q4_1 and Q8_0 pack into the bytes of their blocks.
static_assert(PackedGroupBlockBytes(DType::kQ4_0) == kPackRows * sizeof(BlockQ4_0));
static_assert(PackedGroupBlockBytes(DType::kQ4_1) == kPackRows * sizeof(BlockQ4_1));
static_assert(PackedGroupBlockBytes(DType::kQ8_0) == kPackRows * sizeof(BlockQ8_0));
// 6, 8.5 and 9 bits a weight (kernels/packed.h).
static_assert(PackedGroupBlockBytes(DType::kQ3_K) == 384);
static_assert(PackedGroupBlockBytes(DType::kIQ4_NL) == 544);
static_assert(PackedGroupBlockBytes(DType::kIQ4_XS) == 576);

// Row r's block b of a Q6_K row (32 elements): its values q - 32 and its two 16-element
// sub-blocks' scales d * sc, exact in fp32. Element i of a super-block: half h = i / 128, then
// quarter k = i % 128 / 32 and l = i % 32: low four bits from byte 64 h + l + 32 (k % 2) of ql
// (its low nibble for k < 2, else its high one), high two from bits 2k of byte 32 h + l of qh.
void Q6KBlock(const uint8_t* row, int64_t b, int8_t* qs, float* d0, float* d1) {
  const auto* x = reinterpret_cast<const BlockQ6_K*>(row) + b / 8;
  const int j = static_cast<int>(b % 8);
  *d0 = Fp16ToFloat(x->d) * static_cast<float>(x->scales[2 * j]);
  *d1 = Fp16ToFloat(x->d) * static_cast<float>(x->scales[2 * j + 1]);
  for (int e = 0; e < kQK; ++e) {
    const int i = 32 * j + e, h = i / 128, k = i % 128 / 32, l = i % 32;
    const int lo = x->ql[64 * h + l + 32 * (k % 2)] >> (k < 2 ? 0 : 4) & 15;
    const int hi = x->qh[32 * h + l] >> (2 * k) & 3;
    qs[e] = static_cast<int8_t>((lo | hi << 4) - 32);
  }
}

// A group's rows' current super-blocks as small values, so that each is unpacked once for its 8
// blocks (one per group being packed: the rows' memory cannot change meanwhile).
struct SmallRows {
  SmallValues values[kPackRows];
  const uint8_t* at[kPackRows] = {};
};

// Row r's 32-element block b of a Q3_K or IQ4_XS row: its values and its two 16-element halves'
// scales.
void SmallBlock(DType t, const uint8_t* row, int r, int64_t b, SmallRows& rows, int8_t* qs,
                float* d0, float* d1) {
  const DTypeTraits tr = TraitsOf(t);
  const int64_t per = tr.block_elems / kQK;
  const uint8_t* src = row + b / per * tr.block_bytes;
  if (rows.at[r] != src) {
    UnpackSmallValues(t, src, &rows.values[r]);
    rows.at[r] = src;
  }
  const SmallValues& sv = rows.values[r];
  const int64_t j = b % per;
  std::memcpy(qs, sv.v + kQK * j, kQK);
  *d0 = sv.scale[2 * j];
  *d1 = sv.scale[2 * j + 1];
}

// The 16 rows' block b (row r at rows + r * row_bytes) into one group-block at dst.
void PackGroupBlock(DType t, bool a8, const uint8_t* rows, size_t row_bytes, int64_t b,
                    SmallRows& small, uint8_t* dst) {
  uint8_t* q = dst + PackedScaleBytes(t);
  if (a8) std::memset(q, 0, 8 * 32);  // its rows' nibbles are OR-ed in
  for (int r = 0; r < kPackRows; ++r) {
    // A K-quant's block as the fields of the type it packs as (Q4_1, Q8_0): 2 bytes in.
    uint8_t k_block[2 + kQK];
    const uint8_t* blk = k_block;
    if (PackedScalesF32(t)) {
      float d, m;  // the scale, and the minimum or the second half's scale
      const uint8_t* row = rows + r * row_bytes;
      if (t == DType::kQ4_K) {  // the values as Q4_1's nibbles: e low, e + 16 high
        uint8_t v[kQK];
        KSubBlock<BlockQ4_K>(row, b, v, &d, &m);
        AsNibbles(v, 0, k_block + 2);
      } else if (t == DType::kQ5_K) {  // the values as Q8_0's bytes
        KSubBlock<BlockQ5_K>(row, b, k_block + 2, &d, &m);
      } else if (t == DType::kQ6_K) {
        Q6KBlock(row, b, reinterpret_cast<int8_t*>(k_block + 2), &d, &m);
      } else if (t == DType::kQ3_K) {  // the values plus 4 as Q4_0's nibbles: e low, e + 16 high
        int8_t v[kQK];
        SmallBlock(t, row, r, b, small, v, &d, &m);
        AsNibbles(v, PackedNibbleOffset(t), k_block + 2);
      } else {  // IQ4_XS (whose halves share their sub-block's scale)
        SmallBlock(t, row, r, b, small, reinterpret_cast<int8_t*>(k_block + 2), &d, &m);
      }
      std::memcpy(dst + 4 * r, &d, 4);
      if (PackedHasMins(t) || PackedHalfScales(t)) std::memcpy(dst + 64 + 4 * r, &m, 4);
    } else {  // fp16 scales (and Q4_1 / Q5_1's minimums) lead the block: kept as they are
      blk = rows + r * row_bytes + b * TraitsOf(t).block_bytes;
      std::memcpy(dst + 2 * r, blk, 2);                                 // d
      if (PackedHasMins(t)) std::memcpy(dst + 32 + 2 * r, blk + 2, 2);  // m
      if (t == DType::kQ5_0 || t == DType::kQ5_1) {  // the values as Q8_0's bytes
        const bool q5_1 = t == DType::kQ5_1;
        uint32_t qh;
        std::memcpy(&qh, blk + (q5_1 ? 4 : 2), 4);
        for (int e = 0; e < kQK; ++e) {
          const int v = Q5Value(blk + (q5_1 ? 8 : 6), qh, e) - (q5_1 ? 0 : 16);
          k_block[2 + e] = static_cast<uint8_t>(v);
        }
        blk = k_block;
      } else if (t == DType::kIQ4_NL) {  // the grid values as Q8_0's bytes
        for (int e = 0; e < kQK; ++e) {
          k_block[2 + e] = static_cast<uint8_t>(kIq4Values[Nibble(blk + 2, e)]);
        }
        blk = k_block;
      }
    }
    if (PackedBytesQuants(t)) {
      const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
      for (int k = 0; k < 16; ++k) {
        for (int j = 0; j < 2; ++j) q[32 * k + 2 * r + j] = static_cast<uint8_t>(qs[2 * k + j]);
      }
      continue;
    }
    const uint8_t* qs = blk + (t == DType::kQ4_1 ? 4 : 2);
    if (a8) {
      for (int p = 0; p < 8; ++p) {
        for (int e = 0; e < 4; ++e) {
          q[32 * p + 4 * (r % 8) + e] |= static_cast<uint8_t>(Nibble(qs, 4 * p + e) << (r / 8 * 4));
        }
      }
    } else {
      for (int p = 0; p < 8; ++p) {
        for (int j = 0; j < 2; ++j) {
          q[32 * p + 2 * r + j] =
              static_cast<uint8_t>(Nibble(qs, 4 * p + j) | Nibble(qs, 4 * p + 2 + j) << 4);
        }
      }
    }
  }
}

// Row r's element e of a packed group-block's quants, as the integer the product uses.
int PackedElement(DType t, bool a8, const uint8_t* q, int r, int e) {
  if (PackedBytesQuants(t)) return static_cast<int8_t>(q[32 * (e / 2) + 2 * r + e % 2]);
  if (a8) {
    const int v = q[32 * (e / 4) + 4 * (r % 8) + e % 4] >> (r / 8 * 4) & 15;
    return v - PackedNibbleOffset(t);
  }
  const uint8_t byte = q[32 * (e / 4) + 2 * r + e % 2];
  const int v = (e % 4 < 2) ? (byte & 15) : (byte >> 4);
  return v - PackedNibbleOffset(t);
}

}  // namespace

bool PackableType(DType t) {
  return t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_0 || t == DType::kQ5_1 ||
         t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
         t == DType::kQ3_K || t == DType::kIQ4_NL || t == DType::kIQ4_XS;
}

bool PackedKernelIsFast() { return cpu::Prims().packed_tile != &cpu::PackedTileReference; }

int64_t PackedBytes(const WeightMatrix& w) {
  if (!PackableType(w.type) || w.rows < kPackRows) return 0;
  return w.rows / kPackRows * (w.cols / kQK) * PackedGroupBlockBytes(w.type);
}

WeightMatrix PackWeights(const WeightMatrix& w, std::vector<uint8_t>& storage, ThreadPool* pool,
                         ActBits bits) {
  storage.assign(static_cast<size_t>(PackedBytes(w)), 0);
  return PackWeights(w, storage.data(), pool, bits);
}

WeightMatrix PackWeights(const WeightMatrix& w, uint8_t* dst, ThreadPool* pool, ActBits bits) {
  WeightMatrix out = w;
  const bool a8 = PacksForA8(w.type, bits);
  if (PackedBytes(w) == 0) return out;
  const int64_t groups = w.rows / kPackRows, nb = w.cols / kQK;
  const int64_t gb = PackedGroupBlockBytes(w.type);
  const auto* base = static_cast<const uint8_t*>(w.data);
  auto pack = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      SmallRows small;
      for (int64_t b = 0; b < nb; ++b) {
        PackGroupBlock(w.type, a8, base + g * kPackRows * w.row_bytes, w.row_bytes, b, small,
                       dst + (g * nb + b) * gb);
      }
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(groups, 4, pack);
  } else {
    pack(0, groups);
  }
  out.packed = dst;
  out.packed_rows = groups * kPackRows;
  out.packed_a8 = a8;
  return out;
}

namespace cpu {

namespace {

// Row r's scale in a group-block, or (second) its minimum (PackedHasMins) or second half's scale
// (PackedHalfScales): fp16 at 0 and 32, fp32 at 0 and 64.
float PackedScale(DType type, const uint8_t* blk, int r, bool second) {
  if (PackedScalesF32(type)) {
    float v;
    std::memcpy(&v, blk + (second ? 64 : 0) + 4 * r, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, blk + (second ? 32 : 0) + 2 * r, 2);
  return Fp16ToFloat(h);
}

// PackedTile's operations in plain C++, for either activation width.
template <typename Block>
void PackedTileOf(DType type, bool a8, const uint8_t* group, int64_t nb, const Block* a,
                  int64_t a_stride, int64_t tokens, float* out, int64_t ldo) {
  const int64_t gb = PackedGroupBlockBytes(type);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int r = 0; r < kPackRows; ++r) {
      float acc = 0.0f, mins = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = group + b * gb;
        const Block& ab = a[t * a_stride + b];
        int32_t s[2] = {0, 0};  // the block's sum, or (Q6_K) its halves'
        for (int e = 0; e < kQK; ++e) {
          s[PackedHalfScales(type) && e >= kQK / 2] +=
              PackedElement(type, a8, blk + PackedScaleBytes(type), r, e) * int32_t{ab.qs[e]};
        }
        acc = std::fma(static_cast<float>(s[0]) * ab.d, PackedScale(type, blk, r, false), acc);
        if (PackedHalfScales(type)) {
          acc = std::fma(static_cast<float>(s[1]) * ab.d, PackedScale(type, blk, r, true), acc);
        }
        if (PackedHasMins(type)) mins = std::fma(PackedScale(type, blk, r, true), ab.dsum, mins);
      }
      out[t * ldo + r] = PackedHasMins(type) ? acc + mins : acc;
    }
  }
}

}  // namespace

void PackedTileReference(DType type, const uint8_t* group, int64_t nb, const BlockA16* a,
                         int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                         const uint8_t* /*next_group*/) {
  PackedTileOf(type, false, group, nb, a, a_stride, tokens, out, ldo);
}

void PackedTileA8Reference(DType type, const uint8_t* group, int64_t nb, const BlockA8* a,
                           int64_t a_stride, int64_t tokens, float* out, int64_t ldo,
                           const uint8_t* /*next_group*/) {
  PackedTileOf(type, true, group, nb, a, a_stride, tokens, out, ldo);
}

}  // namespace cpu
}  // namespace kvmesh::kernels
