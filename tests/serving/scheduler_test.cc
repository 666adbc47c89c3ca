// The scheduler against a fake model whose "KV cache" is the token ids themselves: each block
// slot stores the id written at that position, and the next token is a hash of the ids read
// back through the block table. A wrong table, a shared block written without a copy, a slot
// overwritten or a recompute at the wrong position changes the output, so comparing with the
// token sequence's own hash checks every block decision end to end.
#include "serving/scheduler.h"

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <map>
#include <random>

namespace kvmesh::serving {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kEos = 0;

int32_t NextOf(const std::vector<int32_t>& history) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : history) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  return static_cast<int32_t>(1 + (h >> 33) % (kVocab - 1));  // never kEos
}

class FakeModel {
 public:
  FakeModel(int32_t n_blocks, int32_t block_size)
      : bs_(block_size), slots_(static_cast<size_t>(n_blocks) * block_size, -1) {}
  absl::Status Run(const worker::StepPlan& plan, std::span<float> logits) {
    ++steps_;
    if (auto s =
            worker::ValidateStepPlan(plan, static_cast<int32_t>(slots_.size() / bs_), bs_, kVocab);
        !s.ok()) {
      return s;
    }
    for (const auto& [src, dst] : plan.copies) {
      std::copy_n(slots_.begin() + src * bs_, bs_, slots_.begin() + dst * bs_);
      ++copies_;
    }
    size_t at = 0, row = 0;
    for (const auto& c : plan.seqs) {
      max_batch_ = std::max(max_batch_, plan.seqs.size());
      for (int32_t i = 0; i < c.n_tokens; ++i) Slot(c, c.pos0 + i) = plan.tokens[at++];
      if (!c.want_logits) continue;
      std::vector<int32_t> history;
      for (int32_t p = 0; p < c.pos0 + c.n_tokens; ++p) history.push_back(Slot(c, p));
      std::span<float> out = logits.subspan(row++ * kVocab, kVocab);
      std::fill(out.begin(), out.end(), -100.0f);
      out[NextOf(history)] = 100.0f;
    }
    return absl::OkStatus();
  }
  int64_t copies() const { return copies_; }
  int64_t steps() const { return steps_; }
  size_t max_batch() const { return max_batch_; }

 private:
  int32_t& Slot(const worker::SeqChunk& c, int32_t p) {
    return slots_[static_cast<size_t>(c.blocks[p / bs_]) * bs_ + p % bs_];
  }
  int32_t bs_;
  std::vector<int32_t> slots_;
  int64_t copies_ = 0, steps_ = 0;
  size_t max_batch_ = 0;
};

// What a request must generate: the fake model run on the true token sequence.
std::vector<int32_t> Expected(std::vector<int32_t> tokens, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(NextOf(tokens));
    tokens.push_back(out.back());
  }
  return out;
}

struct Harness {
  FakeModel model;
  Scheduler sched;
  std::map<RequestId, Completion> done;
  Harness(SchedulerOptions o)
      : model(o.n_blocks, o.block_size),
        sched(Fill(o),
              [this](const worker::StepPlan& p, std::span<float> l) { return model.Run(p, l); }) {}
  static SchedulerOptions Fill(SchedulerOptions o) {
    o.n_vocab = kVocab;
    if (o.max_context == 0) o.max_context = 4096;
    o.is_end_of_generation = [](int32_t t) { return t == kEos; };
    return o;
  }
  RequestId Submit(std::vector<int32_t> prompt, int max_tokens, std::string session = "") {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.session_id = std::move(session);
    Callbacks cb;
    cb.on_done = [this](const Completion& c) {
      EXPECT_EQ(done.count(c.id), 0u) << "on_done twice";
      done[c.id] = c;
    };
    auto id = sched.Submit(std::move(r), cb);
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }
  void Drain() {
    for (int i = 0; !sched.idle() && i < 100000; ++i) ASSERT_TRUE(sched.Step().ok());
    ASSERT_TRUE(sched.idle()) << "no progress";
  }
  // After every test: nothing referenced once sessions are dropped.
  void ExpectNoLeaks() {
    sched.DropSessions();
    if (sched.idle()) {
      EXPECT_EQ(sched.announced_blocks(), 0u);
    }
    EXPECT_EQ(sched.blocks().referenced(), 0);
    EXPECT_TRUE(sched.blocks().Consistent());
    const SchedulerStats st = sched.stats();
    EXPECT_EQ(st.blocks_used + st.blocks_cached + st.blocks_free, st.blocks_total);
  }
};

std::vector<int32_t> Tokens(int n, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = 1 + static_cast<int32_t>(rng() % (kVocab - 1));
  return t;
}

