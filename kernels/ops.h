// CPU kernels of the forward pass. Kernels take pointers, sizes and a thread pool; they
// allocate nothing except per-thread scratch for quantised activations.
//
// Shapes are written [rows, cols] row-major. Every kernel has a scalar path and, where the CPU
// has it, an AVX2 path selected at start (see isa.h); both are tested against each other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/thread_pool.h"

namespace kvmesh::kernels {

// out[r,:] = x[r,:] * rsqrt(mean(x[r,:]^2) + eps) * w.  x, out: [rows, cols]; may alias.
struct RmsNormArgs {
  const float* x;
  const float* w;
  float* out;
  int64_t rows, cols;
  float eps = 1e-5f;
};
void RmsNormCpu(const RmsNormArgs& a);

// Rotary position embedding in place, ggml "normal" mode: within each head, adjacent pairs
// (x[2i], x[2i+1]) for 2i < rot_dim are rotated by pos * theta_base^(-2i / rot_dim).
// x: [tokens, heads, head_dim]; pos: [tokens].
struct RopeArgs {
  float* x;
  const int32_t* pos;
  int64_t tokens, heads, head_dim, rot_dim;
  float theta_base = 10000.0f;
};
void RopeCpu(const RopeArgs& a);
// RopeCpu in two parts, for callers that rotate many tensors at the same positions (every layer
// of a batch): the table cs[t * rot_dim + 2i, + 1] = cos, sin of token t's angle for pair i,
// then the rotation of x ([tokens, heads, head_dim]) by it. Same bits as RopeCpu.
void RopeTableCpu(const int32_t* pos, int64_t tokens, int64_t rot_dim, float theta_base, float* cs);
void RopeApplyCpu(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t rot_dim,
                  const float* cs);

// Causal grouped-query attention over an fp16 KV cache, flash style (online softmax, no score
// matrix). q: [tokens, n_heads, head_dim]; out: same shape. K and V of kv head h, position p
// start at k + p * kv_pos_stride + h * head_dim (the cache is [positions, n_kv_heads, head_dim]).
// Query t sits at position pos0 + t and attends to positions [0, pos0 + t].
// Heads may be a tensor-parallel slice: local query head i is global head q_head0 + i and uses
// global KV head (q_head0 + i) / group, which is local KV head that minus kv_head0.
// group = 0 means n_heads / n_kv_heads (no slicing).
struct AttentionArgs {
  const float* q;
  const uint16_t* k;
  const uint16_t* v;
  float* out;
  int64_t tokens, n_heads, n_kv_heads, head_dim;
  int64_t kv_pos_stride;
  int64_t pos0;
  float scale;
  int64_t group = 0, q_head0 = 0, kv_head0 = 0;
};
void AttentionCpu(const AttentionArgs& a, ThreadPool& pool);

// One sequence of a batched attention call: its queries are rows [token0, token0 + tokens) of
// q/out, at positions [pos0, pos0 + tokens); its K/V positions live in the blocks of
// block_table (position p in block block_table[p / block_size], slot p % block_size).
struct AttentionSeq {
  int64_t token0, tokens, pos0;
  const int32_t* block_table;
};

// The same attention for a batch of sequences over a paged cache. k / v are one layer's K / V
// in block 0. V of position p, kv head h of a sequence starts at
//   v + block_table[p / block_size] * block_stride + (p % block_size) * pos_stride + h * head_dim;
// K is transposed within a block ([n_kv_heads, head_dim, block_size]): its dim i is at
//   k + block_table[p / block_size] * block_stride + (h * head_dim + i) * block_size
//     + p % block_size,
// so the keys of a block are contiguous per dim and q.k runs across keys in vector lanes.
// q, out: [total tokens, n_heads, head_dim]. Every sequence's new K/V must already be written.
struct PagedAttentionArgs {
  const float* q;
  const uint16_t* k;
  const uint16_t* v;
  float* out;
  int64_t n_heads, n_kv_heads, head_dim;
  int64_t pos_stride, block_size, block_stride;
  const AttentionSeq* seqs;
  int64_t n_seqs;
  float scale;
  int64_t group = 0, q_head0 = 0, kv_head0 = 0;
  // bf16 attention (opt-in): q (scaled), K, the softmax weights and V rounded to bf16, products
  // exact, sums in fp32 (kernels/cpu/primitives.h qk_bf16 / pv_bf16): the numerics of
  // FlashAttention on GPUs serving a bf16 model, at twice the multiply-add rate on CPUs with
  // AVX-512 BF16. Off: the fp16 cache's values with fp32 arithmetic. On, the cache holds bf16
  // pairs (same offsets of blocks, heads and the K / V halves; block_size a multiple of 16, even
  // head_dim): K's dims 2i, 2i + 1 of slot p side by side at
  //   k + block * block_stride + (h * head_dim + 2i) * block_size + 2p (+ 1 for dim 2i + 1),
  // V's slots 2m, 2m + 1 of dim i side by side at
  //   v + block * block_stride + 2m * pos_stride + 2 * (h * head_dim + i) (+ 1 for slot 2m + 1).
  // Callers check block_size and head_dim (worker::Engine::Create does); the kernels do not.
  bool bf16 = false;
};
void PagedAttentionCpu(const PagedAttentionArgs& a, ThreadPool& pool);

// Plan / run split of PagedAttentionCpu. A plan holds a call's arguments but q, k, v and out,
// and the work cut from them: the tasks and the order the threads claim them. None of it depends
// on a layer's K/V or queries, so one plan serves every layer of a step. It points into the
// sequences' block tables, which must outlive it unchanged (shared prefixes are found by
// comparing block ids). The thread count it was made for only steers how work is cut: a plan
// run on another pool gives the same bits. Not thread-safe to re-plan while a run uses it; a
// plan may be run by several callers at once (each run's scratch is its calling thread's).
class PagedAttentionPlan {
 public:
  PagedAttentionPlan();
  ~PagedAttentionPlan();
  PagedAttentionPlan(PagedAttentionPlan&&) noexcept;
  PagedAttentionPlan& operator=(PagedAttentionPlan&&) noexcept;

