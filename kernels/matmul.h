// Matrix products of quantised weights with fp32 activations (CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "kernels/quant.h"
#include "kernels/thread_pool.h"

namespace kvmesh::kernels {

// A row-major weight matrix [rows, cols] stored in `type`, each row row_bytes long.
struct WeightMatrix {
  DType type = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;
  // Rows [0, packed_rows) also in the 16-row interleaved layout of kernels/packed.h (set by
  // PackWeights); the products of those rows read it instead of data.
  const uint8_t* packed = nullptr;
  int64_t packed_rows = 0;
  // The packed rows are laid out for 8-bit activations (PackWeights with ActBits::k8): their
  // products quantise the input to BlockA8 instead of BlockA16.
  bool packed_a8 = false;
};

// out[t, r] = sum_k w[r, k] * x[t, k] for r in [row_begin, row_end).
// x: [tokens, w.cols] fp32; out: [tokens, ldo] (column r of row t at out[t * ldo + r]).
// Q4_0/Q4_1/Q8_0 weights use integer dot products against activations quantised per 32-block
// to 16 bits (BlockA16), or 8 bits (BlockA8) for rows packed with packed_a8; other types are
// dequantised and use fp32 dot products.
struct MatMulArgs {
  WeightMatrix w;
  const float* x;
  float* out;
  int64_t tokens;
  int64_t ldo;
  int64_t row_begin = 0, row_end = -1;  // -1: all rows
};
// Optional: fills rows [t0, t1) of the products' input x (a normalisation, an activation
// function) just before they are read. It runs in the same parallel pass that quantises those
// rows, so the step that makes x costs no pass over the pool (and no serial time) of its own.
// Called for disjoint ranges covering [0, tokens), from any thread.
using PrepareRows = std::function<void(int64_t t0, int64_t t1)>;

void MatMulCpu(const MatMulArgs& a, ThreadPool& pool, const PrepareRows& prepare = {});

// Several products that share one input (x, tokens and w.cols equal), such as Q, K and V of a
// layer: the input is quantised once and all rows run in one parallel region (one wake-up of
// the pool instead of one per matrix).
void MatMulManyCpu(std::span<const MatMulArgs> mats, ThreadPool& pool,
                   const PrepareRows& prepare = {});

}  // namespace kvmesh::kernels
