#include "serving/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "util/str_cat.h"

namespace kvmesh::serving {

using Clock = std::chrono::steady_clock;
using kvstore::BlockId;

namespace {

using NameCounts = absl::flat_hash_map<kvstore::BlockHash, int32_t>;

// Names tokens' full blocks from block `from` on (`parent`: the name before it), appending each
// name to `names` and counting it in `counts`.
void CountNames(kvstore::BlockHash parent, std::span<const int32_t> tokens, int64_t block_size,
                int64_t from, NameCounts& counts, std::vector<kvstore::BlockHash>& names) {
  for (int64_t i = from; (i + 1) * block_size <= static_cast<int64_t>(tokens.size()); ++i) {
    parent = kvstore::ChainHash(parent, tokens.subspan(i * block_size, block_size));
    names.push_back(parent);
    ++counts[parent];
  }
}

// Takes one count of `name` back out of `counts` (its entry goes at zero).
void Uncount(const kvstore::BlockHash& name, NameCounts& counts) {
  auto it = counts.find(name);
  if (--it->second == 0) counts.erase(it);
}

}  // namespace

struct Scheduler::Sequence {
  RequestId id;
  uint64_t arrival;
  Request req;
  Callbacks cb;
  model::Sampler sampler;
  std::vector<int32_t> tokens;  // prompt + generated; the last one's K/V is not computed yet
  int64_t computed = 0;         // positions whose K/V is in `blocks`
  std::vector<BlockId> blocks;
  std::vector<kvstore::BlockHash> names;    // names of blocks [0, names.size()), a hash chain
  std::vector<kvstore::BlockHash> pending;  // names of the prompt blocks still to compute
  std::vector<kvstore::BlockHash> queued;   // its prompt's names in queued_, until it starts
  bool admitted_once = false;
  bool busy = false;  // in a step begun and not yet finished
  Completion done;
  Clock::time_point submitted, admitted, first_token, last_token;

