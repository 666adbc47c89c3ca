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
#include "tests/kernels/isa_test.h"

namespace kvmesh::kernels {
namespace {

using isa_test::IsaTest;
using isa_test::Randn;
using isa_test::RelL2;

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
