#include "kernels/ops.h"

#include <cpuid.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/packed.h"

namespace kvmesh::kernels {
namespace {

double RelL2(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> Randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Random, valid bytes for `rows` rows of `cols` elements of type t (fp16 scales kept finite).
std::vector<uint8_t> RandomWeights(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(0.002f, 0.05f);
  const int64_t rb = RowBytes(t, cols);
  std::vector<uint8_t> w(rows * rb);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  auto set_h = [&](uint8_t* p, float v) {
    const uint16_t h = FloatToFp16(v);
    std::memcpy(p, &h, 2);
  };
  const DTypeTraits tr = TraitsOf(t);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.data() + r * rb;
    for (int64_t b = 0; b < cols / tr.block_elems; ++b) {
      uint8_t* blk = row + b * tr.block_bytes;
      switch (t) {
        case DType::kQ4_0:
        case DType::kQ5_0:
        case DType::kQ8_0:
          set_h(blk, sc(rng));
          break;
        case DType::kQ4_1:
        case DType::kQ5_1:
          set_h(blk, sc(rng));
          set_h(blk + 2, -8 * sc(rng));
          break;
        case DType::kQ4_K:
        case DType::kQ5_K:
          set_h(blk, sc(rng) / 10);
          set_h(blk + 2, sc(rng) / 10);
          break;
        case DType::kQ6_K:
          set_h(blk + 208, sc(rng) / 10);
          break;
        case DType::kQ2_K:
          set_h(blk + 80, sc(rng) / 10);
          set_h(blk + 82, sc(rng) / 10);
          break;
        case DType::kQ3_K:
          set_h(blk + 108, sc(rng) / 10);
          break;
        case DType::kIQ4_NL:
        case DType::kIQ4_XS:
          set_h(blk, sc(rng) / 10);
          break;
        default:
          break;
      }
    }
    if (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16) {
      const auto vals = Randn(cols, seed + r, 0.1f);
      for (int64_t c = 0; c < cols; ++c) {
        if (t == DType::kF32) std::memcpy(row + 4 * c, &vals[c], 4);
        if (t == DType::kF16) set_h(row + 2 * c, vals[c]);
        if (t == DType::kBF16) {
          uint32_t bits;
          std::memcpy(&bits, &vals[c], 4);
          const uint16_t hb = static_cast<uint16_t>(bits >> 16);
          std::memcpy(row + 2 * c, &hb, 2);
        }
      }
    }
  }
  return w;
}

class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!SetIsa(GetParam())) GTEST_SKIP() << "this CPU lacks " << IsaName(GetParam());
  }
  void TearDown() override { SetIsa(DetectedIsa()); }
};

// The reference product: each row dequantised, double-precision dot products; [tokens, rows].
std::vector<double> ExactProduct(const WeightMatrix& w, const std::vector<float>& x,
                                 int64_t tokens) {
  std::vector<double> ref(tokens * w.rows);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_bytes, row.data(),
                  w.cols);
    for (int64_t t = 0; t < tokens; ++t) {
      double s = 0;
      for (int64_t k = 0; k < w.cols; ++k) s += static_cast<double>(row[k]) * x[t * w.cols + k];
      ref[t * w.rows + r] = s;
    }
  }
  return ref;
}

struct MatMulCase {
  DType type;
  int64_t rows, cols, tokens;
};

TEST_P(IsaTest, MatMulMatchesScalarReferenceForEveryType) {
  ThreadPool pool(2);
  const MatMulCase cases[] = {
      {DType::kQ4_0, 37, 96, 1},   {DType::kQ4_0, 16, 576, 5},  {DType::kQ4_1, 41, 64, 3},
      {DType::kQ4_1, 17, 576, 1},  {DType::kQ4_1, 64, 1536, 2}, {DType::kQ8_0, 33, 160, 4},
      {DType::kQ4_1, 37, 96, 9},   {DType::kQ4_0, 22, 64, 7},   {DType::kQ8_0, 45, 576, 13},
      {DType::kQ8_0, 5, 32, 1},    {DType::kQ4_K, 9, 512, 3},   {DType::kQ6_K, 13, 256, 2},
      {DType::kQ6_K, 6, 768, 5},   {DType::kQ4_K, 4, 1024, 1},  {DType::kQ5_K, 9, 512, 3},
      {DType::kQ5_K, 4, 256, 1},   {DType::kQ5_0, 13, 96, 3},   {DType::kQ5_1, 11, 64, 2},
      {DType::kQ2_K, 9, 512, 3},   {DType::kQ3_K, 13, 256, 2},  {DType::kIQ4_NL, 11, 96, 3},
      {DType::kIQ4_XS, 9, 512, 3}, {DType::kF16, 7, 40, 3},     {DType::kBF16, 11, 24, 2},
      {DType::kF32, 19, 33, 5},
  };
  for (const MatMulCase& c : cases) {
    const auto w = RandomWeights(c.type, c.rows, c.cols, 7 * c.rows + c.cols);
    const auto x = Randn(c.tokens * c.cols, 11 + c.tokens);
    WeightMatrix wm{c.type, w.data(), c.rows, c.cols,
                    static_cast<size_t>(RowBytes(c.type, c.cols))};
    const std::vector<double> ref = ExactProduct(wm, x, c.tokens);
    std::vector<float> out(c.tokens * c.rows, 12345.0f);
    MatMulCpu({wm, x.data(), out.data(), c.tokens, c.rows}, pool);
    EXPECT_LT(RelL2(out, ref), 2e-4)
        << TraitsOf(c.type).name << " " << c.rows << "x" << c.cols << " tokens=" << c.tokens;
    // A row range writes only its rows.
    std::vector<float> part(c.tokens * c.rows, 7.0f);
    MatMulCpu({wm, x.data(), part.data(), c.tokens, c.rows, 1, c.rows - 1}, pool);
    for (int64_t t = 0; t < c.tokens; ++t) {
      EXPECT_EQ(part[t * c.rows], 7.0f);
      EXPECT_EQ(part[t * c.rows + c.rows - 1], 7.0f);
      if (c.rows > 2) {
        EXPECT_NEAR(part[t * c.rows + 1], out[t * c.rows + 1], 1e-6);
      }
    }
  }
}

void PackedMatMulCases(ActBits bits);

// Packed 16-row groups (kernels/packed.h), for 16- and 8-bit activations: close to the exact
// product, the same bits on every ISA (the reference computes the table's operations in plain
// C++), each token's outputs the same whatever else is in the batch, and rows past the last
// group still right.
TEST_P(IsaTest, PackedMatMulMatchesReferenceBitForBitAndIsBatchInvariant) {
  for (const ActBits bits : {ActBits::k16, ActBits::k8}) PackedMatMulCases(bits);
}

