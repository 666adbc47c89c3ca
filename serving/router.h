// Data-parallel routing: which replica a new request goes to (ServingEngine::Route), decided
// from what each replica's scheduler reports, so the policy is testable without replicas.
//
// Cache-aware with a load guard, as SGLang's router is. Among the replicas less than a full batch
// busier than the least loaded one, the one that knows the longest prefix of the prompt (cached
// there, being computed there, or held there by a waiting request's prompt until that request
// starts) gets it when that prefix is at least half the prompt and more than one block;
// otherwise the least loaded replica does (ties: the one whose KV pool holds fewest blocks, in
// use or cached, as SGLang's router sends such requests to its smallest tree; then in turn, for
// once every pool is full), so that every replica's pool holds documents of its own. So:
// - requests over one document (or one session's history) share its blocks on one replica,
//   also when they arrive together, before any of them is cached;
// - a single shared block (what a chat template's system prompt makes every chat prompt share)
//   does not decide: requests spread by load and pool use instead of all following the replica
//   that cached that block, and every replica's pool holds documents (with all of them on one
//   replica, its pool would evict while the others' stayed empty);
// - a hot document spills over to another replica once its replica has a batch more work.
// A replica whose waiting queue is full is not chosen while another has room.
#pragma once

#include <cstdint>
#include <span>

namespace kvmesh::serving {

struct ReplicaLoad {
  int64_t known_tokens = 0;  // of the prompt: Scheduler::KnownPrefixTokens
  int64_t load = 0;          // running + waiting requests
  int64_t pool_blocks = 0;   // KV blocks in use or cached there
  bool queue_full = false;   // its Submit would refuse (max_waiting reached)
};

struct RoutePolicy {
  double min_share = 0.5;      // of the prompt a known prefix must cover to decide
  int64_t min_tokens = 32;     // and its least length: more than one block (2 x block size)
  int64_t max_imbalance = 16;  // load above the least loaded a prefix may add to (max_seqs)
  uint64_t turn = 0;           // full ties go to the first replica from turn % n on
};

// The replica for a prompt of prompt_tokens tokens; replicas must not be empty.
int ChooseReplica(std::span<const ReplicaLoad> replicas, int64_t prompt_tokens,
                  const RoutePolicy& policy);

}  // namespace kvmesh::serving
