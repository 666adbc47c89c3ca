// Google Benchmark micro-benchmarks of the CPU kernels at SmolLM2-135M shapes, reporting bytes/s
// of weights streamed and FLOP/s. Run: build/bin/kernels_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/packed.h"
#include "util/aligned_vector.h"
#include "util/huge_pages.h"

namespace kvmesh::kernels {
namespace {

// Random quants with fixed scales (and Q4_1 minimums).
std::vector<uint8_t> RandomWeights(DType t, int64_t rows, int64_t cols) {
  std::mt19937 rng(1);
  std::vector<uint8_t> w(rows * RowBytes(t, cols));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  if (t == DType::kQ4_1) {
    auto* blk = reinterpret_cast<BlockQ4_1*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ4_1); ++i) {
      blk[i].d = FloatToFp16(0.01f);
      blk[i].m = FloatToFp16(-0.08f);
    }
  } else if (t == DType::kQ4_K) {
    auto* blk = reinterpret_cast<BlockQ4_K*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ4_K); ++i) {
      blk[i].d = FloatToFp16(0.001f);
      blk[i].dmin = FloatToFp16(0.002f);
    }
  } else if (t == DType::kQ5_0 || t == DType::kQ5_1) {  // d (and Q5_1's m) lead the block
    const int64_t bb = TraitsOf(t).block_bytes;
    for (size_t i = 0; i < w.size(); i += bb) {
      const uint16_t d = FloatToFp16(0.01f), m = FloatToFp16(-0.16f);
      std::memcpy(&w[i], &d, 2);
      if (t == DType::kQ5_1) std::memcpy(&w[i + 2], &m, 2);
    }
  } else if (t == DType::kQ5_K) {
    auto* blk = reinterpret_cast<BlockQ5_K*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ5_K); ++i) {
      blk[i].d = FloatToFp16(0.001f);
      blk[i].dmin = FloatToFp16(0.002f);
    }
  } else if (t == DType::kQ6_K) {
    auto* blk = reinterpret_cast<BlockQ6_K*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ6_K); ++i) blk[i].d = FloatToFp16(0.001f);
  } else if (t == DType::kQ2_K) {
    auto* blk = reinterpret_cast<BlockQ2_K*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ2_K); ++i) {
      blk[i].d = blk[i].dmin = FloatToFp16(0.001f);
    }
  } else if (t == DType::kQ3_K) {
    auto* blk = reinterpret_cast<BlockQ3_K*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ3_K); ++i) blk[i].d = FloatToFp16(0.001f);
  } else if (t == DType::kIQ4_NL) {
    auto* blk = reinterpret_cast<BlockIQ4_NL*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockIQ4_NL); ++i) blk[i].d = FloatToFp16(0.0001f);
  } else if (t == DType::kIQ4_XS) {
    auto* blk = reinterpret_cast<BlockIQ4_XS*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockIQ4_XS); ++i) blk[i].d = FloatToFp16(0.0001f);
  } else {  // Q8_0
    auto* blk = reinterpret_cast<BlockQ8_0*>(w.data());
    for (size_t i = 0; i < w.size() / sizeof(BlockQ8_0); ++i) blk[i].d = FloatToFp16(0.01f);
  }
  return w;
}

