#include "worker/replica_link.h"

#include <cstring>
#include <vector>

#include "util/str_cat.h"

namespace kvmesh::worker {

namespace {
constexpr int kTagPlanSize = 201;
constexpr int kTagPlan = 202;
constexpr int kTagLogits = 203;

std::span<const float> AsFloats(const std::vector<int32_t>& w) {
  return {reinterpret_cast<const float*>(w.data()), w.size()};
}
}  // namespace

absl::Status RemoteReplica::Send(const StepPlan& plan) {
  const std::vector<int32_t> words = EncodeStepPlan(plan);
  const std::vector<int32_t> size = {static_cast<int32_t>(words.size())};
  if (auto s = world_->Send(AsFloats(size), leader_, kTagPlanSize); !s.ok()) return s;
  return world_->Send(AsFloats(words), leader_, kTagPlan);
}

absl::Status RemoteReplica::Receive(std::span<float> logits) {
  if (logits.empty()) return absl::OkStatus();
  return world_->Recv(logits, leader_, kTagLogits);
}

absl::Status RemoteReplica::Stop() {
  const std::vector<int32_t> stop = {-1};
  return world_->Send(AsFloats(stop), leader_, kTagPlanSize);
}

namespace {

// The coordinator's steps until it says stop (OK) or one fails.
absl::Status ServeSteps(Engine& engine, comm::Communicator* world, int coordinator) {
  std::vector<int32_t> words;
  std::vector<float> logits;
  for (;;) {
    int32_t n = 0;
    if (auto s = world->RecvPatiently({reinterpret_cast<float*>(&n), 1}, coordinator, kTagPlanSize);
        !s.ok()) {
      return s;
    }
    if (n < 0) return absl::OkStatus();
    words.resize(n);
    if (auto s = world->Recv({reinterpret_cast<float*>(words.data()), words.size()}, coordinator,
                             kTagPlan);
        !s.ok()) {
      return s;
    }
    auto plan = DecodeStepPlan(words);
    if (!plan.ok())
      return absl::InternalError(StrCat("replica: bad plan: ", plan.status().message()));
    logits.assign(plan->n_logits() * engine.model().config().n_vocab, 0.0f);
    // A plan that fails validation is rejected on the coordinator's side too (the ranks agreed
    // on their setup at launch); the logits (zeros) still go back so the exchange stays in
    // step. Any other failure ends the replica.
    if (engine.Validate(*plan).ok()) {
      if (auto s = engine.Step(*plan, logits); !s.ok()) return s;
    }
    if (!logits.empty()) {
      if (auto r = world->Send(logits, coordinator, kTagLogits); !r.ok()) return r;
    }
  }
}

}  // namespace

absl::Status ServeReplica(Engine& engine, comm::Communicator* world, int coordinator) {
  const absl::Status s = ServeSteps(engine, world, coordinator);
  // The replica's followers are released whether it was stopped or failed: left waiting in
  // their broadcast, they would hold the job in MPI_Finalize.
  const absl::Status f = engine.StopFollowers();
  return s.ok() ? f : s;
}

}  // namespace kvmesh::worker