void PackedMatMulCases(ActBits bits) {
  ThreadPool pool(2);
  const MatMulCase cases[] = {
      {DType::kQ4_1, 37, 576, 13},
      {DType::kQ4_1, 16, 64, 1},
      {DType::kQ4_0, 48, 96, 9},
      {DType::kQ8_0, 35, 160, 17},
      {DType::kQ4_1, 64, 1536, 8},
      {DType::kQ8_0, 16, 32, 3},
      // Every tail after the 4-token (AVX2) and 8-token (AVX-512) passes for every type.
      {DType::kQ4_1, 32, 128, 6},
      {DType::kQ8_0, 32, 64, 6},
      {DType::kQ4_0, 16, 64, 7},
      {DType::kQ4_0, 32, 64, 6},
      {DType::kQ4_1, 16, 64, 7},
      {DType::kQ4_0, 16, 64, 2},
      {DType::kQ4_1, 16, 64, 2},
      {DType::kQ4_0, 16, 64, 3},
      {DType::kQ4_1, 16, 64, 3},
      {DType::kQ4_0, 16, 64, 4},
      {DType::kQ4_1, 16, 64, 4},
      {DType::kQ4_0, 16, 64, 5},
      {DType::kQ8_0, 16, 64, 4},
      // AMX (8 tokens and more): full 16-token tiles, a tile of 8-15, a tail of 1-7 on AVX-512.
      {DType::kQ4_1, 48, 576, 16},
      {DType::kQ4_0, 32, 128, 33},
      {DType::kQ8_0, 32, 96, 21},
      {DType::kQ4_1, 16, 64, 30},
      {DType::kQ4_0, 16, 64, 8},
      {DType::kQ8_0, 16, 64, 12},
      // Q4_K (sub-blocks packed as Q4_1 with fp32 scales): one token, the AVX2 tails, the
      // AVX-512 passes, AMX tiles of 16 and of 8-15 with a tail, and rows past the last group.
      {DType::kQ4_K, 16, 256, 1},
      {DType::kQ4_K, 37, 512, 6},
      {DType::kQ4_K, 32, 256, 3},
      {DType::kQ4_K, 48, 768, 16},
      {DType::kQ4_K, 16, 256, 29},
      // Q6_K (blocks packed as Q8_0 with a fp32 scale per 16-element half), the same spread.
      {DType::kQ6_K, 16, 256, 1},
      {DType::kQ6_K, 37, 512, 6},
      {DType::kQ6_K, 32, 256, 3},
      {DType::kQ6_K, 48, 768, 16},
      {DType::kQ6_K, 16, 256, 29},
      // Q5_K (sub-blocks packed as Q8_0's bytes with Q4_K's fp32 scale and minimum).
      {DType::kQ5_K, 16, 256, 1},
      {DType::kQ5_K, 37, 512, 6},
      {DType::kQ5_K, 32, 256, 3},
      {DType::kQ5_K, 48, 768, 16},
      {DType::kQ5_K, 16, 256, 29},
      // Q5_0 / Q5_1 (as Q8_0's bytes with their fp16 scales; Q5_1 with Q4_1's minimums).
      {DType::kQ5_0, 37, 96, 6},
      {DType::kQ5_1, 37, 96, 6},
      {DType::kQ5_0, 32, 64, 3},
      {DType::kQ5_1, 16, 64, 1},
      {DType::kQ5_0, 48, 576, 16},
      {DType::kQ5_1, 48, 576, 16},
      {DType::kQ5_1, 16, 64, 29},
      // Q3_K (as Q6_K), IQ4_NL (as Q8_0), IQ4_XS (as Q8_0's quants with fp32 scales): one
      // token, the AVX2 tails, the AVX-512 passes, AMX tiles of 16 and of 8-15 with a tail.
      {DType::kQ3_K, 16, 256, 1},
      {DType::kQ3_K, 37, 512, 6},
      {DType::kQ3_K, 48, 768, 16},
      {DType::kQ3_K, 16, 256, 29},
      {DType::kIQ4_NL, 37, 96, 6},
      {DType::kIQ4_NL, 16, 64, 1},
      {DType::kIQ4_NL, 48, 576, 16},
      {DType::kIQ4_NL, 16, 64, 29},
      {DType::kIQ4_XS, 16, 256, 1},
      {DType::kIQ4_XS, 37, 512, 6},
      {DType::kIQ4_XS, 32, 256, 3},
      {DType::kIQ4_XS, 48, 768, 16},
      {DType::kIQ4_XS, 16, 256, 29},
  };
  for (const MatMulCase& c : cases) {
    const bool a8 = PacksForA8(c.type, bits);
    const std::string name = std::string(TraitsOf(c.type).name) + " " + std::to_string(c.rows) +
                             "x" + std::to_string(c.cols) + " tokens=" + std::to_string(c.tokens) +
                             (a8 ? " a8" : "");
    const auto w = RandomWeights(c.type, c.rows, c.cols, 3 * c.rows + c.cols);
    // Activations spanning the int16 range, with one block of extremes in each of the first 4
    // tokens (every position of a 4-token pass), at a different block per token.
    auto x = Randn(c.tokens * c.cols, 5 + c.tokens, 4.0f);
    const int64_t nb_x = c.cols / kQK;
    for (int64_t t = 0; t < std::min<int64_t>(4, c.tokens); ++t) {
      for (int64_t k = 0; k < kQK; ++k) {
        x[t * c.cols + (t % nb_x) * kQK + k] = ((k + t) % 2 ? -1.0f : 1.0f) * 1e3f;
      }
    }
    const WeightMatrix plain{c.type, w.data(), c.rows, c.cols,
                             static_cast<size_t>(RowBytes(c.type, c.cols))};
    std::vector<uint8_t> storage;
    const WeightMatrix wm = PackWeights(plain, storage, nullptr, bits);
    ASSERT_EQ(wm.packed_rows, c.rows / 16 * 16) << name;
    ASSERT_EQ(wm.packed_a8, a8) << name;
    // Packed into the caller's memory (as the forward pass packs into one region), whatever
    // that memory held: the same bytes.
    ASSERT_EQ(static_cast<int64_t>(storage.size()), PackedBytes(plain)) << name;
    std::vector<uint8_t> dirty(storage.size(), 0xa5);
    const WeightMatrix into = PackWeights(plain, dirty.data(), nullptr, bits);
    ASSERT_EQ(into.packed, dirty.data()) << name;
    ASSERT_EQ(into.packed_rows, wm.packed_rows) << name;
    ASSERT_TRUE(dirty == storage) << name;
    const std::vector<double> ref = ExactProduct(plain, x, c.tokens);
    std::vector<float> out(c.tokens * c.rows, 12345.0f);
    MatMulCpu({wm, x.data(), out.data(), c.tokens, c.rows}, pool);
    // 8 bits: each activation within half a step of 1/127 of its block's largest.
    EXPECT_LT(RelL2(out, ref), a8 ? 2e-2 : 2e-4) << name;
    // Bit for bit the reference's operations, group by group.
    const int64_t nb = c.cols / kQK;
    std::vector<BlockA16> xq(c.tokens * nb);
    std::vector<BlockA8> xq8(c.tokens * nb);
    for (int64_t t = 0; t < c.tokens; ++t) {
      QuantizeRowA16(x.data() + t * c.cols, &xq[t * nb], c.cols);
      QuantizeRowA8(x.data() + t * c.cols, &xq8[t * nb], c.cols);
    }
    std::vector<float> expect(out);
    for (int64_t g = 0; g < c.rows / 16; ++g) {
      const uint8_t* group = wm.packed + g * nb * PackedGroupBlockBytes(c.type);
      if (a8) {
        cpu::PackedTileA8Reference(c.type, group, nb, xq8.data(), nb, c.tokens,
                                   expect.data() + 16 * g, c.rows);
      } else {
        cpu::PackedTileReference(c.type, group, nb, xq.data(), nb, c.tokens, expect.data() + 16 * g,
                                 c.rows);
      }
    }
    EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), out.size() * sizeof(float))) << name;
    // Each token alone gives its row of the batch exactly (packed rows and the tail).
    for (int64_t t = 0; t < c.tokens; ++t) {
      std::vector<float> one(c.rows);
      MatMulCpu({wm, x.data() + t * c.cols, one.data(), 1, c.rows}, pool);
      EXPECT_EQ(0, std::memcmp(one.data(), out.data() + t * c.rows, c.rows * sizeof(float)))
          << name << " token " << t;
    }
  }
}

// Each ISA file's table points at its own packed kernels. (From 36c232b to the twenty-ninth
// session GCC merged the AVX2 and AVX-512 files' instantiations into one symbol: the AVX-512
// table ran the AVX2 kernels, and its bit-for-bit test compared those.)
TEST(Packed, EachIsaTableHasItsOwnKernels) {
  EXPECT_NE(cpu::Avx2Primitives().packed_tile, cpu::Avx512Primitives().packed_tile);
  EXPECT_NE(cpu::Avx2Primitives().packed_tile_a8, cpu::Avx512Primitives().packed_tile_a8);
  EXPECT_NE(cpu::Avx2Primitives().packed_tile, cpu::ScalarPrimitives().packed_tile);
}

// A column slice (rows strided by the full row, as a TP shard's O and down are) packs to the
// same bytes as its rows copied out contiguously.
TEST(Packed, ColumnSlicePacksLikeItsContiguousCopy) {
  for (DType t :
       {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K,
        DType::kQ5_K, DType::kQ6_K, DType::kQ3_K, DType::kIQ4_NL, DType::kIQ4_XS}) {
    // A K-quant slice starts and ends on its 256-element super-blocks.
    const int64_t k = TraitsOf(t).block_elems == kQKK ? 4 : 1;
    const int64_t rows = 40, cols = 256 * k, c0 = 64 * k, c1 = 192 * k;
    const auto w = RandomWeights(t, rows, cols, 77);
    const auto rb = static_cast<size_t>(RowBytes(t, cols));
    const auto off = static_cast<size_t>(RowBytes(t, c0));
    const auto run = static_cast<size_t>(RowBytes(t, c1 - c0));
    std::vector<uint8_t> copy(rows * run);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&copy[r * run], &w[r * rb + off], run);
    std::vector<uint8_t> a, b;
    const WeightMatrix slice = PackWeights({t, w.data() + off, rows, c1 - c0, rb}, a);
    PackWeights({t, copy.data(), rows, c1 - c0, run}, b);
    EXPECT_EQ(slice.packed_rows, 32);
    EXPECT_EQ(a, b) << TraitsOf(t).name;
    // Packing in parallel (160 rows: 10 groups over 2 threads) gives the same bytes.
    ThreadPool pool(2);
    const auto big = RandomWeights(t, 160, cols, 78);
    std::vector<uint8_t> serial, parallel;
    PackWeights({t, big.data(), 160, cols, rb}, serial);
    PackWeights({t, big.data(), 160, cols, rb}, parallel, &pool);
    EXPECT_EQ(serial, parallel) << TraitsOf(t).name;
  }
}

// One input shared by matrices of several types: quantised once (in both widths where some rows
// are packed for 8-bit activations and others, such as a tail of rows or Q8_0, keep 16 bits),
// each product equal to the same matrix alone. Unpacked, packed for 16 and for 8 bits.
TEST_P(IsaTest, MatMulManySharesOneInputAcrossTypes) {
  ThreadPool pool(2);
  const int64_t cols = 96, tokens = 6;
  const auto x = Randn(tokens * cols, 21);
  const DType types[] = {DType::kQ4_1, DType::kQ8_0, DType::kF16, DType::kQ4_0};
  const int64_t rows[] = {19, 32, 5, 33};
  for (const int mode : {0, 16, 8}) {
    std::vector<std::vector<uint8_t>> w, storage(4);
    std::vector<std::vector<float>> one(4), many(4);
    std::vector<MatMulArgs> args;
    for (int i = 0; i < 4; ++i) {
      w.push_back(RandomWeights(types[i], rows[i], cols, 100 + i));
      one[i].assign(tokens * rows[i], 0.0f);
      many[i].assign(tokens * rows[i], 1.0f);
      const ActBits bits = mode == 8 ? ActBits::k8 : ActBits::k16;
      WeightMatrix wm{types[i], w[i].data(), rows[i], cols,
                      static_cast<size_t>(RowBytes(types[i], cols))};
      if (mode != 0) wm = PackWeights(wm, storage[i], nullptr, bits);
      EXPECT_EQ(wm.packed_a8, mode == 8 && PacksForA8(types[i], bits) && rows[i] >= 16);
      MatMulCpu({wm, x.data(), one[i].data(), tokens, rows[i]}, pool);
      args.push_back({wm, x.data(), many[i].data(), tokens, rows[i]});
    }
    MatMulManyCpu(args, pool);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(one[i], many[i]) << TraitsOf(types[i]).name << " " << mode;
  }
}

