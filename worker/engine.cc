#include "worker/engine.h"

#include <chrono>

#include "util/str_cat.h"

namespace kvmesh::worker {

namespace {
double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& opts) {
  std::unique_ptr<Engine> e(new Engine());
  auto m = model::LlamaModel::Load(opts.model_path);
  if (!m.ok()) return m.status();
  e->model_ = std::move(*m);
  auto tok = model::Tokenizer::FromGguf(e->model_->gguf());
  if (!tok.ok()) return tok.status();
  e->tokenizer_ = std::move(*tok);
  if (e->tokenizer_->vocab_size() != e->model_->config().n_vocab) {
    return absl::InvalidArgumentError(StrCat("model: tokenizer has ", e->tokenizer_->vocab_size(),
                                             " tokens but token_embd.weight has ",
                                             e->model_->config().n_vocab, " rows"));
  }
  if (auto ct = model::ChatTemplate::FromGguf(e->model_->gguf()); ct.ok()) e->chat_ = *ct;
  const int64_t train_ctx = e->model_->config().n_ctx_train;
  if (opts.ctx_size < 0) return absl::InvalidArgumentError("ctx_size must be >= 0");
  e->ctx_size_ = opts.ctx_size == 0 ? train_ctx : std::min(opts.ctx_size, train_ctx);
  if (opts.threads < 0) return absl::InvalidArgumentError("threads must be >= 0");
  e->pool_ = std::make_unique<kernels::ThreadPool>(
      opts.threads == 0 ? kernels::ThreadPool::AvailableCpus() : opts.threads);
  e->comm_ = opts.tp_comm;
  e->world_ = opts.world_comm;
  const int tp_rank = e->comm_ ? e->comm_->rank() : 0;
  const int tp_size = e->comm_ ? e->comm_->size() : 1;
  const int world_rank = e->world_ ? e->world_->rank() : 0;
  const int world_size = e->world_ ? e->world_->size() : 1;
  if (world_size != opts.pp * tp_size || world_rank % tp_size != tp_rank) {
    return absl::InvalidArgumentError(
        StrCat("world of ", world_size, " ranks is not pp ", opts.pp, " x tp ", tp_size));
  }
  auto shard = model::MakeTpShard(*e->model_, tp_rank, tp_size);
  if (!shard.ok()) return shard.status();
  const int stage = world_rank / tp_size;
  auto st = model::MakePipelineStage(e->model_->config(), stage, opts.pp);
  if (!st.ok()) return st.status();
  PipelinePlace place;
  place.stage = *st;
  place.world = e->world_;
  if (!st->first()) place.prev = world_rank - tp_size;
  if (!st->last()) place.next = world_rank + tp_size;
  const int last_tp0 = (opts.pp - 1) * tp_size;
  if (opts.pp > 1 && world_rank == last_tp0) place.logits_to = 0;
  if (opts.pp > 1 && world_rank == 0) place.logits_from = last_tp0;
  e->forward_ = std::make_unique<LlamaForward>(*e->model_, *e->pool_, *shard, e->comm_, place);
  return e;
}

absl::Status Engine::Execute(Op op, std::span<const int32_t> tokens, std::span<float> logits) {
  const auto& c = model_->config();
  switch (op) {
    case Op::kReset:
      cache_ = std::make_unique<kvstore::KvCache>(forward_->n_layers(), forward_->n_kv_heads(),
                                                  c.head_dim, ctx_size_);
      return absl::OkStatus();
    case Op::kForward:
      if (!cache_) return absl::FailedPreconditionError("forward before reset");
      return forward_->Forward(tokens, *cache_, logits);
    case Op::kTruncate:
      if (!cache_) return absl::FailedPreconditionError("truncate before reset");
      cache_->set_size(std::min<int64_t>(cache_->size(), static_cast<int64_t>(tokens.size())));
      return absl::OkStatus();
    case Op::kStop:
      return absl::OkStatus();
  }
  return absl::InternalError("unknown step");
}

absl::Status Engine::Step(Op op, std::span<const int32_t> tokens, std::span<float> logits) {
  if (world_ != nullptr && world_->size() > 1) {
    // Header: op, token count, whether logits are wanted; then the tokens (for kTruncate the
    // count alone is the number of positions to keep, and no tokens follow).
    int32_t hdr[3] = {static_cast<int32_t>(op), static_cast<int32_t>(tokens.size()),
                      logits.empty() ? 0 : 1};
    if (auto s = world_->Broadcast({reinterpret_cast<uint8_t*>(hdr), sizeof(hdr)}, 0); !s.ok()) {
      return s;
    }
    if (!tokens.empty() && op != Op::kTruncate) {
      std::vector<int32_t> copy(tokens.begin(), tokens.end());
      if (auto s = world_->Broadcast({reinterpret_cast<uint8_t*>(copy.data()), copy.size() * 4}, 0);
          !s.ok()) {
        return s;
      }
    }
  }
  return Execute(op, tokens, logits);
}

absl::Status Engine::ServeFollower() {
  if (world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  std::vector<int32_t> tokens;
  std::vector<float> logits(model_->config().n_vocab);
  for (;;) {
    int32_t hdr[3];
    if (auto s = world_->Broadcast({reinterpret_cast<uint8_t*>(hdr), sizeof(hdr)}, 0); !s.ok()) {
      return s;
    }
    const Op op = static_cast<Op>(hdr[0]);
    if (op == Op::kStop) return absl::OkStatus();
    if (hdr[1] < 0) return absl::InternalError("follower: bad step header");
    tokens.resize(hdr[1]);
    if (!tokens.empty() && op != Op::kTruncate) {
      if (auto s =
              world_->Broadcast({reinterpret_cast<uint8_t*>(tokens.data()), tokens.size() * 4}, 0);
          !s.ok()) {
        return s;
      }
    }
    // A step the leader rejects is rejected here too, before any collective, so the group stays
    // in step: keep serving. A failed collective means a peer is gone.
    const absl::Status s =
        Execute(op, tokens, hdr[2] ? std::span<float>(logits) : std::span<float>());
    if (!s.ok() && s.code() == absl::StatusCode::kUnavailable) return s;
  }
}

absl::Status Engine::StopFollowers() {
  if (world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  return Step(Op::kStop, {}, {});
}

absl::StatusOr<std::vector<int32_t>> Engine::ChatPrompt(const std::string& user_message) const {
  if (!chat_) return absl::FailedPreconditionError("model has no supported chat template");
  const std::string text = chat_->Render({{"user", user_message}}, /*add_generation_prompt=*/true);
  return tokenizer_->Encode(text, /*parse_special=*/true);
}

absl::Status Engine::CheckPrompt(const std::vector<int32_t>& prompt) const {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (static_cast<int64_t>(prompt.size()) >= ctx_size_) {
    return absl::InvalidArgumentError(StrCat(
        "prompt is ", prompt.size(), " tokens, which does not fit the context size ", ctx_size_));
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerateResult> Engine::Generate(const GenerateRequest& req,
                                                const std::function<void(int32_t)>& on_token) {
  if (auto s = CheckPrompt(req.prompt); !s.ok()) return s;
  if (auto s = req.sampling.Validate(); !s.ok()) return s;
  if (req.max_tokens < 0) return absl::InvalidArgumentError("max_tokens must be >= 0");
  const auto& c = model_->config();
  model::Sampler sampler(req.sampling);
  std::vector<float> logits(c.n_vocab);
  std::vector<int32_t> history = req.prompt;
  GenerateResult r;
  r.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  r.stop_reason = "length";

  const double comm0 = forward_->comm_seconds();
  const int64_t calls0 = forward_->comm_calls();
  auto t0 = std::chrono::steady_clock::now();
  // The reusable prefix: shared with the cached sequence, and at least one token left to run
  // (its logits start the answer).
  size_t keep = 0;
  if (req.reuse_prefix && cache_) {
    while (keep < cached_tokens_.size() && keep + 1 < req.prompt.size() &&
           cached_tokens_[keep] == req.prompt[keep]) {
      ++keep;
    }
  }
  if (keep > 0) {
    // Only the count matters to kTruncate; the prompt's first `keep` ids carry it.
    if (auto s = Step(Op::kTruncate, std::span(req.prompt).first(keep), {}); !s.ok()) return s;
  } else if (auto s = Step(Op::kReset, {}, {}); !s.ok()) {
    return s;
  }
  cached_tokens_.assign(req.prompt.begin(), req.prompt.begin() + keep);
  r.cached_tokens = static_cast<int64_t>(keep);
  if (auto s = Step(Op::kForward, std::span(req.prompt).subspan(keep), logits); !s.ok()) {
    cached_tokens_.clear();
    return s;
  }
  cached_tokens_.insert(cached_tokens_.end(), req.prompt.begin() + keep, req.prompt.end());
  r.prefill_ms = MsSince(t0);
  if (req.return_logits) r.first_logits = logits;
  t0 = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < req.max_tokens; ++i) {
    const int32_t tok = sampler.Sample(logits, history);
    r.tokens.push_back(tok);
    history.push_back(tok);
    if (on_token) on_token(tok);
    if (!req.ignore_eos && tokenizer_->IsEndOfGeneration(tok)) {
      r.stop_reason = "eos";
      break;
    }
    if (i + 1 == req.max_tokens) break;
    if (cache_->size() + 1 > ctx_size_) break;  // context full: stop as "length"
    const int32_t one[1] = {tok};
    if (auto s = Step(Op::kForward, one, logits); !s.ok()) return s;
    cached_tokens_.push_back(tok);
  }
  r.decode_ms = MsSince(t0);
  r.comm_ms = (forward_->comm_seconds() - comm0) * 1e3;
  r.comm_calls = forward_->comm_calls() - calls0;
  r.text = tokenizer_->Decode(r.tokens);
  return r;
}

absl::StatusOr<std::vector<float>> Engine::LastLogits(const std::vector<int32_t>& prompt) {
  if (auto s = CheckPrompt(prompt); !s.ok()) return s;
  std::vector<float> logits(model_->config().n_vocab);
  cached_tokens_.clear();
  if (auto s = Step(Op::kReset, {}, {}); !s.ok()) return s;
  if (auto s = Step(Op::kForward, prompt, logits); !s.ok()) return s;
  cached_tokens_ = prompt;
  return logits;
}

}  // namespace kvmesh::worker
