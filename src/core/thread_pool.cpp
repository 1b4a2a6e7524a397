#include "moe/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "moe/error.h"

namespace moe {
namespace {
thread_local bool t_in_pool_worker = false;

// How long a thread polls before it blocks on a condition variable. Loops
// of a layer step follow each other within microseconds; a blocked thread
// costs a futex wake-up, and on a VM an idle vCPU may be descheduled, which
// made small loops 3 to 6 times slower (docs/architecture.md, the pool).
constexpr auto kSpin = std::chrono::microseconds(50);

// Polls done() for up to kSpin; true if it became true.
template <class Done>
bool spin_until(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    if (i % 64 == 63) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::yield();  // an oversubscribed machine runs someone else meanwhile
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) { start_workers(n_threads); }

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::start_workers(int n_threads) {
  // A new worker waits for the next generation, not one already run.
  const uint64_t now = generation_.load(std::memory_order_acquire);
  for (int i = 1; i < std::max(1, n_threads); ++i) workers_.emplace_back([this, now] { worker_loop(now); });
}

void ThreadPool::resize(int n_threads) {
  MOE_ASSERT(!t_in_pool_worker, "ThreadPool::resize called from inside a loop");
  std::lock_guard<std::mutex> call(call_mu_);  // no loop in flight from here on
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
  }
  start_workers(n_threads);
}

ThreadPool& ThreadPool::compute() {
  static ThreadPool pool([] {
    if (const char* s = std::getenv("MOE_NUM_THREADS")) {
      int n = std::atoi(s);
      if (n > 0) return n;
    }
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

// Chunks that shrink as the loop goes (guided scheduling): the first ones are large (few grabs of
// the shared counter, long runs of consecutive items such as a GEMM's tasks sharing packed
// weights), and whichever thread takes the last chunk holds the others up for a small one. Equal
// chunks of n / (16 * threads) before (2026-12-04): a GEMM of 1,280 tasks of about 0.25 ms had
// chunks of 10 ms, and the thread that took the last one ran on while the other waited. In one
// process against those (docs/architecture.md, the pool): the grouped GEMMs' ops 0.98-1.04x the
// speed, median 1.011, 27 of 30 op timings faster, at avx2 and avx512_bf16.
void ThreadPool::chunk_bounds(int64_t n, int64_t grain, int threads, std::vector<int64_t>& bounds) {
  bounds.clear();
  bounds.push_back(0);
  const int64_t div = 2 * int64_t(std::max(1, threads));
  grain = std::max<int64_t>(1, grain);
  for (int64_t b = 0; b < n;) bounds.push_back(b = std::min(n, b + std::max(grain, (n - b + div - 1) / div)));
}

void ThreadPool::run_chunks() {
  for (;;) {
    int64_t c = next_chunk_.fetch_add(1);
    if (c >= n_chunks_) return;
    const int64_t b = bounds_[size_t(c)], e = bounds_[size_t(c + 1)];
    try {
      (*fn_)(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(uint64_t seen) {
  t_in_pool_worker = true;
  for (;;) {
    spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });  // stop_ is seen below
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
    }
    run_chunks();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) cv_done_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (workers_.empty() || t_in_pool_worker || n <= grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    chunk_bounds(n, grain, size(), bounds_);
    n_chunks_ = int64_t(bounds_.size()) - 1;
    next_chunk_.store(0);
    error_ = nullptr;
    busy_.store(int(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_work_.notify_all();
  bool was = t_in_pool_worker;
  t_in_pool_worker = true;  // nested loops from fn on the caller run serially too
  run_chunks();
  t_in_pool_worker = was;
  std::exception_ptr err;
  {
    spin_until([&] { return busy_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, [&] { return busy_.load(std::memory_order_relaxed) == 0; });
    fn_ = nullptr;
    err = error_;
  }
  if (err) std::rethrow_exception(err);
}

}  // namespace moe
