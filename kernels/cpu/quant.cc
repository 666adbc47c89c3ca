#include "kernels/quant.h"

#include <cassert>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/fp16.h"

namespace kvmesh::kernels {

std::optional<DTypeTraits> TraitsOf(uint32_t type_id) {
  switch (static_cast<DType>(type_id)) {
    case DType::kF32:
      return DTypeTraits{"F32", 1, 4};
    case DType::kF16:
      return DTypeTraits{"F16", 1, 2};
    case DType::kBF16:
      return DTypeTraits{"BF16", 1, 2};
    case DType::kQ4_0:
      return DTypeTraits{"Q4_0", kQK, sizeof(BlockQ4_0)};
    case DType::kQ4_1:
      return DTypeTraits{"Q4_1", kQK, sizeof(BlockQ4_1)};
    case DType::kQ5_0:
      return DTypeTraits{"Q5_0", kQK, sizeof(BlockQ5_0)};
    case DType::kQ5_1:
      return DTypeTraits{"Q5_1", kQK, sizeof(BlockQ5_1)};
    case DType::kQ8_0:
      return DTypeTraits{"Q8_0", kQK, sizeof(BlockQ8_0)};
    case DType::kQ4_K:
      return DTypeTraits{"Q4_K", kQKK, sizeof(BlockQ4_K)};
    case DType::kQ5_K:
      return DTypeTraits{"Q5_K", kQKK, sizeof(BlockQ5_K)};
    case DType::kQ6_K:
      return DTypeTraits{"Q6_K", kQKK, sizeof(BlockQ6_K)};
    case DType::kQ2_K:
      return DTypeTraits{"Q2_K", kQKK, sizeof(BlockQ2_K)};
    case DType::kQ3_K:
      return DTypeTraits{"Q3_K", kQKK, sizeof(BlockQ3_K)};
    case DType::kIQ4_NL:
      return DTypeTraits{"IQ4_NL", kQK, sizeof(BlockIQ4_NL)};
    case DType::kIQ4_XS:
      return DTypeTraits{"IQ4_XS", kQKK, sizeof(BlockIQ4_XS)};
  }
  return std::nullopt;
}

DTypeTraits TraitsOf(DType t) {
  auto tr = TraitsOf(static_cast<uint32_t>(t));
  assert(tr.has_value());
  return *tr;
}

namespace {

void DequantQ4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFloat(b[i].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = ((b[i].qs[j] & 0xF) - 8) * d;
      y[i * kQK + j + kQK / 2] = ((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantQ4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFloat(b[i].d), m = Fp16ToFloat(b[i].m);
    for (int j = 0; j < kQK / 2; ++j) {
      y[i * kQK + j] = (b[i].qs[j] & 0xF) * d + m;
      y[i * kQK + j + kQK / 2] = (b[i].qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0 / Q5_1: element e's value, nibble | bit e of qh << 4 (Q5_0: minus 16).
template <typename Block>
void DequantQ5(const Block* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFloat(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    if constexpr (std::is_same_v<Block, BlockQ5_0>) {
      for (int e = 0; e < kQK; ++e) y[i * kQK + e] = (Q5Value(b[i].qs, qh, e) - 16) * d;
    } else {
      const float m = Fp16ToFloat(b[i].m);
      for (int e = 0; e < kQK; ++e) y[i * kQK + e] = Q5Value(b[i].qs, qh, e) * d + m;
    }
  }
}

void DequantQ8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFloat(b[i].d);
    for (int j = 0; j < kQK; ++j) y[i * kQK + j] = b[i].qs[j] * d;
  }
}

// Q4_K and Q5_K: 4 chunks of 64 elements, 32 low nibbles with sub-block 2c and 32 high nibbles
// with 2c + 1; Q5_K's values have a fifth bit, bit j of qh[l] for element l of sub-block j.
template <typename Block>
void DequantK4(const Block* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFloat(b[i].d), dmin = Fp16ToFloat(b[i].dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, mn;
      UnpackScaleMinK4(j, b[i].scales, &sc, &mn);
      const float dj = d * sc, mj = dmin * mn;
      for (int l = 0; l < 32; ++l) y[i * kQKK + 32 * j + l] = dj * KQuantValue(b[i], j, l) - mj;
    }
  }
}

void DequantQ6_K(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFloat(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    float* out = y + i * kQKK;
    // Two halves of 128 elements; each 6-bit value = 4 bits from ql + 2 bits from qh, minus 32.
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        out[l] = d * sc[is] * q1;
        out[l + 32] = d * sc[is + 2] * q2;
        out[l + 64] = d * sc[is + 4] * q3;
        out[l + 96] = d * sc[is + 6] * q4;
      }
      out += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// Q2_K and Q3_K's low two bits of element 128h + 32j + l: bits 2j of qs[32h + l].
void LowBits2(const uint8_t* __restrict qs, int8_t* __restrict v) {
  for (int h = 0; h < 2; ++h) {
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) v[128 * h + 32 * j + l] = (qs[32 * h + l] >> (2 * j)) & 3;
    }
  }
}

// IQ4_NL's 32 elements from 16 bytes of nibbles: e < 16 low nibble of qs[e], else high of
// qs[e - 16].
void Iq4Values(const uint8_t* qs, int8_t* v) {
  for (int e = 0; e < kQK / 2; ++e) {
    v[e] = kIq4Values[qs[e] & 0xF];
    v[e + kQK / 2] = kIq4Values[qs[e] >> 4];
  }
}

// Small-value blocks dequantised: scale * v + min, as the gguf package computes them (no
// minimum added where the type has none, so that -0.0 stays -0.0).
void DequantSmall(DType t, const uint8_t* src, float* y, int64_t n) {
  const DTypeTraits tr = TraitsOf(t);
  SmallValues sv;
  for (int64_t b = 0; b < n / tr.block_elems; ++b, y += tr.block_elems) {
    UnpackSmallValues(t, src + b * tr.block_bytes, &sv);
    for (int64_t s = 0; s < tr.block_elems / 16; ++s) {
      const float scale = sv.scale[s], min = sv.min[s];
      const int8_t* v = sv.v + 16 * s;
      if (t == DType::kQ2_K) {
        for (int l = 0; l < 16; ++l) y[16 * s + l] = scale * v[l] + min;
      } else {
        for (int l = 0; l < 16; ++l) y[16 * s + l] = scale * v[l];
      }
    }
  }
}

}  // namespace

void UnpackSmallValues(DType t, const uint8_t* src, SmallValues* out) {
  switch (t) {
    case DType::kQ2_K: {
      const auto* x = reinterpret_cast<const BlockQ2_K*>(src);
      const float d = Fp16ToFloat(x->d), dmin = Fp16ToFloat(x->dmin);
      LowBits2(x->qs, out->v);
      for (int s = 0; s < 16; ++s) {
        out->scale[s] = d * static_cast<float>(x->scales[s] & 0xF);
        out->min[s] = -(dmin * static_cast<float>(x->scales[s] >> 4));
      }
      return;
    }
    case DType::kQ3_K: {
      const auto* x = reinterpret_cast<const BlockQ3_K*>(src);
      const float d = Fp16ToFloat(x->d);
      LowBits2(x->qs, out->v);
      uint8_t hmask[32];  // a copy the compiler knows out->v does not overlap
      std::memcpy(hmask, x->hmask, sizeof hmask);
      for (int b = 0; b < 8; ++b) {
        for (int l = 0; l < 32; ++l) {
          out->v[32 * b + l] = static_cast<int8_t>(out->v[32 * b + l] - 4 * (~hmask[l] >> b & 1));
        }
      }
      // Scale s: its low nibble from scales[s % 8] (s < 8: low nibble, else high), its two
      // high bits from scales[8 + s % 4] at bit 2 (s / 4).
      for (int s = 0; s < 16; ++s) {
        const int lo = (x->scales[s % 8] >> (s < 8 ? 0 : 4)) & 0xF;
        const int hi = (x->scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        out->scale[s] = d * static_cast<float>((lo | hi << 4) - 32);
        out->min[s] = 0.0f;
      }
      return;
    }
    case DType::kIQ4_NL: {
      const auto* x = reinterpret_cast<const BlockIQ4_NL*>(src);
      Iq4Values(x->qs, out->v);
      out->scale[0] = out->scale[1] = Fp16ToFloat(x->d);
      out->min[0] = out->min[1] = 0.0f;
      return;
    }
    case DType::kIQ4_XS: {
      const auto* x = reinterpret_cast<const BlockIQ4_XS*>(src);
      const float d = Fp16ToFloat(x->d);
      for (int j = 0; j < 8; ++j) {
        Iq4Values(x->qs + 16 * j, out->v + 32 * j);
        const int ls =
            ((x->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | ((x->scales_h >> (2 * j)) & 3) << 4;
        out->scale[2 * j] = out->scale[2 * j + 1] = d * static_cast<float>(ls - 32);
        out->min[2 * j] = out->min[2 * j + 1] = 0.0f;
      }
      return;
    }
    default:
      assert(false && "not a small-value type");
  }
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(h[i]);
      return;
    }
    case DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(h[i]);
      return;
    }
    case DType::kQ4_0:
      return DequantQ4_0(static_cast<const BlockQ4_0*>(src), dst, n / kQK);
    case DType::kQ4_1:
      return DequantQ4_1(static_cast<const BlockQ4_1*>(src), dst, n / kQK);
    case DType::kQ5_0:
      return DequantQ5(static_cast<const BlockQ5_0*>(src), dst, n / kQK);
    case DType::kQ5_1:
      return DequantQ5(static_cast<const BlockQ5_1*>(src), dst, n / kQK);
    case DType::kQ8_0:
      return DequantQ8_0(static_cast<const BlockQ8_0*>(src), dst, n / kQK);
    case DType::kQ4_K:
      return DequantK4(static_cast<const BlockQ4_K*>(src), dst, n / kQKK);
    case DType::kQ5_K:
      return DequantK4(static_cast<const BlockQ5_K*>(src), dst, n / kQKK);
    case DType::kQ6_K:
      return DequantQ6_K(static_cast<const BlockQ6_K*>(src), dst, n / kQKK);
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return DequantSmall(t, static_cast<const uint8_t*>(src), dst, n);
  }
  assert(false && "unsupported dtype");
}

namespace {

// Activation blocks of either width: d = max |x| / kMax, values round(x / d) in [-kMax, kMax].
template <typename Block, int kMax>
void QuantizeRowTo(const float* x, Block* y, int64_t n) {
  constexpr float kLimit = static_cast<float>(kMax);
  using Value = std::remove_reference_t<decltype(y->qs[0])>;
  for (int64_t i = 0; i < n / kQK; ++i) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(x[i * kQK + j]));
    const float d = amax / kLimit;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = d;
    int32_t sum = 0;
    for (int j = 0; j < kQK; ++j) {
      const float v = std::nearbyint(x[i * kQK + j] * id);
      y[i].qs[j] = static_cast<Value>(std::fmax(-kLimit, std::fmin(kLimit, v)));
      sum += y[i].qs[j];
    }
    y[i].sum = sum;
    y[i].dsum = d * static_cast<float>(sum);
  }
}

}  // namespace

void QuantizeRowA16(const float* x, BlockA16* y, int64_t n) {
  QuantizeRowTo<BlockA16, 32767>(x, y, n);
}

void QuantizeRowA8(const float* x, BlockA8* y, int64_t n) { QuantizeRowTo<BlockA8, 127>(x, y, n); }

}  // namespace kvmesh::kernels
