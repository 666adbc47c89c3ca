// std::vector whose storage starts on a cache line (64 bytes).
//
// The kernels write a packed group's 16 outputs of a token as one 64-byte vector, and read
// activations a vector at a time; with the 16-byte alignment malloc gives (and mmap'd chunks
// always have: page + 16), every such access straddles two lines, and neighbouring groups that
// two threads write share a line. A 16-token Q4_1 product of 1536 x 576 on AMX, 2 threads:
// 62-63 us into an aligned output against 65-67 us 16 bytes off (kernels_bench, alternating);
// the decode step of 16 sequences over a 1K context with the engine's buffers aligned, 19.4-19.8
// ms against 20.4-21.2 ms (shared_context_bench, three alternating runs; 23rd session, Intel
// Xeon with AMX).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace kvmesh::util {

inline constexpr std::size_t kCacheLineBytes = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLineBytes}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{kCacheLineBytes});
  }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace kvmesh::util
