#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {

namespace {

constexpr int64_t kKeyChunk = 64;       // scores kept per step of the online softmax
constexpr int64_t kKeysPerSplit = 512;  // a query's keys are split in runs of about this many
constexpr int64_t kMaxSplits = 16;

// How many parts a query with n_keys keys is split into (flash-decoding). A function of the
// query's own key count only, never of the batch or thread count: a sequence's outputs are
// then bit-identical whether it runs alone or batched, whole or in prefill chunks.
int64_t SplitsFor(int64_t n_keys) {
  return std::clamp<int64_t>(n_keys / kKeysPerSplit, 1, kMaxSplits);
}

// Calls fn(key offset in [0, n), k run, v run, run length) for the runs of keys [j0, j0 + n)
// that are contiguous in memory: within one block of a paged cache.
template <typename Fn>
void ForEachRun(const PagedAttentionArgs& a, const int32_t* table, const uint16_t* kbase,
                const uint16_t* vbase, int64_t j0, int64_t n, Fn&& fn) {
  for (int64_t j = j0; j < j0 + n;) {
    const int64_t slot = j % a.block_size;
    const int64_t len = std::min(a.block_size - slot, j0 + n - j);
    const int64_t at = table[j / a.block_size] * a.block_stride + slot * a.pos_stride;
    fn(j - j0, kbase + at, vbase + at, len);
    j += len;
  }
}

// Online-softmax state of one query head over a range of keys: running max m, running sum l of
// exp(s - m), and the unnormalised output o (head_dim floats), stored as [m, l, o...].
// Attends the `group` query heads q[g * d ...] of one KV head to keys [j_begin, j_end) of one
// sequence. Writes one record per query head into `out` (stride 2 + d floats).
void AttendRange(const PagedAttentionArgs& a, const cpu::Primitives& p, const float* q,
                 int64_t group, const int32_t* table, const uint16_t* kbase, const uint16_t* vbase,
                 int64_t j_begin, int64_t j_end, float* out) {
  const int64_t d = a.head_dim;
  const int64_t rec = 2 + d;
  thread_local std::vector<float> score_buf;  // this thread's [group, kKeyChunk] scores
  score_buf.resize(static_cast<size_t>(group * kKeyChunk));
  auto scores = [&](int64_t g) { return score_buf.data() + g * kKeyChunk; };
  for (int64_t g = 0; g < group; ++g) {
    float* r = out + g * rec;
    r[0] = -std::numeric_limits<float>::infinity();
    r[1] = 0.0f;
    std::fill(r + 2, r + 2 + d, 0.0f);
  }
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeyChunk) {
    const int64_t n = std::min(kKeyChunk, j_end - j0);
    ForEachRun(a, table, kbase, vbase, j0, n,
               [&](int64_t off, const uint16_t* k, const uint16_t*, int64_t len) {
                 p.qk(q, group, d, k, a.pos_stride, len, a.scale, scores(0) + off, kKeyChunk);
               });
    for (int64_t g = 0; g < group; ++g) {
      float* r = out + g * rec;
      float cmax = r[0];
      for (int64_t j = 0; j < n; ++j) cmax = std::max(cmax, scores(g)[j]);
      // Rescale what was accumulated under the old max, once per chunk.
      const float rescale = std::exp(r[0] - cmax);
      r[0] = cmax;
      p.exp_shifted(scores(g), cmax, scores(g), n);
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) sum += scores(g)[j];
      r[1] = r[1] * rescale + sum;
      if (rescale != 1.0f) {
        for (int64_t i = 0; i < d; ++i) r[2 + i] *= rescale;
      }
    }
    // V: each row is loaded once for all heads of the group.
    ForEachRun(a, table, kbase, vbase, j0, n,
               [&](int64_t off, const uint16_t*, const uint16_t* v, int64_t len) {
                 p.pv(scores(0) + off, kKeyChunk, group, d, v, a.pos_stride, len, out + 2, rec);
               });
  }
}

}  // namespace

