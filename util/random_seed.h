// A seed for a request that did not give one: OpenAI's semantics (no seed, a fresh draw each
// time), from the OS's entropy once per process, then a counter mixed through splitmix64.
#pragma once

#include <atomic>
#include <cstdint>
#include <random>

namespace kvmesh::util {

inline uint64_t RandomSeed() {
  static const uint64_t base = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  uint64_t z = base + 0x9E3779B97F4A7C15ull * (counter.fetch_add(1) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace kvmesh::util
