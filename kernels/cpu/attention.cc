#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {

namespace {

constexpr int64_t kKeyChunk = 64;          // scores kept per step of the online softmax
constexpr int64_t kMinKeysPerSplit = 256;  // below this, splitting keys costs more than it saves

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
  int64_t total = 0, max_keys = 0;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    total = std::max(total, a.seqs[s].token0 + a.seqs[s].tokens);
    max_keys = std::max(max_keys, a.seqs[s].pos0 + a.seqs[s].tokens);
  }
  thread_local std::vector<int32_t> seq_of_row_storage;
  std::vector<int32_t>& seq_of_row = seq_of_row_storage;
  seq_of_row.assign(static_cast<size_t>(total), -1);
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    for (int64_t t = 0; t < a.seqs[s].tokens; ++t) {
      seq_of_row[a.seqs[s].token0 + t] = static_cast<int32_t>(s);
    }
  }
  // Work units are (row, kv head, key split). Decode has few (row, kv head) pairs, so the keys
  // are split across threads (flash-decoding) and the partial softmaxes merged after.
  const int64_t pairs = total * a.n_kv_heads;
  int64_t splits = 1;
  if (pairs < 4 * pool.size()) {
    splits = std::clamp<int64_t>((4 * pool.size() + pairs - 1) / std::max<int64_t>(1, pairs), 1,
                                 std::max<int64_t>(1, max_keys / kMinKeysPerSplit));
  }
  thread_local std::vector<float> scratch_storage;
  std::vector<float>& scratch = scratch_storage;  // workers reach it through this reference
  if (splits > 1) scratch.resize(static_cast<size_t>(pairs * splits * group * rec));
  pool.ParallelFor(pairs * splits, 1, [&](int64_t u0, int64_t u1) {
    thread_local std::vector<float> local;  // this worker's records when keys are not split
    local.resize(static_cast<size_t>(group * rec));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t pair = u / splits, s = u % splits;
      const int64_t row = pair / a.n_kv_heads, kvh = pair % a.n_kv_heads;
      const auto [h0, h1] = heads_of(kvh);
      const int32_t si = seq_of_row[row];
      if (h1 <= h0 || si < 0) continue;
      const AttentionSeq& sq = a.seqs[si];
      const int64_t n_keys = sq.pos0 + (row - sq.token0) + 1;
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
  if (splits == 1) return;
  // Merge the splits of each (row, head): rescale every partial to the common max.
  for (int64_t pair = 0; pair < pairs; ++pair) {
    const int64_t row = pair / a.n_kv_heads, kvh = pair % a.n_kv_heads;
    const auto [h0, h1] = heads_of(kvh);
    if (seq_of_row[row] < 0) continue;
    for (int64_t g = 0; g < h1 - h0; ++g) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t s = 0; s < splits; ++s) {
        m = std::max(m, scratch[((pair * splits + s) * group + g) * rec]);
      }
      float* o = a.out + (row * a.n_heads + h0 + g) * d;
      std::fill(o, o + d, 0.0f);
      float l = 0.0f;
      for (int64_t s = 0; s < splits; ++s) {
        const float* r = scratch.data() + ((pair * splits + s) * group + g) * rec;
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
