#include "serving/metrics.h"

#include <algorithm>

namespace kvmesh::serving {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  std::sort(bounds_.begin(), bounds_.end());
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  ++count_;
  sum_ += v;
}

void Histogram::Merge(const Histogram& other) {
  for (size_t i = 0; i < counts_.size() && i < other.counts_.size(); ++i)
    counts_[i] += other.counts_[i];
  count_ += other.count_;
  sum_ += other.sum_;
}

double Histogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double rank = std::clamp(q, 0.0, 1.0) * static_cast<double>(count_);
  int64_t below = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i] > 0 && static_cast<double>(below + counts_[i]) >= rank) {
      const double lo = i == 0 ? 0.0 : bounds_[i - 1];
      const double hi = i < bounds_.size() ? bounds_[i] : lo;
      return lo + (hi - lo) * (rank - static_cast<double>(below)) / static_cast<double>(counts_[i]);
    }
    below += counts_[i];
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

std::vector<double> LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
          0.5,   0.75,   1.0,   1.5,  2.0,  3.0,  5.0,  7.5,  10,  20,   30,  60};
}

std::vector<double> LongLatencyBuckets() {
  std::vector<double> b = LatencyBuckets();
  for (double s : {120, 240, 480, 960, 1920, 3840, 7680}) b.push_back(s);
  return b;
}

}  // namespace kvmesh::serving
