// The serving engine on the real model: prefix reuse, continuous batching and preemption must
// not change a single greedy token (the CPU kernels are batch invariant, so not a single logit
// bit either), and every test ends with no KV block referenced.
#include "serving/serving_engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "kernels/packed.h"
#include "tests/util/test_paths.h"

namespace kvmesh::serving {
namespace {

// Every test runs with 16-bit activations (the default), 8-bit ones (--activation-bits 8) and
// bf16 attention (--attention-bits 16): batch invariance and reuse must hold for each numerics.
// The parameter indexes kNumerics.
struct Numerics {
  int activation_bits, attention_bits;
  const char* name;
};
constexpr Numerics kNumerics[] = {{16, 32, "a16"}, {8, 32, "a8"}, {16, 16, "a16_attn16"}};

class Serving : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::RealModelPath();
    if (path.empty()) return;
    for (int i = 0; i < 3; ++i) {
      worker::EngineOptions o;
      o.model_path = path;
      o.threads = 2;
      o.ctx_size = 4096;
      o.kv_cache_bytes = 64ll << 20;  // 182 blocks of 16 tokens
      o.activation_bits = kNumerics[i].activation_bits;
      o.attention_bits = kNumerics[i].attention_bits;
      auto e = worker::Engine::Create(o);
      ASSERT_TRUE(e.ok()) << e.status();
      engines_[i] = std::move(*e).release();
    }
  }
  static void TearDownTestSuite() {
    for (worker::Engine*& e : engines_) {
      delete e;
      e = nullptr;
    }
  }
  void SetUp() override {
    engine_ = engines_[GetParam()];
    if (engine_ == nullptr) {
      GTEST_SKIP() << "SmolLM2 model not found: run scripts/model_pull.sh (or set KVMESH_MODEL)";
    }
  }
  static std::vector<int32_t> Chat(const std::vector<model::ChatMessage>& messages) {
    return engine_->tokenizer().Encode(engine_->chat_template()->Render(messages, true), true);
  }
  static Request Greedy(std::vector<int32_t> prompt, int max_tokens = 16) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.return_logits = true;
    return r;
  }
  // Submits every request at once and steps until all are done.
  static std::vector<Completion> RunTogether(ServingEngine& se, const std::vector<Request>& reqs) {
    std::map<RequestId, Completion> done;
    std::vector<RequestId> ids;
    for (const Request& r : reqs) {
      auto id = se.Submit(r, {.on_done = [&](const Completion& c) { done[c.id] = c; }});
      EXPECT_TRUE(id.ok()) << id.status();
      ids.push_back(*id);
    }
    EXPECT_TRUE(se.RunUntilIdle().ok());
    std::vector<Completion> out;
    for (RequestId id : ids) out.push_back(done[id]);
    return out;
  }
  static void ExpectNoLeaks(ServingEngine& se) {
    se.scheduler().DropSessions();
    EXPECT_EQ(se.scheduler().blocks().referenced(), 0);
    EXPECT_TRUE(se.scheduler().blocks().Consistent());
  }
  static void ExpectSame(const Completion& a, const Completion& b, const std::string& what) {
    EXPECT_TRUE(a.status.ok() && b.status.ok()) << what << ": " << a.status << " / " << b.status;
    EXPECT_EQ(a.tokens, b.tokens) << what;
    ASSERT_EQ(a.first_logits.size(), b.first_logits.size()) << what;
    EXPECT_EQ(0, std::memcmp(a.first_logits.data(), b.first_logits.data(),
                             a.first_logits.size() * sizeof(float)))
        << what << ": first-token logits differ";
  }
  static std::string Document() {
    std::string doc;
    for (int i = 1; i <= 30; ++i) {
      doc += "Item " + std::to_string(i) + " is kept on shelf " + std::to_string(i % 4) + ". ";
    }
    return doc;
  }
  static worker::Engine* engines_[3];
  static worker::Engine* engine_;  // this test's
};
worker::Engine* Serving::engines_[3] = {nullptr, nullptr, nullptr};
worker::Engine* Serving::engine_ = nullptr;

INSTANTIATE_TEST_SUITE_P(Numerics, Serving, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(kNumerics[i.param].name);
                         });

// One document, several questions as independent requests: the document's blocks are computed
// once and shared; answers are identical to computing everything.
TEST_P(Serving, MultiRequestPrefixReuseKeepsAnswersBitForBit) {
  const std::vector<std::string> questions = {"Where is item 9?", "Where is item 14?",
                                              "Which shelf holds item 3?"};
  auto run = [&](bool reuse) {
    ServingEngine se(*engine_, {.prefix_caching = reuse});
    std::vector<Completion> out;
    for (const auto& q : questions) {
      auto c = se.Generate(Greedy(Chat({{"user", Document() + "\n" + q}})));
      EXPECT_TRUE(c.ok()) << c.status();
      out.push_back(*c);
    }
    const auto st = se.scheduler().stats();
    ExpectNoLeaks(se);
    return std::make_pair(out, st);
  };
  const auto [off, st_off] = run(false);
  const auto [on, st_on] = run(true);
  for (size_t i = 0; i < questions.size(); ++i) {
    ExpectSame(on[i], off[i], questions[i]);
    EXPECT_EQ(off[i].cached_tokens, 0);
  }
  EXPECT_EQ(on[0].cached_tokens, 0);
  const int64_t doc_tokens = static_cast<int64_t>(Chat({{"user", Document()}}).size());
  for (size_t i = 1; i < questions.size(); ++i) {
    EXPECT_GE(on[i].cached_tokens, doc_tokens / 16 * 16 - 32) << "question " << i;
  }
  EXPECT_EQ(st_off.prefix_hit_tokens, 0);
  EXPECT_GT(st_on.prefix_hit_tokens, 2 * (doc_tokens - 48));
}

