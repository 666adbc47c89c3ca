// The coordinator's scheduler: admits requests, owns every KV block decision and plans each
// engine step (worker/step_plan.h).
//
// - Paged KV: each sequence has a block table into a pool of n_blocks blocks (kvstore::
//   BlockManager); blocks are allocated as the sequence grows.
// - Prefix reuse: full blocks are named by a hash chain (kvstore/block_hash.h); a new request
//   acquires the longest named prefix of its prompt and computes only the rest. Sessions
//   (Request::session_id) also keep their last partial block, copied before it is written.
// - Continuous batching: between steps, waiting requests join the running batch (up to
//   max_seqs); each step mixes decode tokens and prefill chunks under max_batched_tokens
//   (chunked prefill), oldest sequence first. A request whose next prompt block a running
//   sequence is computing waits for it (in-batch prefix sharing) instead of computing it again.
// - Preemption by recompute: when blocks run out, the newest running sequence gives its blocks
//   back and waits; it re-prefills its prompt and generated tokens later (through the prefix
//   cache where its blocks survived). The oldest sequence always progresses, so nothing
//   deadlocks; a request that could not fit even alone is rejected at Submit.
//
// The model is behind a Runner (the engine's Step), so the scheduling logic is testable with a
// fake model. Not thread safe: one thread submits, cancels and steps.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kvstore/block_hash.h"
#include "kvstore/block_manager.h"
#include "model/sampler.h"
#include "serving/metrics.h"
#include "util/aligned_vector.h"
#include "worker/step_plan.h"

namespace kvmesh::serving {

using RequestId = uint64_t;

struct Request {
  std::vector<int32_t> prompt;  // token ids
  int32_t max_tokens = 256;
  bool ignore_eos = false;  // keep generating past end-of-generation tokens (benchmarks)
  model::SamplingParams sampling;
  // Non-empty: a conversation. Its KV is kept after this turn so the next turn (whose prompt
  // extends this one's prompt and answer) computes only its new tokens.
  std::string session_id;
  bool prefix_cache = true;  // false: compute the whole prompt (and publish nothing)
  // > 0: report each sampled token's log-probability and the top `logprobs` alternatives (at
  // most kMaxLogprobs), from the model's distribution before sampling adjustments.
  int32_t logprobs = 0;
  bool return_logits = false;  // Completion::first_logits (tests, debugging)
  // With several replicas (ServingEngine): run on the replica of this earlier request, whose
  // prompt's KV this one will reuse (the n choices of one prompt). The scheduler ignores it.
  std::optional<RequestId> replica_of;
};

constexpr int32_t kMaxLogprobs = 20;

// A sampled token's log-probability under the model, and the most likely alternatives.
struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // (token, logprob), most likely first
};

struct Completion {
  RequestId id = 0;
  absl::Status status;          // OK, Cancelled, or why the request failed
  std::string stop_reason;      // "eos", "length", "cancelled" or "error"
  std::vector<int32_t> tokens;  // generated ids, including a final end-of-generation token
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens whose KV was reused at admission
  int32_t preemptions = 0;
  double queue_ms = 0;                  // submit to first admission to the batch (0: never)
  double ttft_ms = 0;                   // submit to first token
  double total_ms = 0;                  // submit to completion
  std::vector<float> first_logits;      // the prompt's last-position logits, if return_logits
  std::vector<TokenLogprobs> logprobs;  // one per generated token, if Request::logprobs > 0
};

struct Callbacks {
  std::function<void(RequestId, int32_t token)> on_token;  // each token as it is sampled
  // With Request::logprobs: each token's log-probabilities, just before its on_token.
  std::function<void(RequestId, const TokenLogprobs&)> on_logprobs;
  std::function<void(const Completion&)> on_done;  // exactly once per accepted request
};

