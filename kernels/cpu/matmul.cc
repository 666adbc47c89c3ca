#include <algorithm>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {
namespace {

constexpr int64_t kRowTile = 16;  // weight rows kept hot in L1 while all tokens stream past

// Quantises the tokens' activations once (in parallel over tokens) into `buf`.
const BlockA16* QuantizeActivations(const float* x, int64_t tokens, int64_t cols, ThreadPool& pool,
                                    std::vector<uint8_t>& buf) {
  using Block = BlockA16;
  const int64_t nb = cols / kQK;
  buf.resize(static_cast<size_t>(tokens * nb) * sizeof(Block));
  auto* q = reinterpret_cast<Block*>(buf.data());
  pool.ParallelFor(tokens, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) QuantizeRowA16(x + t * cols, q + t * nb, cols);
  });
  return q;
}

template <typename WBlock, typename ABlock, typename Dot>
void QuantMatMul(const MatMulArgs& a, int64_t r_begin, int64_t r_end, const ABlock* xq, Dot dot,
                 ThreadPool& pool) {
  const int64_t nb = a.w.cols / kQK;
  const auto* base = static_cast<const uint8_t*>(a.w.data);
  pool.ParallelFor(r_end - r_begin, kRowTile, [&](int64_t b, int64_t e) {
    for (int64_t r0 = r_begin + b; r0 < r_begin + e; r0 += kRowTile) {
      const int64_t r1 = std::min(r0 + kRowTile, r_begin + e);
      for (int64_t t = 0; t < a.tokens; ++t) {
        const ABlock* xt = xq + t * nb;
        float* ot = a.out + t * a.ldo;
        for (int64_t r = r0; r < r1; ++r) {
          ot[r] = dot(reinterpret_cast<const WBlock*>(base + r * a.w.row_bytes), xt, nb);
        }
      }
    }
  });
}

// Types without an integer path: dequantise a tile of rows, then fp32 dot products.
void FloatMatMul(const MatMulArgs& a, int64_t r_begin, int64_t r_end, ThreadPool& pool) {
  const auto& dots = cpu::Dots();
  const auto* base = static_cast<const uint8_t*>(a.w.data);
  const int64_t cols = a.w.cols;
  pool.ParallelFor(r_end - r_begin, kRowTile, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> tile;
    tile.resize(static_cast<size_t>(kRowTile * cols));
    for (int64_t r0 = r_begin + b; r0 < r_begin + e; r0 += kRowTile) {
      const int64_t r1 = std::min(r0 + kRowTile, r_begin + e);
      for (int64_t r = r0; r < r1; ++r) {
        if (a.w.type == DType::kF32) continue;
        DequantizeRow(a.w.type, base + r * a.w.row_bytes, tile.data() + (r - r0) * cols, cols);
      }
      for (int64_t t = 0; t < a.tokens; ++t) {
        const float* xt = a.x + t * cols;
        float* ot = a.out + t * a.ldo;
        for (int64_t r = r0; r < r1; ++r) {
          const float* wr = a.w.type == DType::kF32
                                ? reinterpret_cast<const float*>(base + r * a.w.row_bytes)
                                : tile.data() + (r - r0) * cols;
          ot[r] = dots.f32_f32(wr, xt, cols);
        }
      }
    }
  });
}

}  // namespace

void MatMulCpu(const MatMulArgs& a, ThreadPool& pool) {
  const int64_t r_begin = a.row_begin;
  const int64_t r_end = a.row_end < 0 ? a.w.rows : a.row_end;
  if (a.tokens <= 0 || r_end <= r_begin) return;
  const auto& dots = cpu::Dots();
  thread_local std::vector<uint8_t> act;
  static const bool f32_only = std::getenv("KVMESH_F32_ACT") != nullptr;
  switch (f32_only ? DType::kF16 : a.w.type) {
    case DType::kQ4_1: {
      const BlockA16* xq = QuantizeActivations(a.x, a.tokens, a.w.cols, pool, act);
      QuantMatMul<BlockQ4_1>(a, r_begin, r_end, xq, dots.q4_1_a16, pool);
      return;
    }
    case DType::kQ4_0: {
      const BlockA16* xq = QuantizeActivations(a.x, a.tokens, a.w.cols, pool, act);
      QuantMatMul<BlockQ4_0>(a, r_begin, r_end, xq, dots.q4_0_a16, pool);
      return;
    }
    case DType::kQ8_0: {
      const BlockA16* xq = QuantizeActivations(a.x, a.tokens, a.w.cols, pool, act);
      QuantMatMul<BlockQ8_0>(a, r_begin, r_end, xq, dots.q8_0_a16, pool);
      return;
    }
    default:
      FloatMatMul(a, r_begin, r_end, pool);
      return;
  }
}

}  // namespace kvmesh::kernels