// The prepare hook fills each input row once before it is read, for integer and float weights
// alike, and the product equals one over the input prepared beforehand. Also the claims of the
// tile cursors: every row is computed, for few and many tokens, whatever thread finishes first.
TEST_P(IsaTest, MatMulPrepareFillsEachRowOnceBeforeItIsRead) {
  ThreadPool pool(2);
  const int64_t cols = 96;
  for (const int64_t tokens : {1, 3, 16}) {
    for (DType t : {DType::kQ4_1, DType::kF16}) {
      const int64_t rows = 75;  // packed groups and a tail
      const auto w = RandomWeights(t, rows, cols, 9);
      std::vector<uint8_t> packed;
      const WeightMatrix wm =
          PackWeights({t, w.data(), rows, cols, static_cast<size_t>(RowBytes(t, cols))}, packed);
      const auto src = Randn(tokens * cols, 23);
      std::vector<float> ready(src.size()), lazy(src.size(), std::nanf(""));
      for (size_t i = 0; i < src.size(); ++i) ready[i] = 2.0f * src[i] + 1.0f;
      std::vector<float> want(tokens * rows), got(tokens * rows, -1.0f);
      MatMulCpu({wm, ready.data(), want.data(), tokens, rows}, pool);
      std::vector<std::atomic<int>> calls(tokens);
      MatMulCpu({wm, lazy.data(), got.data(), tokens, rows}, pool, [&](int64_t t0, int64_t t1) {
        for (int64_t r = t0; r < t1; ++r) {
          calls[r].fetch_add(1);
          for (int64_t c = 0; c < cols; ++c) lazy[r * cols + c] = ready[r * cols + c];
        }
      });
      for (int64_t r = 0; r < tokens; ++r) EXPECT_EQ(calls[r].load(), 1) << "row " << r;
      EXPECT_EQ(got, want) << TraitsOf(t).name << ", " << tokens << " tokens";
    }
  }
}

TEST_P(IsaTest, AttentionMatchesNaiveSoftmax) {
  ThreadPool pool(2);
  struct Case {
    int64_t tokens, n_heads, n_kv, hd, pos0;
  };
  // The decode cases with long contexts split the keys across threads and merge.
  for (const Case c : {Case{1, 9, 3, 64, 0}, Case{1, 9, 3, 64, 150}, Case{7, 4, 2, 24, 0},
                       Case{5, 6, 6, 17, 70}, Case{3, 3, 1, 8, 1}, Case{1, 9, 3, 64, 1500},
                       Case{2, 4, 1, 16, 900}, Case{1, 2, 2, 8, 5000},
                       // More query heads per KV head than one pass takes (71, as Falcon-7B).
                       Case{2, 71, 1, 64, 130}}) {
    const int64_t n_pos = c.pos0 + c.tokens;
    const int64_t stride = c.n_kv * c.hd;
    const auto kf = Randn(n_pos * stride, 5);
    const auto vf = Randn(n_pos * stride, 6);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      k[i] = FloatToFp16(kf[i]);
      v[i] = FloatToFp16(vf[i]);
    }
    const auto q = Randn(c.tokens * c.n_heads * c.hd, 8, 0.5f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    std::vector<double> ref(q.size());
    const int64_t group = c.n_heads / c.n_kv;
    for (int64_t t = 0; t < c.tokens; ++t) {
      for (int64_t h = 0; h < c.n_heads; ++h) {
        const int64_t kvh = h / group;
        const int64_t n = c.pos0 + t + 1;
        std::vector<double> s(n);
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t i = 0; i < c.hd; ++i) {
            d += q[(t * c.n_heads + h) * c.hd + i] * Fp16ToFloat(k[j * stride + kvh * c.hd + i]);
          }
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (auto& e : s) z += (e = std::exp(e - mx));
        for (int64_t i = 0; i < c.hd; ++i) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j)
            o += s[j] / z * Fp16ToFloat(v[j * stride + kvh * c.hd + i]);
          ref[(t * c.n_heads + h) * c.hd + i] = o;
        }
      }
    }
    std::vector<float> out(q.size(), 99.0f);
    AttentionCpu({q.data(), k.data(), v.data(), out.data(), c.tokens, c.n_heads, c.n_kv, c.hd,
                  stride, c.pos0, scale},
                 pool);
    EXPECT_LT(RelL2(out, ref), 1e-5)
        << "tokens=" << c.tokens << " pos0=" << c.pos0 << " hd=" << c.hd;
  }
}

// A batch over a paged cache: sequences sharing blocks of a long prefix (attended together,
// cascade style), prefill chunks and decode rows mixed, scrambled block ids. Every row must be
// bit-identical to its sequence run alone (and with another thread count), and close to a naive
// float64 softmax.
// Three block tables over a shuffled pool of 3 x per blocks of bs positions (A and B share their
// first 1300 positions' blocks; C is its own), and six sequences over them as one batch: odd and
// even key counts, a prefill chunk, rows sharing a prefix.
struct SharedPrefixBatch {
  struct S {
    int64_t tokens, pos0;
    const std::vector<int32_t>* table;
  };
  SharedPrefixBatch(int64_t bs, uint32_t seed) : per(2200 / bs + 1), n_blocks(3 * per) {
    std::vector<int32_t> perm(n_blocks);
    for (int32_t i = 0; i < n_blocks; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
    ta.assign(perm.begin(), perm.begin() + per);
    tb = ta;
    for (int64_t i = 1300 / bs; i < per; ++i) tb[i] = perm[per + i];
    tc.assign(perm.begin() + 2 * per, perm.begin() + 3 * per);
    seqs = {{1, 1700, &ta}, {5, 1290, &tb}, {1, 2100, &tc},
            {1, 1450, &tb}, {3, 510, &ta},  {1, 40, &tc}};
    for (const S& q : seqs) {
      batch.push_back({rows, q.tokens, q.pos0, q.table->data()});
      rows += q.tokens;
    }
  }
  SharedPrefixBatch(const SharedPrefixBatch&) = delete;
  SharedPrefixBatch& operator=(const SharedPrefixBatch&) = delete;
  int64_t per, n_blocks, rows = 0;
  std::vector<int32_t> ta, tb, tc;
  std::vector<S> seqs;
  std::vector<AttentionSeq> batch;
};

TEST_P(IsaTest, PagedBatchIsBitIdenticalToEachSequenceAlone) {
  for (const int64_t bs : {16, 7}) {
    const int64_t n_heads = 9, n_kv = 3, hd = 64, stride = n_kv * hd;
    const SharedPrefixBatch sb(bs, static_cast<uint32_t>(bs));
    const int64_t n_blocks = sb.n_blocks, rows = sb.rows;
    const auto& seqs = sb.seqs;
    const auto& batch = sb.batch;
    const auto& tb = sb.tb;
    const auto kf = Randn(n_blocks * bs * stride, 11);
    const auto vf = Randn(n_blocks * bs * stride, 12);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      k[i] = FloatToFp16(kf[i]);
      v[i] = FloatToFp16(vf[i]);
    }
    const auto q = Randn(rows * n_heads * hd, 13, 0.5f);
    const float scale = 0.125f;
    auto run = [&](const std::vector<AttentionSeq>& b, const float* qp, int64_t n_rows, int th) {
      ThreadPool pool(th);
      std::vector<float> out(n_rows * n_heads * hd, 99.0f);
      PagedAttentionCpu({qp, k.data(), v.data(), out.data(), n_heads, n_kv, hd, stride, bs,
                         bs * stride, b.data(), static_cast<int64_t>(b.size()), scale},
                        pool);
      return out;
    };
    const auto together = run(batch, q.data(), rows, 2);
    EXPECT_EQ(together, run(batch, q.data(), rows, 1)) << "thread count changed the bits";
    {
      // One plan serves every layer of a step (here: the cache's K and V, then the two swapped),
      // also one made for another thread count, and a plan object planned again for other
      // sequences serves those.
      ThreadPool pool(2);
      PagedAttentionPlan plan, plan_one_thread;
      EXPECT_FALSE(plan.planned());
      PagedAttentionArgs args{
          nullptr, nullptr, nullptr, nullptr,     n_heads,      n_kv,
          hd,      stride,  bs,      bs * stride, batch.data(), static_cast<int64_t>(batch.size()),
          scale};
      PlanPagedAttention(args, pool.size(), plan);
      PlanPagedAttention(args, 1, plan_one_thread);
      EXPECT_TRUE(plan.planned());
      for (int layer = 0; layer < 2; ++layer) {
        const uint16_t* kl = layer == 0 ? k.data() : v.data();
        const uint16_t* vl = layer == 0 ? v.data() : k.data();
        std::vector<float> planned(rows * n_heads * hd, 99.0f), other = planned, fresh = planned;
        PagedAttentionCpu(plan, q.data(), kl, vl, planned.data(), pool);
        PagedAttentionCpu(plan_one_thread, q.data(), kl, vl, other.data(), pool);
        args.q = q.data();
        args.k = kl;
        args.v = vl;
        args.out = fresh.data();
        PagedAttentionCpu(args, pool);
        EXPECT_EQ(planned, fresh) << "block size " << bs << ", layer " << layer;
        EXPECT_EQ(other, fresh) << "planned for one thread, block size " << bs;
        if (layer == 0) {
          EXPECT_EQ(planned, together);
        }
      }
      const std::vector<AttentionSeq> one = {{0, seqs[1].tokens, seqs[1].pos0, tb.data()}};
      args.seqs = one.data();
      args.n_seqs = 1;
      const float* q1 = q.data() + batch[1].token0 * n_heads * hd;
      std::vector<float> planned(seqs[1].tokens * n_heads * hd, 99.0f);
      PlanPagedAttention(args, pool.size(), plan);
      PagedAttentionCpu(plan, q1, k.data(), v.data(), planned.data(), pool);
      EXPECT_EQ(planned, run(one, q1, seqs[1].tokens, 2)) << "re-planned, block size " << bs;
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t r0 = batch[i].token0, n = seqs[i].tokens;
      const std::vector<AttentionSeq> one = {{0, n, seqs[i].pos0, seqs[i].table->data()}};
      const auto alone = run(one, q.data() + r0 * n_heads * hd, n, 2);
      const size_t len = static_cast<size_t>(n * n_heads * hd);
      EXPECT_EQ(0,
                std::memcmp(alone.data(), together.data() + r0 * n_heads * hd, len * sizeof(float)))
          << "block size " << bs << ", sequence " << i;
      // Naive reference for this sequence's rows.
      std::vector<double> ref(len);
      std::vector<float> got(together.begin() + r0 * n_heads * hd,
                             together.begin() + r0 * n_heads * hd + len);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < n_heads; ++h) {
          const int64_t kvh = h / 3, keys = seqs[i].pos0 + t + 1;
          auto at = [&](int64_t p) {  // V of position p
            return (*seqs[i].table)[p / bs] * bs * stride + (p % bs) * stride + kvh * hd;
          };
          auto k_at = [&](int64_t p, int64_t x) {  // K (transposed within its block)
            return (*seqs[i].table)[p / bs] * bs * stride + (kvh * hd + x) * bs + p % bs;
          };
          std::vector<double> sc(keys);
          double mx = -1e300, z = 0;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0;
            for (int64_t x = 0; x < hd; ++x) {
              dot += q[((r0 + t) * n_heads + h) * hd + x] * Fp16ToFloat(k[k_at(j, x)]);
            }
            mx = std::max(mx, sc[j] = dot * scale);
          }
          for (auto& e : sc) z += (e = std::exp(e - mx));
          for (int64_t x = 0; x < hd; ++x) {
            double o = 0;
            for (int64_t j = 0; j < keys; ++j) o += sc[j] / z * Fp16ToFloat(v[at(j) + x]);
            ref[(t * n_heads + h) * hd + x] = o;
          }
        }
      }
      EXPECT_LT(RelL2(got, ref), 1e-5) << "block size " << bs << ", sequence " << i;
    }
  }
}

