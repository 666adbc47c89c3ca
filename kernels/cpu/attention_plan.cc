// Paged attention's planning (kernels/ops.h PlanPagedAttention; attention_plan.h): a batch's
// rows into tasks over key ranges (a shared prefix's rows together), units over KV heads, and
// the items threads claim. attention.cc runs the plan.
#include "kernels/cpu/attention_plan.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace kvmesh::kernels {
namespace paged_attention {

bool LaneWorthy(const PagedAttentionArgs& a, const cpu::Primitives& p, int64_t heads) {
  return !a.bf16 && a.head_dim == 64 && p.qk_lanes != nullptr && p.exp_lanes != nullptr &&
         p.pv_lanes != nullptr && p.transpose_f32 != nullptr && heads >= p.lane_heads &&
         8 * heads >= 7 * ((heads + 15) / 16 * 16);
}

int64_t GroupOf(const PagedAttentionArgs& a) {
  return a.group > 0 ? a.group : a.n_heads / a.n_kv_heads;
}

}  // namespace paged_attention

namespace {

using paged_attention::Entry;
using paged_attention::GroupOf;
using paged_attention::kKeyChunk;
using paged_attention::kLineBytes;
using paged_attention::kMaxRowsPerTask;
using paged_attention::kRange;
using paged_attention::kSideBytes;
using paged_attention::kSideLinesPerPass;
using paged_attention::LaneWorthy;
using paged_attention::Task;
using paged_attention::Unit;

// Whether blocks covering keys [j0, j1) are the same in both tables.
bool SameBlocks(const PagedAttentionArgs& a, const int32_t* x, const int32_t* y, int64_t j0,
                int64_t j1) {
  const int64_t b0 = j0 / a.block_size, b1 = (j1 - 1) / a.block_size + 1;
  return x == y || std::memcmp(x + b0, y + b0, sizeof(int32_t) * (b1 - b0)) == 0;
}

// The keys of a task's range that its rows reach (rows may differ: the most).
int64_t KeysInRange(const Task& t, const std::vector<int64_t>& rows,
                    const std::vector<int64_t>& n_keys) {
  int64_t keys = 0;
  for (int64_t i = 0; i < t.n_rows; ++i) {
    keys = std::max(keys, std::min(kRange, n_keys[rows[t.first_row + i]] - t.s * kRange));
  }
  return keys;
}

// The last kTailUnitsPerThread x threads one-row units stay items of their own, claimed last:
// small items that fill the end of the step when the threads' several-row items finish at
// different times (one of two threads was idle for 7.5-17% of a 16-sequence layer's attention,
// TSC timers). Alternating inside one process (15th session, Zen 3; bench/ab_inprocess.patch),
// against every one-row unit bundled: BM_PagedAttentionSharedDecode 1024/16/2/100 0.93-0.95x,
// 1024/16/2/16 0.96-0.99x, 4096/16/2/16 0.98-0.99x, 4096/16/2/100 1.00x. With 1 or 2 per thread
// 0.94-1.00x, with 6 the same as 4, with all 16 unbundled 1.04x 4's time at 1024/16/2/100; the
// whole 16-sequence decode step at 1K 0.97-1.06x (median 0.99x, five windows of 96 steps).
constexpr int64_t kTailUnitsPerThread = 4;

// What threads claim: item k is units seq[item[k], item[k + 1]). Where there are both
// several-row units (bound by arithmetic: a shared prefix) and one-row units (bound by memory:
// each sequence's own keys), an item is a several-row unit followed by one-row units of up to
// kSideBytes, and no more lines than kSideLinesPerPass per row pass of the several-row unit:
// the thread asks for their lines a few at a time while the several-row unit runs, so they come
// from its cache when their turn comes (16 sequences over 1K shared keys with 100 of their own,
// BM_PagedAttentionSharedDecode/1024/16/2/100: ~6% less time). Every other unit is an item, the
// last one-row units among them (kTailUnitsPerThread, above).
void PlanItems(const std::vector<Task>& tasks, const std::vector<Unit>& units, int64_t d,
               int n_threads, std::vector<int64_t>& seq, std::vector<int64_t>& item) {
  thread_local std::vector<int64_t> multi, lone, alone;
  multi.clear();
  lone.clear();
  alone.clear();
  seq.clear();
  item.clear();
  for (int64_t u = 0; u < static_cast<int64_t>(units.size()); ++u) {
    (tasks[units[u].task].n_rows > 1 ? multi : lone).push_back(u);
  }
  auto bytes_of = [&](int64_t u) {  // K and V of a one-row unit's keys for its KV heads
    return units[u].keys * (units[u].kvh1 - units[u].kvh0) * 2 * d *
           static_cast<int64_t>(sizeof(uint16_t));
  };
  const size_t bundled =
      lone.size() - std::min(lone.size(), static_cast<size_t>(kTailUnitsPerThread * n_threads));
  size_t next = 0;
  for (const int64_t m : multi) {
    item.push_back(static_cast<int64_t>(seq.size()));
    seq.push_back(m);
    const int64_t passes = (units[m].keys + kKeyChunk - 1) / kKeyChunk *
                           (units[m].kvh1 - units[m].kvh0) * tasks[units[m].task].n_rows;
    const int64_t budget = std::min(kSideBytes, passes * kSideLinesPerPass * kLineBytes);
    for (int64_t bytes = 0; next < bundled; ++next) {
      const int64_t b = bytes_of(lone[next]);
      if (b > kSideBytes) {
        alone.push_back(lone[next]);
        continue;
      }
      if (bytes + b > budget) break;
      bytes += b;
      seq.push_back(lone[next]);
    }
  }
  for (; next < lone.size(); ++next) alone.push_back(lone[next]);
  for (const int64_t u : alone) {
    item.push_back(static_cast<int64_t>(seq.size()));
    seq.push_back(u);
  }
  item.push_back(static_cast<int64_t>(seq.size()));
}

// Whether one-row tasks of these key counts (in claiming order) finish sooner as units of all
// kv_heads KV heads than as one unit per head, on n_threads threads each taking the next unit
// when free. All heads together read each block as one stream (ForEachHeadsLine), taken here
// as kAllHeadsCost of the per-head time, but in fewer, larger units, which can leave a thread
// idle at the end. Zen 3, in-process A/B against per head (forty-third session):
// BM_PagedAttentionSharedDecode/512/1/2/88 (a 512-key unit and an 88-key one) 1.16x if forced,
// which this rule does not; 1536/1/2/100 0.94x if forced, which it does (at 0.85 it did not);
// 1024/1/2/16|100 0.86x and 0.87x (another run 0.94x and 0.96x); one sequence's decode step
// at 1K 0.918x and 0.953x (two runs, 48 steps of each).
constexpr double kAllHeadsCost = 0.8;
bool AllHeadsBalance(const std::vector<int64_t>& keys, int64_t kv_heads, int n_threads) {
  thread_local std::vector<double> busy;
  auto makespan = [&](int64_t per_unit, double cost) {
    busy.assign(static_cast<size_t>(std::max(1, n_threads)), 0.0);
    for (const int64_t k : keys) {
      for (int64_t h = 0; h < kv_heads / per_unit; ++h) {
        *std::min_element(busy.begin(), busy.end()) += cost * static_cast<double>(k * per_unit);
      }
    }
    return *std::max_element(busy.begin(), busy.end());
  };
  return makespan(kv_heads, kAllHeadsCost) < makespan(1, 1.0);
}

}  // namespace

