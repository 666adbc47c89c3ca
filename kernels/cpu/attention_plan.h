// Internal: paged attention's plan (kernels/ops.h PlanPagedAttention), shared by the planning
// (attention_plan.cc) and the run (attention.cc): how the work is cut into tasks, units and the
// items threads claim, and the plan's contents.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/primitives.h"
#include "kernels/ops.h"

namespace kvmesh::kernels {
namespace paged_attention {

constexpr int64_t kKeyChunk = 64;  // scores kept per step of the online softmax
constexpr int64_t kRange = 512;    // keys are processed in aligned ranges [s * kRange, ...)
constexpr int64_t kMaxRowsPerTask = 32;
constexpr int64_t kSideBytes = 256 << 10;  // one-row units' bytes asked for per several-row unit
constexpr int64_t kSideLinesPerPass = 32;  // at most, per row pass of the several-row unit
constexpr int64_t kLineBytes = 64;         // a cache line
static_assert(kRange % kKeyChunk == 0);

// How the work is cut, and why outputs are batch invariant:
// - A query row with n keys attends to ranges [s * kRange, min((s + 1) * kRange, n)), each in
//   chunks of kKeyChunk keys starting at s * kRange, producing a partial softmax record per
//   (row, query head, range); the records are merged in range order. All of this depends only on
//   the row's key count, never on the batch or the thread count, so a row's output is
//   bit-identical alone, batched, or in any prefill chunking.
// - A task is (kv head, range, up to kMaxRowsPerTask rows whose keys in that range are the same
//   bytes: rows of one sequence, or rows of sequences whose block tables share those blocks).
//   It walks the range chunk by chunk and runs every row over each chunk while the chunk's K/V
//   are hot in L1: a shared prefix is read from memory once per task instead of once per row
//   (cascade attention), without changing any row's arithmetic.
// - Threads claim items (PlanItems): a unit (a task over some of its KV heads), or a several-row
//   unit with one-row units whose lines it asks for while it runs. Which thread runs a unit, and
//   when, changes no bits.

struct Task {
  int64_t s;          // range index
  int64_t first_row;  // rows [first_row, first_row + n_rows) of `rows`
  int64_t n_rows;
  const int32_t* table;  // a block table valid for the range (any row's: they agree there)
};

// A task over KV heads [kvh0, kvh1): what a thread runs. keys: how many of the task's range its
// rows reach (KeysInRange), found once when planning.
struct Unit {
  int64_t task, kvh0, kvh1, keys;
};

// A query range entry of one sequence (PlanPagedAttention's sort).
struct Entry {
  int64_t s, q, row0, row1;  // rows [row0, row1) of sequence q
  bool full;                 // every row covers the whole range
};

// Whether `heads` query heads (a task's rows x their heads of one KV head) are worth the lane
// kernels: the table has them, head dim 64 (there pv_f16 is a fused multiply-add chain like the
// lanes' p.v; other dims take GenericPv's separate multiply and add, other bits), fp32
// attention, and at least the table's lane_heads filling 7/8 of their vectors. With a third of
// the lanes idle (11 rows of 3 heads) they took 1.28x the pair passes' time, and 8 rows 1.20x;
// 16 rows 0.92-0.97x (in-process A/B, thirty-eighth session, Zen 4).
bool LaneWorthy(const PagedAttentionArgs& a, const cpu::Primitives& p, int64_t heads);

// Query heads per KV head: the args' group, else n_heads / n_kv_heads.
int64_t GroupOf(const PagedAttentionArgs& a);

}  // namespace paged_attention

struct PagedAttentionPlan::Impl {
  PagedAttentionArgs args;  // as planned, without q, k, v and out
  int64_t total = 0;        // rows
  // Per row: its key count and where its records start ([kv head][range][group] records).
  std::vector<int64_t> n_keys, rec0;
  std::vector<int64_t> rows;  // tasks' rows
  std::vector<paged_attention::Task> tasks;
  std::vector<paged_attention::Unit> units;
  std::vector<int64_t> seq, item;               // what threads claim (PlanItems)
  std::vector<paged_attention::Entry> entries;  // scratch of the planning
  std::vector<int64_t> task_keys;               // scratch: each task's KeysInRange
  std::vector<int64_t> lone_keys;               // scratch: the one-row tasks' keys
};

}  // namespace kvmesh::kernels
