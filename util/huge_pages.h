// Anonymous memory asked to be backed by transparent huge pages (2 MiB).
//
// What streams through the kernels every step (packed weights: ~100 MB per decode token; the KV
// cache: blocks spread over the pool, each holding every layer) touches far more 4 KiB pages
// than the TLBs hold, so every page costs a table walk, and a software prefetch that walks
// stalls its thread. On 2 MiB pages the same bytes are ~500 times fewer pages. The region is
// 2 MiB-aligned and asked for with MADV_HUGEPAGE, so it gets huge pages where the kernel's
// transparent_hugepage setting is `always` or `madvise`; elsewhere it is plain anonymous memory
// and everything works the same. Pages are committed (zeroed) when first written.
// KVMESH_HUGE_PAGES=0 in the environment leaves out the request (plain 4 KiB pages), for hosts
// that keep huge pages for other work and to measure what they give.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace kvmesh::util {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

class HugePageRegion {
 public:
  HugePageRegion() = default;
  // bytes rounded up to whole huge pages; empty (data() == nullptr) if the mapping fails.
  static HugePageRegion Map(size_t bytes) {
    HugePageRegion r;
    if (bytes == 0) return r;
    const size_t size = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    // Map one huge page more than needed and trim both ends to a 2 MiB boundary.
    void* p = mmap(nullptr, size + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return r;
    const auto raw = reinterpret_cast<uintptr_t>(p);
    const uintptr_t start = (raw + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
    if (start > raw) munmap(p, start - raw);
    if (const size_t tail = raw + size + kHugePageBytes - (start + size); tail > 0) {
      munmap(reinterpret_cast<void*>(start + size), tail);
    }
    if (Wanted()) madvise(reinterpret_cast<void*>(start), size, MADV_HUGEPAGE);  // a hint only
    r.data_ = reinterpret_cast<uint8_t*>(start);
    r.size_ = size;
    return r;
  }
  ~HugePageRegion() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  HugePageRegion(HugePageRegion&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  HugePageRegion& operator=(HugePageRegion&& o) noexcept {
    if (this != &o) {
      if (data_ != nullptr) munmap(data_, size_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  HugePageRegion(const HugePageRegion&) = delete;
  HugePageRegion& operator=(const HugePageRegion&) = delete;

  // Whether regions ask for huge pages (KVMESH_HUGE_PAGES is not "0").
  static bool Wanted() {
    const char* e = std::getenv("KVMESH_HUGE_PAGES");
    return e == nullptr || std::string_view(e) != "0";
  }

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvmesh::util