PagedAttentionPlan::PagedAttentionPlan() = default;
PagedAttentionPlan::~PagedAttentionPlan() = default;
PagedAttentionPlan::PagedAttentionPlan(PagedAttentionPlan&&) noexcept = default;
PagedAttentionPlan& PagedAttentionPlan::operator=(PagedAttentionPlan&&) noexcept = default;

void PlanPagedAttention(const PagedAttentionArgs& a, int n_threads, PagedAttentionPlan& plan) {
  if (plan.impl_ == nullptr) plan.impl_ = std::make_unique<PagedAttentionPlan::Impl>();
  PagedAttentionPlan::Impl& pl = *plan.impl_;
  const int64_t group = GroupOf(a);
  int64_t total = 0;
  for (int64_t s = 0; s < a.n_seqs; ++s) {
    total = std::max(total, a.seqs[s].token0 + a.seqs[s].tokens);
  }
  pl.args = a;
  pl.args.q = pl.args.out = nullptr;
  pl.args.k = pl.args.v = nullptr;
  pl.total = total;
  std::vector<int64_t>& n_keys = pl.n_keys;
  std::vector<int64_t>& rec0 = pl.rec0;
  std::vector<int64_t>& rows = pl.rows;
  std::vector<Task>& tasks = pl.tasks;
  n_keys.assign(static_cast<size_t>(total), 0);
  rec0.assign(static_cast<size_t>(total + 1), 0);
  for (int64_t q = 0; q < a.n_seqs; ++q) {
    for (int64_t t = 0; t < a.seqs[q].tokens; ++t)
      n_keys[a.seqs[q].token0 + t] = a.seqs[q].pos0 + t + 1;
  }
  for (int64_t row = 0; row < total; ++row) {
    const int64_t ranges = (n_keys[row] + kRange - 1) / kRange;
    rec0[row + 1] = rec0[row] + a.n_kv_heads * ranges * group;
  }

  // Tasks: for each sequence and range, the rows that reach into that range (its later rows).
  // Full ranges of different sequences with the same blocks are merged (a shared prefix).
  std::vector<Entry>& entries = pl.entries;
  entries.clear();
  for (int64_t q = 0; q < a.n_seqs; ++q) {
    const AttentionSeq& sq = a.seqs[q];
    if (sq.tokens <= 0) continue;
    const int64_t max_keys = sq.pos0 + sq.tokens;
    for (int64_t s = 0; s * kRange < max_keys; ++s) {
      // First row whose keys reach past s * kRange: key count pos0 + t + 1 > s * kRange.
      const int64_t t0 = std::max<int64_t>(0, s * kRange - sq.pos0);
      entries.push_back(
          {s, q, sq.token0 + t0, sq.token0 + sq.tokens, sq.pos0 + t0 + 1 >= (s + 1) * kRange});
    }
  }
  // Bring equal full ranges together: by range, then by the range's block ids.
  std::stable_sort(entries.begin(), entries.end(), [&](const Entry& x, const Entry& y) {
    if (x.s != y.s) return x.s < y.s;
    if (x.full != y.full) return x.full;
    if (!x.full) return x.q < y.q;
    const int64_t b0 = x.s * kRange / a.block_size,
                  b1 = ((x.s + 1) * kRange - 1) / a.block_size + 1;
    return std::lexicographical_compare(a.seqs[x.q].block_table + b0, a.seqs[x.q].block_table + b1,
                                        a.seqs[y.q].block_table + b0, a.seqs[y.q].block_table + b1);
  });
  tasks.clear();
  rows.clear();
  // A run of rows over the same keys longer than kMaxRowsPerTask is cut into tasks of near-equal
  // size where every one of them is then worth the lane kernels (50 rows of 3 heads: 25 + 25,
  // not 32 + 18 of which only the 32 is), else left as cut (34 rows: 32 + 2, since 17 + 17 would
  // leave no task in lanes). The run's tasks see the same blocks in their range, so any one's
  // table serves each.
  const auto& prims = cpu::Prims();
  size_t run_begin = 0;  // the current run's first task
  auto even_out = [&](size_t run_end) {
    const auto k = static_cast<int64_t>(run_end - run_begin);
    if (k < 2) return;
    int64_t run_rows = 0;
    for (size_t t = run_begin; t < run_end; ++t) run_rows += tasks[t].n_rows;
    // The smaller tasks of the even cut have run_rows / k rows.
    if (!LaneWorthy(a, prims, run_rows / k * group) ||
        !LaneWorthy(a, prims, (run_rows + k - 1) / k * group)) {
      return;
    }
    int64_t first = tasks[run_begin].first_row;
    for (int64_t t = 0; t < k; ++t) {
      Task& task = tasks[run_begin + static_cast<size_t>(t)];
      task.first_row = first;
      task.n_rows = run_rows / k + (t < run_rows % k ? 1 : 0);
      first += task.n_rows;
    }
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const bool joins = i > 0 && e.full && entries[i - 1].full && entries[i - 1].s == e.s &&
                       SameBlocks(a, a.seqs[entries[i - 1].q].block_table, a.seqs[e.q].block_table,
                                  e.s * kRange, (e.s + 1) * kRange);
    for (int64_t row = e.row0; row < e.row1; ++row) {
      const bool fresh = tasks.empty() || (row == e.row0 && !joins);
      if (fresh || tasks.back().n_rows == kMaxRowsPerTask) {
        if (fresh) {
          even_out(tasks.size());
          run_begin = tasks.size();
        }
        tasks.push_back({e.s, static_cast<int64_t>(rows.size()), 0, a.seqs[e.q].block_table});
      }
      rows.push_back(row);
      ++tasks.back().n_rows;
    }
  }
  even_out(tasks.size());

  // Tasks differ in size (shared ranges, triangular prefill), so threads take them dynamically.
  // A unit is a task and KV heads [kvh0, kvh1): one head for a task of several rows (the
  // arithmetic, split over the threads); every head for a task of one row when there are enough
  // such tasks to keep the threads busy (4 a thread, or fewer where AllHeadsBalance finds the
  // threads still evenly loaded): its chunks then read each block's K and V of all heads
  // (adjacent in the block) together, which the hardware prefetcher streams (one sequence
  // after 4K tokens, BM_PagedAttentionSharedDecode/4096/1: 3% to 40% faster, the more the
  // slower this shared machine's memory is at the time).
  std::vector<Unit>& units = pl.units;
  units.clear();
  std::vector<int64_t>& task_keys = pl.task_keys;
  std::vector<int64_t>& lone_keys = pl.lone_keys;
  task_keys.clear();
  lone_keys.clear();
  for (const Task& t : tasks) {
    task_keys.push_back(KeysInRange(t, rows, n_keys));
    if (t.n_rows == 1) lone_keys.push_back(task_keys.back());
  }
  const bool all_heads =
      a.block_size % 16 == 0 && (static_cast<int64_t>(lone_keys.size()) >= 4 * n_threads ||
                                 AllHeadsBalance(lone_keys, a.n_kv_heads, n_threads));
  for (int64_t t = 0; t < static_cast<int64_t>(tasks.size()); ++t) {
    const int64_t keys = task_keys[t];
    if (tasks[t].n_rows == 1 && all_heads) {
      units.push_back({t, 0, a.n_kv_heads, keys});
    } else {
      for (int64_t h = 0; h < a.n_kv_heads; ++h) units.push_back({t, h, h + 1, keys});
    }
  }
  PlanItems(tasks, units, a.head_dim, n_threads, pl.seq, pl.item);
}

}  // namespace kvmesh::kernels
