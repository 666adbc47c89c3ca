#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <vector>

namespace kvmesh::model {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.5f, 2.9f}; }

TEST(Sampler, GreedyPicksTheArgmax) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  auto l = Logits();
  EXPECT_EQ(s.Sample(l, {}), 1);
}

TEST(Sampler, GreedyIsTheFirstMaximumAtEveryLengthAndPosition) {
  // The vectorised argmax against std::max_element: lengths around the 16-lane width, the
  // maximum in the body, the tail, and tied between lanes and the tail.
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> small(-8, 8);  // few values: many ties
  for (size_t n : {1u, 15u, 16u, 17u, 33u, 49152u, 49157u}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> l(n);
      for (auto& x : l) x = static_cast<float>(small(rng)) * 0.25f;
      if (trial % 4 == 1) l[n - 1] = 100.0f;  // the maximum in the tail
      if (trial % 4 == 2) l[rng() % n] = l[rng() % n] = 50.0f;
      const auto want = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      EXPECT_EQ(s.Sample(l, {}), want) << "n " << n << " trial " << trial;
    }
  }
  std::vector<float> all_low(40, -std::numeric_limits<float>::infinity());
  EXPECT_EQ(s.Sample(all_low, {}), 0);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) {
      auto l = Logits();
      out.push_back(s.Sample(l, {}));
    }
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, TopKOneIsGreedyAndTopKLimitsTheSet) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  Sampler s1(p);
  for (int i = 0; i < 20; ++i) {
    auto l = Logits();
    EXPECT_EQ(s1.Sample(l, {}), 1);
  }
  p.top_k = 3;
  p.top_p = 1.0f;
  Sampler s3(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 500; ++i) {
    auto l = Logits();
    ++seen[s3.Sample(l, {})];
  }
  for (const auto& [id, n] : seen) EXPECT_TRUE(id == 1 || id == 5 || id == 2) << id;
  EXPECT_EQ(seen.size(), 3u);
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;  // token 1 and 5 together carry > 50% of the mass; token 1 alone does not
  Sampler s(p);
  std::map<int32_t, int> seen;
  for (int i = 0; i < 500; ++i) {
    auto l = Logits();
    ++seen[s.Sample(l, {})];
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[5], 0);
}

TEST(Sampler, RepetitionPenaltyDemotesRecentTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  auto l = Logits();
  const int32_t hist[] = {1, 5};
  EXPECT_EQ(s.Sample(l, hist), 2);  // 3.0 -> 1.5 and 2.9 -> 1.45, so 2.5 wins
  EXPECT_FLOAT_EQ(l[1], 1.5f);
}

// A tiny repeat penalty divides a positive logit into +inf; a broken model could give NaN. The
// +inf logits hold all the mass and NaN is never drawn (it once made every weight NaN, and the
// draw fell through to the last of the top k: the least likely token).
TEST(Sampler, InfiniteLogitsTakeTheMassAndNanIsNeverDrawn) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  SamplingParams p;
  p.temperature = 0.8f;
  p.repeat_penalty = 1e-40f;
  Sampler s(p);
  const int32_t hist[] = {0};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = {5.0f, 4.0f, 1.0f, -3.0f, -9.0f};
    ++seen[s.Sample(l, hist)];
  }
  EXPECT_EQ(seen, (std::map<int32_t, int>{{0, 200}}));  // 5 / 1e-40 = +inf
  seen.clear();
  p.repeat_penalty = 1.0f;
  Sampler t(p);
  for (int i = 0; i < 400; ++i) {
    std::vector<float> l = {kNan, kInf, -2.0f, kInf, kNan};
    ++seen[t.Sample(l, {})];
  }
  EXPECT_EQ(seen.size(), 2u);  // the two +inf, each about half the time
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[3], 100);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> l = {kNan, 1.0f, kNan, 3.0f, kNan};
    const int32_t got = t.Sample(l, {});
    EXPECT_TRUE(got == 1 || got == 3) << got;
  }
  std::vector<float> none = {kNan, -kInf, kNan};
  EXPECT_EQ(t.Sample(none, {}), 1);
}

TEST(Sampler, ValidateNamesTheBadField) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_NE(std::string(p.Validate().message()).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(std::string(p.Validate().message()).find("top_p"), std::string::npos);
  p = {};
  p.repeat_penalty = 0;
  EXPECT_NE(std::string(p.Validate().message()).find("repeat_penalty"), std::string::npos);
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
}

}  // namespace
}  // namespace kvmesh::model
