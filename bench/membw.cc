#include "bench/membw.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/isa.h"
#include "kernels/thread_pool.h"

namespace kvmesh::bench {
namespace {

__attribute__((target("avx2"))) uint64_t SumAvx2(const uint64_t* p, int64_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) s += p[i];
  return s;
}

uint64_t SumScalar(const uint64_t* p, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

}  // namespace

BandwidthResult MeasureReadBandwidth(int threads, int64_t buffer_bytes, int reps) {
  buffer_bytes = std::max<int64_t>(4096, buffer_bytes / 4096 * 4096);
  auto* buf = static_cast<uint64_t*>(std::aligned_alloc(4096, buffer_bytes));
  const int64_t n = buffer_bytes / 8;
  kernels::ThreadPool pool(threads);
  // Touch every page from the threads that will read it (first-touch placement).
  pool.ParallelFor(n, 512, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
  });
  const bool avx2 = kernels::ActiveIsa() != kernels::Isa::kScalar;
  std::vector<double> gbps;
  volatile uint64_t sink = 0;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<uint64_t> partial(threads, 0);
    const auto t0 = std::chrono::steady_clock::now();
    pool.Run([&](int t, int nt) {
      const int64_t per = n / nt / 512 * 512;
      const int64_t b = t * per, e = t == nt - 1 ? n : b + per;
      partial[t] = avx2 ? SumAvx2(buf + b, e - b) : SumScalar(buf + b, e - b);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (uint64_t p : partial) sink = sink + p;
    if (r > 0) gbps.push_back(buffer_bytes / s / 1e9);  // the first pass is a warm-up
  }
  std::free(buf);
  std::sort(gbps.begin(), gbps.end());
  return {gbps[gbps.size() / 2], gbps.front(), gbps.back()};
}

}  // namespace kvmesh::bench