// A randomized workload: each round submits 0-2 prompts over a few shared documents (some in
// sessions), sometimes cancels a request, then runs `step` 0-3 times. Afterwards every
// request must have ended once, cancelled or with exactly what the model says.
struct Soak {
  std::mt19937 rng;
  std::vector<std::vector<int32_t>> docs = {Tokens(20, 1), Tokens(33, 2), Tokens(9, 3)};
  std::map<RequestId, std::vector<int32_t>> prompts;
  std::map<RequestId, int> max_tokens;
  explicit Soak(uint32_t seed) : rng(seed) {}
  void Run(Harness& h, int rounds, int cancel_one_in, const std::function<void()>& step) {
    for (int round = 0; round < rounds; ++round) {
      for (int k = rng() % 3; k > 0; --k) {
        auto p = docs[rng() % docs.size()];
        for (int32_t t : Tokens(1 + rng() % 10, round * 10 + k)) p.push_back(t);
        const int n = 1 + rng() % 12;
        const std::string session =
            rng() % 3 == 0 ? std::string("s").append(std::to_string(rng() % 5)) : "";
        const RequestId id = h.Submit(p, n, session);
        prompts[id] = p;
        max_tokens[id] = n;
      }
      if (rng() % cancel_one_in == 0 && !prompts.empty()) {
        h.sched.Cancel(std::next(prompts.begin(), rng() % prompts.size())->first);
      }
      for (int s = rng() % 4; s > 0; --s) step();
      ASSERT_TRUE(h.sched.blocks().Consistent());
    }
  }
  void Check(Harness& h) {
    for (const auto& [id, p] : prompts) {
      ASSERT_EQ(h.done.count(id), 1u);
      const Completion& c = h.done[id];
      if (!c.status.ok()) {
        EXPECT_TRUE(absl::IsCancelled(c.status)) << c.status;
        continue;
      }
      EXPECT_EQ(c.tokens, Expected(p, max_tokens[id])) << "request " << id;
    }
  }
};

TEST(Scheduler, OneRequestGeneratesWhatTheModelSays) {
  Harness h({.n_blocks = 16, .block_size = 4});
  const auto prompt = Tokens(10, 1);
  const RequestId id = h.Submit(prompt, 12);
  h.Drain();
  ASSERT_EQ(h.done.count(id), 1u);
  EXPECT_TRUE(h.done[id].status.ok());
  EXPECT_EQ(h.done[id].tokens, Expected(prompt, 12));
  EXPECT_EQ(h.done[id].stop_reason, "length");
  h.ExpectNoLeaks();
}

TEST(Scheduler, SharedPrefixIsReusedAcrossRequestsAndOutputsDoNotChange) {
  Harness h({.n_blocks = 64, .block_size = 4});
  const auto doc = Tokens(37, 2);
  std::vector<std::vector<int32_t>> prompts;
  for (int q = 0; q < 4; ++q) {
    auto p = doc;
    for (int32_t t : Tokens(5, 100 + q)) p.push_back(t);
    prompts.push_back(p);
  }
  const RequestId first = h.Submit(prompts[0], 6);
  h.Drain();
  EXPECT_EQ(h.done[first].cached_tokens, 0);
  std::vector<RequestId> ids;
  for (int q = 1; q < 4; ++q) ids.push_back(h.Submit(prompts[q], 6));
  h.Drain();
  for (int q = 1; q < 4; ++q) {
    const Completion& c = h.done[ids[q - 1]];
    EXPECT_EQ(c.tokens, Expected(prompts[q], 6)) << q;
    EXPECT_EQ(c.cached_tokens, 36) << "the document's 9 full blocks";
  }
  const auto st = h.sched.stats();
  EXPECT_EQ(st.prefix_hit_tokens, 3 * 36);
  EXPECT_EQ(st.prefix_query_tokens, 4 * 42);
  h.ExpectNoLeaks();
}

// Requests that arrive together with a common uncached prefix: one computes it, the others
// wait for its blocks instead of computing them again.
TEST(Scheduler, ConcurrentRequestsOverOneContextComputeItOnce) {
  Harness h({.n_blocks = 64, .block_size = 4, .max_batched_tokens = 8});
  const auto doc = Tokens(40, 7);
  std::vector<std::pair<RequestId, std::vector<int32_t>>> reqs;
  for (int q = 0; q < 4; ++q) {
    auto p = doc;
    for (int32_t t : Tokens(3, 400 + q)) p.push_back(t);
    reqs.push_back({h.Submit(p, 5), p});
  }
  h.Drain();
  for (size_t q = 0; q < reqs.size(); ++q) {
    const Completion& c = h.done[reqs[q].first];
    EXPECT_EQ(c.tokens, Expected(reqs[q].second, 5));
    EXPECT_EQ(c.cached_tokens, q == 0 ? 0 : 40) << "request " << q;
  }
  // 40 document tokens once + 4 x 3 question tokens (+ decode) computed as prompt.
  EXPECT_EQ(h.sched.stats().prompt_tokens_computed, 40 + 4 * 3);
  h.ExpectNoLeaks();
}