// A conversation: each turn reuses everything the previous turns computed, including the
// partial last block (copied before it is written), and answers as if prefilled from scratch.
TEST_P(Serving, MultiTurnSessionCachedTokensClimbAndAnswersDoNotChange) {
  const std::vector<std::string> turns = {Document() + "\nWhere is item 9?", "And item 14?",
                                          "How many shelves are there?"};
  auto run = [&](bool reuse) {
    ServingEngine se(*engine_, {.prefix_caching = reuse});
    std::vector<model::ChatMessage> messages;
    std::vector<Completion> out;
    for (const auto& t : turns) {
      messages.push_back({"user", t});
      Request r = Greedy(Chat(messages), 24);
      r.session_id = "conversation";
      auto c = se.Generate(r);
      EXPECT_TRUE(c.ok()) << c.status();
      messages.push_back({"assistant", se.Text(c->tokens)});
      out.push_back(*c);
    }
    ExpectNoLeaks(se);
    return out;
  };
  const auto fresh = run(false);
  const auto reused = run(true);
  int64_t last_cached = 0;
  for (size_t i = 0; i < turns.size(); ++i) {
    ExpectSame(reused[i], fresh[i], "turn " + std::to_string(i + 1));
    if (i > 0) {
      EXPECT_GT(reused[i].cached_tokens, last_cached) << "turn " << i + 1;
      // Everything but the new user message and the previous answer's re-tokenised tail.
      EXPECT_GT(reused[i].cached_tokens, reused[i].prompt_tokens - 40) << "turn " << i + 1;
    }
    last_cached = reused[i].cached_tokens;
  }
}

// A session id reused over another prefix of the same length (another conversation, an edited
// turn): the session's partial block was computed after its old prefix and must not be reused
// (it was, and changed the answer: "is a king" for "was a king").
TEST_P(Serving, SessionTailIsNotReusedOverAnotherPrefix) {
  auto tokens = [&](const std::string& t) { return engine_->tokenizer().Encode(t, false); };
  auto cat = [](std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  std::string fox;
  for (int i = 0; i < 6; ++i) fox += "The quick brown fox jumps over the lazy dog. ";
  auto d1 = tokens(Document()), d2 = tokens(fox);
  ASSERT_GE(d2.size(), 32u);
  d1.resize(32);  // two full blocks each
  d2.resize(32);
  const auto q = tokens(" Tell me a story"), r = tokens(" about a king who");
  ServingEngine se(*engine_, {});
  Request first = Greedy(cat(d1, q), 1);
  first.session_id = "s";
  ASSERT_TRUE(se.Generate(first).ok());
  ASSERT_TRUE(se.Generate(Greedy(cat(d2, q), 1)).ok());  // caches d2's full blocks
  Request turn = Greedy(cat(cat(d2, q), r), 8);
  turn.session_id = "s";
  auto got = se.Generate(turn);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->cached_tokens, 32) << "d2's full blocks only";
  ServingEngine fresh(*engine_, {.prefix_caching = false});
  auto want = fresh.Generate(Greedy(cat(cat(d2, q), r), 8));
  ASSERT_TRUE(want.ok()) << want.status();
  ExpectSame(*got, *want, "the session's turn over d2");
  ExpectNoLeaks(se);
  ExpectNoLeaks(fresh);
}

// Continuous batching: N different requests together give each one's answer alone.
TEST_P(Serving, BatchOfDifferentRequestsMatchesEachAlone) {
  const std::vector<std::string> prompts = {
      "What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers.",
      "Explain what a KV cache is in one sentence.", Document() + "\nWhere is item 21?"};
  ServingEngine se(*engine_, {.max_seqs = 8, .max_batched_tokens = 64});
  std::vector<Request> reqs;
  for (const auto& p : prompts) reqs.push_back(Greedy(Chat({{"user", p}})));
  std::vector<Completion> alone;
  {
    ServingEngine solo(*engine_, {.prefix_caching = false});
    for (const Request& r : reqs) alone.push_back(*solo.Generate(r));
    ExpectNoLeaks(solo);
  }
  const auto together = RunTogether(se, reqs);
  for (size_t i = 0; i < prompts.size(); ++i) ExpectSame(together[i], alone[i], prompts[i]);
  EXPECT_GT(se.scheduler().stats().steps, 0);
  const Scheduler& sched = se.scheduler();
  const auto n = static_cast<int64_t>(prompts.size());
  EXPECT_EQ(sched.ttft_seconds().count(), n);
  EXPECT_GT(sched.itl_seconds().count(), 0);
  // Each request's time in parts: queue + prefill is its TTFT; decode counts those that ended.
  EXPECT_EQ(sched.queue_seconds().count(), n);
  EXPECT_EQ(sched.prefill_seconds().count(), n);
  EXPECT_EQ(sched.decode_seconds().count(), n);
  EXPECT_NEAR(sched.queue_seconds().sum() + sched.prefill_seconds().sum(),
              sched.ttft_seconds().sum(), 1e-6);
  for (const Completion& c : together) {
    EXPECT_GE(c.queue_ms, 0.0);
    EXPECT_LE(c.queue_ms, c.ttft_ms);
    EXPECT_LE(c.ttft_ms, c.total_ms);
  }
  ExpectNoLeaks(se);
}