  Sequence(RequestId i, uint64_t a, Request r, Callbacks c)
      : id(i), arrival(a), req(std::move(r)), cb(std::move(c)), sampler(req.sampling) {}
  int32_t generated() const { return static_cast<int32_t>(done.tokens.size()); }
};

// A conversation's KV: the tokens whose K/V exist (as named full blocks in the pool, while they
// survive eviction) and the partial last block, which the session keeps a reference to.
struct Scheduler::Session {
  std::vector<int32_t> tokens;
  BlockId tail = -1;  // the block holding positions [tokens.size() / bs * bs, tokens.size())
  // The name of the last full block before the tail (the salt if none): the tail's K/V hold
  // only after exactly that prefix.
  kvstore::BlockHash prefix;
  uint64_t last_use = 0;
};

namespace {
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// log-softmax of `tok` and of the k most likely tokens.
TokenLogprobs LogprobsOf(const std::vector<float>& logits, int32_t tok, int32_t k) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  std::vector<int32_t> idx(logits.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  const size_t top = std::min<size_t>(static_cast<size_t>(k), idx.size());
  std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  TokenLogprobs lp;
  lp.token = tok;
  lp.logprob = logits[tok] - lse;
  for (size_t i = 0; i < top; ++i) lp.top.emplace_back(idx[i], logits[idx[i]] - lse);
  return lp;
}
}  // namespace

Scheduler::Scheduler(const SchedulerOptions& opts, Runner runner)
    : opts_(opts),
      runner_(std::move(runner)),
      blocks_(opts.n_blocks),
      salt_(kvstore::CacheSalt(opts.cache_salt)),
      ttft_(LongLatencyBuckets()),
      itl_(LatencyBuckets()),
      queue_(LongLatencyBuckets()),
      prefill_(LongLatencyBuckets()),
      decode_(LongLatencyBuckets()),
      preempt_rng_(opts.preempt_seed) {}

// Every accepted request hears its end, even when the engine goes away first (steps still in
// flight will never finish then).
Scheduler::~Scheduler() {
  for (auto& step : steps_) {
    for (Scheduled& sc : step) sc.seq->busy = false;
  }
  steps_.clear();
  CancelAll();
}

absl::StatusOr<RequestId> Scheduler::Submit(Request req, Callbacks callbacks) {
  auto reject = [&](absl::Status s) {
    ++stats_.rejected;
    return s;
  };
  if (req.prompt.empty()) return reject(absl::InvalidArgumentError("prompt is empty"));
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  if (n >= opts_.max_context) {
    return reject(absl::InvalidArgumentError(StrCat(
        "prompt is ", n, " tokens, which does not fit the context size ", opts_.max_context)));
  }
  for (size_t i = 0; i < req.prompt.size(); ++i) {
    if (req.prompt[i] < 0 || req.prompt[i] >= opts_.n_vocab) {
      return reject(absl::InvalidArgumentError(
          StrCat("prompt token id ", req.prompt[i], " at index ", i,
                 " is outside the vocabulary [0, ", opts_.n_vocab, ")")));
    }
  }
  if (req.max_tokens < 0) return reject(absl::InvalidArgumentError("max_tokens must be >= 0"));
  if (req.logprobs < 0 || req.logprobs > kMaxLogprobs) {
    return reject(absl::InvalidArgumentError(
        StrCat("logprobs must be in [0, ", kMaxLogprobs, "], got ", req.logprobs)));
  }
  if (auto s = req.sampling.Validate(); !s.ok()) return reject(s);
  // Alone, the sequence needs K/V for every token but the last one it samples.
  const int64_t positions =
      std::min<int64_t>(n + std::max<int32_t>(req.max_tokens, 1) - 1, opts_.max_context);
  if (CeilDiv(positions, opts_.block_size) > opts_.n_blocks) {
    return reject(absl::InvalidArgumentError(StrCat(
        "request needs ", CeilDiv(positions, opts_.block_size), " KV blocks (", n, " prompt + ",
        req.max_tokens, " new tokens) but the cache holds ", opts_.n_blocks, " blocks of ",
        opts_.block_size, " tokens; raise --kv-cache-mem or lower max_tokens")));
  }
  if (static_cast<int32_t>(waiting_.size()) >= opts_.max_waiting) {
    return reject(absl::ResourceExhaustedError(
        StrCat("request queue is full (", waiting_.size(), " waiting); retry later")));
  }
  const RequestId id = next_id_++;
  auto seq = std::make_unique<Sequence>(id, next_arrival_++, std::move(req), std::move(callbacks));
  seq->tokens = seq->req.prompt;
  seq->submitted = Clock::now();
  seq->done.id = id;
  seq->done.prompt_tokens = n;
  if (opts_.prefix_caching && seq->req.prefix_cache) {
    CountNames(salt_, seq->tokens, opts_.block_size, 0, queued_, seq->queued);
  }
  waiting_.push_back(seq.get());
  seqs_.emplace(id, std::move(seq));
  ++stats_.submitted;
  return id;
}

bool Scheduler::Cancel(RequestId id) {
  return End(id, /*early=*/false, absl::CancelledError("request cancelled"));
}

bool Scheduler::FinishEarly(RequestId id) { return End(id, /*early=*/true, absl::OkStatus()); }

bool Scheduler::End(RequestId id, bool early, const absl::Status& why) {
  auto it = seqs_.find(id);
  if (it == seqs_.end()) return false;
  // From a callback, or while a step in flight holds the sequence: end it after that step.
  if (in_step_ || it->second->busy) {
    deferred_ends_.push_back({id, early, why});
    return true;
  }
  if (early) {
    Finish(*it->second, absl::OkStatus(), "stop");
    return true;
  }
  ++stats_.cancelled;
  Finish(*it->second, why, "cancelled");
  return true;
}

void Scheduler::RunDeferredEnds() {
  std::vector<DeferredEnd> ends;
  ends.swap(deferred_ends_);
  for (const DeferredEnd& e : ends) End(e.id, e.early, e.why);
}

void Scheduler::CancelAll(absl::Status why) {
  std::vector<RequestId> ids;
  for (const auto& [id, seq] : seqs_) ids.push_back(id);
  for (RequestId id : ids) End(id, /*early=*/false, why);
}

void Scheduler::Admit(Sequence& s) {
  s.blocks.clear();
  s.names.clear();
  s.computed = 0;
  const bool cache = opts_.prefix_caching && s.req.prefix_cache;
  const int64_t bs = opts_.block_size;
  // At least the last token runs: its logits start (or continue) the answer.
  const int64_t limit = static_cast<int64_t>(s.tokens.size()) - 1;
  if (cache) {
    kvstore::BlockHash parent = salt_;
    while (static_cast<int64_t>(s.blocks.size() + 1) * bs <= limit) {
      const int64_t i = static_cast<int64_t>(s.blocks.size());
      const kvstore::BlockHash h =
          kvstore::ChainHash(parent, std::span(s.tokens).subspan(i * bs, bs));
      const auto b = blocks_.Find(h);
      if (!b) break;
      blocks_.Acquire(*b);
      s.blocks.push_back(*b);
      s.names.push_back(h);
      parent = h;
    }
    s.computed = static_cast<int64_t>(s.blocks.size()) * bs;
    // A session's partial last block extends the match if every full block before it matched.
    if (auto it = sessions_.find(s.req.session_id);
        !s.req.session_id.empty() && it != sessions_.end()) {
      Session& ss = *it->second;
      ss.last_use = ++session_clock_;
      // The matched full blocks must be the session's own prefix: blocks of the same length
      // cached by another request (another conversation, an edited turn) hold other tokens,
      // after which the tail's K/V are wrong.
      const kvstore::BlockHash matched = s.names.empty() ? salt_ : s.names.back();
      if (ss.tail >= 0 && static_cast<int64_t>(ss.tokens.size()) / bs * bs == s.computed &&
          matched == ss.prefix) {
        int64_t k = 0;
        while (s.computed + k < limit && s.computed + k < static_cast<int64_t>(ss.tokens.size()) &&
               ss.tokens[s.computed + k] == s.tokens[s.computed + k]) {
          ++k;
        }
        if (k > 0) {
          blocks_.Acquire(ss.tail);
          s.blocks.push_back(ss.tail);
          s.computed += k;
        }
      }
    }
  }
}

void Scheduler::Start(Sequence& s) {
  Unqueue(s);
  if (!s.admitted_once) {
    // Counted once per request, over its prompt: a preempted sequence's re-admission (its prompt
    // and the tokens it had generated) would count its own recomputation as queries and hits.
    s.admitted_once = true;
    s.admitted = Clock::now();
    const double queued = Seconds(s.submitted, s.admitted);
    s.done.queue_ms = queued * 1e3;
    queue_.Observe(queued);
    s.done.cached_tokens = s.computed;
    stats_.prefix_query_tokens += static_cast<int64_t>(s.tokens.size());
    stats_.prefix_hit_tokens += s.computed;
  }
  // Announce the full blocks this sequence is about to compute, so that requests sharing them
  // wait for them instead of computing them again.
  if (opts_.prefix_caching && s.req.prefix_cache) {
    CountNames(s.names.empty() ? salt_ : s.names.back(), s.tokens, opts_.block_size,
               static_cast<int64_t>(s.names.size()), in_flight_, s.pending);
  }
  // By arrival: a request that waited for another's in-flight block may start after later ones.
  running_.insert(std::upper_bound(
                      running_.begin(), running_.end(), &s,
                      [](const Sequence* x, const Sequence* y) { return x->arrival < y->arrival; }),
                  &s);
}

bool Scheduler::WaitsForInFlightBlock(const Sequence& s) const {
  const int64_t bs = opts_.block_size;
  const int64_t i = static_cast<int64_t>(s.names.size());
  if (!opts_.prefix_caching || !s.req.prefix_cache || in_flight_.empty() ||
      (i + 1) * bs > static_cast<int64_t>(s.tokens.size()) - 1 || s.computed != i * bs) {
    return false;
  }
  const kvstore::BlockHash next = kvstore::ChainHash(s.names.empty() ? salt_ : s.names.back(),
                                                     std::span(s.tokens).subspan(i * bs, bs));
  return in_flight_.contains(next);
}

void Scheduler::Unqueue(Sequence& s) {
  for (const kvstore::BlockHash& h : s.queued) Uncount(h, queued_);
  s.queued.clear();
}

void Scheduler::DropInFlight(Sequence& s, size_t keep_from) {
  for (size_t i = keep_from; i < s.pending.size(); ++i) Uncount(s.pending[i], in_flight_);
  s.pending.resize(std::min(keep_from, s.pending.size()));
}

void Scheduler::ReleaseBlocks(Sequence& s) {
  // Tail first: the least valuable blocks (a finished sequence's own suffix) become the least
  // recently released, so they are evicted before the shared prefix.
  for (auto it = s.blocks.rbegin(); it != s.blocks.rend(); ++it) blocks_.Release(*it);
  DropInFlight(s, 0);
  s.blocks.clear();
  s.names.clear();
  s.computed = 0;
}

void Scheduler::Preempt(Sequence& s) {
  ReleaseBlocks(s);
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  // Back into the queue in arrival order (normally its front).
  auto at = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const Sequence* w) { return w->arrival > s.arrival; });
  waiting_.insert(at, &s);
  ++stats_.preemptions;
  ++s.done.preemptions;
}

