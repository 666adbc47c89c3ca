// Paged attention run over a plan (kernels/ops.h PagedAttentionCpu; the plan: attention_plan.h):
// each thread claims items of units, walks their chunks of keys and writes each row's partial
// softmax records, merged in range order at the end.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/cpu/attention_plan.h"
#include "kernels/cpu/primitives.h"
#include "kernels/ops.h"
#include "util/aligned_vector.h"

namespace kvmesh::kernels {

namespace {

using paged_attention::GroupOf;
using paged_attention::kKeyChunk;
using paged_attention::kLineBytes;
using paged_attention::kMaxRowsPerTask;
using paged_attention::kRange;
using paged_attention::LaneWorthy;
using paged_attention::Task;
using paged_attention::Unit;

constexpr int64_t kMaxGroup = 64;  // query heads per AttendHeads pass (AttendChunk loops)

struct Run {
  // Key offset in the chunk, run length, and the run's first position in the layer: V's
  // element offset (position-major) and K's (K is transposed within a block); its slot in the
  // block.
  int64_t off, len, at, k_at, slot;
};

// The runs of keys [j0, j0 + n) contiguous in memory (inside one block).
int64_t RunsOf(const PagedAttentionArgs& a, const int32_t* table, int64_t j0, int64_t n,
               Run* runs) {
  // One division: after the first run every run starts a block.
  int64_t k = 0, b = j0 / a.block_size, slot = j0 - b * a.block_size;
  for (int64_t j = j0; j < j0 + n; ++b, slot = 0) {
    const int64_t len = std::min(a.block_size - slot, j0 + n - j);
    const int64_t block = table[b] * a.block_stride;
    runs[k++] = {j - j0, len, block + slot * a.pos_stride, block + slot, slot};
    j += len;
  }
  return k;
}

// Calls f(address) for each cache line holding one KV head's K and V of a chunk's runs, to ask
// for them ahead of use: the blocks of a long context are spread over the pool (each holds every
// layer), so the hardware prefetcher does not see the next chunk coming.
constexpr int64_t kMaxLines = 1024;  // a chunk lists at most this many (a hint only)
// f(line) for each line holding some of the elems fp16 values from p.
template <typename F>
void ForEachSpanLine(const uint16_t* p, int64_t elems, F& f) {
  const auto e = reinterpret_cast<uintptr_t>(p + elems);
  for (auto l = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{kLineBytes - 1}; l < e;
       l += kLineBytes) {
    f(reinterpret_cast<const void*>(l));
  }
}
template <typename F>
void ForEachLine(const PagedAttentionArgs& a, const uint16_t* kbase, const uint16_t* vbase,
                 const Run* runs, int64_t n_runs, F f) {
  auto span = [&](const uint16_t* p, int64_t elems) { ForEachSpanLine(p, elems, f); };
  for (int64_t r = 0; r < n_runs; ++r) {
    // K: head_dim rows of the run's keys, block_size apart: one span from the first row's first
    // key to the last row's last while rows are at most a line (the span then wastes nothing),
    // else row by row; V: len rows of head_dim, pos_stride apart.
    if (a.bf16) {  // K as pairs of dims: pair i's slots at 2 * i * block_size + 2 * slot
      const uint16_t* k0 = kbase + runs[r].k_at + runs[r].slot;
      if (a.block_size * static_cast<int64_t>(sizeof(uint32_t)) <= kLineBytes) {
        span(k0, (a.head_dim - 2) * a.block_size + 2 * runs[r].len);
      } else {
        for (int64_t i = 0; i < a.head_dim / 2; ++i)
          span(k0 + 2 * i * a.block_size, 2 * runs[r].len);
      }
    } else if (a.block_size * static_cast<int64_t>(sizeof(uint16_t)) <= kLineBytes) {
      span(kbase + runs[r].k_at, (a.head_dim - 1) * a.block_size + runs[r].len);
    } else {
      for (int64_t i = 0; i < a.head_dim; ++i)
        span(kbase + runs[r].k_at + i * a.block_size, runs[r].len);
    }
    if (a.bf16) {  // V as pairs of positions (kernels/ops.h)
      for (int64_t j = 0; j < runs[r].len; j += 2)
        span(vbase + runs[r].at + j * a.pos_stride, 2 * a.head_dim);
      continue;
    }
    for (int64_t j = 0; j < runs[r].len; ++j)
      span(vbase + runs[r].at + j * a.pos_stride, a.head_dim);
  }
}

// Where KV head kvh's K and V start in a layer's cache (a.k, a.v): K as head_dim rows of
// block_size keys per head; V d elements per position (in bf16, 2 * d per pair of positions).
const uint16_t* KBaseOf(const PagedAttentionArgs& a, int64_t kvh) {
  return a.k + kvh * a.head_dim * a.block_size;
}
const uint16_t* VBaseOf(const PagedAttentionArgs& a, int64_t kvh) {
  return a.v + (a.bf16 ? 2 : 1) * kvh * a.head_dim;
}

// ForEachLine for KV heads [kvh0, kvh1) of a chunk's runs. Where they are all of a block's
// heads (fp16, V positions holding just those heads, K rows of a head at most a line), each
// run's K and then its V are one span over every head, in address order: the same lines as head
// by head (which went K of a head, its V rows, every third pair of lines, then the next head),
// asked for as a stream. In-process A/B (forty-third session, Zen 3):
// BM_PagedAttentionSharedDecode 4096/1/2/100 0.826x and 0.802x, 4096/1/2/16 0.837x, 0/16/1/100
// 0.804x, 0/16/2/100 0.850x and 0.820x; one sequence's decode step 0.895x at 4K and 0.894x at
// 8K, 16 sequences' at 1K 0.973x.
template <typename F>
void ForEachHeadsLine(const PagedAttentionArgs& a, int64_t kvh0, int64_t kvh1, const Run* runs,
                      int64_t n_runs, F f) {
  const int64_t d = a.head_dim, heads = a.n_kv_heads;
  if (!a.bf16 && kvh0 == 0 && kvh1 == heads && a.pos_stride == heads * d &&
      a.block_size * static_cast<int64_t>(sizeof(uint16_t)) <= kLineBytes) {
    for (int64_t r = 0; r < n_runs; ++r) {
      ForEachSpanLine(a.k + runs[r].k_at, (heads * d - 1) * a.block_size + runs[r].len, f);
      ForEachSpanLine(a.v + runs[r].at, runs[r].len * a.pos_stride, f);
    }
    return;
  }
  for (int64_t kvh = kvh0; kvh < kvh1; ++kvh) {
    ForEachLine(a, KBaseOf(a, kvh), VBaseOf(a, kvh), runs, n_runs, f);
  }
}

// Converts the chunk's K (its runs, n keys) into fp32 transposed [d, kKeyChunk]: a run's
// positions are contiguous for each dim, so each is one conversion per dim.
void StageK(const PagedAttentionArgs& a, const cpu::Primitives& p, const uint16_t* kbase,
            const Run* runs, int64_t n_runs, float* kt) {
  for (int64_t r = 0; r < n_runs; ++r) {
    p.f16_to_f32_tile(kbase + runs[r].k_at, a.block_size, kt + runs[r].off, kKeyChunk, a.head_dim,
                      runs[r].len);
  }
}

// Where a chunk's K/V are read from. The cache's fp16 in place, converted in registers (K per
// 16-key group, when blocks hold a multiple of 16 positions; V rows), or for K in other blocks
// staged as fp32 (transposed, kt) once per task and chunk; the primitives give identical bits.
// In place, a task's rows each convert what they read, which costs nothing beside the fused
// multiply-adds (a scratch loop in L1: q.k and p.v in place within 3% of staged), saves the
// staging pass (~10% of a several-row task's chunk, TSC timers), and halves the bytes a chunk
// keeps in L1 (11th session, Zen 3: BM_PagedAttentionSharedDecode/1024/16/{1,2}/0 and
// 4096/16/2/16, 10 alternating rounds, minimum of rounds 1.07x / 1.05x / 1.13x).
struct ChunkKv {
  const float* kt = nullptr;
  const uint16_t* const* kgroups = nullptr;  // or K in the cache: per 16 keys, their block
  const uint16_t* const* vrows = nullptr;    // per key of the chunk: its fp16 V row
  // bf16 attention: K and V in the cache as bf16 pairs (kernels/ops.h), read in place: per 16
  // keys their block's dim pairs (stride block_size), per pair of keys their V pairs.
  const uint32_t* const* kpairs = nullptr;
  const uint32_t* const* vpairs = nullptr;
};

// A head's record [m, l, o...] takes in a chunk whose scores' maximum, with m's, is cmax and
// whose exps (shifted by cmax) sum to sum: m = cmax, l = l * rescale + sum; returns the rescale
// o must be multiplied by: exp(old m - cmax), exactly 1 when the maximum did not move. Both
// attention paths (AttendHeads, the lane kernels) fold chunks through this one expression.
inline float FoldChunk(float& m, float& l, float cmax, float sum) {
  const float rescale = cmax == m ? 1.0f : std::exp(m - cmax);
  m = cmax;
  l = l * rescale + sum;
  return rescale;
}

// One chunk of keys [0, n) for the `group` (at most kMaxGroup) query heads q of one row:
// updates the records [m, l, o...] (stride 2 + d). The lines in *ahead are asked for during
// q.k (cpu::Ahead); between() runs after the softmax, before p.v, and may give *ahead the lines
// to ask for during p.v.
template <typename Between>
void AttendHeads(const PagedAttentionArgs& a, const cpu::Primitives& p, const float* q,
                 const uint32_t* qp, int64_t group, const ChunkKv& kv, int64_t n, float* scores,
                 float* rec, cpu::Ahead* ahead, const Between& between) {
  const int64_t d = a.head_dim;
  const int64_t stride = 2 + d;
  float chunk_max[kMaxGroup], sums[kMaxGroup];
  if (kv.kpairs != nullptr) {
    p.qk_bf16(qp, group, d, kv.kpairs, a.block_size, n, scores, kKeyChunk, chunk_max, ahead);
  } else if (kv.kt != nullptr) {
    ahead->All();
    p.qk_t(q, group, d, kv.kt, kKeyChunk, n, a.scale, scores, kKeyChunk, chunk_max);
  } else {
    p.qk_t_f16(q, group, d, kv.kgroups, a.block_size, n, a.scale, scores, kKeyChunk, chunk_max,
               ahead);
  }
  for (int64_t g = 0; g < group; ++g) chunk_max[g] = std::max(rec[g * stride], chunk_max[g]);
  // All heads' exps in one call where the table has it (AVX-512: 16 sequences over 1K shared
  // keys 1-2% less time per layer, alternating inside one process, 17th session, Zen 5).
  if (p.exp_shifted_sums != nullptr) {
    p.exp_shifted_sums(scores, kKeyChunk, group, chunk_max, n, sums);
  } else {
    for (int64_t g = 0; g < group; ++g) {
      float* sc = scores + g * kKeyChunk;
      sums[g] = p.exp_shifted_sum(sc, chunk_max[g], sc, n);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* r = rec + g * stride;
    const float rescale = FoldChunk(r[0], r[1], chunk_max[g], sums[g]);
    if (rescale != 1.0f) {
      for (int64_t i = 0; i < d; ++i) r[2 + i] *= rescale;
    }
  }
  between();
  // V: each row is loaded once for all heads of the group.
  if (kv.vpairs == nullptr) {
    return p.pv_f16(scores, kKeyChunk, group, d, kv.vrows, n, rec + 2, stride, ahead);
  }
  uint32_t weights[kMaxGroup * kKeyChunk / 2];  // bf16 pairs, a zero after an odd n
  auto* w = reinterpret_cast<uint16_t*>(weights);
  for (int64_t g = 0; g < group; ++g) {
    p.to_bf16(scores + g * kKeyChunk, w + g * kKeyChunk, n);
    if (n % 2 != 0) w[g * kKeyChunk + n] = 0;
  }
  p.pv_bf16(weights, kKeyChunk / 2, group, d, kv.vpairs, n, rec + 2, stride, ahead);
}

// AttendHeads for any number of heads, in passes of kMaxGroup (each head's arithmetic is its
// own, so the passes change no bits); between() runs in the first pass.
template <typename Between>
void AttendChunk(const PagedAttentionArgs& a, const cpu::Primitives& p, const float* q,
                 const uint32_t* qp, int64_t group, const ChunkKv& kv, int64_t n, float* scores,
                 float* rec, cpu::Ahead* ahead, const Between& between) {
  for (int64_t g0 = 0; g0 < group; g0 += kMaxGroup) {
    AttendHeads(a, p, q + g0 * a.head_dim, qp != nullptr ? qp + g0 * a.head_dim / 2 : nullptr,
                std::min(kMaxGroup, group - g0), kv, n, scores, rec + g0 * (2 + a.head_dim), ahead,
                [&] {
                  if (g0 == 0) between();
                });
  }
}

// A unit of one KV head whose rows all reach every key of its range (a shared prefix's rows, or
// prefill rows below the diagonal), with its rows' hn query heads in vector lanes (the table's
// qk_lanes / exp_lanes / pv_lanes): head h = i * hn + g is row i's head g. Each chunk's K and V
// are staged as fp32 once for all of them; each head's bits are those of AttendHeads (the same
// chains, folded by FoldChunk), so which path a unit takes changes only its time. q_of(i): row
// i's hn scaled query heads; rec_of(i): its records, set to their start, written at the end. The
// next chunk's lines are asked for during q.k (in the last chunk, those last_lines(add) gives
// add: the caller's next item's first chunk), the side lines spread over the chunks' p.v, both
// into L2: a chunk's own data (48 heads: queries, K and V as fp32, scores, outputs, ~68 KB) is
// more than L1 holds, so lines asked for into L1 were gone again before their use. Against
// asking into L1, in-process A/B (thirty-ninth session, Zen 4): BM_PagedAttentionSharedDecode
// 1024/16/2/100 0.922x and 0.950x, 4096/16/2/100 0.963x and 0.969x; the 16-sequence decode
// step 0.977x and 0.985x at 1K, 0.962x at 4K.
template <typename QOf, typename RecOf, typename LastLines>
void AttendInLanes(const PagedAttentionArgs& a, const cpu::Primitives& p, const Task& task,
                   int64_t hn, int64_t j_begin, int64_t j_end, const uint16_t* kbase,
                   const uint16_t* vbase, const QOf& q_of, const RecOf& rec_of,
                   const std::vector<const void*>& side, const LastLines& last_lines) {
  const int64_t d = a.head_dim, stride = 2 + d, H = task.n_rows * hn, hs = (H + 15) / 16 * 16;
  struct Scratch {
    util::AlignedVector<float> rows, q, o, st, kt, vf, m, l, cmax, sums, rescale;
  };
  thread_local Scratch ls;
  ls.rows.resize(static_cast<size_t>(H * d));  // [head][dim], for the transposes
  for (int64_t i = 0; i < task.n_rows; ++i)
    std::copy_n(q_of(i), hn * d, ls.rows.data() + i * hn * d);
  ls.q.assign(static_cast<size_t>(d * hs), 0.0f);  // lanes past H: zero queries
  p.transpose_f32(ls.rows.data(), d, ls.q.data(), hs, H, d);
  ls.o.assign(static_cast<size_t>(d * hs), 0.0f);
  ls.m.assign(static_cast<size_t>(hs), -std::numeric_limits<float>::infinity());
  ls.l.assign(static_cast<size_t>(hs), 0.0f);
  ls.rescale.assign(static_cast<size_t>(hs), 1.0f);
  ls.cmax.resize(static_cast<size_t>(hs));
  ls.sums.resize(static_cast<size_t>(hs));
  ls.st.resize(static_cast<size_t>(kKeyChunk * hs));
  ls.kt.resize(static_cast<size_t>(d * kKeyChunk));
  ls.vf.resize(static_cast<size_t>(kKeyChunk * d));
  Run runs_a[kKeyChunk + 1], runs_b[kKeyChunk + 1];
  Run* runs = runs_a;
  Run* next_runs = runs_b;
  const void* lines[kMaxLines];
  const int64_t chunks = (j_end - j_begin + kKeyChunk - 1) / kKeyChunk;
  const size_t side_per_chunk = (side.size() + static_cast<size_t>(chunks) - 1) /
                                static_cast<size_t>(std::max<int64_t>(1, chunks));
  size_t side_at = 0;
  int64_t n_runs = RunsOf(a, task.table, j_begin, std::min(kKeyChunk, j_end - j_begin), runs);
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeyChunk) {
    const int64_t n = std::min(kKeyChunk, j_end - j0);
    int64_t n_lines = 0, n_next = 0;
    auto add_line = [&](const void* l) {
      if (n_lines < kMaxLines) lines[n_lines++] = l;
    };
    if (j0 + kKeyChunk < j_end) {
      n_next = RunsOf(a, task.table, j0 + kKeyChunk, std::min(kKeyChunk, j_end - j0 - kKeyChunk),
                      next_runs);
      ForEachLine(a, kbase, vbase, next_runs, n_next, add_line);
    } else {
      last_lines(add_line);
    }
    StageK(a, p, kbase, runs, n_runs, ls.kt.data());
    for (int64_t r = 0; r < n_runs; ++r) {
      p.f16_to_f32_tile(vbase + runs[r].at, a.pos_stride, ls.vf.data() + runs[r].off * d, d,
                        runs[r].len, d);
    }
    cpu::Ahead ahead{lines, n_lines, true};
    p.qk_lanes(ls.q.data(), hs, H, d, ls.kt.data(), kKeyChunk, n, ls.st.data(), ls.cmax.data(),
               &ahead);
    for (int64_t h = 0; h < H; ++h) ls.cmax[h] = std::max(ls.m[h], ls.cmax[h]);
    p.exp_lanes(ls.st.data(), hs, H, ls.cmax.data(), n, ls.sums.data());
    for (int64_t h = 0; h < H; ++h) {
      ls.rescale[h] = FoldChunk(ls.m[h], ls.l[h], ls.cmax[h], ls.sums[h]);
    }
    const size_t from = side_at;
    side_at = std::min(side.size(), side_at + side_per_chunk);
    ahead = {side.data() + from, static_cast<int64_t>(side_at - from), true};
    p.pv_lanes(ls.st.data(), hs, H, d, ls.vf.data(), n, ls.rescale.data(), ls.o.data(), &ahead);
    std::swap(runs, next_runs);
    n_runs = n_next;
  }
  p.transpose_f32(ls.o.data(), hs, ls.rows.data(), d, d, H);
  for (int64_t i = 0; i < task.n_rows; ++i) {
    float* rec = rec_of(i);
    for (int64_t g = 0; g < hn; ++g) {
      const int64_t h = i * hn + g;
      float* r = rec + g * stride;
      r[0] = ls.m[h];
      r[1] = ls.l[h];
      std::copy_n(ls.rows.data() + h * d, d, r + 2);
    }
  }
}

std::atomic<int64_t> g_lane_units{0};  // PagedAttentionLaneUnits

// Calls f(line) for the lines of unit u's (task t's) chunk from key j0, over its KV heads.
template <typename F>
void ForEachChunkLine(const PagedAttentionArgs& a, const Task& t, const Unit& u, int64_t j0, F f) {
  Run runs[kKeyChunk + 1];
  const int64_t n_runs =
      RunsOf(a, t.table, j0, std::min(kKeyChunk, t.s * kRange + u.keys - j0), runs);
  ForEachHeadsLine(a, u.kvh0, u.kvh1, runs, n_runs, f);
}

// Appends the lines holding a unit's K and V (all of its keys and KV heads) to `lines`.
void AppendUnitLines(const PagedAttentionArgs& a, const Task& t, const Unit& u,
                     std::vector<const void*>& lines) {
  for (int64_t j0 = t.s * kRange; j0 < t.s * kRange + u.keys; j0 += kKeyChunk) {
    ForEachChunkLine(a, t, u, j0, [&](const void* l) { lines.push_back(l); });
  }
}

}  // namespace

int64_t PagedAttentionLaneUnits() { return g_lane_units.load(std::memory_order_relaxed); }

void PagedAttentionCpu(const PagedAttentionArgs& a, ThreadPool& pool) {
  thread_local PagedAttentionPlan plan;
  PlanPagedAttention(a, pool.size(), plan);
  PagedAttentionCpu(plan, a.q, a.k, a.v, a.out, pool);
}

void PagedAttentionCpu(const PagedAttentionPlan& plan, const float* q, const uint16_t* k,
                       const uint16_t* v, float* out, ThreadPool& pool) {
  const PagedAttentionPlan::Impl& pl = *plan.impl_;
  PagedAttentionArgs a = pl.args;
  // q scaled once here, not once per chunk inside q.k (which reads it in place at scale 1: the
  // same bits, x * 1 being x).
  thread_local util::AlignedVector<float> q_scaled;
  const int64_t q_elems = pl.total * a.n_heads * a.head_dim;
  q_scaled.resize(static_cast<size_t>(q_elems));
  for (int64_t i = 0; i < q_elems; ++i) q_scaled[i] = q[i] * a.scale;
  const auto& p = cpu::Prims();
  // bf16 attention: the scaled queries as bf16 pairs (head h of row r at (r * n_heads + h) *
  // head_dim / 2).
  thread_local std::vector<uint32_t> q_pairs_storage;
  std::vector<uint32_t>& q_pairs = q_pairs_storage;  // workers reach it through this reference
  if (pl.args.bf16) {
    q_pairs.resize(static_cast<size_t>(q_elems / 2));
    p.to_bf16(q_scaled.data(), reinterpret_cast<uint16_t*>(q_pairs.data()), q_elems);
  }
  a.q = q_scaled.data();
  a.scale = 1.0f;
  a.k = k;
  a.v = v;
  a.out = out;
  const bool bf16 = a.bf16;
  const int64_t group = GroupOf(a);
  const int64_t d = a.head_dim;
  const int64_t stride = 2 + d;
  // Local query heads [first, last) of local KV head kvh.
  auto heads_of = [&](int64_t kvh) {
    const int64_t g = a.kv_head0 + kvh;
    const int64_t first = std::max(a.q_head0, g * group) - a.q_head0;
    const int64_t last = std::min(a.q_head0 + a.n_heads, (g + 1) * group) - a.q_head0;
    return std::pair<int64_t, int64_t>{first, last};
  };
  const int64_t total = pl.total;
  const std::vector<int64_t>& n_keys = pl.n_keys;
  const std::vector<int64_t>& rec0 = pl.rec0;
  const std::vector<int64_t>& rows = pl.rows;
  const std::vector<Task>& tasks = pl.tasks;
  const std::vector<Unit>& units = pl.units;
  const std::vector<int64_t>& seq = pl.seq;
  const std::vector<int64_t>& item = pl.item;
  thread_local util::AlignedVector<float> records_storage;
  util::AlignedVector<float>& records = records_storage;  // workers reach it through this reference
  records.resize(static_cast<size_t>(rec0[total] * stride));
  const int64_t n_items = static_cast<int64_t>(item.size()) - 1;
  std::atomic<int64_t> next_item{0};
  pool.Run([&](int, int) {
    thread_local util::AlignedVector<float> scores, kt, pair_q, pair_rec;
    thread_local std::vector<uint32_t> pair_qp;
    // A call's query heads: one row's group, or several rows' up to pair_heads.
    scores.resize(
        static_cast<size_t>(std::max({group, p.pair_heads, p.pair_heads_bf16}) * kKeyChunk));
    kt.resize(static_cast<size_t>(kKeyChunk * d));
    Run runs_a[kKeyChunk + 1], runs_b[kKeyChunk + 1];  // this chunk's and the next one's
    const void* lines[kMaxLines];
    const uint16_t* vrows[kKeyChunk];
    const uint16_t* kgroups[kKeyChunk / 16];
    const uint32_t* kpairs[kKeyChunk / 16];
    const uint32_t* vpairs[kKeyChunk / 2];
    thread_local std::vector<const void*> side;      // lines of the item's one-row units
    thread_local std::vector<const void*> pv_lines;  // a call's lines for its p.v
    // k_next: the item this thread takes next, claimed early (in its current item's last chunk
    // outside lanes) so that chunk can ask for the next item's first chunk; -1 until then.
    for (int64_t k = next_item.fetch_add(1), k_next = -1; k < n_items;
         k = k_next >= 0 ? k_next : next_item.fetch_add(1), k_next = -1) {
      for (int64_t q = item[k]; q < item[k + 1]; ++q) {
        const int64_t u = seq[q];
        side.clear();
        for (int64_t f = q + 1; q == item[k] && f < item[k + 1]; ++f) {
          AppendUnitLines(a, tasks[units[seq[f]].task], units[seq[f]], side);
        }
        const Task& task = tasks[units[u].task];
        const int64_t kvh0 = units[u].kvh0, kvh1 = units[u].kvh1;
        // Per row of the task: its key count, and its records for this range and KV head kvh at
        // rec_at[i] + kvh * rec_step[i] (found once per unit, not per chunk).
        int64_t keys_of[kMaxRowsPerTask];
        float* rec_at[kMaxRowsPerTask];
        int64_t rec_step[kMaxRowsPerTask];
        const int64_t j_begin = task.s * kRange, j_end = j_begin + units[u].keys;
        auto rec_of = [&](int64_t i, int64_t kvh) { return rec_at[i] + kvh * rec_step[i]; };
        for (int64_t i = 0; i < task.n_rows; ++i) {
          const int64_t row = rows[task.first_row + i];
          keys_of[i] = n_keys[row];
          const int64_t ranges = (n_keys[row] + kRange - 1) / kRange;
          rec_at[i] = records.data() + (rec0[row] + task.s * group) * stride;
          rec_step[i] = ranges * group * stride;
          for (int64_t kvh = kvh0; kvh < kvh1; ++kvh) {
            const auto [h0, h1] = heads_of(kvh);
            float* rec = rec_of(i, kvh);
            for (int64_t g = 0; g < h1 - h0; ++g) {
              rec[g * stride] = -std::numeric_limits<float>::infinity();
              rec[g * stride + 1] = 0.0f;
              std::fill(rec + g * stride + 2, rec + (g + 1) * stride, 0.0f);
            }
          }
        }
        // Row i's (scaled) query heads from local head head0.
        auto q_of = [&](int64_t i, int64_t head0) {
          return a.q + (rows[task.first_row + i] * a.n_heads + head0) * d;
        };
        auto qp_of = [&](int64_t i, int64_t head0) {
          return q_pairs.data() + (rows[task.first_row + i] * a.n_heads + head0) * d / 2;
        };
        // A task of several rows (one KV head) runs them several at a time (up to the table's
        // pair_heads query heads in one call), wherever they see the same keys of a chunk: one
        // call over those rows' hn query heads each, so each K and V vector converted feeds
        // several rows' fused multiply-adds and the per-call work is shared. For that its rows'
        // q and records are gathered for the unit (pair_q [i][g][d], pair_rec [i][g][2 + d]) and
        // the records copied back at its end. Each head's arithmetic is its own, so the bits are
        // those of one row at a time.
        const int64_t hn = heads_of(kvh0).second - heads_of(kvh0).first;
        const int64_t rows_per_call = hn > 0 ? (bf16 ? p.pair_heads_bf16 : p.pair_heads) / hn : 0;
        const bool pairs = task.n_rows > 1 && kvh1 == kvh0 + 1 && rows_per_call >= 2;
        // Enough heads over the same keys (LaneWorthy): all at once, in lanes (AttendInLanes).
        bool lanes = task.n_rows > 1 && kvh1 == kvh0 + 1 && LaneWorthy(a, p, task.n_rows * hn);
        for (int64_t i = 0; lanes && i < task.n_rows; ++i) {
          lanes = std::min(kRange, keys_of[i] - j_begin) == units[u].keys;
        }
        // For the item's last unit, in its last chunk: the first chunk of the thread's next
        // item, which it claims now. That chunk was read cold before (a unit's first chunk has
        // no predecessor to ask for it: at 4K, 8 a layer for one sequence, 24 for four).
        // In-process A/B (forty-second session, Zen 3; the decode step, 48 steps of each),
        // outside lanes: one sequence 0.968x at 1K and 4K, 0.942x at 8K; 4 sequences at 4K
        // 0.952x and 0.948x; 16 sequences 1.007x at 1K, 0.976x at 4K. Lane units too
        // (forty-third session, Zen 3, the 16-sequence decode step, 48 steps of each): 0.988x at
        // 1K, 0.959x and 0.981x at 4K, 0.984x at 8K; BM_PagedAttentionPrefill 0.998-0.999x.
        auto next_item_lines = [&](const auto& add) {
          if (q + 1 != item[k + 1]) return;
          if (k_next < 0) k_next = next_item.fetch_add(1);
          if (k_next < n_items) {
            const Unit& nu = units[seq[item[k_next]]];
            const Task& nt = tasks[nu.task];
            ForEachChunkLine(a, nt, nu, nt.s * kRange, add);
          }
        };
        if (lanes) {
          g_lane_units.fetch_add(1, std::memory_order_relaxed);
          const int64_t h0 = heads_of(kvh0).first;
          AttendInLanes(
              a, p, task, hn, j_begin, j_end, KBaseOf(a, kvh0), VBaseOf(a, kvh0),
              [&](int64_t i) { return q_of(i, h0); }, [&](int64_t i) { return rec_of(i, kvh0); },
              side, next_item_lines);
          continue;
        }
        if (pairs) {
          pair_q.resize(static_cast<size_t>(task.n_rows * hn * d));
          pair_rec.resize(static_cast<size_t>(task.n_rows * hn * stride));
          if (bf16) pair_qp.resize(static_cast<size_t>(task.n_rows * hn * d / 2));
          const int64_t h0 = heads_of(kvh0).first;
          for (int64_t i = 0; i < task.n_rows; ++i) {
            if (bf16) std::copy_n(qp_of(i, h0), hn * d / 2, pair_qp.data() + i * hn * d / 2);
            std::copy_n(q_of(i, h0), hn * d, pair_q.data() + i * hn * d);
            std::copy_n(rec_of(i, kvh0), hn * stride, pair_rec.data() + i * hn * stride);
          }
        }
        auto pair_qp_of = [&](int64_t i) {
          return bf16 ? pair_qp.data() + i * hn * d / 2 : nullptr;
        };
        // The side lines, spread over the unit's row passes.
        int64_t passes = 0;
        for (int64_t kvh = kvh0; kvh < kvh1; ++kvh) {
          if (heads_of(kvh).second > heads_of(kvh).first) passes += task.n_rows;
        }
        passes *= (j_end - j_begin + kKeyChunk - 1) / kKeyChunk;
        const int64_t side_per_pass =
            passes > 0 ? (static_cast<int64_t>(side.size()) + passes - 1) / passes : 0;
        size_t side_at = 0;
        // The runs of the current chunk; each chunk's are found once, as the next chunk's while
        // its predecessor runs (for the prefetch), and then used here.
        Run* runs = runs_a;
        Run* next_runs = runs_b;
        int64_t n_runs = RunsOf(a, task.table, j_begin, std::min(kKeyChunk, j_end - j_begin), runs);
        for (int64_t j0 = j_begin; j0 < j_end; j0 += kKeyChunk) {
          // The next chunk's lines, asked for spread over this chunk's work (a burst of misses
          // stalls on the core's miss buffers): a task of several rows spreads them over its
          // rows; a lone row over its KV heads' passes, half during q.k and half during p.v. The
          // lone row used to ask for all of them at the start of the chunk (up to 768 lines for 3
          // KV heads); spread, in-process A/B (nineteenth session, Zen 5):
          // BM_PagedAttentionSharedDecode/0/16/1/100 0.86x the time, one sequence's decode step
          // at 4K 0.962-0.974x. Each call's share goes to its kernels (cpu::Ahead), which ask for
          // a line per step of their loops instead of all at the call's start: in-process A/B
          // (twenty-fourth session, Intel): 1024|4096/16/2/16|100 0.93-0.95x, 1024|4096/1/2/100
          // 0.88-0.89x.
          int64_t n_lines = 0, n_next = 0;
          auto add_line = [&](const void* l) {
            if (n_lines < kMaxLines) lines[n_lines++] = l;
          };
          if (j0 + kKeyChunk < j_end) {
            n_next = RunsOf(a, task.table, j0 + kKeyChunk,
                            std::min(kKeyChunk, j_end - j0 - kKeyChunk), next_runs);
            ForEachHeadsLine(a, kvh0, kvh1, next_runs, n_next, add_line);
          } else {
            next_item_lines(add_line);
          }
          // Row i of a pass asks for lines [i * n_lines / n_rows, (i + 1) * n_lines / n_rows),
          // the bound stepped as quotient and remainder (its two divisions per row were ~1.5% of
          // attention's samples in a 16-sequence decode).
          const int64_t line_step = n_lines / task.n_rows, line_step_rem = n_lines % task.n_rows;
          int64_t line_end = 0, line_rem = 0;  // reset for each KV head's pass below
          auto next_share = [&] {              // moves line_end past the next row's share
            line_end += line_step;
            line_rem += line_step_rem;
            if (line_rem >= task.n_rows) {
              ++line_end;
              line_rem -= task.n_rows;
            }
          };
          const int64_t n_chunk = std::min(kKeyChunk, j_end - j0);
          for (int64_t kvh = kvh0; kvh < kvh1; ++kvh) {
            const auto [h0, h1] = heads_of(kvh);
            if (h1 <= h0) continue;
            const uint16_t* kbase = KBaseOf(a, kvh);
            const uint16_t* vbase = VBaseOf(a, kvh);
            ChunkKv kv;
            if (bf16) {
              // In place: the block's dim pairs of 16 keys from slot s at block + 2 * s (in
              // fp16 units); V's pair of keys j, j + 1 (j even) at V's block + j * pos_stride,
              // this head's 2 * d elements from 2 * kvh * d.
              for (int64_t c = 0; c * 16 < n_chunk; ++c) {
                int64_t r = 0;
                while (runs[r].off + runs[r].len <= 16 * c) ++r;
                const int64_t slot = runs[r].slot + 16 * c - runs[r].off;
                kpairs[c] = reinterpret_cast<const uint32_t*>(kbase + runs[r].k_at - runs[r].slot +
                                                              2 * slot);
              }
              for (int64_t r = 0, j = 0; r < n_runs; ++r) {
                for (int64_t i = 0; i < runs[r].len; i += 2, j += 2) {
                  vpairs[j / 2] =
                      reinterpret_cast<const uint32_t*>(vbase + runs[r].at + i * a.pos_stride);
                }
              }
              kv.kpairs = kpairs;
              kv.vpairs = vpairs;
            } else if (a.block_size % 16 == 0) {
              // K read in place, 16 keys of one block per group.
              for (int64_t c = 0; c * 16 < n_chunk; ++c) {
                int64_t r = 0;
                while (runs[r].off + runs[r].len <= 16 * c) ++r;
                kgroups[c] = kbase + runs[r].k_at + (16 * c - runs[r].off);
              }
              kv.kgroups = kgroups;
            } else {
              StageK(a, p, kbase, runs, n_runs, kt.data());
              kv.kt = kt.data();
            }
            for (int64_t r = 0, j = 0; r < n_runs; ++r) {
              for (int64_t i = 0; i < runs[r].len; ++i, ++j)
                vrows[j] = vbase + runs[r].at + i * a.pos_stride;
            }
            kv.vrows = vrows;
            line_end = line_rem = 0;
            // A call asks for its rows' shares of the next chunk during q.k (since the
            // forty-second session half of them; the other half during p.v, below) and their
            // side lines during p.v: the two together before q.k (16 + 32 lines a row) overran
            // the core's miss buffers. This way against both before q.k, alternating every 7 calls
            // in one process (15th session, Zen 3): 16 sequences over 1K shared keys with 100 of
            // their own 7-10% less time per layer, over 4K 1-6%; the whole 16-sequence decode step
            // at 1K 1.6% less with 256 tokens decoded, within +-1.5% with 64.
            cpu::Ahead ahead;
            auto side_lines = [&](int64_t rows) {  // `rows` row passes' share of the side lines
              const size_t from = side_at;
              side_at = std::min(side.size(), side_at + static_cast<size_t>(rows * side_per_pass));
              return cpu::Ahead{side.data() + from, static_cast<int64_t>(side_at - from)};
            };
            auto keys_in_chunk = [&](int64_t i) {
              return std::min({kKeyChunk, keys_of[i] - j0, j_begin + kRange - j0});
            };
            if (task.n_rows == 1) {
              const int64_t slices = 2 * (kvh1 - kvh0), at = 2 * (kvh - kvh0);
              auto slice = [&](int64_t sl) {
                const int64_t from = sl * n_lines / slices;
                return cpu::Ahead{lines + from, (sl + 1) * n_lines / slices - from};
              };
              if (const int64_t n = keys_in_chunk(0); n > 0) {
                ahead = slice(at);
                AttendChunk(a, p, q_of(0, h0), bf16 ? qp_of(0, h0) : nullptr, h1 - h0, kv, n,
                            scores.data(), rec_of(0, kvh), &ahead, [&] {
                              side_lines(1).All();
                              ahead = slice(at + 1);
                            });
              } else {
                slice(at).All();
                slice(at + 1).All();
              }
              continue;
            }
            for (int64_t i = 0; i < task.n_rows; ++i) {
              const int64_t first_line = line_end;
              next_share();
              const int64_t n = keys_in_chunk(i);
              if (n <= 0) {
                cpu::Ahead{lines + first_line, line_end - first_line}.All();
                side_lines(1).All();
                continue;
              }
              int64_t m = 1;  // rows in this call: row i and the next that see the same keys
              for (; pairs && m < rows_per_call && i + m < task.n_rows && keys_in_chunk(i + m) == n;
                   ++m) {
                next_share();  // row i + m's share
              }
              // The calls' share of the next chunk goes half to q.k and half, with the side
              // lines, to p.v, so a kernel that spreads its lines over its steps (AVX2) gives
              // them out over the whole call. All to q.k, whose 64 dims x 2 tiles took them
              // one a step and the rest at once: in-process A/B (forty-second session, Zen 3),
              // the 4-sequence decode step at 4K 0.877-0.954x (four runs; 8K 0.903x, 8
              // sequences at 4K 0.915x), one and 16 sequences within noise.
              const int64_t share = line_end - first_line, qk_share = share / 2;
              ahead = {lines + first_line, qk_share};
              auto between = [&] {
                const cpu::Ahead sl = side_lines(m);
                pv_lines.assign(lines + first_line + qk_share, lines + line_end);
                pv_lines.insert(pv_lines.end(), sl.lines, sl.lines + sl.n);
                ahead = {pv_lines.data(), static_cast<int64_t>(pv_lines.size())};
              };
              if (pairs) {
                AttendChunk(a, p, pair_q.data() + i * hn * d, pair_qp_of(i), m * hn, kv, n,
                            scores.data(), pair_rec.data() + i * hn * stride, &ahead, between);
              } else {
                AttendChunk(a, p, q_of(i, h0), bf16 ? qp_of(i, h0) : nullptr, h1 - h0, kv, n,
                            scores.data(), rec_of(i, kvh), &ahead, between);
              }
              i += m - 1;
            }
          }
          std::swap(runs, next_runs);
          n_runs = n_next;
        }
        if (pairs) {
          for (int64_t i = 0; i < task.n_rows; ++i) {
            std::copy_n(pair_rec.data() + i * hn * stride, hn * stride, rec_of(i, kvh0));
          }
        }
      }
    }
  });

  // Merge each (row, head)'s range records in range order: rescale to the common max.
  pool.ParallelFor(total, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t row = r0; row < r1; ++row) {
      if (n_keys[row] == 0) continue;
      const int64_t ranges = (n_keys[row] + kRange - 1) / kRange;
      for (int64_t kvh = 0; kvh < a.n_kv_heads; ++kvh) {
        const auto [h0, h1] = heads_of(kvh);
        const float* base = records.data() + (rec0[row] + kvh * ranges * group) * stride;
        for (int64_t g = 0; g < h1 - h0; ++g) {
          float* o = a.out + (row * a.n_heads + h0 + g) * d;
          if (ranges == 1) {
            const float* r = base + g * stride;
            const float inv = 1.0f / r[1];
            for (int64_t i = 0; i < d; ++i) o[i] = r[2 + i] * inv;
            continue;
          }
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t s = 0; s < ranges; ++s) m = std::max(m, base[(s * group + g) * stride]);
          std::fill(o, o + d, 0.0f);
          float l = 0.0f;
          for (int64_t s = 0; s < ranges; ++s) {
            const float* r = base + (s * group + g) * stride;
            const float w = std::exp(r[0] - m);
            l += r[1] * w;
            for (int64_t i = 0; i < d; ++i) o[i] += r[2 + i] * w;
          }
          const float inv = 1.0f / l;
          for (int64_t i = 0; i < d; ++i) o[i] *= inv;
        }
      }
    }
  });
}

void AttentionCpu(const AttentionArgs& a, ThreadPool& pool) {
  // A contiguous cache is one block long enough for every position; its K is copied into the
  // block layout (transposed: [n_kv_heads, head_dim, positions]).
  const int32_t table[1] = {0};
  const int64_t positions = std::max<int64_t>(1, a.pos0 + a.tokens);
  thread_local std::vector<uint16_t> kt;
  kt.resize(static_cast<size_t>(a.n_kv_heads * a.head_dim * positions));
  for (int64_t p = 0; p < a.pos0 + a.tokens; ++p) {
    for (int64_t e = 0; e < a.n_kv_heads * a.head_dim; ++e)
      kt[e * positions + p] = a.k[p * a.kv_pos_stride + e];
  }
  const AttentionSeq seq{0, a.tokens, a.pos0, table};
  PagedAttentionCpu(
      {a.q, kt.data(), a.v, a.out, a.n_heads, a.n_kv_heads, a.head_dim, a.kv_pos_stride, positions,
       0, &seq, 1, a.scale, a.group, a.q_head0, a.kv_head0},
      pool);
}

}  // namespace kvmesh::kernels
