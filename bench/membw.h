// A memory read-bandwidth probe: streams a buffer much larger than the last-level cache with
// `threads` threads and reports bytes read per second (median of repetitions).
#pragma once

#include <cstdint>

namespace kvmesh::bench {

struct BandwidthResult {
  double median_gbps = 0;  // 1e9 bytes / s
  double min_gbps = 0, max_gbps = 0;
};

// Blocks for about reps * (buffer_bytes / bandwidth). buffer_bytes is rounded to 4 KiB.
BandwidthResult MeasureReadBandwidth(int threads, int64_t buffer_bytes = int64_t{1} << 30,
                                     int reps = 7);

}  // namespace kvmesh::bench
