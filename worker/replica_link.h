// Data-parallel replicas: the coordinator (world rank 0, itself the leader of replica 0) plans
// every replica's steps. Replica r > 0's leader receives its plans over the world communicator,
// runs each on its replica (Engine::Step: broadcast to the replica's TP/PP ranks, execute) and
// returns the logits. Plans travel as int32 words bit-copied into float messages (same-machine
// representation on every rank).
#pragma once

#include <span>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "worker/engine.h"
#include "worker/step_plan.h"

namespace kvmesh::worker {

// The coordinator's handle on one remote replica. Thread-compatible.
class RemoteReplica {
 public:
  RemoteReplica(comm::Communicator* world, int leader, int64_t n_vocab)
      : world_(world), leader_(leader), n_vocab_(n_vocab) {}
  // Sends a step's plan; returns once it is sent (the replica then runs it).
  absl::Status Send(const StepPlan& plan);
  // The logits of the plan sent last: plan.n_logits() rows of n_vocab.
  absl::Status Receive(std::span<float> logits);
  // Releases the replica (its leader stops its followers and returns from ServeReplica).
  absl::Status Stop();
  int leader() const { return leader_; }

 private:
  comm::Communicator* world_;
  int leader_;
  int64_t n_vocab_;
};

// On a replica leader (world rank != 0, replica-local rank 0): serves the coordinator's steps
// until it says stop or a step fails, then stops the replica's followers. Blocks.
absl::Status ServeReplica(Engine& engine, comm::Communicator* world, int coordinator);

}  // namespace kvmesh::worker
