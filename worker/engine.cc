#include "worker/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "kvstore/block_hash.h"
#include "util/str_cat.h"

namespace kvmesh::worker {

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
  // Without one, chat requests fail with the template's own reason (a template of another
  // type, an unsupported dialect), not a generic "no template".
  if (auto ct = model::ChatTemplate::FromGguf(e->model_->gguf()); ct.ok()) {
    e->chat_ = *ct;
  } else {
    e->no_chat_reason_ = std::string(ct.status().message());
  }
  const int64_t train_ctx = e->model_->config().n_ctx_train;
  if (opts.ctx_size < 0) return absl::InvalidArgumentError("ctx_size must be >= 0");
  if (opts.ctx_size > train_ctx) {  // vLLM refuses a max_model_len past the model's too
    return absl::InvalidArgumentError(
        StrCat("context size ", opts.ctx_size, " is more than the model's ", train_ctx, " tokens"));
  }
  e->ctx_size_ = opts.ctx_size == 0 ? train_ctx : opts.ctx_size;
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
  if (opts.activation_bits != 8 && opts.activation_bits != 16) {
    return absl::InvalidArgumentError(
        StrCat("activation bits must be 8 or 16, not ", opts.activation_bits));
  }
  e->forward_ = std::make_unique<LlamaForward>(
      *e->model_, *e->pool_, *shard, e->comm_, place, 512,
      opts.activation_bits == 8 ? kernels::ActBits::k8 : kernels::ActBits::k16,
      opts.repack_weights);
  e->forward_->set_phase_times(opts.phase_times);
  if (opts.attention_bits != 16 && opts.attention_bits != 32) {
    return absl::InvalidArgumentError(
        StrCat("attention bits must be 16 or 32, not ", opts.attention_bits));
  }
  if (opts.attention_bits == 16 && e->model_->config().head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        StrCat("16-bit attention needs an even head dim, not ", e->model_->config().head_dim));
  }
  if (opts.attention_bits == 16 && opts.block_size % 16 != 0) {
    return absl::InvalidArgumentError(StrCat(
        "16-bit attention needs a block size that is a multiple of 16, not ", opts.block_size));
  }
  e->forward_->set_bf16_attention(opts.attention_bits == 16);

  // Every rank must hold the same number of blocks: size them for the rank with the largest
  // blocks (most layers x KV heads), which every rank can work out from the layout alone.
  if (opts.block_size <= 0 || opts.block_size > 1024) {
    return absl::InvalidArgumentError(
        StrCat("block size ", opts.block_size, " is not in [1, 1024]"));
  }
  const auto& c = e->model_->config();
  int64_t max_block_bytes = 0;
  for (int s = 0; s < opts.pp; ++s) {
    const auto stage_s = model::MakePipelineStage(c, s, opts.pp);
    for (int r = 0; r < tp_size; ++r) {
      const auto sh = model::MakeTpShard(*e->model_, r, tp_size);
      if (!stage_s.ok()) return stage_s.status();
      if (!sh.ok()) return sh.status();
      const kvstore::KvBlockShape bs{stage_s->layer_end - stage_s->layer_begin,
                                     sh->kv_head_end - sh->kv_head_begin, c.head_dim,
                                     opts.block_size};
      max_block_bytes = std::max(max_block_bytes, bs.block_bytes());
    }
  }
  // The pool is mapped without reserving memory, so a size past the machine's would only fail
  // once traffic had filled it (the kernel's OOM killer), not here.
  const int64_t ram = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (ram > 0 && opts.kv_cache_bytes > ram) {
    return absl::InvalidArgumentError(StrCat("KV cache memory ", opts.kv_cache_bytes >> 20,
                                             " MiB is more than this machine's ", ram >> 20,
                                             " MiB"));
  }
  const int64_t n_blocks = opts.kv_cache_bytes / max_block_bytes;
  if (n_blocks < 1) {
    return absl::InvalidArgumentError(StrCat("KV cache memory ", opts.kv_cache_bytes,
                                             " bytes holds no block of ", max_block_bytes,
                                             " bytes"));
  }
  const kvstore::KvBlockShape shape{e->forward_->n_layers(), e->forward_->n_kv_heads(), c.head_dim,
                                    opts.block_size};
  auto arena = kvstore::KvBlockArena::Create(
      shape, static_cast<int32_t>(std::min<int64_t>(n_blocks, 1 << 30)));
  if (!arena.ok()) return arena.status();
  e->arena_ = std::move(*arena);
  e->pp_ = opts.pp;
  e->kv_bytes_per_token_ = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2;
  // Block names must differ whenever the bytes a block holds could: another model file, another
  // split of heads or layers, another block size or element format, other activation, product or
  // attention numerics (8-bit activations, row-major products and bf16 attention compute other K
  // and V). The model is named by a hash of its GGUF header (metadata and tensor table) and its
  // size.
  const auto& g = e->model_->gguf();
  const kvstore::BlockHash model_id = kvstore::CacheSalt(g.header());
  char id[40];
  std::snprintf(id, sizeof(id), "%016llx%016llx", static_cast<unsigned long long>(model_id.hi),
                static_cast<unsigned long long>(model_id.lo));
  e->cache_salt_ =
      StrCat("model=", id, ":", g.file_size(), ";tp=", tp_size, ";pp=", opts.pp,
             ";kv=", e->forward_->bf16_attention() ? "bf16-pairs" : "fp16,k-transposed",
             ";block=", opts.block_size, e->forward_->eight_bit_activations() ? ";act=8" : "",
             e->forward_->repacked() ? "" : ";products=row-major");
  return e;
}

