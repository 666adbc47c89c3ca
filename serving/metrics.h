// Counters and histograms the serving engine keeps (exported by the metrics endpoint later).
// Thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

namespace kvmesh::serving {

// A fixed-bucket histogram, Prometheus style: counts per upper bound (the last bucket is
// +Inf), plus the sum and count of observations.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  // Adds another histogram's observations (same buckets).
  void Merge(const Histogram& other);

  const std::vector<double>& upper_bounds() const { return bounds_; }
  // Observations in bucket i: (bounds[i-1], bounds[i]]; one more bucket for > bounds.back().
  const std::vector<int64_t>& bucket_counts() const { return counts_; }
  int64_t count() const { return count_; }
  double sum() const { return sum_; }
  // The q-quantile (0 <= q <= 1) interpolated within its bucket; 0 when empty.
  double Quantile(double q) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  double sum_ = 0;
};

// Latency buckets in seconds, 1 ms to 60 s (inter-token latency).
std::vector<double> LatencyBuckets();
// The same, then on to 7,680 s (about vLLM's range), for times a whole prompt or answer takes:
// time to first token (queueing included) and end-to-end latency.
std::vector<double> LongLatencyBuckets();

}  // namespace kvmesh::serving