void Scheduler::DropSessionTail(Session& ss) {
  if (ss.tail >= 0) blocks_.Release(ss.tail);
  ss.tail = -1;
}

bool Scheduler::DropOneSessionTail() {
  Session* oldest = nullptr;
  for (auto& [id, ss] : sessions_) {
    if (ss->tail >= 0 && (oldest == nullptr || ss->last_use < oldest->last_use)) oldest = ss.get();
  }
  if (oldest == nullptr) return false;
  DropSessionTail(*oldest);
  return true;
}

int64_t Scheduler::Room() const {
  int64_t n = blocks_.available();
  for (const auto& [id, ss] : sessions_) {
    if (ss->tail >= 0 && blocks_.ref_count(ss->tail) == 1) ++n;
  }
  return n;
}

bool Scheduler::DropSession(const std::string& session_id) {
  // A turn still queued or running leaves the session too: finishing, it would record the
  // session again (and hold a block for it).
  for (auto& [id, seq] : seqs_) {
    if (seq->req.session_id == session_id) seq->req.session_id.clear();
  }
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return false;
  DropSessionTail(*it->second);
  sessions_.erase(it);
  return true;
}

void Scheduler::DropSessions() {
  for (auto& [id, seq] : seqs_) seq->req.session_id.clear();
  for (auto& [id, ss] : sessions_) DropSessionTail(*ss);
  sessions_.clear();
}

