// The single-process generation engine: owns the model, tokenizer, chat template, thread pool
// and forward pass, and runs one request at a time (prefill, then sampled decode until an
// end-of-generation token or the token limit).
//
// Tensor and pipeline parallel: every rank creates an Engine with its TP group and the world.
// World rank r is TP rank r % tp of stage r / tp. World rank 0 (the leader) serves requests;
// each forward step is broadcast to the other ranks, which run ServeFollower() until the leader
// calls StopFollowers().
//
// Not thread safe: one request at a time. The serving engine (continuous batching) builds on
// the same LlamaForward and KV cache.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/thread_pool.h"
#include "model/chat_template.h"
#include "model/llama_model.h"
#include "model/sampler.h"
#include "model/tokenizer.h"
#include "worker/llama_forward.h"

namespace kvmesh::worker {

struct EngineOptions {
  std::string model_path;
  int threads = 0;                           // 0: the CPUs this process may use
  int64_t ctx_size = 0;                      // 0: the model's training context
  comm::Communicator* tp_comm = nullptr;     // this rank's TP group (not owned); null: one rank
  comm::Communicator* world_comm = nullptr;  // every rank (not owned): steps and pipeline links
  int pp = 1;                                // pipeline stages; world = pp x tp
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // token ids
  int32_t max_tokens = 256;
  bool ignore_eos = false;  // keep generating past end-of-generation tokens (benchmarks, tests)
  // Reuse the KV of the longest prefix this prompt shares with the engine's previous sequence
  // (a session's earlier turns): only the rest is prefilled. Off: a fresh context.
  bool reuse_prefix = false;
  bool return_logits = false;  // fill GenerateResult::first_logits (tests, debugging)
  model::SamplingParams sampling;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids, including a final end-of-generation token
  std::string text;             // detokenised generated text (without control tokens)
  std::string stop_reason;      // "eos" or "length"
  double prefill_ms = 0, decode_ms = 0;
  double comm_ms = 0;  // time in TP collectives during this request (0 with one rank)
  int64_t comm_calls = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;        // prompt tokens whose KV was reused (reuse_prefix)
  std::vector<float> first_logits;  // the prompt's last-position logits, if return_logits
};

class Engine {
 public:
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& opts);

  const model::LlamaModel& model() const { return *model_; }
  const model::Tokenizer& tokenizer() const { return *tokenizer_; }
  // Null if the model has no supported chat template.
  const model::ChatTemplate* chat_template() const { return chat_ ? &*chat_ : nullptr; }
  int threads() const { return pool_->size(); }
  int64_t ctx_size() const { return ctx_size_; }

  // Tokens of a user prompt rendered through the chat template (with generation prompt).
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(const std::string& user_message) const;

  // Generates from a fresh context. on_token (optional) sees each new token id as it is sampled.
  // InvalidArgument if the prompt is empty or does not leave room for one token in the context.
  absl::StatusOr<GenerateResult> Generate(const GenerateRequest& req,
                                          const std::function<void(int32_t)>& on_token = {});

  // Logits at the last position of `prompt` (raw, no template), n_vocab floats.
  absl::StatusOr<std::vector<float>> LastLogits(const std::vector<int32_t>& prompt);

  const model::TpShard& shard() const { return forward_->shard(); }
  bool is_leader() const { return world_ == nullptr || world_->rank() == 0; }
  // Followers (TP rank > 0): execute the leader's steps until it stops them. Blocks.
  absl::Status ServeFollower();
  // Leader: releases the followers (they return from ServeFollower). Call once, at the end.
  absl::Status StopFollowers();

 private:
  // kTruncate keeps the first n cached positions (n in the step header).
  enum class Op : int32_t { kStop = 0, kReset = 1, kForward = 2, kTruncate = 3 };
  Engine() = default;
  absl::Status CheckPrompt(const std::vector<int32_t>& prompt) const;
  // Leader: broadcasts the step to the followers, then runs it here.
  absl::Status Step(Op op, std::span<const int32_t> tokens, std::span<float> logits);
  absl::Status Execute(Op op, std::span<const int32_t> tokens, std::span<float> logits);

  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::optional<model::ChatTemplate> chat_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  std::unique_ptr<LlamaForward> forward_;
  std::unique_ptr<kvstore::KvCache> cache_;  // the current sequence
  std::vector<int32_t> cached_tokens_;       // tokens whose K/V fill cache_ (leader only)
  comm::Communicator* comm_ = nullptr;
  comm::Communicator* world_ = nullptr;
  int64_t ctx_size_ = 0;
};

}  // namespace kvmesh::worker
