// The serving engine inside the leader process: the rank's worker::Engine plus the scheduler,
// with text and chat front ends. This is the API the RPC and HTTP servers put on the network.
//
// Submit/Cancel/Step are single-threaded (the caller drives Step, or Generate drives it until
// its request is done). Followers (world rank > 0) only run Engine::ServeFollower.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "serving/scheduler.h"
#include "worker/engine.h"

namespace kvmesh::serving {

struct ServingOptions {
  int32_t max_seqs = 16;
  int32_t max_batched_tokens = 512;
  int32_t max_waiting = 1024;
  int32_t max_sessions = 256;
  bool prefix_caching = true;
  double preempt_probability = 0;  // test hook (see SchedulerOptions)
  uint64_t preempt_seed = 1;
};

class ServingEngine {
 public:
  // `engine` must be the leader's (world rank 0). Not owned; must outlive this object.
  ServingEngine(worker::Engine& engine, const ServingOptions& opts);

  worker::Engine& engine() { return engine_; }
  Scheduler& scheduler() { return *scheduler_; }

  // See Scheduler::Submit / Cancel / Step.
  absl::StatusOr<RequestId> Submit(Request req, Callbacks cb) {
    return scheduler_->Submit(std::move(req), std::move(cb));
  }
  bool Cancel(RequestId id) { return scheduler_->Cancel(id); }
  absl::Status Step() { return scheduler_->Step(); }
  // Steps until no request is waiting or running. Returns the first failed step's status.
  absl::Status RunUntilIdle();

  // Submits one request and steps until it completes (other queued requests progress too).
  // The request's own failure is in the Completion's status; a failed step is returned.
  absl::StatusOr<Completion> Generate(Request req,
                                      const std::function<void(int32_t)>& on_token = {});
  // Logits at the last position of `prompt` (raw tokens), n_vocab floats; nothing is reused
  // from or left in the prefix cache.
  absl::StatusOr<std::vector<float>> LastLogits(const std::vector<int32_t>& prompt);

  // The detokenised text of generated ids (control tokens dropped).
  std::string Text(const std::vector<int32_t>& tokens) const;

 private:
  worker::Engine& engine_;
  std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace kvmesh::serving