// The lane kernels (heads in vector lanes) against the table's qk_t / exp_shifted_sum / pv, one
// head at a time, to the bit: scores, exps, sums and outputs over chunks of 1 to 64 keys, for
// head counts that fill their vectors and ones that do not, from a record that has seen keys.
TEST_P(IsaTest, LaneAttentionKernelsGiveEachHeadsBits) {
  const auto& p = cpu::Prims();
  if (p.qk_lanes == nullptr) GTEST_SKIP() << "the " << IsaName(GetParam()) << " table has none";
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{48, 64}, {64, 96}, {37, 50}, {5, 3}, {16, 17}, {33, 16}}) {
    const auto src = Randn(rows * (cols + 3), 39);  // a row stride past cols
    std::vector<float> dst((cols + 1) * (rows + 2), -1.0f);
    p.transpose_f32(src.data(), cols + 3, dst.data(), rows + 2, rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(dst[c * (rows + 2) + r], src[r * (cols + 3) + c])
            << "transpose " << rows << " x " << cols << " at " << r << ", " << c;
      }
    }
    EXPECT_EQ(dst[rows], -1.0f) << "wrote past its rows";
  }
  const int64_t d = 64, kc = 64;
  for (const int64_t H : {1, 16, 45, 48, 96, 100}) {
    for (const int64_t n : {64, 37, 1}) {
      const int64_t hs = (H + 15) / 16 * 16;
      const auto q = Randn(H * d, 40 + static_cast<uint32_t>(H), 0.125f);
      std::vector<float> kt(d * kc), vf(kc * d);  // fp16 values, as staged from the cache
      const auto kr = Randn(kt.size(), 41), vr = Randn(vf.size(), 42);
      for (size_t i = 0; i < kt.size(); ++i) kt[i] = Fp16ToFloat(FloatToFp16(kr[i]));
      for (size_t i = 0; i < vf.size(); ++i) vf[i] = Fp16ToFloat(FloatToFp16(vr[i]));
      const auto o0 = Randn(H * d, 43);
      const auto m0 = Randn(H, 44, 0.5f);
      std::vector<float> qt(d * hs, 0.0f), ot(d * hs, 0.0f), st(kc * hs), cmax(hs), sums(hs),
          rescale(hs, 1.0f);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t x = 0; x < d; ++x) {
          qt[x * hs + h] = q[h * d + x];
          ot[x * hs + h] = o0[h * d + x];
        }
      }
      p.qk_lanes(qt.data(), hs, H, d, kt.data(), kc, n, st.data(), cmax.data(), nullptr);
      for (int64_t h = 0; h < H; ++h) cmax[h] = std::max(m0[h], cmax[h]);
      std::vector<float> raw(st);
      p.exp_lanes(st.data(), hs, H, cmax.data(), n, sums.data());
      for (int64_t h = 0; h < H; ++h) rescale[h] = std::exp(m0[h] - cmax[h]);
      p.pv_lanes(st.data(), hs, H, d, vf.data(), n, rescale.data(), ot.data(), nullptr);
      for (int64_t h = 0; h < H; ++h) {
        std::vector<float> sc(kc), o(d);
        float mx = -std::numeric_limits<float>::infinity();
        p.qk_t(q.data() + h * d, 1, d, kt.data(), kc, n, 1.0f, sc.data(), kc, &mx);
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(std::bit_cast<uint32_t>(sc[j]), std::bit_cast<uint32_t>(raw[j * hs + h]))
              << "score, H " << H << " n " << n << " head " << h << " key " << j;
        }
        ASSERT_EQ(std::max(m0[h], mx), cmax[h]) << "maximum, H " << H << " n " << n;
        const float sum = p.exp_shifted_sum(sc.data(), cmax[h], sc.data(), n);
        ASSERT_EQ(std::bit_cast<uint32_t>(sum), std::bit_cast<uint32_t>(sums[h]))
            << "sum, H " << H << " n " << n << " head " << h;
        for (int64_t x = 0; x < d; ++x) o[x] = o0[h * d + x] * rescale[h];
        p.pv(sc.data(), kc, 1, d, vf.data(), n, o.data(), d);
        for (int64_t x = 0; x < d; ++x) {
          ASSERT_EQ(std::bit_cast<uint32_t>(o[x]), std::bit_cast<uint32_t>(ot[x * hs + h]))
              << "output, H " << H << " n " << n << " head " << h << " dim " << x;
        }
      }
    }
  }
}