std::optional<BlockId> Scheduler::AllocateOrPreempt(Sequence& s, bool& self_preempted) {
  self_preempted = false;
  for (;;) {
    if (auto b = blocks_.Allocate()) return b;
    // Out of blocks: sessions' partial blocks go first, then the newest running sequence
    // newer than s that is not in a step in flight. If only sequences in flight are newer, s
    // waits for their steps to finish (it keeps its blocks: older sequences keep priority);
    // if none is newer, s itself goes.
    if (DropOneSessionTail()) continue;
    Sequence* victim = &s;
    bool newer_in_flight = false;
    for (auto it = running_.rbegin(); it != running_.rend() && *it != &s; ++it) {
      if (!(*it)->busy) {
        victim = *it;
        break;
      }
      newer_in_flight = true;
    }
    if (victim == &s && newer_in_flight) return std::nullopt;
    Preempt(*victim);
    if (victim == &s) {
      self_preempted = true;
      return std::nullopt;
    }
  }
}

bool Scheduler::EnsureBlocks(Sequence& s, int64_t end, worker::StepPlan& plan) {
  const int64_t bs = opts_.block_size;
  bool self = false;
  // Copy-on-write: the block the next position goes into is partial and shared.
  if (s.computed % bs != 0) {
    const size_t i = static_cast<size_t>(s.computed / bs);
    const BlockId shared = s.blocks[i];
    if (blocks_.ref_count(shared) > 1) {
      // Out of blocks, sessions' partial blocks go first; if the other holder was a session,
      // the block is s's alone then and is written in place (copying it preempted s, or a
      // newer sequence, for nothing).
      std::optional<BlockId> fresh;
      while (!(fresh = blocks_.Allocate()) && blocks_.ref_count(shared) > 1 &&
             DropOneSessionTail()) {
      }
      if (blocks_.ref_count(shared) > 1) {
        if (!fresh) fresh = AllocateOrPreempt(s, self);
        if (!fresh) return false;
        plan.copies.emplace_back(shared, *fresh);
        s.blocks[i] = *fresh;
        blocks_.Release(shared);
      } else if (fresh) {
        blocks_.Release(*fresh);
      }
    }
  }
  while (static_cast<int64_t>(s.blocks.size()) * bs < end) {
    const auto b = AllocateOrPreempt(s, self);
    if (!b) return false;
    s.blocks.push_back(*b);
  }
  return true;
}

