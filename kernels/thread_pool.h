// A persistent pool of worker threads for data-parallel loops.
//
// One pool per process (the engine owns it); threads are created once and park on a futex
// (std::atomic::wait) between jobs after a short spin, so per-op dispatch costs microseconds,
// not a thread creation. ParallelFor is not reentrant and must be called from one thread at a
// time (the owner); the calling thread takes part in the work.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace kvmesh::kernels {

class ThreadPool {
 public:
  // n_threads >= 1 counts the calling thread; n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index, n_threads) on every thread of the pool, including the caller, and
  // blocks until all return. thread_index is in [0, n_threads).
  void Run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks, one per thread (multiples of `grain` where possible),
  // and calls fn(begin, end) for each non-empty chunk. Blocks until done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The number of CPUs this process may run on (sched_getaffinity), at least 1.
  static int AvailableCpus();

 private:
  void WorkerLoop(int index);

  const int n_threads_;
  // Spin-waits before sleeping / yielding: none with more threads than CPUs, where a spinning
  // thread takes the core another needs (--threads 16 on 2 CPUs ran 30x slower).
  const int spin_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;  // written before generation_ bumps
  std::atomic<uint64_t> generation_{0};                 // bumped once per job; workers wait on it
  std::atomic<int> pending_{0};                         // workers still running the current job
  std::atomic<bool> stop_{false};
};

}  // namespace kvmesh::kernels