void PagedAttentionCpu(const PagedAttentionArgs& a, ThreadPool& pool) {
  const auto& p = cpu::Prims();
  const int64_t group = a.group > 0 ? a.group : a.n_heads / a.n_kv_heads;
  const int64_t d = a.head_dim;
  const int64_t rec = 2 + d;
  // Local query heads [first, last) of local KV head kvh.
  auto heads_of = [&](int64_t kvh) {
    const int64_t g = a.kv_head0 + kvh;
    const int64_t first = std::max(a.q_head0, g * group) - a.q_head0;
    const int64_t last = std::min(a.q_head0 + a.n_heads, (g + 1) * group) - a.q_head0;
    return std::pair<int64_t, int64_t>{first, last};
  };
  // Rows of q map to (sequence, row): a batch mixes prefill chunks and single decode tokens.
  int64_t total = 0;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    total = std::max(total, a.seqs[s].token0 + a.seqs[s].tokens);
  }
  thread_local std::vector<int32_t> seq_of_row_storage;
  std::vector<int32_t>& seq_of_row = seq_of_row_storage;
  seq_of_row.assign(static_cast<size_t>(total), -1);
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    for (int64_t t = 0; t < a.seqs[s].tokens; ++t) {
      seq_of_row[a.seqs[s].token0 + t] = static_cast<int32_t>(s);
    }
  }
  // Work units are (row, kv head, key split); a row's split count depends on its key count.
  // Decode has few (row, kv head) pairs, so splitting long key ranges keeps every thread busy;
  // the partial softmaxes are merged after.
  thread_local std::vector<int64_t> unit0_storage;  // first unit of each row
  std::vector<int64_t>& unit0 = unit0_storage;
  unit0.resize(static_cast<size_t>(total + 1));
  int64_t units = 0, max_splits = 1;
  for (int64_t row = 0; row < total; ++row) {
    unit0[row] = units;
    const int32_t si = seq_of_row[row];
    const int64_t splits = si < 0 ? 0 : SplitsFor(a.seqs[si].pos0 + (row - a.seqs[si].token0) + 1);
    max_splits = std::max(max_splits, splits);
    units += splits * a.n_kv_heads;
  }
  unit0[total] = units;
  thread_local std::vector<float> scratch_storage;
  std::vector<float>& scratch = scratch_storage;  // workers reach it through this reference
  if (max_splits > 1) scratch.resize(static_cast<size_t>(units * group * rec));
  pool.ParallelFor(units, 1, [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> local;  // this worker's records when keys are not split
    local.resize(static_cast<size_t>(group * rec));
    // The row of unit u0 (rows are few in decode, so a linear scan from a binary search start).
    int64_t row = std::upper_bound(unit0.begin(), unit0.begin() + total, u0) - unit0.begin() - 1;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= unit0[row + 1]) ++row;
      const int32_t si = seq_of_row[row];
      const AttentionSeq& sq = a.seqs[si];
      const int64_t n_keys = sq.pos0 + (row - sq.token0) + 1;
      const int64_t splits = SplitsFor(n_keys);
      const int64_t kvh = (u - unit0[row]) / splits, s = (u - unit0[row]) % splits;
      const auto [h0, h1] = heads_of(kvh);
      if (h1 <= h0) continue;
      const int64_t j_begin = n_keys * s / splits, j_end = n_keys * (s + 1) / splits;
      const float* q = a.q + (row * a.n_heads + h0) * d;
      float* rec_out = splits > 1 ? scratch.data() + u * group * rec : local.data();
      AttendRange(a, p, q, h1 - h0, sq.block_table, a.k + kvh * d, a.v + kvh * d, j_begin, j_end,
                  rec_out);
      if (splits == 1) {
        for (int64_t g = 0; g < h1 - h0; ++g) {
          const float* r = rec_out + g * rec;
          float* o = a.out + (row * a.n_heads + h0 + g) * d;
          const float inv = 1.0f / r[1];
          for (int64_t i = 0; i < d; ++i) o[i] = r[2 + i] * inv;
        }
      }
    }
  });
  if (max_splits == 1) return;
  // Merge the splits of each (row, head): rescale every partial to the common max.
  for (int64_t row = 0; row < total; ++row) {
    const int32_t si = seq_of_row[row];
    if (si < 0) continue;
    const int64_t splits = SplitsFor(a.seqs[si].pos0 + (row - a.seqs[si].token0) + 1);
    if (splits == 1) continue;
    for (int64_t kvh = 0; kvh < a.n_kv_heads; ++kvh) {
      const auto [h0, h1] = heads_of(kvh);
      const float* base = scratch.data() + (unit0[row] + kvh * splits) * group * rec;
      for (int64_t g = 0; g < h1 - h0; ++g) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < splits; ++s) m = std::max(m, base[(s * group + g) * rec]);
        float* o = a.out + (row * a.n_heads + h0 + g) * d;
        std::fill(o, o + d, 0.0f);
        float l = 0.0f;
        for (int64_t s = 0; s < splits; ++s) {
          const float* r = base + (s * group + g) * rec;
          if (r[1] == 0.0f) continue;  // an empty split
          const float w = std::exp(r[0] - m);
          l += r[1] * w;
          for (int64_t i = 0; i < d; ++i) o[i] += r[2 + i] * w;
        }
        const float inv = 1.0f / l;
        for (int64_t i = 0; i < d; ++i) o[i] *= inv;
      }
    }
  }
}

void AttentionCpu(const AttentionArgs& a, ThreadPool& pool) {
  // A contiguous cache is one block long enough for every position.
  const int32_t table[1] = {0};
  const int64_t positions = a.pos0 + a.tokens;
  const AttentionSeq seq{0, a.tokens, a.pos0, table};
  PagedAttentionCpu(
      {a.q, a.k, a.v, a.out, a.n_heads, a.n_kv_heads, a.head_dim, a.kv_pos_stride,
       std::max<int64_t>(1, positions), 0, &seq, 1, a.scale, a.group, a.q_head0, a.kv_head0},
      pool);
}

}  // namespace kvmesh::kernels
