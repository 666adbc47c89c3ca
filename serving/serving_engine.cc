#include "serving/serving_engine.h"

#include <algorithm>
#include <optional>

#include "kvstore/block_hash.h"
#include "serving/router.h"
#include "util/str_cat.h"

namespace kvmesh::serving {

ServingEngine::ServingEngine(worker::Engine& engine, const ServingOptions& opts,
                             std::vector<worker::RemoteReplica*> remotes)
    : engine_(engine), remotes_(std::move(remotes)) {
  SchedulerOptions so;
  so.n_blocks = engine.n_blocks();
  so.block_size = engine.block_size();
  so.max_context = engine.ctx_size();
  so.n_vocab = static_cast<int32_t>(engine.model().config().n_vocab);
  so.max_seqs = opts.max_seqs;
  so.max_batched_tokens = opts.max_batched_tokens;
  so.max_waiting = opts.max_waiting;
  so.max_sessions = opts.max_sessions;
  max_sessions_ = std::max(1, opts.max_sessions);
  max_waiting_ = opts.max_waiting;
  max_seqs_ = opts.max_seqs;
  so.prefix_caching = opts.prefix_caching;
  so.cache_salt = engine.cache_salt();
  so.preempt_probability = opts.preempt_probability;
  pipelined_ = remotes_.empty() && engine.pipeline_stages() > 1;
  if (pipelined_) so.max_steps_in_flight = engine.pipeline_stages();
  so.preempt_seed = opts.preempt_seed;
  const model::Tokenizer* tok = &engine.tokenizer();
  so.is_end_of_generation = [tok](int32_t t) { return tok->IsEndOfGeneration(t); };
  // Replica 0 runs here; the runners of remote replicas are never called (Step drives them).
  schedulers_.push_back(std::make_unique<Scheduler>(
      so, [&engine](const worker::StepPlan& plan, std::span<float> logits) {
        return engine.Step(plan, logits);
      }));
  for (size_t r = 0; r < remotes_.size(); ++r) {
    so.preempt_seed = opts.preempt_seed + r + 1;
    worker::RemoteReplica* remote = remotes_[r];
    schedulers_.push_back(std::make_unique<Scheduler>(
        so, [remote](const worker::StepPlan& plan, std::span<float> logits) {
          if (auto s = remote->Send(plan); !s.ok()) return s;
          return remote->Receive(logits);
        }));
  }
  remote_logits_.resize(schedulers_.size());
}

int ServingEngine::Route(const Request& req) {
  if (schedulers_.size() == 1) return 0;
  if (req.replica_of) {  // before sessions: the HTTP API sends no session with n > 1 choices
    const int r = static_cast<int>(*req.replica_of & ((1u << kReplicaBits) - 1));
    if (r < replicas()) return r;
  }
  if (!req.session_id.empty()) {
    if (auto it = session_replica_.find(req.session_id); it != session_replica_.end()) {
      return it->second;
    }
  }
  std::vector<ReplicaLoad> loads(schedulers_.size());
  for (size_t r = 0; r < loads.size(); ++r) {
    const auto st = schedulers_[r]->stats();
    // A request that reuses no prefix goes by load alone.
    loads[r] = {req.prefix_cache ? schedulers_[r]->KnownPrefixTokens(req.prompt) : 0,
                st.running + st.waiting, st.blocks_used + st.blocks_cached,
                st.waiting >= max_waiting_};
  }
  return ChooseReplica(loads, static_cast<int64_t>(req.prompt.size()),
                       {.min_tokens = 2 * int64_t{engine_.block_size()},
                        .max_imbalance = std::max(1, max_seqs_),
                        .turn = routed_++});
}

absl::StatusOr<RequestId> ServingEngine::Submit(Request req, Callbacks cb) {
  const int r = Route(req);
  const std::string session = req.session_id;
  // Callbacks see global ids.
  Callbacks wrapped;
  if (cb.on_token) {
    wrapped.on_token = [r, f = cb.on_token](RequestId id, int32_t t) {
      f(id << kReplicaBits | r, t);
    };
  }
  if (cb.on_logprobs) {
    wrapped.on_logprobs = [r, f = cb.on_logprobs](RequestId id, const TokenLogprobs& l) {
      f(id << kReplicaBits | r, l);
    };
  }
  wrapped.on_done = [r, f = std::move(cb.on_done)](const Completion& c) {
    if (!f) return;
    Completion g = c;
    g.id = c.id << kReplicaBits | r;
    f(g);
  };
  auto id = schedulers_[r]->Submit(std::move(req), std::move(wrapped));
  if (!id.ok()) return id.status();
  if (!session.empty() && schedulers_.size() > 1) {
    session_replica_[session] = r;
    // Bounded as the schedulers' sessions are: once it holds twice what they can keep, forget
    // the sessions no scheduler keeps any more (a later turn of one forgotten while its turn was
    // running is routed as any request: its history is a long prefix its replica knows, so it
    // goes back there unless that replica is a batch busier than another).
    if (session_replica_.size() > 2 * schedulers_.size() * static_cast<size_t>(max_sessions_)) {
      absl::erase_if(session_replica_, [&](const auto& e) {
        return e.first != session && !schedulers_[e.second]->HasSession(e.first);
      });
    }
  }
  return *id << kReplicaBits | static_cast<RequestId>(r);
}

bool ServingEngine::Cancel(RequestId id) {
  const int r = static_cast<int>(id & ((1u << kReplicaBits) - 1));
  if (r >= replicas()) return false;
  return schedulers_[r]->Cancel(id >> kReplicaBits);
}

bool ServingEngine::FinishEarly(RequestId id) {
  const int r = static_cast<int>(id & ((1u << kReplicaBits) - 1));
  if (r >= replicas()) return false;
  return schedulers_[r]->FinishEarly(id >> kReplicaBits);
}

absl::Status ServingEngine::PipelinedStep() {
  Scheduler& sched = *schedulers_[0];
  for (worker::StepPlan plan; sched.BeginStep(plan);) {
    engine_.StartStep(plan);
  }
  if (engine_.steps_in_flight() == 0) return absl::OkStatus();
  return FinishOldestStep();
}

absl::Status ServingEngine::FinishOldestStep() {
  auto logits = engine_.FinishStep();
  return schedulers_[0]->FinishStep(logits.status(),
                                    logits.ok() ? std::span<float>(*logits) : std::span<float>());
}

absl::Status ServingEngine::Step() {
  if (pipelined_) return PipelinedStep();
  if (schedulers_.size() == 1) return schedulers_[0]->Step();
  // Remote replicas first (their plans go out; they compute while replica 0 does), then
  // replica 0 here, then the remote logits.
  std::vector<worker::StepPlan> plans(schedulers_.size());
  std::vector<bool> active(schedulers_.size(), false);
  std::vector<absl::Status> sent(schedulers_.size());
  for (size_t r = 1; r < schedulers_.size(); ++r) {
    active[r] = schedulers_[r]->BeginStep(plans[r]);
    if (active[r]) sent[r] = remotes_[r - 1]->Send(plans[r]);
  }
  absl::Status first;
  if (worker::StepPlan plan; schedulers_[0]->BeginStep(plan)) {
    logits_.resize(plan.n_logits() * engine_.model().config().n_vocab);
    const absl::Status s = engine_.Step(plan, logits_);
    if (auto f = schedulers_[0]->FinishStep(s, logits_); !f.ok() && first.ok()) first = f;
  }
  for (size_t r = 1; r < schedulers_.size(); ++r) {
    if (!active[r]) continue;
    remote_logits_[r].resize(plans[r].n_logits() * engine_.model().config().n_vocab);
    absl::Status s = sent[r];
    if (s.ok()) s = remotes_[r - 1]->Receive(remote_logits_[r]);
    if (auto f = schedulers_[r]->FinishStep(s, remote_logits_[r]); !f.ok() && first.ok()) first = f;
  }
  return first;
}

bool ServingEngine::idle() const {
  for (const auto& s : schedulers_) {
    if (!s->idle()) return false;
  }
  return true;
}

void ServingEngine::CancelAll(absl::Status why) {
  for (auto& s : schedulers_) s->CancelAll(why);
}

bool ServingEngine::DropSession(const std::string& session_id) {
  bool any = false;
  for (auto& s : schedulers_) any |= s->DropSession(session_id);
  session_replica_.erase(session_id);
  return any;
}

void ServingEngine::DropSessions() {
  for (auto& s : schedulers_) s->DropSessions();
  session_replica_.clear();
}

void ServingEngine::SetPreemptProbabilityForTesting(double p) {
  for (auto& s : schedulers_) s->SetPreemptProbabilityForTesting(p);
}

SchedulerStats ServingEngine::stats() const {
  SchedulerStats t;
  for (const auto& sc : schedulers_) {
    const SchedulerStats s = sc->stats();
    t.prefix_query_tokens += s.prefix_query_tokens;
    t.prefix_hit_tokens += s.prefix_hit_tokens;
    t.blocks_total += s.blocks_total;
    t.blocks_used += s.blocks_used;
    t.blocks_cached += s.blocks_cached;
    t.blocks_free += s.blocks_free;
    t.evictions += s.evictions;
    t.preemptions += s.preemptions;
    t.steps = std::max(t.steps, s.steps);
    t.submitted += s.submitted;
    t.finished += s.finished;
    t.rejected += s.rejected;
    t.cancelled += s.cancelled;
    t.failed += s.failed;
    t.prompt_tokens_computed += s.prompt_tokens_computed;
    t.generated_tokens += s.generated_tokens;
    t.running += s.running;
    t.waiting += s.waiting;
    t.sessions += s.sessions;
  }
  return t;
}

Histogram ServingEngine::Merged(const Histogram& (Scheduler::*which)() const) const {
  Histogram h = (*schedulers_[0].*which)();
  for (size_t r = 1; r < schedulers_.size(); ++r) h.Merge((*schedulers_[r].*which)());
  return h;
}

Histogram ServingEngine::ttft_seconds() const { return Merged(&Scheduler::ttft_seconds); }
Histogram ServingEngine::itl_seconds() const { return Merged(&Scheduler::itl_seconds); }
Histogram ServingEngine::queue_seconds() const { return Merged(&Scheduler::queue_seconds); }
Histogram ServingEngine::prefill_seconds() const { return Merged(&Scheduler::prefill_seconds); }
Histogram ServingEngine::decode_seconds() const { return Merged(&Scheduler::decode_seconds); }

absl::Status ServingEngine::Drain() {
  absl::Status first;
  while (engine_.steps_in_flight() > 0) {
    if (auto s = FinishOldestStep(); !s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status ServingEngine::StopReplicas() {
  absl::Status first = Drain();
  for (auto* r : remotes_) {
    if (auto s = r->Stop(); !s.ok() && first.ok()) first = s;
  }
  return first;
}

absl::Status ServingEngine::RunUntilIdle() {
  while (!idle()) {
    if (auto s = Step(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<Completion> ServingEngine::Generate(Request req,
                                                   const std::function<void(int32_t)>& on_token) {
  std::optional<Completion> result;
  Callbacks cb;
  if (on_token) cb.on_token = [&on_token](RequestId, int32_t t) { on_token(t); };
  cb.on_done = [&result](const Completion& c) { result = c; };
  auto id = Submit(std::move(req), std::move(cb));
  if (!id.ok()) return id.status();
  while (!result) {
    if (auto s = Step(); !s.ok()) {
      // Not scheduled in the failed step: end it now, while `result` and `on_token` live (a
      // pipelined step still holding it ends it when it finishes).
      Cancel(*id);
      Drain().IgnoreError();  // s is the error returned
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
