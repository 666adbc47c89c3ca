#include "serving/serving_engine.h"

#include <optional>

namespace kvmesh::serving {

ServingEngine::ServingEngine(worker::Engine& engine, const ServingOptions& opts) : engine_(engine) {
  SchedulerOptions so;
  so.n_blocks = engine.n_blocks();
  so.block_size = engine.block_size();
  so.max_context = engine.ctx_size();
  so.n_vocab = static_cast<int32_t>(engine.model().config().n_vocab);
  so.max_seqs = opts.max_seqs;
  so.max_batched_tokens = opts.max_batched_tokens;
  so.max_waiting = opts.max_waiting;
  so.max_sessions = opts.max_sessions;
  so.prefix_caching = opts.prefix_caching;
  so.cache_salt = engine.cache_salt();
  so.preempt_probability = opts.preempt_probability;
  so.preempt_seed = opts.preempt_seed;
  const model::Tokenizer* tok = &engine.tokenizer();
  so.is_end_of_generation = [tok](int32_t t) { return tok->IsEndOfGeneration(t); };
  scheduler_ = std::make_unique<Scheduler>(
      so, [&engine](const worker::StepPlan& plan, std::span<float> logits) {
        return engine.Step(plan, logits);
      });
}

absl::Status ServingEngine::RunUntilIdle() {
  while (!scheduler_->idle()) {
    if (auto s = scheduler_->Step(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Completion> ServingEngine::Generate(Request req,
                                                   const std::function<void(int32_t)>& on_token) {
  std::optional<Completion> result;
  Callbacks cb;
  if (on_token) cb.on_token = [&on_token](RequestId, int32_t t) { on_token(t); };
  cb.on_done = [&result](const Completion& c) { result = c; };
  auto id = scheduler_->Submit(std::move(req), std::move(cb));
  if (!id.ok()) return id.status();
  while (!result) {
    if (auto s = scheduler_->Step(); !s.ok()) {
      // Not scheduled in the failed step: end it now, while `result` and `on_token` live.
      scheduler_->Cancel(*id);
      return s;
    }
  }
  return *result;
}

absl::StatusOr<std::vector<float>> ServingEngine::LastLogits(const std::vector<int32_t>& prompt) {
  Request req;
  req.prompt = prompt;
  req.max_tokens = 0;
  req.prefix_cache = false;
  req.return_logits = true;
  auto c = Generate(std::move(req));
  if (!c.ok()) return c.status();
  if (!c->status.ok()) return c->status;
  return std::move(c->first_logits);
}

std::string ServingEngine::Text(const std::vector<int32_t>& tokens) const {
  return engine_.tokenizer().Decode(tokens);
}

}  // namespace kvmesh::serving
