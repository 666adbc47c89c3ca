// The forward pass on the real model against two independent implementations
// (tests/fixtures/make_forward_fixture.py): an exact float64 NumPy evaluation, and llama.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "tests/util/test_paths.h"
#include "worker/engine.h"

namespace kvmesh::worker {
namespace {

using nlohmann::json;

class RealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::RealModelPath();
    if (path.empty()) return;
    EngineOptions o;
    o.model_path = path;
    auto e = Engine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e).release();
  }
  static void TearDownTestSuite() {
    delete engine_;
    engine_ = nullptr;
  }
  void SetUp() override {
    if (engine_ == nullptr) {
      GTEST_SKIP() << "SmolLM2 model not found: run scripts/model_pull.sh (or set KVMESH_MODEL)";
    }
  }
  static Engine* engine_;
};
Engine* RealModel::engine_ = nullptr;

double RelL2(const float* got, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

TEST_F(RealModel, MatchesExactAndLlamaCppReferences) {
  const json fx = json::parse(testing::ReadFile(testing::FixturePath("forward_cases.json")));
  const std::string blob = testing::ReadFile(testing::FixturePath(fx.at("logits_file")));
  const size_t n_vocab = fx.at("n_vocab");
  ASSERT_EQ(n_vocab, static_cast<size_t>(engine_->model().config().n_vocab));
  const auto& cases = fx.at("cases");
  ASSERT_GE(cases.size(), 10u);
  ASSERT_EQ(blob.size(), cases.size() * n_vocab * sizeof(float));
  bool saw_long = false, saw_chat = false;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const json& c = cases[ci];
    const std::string name = c.at("name");
    SCOPED_TRACE(name);
    const auto want_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    // The prompt our tokenizer (and chat template) makes is the reference's prompt.
    std::vector<int32_t> ids;
    if (c.contains("chat")) {
      auto p = engine_->ChatPrompt(c.at("chat"));
      ASSERT_TRUE(p.ok()) << p.status();
      ids = *p;
      saw_chat = true;
    } else {
      ids = engine_->tokenizer().Encode(c.at("prompt").get<std::string>(), true);
    }
    ASSERT_EQ(ids, want_ids);
    saw_long |= ids.size() >= 1000;

    auto logits = engine_->LastLogits(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    std::vector<float> exact(n_vocab);
    std::memcpy(exact.data(), blob.data() + ci * n_vocab * sizeof(float), n_vocab * sizeof(float));
    const double rel = RelL2(logits->data(), exact.data(), n_vocab);
    EXPECT_LT(rel, 1e-2) << "full logit vector vs exact float64";
    // The top-20 of the exact reference, value by value.
    std::vector<float> got20, ref20;
    for (const auto& p : c.at("exact").at("top20")) {
      got20.push_back((*logits)[p[0].get<int>()]);
      ref20.push_back(p[1].get<float>());
    }
    EXPECT_LT(RelL2(got20.data(), ref20.data(), 20), 1e-2) << "top-20 logits vs exact";
    // llama.cpp rounds activations to 8 bits and attention to fp16, so it sits a known distance
    // from the exact result; we must be no further from it than that (plus a little).
    const json& lc = c.at("llama_cpp");
    std::vector<float> got_lc, ref_lc;
    for (const auto& p : lc.at("top20")) {
      got_lc.push_back((*logits)[p[0].get<int>()]);
      ref_lc.push_back(p[1].get<float>());
    }
    const double lc_rel = RelL2(got_lc.data(), ref_lc.data(), 20);
    EXPECT_LT(lc_rel, 2 * lc.at("rel_l2_to_exact").get<double>() + 1e-2) << "top-20 vs llama.cpp";

    // 32 greedy tokens: identical to the exact reference, except that a divergence is accepted
    // at a step where the reference's top two logits are within 0.05 (then comparison stops).
    GenerateRequest req;
    req.prompt = ids;
    req.max_tokens = 32;
    req.sampling.temperature = 0;
    auto r = engine_->Generate(req);
    ASSERT_TRUE(r.ok()) << r.status();
    const auto greedy = c.at("exact").at("greedy").get<std::vector<int32_t>>();
    const auto gaps = c.at("exact").at("greedy_gaps").get<std::vector<double>>();
    size_t same = 0;
    for (size_t i = 0; i < std::min(greedy.size(), r->tokens.size()); ++i) {
      if (r->tokens[i] == greedy[i]) {
        ++same;
        continue;
      }
      EXPECT_LT(gaps[i], 0.05) << "greedy token " << i << " is " << r->tokens[i] << ", reference "
                               << greedy[i] << " with a top-2 gap of " << gaps[i];
      break;
    }
    // We stop at an end-of-generation token; the reference runs on. Either way, all of ours
    // up to the stop matched (or diverged at a near-tie, checked above).
    if (same == r->tokens.size()) {
      EXPECT_TRUE(r->tokens.size() == 32 || r->stop_reason == "eos");
    }
    const auto lc_greedy = lc.at("greedy").get<std::vector<int32_t>>();
    size_t lc_same = 0;
    while (lc_same < std::min(lc_greedy.size(), r->tokens.size()) &&
           lc_greedy[lc_same] == r->tokens[lc_same])
      ++lc_same;
    std::printf(
        "  %-15s %4zu tokens  rel-L2 vs exact %.2e  vs llama.cpp top-20 %.2e  greedy: %zu/%zu "
        "exact, "
        "%zu leading tokens as llama.cpp\n",
        name.c_str(), ids.size(), rel, lc_rel, same, r->tokens.size(), lc_same);
  }
  EXPECT_TRUE(saw_long);
  EXPECT_TRUE(saw_chat);
}

TEST_F(RealModel, IncrementalDecodeAndMicroBatchesMatchOneBatch) {
  const auto& m = engine_->model();
  const auto& c = m.config();
  const auto ids = engine_->tokenizer().Encode(
      "KV caches let decoding reuse the keys and values of earlier tokens, so each step only "
      "computes one new position.",
      false);
  ASSERT_GT(ids.size(), 12u);
  kernels::ThreadPool pool(2);
  auto logits_of = [&](int64_t max_batch, size_t split) {
    LlamaForward fwd(m, pool, max_batch);
    kvstore::KvCache cache(c.n_layers, c.n_kv_heads, c.head_dim, 256);
    std::vector<float> logits(c.n_vocab);
    EXPECT_TRUE(fwd.Forward(std::span(ids).first(split), cache, {}).ok());
    for (size_t i = split; i < ids.size(); ++i) {
      EXPECT_TRUE(fwd.Forward(std::span(ids).subspan(i, 1), cache, logits).ok());
    }
    EXPECT_EQ(cache.size(), static_cast<int64_t>(ids.size()));
    return logits;
  };
  LlamaForward fwd(m, pool);
  kvstore::KvCache cache(c.n_layers, c.n_kv_heads, c.head_dim, 256);
  std::vector<float> whole(c.n_vocab);
  ASSERT_TRUE(fwd.Forward(ids, cache, whole).ok());
  for (auto [mb, split] :
       {std::pair<int64_t, size_t>{512, ids.size() - 5}, {7, ids.size() - 1}, {1, 1}}) {
    const auto inc = logits_of(mb, split);
    // Batched and single-token products sum in different orders (register tiles vs one dot per
    // row), so they agree to rounding (~2e-4 measured), far inside what a wrong position,
    // cache slot or mask causes (> 1e-1).
    EXPECT_LT(RelL2(inc.data(), whole.data(), whole.size()), 1e-3)
        << "max_batch=" << mb << " split=" << split;
  }
}

TEST_F(RealModel, RejectsBadPromptsWithClearErrors) {
  auto too_long = engine_->LastLogits(std::vector<int32_t>(engine_->ctx_size(), 42));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(too_long.status().message()).find("context size"), std::string::npos);
  auto bad_id = engine_->LastLogits({1, 999999});
  EXPECT_EQ(bad_id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad_id.status().message()).find("token id 999999"), std::string::npos);
  EXPECT_EQ(engine_->LastLogits({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RealModel, SeededSamplingIsReproducible) {
  GenerateRequest req;
  req.prompt = *engine_->ChatPrompt("Tell me a short story about a robot.");
  req.max_tokens = 24;
  req.sampling.temperature = 0.9f;
  req.sampling.seed = 1234;
  auto a = engine_->Generate(req), b = engine_->Generate(req);
  req.sampling.seed = 99;
  auto c = engine_->Generate(req);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_NE(a->tokens, c->tokens);
}

}  // namespace
}  // namespace kvmesh::worker