// What routing sees of a prompt (serving/router.h): the blocks a waiting request's prompt holds,
// those a running sequence computes and those cached, and no more once a request ends.
TEST(Scheduler, KnownPrefixCountsQueuedComputingAndCachedBlocks) {
  Harness h({.n_blocks = 64, .block_size = 16, .max_seqs = 1, .max_batched_tokens = 16});
  const auto doc = Tokens(64, 7);
  auto after_doc = [&](std::vector<int32_t> tail) {
    auto p = doc;
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const auto question = after_doc({1, 2, 3}), other_question = after_doc({4, 5});
  auto diverging = doc;
  diverging[40] = diverging[40] % (kVocab - 1) + 1;  // a change in its third block
  const auto lone = Tokens(40, 8);
  EXPECT_EQ(h.sched.KnownPrefixTokens(other_question), 0);
  const RequestId a = h.Submit(question, 4);
  const RequestId b = h.Submit(lone, 4);                     // waits: one sequence at a time
  EXPECT_EQ(h.sched.KnownPrefixTokens(other_question), 64);  // queued in a's prompt
  EXPECT_EQ(h.sched.KnownPrefixTokens(diverging), 32);
  EXPECT_EQ(h.sched.KnownPrefixTokens(lone), 32);  // b's two full blocks (its last token apart)
  EXPECT_EQ(h.sched.announced_blocks(), 4u + 2u);  // a's and b's full blocks, queued
  ASSERT_TRUE(h.sched.Step().ok());                // a computes its first block
  EXPECT_EQ(h.sched.stats().running, 1);
  EXPECT_EQ(h.sched.announced_blocks(), 3u + 2u);            // a's three to compute, b's two queued
  EXPECT_EQ(h.sched.KnownPrefixTokens(other_question), 64);  // one cached, three computing
  EXPECT_TRUE(h.sched.Cancel(b));
  EXPECT_EQ(h.sched.KnownPrefixTokens(lone), 0);  // cancelled while waiting: forgotten
  EXPECT_TRUE(h.sched.Cancel(a));
  EXPECT_EQ(h.sched.KnownPrefixTokens(other_question), 16);  // what a computed stays cached
  h.Drain();
  h.ExpectNoLeaks();
}

TEST(Scheduler, SessionsReuseTheirPartialBlockThroughACopy) {
  Harness h({.n_blocks = 64, .block_size = 8});
  auto conv = Tokens(21, 3);
  // Turn 1 computes 21 + 2 positions (its last token is never run): 2 full blocks + 7.
  const RequestId t1 = h.Submit(conv, 3, "s");
  h.Drain();
  const auto& a = h.done[t1].tokens;
  // Turn 2: the conversation so far (the answer's last token was never run) plus a question.
  conv.insert(conv.end(), a.begin(), a.end());
  for (int32_t t : Tokens(6, 4)) conv.push_back(t);
  const int64_t copies0 = h.model.copies();
  const RequestId t2 = h.Submit(conv, 4, "s");
  h.Drain();
  EXPECT_EQ(h.done[t2].tokens, Expected(conv, 4));
  EXPECT_EQ(h.done[t2].cached_tokens, 21 + 2) << "everything turn 1 computed";
  EXPECT_EQ(h.model.copies(), copies0 + 1) << "the shared partial block is copied, not written";
  // A different conversation under another id does not see this one's tail.
  const RequestId other = h.Submit(conv, 4, "other");
  h.Drain();
  EXPECT_EQ(h.done[other].cached_tokens, 24) << "turn 2's full blocks, no session tail";
  EXPECT_EQ(h.done[other].tokens, Expected(conv, 4));
  h.ExpectNoLeaks();
}

// A session's partial block was computed after the session's own tokens: it must not extend a
// match whose full blocks hold other tokens of the same length (another conversation reusing
// the id, an edited turn), even where the partial block's own tokens agree.
TEST(Scheduler, SessionTailExtendsOnlyTheSessionsOwnPrefix) {
  Harness h({.n_blocks = 64, .block_size = 8});
  const auto a = Tokens(16, 21), b = Tokens(16, 22), q = Tokens(5, 23);
  auto with = [](std::vector<int32_t> x, const std::vector<int32_t>& y) {
    x.insert(x.end(), y.begin(), y.end());
    return x;
  };
  h.Submit(with(a, q), 1, "s");  // the session: 2 full blocks of a, then q in its tail
  h.Drain();
  h.Submit(with(b, q), 1);  // caches b's 2 full blocks
  h.Drain();
  const auto prompt = with(with(b, q), Tokens(4, 24));
  const RequestId id = h.Submit(prompt, 3, "s");
  h.Drain();
  EXPECT_EQ(h.done[id].cached_tokens, 16) << "b's full blocks only: the tail followed a, not b";
  EXPECT_EQ(h.done[id].tokens, Expected(prompt, 3));
  // The session now continues b: its tail extends the same prefix again.
  const auto next = with(with(prompt, h.done[id].tokens), Tokens(2, 25));
  const RequestId again = h.Submit(next, 2, "s");
  h.Drain();
  EXPECT_EQ(h.done[again].cached_tokens, static_cast<int64_t>(prompt.size()) + 2);
  h.ExpectNoLeaks();
}

// Admission counts the blocks of every prompt it admits in one pass: newcomers that do not fit
// together wait instead of being admitted and then preempted.
TEST(Scheduler, AdmissionDoesNotOvercommitThePool) {
  // 12 blocks of 4; each prompt of 17 tokens with 2 to generate needs 5 (admission asks 6).
  Harness h({.n_blocks = 12, .block_size = 4});
  std::vector<std::pair<RequestId, std::vector<int32_t>>> reqs;
  for (int i = 0; i < 3; ++i) {
    const auto p = Tokens(17, 60 + i);
    reqs.push_back({h.Submit(p, 2), p});
  }
  h.Drain();
  for (const auto& [id, p] : reqs) EXPECT_EQ(h.done[id].tokens, Expected(p, 2));
  EXPECT_EQ(h.sched.stats().preemptions, 0);
  EXPECT_EQ(h.sched.stats().prefix_query_tokens, 3 * 17);
  h.ExpectNoLeaks();
}

// FinishEarly (an API's stop sequence): the request ends as finished, not cancelled, with
// stop reason "stop", and its session is recorded; from a token callback it takes effect after
// the step.
TEST(Scheduler, FinishEarlyEndsARequestAsFinished) {
  Harness h({.n_blocks = 32, .block_size = 4});
  const auto p = Tokens(10, 41);
  Request r;
  r.prompt = p;
  r.max_tokens = 50;
  r.sampling.temperature = 0;
  r.session_id = "s";
  Completion got;
  int tokens = 0;
  RequestId id = 0;
  auto sub = h.sched.Submit(r, {.on_token =
                                    [&](RequestId, int32_t) {
                                      if (++tokens == 3) {
                                        EXPECT_TRUE(h.sched.FinishEarly(id));
                                      }
                                    },
                                .on_done = [&](const Completion& c) { got = c; }});
  ASSERT_TRUE(sub.ok());
  id = *sub;
  h.Drain();
  EXPECT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.stop_reason, "stop");
  EXPECT_EQ(got.tokens, Expected(p, 3));
  EXPECT_EQ(h.sched.stats().cancelled, 0);
  EXPECT_EQ(h.sched.stats().finished, 1);
  EXPECT_TRUE(h.sched.HasSession("s")) << "a finished turn keeps its session";
  EXPECT_FALSE(h.sched.FinishEarly(id)) << "already ended";
  h.ExpectNoLeaks();
}