struct SchedulerOptions {
  int32_t n_blocks = 0, block_size = 16;
  int64_t max_context = 0;  // positions one sequence may hold
  int32_t n_vocab = 0;
  int32_t max_seqs = 16;             // sequences in the running batch
  int32_t max_batched_tokens = 512;  // tokens per step (chunked prefill)
  int32_t max_waiting = 1024;        // queued requests beyond which Submit refuses
  int32_t max_sessions = 256;        // sessions kept (least recently used dropped)
  bool prefix_caching = true;        // engine-wide: name and reuse full blocks
  std::string cache_salt;            // model, layout and KV format (worker::Engine::cache_salt)
  std::function<bool(int32_t)> is_end_of_generation;
  // Steps that may be begun and not yet finished at once (BeginStep ... FinishStep): the
  // pipeline stages' count. A sequence is in at most one of them; each step takes about
  // 1/max_steps_in_flight of the running batch, so every stage has work.
  int32_t max_steps_in_flight = 1;
  // Test hook: before each step, with this probability, preempt one running sequence at random.
  double preempt_probability = 0;
  uint64_t preempt_seed = 1;
};

struct SchedulerStats {
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;    // of which found cached
  // used (referenced) + cached (unreferenced, kept for reuse) + free (holding nothing) = total.
  int32_t blocks_total = 0, blocks_used = 0, blocks_cached = 0, blocks_free = 0;
  int64_t evictions = 0, preemptions = 0, steps = 0;
  int64_t submitted = 0, finished = 0, rejected = 0, cancelled = 0, failed = 0;
  int64_t prompt_tokens_computed = 0, generated_tokens = 0;
  int32_t running = 0, waiting = 0, sessions = 0;
};

class Scheduler {
 public:
  // Runs a plan on the model and fills plan.n_logits() rows of n_vocab logits.
  using Runner = std::function<absl::Status(const worker::StepPlan&, std::span<float>)>;

  Scheduler(const SchedulerOptions& opts, Runner runner);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. InvalidArgument (naming the field) for a bad request, including one that
  // could not fit in the KV pool or context even alone; ResourceExhausted when the waiting
  // queue is full. On success, callbacks.on_done is called exactly once, from Step or Cancel.
  absl::StatusOr<RequestId> Submit(Request req, Callbacks callbacks);
  // Ends a waiting or running request (Completion status Cancelled). False if unknown/done.
  // From a callback inside Step, the request ends when that step's sampling is done.
  bool Cancel(RequestId id);
  // Ends a request as finished (OK, stop reason "stop"), as if it had generated its end: for a
  // stop the caller found itself (an API's stop sequence). Its session is recorded, it counts
  // as finished, not cancelled. False if unknown. Safe from a callback (then after the step).
  bool FinishEarly(RequestId id);
  // Cancels every waiting and running request (shutdown); those in a step in flight end when
  // it finishes. `why` is their completions' status (a drain's deadline passing is Unavailable,
  // which the HTTP API answers 503).
  void CancelAll(absl::Status why = absl::CancelledError("request cancelled"));
  // Plans and runs one step. OK and nothing done when idle. If the runner fails, every sequence
  // of the step completes with that error and it is returned (Unavailable: a rank is gone).
  absl::Status Step();
  // Step in two phases, for a caller that runs several plans at once: BeginStep plans (false:
  // nothing to run), the caller runs the plan, FinishStep takes its status and logits
  // (plan.n_logits() rows: scratch of the step, which the samplers edit in place).
  // Step() == BeginStep + runner + FinishStep.
  // Pipelining: up to max_steps_in_flight steps may be begun before the first is finished; they
  // finish in the order they began. A sequence in an unfinished step is not scheduled,
  // preempted or ended until that step finishes (a Cancel of it takes effect then).
  bool BeginStep(worker::StepPlan& plan);
  absl::Status FinishStep(const absl::Status& run_status, std::span<float> logits);
  int32_t steps_in_flight() const { return static_cast<int32_t>(steps_.size()); }
  bool idle() const { return running_.empty() && waiting_.empty(); }

