#include "server/engine_loop.h"

#include <utility>

namespace kvmesh::server {

EngineLoop::EngineLoop(serving::ServingEngine& engine) : engine_(engine) { Publish(); }

void EngineLoop::Submit(serving::Request req, serving::Callbacks cb, Submitted submitted) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (exited_) {
      lock.unlock();
      submitted(absl::UnavailableError("server is shutting down"));
      return;
    }
    Command c;
    c.req = std::move(req);
    c.cb = std::move(cb);
    c.submitted = std::move(submitted);
    inbox_.push_back(std::move(c));
  }
  cv_.notify_one();
}

void EngineLoop::Cancel(serving::RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Command c;
    c.cancel = true;
    c.id = id;
    inbox_.push_back(std::move(c));
  }
  cv_.notify_one();
}

void EngineLoop::FinishEarly(serving::RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Command c;
    c.cancel = true;
    c.finish = true;
    c.id = id;
    inbox_.push_back(std::move(c));
  }
  cv_.notify_one();
}

void EngineLoop::Stop(std::chrono::steady_clock::duration drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) deadline_ = std::chrono::steady_clock::now() + drain;
    stop_ = true;
  }
  cv_.notify_one();
}

void EngineLoop::DropSession(const std::string& session_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Command c;
    c.drop_session = session_id;
    inbox_.push_back(std::move(c));
  }
  cv_.notify_one();
}

EngineSnapshot EngineLoop::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snapshot_;
}

void EngineLoop::Publish() {
  EngineSnapshot s;
  s.stats = engine_.stats();
  for (int r = 0; r < engine_.replicas(); ++r) s.replicas.push_back(engine_.scheduler(r).stats());
  s.ttft = engine_.ttft_seconds();
  s.itl = engine_.itl_seconds();
  s.queue = engine_.queue_seconds();
  s.prefill = engine_.prefill_seconds();
  s.decode = engine_.decode_seconds();
  s.e2e = e2e_;
  std::lock_guard<std::mutex> lock(mu_);
  s.stopping = stop_;
  snapshot_ = std::move(s);
}

absl::Status EngineLoop::Run() {
  absl::Status s = RunSteps();
  // Whatever is still queued gets its answer: nobody may wait on a loop that has stopped.
  std::deque<Command> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exited_ = true;
    left.swap(inbox_);
  }
  for (Command& c : left) {
    if (c.submitted) c.submitted(absl::UnavailableError("server is shutting down"));
  }
  return s;
}

absl::Status EngineLoop::RunSteps() {
  serving::ServingEngine& sched = engine_;
  std::vector<serving::RequestId> live;
  for (;;) {
    std::deque<Command> commands;
    bool stopping;
    std::chrono::steady_clock::time_point deadline;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !inbox_.empty() || stop_ || !sched.idle(); });
      commands.swap(inbox_);
      stopping = stop_;
      deadline = deadline_;
    }
    for (Command& c : commands) {
      if (!c.drop_session.empty()) {
        sched.DropSession(c.drop_session);
        continue;
      }
      if (c.cancel) {
        if (c.finish) {
          sched.FinishEarly(c.id);
        } else {
          sched.Cancel(c.id);
        }
        continue;
      }
      if (stopping) {
        c.submitted(absl::UnavailableError("server is shutting down"));
        continue;
      }
      // Completions also feed the end-to-end latency histogram.
      auto done = std::move(c.cb.on_done);
      c.cb.on_done = [this, done = std::move(done)](const serving::Completion& comp) {
        if (comp.status.ok()) e2e_.Observe(comp.total_ms / 1e3);
        // Published before the answer goes out: a client that reads /metrics after its
        // response sees it counted (publishing only after the step lagged by one step).
        Publish();
        if (done) done(comp);
      };
      c.submitted(sched.Submit(std::move(c.req), std::move(c.cb)));
    }
    if (stopping && std::chrono::steady_clock::now() >= deadline) {
      // Out of time: whatever is left ends now (each request's on_done reports Unavailable).
      sched.CancelAll(absl::UnavailableError("server shut down before the request finished"));
    }
    if (!sched.idle()) {
      if (auto s = sched.Step(); !s.ok()) {
        sched.CancelAll(s);           // the failure ends the requests of later steps too
        sched.Drain().IgnoreError();  // steps in flight end their requests; s is the error
        Publish();
        return s;
      }
    }
    Publish();
    if (stopping && sched.idle()) return absl::OkStatus();
  }
}

}  // namespace kvmesh::server
