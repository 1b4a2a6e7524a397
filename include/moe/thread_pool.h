// The compute pool: a fixed set of worker threads that run data-parallel
// loops (expert GEMM tiles, permute/combine rows, router rows).
//
// Thread safety: parallel_for may be called from any thread (the caller joins
// the work and returns when every chunk is done); calls from several threads
// at once (e.g. the compute thread and a side-engine task) are serialized by
// a lock, one loop at a time per pool. A
// parallel_for issued from inside a pool worker runs serially on that worker,
// so nested loops never deadlock. The first exception thrown by a chunk is
// rethrown on the caller after all chunks finished.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moe {

class ThreadPool {
 public:
  // n_threads counts the caller: a pool of n uses n-1 workers plus the caller.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Changes the pool to n_threads (>= 1; counting the caller). Waits for a loop in flight to end
  // first. REQUIRES: not called from inside a loop of this pool.
  void resize(int n_threads);

  // Runs fn(begin, end) over [0, n) split into chunks of at least `grain`
  // items (chunk_bounds: each takes 1/(2 * threads) of what is left, so the
  // first are large and the last small, and the threads end together).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The chunks of parallel_for(n, grain) on `threads` threads: their bounds
  // 0 = b_0 < b_1 < ... < b_m = n. Each chunk is max(grain, ceil(left / (2 *
  // threads))) items, left = n - b_i (the last may be shorter than grain). A
  // function of (n, grain, threads) only, never of timing.
  static void chunk_bounds(int64_t n, int64_t grain, int threads, std::vector<int64_t>& bounds);

  // The process-wide compute pool. Its size is MOE_NUM_THREADS if set, else
  // the hardware concurrency.
  static ThreadPool& compute();

 private:
  void worker_loop(uint64_t seen);
  void start_workers(int n_threads);  // REQUIRES: no workers
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  bool stop_ = false;                 // GUARDED_BY(mu_)
  // Written under mu_; also read without it by the short spins before a
  // thread blocks (a worker waiting for the next loop, the caller for the
  // workers), so back-to-back loops skip the sleep/wake round trip.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};
  // Current job (valid while busy_ > 0 or the caller runs it).
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_chunks_ = 0;             // bounds_.size() - 1 of the current loop
  std::vector<int64_t> bounds_;       // chunk c is [bounds_[c], bounds_[c + 1])
  std::atomic<int64_t> next_chunk_{0};
  std::exception_ptr error_;          // GUARDED_BY(mu_)
  std::mutex call_mu_;                // serializes parallel_for callers
};

// Shorthand for ThreadPool::compute().parallel_for.
inline void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  ThreadPool::compute().parallel_for(n, grain, fn);
}

}  // namespace moe