// Tasks with enough heads run in lanes (16 decode rows over a shared prefix: 48 heads; 32 rows
// of a prefill below the diagonal: 96): each decode row gives its bits alone (one row, no
// lanes), each prefill row its bits in chunks of 8 rows (24 heads, no lanes), and both are near
// a naive softmax.
TEST_P(IsaTest, PagedLaneTasksGiveTheBitsOfOneRowAndOfSmallChunks) {
  // 15 decode rows: 45 heads, a vector not full; head dim 128: no lanes (pv_f16 is no FMA chain
  // there), the same checks.
  // 40 decode rows: one run over the shared keys cut 20 + 20, each task from other sequences'
  // tables.
  for (const auto& [hd, n_dec] :
       {std::pair<int64_t, int64_t>{64, 16}, {64, 15}, {64, 40}, {128, 16}}) {
    const int64_t bs = 16, n_heads = 9, n_kv = 3, stride = n_kv * hd;
    const int64_t prefix = 1100, own = 40, pre_rows = 40, pre_pos0 = 700;
    // Blocks: the shared prefix's, then each decode sequence's own, then the prefill's.
    const int64_t pb = (prefix + bs - 1) / bs, ob = (own + bs) / bs;
    const int64_t fb = (pre_pos0 + pre_rows + bs - 1) / bs;
    const int64_t n_blocks = pb + n_dec * ob + fb;
    std::vector<std::vector<int32_t>> tables(n_dec + 1);
    for (int64_t s = 0; s < n_dec; ++s) {
      for (int64_t b = 0; b < pb; ++b) tables[s].push_back(static_cast<int32_t>(b));
      for (int64_t b = 0; b < ob; ++b) tables[s].push_back(static_cast<int32_t>(pb + s * ob + b));
    }
    for (int64_t b = 0; b < fb; ++b)
      tables[n_dec].push_back(static_cast<int32_t>(pb + n_dec * ob + b));
    const auto kf = Randn(n_blocks * bs * stride, 51), vf = Randn(n_blocks * bs * stride, 52);
    std::vector<uint16_t> k(kf.size()), v(vf.size());
    for (size_t i = 0; i < kf.size(); ++i) {
      k[i] = FloatToFp16(kf[i]);
      v[i] = FloatToFp16(vf[i]);
    }
    std::vector<AttentionSeq> batch;
    int64_t rows = 0;
    for (int64_t s = 0; s < n_dec; ++s) {
      // Own keys 1..40 in blocks of their own after the shared 69 blocks (positions 0-1103).
      const int64_t keys = pb * bs + 1 + (s * 7) % own;
      batch.push_back({rows++, 1, keys - 1, tables[s].data()});
    }
    batch.push_back({rows, pre_rows, pre_pos0, tables[n_dec].data()});
    rows += pre_rows;
    const auto q = Randn(rows * n_heads * hd, 53, 0.5f);
    const float scale = 0.125f;
    auto run = [&](const std::vector<AttentionSeq>& b, const float* qp, int64_t n_rows) {
      ThreadPool pool(2);
      std::vector<float> out(n_rows * n_heads * hd, 99.0f);
      PagedAttentionCpu({qp, k.data(), v.data(), out.data(), n_heads, n_kv, hd, stride, bs,
                         bs * stride, b.data(), static_cast<int64_t>(b.size()), scale},
                        pool);
      return out;
    };
    const int64_t lane_units = PagedAttentionLaneUnits();
    const auto together = run(batch, q.data(), rows);
    if (cpu::Prims().qk_lanes != nullptr && hd == 64) {
      EXPECT_GT(PagedAttentionLaneUnits(), lane_units) << "the batch took no lane path";
    } else {
      EXPECT_EQ(PagedAttentionLaneUnits(), lane_units) << "head dim " << hd;
    }
    const int64_t row_elems = n_heads * hd;
    for (int64_t s = 0; s < n_dec; ++s) {
      const std::vector<AttentionSeq> one = {{0, 1, batch[s].pos0, tables[s].data()}};
      const auto alone = run(one, q.data() + s * row_elems, 1);
      EXPECT_EQ(
          0, std::memcmp(alone.data(), together.data() + s * row_elems, row_elems * sizeof(float)))
          << "decode sequence " << s << ", head dim " << hd << ", " << n_dec << " rows";
    }
    {
      // The 40 prefill rows alone: range 0's rows are cut 20 + 20 (not 32 + 8), so both tasks
      // run in lanes over each of the 3 KV heads; range 1 (the diagonal) does not.
      const std::vector<AttentionSeq> pre = {{0, pre_rows, pre_pos0, tables[n_dec].data()}};
      const int64_t before = PagedAttentionLaneUnits();
      const auto alone = run(pre, q.data() + n_dec * row_elems, pre_rows);
      if (cpu::Prims().qk_lanes != nullptr && hd == 64) {
        EXPECT_EQ(PagedAttentionLaneUnits() - before, 2 * n_kv);
      }
      EXPECT_EQ(0, std::memcmp(alone.data(), together.data() + n_dec * row_elems,
                               pre_rows * row_elems * sizeof(float)))
          << "prefill alone, head dim " << hd;
    }
    // Other prefill lengths over the same blocks: cut evenly only where every task then takes
    // the lanes (34 rows stay 32 + 2, 44 stay 32 + 12: one task in lanes per KV head), and each
    // row's bits those of 2-row calls (6 heads, no lanes).
    for (const auto& [n_pre, lane_tasks] : {std::pair<int64_t, int64_t>{34, 1}, {44, 1}}) {
      if (hd != 64 || n_dec != 16) break;
      const auto qp = Randn(n_pre * row_elems, 54, 0.5f);
      const std::vector<AttentionSeq> pre = {{0, n_pre, pre_pos0, tables[n_dec].data()}};
      const int64_t before = PagedAttentionLaneUnits();
      const auto whole = run(pre, qp.data(), n_pre);
      if (cpu::Prims().qk_lanes != nullptr) {
        EXPECT_EQ(PagedAttentionLaneUnits() - before, lane_tasks * n_kv) << n_pre << " rows";
      }
      for (int64_t r0 = 0; r0 < n_pre; r0 += 2) {
        const std::vector<AttentionSeq> two = {{0, 2, pre_pos0 + r0, tables[n_dec].data()}};
        const auto part = run(two, qp.data() + r0 * row_elems, 2);
        ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + r0 * row_elems,
                                 2 * row_elems * sizeof(float)))
            << n_pre << " prefill rows, rows " << r0 << "-" << r0 + 1;
      }
    }
    for (int64_t r0 = 0; r0 < pre_rows; r0 += 8) {
      const std::vector<AttentionSeq> part = {{0, 8, pre_pos0 + r0, tables[n_dec].data()}};
      const auto chunk = run(part, q.data() + (n_dec + r0) * row_elems, 8);
      EXPECT_EQ(0, std::memcmp(chunk.data(), together.data() + (n_dec + r0) * row_elems,
                               8 * row_elems * sizeof(float)))
          << "prefill rows " << r0 << "-" << r0 + 7 << ", head dim " << hd;
    }
    // Near a naive float64 softmax: decode sequence 5 and prefill row 33.
    for (const auto& [s, t] : {std::pair<int64_t, int64_t>{5, 0}, {n_dec, 33}}) {
      const int64_t row = batch[s].token0 + t, keys = batch[s].pos0 + t + 1;
      std::vector<double> ref(row_elems);
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t kvh = h / 3;
        auto base = [&](int64_t pos) { return tables[s][pos / bs] * bs * stride; };
        std::vector<double> sc(keys);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < hd; ++x) {
            dot += q[row * row_elems + h * hd + x] *
                   Fp16ToFloat(k[base(j) + (kvh * hd + x) * bs + j % bs]);
          }
          mx = std::max(mx, sc[j] = dot * scale);
        }
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (int64_t x = 0; x < hd; ++x) {
          double o = 0;
          for (int64_t j = 0; j < keys; ++j) {
            o += sc[j] / z * Fp16ToFloat(v[base(j) + (j % bs) * stride + kvh * hd + x]);
          }
          ref[h * hd + x] = o;
        }
      }
      const std::vector<float> got(together.begin() + row * row_elems,
                                   together.begin() + (row + 1) * row_elems);
      EXPECT_LT(RelL2(got, ref), 1e-5) << "sequence " << s << ", row " << t;
    }
  }
}

// bf16 attention (PagedAttentionArgs::bf16) over a cache of bf16 pairs: a batch gives each
// sequence's bits alone, and the result is near an exact softmax over the cache's bf16 values.
TEST_P(IsaTest, Bf16PagedAttentionMatchesReferenceAndIsBatchInvariant) {
  const int64_t bs = 16, n_heads = 9, n_kv = 3, hd = 64, stride = n_kv * hd;
  const SharedPrefixBatch sb(bs, 5);
  const int64_t n_blocks = sb.n_blocks, rows = sb.rows;
  const auto& seqs = sb.seqs;
  const auto& batch = sb.batch;
  std::vector<uint16_t> k(n_blocks * bs * stride), v(k.size());
  const auto kf = Randn(k.size(), 21), vf = Randn(v.size(), 22);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = cpu::Bf16Of(kf[i]);
    v[i] = cpu::Bf16Of(vf[i]);
  }
  // The pair layout (kernels/ops.h): K's dims 2i, 2i + 1 of a slot side by side, V's slots
  // 2m, 2m + 1 of a dim side by side.
  auto k_at = [&](int32_t block, int64_t h, int64_t x, int64_t slot) {
    return block * bs * stride + (h * hd + (x & ~int64_t{1})) * bs + 2 * slot + (x & 1);
  };
  auto v_at = [&](int32_t block, int64_t slot, int64_t h, int64_t x) {
    return block * bs * stride + (slot & ~int64_t{1}) * stride + 2 * (h * hd + x) + (slot & 1);
  };
  const auto q = Randn(rows * n_heads * hd, 23, 0.5f);
  const float scale = 0.125f;
  auto run = [&](const std::vector<AttentionSeq>& b, const float* qp, int64_t n_rows, int th) {
    ThreadPool pool(th);
    std::vector<float> out(n_rows * n_heads * hd, 99.0f);
    PagedAttentionCpu({qp, k.data(), v.data(), out.data(), n_heads, n_kv, hd, stride, bs,
                       bs * stride, b.data(), static_cast<int64_t>(b.size()), scale, 0, 0, 0, true},
                      pool);
    return out;
  };
  const auto together = run(batch, q.data(), rows, 2);
  EXPECT_EQ(together, run(batch, q.data(), rows, 1)) << "thread count changed the bits";
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int64_t r0 = batch[i].token0, n = seqs[i].tokens;
    const size_t len = static_cast<size_t>(n * n_heads * hd);
    const std::vector<AttentionSeq> one = {{0, n, seqs[i].pos0, seqs[i].table->data()}};
    const auto alone = run(one, q.data() + r0 * n_heads * hd, n, 2);
    EXPECT_EQ(0,
              std::memcmp(alone.data(), together.data() + r0 * n_heads * hd, len * sizeof(float)))
        << "sequence " << i;
    // Exact softmax over the bf16 K / V with q rounded to bf16 as the kernel rounds it; what is
    // left is the weights' rounding to bf16 (2^-9 relative each).
    std::vector<double> ref(len);
    const std::vector<float> got(together.begin() + r0 * n_heads * hd,
                                 together.begin() + r0 * n_heads * hd + len);
    const auto& table = *seqs[i].table;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < n_heads; ++h) {
        const int64_t kvh = h / 3, keys = seqs[i].pos0 + t + 1;
        std::vector<double> sc(keys);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < hd; ++x) {
            const float qs = q[((r0 + t) * n_heads + h) * hd + x] * scale;
            dot += static_cast<double>(cpu::Bf16ToFloat(cpu::Bf16Of(qs))) *
                   cpu::Bf16ToFloat(k[k_at(table[j / bs], kvh, x, j % bs)]);
          }
          mx = std::max(mx, sc[j] = dot);
        }
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (int64_t x = 0; x < hd; ++x) {
          double o = 0;
          for (int64_t j = 0; j < keys; ++j) {
            o += sc[j] / z * cpu::Bf16ToFloat(v[v_at(table[j / bs], j % bs, kvh, x)]);
          }
          ref[(t * n_heads + h) * hd + x] = o;
        }
      }
    }
    const double rel = RelL2(got, ref);
    EXPECT_LT(rel, 5e-3) << "sequence " << i;
    EXPECT_GT(rel, 1e-7) << "sequence " << i << ": the weights were not rounded to bf16";
  }
}