// A session turn ended before it computed anything (FinishEarly while it waits, or after a
// preemption freed its blocks) leaves the session as the previous turn left it: recording the
// turn's 0 computed tokens emptied the session and dropped its partial block, and the next turn
// recomputed what the first had cached.
TEST(Scheduler, FinishEarlyBeforeATurnComputesKeepsTheSession) {
  Harness h({.n_blocks = 32, .block_size = 4});
  auto conv = Tokens(9, 51);
  const RequestId t1 = h.Submit(conv, 3, "s");
  h.Drain();
  const auto& a = h.done[t1].tokens;
  conv.insert(conv.end(), a.begin(), a.end());  // 12 tokens, 11 computed: 2 blocks + 3
  const RequestId t2 = h.Submit(conv, 2, "s");
  EXPECT_TRUE(h.sched.FinishEarly(t2));  // before any step
  h.Drain();
  EXPECT_TRUE(h.done[t2].status.ok());
  EXPECT_TRUE(h.done[t2].tokens.empty());
  for (int32_t t : Tokens(3, 52)) conv.push_back(t);
  const RequestId t3 = h.Submit(conv, 2, "s");
  h.Drain();
  EXPECT_EQ(h.done[t3].cached_tokens, 11) << "everything turn 1 computed, its tail included";
  EXPECT_EQ(h.done[t3].tokens, Expected(conv, 2));
  h.ExpectNoLeaks();
}