// args: rows, cols, tokens, threads, packed (1: the 16-row interleaved layout, kernels/packed.h;
// 2: the same packed for 8-bit activations, ActBits::k8)
template <DType T>
void BM_MatMul(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1), tokens = st.range(2);
  const int64_t copies = st.range(5);  // distinct matrices, taken in turn: > 1 streams from DRAM
  ThreadPool pool(static_cast<int>(st.range(3)));
  std::vector<std::vector<uint8_t>> w, storage(copies);
  std::vector<WeightMatrix> wm;
  for (int64_t c = 0; c < copies; ++c) {
    w.push_back(RandomWeights(T, rows, cols));
    const WeightMatrix plain{T, w.back().data(), rows, cols,
                             static_cast<size_t>(RowBytes(T, cols))};
    const ActBits bits = st.range(4) == 2 ? ActBits::k8 : ActBits::k16;
    wm.push_back(st.range(4) != 0 ? PackWeights(plain, storage[c], nullptr, bits) : plain);
  }
  // Cache-line aligned, as the engine's buffers (util/aligned_vector.h).
  util::AlignedVector<float> x(tokens * cols, 0.5f), out(tokens * rows);
  int64_t i = 0;
  for (auto _ : st) {
    MatMulCpu({wm[i], x.data(), out.data(), tokens, rows}, pool);
    benchmark::DoNotOptimize(out.data());
    i = (i + 1) % copies;
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(w[0].size()));
  st.counters["FLOP/s"] =
      benchmark::Counter(2.0 * rows * cols * tokens * st.iterations(), benchmark::Counter::kIsRate);
  st.SetLabel(std::string(IsaName(ActiveIsa())));
}
void BM_MatMulQ4_1(benchmark::State& st) { BM_MatMul<DType::kQ4_1>(st); }
void BM_MatMulQ8_0(benchmark::State& st) { BM_MatMul<DType::kQ8_0>(st); }
// args: rows, cols, tokens, threads, packed, copies (128 copies of 1536 x 576: 71 MB, as a
// model's layers, so the weights come from memory as in decode).
BENCHMARK(BM_MatMulQ4_1)
    ->ArgsProduct({{1536}, {576}, {1, 4, 16, 64}, {1, 2}, {0, 1, 2}, {1}})
    ->Args({576, 1536, 1, 2, 0, 1})
    ->Args({576, 1536, 1, 2, 1, 1})
    ->ArgsProduct({{576}, {1536}, {16}, {1, 2}, {1}, {1}})  // down at 16 sequences
    // One group of rows: what a 16-token product costs besides its rows (quantising and
    // splitting the activations, handing out the work).
    ->ArgsProduct({{16}, {576, 1536}, {16}, {1, 2}, {1}, {1}})
    ->ArgsProduct({{1536}, {576}, {1, 16}, {2}, {1, 2}, {128}})
    ->UseRealTime();
// The tied LM head (Q8_0 in SmolLM2's Q4_1 file): 49,152 x 576, 30 MB, from memory each step.
BENCHMARK(BM_MatMulQ8_0)->ArgsProduct({{49152}, {576}, {1, 16}, {1, 2}, {1}, {1}})->UseRealTime();
// K-quants at a 7B model's 4096 x 4096, as in Q4_K_M and Q5_K_M files: row-major (0) and packed
// (1: Q4_K's sub-blocks as Q4_1, Q5_K's as Q8_0 with minimums, Q6_K's blocks as Q8_0, with fp32
// scales; kernels/packed.h).
void BM_MatMulQ4_K(benchmark::State& st) { BM_MatMul<DType::kQ4_K>(st); }
// Q5_0 / Q5_1: what those files hold where rows are not a multiple of 256 (row-major dots in
// plain C++; packed as Q8_0's bytes).
void BM_MatMulQ5_0(benchmark::State& st) { BM_MatMul<DType::kQ5_0>(st); }
void BM_MatMulQ5_1(benchmark::State& st) { BM_MatMul<DType::kQ5_1>(st); }
BENCHMARK(BM_MatMulQ5_0)->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})->UseRealTime();
BENCHMARK(BM_MatMulQ5_1)->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})->UseRealTime();
void BM_MatMulQ5_K(benchmark::State& st) { BM_MatMul<DType::kQ5_K>(st); }
void BM_MatMulQ6_K(benchmark::State& st) { BM_MatMul<DType::kQ6_K>(st); }
// 32 copies (0.4-0.7 GB, past the L3): one token streaming its weights from memory, where the
// packed forms' extra bytes (a third more for Q4_K, half more for Q6_K) count most.
BENCHMARK(BM_MatMulQ4_K)
    ->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})
    ->ArgsProduct({{4096}, {4096}, {1}, {2}, {0, 1}, {32}})
    ->UseRealTime();
BENCHMARK(BM_MatMulQ5_K)
    ->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})
    ->ArgsProduct({{4096}, {4096}, {1}, {2}, {0, 1}, {32}})
    ->UseRealTime();
BENCHMARK(BM_MatMulQ6_K)
    ->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})
    ->ArgsProduct({{4096}, {4096}, {1}, {2}, {0, 1}, {32}})
    ->UseRealTime();
