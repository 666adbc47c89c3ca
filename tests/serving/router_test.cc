// The data-parallel routing policy (serving/router.h) on the replica reports it decides from.
#include "serving/router.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvmesh::serving {
namespace {

// A replica's report: known prompt tokens, load, KV blocks in its pool, queue full.
ReplicaLoad R(int64_t known, int64_t load, int64_t pool = 0, bool full = false) {
  return {known, load, pool, full};
}

int Choose(const std::vector<ReplicaLoad>& r, int64_t prompt, int64_t max_imbalance = 16,
           uint64_t turn = 0) {
  return ChooseReplica(
      r, prompt,
      {.min_share = 0.5, .min_tokens = 32, .max_imbalance = max_imbalance, .turn = turn});
}

TEST(Router, UnknownPromptsGoToTheLeastLoadedReplica) {
  EXPECT_EQ(Choose({R(0, 3), R(0, 1), R(0, 2)}, 100), 1);
  // Equal loads: the replica whose pool holds fewer blocks, then in turn (full pools: warm
  // replicas still take such requests in turn).
  EXPECT_EQ(Choose({R(0, 1, 40), R(0, 1, 12)}, 100), 1);
  EXPECT_EQ(Choose({R(0, 1, 12), R(0, 1, 40)}, 100, 16, 1), 0);
  const std::vector<ReplicaLoad> full = {R(0, 1, 68), R(0, 1, 68), R(0, 1, 68)};
  EXPECT_EQ(Choose(full, 100, 16, 0), 0);
  EXPECT_EQ(Choose(full, 100, 16, 1), 1);
  EXPECT_EQ(Choose(full, 100, 16, 5), 2);
  EXPECT_EQ(Choose({R(0, 2, 68), R(0, 1, 68), R(0, 1, 68)}, 100, 16, 0), 1);
}

TEST(Router, APromptMostlyKnownGoesWhereItIsKnownEvenIfBusier) {
  // Cached, computing or queued there alike (the scheduler's KnownPrefixTokens).
  EXPECT_EQ(Choose({R(0, 0), R(592, 1, 90)}, 596), 1);
  EXPECT_EQ(Choose({R(50, 0), R(64, 15)}, 100), 1);
  // Exactly half is enough.
  EXPECT_EQ(Choose({R(0, 0), R(48, 4)}, 96), 1);
}

TEST(Router, AShortSharedHeadDoesNotPullEveryRequestToOneReplica) {
  // A chat template's system prompt (one 16-token block of a 34-token prompt) cached on replica
  // 0: by load, then by pool, not by that block.
  EXPECT_EQ(Choose({R(16, 2, 30), R(0, 1, 30)}, 34), 1);
  EXPECT_EQ(Choose({R(16, 1, 30), R(0, 1, 2)}, 34), 1);
  EXPECT_EQ(Choose({R(16, 1, 2), R(0, 1, 30)}, 34), 0);
  // Also where that one block is half a short prompt ("Hi": 31 tokens): more than one block
  // must be known to decide.
  EXPECT_EQ(Choose({R(16, 1), R(0, 0)}, 31), 1);
  EXPECT_EQ(Choose({R(32, 1), R(0, 0)}, 60), 0);
}

TEST(Router, AReplicaABatchBusierThanTheLeastLoadedGetsNoMoreOfItsPrefix) {
  EXPECT_EQ(Choose({R(592, 16), R(0, 1)}, 596), 0);  // 15 more: still its prefix's replica
  EXPECT_EQ(Choose({R(592, 17), R(0, 1)}, 596), 1);  // 16 more: the least loaded
  EXPECT_EQ(Choose({R(592, 3), R(0, 1)}, 596, 2), 1);
  // Past the guard, the next replica that knows the prompt, not the least loaded.
  EXPECT_EQ(Choose({R(592, 20), R(400, 5), R(0, 2)}, 596), 1);
  EXPECT_EQ(Choose({R(592, 20), R(200, 5), R(0, 2)}, 596), 2);  // 200 is under half
}

TEST(Router, AFullQueueIsPassedOverWhileAnotherHasRoom) {
  EXPECT_EQ(Choose({R(592, 5, 0, true), R(0, 7)}, 596), 1);
  EXPECT_EQ(Choose({R(0, 1, 0, true), R(0, 9), R(0, 4)}, 100), 2);
  // All full: the least loaded (its Submit answers for them all).
  EXPECT_EQ(Choose({R(0, 9, 0, true), R(0, 8, 0, true)}, 100), 1);
}

}  // namespace
}  // namespace kvmesh::serving