namespace kvmesh::worker {
namespace {

// Multi-turn: with prefix reuse each turn prefills only what the conversation added, and the
// greedy answers are exactly those of prefilling every turn from scratch.
TEST_F(RealModel, SessionPrefixReuseKeepsAnswersAndSkipsCachedTokens) {
  const model::ChatTemplate* tmpl = engine_->chat_template();
  ASSERT_NE(tmpl, nullptr);
  std::string doc;
  for (int i = 1; i <= 25; ++i) {
    doc += "Item " + std::to_string(i) + " is kept on shelf " + std::to_string(i % 4) + ". ";
  }
  const std::vector<std::string> turns = {doc + "\nWhere is item 9?", "And item 14?",
                                          "How many shelves are there?"};
  auto run = [&](bool reuse) {
    std::vector<model::ChatMessage> messages;
    std::vector<GenerateResult> out;
    for (const auto& t : turns) {
      messages.push_back({"user", t});
      GenerateRequest req;
      req.prompt = engine_->tokenizer().Encode(tmpl->Render(messages, true), true);
      req.max_tokens = 24;
      req.sampling.temperature = 0;
      req.reuse_prefix = reuse;
      req.return_logits = true;
      auto r = engine_->Generate(req);
      EXPECT_TRUE(r.ok()) << r.status();
      messages.push_back({"assistant", r->text});
      out.push_back(*r);
    }
    return out;
  };
  const auto fresh = run(false);
  // An unrelated request in between: reuse must notice the cache holds something else.
  ASSERT_TRUE(engine_->LastLogits(engine_->tokenizer().Encode("Unrelated text.", false)).ok());
  const auto reused = run(true);
  ASSERT_EQ(fresh.size(), reused.size());
  int64_t last_cached = 0;
  for (size_t i = 0; i < fresh.size(); ++i) {
    EXPECT_EQ(reused[i].tokens, fresh[i].tokens) << "turn " << i + 1;
    // Same logits up to the summation order of a shorter prefill (as in the incremental test).
    const auto& a = reused[i].first_logits;
    const auto& b = fresh[i].first_logits;
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LT(RelL2(a.data(), b.data(), a.size()), 1e-3) << "turn " << i + 1;
    EXPECT_EQ(fresh[i].cached_tokens, 0);
    if (i == 0) {
      EXPECT_EQ(reused[i].cached_tokens, 0);  // the unrelated request shares no prefix
    } else {
      // Everything but the new user turn (and the template tokens around it) is reused.
      EXPECT_GT(reused[i].cached_tokens, last_cached);
      EXPECT_GE(reused[i].cached_tokens, reused[i - 1].prompt_tokens);
    }
    last_cached = reused[i].cached_tokens;
  }
}

}  // namespace
}  // namespace kvmesh::worker
