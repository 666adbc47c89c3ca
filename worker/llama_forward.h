// The Llama forward pass on CPU: embedding, per layer RMSNorm -> QKV -> RoPE -> attention over
// the KV cache -> output projection -> residual -> RMSNorm -> SwiGLU MLP -> residual, then the
// final norm and the (tied) LM head.
//
// Holds scratch buffers, so one LlamaForward serves one thread at a time.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/thread_pool.h"
#include "kvstore/kv_cache.h"
#include "model/llama_model.h"

namespace kvmesh::worker {

class LlamaForward {
 public:
  // Prefill is processed in micro-batches of at most max_batch tokens (bounds scratch memory).
  LlamaForward(const model::LlamaModel& model, kernels::ThreadPool& pool, int64_t max_batch = 512);

  // Runs `tokens` at positions [cache.size(), cache.size() + n), appends their K/V to the cache
  // and, if logits is non-empty (n_vocab floats), writes the logits of the last token.
  // InvalidArgument for a token id outside the vocabulary; ResourceExhausted if the cache is full.
  // Nothing is appended to the cache on error.
  absl::Status Forward(std::span<const int32_t> tokens, kvstore::KvCache& cache,
                       std::span<float> logits);

 private:
  void Batch(const int32_t* tokens, int64_t n, kvstore::KvCache& cache);

  const model::LlamaModel& model_;
  kernels::ThreadPool& pool_;
  const int64_t max_batch_;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, gate_, up_;
  std::vector<int32_t> pos_;
};

}  // namespace kvmesh::worker