TEST(Bf16, RoundsToNearestEvenFlushesTinyAndKeepsNaN) {
  EXPECT_EQ(cpu::Bf16Of(1.0f), 0x3F80);
  EXPECT_EQ(cpu::Bf16Of(-2.0f), 0xC000);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one (1); 1 + 3 * 2^-8 up.
  EXPECT_EQ(cpu::Bf16Of(1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(cpu::Bf16Of(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(cpu::Bf16Of(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(cpu::Bf16Of(0x1p-61f), 0x0000);
  EXPECT_EQ(cpu::Bf16Of(-0x1p-61f), 0x8000);
  EXPECT_EQ(cpu::Bf16Of(0x1p-60f), cpu::Bf16Of(0x1p-60f) & 0x7FFF);
  EXPECT_NE(cpu::Bf16Of(0x1p-60f), 0);
  EXPECT_EQ(cpu::Bf16Of(1e-40f), 0) << "subnormal";
  const uint16_t nan = cpu::Bf16Of(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(cpu::Bf16ToFloat(nan)));
  uint32_t sn = 0x7F800001u;  // a signalling NaN whose payload is all below bit 16
  float snf;
  std::memcpy(&snf, &sn, sizeof snf);
  EXPECT_TRUE(std::isnan(cpu::Bf16ToFloat(cpu::Bf16Of(snf))));
  EXPECT_EQ(cpu::Bf16Of(std::numeric_limits<float>::infinity()), 0x7F80);
}

// A pair of bf16 product kernels against the scalar entries, bit for bit (AVX-512: VDPBF16PS or
// fused multiply-adds in the tiles' order; AMX-BF16: the tiles, from 6 heads, in full groups of 16
// and a last partial one), over any head count and odd and even key counts.
void ExpectBf16ProductsMatchScalarReference(const cpu::Bf16Products& p) {
  constexpr int64_t d = 64, kMax = 64;
  std::mt19937 rng(41);
  auto pairs_of = [&](size_t n, float sc) {
    std::vector<uint32_t> out(n);
    const auto lo = Randn(n, rng(), sc), hi = Randn(n, rng(), sc);
    for (size_t i = 0; i < n; ++i)
      out[i] = cpu::Bf16Of(lo[i]) | static_cast<uint32_t>(cpu::Bf16Of(hi[i])) << 16;
    return out;
  };
  for (int64_t G : {1, 3, 6, 7, 12, 16, 19, 48}) {
    for (int64_t n : {1, 2, 15, 16, 31, 32, 33, 63, 64}) {
      // K: 4 groups of 16 keys, each [d / 2][16] inside a 16-slot block (pair stride 16).
      const auto kp = pairs_of(4 * d / 2 * 16, 1.0f);
      const uint32_t* groups[4];
      for (int c = 0; c < 4; ++c) groups[c] = kp.data() + c * d / 2 * 16;
      const auto qp = pairs_of(G * d / 2, 0.2f);
      std::vector<float> s1(G * kMax, 7.0f), s2 = s1, m1(G), m2(G);
      p.qk(qp.data(), G, d, groups, 16, n, s1.data(), kMax, m1.data(), nullptr);
      cpu::GenericQkBf16(qp.data(), G, d, groups, 16, n, s2.data(), kMax, m2.data());
      ASSERT_EQ(s1, s2) << "qk_bf16, G " << G << " n " << n;
      ASSERT_EQ(m1, m2) << "qk_bf16 maximum, G " << G << " n " << n;
      // V: a pair of keys per row, each at its own address; weights with a zero after odd n.
      auto vp = pairs_of((kMax / 2) * d, 1.0f);
      const uint32_t* rows[kMax / 2];
      for (int64_t jp = 0; jp < kMax / 2; ++jp) rows[jp] = vp.data() + (kMax / 2 - 1 - jp) * d;
      auto pp = pairs_of(G * kMax / 2, 0.5f);
      if (n % 2 != 0) {
        for (int64_t g = 0; g < G; ++g) pp[g * kMax / 2 + n / 2] &= 0xFFFFu;
        // Key n (past the end) holds an infinity, as a stale slot might: never read.
        uint32_t* last = vp.data() + (kMax / 2 - 1 - n / 2) * d;
        for (int64_t i = 0; i < d; ++i) last[i] = (last[i] & 0xFFFFu) | 0x7F800000u;
      }
      const auto o0 = Randn(G * (d + 2), rng());
      std::vector<float> o1 = o0, o2 = o0;
      o1[2] = o2[2] = 1e-40f;  // a subnormal accumulator reads as zero
      p.pv(pp.data(), kMax / 2, G, d, rows, n, o1.data() + 2, d + 2, nullptr);
      cpu::GenericPvBf16(pp.data(), kMax / 2, G, d, rows, n, o2.data() + 2, d + 2);
      ASSERT_EQ(o1, o2) << "pv_bf16, G " << G << " n " << n;
      // Head 0 with no weight: its outputs are what it read, so the subnormal accumulators
      // (either sign) must come back as zero (and equal the reference's).
      auto pz = pp;
      std::fill_n(pz.begin(), kMax / 2, 0u);
      std::vector<float> z1 = o0;
      z1[2] = 1e-40f;
      z1[3] = -1e-40f;
      std::vector<float> z2 = z1;
      p.pv(pz.data(), kMax / 2, G, d, rows, n, z1.data() + 2, d + 2, nullptr);
      cpu::GenericPvBf16(pz.data(), kMax / 2, G, d, rows, n, z2.data() + 2, d + 2);
      ASSERT_EQ(z1, z2) << "pv_bf16 without weights, G " << G << " n " << n;
      ASSERT_EQ(z1[2], 0.0f) << "a subnormal accumulator was not read as zero";
      ASSERT_EQ(z1[3], 0.0f) << "a subnormal accumulator was not read as zero";
    }
  }
}

TEST_P(IsaTest, Bf16ProductsMatchScalarReference) {
  ExpectBf16ProductsMatchScalarReference({cpu::Prims().qk_bf16, cpu::Prims().pv_bf16});
}

// Both AVX-512 kernels, whichever the table took: the fused multiply-adds (every AVX-512 CPU's
// fallback) and VDPBF16PS (two chain steps an instruction, where the CPU has it).
TEST(Bf16, EveryAvx512KernelMatchesScalarReference) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  {
    SCOPED_TRACE("fused multiply-adds");
    ExpectBf16ProductsMatchScalarReference(cpu::Avx512FmaBf16());
  }
  if (!cpu::CpuHasDpBf16()) GTEST_SKIP() << "this CPU has no AVX512_BF16";
  SCOPED_TRACE("VDPBF16PS");
  ExpectBf16ProductsMatchScalarReference(cpu::Avx512DpBf16());
  // The table's start-up check passed and the table took them (a failed check would leave the
  // fused multiply-adds in use silently).
  ASSERT_TRUE(cpu::DpBf16Usable()) << "VDPBF16PS kernels disagree with the reference here";
  EXPECT_EQ(cpu::Avx512Primitives().qk_bf16, cpu::Avx512DpBf16().qk);
  EXPECT_EQ(cpu::Avx512Primitives().pv_bf16, cpu::Avx512DpBf16().pv);
}

TEST_P(IsaTest, Bf16ConversionMatchesReference) {
  const auto& p = cpu::Prims();
  std::vector<float> x = Randn(1000, 31, 3.0f);
  std::mt19937 rng(32);
  for (int i = 0; i < 1000; ++i) {  // any bit pattern
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 1e-40f, -1e-40f, 0x1p-60f, 0x1p-61f, 1.0f + 0x1p-8f, 3.4e38f,
                  std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(f);
  std::vector<uint16_t> got(x.size());
  p.to_bf16(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], cpu::Bf16Of(x[i])) << "element " << i;
}

// The AVX-512 table has its own bf16 entries (not the scalar ones), and where the CPU has AMX-BF16
// the AMX table runs them on tiles.
TEST(Bf16, VectorAndTileKernelsInUseWhereTheCpuHasThem) {
  if (DetectedIsa() < Isa::kAvx512) GTEST_SKIP() << "this CPU has no AVX-512";
  EXPECT_NE(cpu::Avx512Primitives().qk_bf16, &cpu::GenericQkBf16);
  EXPECT_NE(cpu::Avx512Primitives().pv_bf16, &cpu::GenericPvBf16);
  if (!cpu::AmxBf16Usable()) GTEST_SKIP() << "this CPU has no AMX-BF16 (or the OS refused AMX)";
  EXPECT_NE(cpu::AmxPrimitives().qk_bf16, cpu::Avx512Primitives().qk_bf16);
  EXPECT_NE(cpu::AmxPrimitives().pv_bf16, cpu::Avx512Primitives().pv_bf16);
  EXPECT_GT(cpu::AmxPrimitives().pair_heads_bf16, cpu::Avx512Primitives().pair_heads_bf16);
}

// Where the CPU has AMX-INT8 and Linux grants the tile state, the detected level is amx and its
// table runs the packed products on tiles (not the AVX-512 kernel under another name).
TEST(Amx, TileKernelsInUseWhereTheCpuHasThem) {
  if (!cpu::AmxUsable()) GTEST_SKIP() << "this CPU has no AMX-INT8 and VBMI, or the OS refused it";
  EXPECT_EQ(DetectedIsa(), Isa::kAmx);
  EXPECT_NE(cpu::AmxPrimitives().split_a16, nullptr);
  EXPECT_NE(cpu::AmxPrimitives().packed_tile_split, nullptr);
  EXPECT_EQ(cpu::Avx512Primitives().packed_tile_split, nullptr);
  EXPECT_NE(cpu::AmxPrimitives().packed_tile_a8, cpu::Avx512Primitives().packed_tile_a8);
}

TEST_P(IsaTest, VectorPrimitivesMatchScalarReference) {
  const auto& p = cpu::Prims();
  for (const void* fn :
       {(const void*)p.q4_0_a16, (const void*)p.q4_1_a16, (const void*)p.q8_0_a16,
        (const void*)p.f32_f32, (const void*)p.qk_t, (const void*)p.pv_f16,
        (const void*)p.exp_shifted_sum, (const void*)p.f16_to_f32_tile, (const void*)p.qk_t_f16,
        (const void*)p.f16_to_f32, (const void*)p.quantize_a16, (const void*)p.exp_shifted,
        (const void*)p.silu_mul, (const void*)p.pv, (const void*)p.to_fp16,
        (const void*)p.quantize_a8, (const void*)p.packed_tile_a8, (const void*)p.argmax}) {
    ASSERT_NE(fn, nullptr) << "a primitive is missing from the " << IsaName(GetParam()) << " table";
  }
  const auto& ref = cpu::ScalarPrimitives();
  for (int64_t n : {32, 64, 576, 1536}) {
    auto x = Randn(n, static_cast<uint32_t>(n), 4.0f);
    x[3] = 0.0f;
    std::vector<BlockA16> q(n / kQK), q_ref(n / kQK);
    p.quantize_a16(x.data(), q.data(), n);
    ref.quantize_a16(x.data(), q_ref.data(), n);
    for (int64_t b = 0; b < n / kQK; ++b) {
      ASSERT_EQ(q[b].d, q_ref[b].d);
      ASSERT_EQ(q[b].sum, q_ref[b].sum);
      ASSERT_EQ(q[b].dsum, q_ref[b].dsum);
      for (int j = 0; j < kQK; ++j) ASSERT_EQ(q[b].qs[j], q_ref[b].qs[j]) << b << " " << j;
    }
    // 8 bits: the same, and every value in [-127, 127] (the packed kernels' int16 sums rely on
    // it), the largest magnitude of each block at 127.
    x[5] = -1e9f;
    std::vector<BlockA8> q8(n / kQK), q8_ref(n / kQK);
    p.quantize_a8(x.data(), q8.data(), n);
    ref.quantize_a8(x.data(), q8_ref.data(), n);
    for (int64_t b = 0; b < n / kQK; ++b) {
      ASSERT_EQ(q8[b].d, q8_ref[b].d);
      ASSERT_EQ(q8[b].sum, q8_ref[b].sum);
      ASSERT_EQ(q8[b].dsum, q8_ref[b].dsum);
      int biggest = 0, sum = 0;
      for (int j = 0; j < kQK; ++j) {
        ASSERT_EQ(q8[b].qs[j], q8_ref[b].qs[j]) << b << " " << j;
        ASSERT_GE(q8[b].qs[j], -127);
        biggest = std::max(biggest, std::abs(int{q8[b].qs[j]}));
        sum += q8[b].qs[j];
      }
      EXPECT_EQ(biggest, 127) << b;
      EXPECT_EQ(sum, q8[b].sum) << b;
      for (int j = 0; j < kQK; ++j) {
        EXPECT_NEAR(x[b * kQK + j], q8[b].d * q8[b].qs[j], 0.5001 * q8[b].d) << b << " " << j;
      }
    }
  }
  std::vector<BlockA16> zero(2);
  std::vector<float> zeros(64, 0.0f);
  p.quantize_a16(zeros.data(), zero.data(), 64);
  EXPECT_EQ(zero[1].d, 0.0f);
  EXPECT_EQ(zero[1].sum, 0);
  EXPECT_EQ(zero[1].dsum, 0.0f);
  for (int64_t n : {1, 7, 8, 37, 64}) {
    std::vector<float> x(n), y(n), g = Randn(n, 3, 3.0f), u = Randn(n, 4), s(n);
    for (int64_t i = 0; i < n; ++i) x[i] = -80.0f + 160.0f * i / std::max<int64_t>(1, n - 1);
    p.exp_shifted(x.data(), 1.5f, y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] - 1.5f < -87.0f) continue;  // below the documented range
      ASSERT_NEAR(y[i], std::exp(double(x[i]) - 1.5), 3e-7 * std::exp(double(x[i]) - 1.5)) << x[i];
    }
    std::vector<float> y2(n);
    const float sum = p.exp_shifted_sum(x.data(), 1.5f, y2.data(), n);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(y2[i], y[i]) << "exp_shifted_sum and exp_shifted differ at " << i;
      want_sum += y[i];
    }
    ASSERT_NEAR(sum, want_sum, 1e-6 * want_sum);
    // Several rows at once (where the table has it): each row's bits are exp_shifted_sum's.
    for (const int64_t m : {n, n / 2 + 1}) {
      if (p.exp_shifted_sums == nullptr) break;
      for (int64_t rows = 1; rows <= 5; ++rows) {
        const int64_t xs = m + 3;
        std::vector<float> xr(rows * xs), sums(rows), shift(rows);
        for (int64_t r = 0; r < rows; ++r) {
          shift[r] = 0.5f * static_cast<float>(r) - 1.0f;
          for (int64_t i = 0; i < m; ++i) xr[r * xs + i] = x[(i + 7 * r) % n];
        }
        std::vector<float> want(xr);
        p.exp_shifted_sums(xr.data(), xs, rows, shift.data(), m, sums.data());
        for (int64_t r = 0; r < rows; ++r) {
          const float s1 =
              p.exp_shifted_sum(want.data() + r * xs, shift[r], want.data() + r * xs, m);
          ASSERT_EQ(sums[r], s1) << rows << " rows, row " << r << ", m " << m;
        }
        ASSERT_TRUE(xr == want) << rows << " rows, m " << m;
      }
    }
    p.silu_mul(g.data(), u.data(), s.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(s[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5);
    std::vector<uint16_t> h(n);
    p.to_fp16(g.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], FloatToFp16(g[i]));
  }
  // argmax: the first index of the largest value as the scalar loops find it, also for ties
  // across lanes (the first in a later lane than a second copy), in the tail, for +-inf and
  // NaN (never chosen), and when nothing is above -inf.
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n : {1, 5, 16, 17, 33, 1000, 49152, 49157}) {
    const auto base = Randn(n, static_cast<uint32_t>(n + 9));
    std::vector<std::vector<float>> cases{base};
    auto with = [&](std::initializer_list<std::pair<int64_t, float>> sets) {
      std::vector<float> v = base;
      for (auto [i, x] : sets) {
        if (i < n) v[i] = x;
      }
      cases.push_back(v);
    };
    with({{n - 1, 9.0f}});                        // the maximum last (the tail)
    with({{7, 9.0f}, {2, 9.0f}, {n - 1, 9.0f}});  // ties: index 2, lane 2 before lane 7
    with({{18, 9.0f}, {3, 9.0f}});                // ties: lane 3 at 3, lane 2 at 18
    with({{34, 9.0f}, {18, 9.0f}});               // ties in one lane: 18, then 34
    with({{0, kNaN}, {4, kNaN}, {n / 2, kInf}});
    cases.push_back(std::vector<float>(n, -kInf));
    cases.push_back(std::vector<float>(n, kNaN));
    std::vector<float> mixed(n, kNaN);
    mixed[n - 1] = -kInf;
    if (n > 3) mixed[3] = -kInf;
    cases.push_back(mixed);
    for (size_t c = 0; c < cases.size(); ++c) {
      ASSERT_EQ(p.argmax(cases[c].data(), n), ref.argmax(cases[c].data(), n))
          << "argmax, n " << n << " case " << c;
    }
    const auto& v = cases[2];
    ASSERT_EQ(p.argmax(v.data(), n), n > 2 ? 2 : 0);
  }
  // The vector exps (AVX2's 8 lanes, AVX-512's 16: its exp_shifted_sum) give the same bits over
  // the clamp's whole range and past it: results that are subnormal at its low end, and its top,
  // where 2^n is 2^127 (primitives.h vexp).
  if (GetParam() == Isa::kAvx512 || GetParam() == Isa::kAmx) {
    std::vector<float> x;
    for (float v = -100.0f; v < 100.0f; v += 0.00390625f) x.push_back(v);
    for (float v = -87.4f; v < -86.0f; v = std::nextafter(v, 0.0f) + 1e-5f) x.push_back(v);
    std::vector<float> y16(x.size()), y8(x.size());
    p.exp_shifted_sum(x.data(), 0.0f, y16.data(), static_cast<int64_t>(x.size()));
    cpu::Avx2Primitives().exp_shifted(x.data(), 0.0f, y8.data(), static_cast<int64_t>(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(y16[i]), std::bit_cast<uint32_t>(y8[i])) << x[i];
    }
    // SiLU's 16 lanes: AVX2's bits for every length (its tail included).
    for (int64_t n : {1, 7, 8, 15, 16, 23, 31, 1536, 1543}) {
      std::vector<float> g(n), u = Randn(n, 77);
      for (int64_t i = 0; i < n; ++i) g[i] = x[(i * 7919) % x.size()];
      std::vector<float> o16(n), o8(n);
      p.silu_mul(g.data(), u.data(), o16.data(), n);
      cpu::Avx2Primitives().silu_mul(g.data(), u.data(), o8.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(o16[i]), std::bit_cast<uint32_t>(o8[i]))
            << "silu n " << n << " at " << i << " gate " << g[i];
      }
    }
  }
  // fp16 tiles: exact conversion of rows x cols, nothing written outside them.
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {16, 64}, {5, 37}}) {
    std::vector<uint16_t> src(rows * (cols + 3));
    const auto vals = Randn(static_cast<int64_t>(src.size()), static_cast<uint32_t>(cols), 8.0f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = FloatToFp16(vals[i]);
    const int64_t ds = cols + 5;
    std::vector<float> dst(rows * ds, -7.0f);
    p.f16_to_f32_tile(src.data(), cols + 3, dst.data(), ds, rows, cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < ds; ++c) {
        ASSERT_EQ(dst[r * ds + c], c < cols ? Fp16ToFloat(src[r * (cols + 3) + c]) : -7.0f)
            << rows << "x" << cols << " at " << r << "," << c;
      }
    }
  }
  // q.k over transposed K: one fused chain per key in dim order, the same bits on every ISA.
  // G up to 13: the AVX-512 kernels' 6-head passes, their wide passes of 7-12 heads (several
  // rows' heads at once), and passes again beyond.
  const auto kt = Randn(64 * 64, 21), qv = Randn(13 * 64, 22);
  for (int64_t G = 1; G <= 13; ++G) {
    for (int64_t n : {1, 5, 8, 16, 24, 29, 33, 40, 47, 56, 63, 64}) {
      std::vector<float> got(G * 64, -1.0f), want(G * 64, -1.0f), got_max(G), want_max(G);
      p.qk_t(qv.data(), G, 64, kt.data(), 64, n, 0.125f, got.data(), 64, got_max.data());
      ref.qk_t(qv.data(), G, 64, kt.data(), 64, n, 0.125f, want.data(), 64, want_max.data());
      ASSERT_EQ(got, want) << "G " << G << " n " << n;
      ASSERT_EQ(got_max, want_max) << "G " << G << " n " << n;
      for (int64_t g = 0; g < G; ++g) {
        ASSERT_EQ(got_max[g], *std::max_element(got.begin() + g * 64, got.begin() + g * 64 + n));
      }
      // The same keys as fp16 groups of 16 (dim stride 32, as in a cache block of 32): the
      // same bits as their fp32 staging.
      std::vector<uint16_t> h16(4 * 64 * 32);
      std::vector<float> kt16(64 * 64);
      const uint16_t* groups[4];
      for (int c = 0; c < 4; ++c) {
        groups[c] = h16.data() + c * 64 * 32 + 5;
        for (int64_t i = 0; i < 64; ++i) {
          for (int j = 0; j < 16; ++j) {
            h16[c * 64 * 32 + 5 + i * 32 + j] = FloatToFp16(kt[i * 64 + 16 * c + j]);
            kt16[i * 64 + 16 * c + j] = Fp16ToFloat(h16[c * 64 * 32 + 5 + i * 32 + j]);
          }
        }
      }
      std::vector<float> s16(G * 64, -1.0f), s32(G * 64, -1.0f), m16(G), m32(G);
      p.qk_t_f16(qv.data(), G, 64, groups, 32, n, 0.125f, s16.data(), 64, m16.data(), nullptr);
      p.qk_t(qv.data(), G, 64, kt16.data(), 64, n, 0.125f, s32.data(), 64, m32.data());
      ASSERT_EQ(s16, s32) << "fp16 groups, G " << G << " n " << n;
      ASSERT_EQ(m16, m32);
      // q scaled by the caller and passed at scale 1 (attention's way, read in place): the same
      // bits; and a group's positions past key n, which a kernel may load, change nothing even
      // when they hold NaN. Lines to ask for during the call (more than its loops take, so the
      // rest are asked for at its end) change nothing, and the kernel takes all of them.
      std::vector<float> qs(qv.size());
      for (size_t i = 0; i < qv.size(); ++i) qs[i] = qv[i] * 0.125f;
      for (int64_t j = n; j < 64; ++j) {
        for (int64_t i = 0; i < 64; ++i) h16[j / 16 * 64 * 32 + 5 + i * 32 + j % 16] = 0x7e00;
      }
      std::vector<float> s1(G * 64, -1.0f), m1(G), t1(G * 64, -1.0f), tm1(G);
      std::vector<const void*> lines;
      for (size_t l = 0; l < h16.size(); l += 32) lines.push_back(h16.data() + l);
      cpu::Ahead ahead{lines.data(), static_cast<int64_t>(lines.size())};
      p.qk_t_f16(qs.data(), G, 64, groups, 32, n, 1.0f, s1.data(), 64, m1.data(), &ahead);
      ASSERT_EQ(ahead.n, 0);
      p.qk_t(qs.data(), G, 64, kt.data(), 64, n, 1.0f, t1.data(), 64, tm1.data());
      ASSERT_EQ(s1, s16) << "prescaled q, fp16 groups, G " << G << " n " << n;
      ASSERT_EQ(m1, m16);
      ASSERT_EQ(t1, want) << "prescaled q, G " << G << " n " << n;
      ASSERT_EQ(tm1, want_max);
    }
  }
  // p.v over G heads at once: each head's sums are its own, the same bits as one head per call
  // (attention runs several rows' heads in one call).
  const auto pw = Randn(13 * 64, 23), vv = Randn(64 * 64, 24), o0 = Randn(13 * 66, 25);
  std::vector<uint16_t> v16(64 * 64);
  for (size_t i = 0; i < v16.size(); ++i) v16[i] = FloatToFp16(vv[i]);
  const uint16_t* vrows[64];
  for (int j = 0; j < 64; ++j) vrows[j] = v16.data() + j * 64;
  for (int64_t G = 1; G <= 13; ++G) {
    for (int64_t n : {1, 17, 64}) {
      std::vector<float> all(o0.begin(), o0.end()), one(o0.begin(), o0.end());
      cpu::Ahead ahead{reinterpret_cast<const void* const*>(vrows), 64};
      p.pv_f16(pw.data(), 64, G, 64, vrows, n, all.data() + 2, 66, &ahead);
      ASSERT_EQ(ahead.n, 0);
      for (int64_t g = 0; g < G; ++g) {
        p.pv_f16(pw.data() + g * 64, 64, 1, 64, vrows, n, one.data() + g * 66 + 2, 66, nullptr);
      }
      ASSERT_EQ(all, one) << "pv, G " << G << " n " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, IsaTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

TEST(Elementwise, RmsNormMatchesReference) {
  for (int64_t cols : {1, 7, 576}) {
    const auto x = Randn(3 * cols, 1);
    const auto w = Randn(cols, 2);
    std::vector<float> out(x.size());
    RmsNormCpu({x.data(), w.data(), out.data(), 3, cols, 1e-5f});
    std::vector<double> ref(x.size());
    for (int64_t r = 0; r < 3; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < cols; ++c) ss += double(x[r * cols + c]) * x[r * cols + c];
      const double s = 1.0 / std::sqrt(ss / cols + 1e-5);
      for (int64_t c = 0; c < cols; ++c) ref[r * cols + c] = x[r * cols + c] * s * w[c];
    }
    EXPECT_LT(RelL2(out, ref), 1e-6) << cols;
  }
}

TEST(Elementwise, RopeRotatesAdjacentPairs) {
  const int64_t tokens = 3, heads = 2, hd = 10, rot = 8;  // last pair left alone
  auto x = Randn(tokens * heads * hd, 4);
  const auto x0 = x;
  const int32_t pos[] = {0, 5, 8191};  // far positions: a float angle fails the 1e-6 below
  RopeCpu({x.data(), pos, tokens, heads, hd, rot, 10000.0f});
  std::vector<double> ref(x.size());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t b = (t * heads + h) * hd;
      for (int64_t i = 0; i < hd / 2; ++i) {
        if (2 * i >= rot) {
          ref[b + 2 * i] = x0[b + 2 * i];
          ref[b + 2 * i + 1] = x0[b + 2 * i + 1];
          continue;
        }
        const double th = pos[t] * std::pow(10000.0, -2.0 * i / rot);
        ref[b + 2 * i] = x0[b + 2 * i] * std::cos(th) - x0[b + 2 * i + 1] * std::sin(th);
        ref[b + 2 * i + 1] = x0[b + 2 * i] * std::sin(th) + x0[b + 2 * i + 1] * std::cos(th);
      }
    }
  }
  EXPECT_LT(RelL2(x, ref), 1e-6);
}

TEST(Elementwise, SwiGluAndAdd) {
  const auto g = Randn(37, 1), u = Randn(37, 2);
  std::vector<float> out(37), acc = u;
  SwiGluCpu(g.data(), u.data(), out.data(), 37);
  AddInPlaceCpu(acc.data(), g.data(), 37);
  for (int i = 0; i < 37; ++i) {
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
    EXPECT_FLOAT_EQ(acc[i], u[i] + g[i]);
  }
}

TEST(ThreadPool, ParallelForCoversEveryIndexOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 5, 16, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 4, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
    // Many small jobs back to back (the decode pattern) neither lose nor repeat work.
    std::atomic<int64_t> total{0};
    for (int j = 0; j < 300; ++j) pool.Run([&](int, int) { total.fetch_add(1); });
    EXPECT_EQ(total.load(), 300 * threads);
  }
}

}  // namespace
}  // namespace kvmesh::kernels
