// The RPC API's sampling parameters (kvmesh.v1.SamplingParams) as the sampler's.
#pragma once

#include <algorithm>

#include "absl/status/statusor.h"
#include "kvmesh.pb.h"
#include "model/sampler.h"
#include "util/random_seed.h"
#include "util/str_cat.h"

namespace kvmesh::server {

// The proto's zeros mean "off" (top_p, repeat_penalty); anything else out of range, or NaN, is
// an error naming the field, as the HTTP API's.
inline absl::StatusOr<model::SamplingParams> SamplingFromProto(
    const kvmesh::v1::SamplingParams& p) {
  auto in = [](float v, float lo, float hi) { return v >= lo && v <= hi; };  // false for NaN
  if (!in(p.temperature(), 0, 100)) {
    return absl::InvalidArgumentError(
        StrCat("temperature must be in [0, 100], not ", p.temperature()));
  }
  if (!in(p.top_p(), 0, 1)) {
    return absl::InvalidArgumentError(StrCat("top_p must be in [0, 1], not ", p.top_p()));
  }
  if (!in(p.repeat_penalty(), 0, 100)) {
    return absl::InvalidArgumentError(
        StrCat("repeat_penalty must be in [0, 100], not ", p.repeat_penalty()));
  }
  model::SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = std::max(0, p.top_k());
  s.top_p = p.top_p() > 0 ? p.top_p() : 1.0f;
  s.repeat_penalty = p.repeat_penalty() > 0 ? p.repeat_penalty() : 1.0f;
  s.seed = p.has_seed() ? p.seed() : util::RandomSeed();
  return s;
}

}  // namespace kvmesh::server