// Forced preemption (p = 0.5 per step) and a pool too small for the batch: sequences are
// recomputed, possibly several times, and still produce exactly the same tokens.
TEST_P(Serving, ForcedPreemptionLeavesGreedyOutputsUnchanged) {
  const std::vector<std::string> prompts = {"Name a fruit.", "Count from one to five.",
                                            "What colour is the sky?", "Say hello in French."};
  std::vector<Request> reqs;
  for (const auto& p : prompts) reqs.push_back(Greedy(Chat({{"user", p}}), 12));
  std::vector<Completion> alone;
  {
    ServingEngine solo(*engine_, {.prefix_caching = false});
    for (const Request& r : reqs) alone.push_back(*solo.Generate(r));
  }
  ServingEngine se(
      *engine_,
      {.max_seqs = 4, .max_batched_tokens = 48, .preempt_probability = 0.5, .preempt_seed = 3});
  const auto got = RunTogether(se, reqs);
  for (size_t i = 0; i < prompts.size(); ++i) ExpectSame(got[i], alone[i], prompts[i]);
  EXPECT_GT(se.scheduler().stats().preemptions, 2);
  ExpectNoLeaks(se);
}

// The two numerics are different engines: different logits, different block names (a block
// computed under one must never be reused under the other, e.g. from the disk tier).
TEST_P(Serving, ActivationBitsChangeTheNumericsAndTheBlockNames) {
  if (GetParam() != 1) GTEST_SKIP() << "compares the two engines once";
  if (!kernels::PackedKernelIsFast()) {
    EXPECT_EQ(engine_->activation_bits(), 16) << "nothing is packed on this ISA";
    GTEST_SKIP() << "this ISA has no packed kernels, so 8-bit activations do not apply";
  }
  EXPECT_EQ(engines_[0]->activation_bits(), 16);
  EXPECT_EQ(engines_[1]->activation_bits(), 8);
  EXPECT_NE(engines_[0]->cache_salt(), engines_[1]->cache_salt());
  const Request r = Greedy(Chat({{"user", "What is the capital of France?"}}), 1);
  ServingEngine a(*engines_[0], {}), b(*engines_[1], {});
  const auto la = a.Generate(r), lb = b.Generate(r);
  ASSERT_TRUE(la.ok() && lb.ok());
  ASSERT_EQ(la->first_logits.size(), lb->first_logits.size());
  EXPECT_NE(0, std::memcmp(la->first_logits.data(), lb->first_logits.data(),
                           la->first_logits.size() * sizeof(float)));
}

// bf16 attention likewise: its own block names (the cache holds bf16 pairs, not fp16), other
// logits, and the same greedy answer to a plain question.
TEST_P(Serving, AttentionBitsChangeTheNumericsAndTheBlockNames) {
  if (GetParam() != 2) GTEST_SKIP() << "compares the two engines once";
  EXPECT_EQ(engines_[0]->attention_bits(), 32);
  EXPECT_EQ(engines_[2]->attention_bits(), 16);
  EXPECT_NE(engines_[0]->cache_salt(), engines_[2]->cache_salt());
  const Request r = Greedy(Chat({{"user", "What is the capital of France?"}}), 8);
  ServingEngine a(*engines_[0], {}), b(*engines_[2], {});
  const auto la = a.Generate(r), lb = b.Generate(r);
  ASSERT_TRUE(la.ok() && lb.ok());
  ASSERT_EQ(la->first_logits.size(), lb->first_logits.size());
  EXPECT_NE(0, std::memcmp(la->first_logits.data(), lb->first_logits.data(),
                           la->first_logits.size() * sizeof(float)));
  EXPECT_EQ(la->tokens, lb->tokens);
}

TEST_P(Serving, RejectsRequestsThatCannotFitAndKeepsServing) {
  ServingEngine se(*engine_, {});
  Request r = Greedy(Chat({{"user", "Hi"}}), 182 * 16);
  auto c = se.Generate(r);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("KV blocks"), std::string::npos) << c.status();
  r.max_tokens = 4;
  auto ok = se.Generate(r);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->status.ok());
  EXPECT_EQ(se.scheduler().stats().rejected, 1);
  ExpectNoLeaks(se);
}

}  // namespace
}  // namespace kvmesh::serving