void Scheduler::NameFullBlocks(Sequence& s) {
  if (!opts_.prefix_caching || !s.req.prefix_cache) return;
  const int64_t bs = opts_.block_size;
  while (static_cast<int64_t>(s.names.size() + 1) * bs <= s.computed) {
    const size_t i = s.names.size();
    const kvstore::BlockHash h = kvstore::ChainHash(i == 0 ? salt_ : s.names.back(),
                                                    std::span(s.tokens).subspan(i * bs, bs));
    blocks_.Name(s.blocks[i], h);  // false: another block has this name; ours stays unnamed
    s.names.push_back(h);
    if (!s.pending.empty() && s.pending.front() == h) {
      // Computed now: no longer in flight. (pending is short; erase from the front.)
      Uncount(h, in_flight_);
      s.pending.erase(s.pending.begin());
    }
  }
}

void Scheduler::RecordSession(Sequence& s) {
  if (s.req.session_id.empty() || !opts_.prefix_caching || !s.req.prefix_cache) return;
  auto [it, fresh] = sessions_.try_emplace(s.req.session_id, nullptr);
  if (fresh) {
    it->second = std::make_unique<Session>();
    if (static_cast<int32_t>(sessions_.size()) > opts_.max_sessions) {
      auto lru = sessions_.end();
      for (auto j = sessions_.begin(); j != sessions_.end(); ++j) {
        if (j != it && (lru == sessions_.end() || j->second->last_use < lru->second->last_use))
          lru = j;
      }
      if (lru != sessions_.end()) {  // none other with max_sessions 0: keep just this one
        DropSessionTail(*lru->second);
        sessions_.erase(lru);
        it = sessions_.find(s.req.session_id);
      }
    }
  }
  Session& ss = *it->second;
  ss.last_use = ++session_clock_;
  const int64_t bs = opts_.block_size;
  BlockId tail = -1;
  if (s.computed % bs != 0) {
    tail = s.blocks[s.computed / bs];
    blocks_.Acquire(tail);
  }
  DropSessionTail(ss);
  ss.tail = tail;
  ss.tokens.assign(s.tokens.begin(), s.tokens.begin() + s.computed);
  // NameFullBlocks has named every full computed block (names holds computed / bs of them).
  const size_t full = static_cast<size_t>(s.computed / bs);
  ss.prefix = full == 0 ? salt_ : s.names[full - 1];
}

void Scheduler::Finish(Sequence& s, absl::Status status, const std::string& reason) {
  // A turn ended before it computed anything (waiting, or preempted) leaves its session as the
  // previous turn left it.
  if (status.ok() && s.computed > 0) RecordSession(s);
  Unqueue(s);
  ReleaseBlocks(s);
  if (auto it = std::find(running_.begin(), running_.end(), &s); it != running_.end()) {
    running_.erase(it);
  }
  if (auto it = std::find(waiting_.begin(), waiting_.end(), &s); it != waiting_.end()) {
    waiting_.erase(it);
  }
  s.done.status = std::move(status);
  s.done.stop_reason = reason;
  const Clock::time_point end = Clock::now();
  s.done.total_ms = Seconds(s.submitted, end) * 1e3;
  if (s.done.status.ok()) {
    ++stats_.finished;
    if (s.generated() > 0) decode_.Observe(Seconds(s.first_token, end));
  }
  // Ended by Cancel or CancelAll (also with the drain's Unavailable): cancelled, not failed.
  if (!s.done.status.ok() && reason != "cancelled") ++stats_.failed;
  // Take ownership before the callback: it may submit new requests.
  auto node = seqs_.extract(s.id);
  if (node.mapped()->cb.on_done) node.mapped()->cb.on_done(node.mapped()->done);
}

absl::Status Scheduler::Step() {
  worker::StepPlan plan;
  if (!BeginStep(plan)) return absl::OkStatus();
  logits_.resize(plan.n_logits() * opts_.n_vocab);
  const absl::Status s = runner_(plan, logits_);
  return FinishStep(s, logits_);
}