// Sessions' partial blocks that no sequence shares count as room at admission, since allocation
// drops them before it preempts anything: with six sessions' tails in a pool of 8, two requests
// of 3 blocks each start together (the second waited for the first to finish).
TEST(Scheduler, AdmissionCountsSessionTailsAsRoom) {
  Harness h({.n_blocks = 8, .block_size = 4});
  for (int i = 0; i < 6; ++i) {
    h.Submit(Tokens(5, 70 + i), 1, std::string("s").append(std::to_string(i)));  // a tail of 1
    h.Drain();
  }
  EXPECT_EQ(h.sched.blocks().referenced(), 6) << "the six tails";
  const auto a = Tokens(5, 80), b = Tokens(5, 81);
  const RequestId ia = h.Submit(a, 2), ib = h.Submit(b, 2);
  ASSERT_TRUE(h.sched.Step().ok());
  EXPECT_EQ(h.sched.stats().running, 2);
  h.Drain();
  EXPECT_EQ(h.done[ia].tokens, Expected(a, 2));
  EXPECT_EQ(h.done[ib].tokens, Expected(b, 2));
  EXPECT_EQ(h.sched.stats().preemptions, 0);
  h.ExpectNoLeaks();
}

// A session turn whose partial block only its session shares, in a pool with no block left:
// the session's hold is dropped and the turn writes the block in place, where it had gone on to
// copy it, found no block and preempted itself.
TEST(Scheduler, FullPoolDropsTheSessionsHoldInsteadOfCopying) {
  Harness h({.n_blocks = 2, .block_size = 4});
  auto conv = Tokens(5, 90);
  const RequestId t1 = h.Submit(conv, 2, "s");  // 6 computed: a full block and a tail of 2
  h.Drain();
  const auto& a = h.done[t1].tokens;
  conv.insert(conv.end(), a.begin(), a.end());
  conv.push_back(Tokens(1, 91)[0]);
  const RequestId t2 = h.Submit(conv, 1, "s");
  h.Drain();
  EXPECT_EQ(h.done[t2].tokens, Expected(conv, 1));
  EXPECT_EQ(h.done[t2].cached_tokens, 6);
  EXPECT_EQ(h.sched.stats().preemptions, 0);
  h.ExpectNoLeaks();
}

// CancelAll with a status (a drain's deadline: Unavailable) ends every request with it, and
// counts them as cancelled, not as failed (an engine error).
TEST(Scheduler, CancelAllWithAStatusCountsAsCancelled) {
  Harness h({.n_blocks = 32, .block_size = 4});
  const RequestId a = h.Submit(Tokens(6, 95), 8), b = h.Submit(Tokens(7, 96), 8);
  ASSERT_TRUE(h.sched.Step().ok());
  h.sched.CancelAll(absl::UnavailableError("shutting down"));
  EXPECT_TRUE(absl::IsUnavailable(h.done[a].status)) << h.done[a].status;
  EXPECT_TRUE(absl::IsUnavailable(h.done[b].status)) << h.done[b].status;
  EXPECT_EQ(h.done[a].stop_reason, "cancelled");
  EXPECT_EQ(h.sched.stats().cancelled, 2);
  EXPECT_EQ(h.sched.stats().failed, 0);
  h.ExpectNoLeaks();
}

// A session dropped while its turn runs stays dropped: the finishing turn does not record it.
TEST(Scheduler, DroppingASessionDuringItsTurnForgetsIt) {
  Harness h({.n_blocks = 32, .block_size = 4});
  const auto p = Tokens(10, 31);
  const RequestId id = h.Submit(p, 6, "s");
  ASSERT_TRUE(h.sched.Step().ok());
  EXPECT_FALSE(h.sched.DropSession("s")) << "not recorded before its first turn ends";
  h.Drain();
  EXPECT_EQ(h.done[id].tokens, Expected(p, 6));
  EXPECT_FALSE(h.sched.HasSession("s"));
  EXPECT_EQ(h.sched.blocks().referenced(), 0) << "no block held for a dropped session";
  h.ExpectNoLeaks();
}

TEST(Scheduler, ContinuousBatchingChunkedPrefillAndPreemptionKeepOutputs) {
  // 24 blocks of 4 = 96 positions for 8 requests of ~30 positions each: preemption is certain.
  Harness h({.n_blocks = 24, .block_size = 4, .max_seqs = 6, .max_batched_tokens = 9});
  std::vector<std::pair<RequestId, std::vector<int32_t>>> reqs;
  const auto shared = Tokens(12, 5);
  for (int i = 0; i < 8; ++i) {
    auto p = i % 2 ? shared : Tokens(3, 50 + i);
    for (int32_t t : Tokens(8 + i, 200 + i)) p.push_back(t);
    reqs.push_back({h.Submit(p, 10), p});
  }
  h.Drain();
  for (const auto& [id, p] : reqs) {
    ASSERT_EQ(h.done.count(id), 1u);
    EXPECT_TRUE(h.done[id].status.ok()) << h.done[id].status;
    EXPECT_EQ(h.done[id].tokens, Expected(p, 10)) << "request " << id;
  }
  const auto st = h.sched.stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(h.model.max_batch(), 1u);
  // Each request's prompt is queried once: re-admissions after preemption are not counted.
  int64_t prompt_tokens = 0;
  for (const auto& [id, p] : reqs) prompt_tokens += static_cast<int64_t>(p.size());
  EXPECT_EQ(st.prefix_query_tokens, prompt_tokens);
  h.ExpectNoLeaks();
}

