#include "worker/step_plan.h"

#include <gtest/gtest.h>

#include <random>

namespace kvmesh::worker {
namespace {

StepPlan Example() {
  StepPlan p;
  p.copies = {{3, 7}};
  p.seqs.push_back({5, 0, true, {0, 1}});
  p.seqs.push_back({1, 17, false, {4, 5}});
  p.tokens = {10, 11, 12, 13, 14, 99};
  return p;
}

TEST(StepPlan, RoundTripsThroughWords) {
  const StepPlan p = Example();
  auto q = DecodeStepPlan(EncodeStepPlan(p));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->copies, p.copies);
  ASSERT_EQ(q->seqs.size(), 2u);
  EXPECT_EQ(q->seqs[1].pos0, 17);
  EXPECT_EQ(q->seqs[0].blocks, p.seqs[0].blocks);
  EXPECT_TRUE(q->seqs[0].want_logits);
  EXPECT_EQ(q->tokens, p.tokens);
  EXPECT_EQ(q->n_logits(), 1);
  EXPECT_TRUE(ValidateStepPlan(*q, 8, 16, 100).ok());
}

TEST(StepPlan, RejectsEveryTruncationAndRandomCorruption) {
  const auto words = EncodeStepPlan(Example());
  for (size_t n = 0; n < words.size(); ++n) {
    EXPECT_FALSE(DecodeStepPlan(std::span(words).first(n)).ok()) << n << " words";
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    auto w = words;
    w[rng() % w.size()] = static_cast<int32_t>(rng());
    auto p = DecodeStepPlan(w);  // must not crash or allocate wildly
    if (p.ok()) (void)ValidateStepPlan(*p, 8, 16, 100);
  }
}

TEST(StepPlan, ValidationNamesWhatIsWrong) {
  StepPlan p = Example();
  p.seqs[1].blocks = {4};  // 18 positions need 2 blocks of 16
  auto s = ValidateStepPlan(p, 8, 16, 100);
  EXPECT_NE(s.message().find("do not cover 18 positions"), std::string::npos) << s;
  p = Example();
  p.tokens[5] = 100;
  s = ValidateStepPlan(p, 8, 16, 100);
  EXPECT_NE(s.message().find("token id 100"), std::string::npos) << s;
  p = Example();
  p.copies = {{3, 8}};
  EXPECT_FALSE(ValidateStepPlan(p, 8, 16, 100).ok());
  p = Example();
  p.tokens.pop_back();
  EXPECT_FALSE(ValidateStepPlan(p, 8, 16, 100).ok());
}

}  // namespace
}  // namespace kvmesh::worker
