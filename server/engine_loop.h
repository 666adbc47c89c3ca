// Runs the serving engine on one thread — the one that calls Run(), which under MPI must be the
// main thread (collectives are funneled) — while other threads (the network servers) submit and
// cancel requests and read the counters.
//
// Thread safety: Submit, Cancel, Stop and Snapshot may be called from any thread. Every callback
// (submission result, tokens, completion) runs on the loop thread; they must not block (post the
// work to your own executor).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "serving/serving_engine.h"

namespace kvmesh::server {

// A consistent copy of the engine's counters and histograms.
struct EngineSnapshot {
  serving::SchedulerStats stats;
  // Each data-parallel replica's own (one with one replica); stats sums them.
  std::vector<serving::SchedulerStats> replicas;
  serving::Histogram ttft{serving::LongLatencyBuckets()};
  serving::Histogram itl{serving::LatencyBuckets()};
  serving::Histogram e2e{serving::LongLatencyBuckets()};
  serving::Histogram queue{serving::LongLatencyBuckets()};
  serving::Histogram prefill{serving::LongLatencyBuckets()};
  serving::Histogram decode{serving::LongLatencyBuckets()};
  bool stopping = false;
};

class EngineLoop {
 public:
  explicit EngineLoop(serving::ServingEngine& engine);

  using Submitted = std::function<void(absl::StatusOr<serving::RequestId>)>;
  // Queues a request for the loop. `submitted` runs (on the loop thread) with the id, or with
  // the rejection: the scheduler's InvalidArgument / ResourceExhausted, or Unavailable once the
  // loop is stopping. The callbacks then follow as in serving::Scheduler.
  void Submit(serving::Request req, serving::Callbacks cb, Submitted submitted);
  void Cancel(serving::RequestId id);
  // Ends a request as finished with reason "stop" (serving::Scheduler::FinishEarly).
  void FinishEarly(serving::RequestId id);
  // Forgets a session's kept KV (its partial last block returns to the pool).
  void DropSession(const std::string& session_id);

  // Runs until Stop(): waits for work, steps while any request is waiting or running. After
  // Stop(), requests already accepted run to completion until `drain_deadline` has passed, then
  // the rest are cancelled; Run returns OK, or the first failed step's status. Submissions that
  // arrive once Run is returning are answered Unavailable (never left unanswered).
  absl::Status Run();
  void Stop(std::chrono::steady_clock::duration drain = std::chrono::seconds(25));

  EngineSnapshot Snapshot() const;

 private:
  struct Command {
    bool cancel = false;
    bool finish = false;  // with cancel: FinishEarly
    serving::RequestId id = 0;
    std::string drop_session;  // non-empty: a DropSession command
    serving::Request req;
    serving::Callbacks cb;
    Submitted submitted;
  };
  void Publish();
  absl::Status RunSteps();

  serving::ServingEngine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> inbox_;  // guarded by mu_
  bool stop_ = false;          // guarded by mu_
  bool exited_ = false;        // guarded by mu_: Run has returned; Submit answers at once
  std::chrono::steady_clock::time_point deadline_;         // guarded by mu_
  EngineSnapshot snapshot_;                                // guarded by mu_
  serving::Histogram e2e_{serving::LongLatencyBuckets()};  // loop thread only
};

}  // namespace kvmesh::server