TEST(Scheduler, RandomPreemptionHookNeverChangesOutputs) {
  Harness h({.n_blocks = 64,
             .block_size = 4,
             .max_seqs = 4,
             .max_batched_tokens = 16,
             .preempt_probability = 0.5,
             .preempt_seed = 11});
  std::vector<std::pair<RequestId, std::vector<int32_t>>> reqs;
  for (int i = 0; i < 6; ++i) {
    const auto p = Tokens(5 + 3 * i, 300 + i);
    reqs.push_back({h.Submit(p, 12, i == 2 ? "s" : ""), p});
  }
  h.Drain();
  for (const auto& [id, p] : reqs) EXPECT_EQ(h.done[id].tokens, Expected(p, 12));
  EXPECT_GT(h.sched.stats().preemptions, 5);
  h.ExpectNoLeaks();
}

TEST(Scheduler, LogprobsDescribeTheModelsDistribution) {
  Harness h({.n_blocks = 16, .block_size = 4});
  Request r;
  r.prompt = Tokens(6, 9);
  r.max_tokens = 5;
  r.sampling.temperature = 0;
  r.logprobs = 3;
  Completion got;
  int streamed = 0;
  Callbacks cb;
  cb.on_logprobs = [&](RequestId, const TokenLogprobs&) { ++streamed; };
  cb.on_done = [&](const Completion& c) { got = c; };
  ASSERT_TRUE(h.sched.Submit(r, cb).ok());
  h.Drain();
  ASSERT_EQ(got.logprobs.size(), got.tokens.size());
  EXPECT_EQ(streamed, 5);
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    const TokenLogprobs& lp = got.logprobs[i];
    EXPECT_EQ(lp.token, got.tokens[i]);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);  // greedy: the most likely token
    EXPECT_NEAR(lp.logprob, 0.0, 1e-6);    // the fake model is one-hot (+100 vs -100)
    EXPECT_LE(lp.top[1].second, lp.top[0].second);
  }
  r.logprobs = 21;
  EXPECT_EQ(h.sched.Submit(r, {}).status().code(), absl::StatusCode::kInvalidArgument);
  h.ExpectNoLeaks();
}

// The sampler edits the step's logits row in place (the repetition penalty): what a request gets
// back of the model's distribution (first_logits, logprobs) is read before that.
TEST(Scheduler, LogitsAndLogprobsAreTheModelsBeforeThePenaltyEditsThem) {
  Harness h({.n_blocks = 16, .block_size = 4});
  // A prompt whose first greedy token is already in it, so the penalty changes that logit.
  std::vector<int32_t> p;
  int32_t first = -1;
  for (int seed = 1; seed < 1000; ++seed) {
    p = Tokens(20, seed);
    first = Expected(p, 1)[0];
    if (std::find(p.begin(), p.end(), first) != p.end()) break;
  }
  ASSERT_NE(std::find(p.begin(), p.end(), first), p.end());
  Request r;
  r.prompt = p;
  r.max_tokens = 3;
  r.sampling.temperature = 0;
  r.sampling.repeat_penalty = 2.0f;  // 100 -> 50 for a token seen, -100 -> -200
  r.logprobs = 2;
  r.return_logits = true;
  Completion got;
  ASSERT_TRUE(h.sched.Submit(r, {.on_done = [&](const Completion& c) { got = c; }}).ok());
  h.Drain();
  EXPECT_EQ(got.tokens, Expected(p, 3));  // 50 is still the largest
  ASSERT_EQ(got.first_logits.size(), static_cast<size_t>(kVocab));
  for (int32_t t = 0; t < kVocab; ++t) {
    EXPECT_EQ(got.first_logits[t], t == first ? 100.0f : -100.0f) << t;
  }
  ASSERT_EQ(got.logprobs.size(), 3u);
  ASSERT_EQ(got.logprobs[0].top.size(), 2u);
  // The model's runner-up is 200 below its best; after the penalty it would be 150.
  EXPECT_NEAR(got.logprobs[0].top[1].second, -200.0, 1e-3);
  h.ExpectNoLeaks();
}