// Q3_K (Q3_K_M files; packed as Q4_0's nibbles with Q6_K's scales), IQ4_XS (packed as Q8_0's quants
// with fp32 scales) and its fallback IQ4_NL (packed as Q8_0), and Q2_K (no packed form): row-major,
// each product dequantises its rows once and runs fp32 dots.
void BM_MatMulQ2_K(benchmark::State& st) { BM_MatMul<DType::kQ2_K>(st); }
void BM_MatMulQ3_K(benchmark::State& st) { BM_MatMul<DType::kQ3_K>(st); }
void BM_MatMulIQ4_NL(benchmark::State& st) { BM_MatMul<DType::kIQ4_NL>(st); }
void BM_MatMulIQ4_XS(benchmark::State& st) { BM_MatMul<DType::kIQ4_XS>(st); }
BENCHMARK(BM_MatMulQ2_K)->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0}, {1}})->UseRealTime();
BENCHMARK(BM_MatMulQ3_K)->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})->UseRealTime();
BENCHMARK(BM_MatMulIQ4_NL)->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})->UseRealTime();
BENCHMARK(BM_MatMulIQ4_XS)->ArgsProduct({{4096}, {4096}, {1, 16}, {2}, {0, 1}, {1}})->UseRealTime();

// args: context length, threads. One decode step of one layer: 9 query heads, 3 KV heads.
void BM_AttentionDecode(benchmark::State& st) {
  const int64_t ctx = st.range(0), H = 9, KV = 3, hd = 64;
  ThreadPool pool(static_cast<int>(st.range(1)));
  std::vector<uint16_t> k(ctx * KV * hd, FloatToFp16(0.1f)), v(k.size(), FloatToFp16(0.2f));
  std::vector<float> q(H * hd, 0.3f), out(H * hd);
  for (auto _ : st) {
    AttentionCpu({q.data(), k.data(), v.data(), out.data(), 1, H, KV, hd, KV * hd, ctx - 1, 0.125f},
                 pool);
    benchmark::DoNotOptimize(out.data());
  }
  st.SetBytesProcessed(st.iterations() * static_cast<int64_t>(2 * k.size() * sizeof(uint16_t)));
}
BENCHMARK(BM_AttentionDecode)->Args({512, 2})->Args({4096, 2})->UseRealTime();

// A paged KV cache of `elems` fp16 values drawn from u(rng), allocated as the KV arena allocates
// (kvstore/block_arena.cc: on huge pages).
util::HugePageRegion RandomFp16Cache(int64_t elems, std::mt19937& rng,
                                     std::uniform_real_distribution<float>& u) {
  util::HugePageRegion region =
      util::HugePageRegion::Map(static_cast<size_t>(elems) * sizeof(uint16_t));
  auto* h = reinterpret_cast<uint16_t*>(region.data());
  for (int64_t i = 0; i < elems; ++i) h[i] = FloatToFp16(u(rng));
  return region;
}