  // Whether PlanPagedAttention has filled it.
  bool planned() const { return impl_ != nullptr; }

 private:
  struct Impl;
  friend void PlanPagedAttention(const PagedAttentionArgs&, int, PagedAttentionPlan&);
  friend void PagedAttentionCpu(const PagedAttentionPlan&, const float*, const uint16_t*,
                                const uint16_t*, float*, ThreadPool&);
  std::unique_ptr<Impl> impl_;
};
// Fills `plan` (reusing its storage) for `a` (its q, k, v and out are not read) on a pool of
// n_threads.
void PlanPagedAttention(const PagedAttentionArgs& a, int n_threads, PagedAttentionPlan& plan);
// PagedAttentionCpu of the planned arguments with these q, k, v and out (one layer's); the same
// bits as planning afresh. `plan` must be planned().
void PagedAttentionCpu(const PagedAttentionPlan& plan, const float* q, const uint16_t* k,
                       const uint16_t* v, float* out, ThreadPool& pool);
// Units (a task's rows over one KV head) run with their query heads in vector lanes since the
// process started (engine.md "Attention"): lets tests see that they took that path.
int64_t PagedAttentionLaneUnits();

// out[i] = silu(gate[i]) * up[i] for i < n.
void SwiGluCpu(const float* gate, const float* up, float* out, int64_t n);

// x[i] += y[i] for i < n.
void AddInPlaceCpu(float* x, const float* y, int64_t n);

// dst[i] = fp16(src[i]).
void ConvertToFp16Cpu(const float* src, uint16_t* dst, int64_t n);
// The first index of the largest of x[0, n); a NaN is never chosen (0 if every value is NaN).
int64_t ArgMaxCpu(const float* x, int64_t n);
// dst[i] = bf16(src[i]): round to nearest even, magnitudes below 2^-60 to zero
// (kernels/cpu/primitives.h Bf16Of).
void ConvertToBf16Cpu(const float* src, uint16_t* dst, int64_t n);

}  // namespace kvmesh::kernels