TEST(Scheduler, RejectsWhatCanNeverRunAndBoundsTheQueue) {
  Harness h({.n_blocks = 4, .block_size = 4, .max_context = 64, .max_waiting = 2});
  Request r;
  r.sampling.temperature = 0;
  EXPECT_EQ(h.sched.Submit(r, {}).status().code(), absl::StatusCode::kInvalidArgument);
  r.prompt = Tokens(10, 1);
  r.max_tokens = 7;  // 16 positions = 4 blocks: fits
  EXPECT_TRUE(h.sched.Submit(r, {}).ok());
  r.max_tokens = 8;  // 17 positions: 5 blocks, more than the pool
  auto s = h.sched.Submit(r, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("KV blocks"), std::string::npos) << s.status();
  r.max_tokens = 1;
  r.prompt = {1, kVocab};
  EXPECT_NE(h.sched.Submit(r, {}).status().message().find("outside the vocabulary"),
            std::string::npos);
  r.prompt = Tokens(64, 1);
  EXPECT_NE(h.sched.Submit(r, {}).status().message().find("context size"), std::string::npos);
  r.prompt = Tokens(3, 1);
  EXPECT_TRUE(h.sched.Submit(r, {}).ok());
  EXPECT_EQ(h.sched.Submit(r, {}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(h.sched.stats().rejected, 5);
  h.Drain();
  h.ExpectNoLeaks();
}

TEST(Scheduler, CancelEndsWaitingAndRunningRequestsOnce) {
  Harness h({.n_blocks = 32, .block_size = 4, .max_seqs = 1});
  const RequestId running = h.Submit(Tokens(9, 1), 50);
  const RequestId waiting = h.Submit(Tokens(9, 2), 50);
  ASSERT_TRUE(h.sched.Step().ok());
  EXPECT_TRUE(h.sched.Cancel(waiting));
  ASSERT_TRUE(h.sched.Step().ok());
  EXPECT_TRUE(h.sched.Cancel(running));
  EXPECT_FALSE(h.sched.Cancel(running));
  EXPECT_TRUE(h.sched.idle());
  EXPECT_EQ(h.done[running].stop_reason, "cancelled");
  EXPECT_TRUE(absl::IsCancelled(h.done[waiting].status));
  EXPECT_EQ(h.sched.stats().cancelled, 2);
  h.ExpectNoLeaks();
}

TEST(Scheduler, CancelFromATokenCallbackIsSafe) {
  Harness h({.n_blocks = 32, .block_size = 4});
  Request r;
  r.prompt = Tokens(6, 1);
  r.max_tokens = 100;
  r.sampling.temperature = 0;
  Callbacks cb;
  int tokens = 0;
  bool ended = false;
  cb.on_token = [&](RequestId id, int32_t) {
    if (++tokens == 3) h.sched.Cancel(id);
  };
  cb.on_done = [&](const Completion& c) {
    ended = true;
    EXPECT_EQ(c.tokens.size(), 3u);
  };
  ASSERT_TRUE(h.sched.Submit(r, cb).ok());
  h.Drain();
  EXPECT_TRUE(ended);
  h.ExpectNoLeaks();
}

TEST(Scheduler, RunnerFailureEndsTheStepsRequestsWithItsError) {
  int calls = 0;
  SchedulerOptions o = Harness::Fill({.n_blocks = 8, .block_size = 4});
  Scheduler s(o, [&](const worker::StepPlan&, std::span<float>) {
    return ++calls == 2 ? absl::UnavailableError("rank 1 is gone") : absl::OkStatus();
  });
  Completion got;
  Request r;
  r.prompt = Tokens(4, 1);
  r.max_tokens = 4;
  ASSERT_TRUE(s.Submit(r, {.on_done = [&](const Completion& c) { got = c; }}).ok());
  ASSERT_TRUE(s.Step().ok());
  EXPECT_EQ(s.Step().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(got.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(s.blocks().referenced(), 0);
}

// A short randomized soak (the 10-minute one is bench/serving_soak): random prompts over a few
// shared documents, random sessions, cancels and forced preemption in a tight pool.
TEST(Scheduler, RandomizedSoakKeepsOutputsAndLeaksNothing) {
  Harness h({.n_blocks = 40,
             .block_size = 4,
             .max_seqs = 5,
             .max_batched_tokens = 12,
             .max_sessions = 3,
             .preempt_probability = 0.2,
             .preempt_seed = 5});
  Soak soak(99);
  soak.Run(h, 60, 7, [&] { ASSERT_TRUE(h.sched.Step().ok()); });
  h.Drain();
  soak.Check(h);
  h.ExpectNoLeaks();
}

// Pipelined steps (max_steps_in_flight = 2, as for pp = 2): the fake model runs each plan when
// it is begun, in order, as the stages would; its logits come back one step later. Sequences
// of the unfinished step sit out the next one, so outputs stay exact under preemption, cancels,
// sessions and a tight pool, and both steps have sequences.
TEST(Scheduler, PipelinedStepsKeepOutputsAndSplitTheBatch) {
  Harness h({.n_blocks = 40,
             .block_size = 4,
             .max_seqs = 6,
             .max_batched_tokens = 12,
             .max_sessions = 3,
             .max_steps_in_flight = 2,
             .preempt_probability = 0.2,
             .preempt_seed = 7});
  std::deque<std::vector<float>> in_flight;
  int both_busy = 0;
  auto step = [&] {
    for (worker::StepPlan plan; h.sched.BeginStep(plan);) {
      std::vector<float> logits(plan.n_logits() * kVocab);
      EXPECT_TRUE(h.model.Run(plan, logits).ok());
      in_flight.push_back(std::move(logits));
    }
    EXPECT_LE(in_flight.size(), 2u);
    both_busy += in_flight.size() == 2;
    if (in_flight.empty()) return;
    EXPECT_TRUE(h.sched.FinishStep(absl::OkStatus(), in_flight.front()).ok());
    in_flight.pop_front();
  };
  // Cancels hit sequences in flight too: they end when their step finishes.
  Soak soak(17);
  soak.Run(h, 60, 5, step);
  for (int i = 0; (!h.sched.idle() || !in_flight.empty()) && i < 100000; ++i) step();
  ASSERT_TRUE(h.sched.idle());
  EXPECT_EQ(h.sched.steps_in_flight(), 0);
  EXPECT_GT(both_busy, 20);
  soak.Check(h);
  EXPECT_GT(h.sched.stats().preemptions, 0);
  h.ExpectNoLeaks();
}

// A cancel of a sequence whose step is in flight waits for that step; on_done comes once.
TEST(Scheduler, CancelOfASequenceInFlightEndsItWhenItsStepFinishes) {
  Harness h({.n_blocks = 16, .block_size = 4, .max_steps_in_flight = 2});
  const RequestId a = h.Submit(Tokens(6, 1), 5);
  const RequestId b = h.Submit(Tokens(6, 2), 5);
  worker::StepPlan p1, p2, p3;
  ASSERT_TRUE(h.sched.BeginStep(p1));   // a (its share of two running sequences)
  ASSERT_TRUE(h.sched.BeginStep(p2));   // b
  EXPECT_FALSE(h.sched.BeginStep(p3));  // two in flight
  EXPECT_EQ(p1.seqs.size(), 1u);
  EXPECT_EQ(p2.seqs.size(), 1u);
  std::vector<float> l1(p1.n_logits() * kVocab), l2(p2.n_logits() * kVocab);
  ASSERT_TRUE(h.model.Run(p1, l1).ok());
  ASSERT_TRUE(h.model.Run(p2, l2).ok());
  EXPECT_TRUE(h.sched.Cancel(a));
  EXPECT_EQ(h.done.count(a), 0u);  // still in flight
  ASSERT_TRUE(h.sched.FinishStep(absl::OkStatus(), l1).ok());
  ASSERT_EQ(h.done.count(a), 1u);
  EXPECT_TRUE(absl::IsCancelled(h.done[a].status));
  ASSERT_TRUE(h.sched.FinishStep(absl::OkStatus(), l2).ok());
  h.Drain();
  EXPECT_EQ(h.done[b].tokens, Expected(Tokens(6, 2), 5));
  h.ExpectNoLeaks();
}

// Out of blocks with the newer sequence in flight: the older one waits for that step instead of
// giving up its own KV, then takes the newer one's blocks once it is back. (Admission leaves
// each newcomer its first decode block, so the pool runs out later in decode: both fill 3 of
// the 6 blocks, and position 12 needs a fourth.)
TEST(Scheduler, OldestWaitsForStepsInFlightInsteadOfPreemptingItself) {
  Harness h({.n_blocks = 6, .block_size = 4, .max_steps_in_flight = 2});
  const RequestId a = h.Submit(Tokens(8, 1), 8);
  const RequestId b = h.Submit(Tokens(8, 2), 8);
  std::deque<std::vector<float>> in_flight;  // logits of the steps begun, oldest first
  int waited = 0;  // plans that found an idle sequence unable to run beside one step in flight
  for (int i = 0; i < 1000 && !h.sched.idle(); ++i) {
    worker::StepPlan p;
    if (in_flight.size() < 2 && h.sched.BeginStep(p)) {
      in_flight.emplace_back(p.n_logits() * kVocab);
      ASSERT_TRUE(h.model.Run(p, in_flight.back()).ok());
      continue;
    }
    if (in_flight.size() == 1 && h.done.empty()) ++waited;
    ASSERT_FALSE(in_flight.empty()) << "no step in flight and none begun";
    ASSERT_TRUE(h.sched.FinishStep(absl::OkStatus(), in_flight.front()).ok());
    in_flight.pop_front();
  }
  ASSERT_TRUE(h.sched.idle());
  EXPECT_GT(waited, 0) << "a waited for b's step instead of preempting itself";
  EXPECT_EQ(h.done[a].preemptions, 0);
  EXPECT_GE(h.done[b].preemptions, 1);
  EXPECT_EQ(h.done[a].tokens, Expected(Tokens(8, 1), 8));
  EXPECT_EQ(h.done[b].tokens, Expected(Tokens(8, 2), 8));
  h.ExpectNoLeaks();
}

}  // namespace
}  // namespace kvmesh::serving
