// One rank's engine: owns the model, tokenizer, chat template, thread pool, forward pass and this
// rank's KV block arena, and executes step plans (worker/step_plan.h).
//
// Tensor and pipeline parallel: every rank creates an Engine with its TP group and the world.
// World rank r is TP rank r % tp of stage r / tp. World rank 0 (the leader) plans the steps (the
// serving scheduler); Step() broadcasts each plan to the other ranks, which run ServeFollower()
// until the leader calls StopFollowers(). Every rank's arena has the same number of blocks, so
// block ids in a plan mean the same on every rank.
//
// Not thread safe: the leader's scheduler thread calls Step().
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/thread_pool.h"
#include "kvstore/block_arena.h"
#include "model/chat_template.h"
#include "model/llama_model.h"
#include "model/tokenizer.h"
#include "worker/llama_forward.h"
#include "worker/step_plan.h"

namespace kvmesh::worker {

struct EngineOptions {
  std::string model_path;
  int threads = 0;                           // 0: the CPUs this process may use
  int64_t ctx_size = 0;                      // 0: the model's training context
  comm::Communicator* tp_comm = nullptr;     // this rank's TP group (not owned); null: one rank
  comm::Communicator* world_comm = nullptr;  // every rank (not owned): steps and pipeline links
  int pp = 1;                                // pipeline stages; world = pp x tp
  int64_t kv_cache_bytes = 512ll << 20;      // KV block memory per rank
  int32_t block_size = 16;                   // token positions per KV block
  // Activations of the Q4_0 / Q4_1 products: 16 bits (exact to ~1e-3) or 8 (ggml's numerics,
  // faster when batched; kernels/packed.h ActBits).
  int activation_bits = 16;
  // Attention's operands: 32 (the fp16 cache's values, fp32 arithmetic; the reference) or 16
  // (q, K, the softmax weights and V rounded to bf16, exact products, fp32 sums: FlashAttention's
  // numerics for a bf16 model; twice the multiply-add rate with AVX-512 BF16, so faster when many
  // sequences share a context; kernels/ops.h PagedAttentionArgs::bf16).
  int attention_bits = 32;
  // Repack the integer-path matrices for the packed kernels (kernels/packed.h) where the ISA has
  // them: the default, faster at every batch size. False keeps the file's row-major blocks: no
  // extra bytes where packing adds them (the K-quants: Q4_K a third more, Q5_K and Q6_K up to
  // twice), other bits, and no 8-bit activations.
  bool repack_weights = true;
  // Time the forward passes by phase (Engine::phase_times); off, no clock is read.
  bool phase_times = false;
};

class Engine {
 public:
  // InvalidArgument naming the option for bad options; the model loader's errors otherwise.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& opts);

  const model::LlamaModel& model() const { return *model_; }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null if the model has no supported chat template.
  const model::ChatTemplate* chat_template() const { return chat_ ? &*chat_ : nullptr; }
  int threads() const { return pool_->size(); }
  int64_t ctx_size() const { return ctx_size_; }
  int32_t n_blocks() const { return arena_->n_blocks(); }
  int32_t block_size() const { return static_cast<int32_t>(arena_->shape().block_size); }
  // KV bytes per token summed over the whole model (every layer and KV head, one copy).
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
  // 8 if the products run against 8-bit activations (asked for, and this ISA packs), else 16.
  int activation_bits() const { return forward_->eight_bit_activations() ? 8 : 16; }
  // 16 if attention runs on bf16 operands (EngineOptions::attention_bits), else 32.
  int attention_bits() const { return forward_->bf16_attention() ? 16 : 32; }
  // Whether the weights were repacked for the packed kernels (EngineOptions::repack_weights).
  bool repacked() const { return forward_->repacked(); }
  // Bytes of the repacked copies of this rank's matrices (LlamaForward::packed_bytes).
  int64_t packed_weight_bytes() const { return forward_->packed_bytes(); }
  // Names the model, shard layout and KV format: the root of block names (kvstore/block_hash.h).
  const std::string& cache_salt() const { return cache_salt_; }

  // Tokens of a user prompt rendered through the chat template (with generation prompt).
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(const std::string& user_message) const;

  // Leader: runs one step on every rank (broadcasts the plan, then executes it here) and fills
  // `logits` with plan.n_logits() rows of n_vocab floats. Blocks until this rank's part is done.
  // InvalidArgument for a malformed plan (rejected on every rank, the group stays in step);
  // Unavailable if a peer is gone.
  absl::Status Step(const StepPlan& plan, std::span<float> logits);
  // The checks Step() makes of a plan before any collective: InvalidArgument if it names blocks,
  // tokens or sizes this engine does not have.
  absl::Status Validate(const StepPlan& plan) const;

  // Pipelined steps (the leader, pp > 1): StartStep broadcasts the plan and runs this rank's
  // stage, leaving the logits' receive from the last stage posted; FinishStep waits for the
  // oldest started step and returns its plan.n_logits() rows of logits. While stage 1 runs
  // step i, stage 0 already runs step i + 1. Steps finish in the order they started; Step()
  // refuses to run while any is unfinished. Without stages, StartStep runs the whole step.
  // A failure (a malformed plan, a lost peer) is returned by the step's FinishStep.
  void StartStep(const StepPlan& plan);
  absl::StatusOr<std::vector<float>> FinishStep();
  int steps_in_flight() const { return static_cast<int>(in_flight_.size()); }

  const model::TpShard& shard() const { return forward_->shard(); }
  bool is_leader() const { return world_ == nullptr || world_->rank() == 0; }
  int pipeline_stages() const { return pp_; }
  // Followers: execute the leader's steps until it stops them. Blocks. Returns the error of a
  // step that failed after its plan was validated (the rank is out of step with its group).
  absl::Status ServeFollower();
  // Leader: releases the followers (they return from ServeFollower). Call once, at the end.
  absl::Status StopFollowers();
  // Time in TP collectives since construction (see CommStats).
  const CommStats& comm_stats() const { return forward_->comm_stats(); }
  // This rank's forward time by phase since construction (all zero unless
  // EngineOptions::phase_times).
  const PhaseTimes& phase_times() const { return forward_->phase_times(); }

 private:
  Engine() = default;
  absl::Status Execute(const StepPlan& plan, std::span<float> logits,
                       std::unique_ptr<comm::PendingRecv>* logits_pending = nullptr);
  absl::Status BroadcastPlan(const StepPlan& plan);

  // A started step: its logits (filled by the posted receive, or already here) and status.
  struct InFlight {
    std::vector<float> logits;
    std::unique_ptr<comm::PendingRecv> recv;
    absl::Status status;
  };
  std::deque<InFlight> in_flight_;

  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::optional<model::ChatTemplate> chat_;
  std::string no_chat_reason_;  // why chat_ is empty
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<kvstore::KvBlockArena> arena_;
  comm::Communicator* comm_ = nullptr;
  comm::Communicator* world_ = nullptr;
  int64_t ctx_size_ = 0;
  int pp_ = 1;
  int64_t kv_bytes_per_token_ = 0;
  std::string cache_salt_;
};

}  // namespace kvmesh::worker
