// The median of benchmark samples, shared by the benchmark binaries: the middle value, or the mean
// of the two middle values for an even count; 0 for none.
#pragma once

#include <algorithm>
#include <vector>

namespace kvmesh::bench {

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 != 0 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

}  // namespace kvmesh::bench