bool Scheduler::BeginStep(worker::StepPlan& plan) {
  plan = worker::StepPlan();
  if (steps_in_flight() >= std::max(1, opts_.max_steps_in_flight)) return false;
  // Test hook: a random preemption must never change what a sequence generates.
  if (opts_.preempt_probability > 0 && !running_.empty() &&
      std::uniform_real_distribution<double>(0, 1)(preempt_rng_) < opts_.preempt_probability) {
    std::vector<Sequence*> idle;
    for (Sequence* q : running_) {
      if (!q->busy) idle.push_back(q);
    }
    if (!idle.empty())
      Preempt(*idle[std::uniform_int_distribution<size_t>(0, idle.size() - 1)(preempt_rng_)]);
  }
  // Admission: FCFS while the batch has room and the pool can hold the newcomer's prompt (an
  // empty batch always admits: a lone request fits, Submit checked). Blocks are allocated when
  // planned, so the prompts admitted in this pass are counted against the pool here.
  int64_t promised = 0;
  for (auto it = waiting_.begin();
       it != waiting_.end() && static_cast<int32_t>(running_.size()) < opts_.max_seqs;) {
    Sequence& s = **it;
    Admit(s);
    // In-batch prefix sharing: if a running sequence is computing this one's next block right
    // now, wait for it (later requests may go ahead) rather than compute the same prefix twice.
    if (!running_.empty() && WaitsForInFlightBlock(s)) {
      ReleaseBlocks(s);
      ++it;
      continue;
    }
    // The prompt's blocks still to allocate, the first generated token's, and a copy of a
    // session's shared partial block (copy-on-write before the turn writes into it).
    const int64_t need = CeilDiv(static_cast<int64_t>(s.tokens.size()), opts_.block_size) -
                         static_cast<int64_t>(s.blocks.size()) + 1 +
                         (s.computed % opts_.block_size != 0 ? 1 : 0);
    // (Room() scans the sessions: only when the free and cached blocks fall short.)
    if (!running_.empty() && need + promised > blocks_.available() && need + promised > Room()) {
      ReleaseBlocks(s);
      break;
    }
    promised += need;
    it = waiting_.erase(it);
    Start(s);
  }
  if (running_.empty()) return false;

  // Oldest first: decode tokens and prefill chunks share the token budget. With steps in
  // flight, sequences of unfinished steps sit this one out, and a step takes its share of the
  // batch so the next one has sequences too.
  std::vector<Scheduled> scheduled;
  int64_t budget = opts_.max_batched_tokens;
  const int64_t depth = std::max(1, opts_.max_steps_in_flight);
  const size_t share = static_cast<size_t>(CeilDiv(static_cast<int64_t>(running_.size()), depth));
  for (size_t i = 0; i < running_.size() && budget > 0 && scheduled.size() < share; ++i) {
    Sequence& s = *running_[i];
    if (s.busy) continue;
    const int64_t todo = static_cast<int64_t>(s.tokens.size()) - s.computed;
    const int32_t chunk = static_cast<int32_t>(std::min(todo, budget));
    // False: s itself was preempted, or only sequences in flight could give blocks back.
    if (!EnsureBlocks(s, s.computed + chunk, plan)) break;
    worker::SeqChunk c;
    c.n_tokens = chunk;
    c.pos0 = static_cast<int32_t>(s.computed);
    c.want_logits = s.computed + chunk == static_cast<int64_t>(s.tokens.size());
    c.blocks = s.blocks;
    plan.seqs.push_back(std::move(c));
    plan.tokens.insert(plan.tokens.end(), s.tokens.begin() + s.computed,
                       s.tokens.begin() + s.computed + chunk);
    scheduled.push_back({&s, chunk});
    budget -= chunk;
  }
  // Sequences preempted after being scheduled cannot exist: victims come from the back of the
  // batch, beyond every scheduled sequence. A sequence that stopped for blocks after its
  // copy-on-write was planned still needs that copy: a plan of copies alone runs too.
  if (plan.seqs.empty() && plan.copies.empty()) return false;
  for (Scheduled& sc : scheduled) sc.seq->busy = true;
  steps_.push_back(std::move(scheduled));
  ++stats_.steps;
  return true;
}

