// Token sampling from a logit vector: repetition penalty, then greedy (temperature <= 0) or
// top-k -> temperature -> top-p -> a draw from a seeded generator. The same seed and inputs give
// the same tokens. Not thread safe (owns its generator).
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "absl/status/status.h"

namespace kvmesh::model {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;           // <= 0: all tokens
  float top_p = 0.95f;          // 1: off
  float repeat_penalty = 1.0f;  // 1: off; applied to tokens of the last repeat_last_n
  int32_t repeat_last_n = 64;
  uint64_t seed = 0;
  // InvalidArgument naming the field if a value is out of range.
  absl::Status Validate() const;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}
  // `history`: tokens so far (prompt and generated), for the repetition penalty. Modifies logits.
  int32_t Sample(std::span<float> logits, std::span<const int32_t> history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

}  // namespace kvmesh::model
