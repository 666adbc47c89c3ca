// The Llama forward pass on CPU: embedding, per layer RMSNorm -> QKV -> RoPE -> attention over
// the KV cache -> output projection -> residual -> RMSNorm -> SwiGLU MLP -> residual, then the
// final norm and the (tied) LM head.
//
// With a tensor-parallel shard, each rank runs its slice of every layer and the partial outputs
// of the O and down projections are summed over `comm` (two all-reduces per layer); the LM
// head's vocabulary slices are gathered on rank 0. Every rank of the group must make the same
// sequence of Forward calls.
//
// Holds scratch buffers, so one LlamaForward serves one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "kernels/ops.h"
#include "kernels/packed.h"
#include "kernels/thread_pool.h"
#include "kvstore/block_arena.h"
#include "model/llama_model.h"
#include "model/shard.h"
#include "util/aligned_vector.h"
#include "util/huge_pages.h"
#include "worker/phase_times.h"
#include "worker/step_plan.h"

namespace kvmesh::worker {

// This rank's place in a pipeline: its stage and the world ranks it exchanges with.
struct PipelinePlace {
  model::PipelineStage stage;           // n_stages == 1 (the default): every layer, no exchange
  comm::Communicator* world = nullptr;  // point-to-point between stages (not owned)
  int prev = -1, next = -1;             // world ranks of this TP rank in the previous / next stage
  int logits_to = -1;    // on the last stage's TP rank 0: the leader's world rank (if not itself)
  int logits_from = -1;  // on the leader: the last stage's TP rank 0 (if not itself)
};

// Wall time inside the TP collectives (a rank's own view). The waiting / transfer split compares
// steady-clock stamps of the ranks, which only processes of one machine share: across machines
// the *_wait_s figures are meaningless.
struct CommStats {
  double allreduce_s = 0;       // in the per-layer all-reduces, waiting included
  double allreduce_wait_s = 0;  // of which before the last rank arrived: waiting for slower
                                // ranks (uneven work, scheduling), not moving data
  int64_t allreduces = 0;
  double gather_s = 0;       // gathering the LM head's vocabulary slices on TP rank 0
  double gather_wait_s = 0;  // of which before the last rank arrived (TP rank 0 only)
  int64_t gathers = 0;
  double total_s() const { return allreduce_s + gather_s; }
};

class LlamaForward {
 public:
  // Prefill is processed in micro-batches of at most max_batch tokens (bounds scratch memory).
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool, int64_t max_batch = 512);
  // A tensor-parallel rank: `shard` says which slice; `comm` is the TP group (size tp_size).
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
               const model::TpShard& shard, comm::Communicator* comm, int64_t max_batch = 512);
  // A rank of stage `place.stage` of a pipeline (and of a TP group within the stage). Stages
  // pass hidden states [tokens, n_embd] forward with Send/Recv, one micro-batch at a time.
  // act_bits: the activations' width in the packed products (kernels/packed.h ActBits).
  // repack: whether the matrices are repacked for the packed kernels where the ISA has them
  // (false: the file's row-major blocks, no extra bytes; the products' bits differ).
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
               const model::TpShard& shard, comm::Communicator* comm, const PipelinePlace& place,
               int64_t max_batch = 512, kernels::ActBits act_bits = kernels::ActBits::k16,
               bool repack = true);
  // Layers this rank runs (the arena passed to Forward must have this many).
  int64_t n_layers() const { return place_.stage.layer_end - place_.stage.layer_begin; }

  // KV heads this rank caches (the arena passed to Forward must have this many).
  int64_t n_kv_heads() const { return shard_.kv_head_end - shard_.kv_head_begin; }
  const model::TpShard& shard() const { return shard_; }
  // Whether any product runs against 8-bit activations (asked for, and this ISA packs).
  bool eight_bit_activations() const { return eight_bit_; }
  // Whether any matrix was repacked (and so runs the packed kernels).
  bool repacked() const { return packed_bytes_ > 0; }
  // Bytes of this rank's repacked matrices (0 without repacking): memory on top of the mapped
  // file's pages that the packed matrices' rows still use (kernels/packed.h).
  int64_t packed_bytes() const { return packed_bytes_; }
  // Time inside this rank's TP collectives since construction.
  const CommStats& comm_stats() const { return comm_stats_; }
  // Wall time of Forward by phase since construction, counted while enabled.
  void set_phase_times(bool on) { time_phases_ = on; }
  // Attention on bf16 operands (kernels/ops.h PagedAttentionArgs::bf16); off by default.
  void set_bf16_attention(bool on) { bf16_attention_ = on; }
  bool bf16_attention() const { return bf16_attention_; }
  const PhaseTimes& phase_times() const { return phase_times_; }

  // Runs one step's batch of sequence chunks (plan.copies are the caller's): chunk i's tokens
  // at positions [pos0, pos0 + n_tokens), writing their K/V into its blocks of `arena` and
  // attending over positions [0, pos0 + t] of the same blocks. If the plan wants logits,
  // `logits` holds plan.n_logits() rows of n_vocab floats, one per chunk with want_logits in
  // plan order, filled on the leader (TP rank 0 of stage 0).
  // InvalidArgument for a malformed plan (bad token id, table not covering the positions, wrong
  // logits size); nothing is written to the arena then.
  // With `logits_pending` (pipelined steps): where the logits come from a later stage, their
  // receive is posted into `logits` and returned there instead of waited for; the caller keeps
  // `logits` alive until it has waited.
  absl::Status Forward(const StepPlan& plan, kvstore::KvBlockArena& arena, std::span<float> logits,
                       std::unique_ptr<comm::PendingRecv>* logits_pending = nullptr);

 private:
  // Runs rows [b, b + n) of the plan's tokens through this rank's layers.
  absl::Status Batch(const StepPlan& plan, int64_t b, int64_t n, kvstore::KvBlockArena& arena,
                     PhaseClock& clock);
  absl::Status AllReduce(int64_t n);  // sums tmp_[0, n) over the TP group
  kernels::WeightMatrix Materialise(const kernels::WeightMatrix& w);  // copy into owned_
  static double Since(std::chrono::steady_clock::time_point t0);
  static void Stamp(std::chrono::steady_clock::time_point t, float* out);
  static int64_t Unstamp(std::chrono::steady_clock::time_point near, const float* in);
  static double Waited(std::chrono::steady_clock::time_point enter, int64_t last, double in_call);

  const model::LlamaModel& model_;
  kernels::ThreadPool& pool_;
  const int64_t max_batch_;
  bool eight_bit_ = false;
  int64_t packed_bytes_ = 0;
  bool bf16_attention_ = false;
  model::TpShard shard_;
  comm::Communicator* comm_ = nullptr;  // null: one rank
  PipelinePlace place_;
  std::vector<model::LlamaLayer> layers_;  // this rank's views
  // Rank-owned weight bytes: the packed matrices, in one huge-page region; or (without a packed
  // kernel) the column slices O and down of a TP shard copied into contiguous rows.
  util::HugePageRegion packed_;
  std::vector<std::vector<uint8_t>> owned_;
  kernels::WeightMatrix output_;
  util::AlignedVector<float> local_logits_;
  std::vector<int> vocab_counts_;
  CommStats comm_stats_;
  bool time_phases_ = false;
  PhaseTimes phase_times_;
  // The rows' activations, each buffer starting on a cache line (util/aligned_vector.h).
  util::AlignedVector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
  std::vector<int32_t> pos_;
  // Per plan row: its chunk and, for the last stage, which logits row it feeds (-1: none).
  std::vector<int32_t> chunk_of_row_, out_of_row_;
  std::vector<int64_t> chunk_row0_;  // first plan row of each chunk
  std::vector<kernels::AttentionSeq> segs_;
  // Attention's plan for segs_, made once per batch and run by every layer.
  kernels::PagedAttentionPlan attn_plan_;
  std::vector<int64_t> kv_at_;   // per micro-batch row: its V slot's offset in a layer
  std::vector<int64_t> k_at_;    // ... and its K slot's (dim 0; dim e at + e * block_size)
  std::vector<uint16_t> k16_;    // the rows' K in fp16, before each is spread over its block
  std::vector<float> rope_cs_;   // the rows' rotary cos/sin (kernels::RopeTableCpu)
  std::vector<float> gathered_;  // TP rank 0: every rank's logits slices, rank-major
  // [n_logits, n_embd] final hidden states of the logits rows.
  util::AlignedVector<float> hidden_out_;
};

}  // namespace kvmesh::worker
