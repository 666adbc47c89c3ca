#include "comm/shm/shm_communicator.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "util/str_cat.h"

namespace kvmesh::comm {
namespace {

constexpr int kMaxRanks = 64;
constexpr size_t kSlotFloats = size_t{1} << 18;  // 1 MiB per rank and buffer
// Busy polls (PAUSE, ~20-40 ns each) before a waiting rank starts yielding its core: long enough
// to cover the usual skew between ranks (a few microseconds), short enough for ranks that share
// cores (oversubscribed) not to starve each other.
constexpr uint32_t kSpins = 256;

// One rank's published state, on its own cache line.
struct alignas(64) RankState {
  std::atomic<uint64_t> seq;  // the last call whose values are in the rank's slot
  std::atomic<int32_t> pid;
};

struct Header {
  RankState rank[kMaxRanks];
};

size_t SegmentBytes(int size) { return sizeof(Header) + 2 * size * kSlotFloats * sizeof(float); }

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(Communicator& group, void* base, size_t bytes)
      : group_(group),
        base_(base),
        bytes_(bytes),
        header_(static_cast<Header*>(base)),
        rank_(group.rank()),
        size_(group.size()) {}
  ~ShmCommunicator() override { munmap(base_, bytes_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduceSum(std::span<float> buf) override {
    if (size_ == 1) return absl::OkStatus();
    if (buf.size() > kSlotFloats) return group_.AllReduceSum(buf);
    const uint64_t gen = Publish(buf);
    if (auto s = WaitForAll(gen); !s.ok()) return s;
    // Rank order on every rank: the same bits everywhere.
    const int b = static_cast<int>(gen & 1);
    float* out = buf.data();
    const size_t n = buf.size();
    std::memcpy(out, Slot(b, 0), n * sizeof(float));
    for (int r = 1; r < size_; ++r) {
      const float* in = Slot(b, r);
      for (size_t i = 0; i < n; ++i) out[i] += in[i];
    }
    return absl::OkStatus();
  }
  absl::Status AllReduceSum(std::span<uint16_t> buf, HalfType type) override {
    return group_.AllReduceSum(buf, type);
  }
  absl::Status Broadcast(std::span<uint8_t> buf, int root) override {
    return group_.Broadcast(buf, root);
  }
  absl::Status Barrier() override { return group_.Barrier(); }
  absl::Status Send(std::span<const float> buf, int dst, int tag) override {
    return group_.Send(buf, dst, tag);
  }
  absl::Status Recv(std::span<float> buf, int src, int tag) override {
    return group_.Recv(buf, src, tag);
  }
  absl::StatusOr<std::unique_ptr<PendingRecv>> RecvAsync(std::span<float> buf, int src,
                                                         int tag) override {
    return group_.RecvAsync(buf, src, tag);
  }
  absl::Status AllGather(std::span<const float> mine, std::span<float> all) override {
    if (all.size() < mine.size() * size_) {
      return absl::InvalidArgumentError("all-gather: receive buffer too small");
    }
    if (mine.size() > kSlotFloats) return group_.AllGather(mine, all);
    const uint64_t gen = Publish(mine);
    if (auto s = WaitForAll(gen); !s.ok()) return s;
    for (int r = 0; r < size_; ++r) {
      std::memcpy(all.data() + r * mine.size(), Slot(static_cast<int>(gen & 1), r),
                  mine.size() * sizeof(float));
    }
    return absl::OkStatus();
  }
  absl::Status GatherV(std::span<const float> mine, std::span<float> all,
                       std::span<const int> counts, int root) override {
    if (static_cast<int>(counts.size()) != size_ ||
        counts[rank_] != static_cast<int>(mine.size()) || root < 0 || root >= size_) {
      return absl::InvalidArgumentError("gather: counts do not match the group");
    }
    size_t total = 0;
    bool fits = true;
    for (int c : counts) {
      fits = fits && c >= 0 && static_cast<size_t>(c) <= kSlotFloats;
      total += static_cast<size_t>(std::max(c, 0));
    }
    if (!fits) return group_.GatherV(mine, all, counts, root);
    if (rank_ == root && all.size() < total) {
      return absl::InvalidArgumentError("gather: receive buffer too small");
    }
    const uint64_t gen = Publish(mine);
    // Every rank waits for every other, so none can reuse a slot the root still reads.
    if (auto s = WaitForAll(gen); !s.ok()) return s;
    if (rank_ == root) {
      size_t at = 0;
      for (int r = 0; r < size_; ++r) {
        std::memcpy(all.data() + at, Slot(static_cast<int>(gen & 1), r), counts[r] * sizeof(float));
        at += counts[r];
      }
    }
    return absl::OkStatus();
  }

 private:
  float* Slot(int buffer, int rank) const {
    return reinterpret_cast<float*>(static_cast<char*>(base_) + sizeof(Header)) +
           (static_cast<size_t>(buffer) * size_ + rank) * kSlotFloats;
  }
  // Copies this rank's values into its slot for the next call and announces them.
  uint64_t Publish(std::span<const float> v) {
    const uint64_t gen = ++gen_;
    std::memcpy(Slot(static_cast<int>(gen & 1), rank_), v.data(), v.size() * sizeof(float));
    header_->rank[rank_].seq.store(gen, std::memory_order_release);
    return gen;
  }
  absl::Status WaitForAll(uint64_t gen) {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      std::atomic<uint64_t>& seq = header_->rank[r].seq;
      auto next_check = std::chrono::steady_clock::time_point::min();
      for (uint32_t spin = 0; seq.load(std::memory_order_acquire) < gen; ++spin) {
        if (spin < kSpins) {
#if defined(__x86_64__)
          __builtin_ia32_pause();
#endif
          continue;
        }
        sched_yield();  // a peer may be waiting for this core
        if ((spin & 1023) == 0) {
          const auto now = std::chrono::steady_clock::now();
          if (now < next_check) continue;
          next_check = now + std::chrono::milliseconds(100);
          const pid_t pid = header_->rank[r].pid.load(std::memory_order_relaxed);
          if (kill(pid, 0) != 0 && errno == ESRCH) {
            return absl::UnavailableError(
                StrCat("shared-memory collective: rank ", r, " (pid ", pid, ") is gone"));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  Communicator& group_;
  void* base_;
  size_t bytes_;
  Header* header_;
  int rank_, size_;
  uint64_t gen_ = 0;
};

// 1.0 on every rank if any rank passes true.
absl::StatusOr<bool> AnyRank(Communicator& group, bool mine) {
  float v = mine ? 1.0f : 0.0f;
  if (auto s = group.AllReduceSum(std::span<float>(&v, 1)); !s.ok()) return s;
  return v > 0.0f;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateShmCommunicator(Communicator& group) {
  const int size = group.size();
  if (size > kMaxRanks) {
    return absl::FailedPreconditionError(
        StrCat("shared-memory collectives: ", size, " ranks, at most ", kMaxRanks));
  }
  // Same machine: every rank compares rank 0's host name with its own.
  char host[256] = {}, root_host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::memcpy(root_host, host, sizeof(host));
  if (auto s = group.Broadcast({reinterpret_cast<uint8_t*>(root_host), sizeof(root_host)}, 0);
      !s.ok()) {
    return s;
  }
  auto elsewhere = AnyRank(group, std::strncmp(host, root_host, sizeof(host)) != 0);
  if (!elsewhere.ok()) return elsewhere.status();
  if (*elsewhere) {
    return absl::FailedPreconditionError("shared-memory collectives: ranks on several hosts");
  }
  // Rank 0 creates the segment and broadcasts its name ("" if it could not).
  static std::atomic<int> counter{0};
  char name[64] = {};
  const size_t bytes = SegmentBytes(size);
  std::string why;
  if (group.rank() == 0) {
    std::snprintf(name, sizeof(name), "/kvmesh-tp-%d-%d", static_cast<int>(getpid()),
                  counter.fetch_add(1));
    // posix_fallocate, not just ftruncate: tmpfs reserves nothing on truncate, and a full
    // /dev/shm (containers default to 64 MiB) would be a SIGBUS at the first write instead of
    // a fallback to MPI.
    const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    int rc = fd < 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (rc != 0) {
      why = StrCat("shm_open/posix_fallocate ", name, ": ", std::strerror(rc));
      if (fd >= 0) {
        close(fd);
        shm_unlink(name);
      }
      name[0] = '\0';
    } else {
      close(fd);
    }
  }
  // The name goes once every rank has mapped the segment (or given up), and on every early
  // return: a failed broadcast or barrier left /dev/shm/kvmesh-tp-* behind for good.
  absl::Cleanup unlink = [&] {
    if (group.rank() == 0 && name[0] != '\0') shm_unlink(name);
    name[0] = '\0';
  };
  if (auto s = group.Broadcast({reinterpret_cast<uint8_t*>(name), sizeof(name)}, 0); !s.ok()) {
    return s;
  }
  void* base = MAP_FAILED;
  if (name[0] != '\0') {
    const int fd = shm_open(name, O_RDWR, 0600);
    if (fd >= 0) {
      base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
    }
    if (base == MAP_FAILED) why = StrCat("mapping ", name, ": ", std::strerror(errno));
  }
  auto failed = AnyRank(group, base == MAP_FAILED);
  // Everyone has mapped it (or given up): the name can go, the mapping stays.
  if (auto s = group.Barrier(); !s.ok()) {
    if (base != MAP_FAILED) munmap(base, bytes);
    return s;
  }
  std::move(unlink).Invoke();
  if (!failed.ok() || *failed) {
    if (base != MAP_FAILED) munmap(base, bytes);
    if (!failed.ok()) return failed.status();
    return absl::FailedPreconditionError(
        StrCat("shared-memory collectives unavailable", why.empty() ? "" : ": ", why));
  }
  auto* header = static_cast<Header*>(base);
  header->rank[group.rank()].seq.store(0, std::memory_order_relaxed);
  header->rank[group.rank()].pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  if (auto s = group.Barrier(); !s.ok()) {
    munmap(base, bytes);
    return s;
  }
  return std::unique_ptr<Communicator>(new ShmCommunicator(group, base, bytes));
}

}  // namespace kvmesh::comm