// args: shared context length, sequences, threads, tokens of each sequence's own, bf16 attention
// (PagedAttentionArgs::bf16: 1, else 0). One decode
// step of one layer over a paged cache laid out as the engine's (16-token blocks, each holding
// all 30 layers, so a layer's keys are spread over memory and a long context is not in cache):
// every sequence has the shared context's blocks and its own tokens in blocks of its own, as
// concurrent requests over one document do. Successive iterations visit successive layers.
// Reports fp32 FLOP/s of q.k and p.v.
void BM_PagedAttentionSharedDecode(benchmark::State& st) {
  const int64_t ctx = st.range(0), seqs = st.range(1), own = st.range(3);
  const int64_t H = 9, KV = 3, hd = 64, bs = 16, layers = 30;
  ThreadPool pool(static_cast<int>(st.range(2)));
  const int64_t half = KV * hd * bs, shared_blocks = ctx / bs, own_blocks = (own + bs - 1) / bs;
  const int64_t n_blocks = shared_blocks + seqs * own_blocks, block_stride = layers * 2 * half;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const util::HugePageRegion region = RandomFp16Cache(n_blocks * block_stride, rng, u);
  const uint16_t* cache = reinterpret_cast<const uint16_t*>(region.data());
  std::vector<std::vector<int32_t>> tables(seqs);
  std::vector<AttentionSeq> as(seqs);
  for (int64_t s = 0; s < seqs; ++s) {
    for (int64_t b = 0; b < shared_blocks; ++b) tables[s].push_back(static_cast<int32_t>(b));
    for (int64_t b = 0; b < own_blocks; ++b) {
      tables[s].push_back(static_cast<int32_t>(shared_blocks + s * own_blocks + b));
    }
    as[s] = {s, 1, ctx + own - 1, tables[s].data()};
  }
  std::vector<float> q(seqs * H * hd);
  for (auto& x : q) x = u(rng);
  std::vector<float> out(q.size());
  int64_t layer = 0;
  for (auto _ : st) {
    const uint16_t* k = cache + layer * 2 * half;
    PagedAttentionCpu({q.data(), k, k + half, out.data(), H, KV, hd, KV * hd, bs, block_stride,
                       as.data(), seqs, 0.125f, 0, 0, 0, st.range(4) != 0},
                      pool);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
  st.counters["FLOP/s"] = benchmark::Counter(4.0 * seqs * H * (ctx + own) * hd * st.iterations(),
                                             benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PagedAttentionSharedDecode)
    ->ArgsProduct({{1024, 4096}, {1, 16}, {2}, {16, 100}, {0, 1}})
    ->Args({4096, 4, 2, 100, 0})  // 4 sequences: tasks of 4 rows (one-row passes on AVX2)
    ->Args({0, 16, 1, 100, 0})    // each sequence's own keys alone: 16 one-row units of 100 keys
    ->Args({0, 16, 2, 100, 0})
    ->Args({0, 16, 2, 100, 1})
    ->Args({1024, 16, 2, 0, 0})  // the shared part alone
    ->Args({1024, 16, 1, 0, 0})  // and on one thread (a row pass: 1/768 of it)
    ->Args({1024, 16, 2, 0, 1})  // the same in bf16
    ->Args({1024, 16, 1, 0, 1})
    ->UseRealTime();

// args: cached keys, new rows, threads. One layer of a prefill chunk: `rows` new tokens of one
// sequence after `ctx` cached ones (a follow-up turn over a cached context), SmolLM2's heads.
// Below the diagonal its tasks have 96 query heads (32 rows of 3) or the even cut of more rows:
// the lane kernels (engine.md "Attention").
void BM_PagedAttentionPrefill(benchmark::State& st) {
  const int64_t ctx = st.range(0), n = st.range(1);
  const int64_t H = 9, KV = 3, hd = 64, bs = 16, layers = 30;
  ThreadPool pool(static_cast<int>(st.range(2)));
  const int64_t half = KV * hd * bs, n_blocks = (ctx + n + bs - 1) / bs;
  const int64_t block_stride = layers * 2 * half;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const util::HugePageRegion region = RandomFp16Cache(n_blocks * block_stride, rng, u);
  const uint16_t* cache = reinterpret_cast<const uint16_t*>(region.data());
  std::vector<int32_t> table(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(b);
  const AttentionSeq seq{0, n, ctx, table.data()};
  std::vector<float> q(n * H * hd);
  for (auto& x : q) x = u(rng);
  std::vector<float> out(q.size());
  int64_t layer = 0;
  for (auto _ : st) {
    const uint16_t* k = cache + layer * 2 * half;
    PagedAttentionCpu(
        {q.data(), k, k + half, out.data(), H, KV, hd, KV * hd, bs, block_stride, &seq, 1, 0.125f},
        pool);
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % layers;
  }
  // Keys attended: each row its cached keys and the new ones up to itself.
  const double keys = static_cast<double>(n * ctx + n * (n + 1) / 2);
  st.counters["FLOP/s"] =
      benchmark::Counter(4.0 * H * keys * hd * st.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PagedAttentionPrefill)->ArgsProduct({{1024, 4096}, {50, 64}, {1, 2}})->UseRealTime();

// args: part (0 q.k, 1 exp, 2 p.v), query heads (3: one row, 6: two rows, as attention runs a
// several-row task's rows in pairs). One part of a shared-prefix row pass (primitives.h:
// qk_t_f16, exp_shifted_sums, pv_f16) as attention runs it (the heads of one KV head over a
// chunk of 64 fp16 keys in four 16-position blocks), its data in L1, one thread: each part's
// cost against its arithmetic (q.k and p.v 768 fused multiply-adds per head each; isa_rates
// gives the rates of the loops they are built of).
void BM_AttentionRowPass(benchmark::State& st) {
  const auto& p = cpu::Prims();
  const int64_t G = st.range(1);
  constexpr int64_t d = 64, n = 64, bs = 16, stride = 2 + d;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> k(d * n), v(n * d);
  for (auto& h : k) h = FloatToFp16(u(rng));
  for (auto& h : v) h = FloatToFp16(u(rng));
  const uint16_t* groups[n / bs];
  for (int64_t c = 0; c < n / bs; ++c) groups[c] = k.data() + c * d * bs;
  const uint16_t* rows[n];
  for (int64_t j = 0; j < n; ++j) rows[j] = v.data() + j * d;
  std::vector<float> q(G * d), scores(G * n), rec(G * stride, 0.0f);
  for (auto& x : q) x = u(rng) * 0.125f;  // scaled, as attention passes it (at scale 1)
  float row_max[6], shift[6], sums[6];
  std::fill(shift, shift + 6, 0.5f);
  p.qk_t_f16(q.data(), G, d, groups, bs, n, 1.0f, scores.data(), n, row_max, nullptr);
  for (int64_t g = 0; g < G; ++g)
    p.exp_shifted_sum(scores.data() + g * n, row_max[g], scores.data() + g * n, n);
  const std::vector<float> logits = scores;
  for (auto _ : st) {
    switch (st.range(0)) {
      case 0:
        p.qk_t_f16(q.data(), G, d, groups, bs, n, 1.0f, scores.data(), n, row_max, nullptr);
        break;
      case 1:  // the same scores each time (in place they would decay to 1)
        std::copy(logits.begin(), logits.end(), scores.begin());
        if (p.exp_shifted_sums != nullptr) {  // attention's way (AttendHeads)
          p.exp_shifted_sums(scores.data(), n, G, shift, n, sums);
        } else {
          for (int64_t g = 0; g < G; ++g) {
            sums[g] = p.exp_shifted_sum(scores.data() + g * n, shift[g], scores.data() + g * n, n);
          }
        }
        benchmark::DoNotOptimize(sums);
        break;
      default:
        p.pv_f16(scores.data(), n, G, d, rows, n, rec.data() + 2, stride, nullptr);
        break;
    }
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_AttentionRowPass)->ArgsProduct({{0, 1, 2}, {3, 6}});

// What one core can read of the same bytes: the K and V of one layer of 16 sequences' 7 own
// blocks (BM_PagedAttentionSharedDecode/0/16/1/100's data, same layout and block order), read
// chunk by chunk in the order attention reads them (each KV head's K of 4 blocks, then its V
// rows), with nothing else to do. The ceiling for attention over keys that come from memory (it
// reads the 7th block whole, 112 positions where attention uses 100: ~4% more bytes).
void BM_KvLayerRead(benchmark::State& st) {
  const int64_t seqs = 16, blocks = 7, KV = 3, hd = 64, bs = 16, layers = 30;
  const int64_t half = KV * hd * bs, block_stride = layers * 2 * half;
  std::vector<uint16_t> cache(seqs * blocks * block_stride, 1);
  int64_t layer = 0;
  uint64_t acc = 0;  // one load per 64-byte line
  auto add = [&](const uint16_t* p) {
    uint64_t x;
    std::memcpy(&x, p, sizeof x);
    acc += x;
  };
  for (auto _ : st) {
    for (int64_t s = 0; s < seqs; ++s) {
      for (int64_t b0 = 0; b0 < blocks; b0 += 4) {
        const int64_t nb = std::min<int64_t>(4, blocks - b0);
        for (int64_t h = 0; h < KV; ++h) {
          for (int64_t i = 0; i < hd * bs; i += 32) {  // K: [head][dim][16 positions]
            for (int64_t c = 0; c < nb; ++c) {
              add(cache.data() + ((s * blocks + b0 + c) * layers + layer) * 2 * half + h * hd * bs +
                  i);
            }
          }
          for (int64_t c = 0; c < nb; ++c) {  // V: [16 positions][heads][dim]
            const uint16_t* v =
                cache.data() + ((s * blocks + b0 + c) * layers + layer) * 2 * half + half;
            for (int64_t r = 0; r < bs; ++r) {
              add(v + r * KV * hd + h * hd);
              add(v + r * KV * hd + h * hd + 32);
            }
          }
        }
      }
    }
    benchmark::DoNotOptimize(acc);
    layer = (layer + 1) % layers;
  }
  st.SetBytesProcessed(st.iterations() * seqs * blocks * 2 * half *
                       static_cast<int64_t>(sizeof(uint16_t)));
}
BENCHMARK(BM_KvLayerRead)->UseRealTime();

}  // namespace
}  // namespace kvmesh::kernels

BENCHMARK_MAIN();
