// The serving engine inside the leader process: the rank's worker::Engine plus one scheduler per
// data-parallel replica, with text and chat front ends. This is the API the RPC and HTTP servers
// put on the network.
//
// Data parallelism: replica 0 runs on this process's engine (and its TP/PP group); replicas
// r > 0 are remote (worker::RemoteReplica). A request goes to the replica that knows most of its
// prompt, or to the least loaded one (serving/router.h); a session stays on its replica. Each
// step sends the remote replicas' plans first, runs replica 0's, then collects the remote logits,
// so replicas compute at the same time.
//
// Pipeline parallelism (pp > 1, one replica): the scheduler keeps up to pp steps in flight,
// each over its share of the running batch. Step() starts steps until pp are in flight, then
// finishes the oldest: while the last stage computes step i, the first already runs step i + 1.
//
// Submit/Cancel/Step are single-threaded (the caller drives Step, or Generate drives it until
// its request is done). Followers (world rank > 0) only run Engine::ServeFollower or
// worker::ServeReplica.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "serving/scheduler.h"
#include "util/aligned_vector.h"
#include "worker/engine.h"
#include "worker/replica_link.h"

namespace kvmesh::serving {

struct ServingOptions {
  int32_t max_seqs = 16;  // per replica
  int32_t max_batched_tokens = 512;
  int32_t max_waiting = 1024;  // per replica
  int32_t max_sessions = 256;
  bool prefix_caching = true;
  double preempt_probability = 0;  // test hook (see SchedulerOptions)
  uint64_t preempt_seed = 1;
};

class ServingEngine {
 public:
  // `engine` must be the leader's (world rank 0); `remotes` are replicas 1.. (none: dp = 1).
  // Not owned; must outlive this object.
  ServingEngine(worker::Engine& engine, const ServingOptions& opts,
                std::vector<worker::RemoteReplica*> remotes = {});

  worker::Engine& engine() { return engine_; }
  int replicas() const { return static_cast<int>(schedulers_.size()); }
  int32_t max_waiting() const { return max_waiting_; }  // per replica
  // Replica r's scheduler (tests, per-replica introspection).
  Scheduler& scheduler(int r = 0) { return *schedulers_[r]; }

  // See Scheduler::Submit / Cancel / Step; ids are unique across replicas.
  absl::StatusOr<RequestId> Submit(Request req, Callbacks cb);
  bool Cancel(RequestId id);
  bool FinishEarly(RequestId id);  // Scheduler::FinishEarly
  absl::Status Step();
  bool idle() const;
  void CancelAll(absl::Status why = absl::CancelledError("request cancelled"));
  bool DropSession(const std::string& session_id);
  void DropSessions();
  void SetPreemptProbabilityForTesting(double p);
  // Summed over replicas.
  SchedulerStats stats() const;
  Histogram ttft_seconds() const;
  Histogram itl_seconds() const;
  Histogram queue_seconds() const;    // Scheduler::queue_seconds
  Histogram prefill_seconds() const;  // Scheduler::prefill_seconds
  Histogram decode_seconds() const;   // Scheduler::decode_seconds
  // Steps until no request is waiting or running. Returns the first failed step's status.
  absl::Status RunUntilIdle();
  // Finishes the pipelined steps in flight (their requests' callbacks run). Returns the first
  // failure.
  absl::Status Drain();
  // Finishes the steps in flight and releases the remote replicas (call once, at the end).
  absl::Status StopReplicas();

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
  static constexpr int kReplicaBits = 8;  // global id = local id << 8 | replica
  int Route(const Request& req);
  absl::Status PipelinedStep();
  absl::Status FinishOldestStep();
  // One of the schedulers' histograms, summed over replicas.
  Histogram Merged(const Histogram& (Scheduler::*which)() const) const;

  worker::Engine& engine_;
  std::vector<worker::RemoteReplica*> remotes_;
  std::vector<std::unique_ptr<Scheduler>> schedulers_;
  absl::flat_hash_map<std::string, int> session_replica_;  // with several replicas only
  int32_t max_sessions_ = 1;
  int32_t max_waiting_ = 1;
  int32_t max_seqs_ = 1;
  uint64_t routed_ = 0;  // requests routed: whose turn a full tie is (serving/router.h)
  util::AlignedVector<float> logits_;  // starts on a cache line (the LM head writes it)
  bool pipelined_ = false;             // pp > 1 with one replica: steps overlap across stages

  std::vector<std::vector<float>> remote_logits_;
};

}  // namespace kvmesh::serving