absl::Status Engine::Validate(const StepPlan& plan) const {
  return ValidateStepPlan(plan, arena_->n_blocks(), block_size(),
                          static_cast<int32_t>(model_->config().n_vocab));
}

absl::Status Engine::Execute(const StepPlan& plan, std::span<float> logits,
                             std::unique_ptr<comm::PendingRecv>* logits_pending) {
  if (auto s = Validate(plan); !s.ok()) return s;
  for (const auto& [src, dst] : plan.copies) arena_->CopyBlock(src, dst);
  if (plan.seqs.empty()) return absl::OkStatus();
  return forward_->Forward(plan, *arena_, logits, logits_pending);
}

namespace {
constexpr int32_t kStopWord = -1;  // a plan length of -1 stops the followers
}

absl::Status Engine::BroadcastPlan(const StepPlan& plan) {
  if (world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  // Header: the plan's length in words; then the plan.
  std::vector<int32_t> words = EncodeStepPlan(plan);
  // The header goes as the followers take it (a nonblocking collective matches only its kind).
  int32_t n = static_cast<int32_t>(words.size());
  if (auto s = world_->BroadcastPatiently({reinterpret_cast<uint8_t*>(&n), sizeof(n)}, 0);
      !s.ok()) {
    return s;
  }
  return world_->Broadcast({reinterpret_cast<uint8_t*>(words.data()), words.size() * 4}, 0);
}

absl::Status Engine::Step(const StepPlan& plan, std::span<float> logits) {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError("step: pipelined steps are still in flight");
  }
  if (auto s = BroadcastPlan(plan); !s.ok()) return s;
  return Execute(plan, logits);
}

void Engine::StartStep(const StepPlan& plan) {
  InFlight& f = in_flight_.emplace_back();
  f.logits.resize(plan.n_logits() * model_->config().n_vocab);
  f.status = BroadcastPlan(plan);
  if (f.status.ok()) f.status = Execute(plan, f.logits, &f.recv);
}

absl::StatusOr<std::vector<float>> Engine::FinishStep() {
  if (in_flight_.empty()) return absl::FailedPreconditionError("step: no step in flight");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (f.status.ok() && f.recv) f.status = f.recv->Wait();
  if (!f.status.ok()) return f.status;
  return std::move(f.logits);
}

absl::Status Engine::ServeFollower() {
  if (world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  std::vector<int32_t> words;
  std::vector<float> logits;
  for (;;) {
    int32_t n;
    if (auto s = world_->BroadcastPatiently({reinterpret_cast<uint8_t*>(&n), sizeof(n)}, 0);
        !s.ok()) {
      return s;
    }
    if (n == kStopWord) return absl::OkStatus();
    if (n < 0) return absl::InternalError("follower: bad step header");
    words.resize(n);
    if (auto s = world_->Broadcast({reinterpret_cast<uint8_t*>(words.data()), words.size() * 4}, 0);
        !s.ok()) {
      return s;
    }
    // A plan the leader rejects is rejected here too, before any collective (the ranks agreed
    // on their setup at launch, so they validate alike): the group stays in step, keep serving.
    // Any other failure leaves this rank out of step with its group: end it.
    auto plan = DecodeStepPlan(words);
    if (!plan.ok()) continue;
    if (!Validate(*plan).ok()) continue;
    logits.resize(plan->n_logits() * model_->config().n_vocab);
    if (auto s = Execute(*plan, logits); !s.ok()) return s;
  }
}

absl::Status Engine::StopFollowers() {
  if (world_ == nullptr || world_->size() == 1) return absl::OkStatus();
  int32_t n = kStopWord;
  return world_->BroadcastPatiently({reinterpret_cast<uint8_t*>(&n), sizeof(n)}, 0);
}

absl::StatusOr<std::vector<int32_t>> Engine::ChatPrompt(const std::string& user_message) const {
  if (!chat_) {
    return absl::FailedPreconditionError(
        StrCat("model has no supported chat template: ", no_chat_reason_));
  }
  const std::string text = chat_->Render({{"user", user_message}}, /*add_generation_prompt=*/true);
  return tokenizer_->Encode(text, /*parse_special=*/true);
}

}  // namespace kvmesh::worker
