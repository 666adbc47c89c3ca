#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/fp16.h"
#include "tests/util/test_paths.h"

namespace kvmesh::kernels {
namespace {

// dequant_cases.bin holds random blocks of every type with values from the `gguf` package.
TEST(Dequant, EveryTypeMatchesGgufPyOnRandomBlocks) {
  const std::string blob = testing::ReadFile(testing::FixturePath("dequant_cases.bin"));
  ASSERT_FALSE(blob.empty()) << "missing fixture dequant_cases.bin";
  size_t pos = 0;
  int types = 0;
  while (pos < blob.size()) {
    uint32_t hdr[3];
    std::memcpy(hdr, blob.data() + pos, sizeof(hdr));
    pos += sizeof(hdr);
    const auto [type_id, n, n_bytes] = std::tuple(hdr[0], hdr[1], hdr[2]);
    auto tr = TraitsOf(type_id);
    ASSERT_TRUE(tr.has_value()) << "type " << type_id;
    ASSERT_EQ(RowBytes(static_cast<DType>(type_id), n), static_cast<int64_t>(n_bytes)) << tr->name;
    const char* raw = blob.data() + pos;
    pos += n_bytes;
    std::vector<float> want(n), got(n, -1.0f);
    std::memcpy(want.data(), blob.data() + pos, n * sizeof(float));
    pos += n * sizeof(float);
    DequantizeRow(static_cast<DType>(type_id), raw, got.data(), n);
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.0f, std::fabs(want[i])))
          << tr->name << " element " << i;
    }
    ++types;
  }
  // F32 F16 BF16 Q4_0 Q4_1 Q8_0 Q4_K Q6_K Q5_K Q5_0 Q5_1 Q2_K Q3_K IQ4_NL IQ4_XS
  EXPECT_EQ(types, 15);
}

TEST(Fp16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Fp16ToFloat(FloatToFp16(f))));
      continue;
    }
    ASSERT_EQ(FloatToFp16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  // Halves near 1 are 1/1024 apart.
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + 1.0f / 2048)), 1.0f);               // tie -> even (down)
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + 3.0f / 2048)), 1.0f + 1.0f / 512);  // tie -> even (up)
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1.0f + 3.0f / 4096)), 1.0f + 1.0f / 1024);  // nearest
  EXPECT_TRUE(std::isinf(Fp16ToFloat(FloatToFp16(70000.0f))));
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(1e-8f)), 0.0f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(6e-8f)), std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST(Bf16, RoundTripsEveryValueAndRoundsToNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(f))));
      continue;
    }
    ASSERT_EQ(FloatToBf16(f), b) << "bf16 0x" << std::hex << b;
  }
  // bfloat16 values near 1 are 1/128 apart.
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 1.0f / 256)), 1.0f);               // tie -> even
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);   // tie -> even
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f + 3.0f / 512)), 1.0f + 1.0f / 128);  // nearest
}

TEST(QuantizeA16, ErrorIsBelowHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t n : {32, 96, 576}) {
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    std::vector<BlockA16> q(n / kQK);
    QuantizeRowA16(x.data(), q.data(), n);
    for (int64_t b = 0; b < n / kQK; ++b) {
      float amax = 0;
      int32_t sum = 0;
      for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
      for (int j = 0; j < kQK; ++j) {
        EXPECT_NEAR(q[b].d * q[b].qs[j], x[b * kQK + j], 0.51f * amax / 32767);
        sum += q[b].qs[j];
      }
      EXPECT_EQ(q[b].sum, sum);
    }
  }
}

}  // namespace
}  // namespace kvmesh::kernels