absl::Status Scheduler::FinishStep(const absl::Status& s, std::span<float> all_logits) {
  if (steps_.empty()) return absl::FailedPreconditionError("scheduler: no step in flight");
  std::vector<Scheduled> scheduled = std::move(steps_.front());
  steps_.pop_front();
  for (Scheduled& sc : scheduled) sc.seq->busy = false;
  if (!s.ok()) {
    // Callbacks may cancel other requests of this step: finish by id, skipping any already gone.
    std::vector<RequestId> ids;
    for (const Scheduled& sc : scheduled) ids.push_back(sc.seq->id);
    for (RequestId id : ids) {
      if (auto it = seqs_.find(id); it != seqs_.end()) Finish(*it->second, s, "error");
    }
    RunDeferredEnds();
    return s;
  }
  const auto now = Clock::now();
  int64_t row = 0;
  in_step_ = true;
  for (const Scheduled& sc : scheduled) {
    Sequence& s = *sc.seq;
    const bool prefill = static_cast<int64_t>(s.tokens.size()) - s.computed > 1;
    if (prefill || s.generated() == 0) stats_.prompt_tokens_computed += sc.chunk;
    s.computed += sc.chunk;
    NameFullBlocks(s);
    if (s.computed != static_cast<int64_t>(s.tokens.size())) continue;  // prefill continues
    // Sampled in place (no copy of the row: at 16 sequences, 16 x 192 KB per step).
    const std::span<float> logits = all_logits.subspan(row++ * opts_.n_vocab, opts_.n_vocab);
    if (s.req.return_logits && s.generated() == 0 && s.done.first_logits.empty()) {
      s.done.first_logits.assign(logits.begin(), logits.end());
    }
    if (s.generated() >= s.req.max_tokens) {
      Finish(s, absl::OkStatus(), "length");
      continue;
    }
    // Log-probabilities come from the model's distribution, before the sampler adjusts logits.
    if (s.req.logprobs > 0) raw_logits_.assign(logits.begin(), logits.end());
    const int32_t tok = s.sampler.Sample(logits, s.tokens);
    if (s.req.logprobs > 0) {
      s.done.logprobs.push_back(LogprobsOf(raw_logits_, tok, s.req.logprobs));
      if (s.cb.on_logprobs) s.cb.on_logprobs(s.id, s.done.logprobs.back());
    }
    s.tokens.push_back(tok);
    s.done.tokens.push_back(tok);
    ++stats_.generated_tokens;
    if (s.generated() == 1) {
      const double ttft = Seconds(s.submitted, now);
      s.done.ttft_ms = ttft * 1e3;
      ttft_.Observe(ttft);
      prefill_.Observe(Seconds(s.admitted, now));
      s.first_token = now;
    } else {
      itl_.Observe(Seconds(s.last_token, now));
    }
    s.last_token = now;
    if (s.cb.on_token) s.cb.on_token(s.id, tok);
    if (!s.req.ignore_eos && opts_.is_end_of_generation && opts_.is_end_of_generation(tok)) {
      Finish(s, absl::OkStatus(), "eos");
    } else if (s.generated() >= s.req.max_tokens ||
               static_cast<int64_t>(s.tokens.size()) > opts_.max_context) {
      Finish(s, absl::OkStatus(), "length");
    }
  }
  in_step_ = false;
  RunDeferredEnds();
  return absl::OkStatus();
}

int64_t Scheduler::KnownPrefixTokens(const std::vector<int32_t>& prompt) const {
  if (!opts_.prefix_caching) return 0;
  const int64_t bs = opts_.block_size;
  kvstore::BlockHash parent = salt_;
  int64_t n = 0;
  while ((n + 1) * bs <= static_cast<int64_t>(prompt.size()) - 1) {
    parent = kvstore::ChainHash(parent, std::span(prompt).subspan(n * bs, bs));
    if (!blocks_.Find(parent) && !in_flight_.contains(parent) && !queued_.contains(parent)) break;
    ++n;
  }
  return n * bs;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st = stats_;
  st.blocks_total = blocks_.n_blocks();
  st.blocks_used = blocks_.referenced();
  st.blocks_cached = blocks_.cached();
  st.blocks_free = blocks_.unused();
  st.evictions = blocks_.evictions();
  st.running = static_cast<int32_t>(running_.size());
  st.waiting = static_cast<int32_t>(waiting_.size());
  st.sessions = static_cast<int32_t>(sessions_.size());
  return st;
}

}  // namespace kvmesh::serving
