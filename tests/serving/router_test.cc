// The data-parallel routing policy (serving/router.h) on the replica reports it decides from.
#include "serving/router.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvmesh::serving {
namespace {

int Choose(const std::vector<ReplicaLoad>& r, int64_t prompt, int64_t max_imbalance = 16) {
  return ChooseReplica(r, prompt,
                       {.min_share = 0.5, .min_tokens = 32, .max_imbalance = max_imbalance});
}

TEST(Router, UnknownPromptsGoToTheLeastLoadedReplica) {
  EXPECT_EQ(Choose({{0, 3}, {0, 1}, {0, 2}}, 100), 1);
  // Equal loads: the replica knowing more of the prompt, then the lowest index.
  EXPECT_EQ(Choose({{0, 1}, {16, 1}}, 100), 1);
  EXPECT_EQ(Choose({{0, 1}, {0, 1}}, 100), 0);
}

TEST(Router, APromptMostlyKnownGoesWhereItIsKnownEvenIfBusier) {
  // Cached, computing or queued there alike (the scheduler's KnownPrefixTokens).
  EXPECT_EQ(Choose({{0, 0}, {592, 1}}, 596), 1);
  EXPECT_EQ(Choose({{50, 0}, {64, 15}}, 100), 1);
  // Exactly half is enough.
  EXPECT_EQ(Choose({{0, 0}, {48, 4}}, 96), 1);
}

TEST(Router, AShortSharedHeadDoesNotPullEveryRequestToOneReplica) {
  // A chat template's system prompt (one 16-token block of a 34-token prompt) cached on replica
  // 0: by load, not by that block.
  EXPECT_EQ(Choose({{16, 2}, {0, 1}}, 34), 1);
  EXPECT_EQ(Choose({{16, 1}, {0, 1}}, 34), 0);  // equal loads: the one that has it
  // Also where that one block is half a short prompt ("Hi": 31 tokens): more than one block
  // must be known to decide.
  EXPECT_EQ(Choose({{16, 1}, {0, 0}}, 31), 1);
  EXPECT_EQ(Choose({{32, 1}, {0, 0}}, 60), 0);
}

TEST(Router, AReplicaABatchBusierThanTheLeastLoadedGetsNoMoreOfItsPrefix) {
  EXPECT_EQ(Choose({{592, 16}, {0, 1}}, 596), 0);  // 15 more: still its prefix's replica
  EXPECT_EQ(Choose({{592, 17}, {0, 1}}, 596), 1);  // 16 more: the least loaded
  EXPECT_EQ(Choose({{592, 3}, {0, 1}}, 596, 2), 1);
  // Past the guard, the next replica that knows the prompt, not the least loaded.
  EXPECT_EQ(Choose({{592, 20}, {400, 5}, {0, 2}}, 596), 1);
  EXPECT_EQ(Choose({{592, 20}, {200, 5}, {0, 2}}, 596), 2);  // 200 is under half
}

TEST(Router, AFullQueueIsPassedOverWhileAnotherHasRoom) {
  EXPECT_EQ(Choose({{592, 5, true}, {0, 7}}, 596), 1);
  EXPECT_EQ(Choose({{0, 1, true}, {0, 9}, {0, 4}}, 100), 2);
  // All full: the least loaded (its Submit answers for them all).
  EXPECT_EQ(Choose({{0, 9, true}, {0, 8, true}}, 100), 1);
}

}  // namespace
}  // namespace kvmesh::serving
