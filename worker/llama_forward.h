// The Llama forward pass on CPU: embedding, per layer RMSNorm -> QKV -> RoPE -> attention over
// the KV cache -> output projection -> residual -> RMSNorm -> SwiGLU MLP -> residual, then the
// final norm and the (tied) LM head.
//
// With a tensor-parallel shard, each rank runs its slice of every layer and the partial outputs
// of the O and down projections are summed over `comm` (two all-reduces per layer); the LM
// head's vocabulary slices are gathered on rank 0. Every rank of the group must make the same
// sequence of Forward calls.
//
// Holds scratch buffers, so one LlamaForward serves one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "comm/communicator.h"
#include "kernels/thread_pool.h"
#include "kvstore/kv_cache.h"
#include "model/llama_model.h"
#include "model/shard.h"

namespace kvmesh::worker {

// This rank's place in a pipeline: its stage and the world ranks it exchanges with.
struct PipelinePlace {
  model::PipelineStage stage;           // n_stages == 1 (the default): every layer, no exchange
  comm::Communicator* world = nullptr;  // point-to-point between stages (not owned)
  int prev = -1, next = -1;             // world ranks of this TP rank in the previous / next stage
  int logits_to = -1;    // on the last stage's TP rank 0: the leader's world rank (if not itself)
  int logits_from = -1;  // on the leader: the last stage's TP rank 0 (if not itself)
};

class LlamaForward {
 public:
  // Prefill is processed in micro-batches of at most max_batch tokens (bounds scratch memory).
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool, int64_t max_batch = 512);
  // A tensor-parallel rank: `shard` says which slice; `comm` is the TP group (size tp_size).
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
               const model::TpShard& shard, comm::Communicator* comm, int64_t max_batch = 512);
  // A rank of stage `place.stage` of a pipeline (and of a TP group within the stage). Stages
  // pass hidden states [tokens, n_embd] forward with Send/Recv, one micro-batch at a time.
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool,
               const model::TpShard& shard, comm::Communicator* comm, const PipelinePlace& place,
               int64_t max_batch = 512);
  // Layers this rank runs (the KvCache passed to Forward must have this many).
  int64_t n_layers() const { return place_.stage.layer_end - place_.stage.layer_begin; }

  // KV heads this rank caches (the KvCache passed to Forward must have this many).
  int64_t n_kv_heads() const { return shard_.kv_head_end - shard_.kv_head_begin; }
  const model::TpShard& shard() const { return shard_; }
  // Wall time spent inside collectives (all-reduces and the logits gather) since construction,
  // including waiting for slower ranks.
  double comm_seconds() const { return comm_ns_ * 1e-9; }
  int64_t comm_calls() const { return comm_calls_; }

  // Runs `tokens` at positions [cache.size(), cache.size() + n), appends their K/V to the cache
  // and, if logits is non-empty (n_vocab floats), writes the logits of the last token (on TP
  // rank 0; whether logits is empty must agree across the group).
  // InvalidArgument for a token id outside the vocabulary; ResourceExhausted if the cache is full.
  // Nothing is appended to the cache on error.
  absl::Status Forward(std::span<const int32_t> tokens, kvstore::KvCache& cache,
                       std::span<float> logits);

 private:
  absl::Status Batch(const int32_t* tokens, int64_t n, kvstore::KvCache& cache);
  absl::Status AllReduce(int64_t n);  // sums tmp_[0, n) over the TP group
  kernels::WeightMatrix Materialise(const kernels::WeightMatrix& w);  // copy into owned_
  void CountComm(std::chrono::steady_clock::time_point t0);

  const model::LlamaModel& model_;
  kernels::ThreadPool& pool_;
  const int64_t max_batch_;
  model::TpShard shard_;
  comm::Communicator* comm_ = nullptr;  // null: one rank
  PipelinePlace place_;
  std::vector<model::LlamaLayer> layers_;  // this rank's views
  // Column slices (O, down) copied into contiguous rank-owned rows: read in place they would
  // share pages and prefetch streams with the peers' columns.
  std::vector<std::vector<uint8_t>> owned_;
  kernels::WeightMatrix output_;
  std::vector<float> local_logits_;
  std::vector<int> vocab_counts_;
  int64_t comm_ns_ = 0, comm_calls_ = 0;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
  std::vector<int32_t> pos_;
};

}  // namespace kvmesh::worker
