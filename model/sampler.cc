#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_set>
#include <vector>

#include "kernels/ops.h"
#include "util/str_cat.h"

namespace kvmesh::model {

absl::Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(StrCat("temperature must be >= 0, got ", temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!(repeat_penalty > 0.0f) || !std::isfinite(repeat_penalty)) {
    return absl::InvalidArgumentError(StrCat("repeat_penalty must be > 0, got ", repeat_penalty));
  }
  if (repeat_last_n < 0) return absl::InvalidArgumentError("repeat_last_n must be >= 0");
  return absl::OkStatus();
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The first index of the largest logit (as std::max_element); a NaN logit is never chosen
// (std::max_element's choice would depend on its position).
int32_t ArgMax(std::span<const float> x) {
  return static_cast<int32_t>(kernels::ArgMaxCpu(x.data(), static_cast<int64_t>(x.size())));
}

}  // namespace

int32_t Sampler::Sample(std::span<float> logits, std::span<const int32_t> history) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n > 0) {
    const size_t from = history.size() > static_cast<size_t>(p_.repeat_last_n)
                            ? history.size() - p_.repeat_last_n
                            : 0;
    std::unordered_set<int32_t> seen(history.begin() + from, history.end());
    for (int32_t id : seen) {
      if (id < 0 || id >= n) continue;
      // As llama.cpp: shrink positive logits, push negative ones further down.
      logits[id] = logits[id] > 0 ? logits[id] / p_.repeat_penalty : logits[id] * p_.repeat_penalty;
    }
  }
  if (p_.temperature <= 0.0f) {
    return ArgMax(logits);
  }
  // NaN counts as -inf, so it is never chosen. A +inf logit (a repeat penalty of 1e-40 can make
  // one) holds all the mass: the choice is uniform among the +inf logits of the top k.
  auto key = [&](int32_t i) { return std::isnan(logits[i]) ? -kInf : logits[i]; };
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  const int32_t k = (p_.top_k <= 0 || p_.top_k > n) ? n : p_.top_k;
  auto by_logit = [&](int32_t a, int32_t b) {
    if (key(a) != key(b)) return key(a) > key(b);
    const bool nan_a = std::isnan(logits[a]), nan_b = std::isnan(logits[b]);
    return nan_a != nan_b ? nan_b : a < b;  // among -inf, NaN last
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(k);
  const float mx = key(idx[0]);
  if (mx == kInf) {
    const int32_t n_inf = static_cast<int32_t>(
        std::count_if(idx.begin(), idx.end(), [&](int32_t i) { return key(i) == kInf; }));
    return idx[std::uniform_int_distribution<int32_t>(0, n_inf - 1)(rng_)];
  }
  if (mx == -kInf) return idx[0];  // every logit -inf or NaN: nothing to weigh
  std::vector<double> prob(k);
  double sum = 0.0;
  for (int32_t i = 0; i < k; ++i) {
    prob[i] = std::exp((static_cast<double>(key(idx[i])) - mx) / p_.temperature);
    sum += prob[i];
  }
  // Top-p: the smallest prefix (by probability) whose mass reaches top_p.
  int32_t keep = k;
  if (p_.top_p < 1.0f) {
    double cum = 0.0;
    for (int32_t i = 0; i < k; ++i) {
      cum += prob[i] / sum;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double total = 0.0;
  for (int32_t i = 0; i < keep; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (int32_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0.0) return idx[i];
  }
  return idx[keep - 1];
}

}  // namespace kvmesh::model