  SchedulerStats stats() const;
  // Whether this scheduler keeps session `id` (a finished turn recorded it, not dropped since).
  bool HasSession(const std::string& id) const { return sessions_.contains(id); }
  // Prompt tokens of `prompt`, in full blocks, that this scheduler knows (for routing,
  // serving/router.h): blocks it has cached, that a running sequence is computing, or that a
  // waiting request's prompt holds (those run here before the new request could, so it would
  // share them).
  int64_t KnownPrefixTokens(const std::vector<int32_t>& prompt) const;
  // Block names held for that (waiting prompts', running sequences'); 0 when idle (tests).
  size_t announced_blocks() const { return queued_.size() + in_flight_.size(); }
  const Histogram& ttft_seconds() const { return ttft_; }
  const Histogram& itl_seconds() const { return itl_; }
  // A request's time in three parts: submission to its first admission into the batch (queue),
  // first admission to its first token (prefill, with any preemption before that token), and
  // first token to a successful end (decode). queue + prefill is its TTFT.
  const Histogram& queue_seconds() const { return queue_; }
  const Histogram& prefill_seconds() const { return prefill_; }
  const Histogram& decode_seconds() const { return decode_; }
  const kvstore::BlockManager& blocks() const { return blocks_; }
  // The preemption test hook (SchedulerOptions::preempt_probability), for end-to-end tests.
  void SetPreemptProbabilityForTesting(double p) { opts_.preempt_probability = p; }
  // Forgets every session (their partial blocks return to the pool).
  void DropSessions();
  // Forgets one session; false if unknown.
  bool DropSession(const std::string& session_id);

 private:
  struct Sequence;
  struct Session;
  struct Scheduled {
    Sequence* seq;
    int32_t chunk;
  };
  // Cancel (early false; the completion's status is `why`) and FinishEarly (true).
  bool End(RequestId id, bool early, const absl::Status& why);
  void RunDeferredEnds();
  void Admit(Sequence& s);  // matches the cached prefix (acquires its blocks)
  void Start(Sequence& s);  // moves an admitted sequence into the running batch
  bool WaitsForInFlightBlock(const Sequence& s) const;
  void DropInFlight(Sequence& s, size_t keep_from);
  void Unqueue(Sequence& s);  // its prompt's names leave queued_ (it started or ended)
  bool EnsureBlocks(Sequence& s, int64_t end, worker::StepPlan& plan);
  std::optional<kvstore::BlockId> AllocateOrPreempt(Sequence& s, bool& self_preempted);
  void Preempt(Sequence& s);
  void ReleaseBlocks(Sequence& s);
  void NameFullBlocks(Sequence& s);
  void Finish(Sequence& s, absl::Status status, const std::string& reason);
  void RecordSession(Sequence& s);
  void DropSessionTail(Session& ss);
  bool DropOneSessionTail();
  // Blocks an allocation can have without preempting: free and cached ones, and sessions'
  // partial blocks no sequence shares (dropped first when the pool runs out).
  int64_t Room() const;

  SchedulerOptions opts_;
  Runner runner_;
  kvstore::BlockManager blocks_;
  kvstore::BlockHash salt_;
  RequestId next_id_ = 1;
  uint64_t next_arrival_ = 0, session_clock_ = 0;
  absl::flat_hash_map<RequestId, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   // by arrival (preempted sequences go back to the front)
  std::vector<Sequence*> running_;  // by arrival
  absl::flat_hash_map<std::string, std::unique_ptr<Session>> sessions_;
  // Names of blocks running sequences will compute, with how many sequences compute each.
  absl::flat_hash_map<kvstore::BlockHash, int32_t> in_flight_;
  // Names of the full blocks of waiting requests' prompts (until each first starts), with how
  // many prompts hold each: KnownPrefixTokens.
  absl::flat_hash_map<kvstore::BlockHash, int32_t> queued_;
  SchedulerStats stats_;
  Histogram ttft_, itl_, queue_, prefill_, decode_;
  std::mt19937_64 preempt_rng_;
  util::AlignedVector<float> logits_;  // starts on a cache line (the LM head writes it)
  std::vector<float> raw_logits_;      // a sampled row before the sampler adjusts it (logprobs)
  std::deque<std::vector<Scheduled>> steps_;  // begun and not finished, oldest first
  bool in_step_ = false;                      // sampling: callbacks are running
  // Cancel / FinishEarly calls made from callbacks or on sequences in flight: (id, early).
  struct DeferredEnd {
    RequestId id;
    bool early;
    absl::Status why;
  };
  std::vector<DeferredEnd> deferred_ends_;
};

}  // namespace kvmesh::serving
