// util::HugePageRegion, which the KV arena and the packed weights live in: its geometry, and
// whether the kernel backs it with huge pages (read back from /proc/self/smaps).
#include "util/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "kvstore/block_arena.h"

namespace kvmesh::util {
namespace {

// The transparent_hugepage mode in force ("always", "madvise" or "never"; "" if unknown).
std::string ThpMode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  const size_t a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
}

// AnonHugePages (kB) of the mapping that holds p, from /proc/self/smaps; -1 if not found.
int64_t AnonHugeKbAt(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stoll(line.substr(std::strlen("AnonHugePages:")));
    }
  }
  return -1;
}

TEST(HugePageRegionTest, WholeAlignedHugePagesZeroedAndWritable) {
  EXPECT_EQ(HugePageRegion::Map(0).data(), nullptr);
  for (const size_t bytes : {size_t{1}, kHugePageBytes, kHugePageBytes + 1, size_t{5} << 20}) {
    HugePageRegion r = HugePageRegion::Map(bytes);
    ASSERT_NE(r.data(), nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data()) % kHugePageBytes, 0u) << bytes;
    EXPECT_EQ(r.size(), (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes) << bytes;
    EXPECT_EQ(r.data()[0], 0);
    EXPECT_EQ(r.data()[r.size() - 1], 0);
    std::memset(r.data(), 0x5a, r.size());
    EXPECT_EQ(r.data()[r.size() - 1], 0x5a);
    HugePageRegion moved = std::move(r);
    EXPECT_EQ(r.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(moved.data()[0], 0x5a);
  }
}

TEST(HugePageRegionTest, BackedByHugePagesWhereTheKernelAllows) {
  const std::string mode = ThpMode();
  if (mode != "always" && mode != "madvise") {
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' on this host";
  }
  ASSERT_TRUE(HugePageRegion::Wanted());
  HugePageRegion r = HugePageRegion::Map(8 * kHugePageBytes);
  std::memset(r.data(), 1, r.size());
  EXPECT_GE(AnonHugeKbAt(r.data()), 2048)
      << "no huge page in an 8-page region (mode " << mode << ")";

  // The KV arena's blocks are on them too.
  auto arena = kvstore::KvBlockArena::Create({30, 3, 64, 16}, 64);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::memset((*arena)->block(0), 1, static_cast<size_t>((*arena)->shape().block_bytes()) * 64);
  EXPECT_GE(AnonHugeKbAt((*arena)->block(0)), 2048);

  // KVMESH_HUGE_PAGES=0: the request is left out (with `madvise`, none are given then).
  setenv("KVMESH_HUGE_PAGES", "0", 1);
  EXPECT_FALSE(HugePageRegion::Wanted());
  HugePageRegion plain = HugePageRegion::Map(8 * kHugePageBytes);
  unsetenv("KVMESH_HUGE_PAGES");
  std::memset(plain.data(), 1, plain.size());
  if (mode == "madvise") {
    EXPECT_EQ(AnonHugeKbAt(plain.data()), 0);
  }
}

}  // namespace
}  // namespace kvmesh::util
