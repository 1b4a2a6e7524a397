// The side engine: a FIFO task queue served by N worker threads (see the
// contract in include/moe/side_engine.h).
#include "moe/side_engine.h"

#include "moe/comm.h"

#include <cstdlib>
#include <pthread.h>
#include <sched.h>

#include "moe/error.h"
#include "moe/watchdog.h"

namespace moe {
namespace {
// The engine whose worker is running on this thread (nullptr elsewhere).
thread_local const SideEngine* t_worker_of = nullptr;
}  // namespace

struct Event::State {
  std::string name;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;         // GUARDED_BY(mu)
  bool reported = false;     // GUARDED_BY(mu): error rethrown by a wait(), submit() or sync()
  std::exception_ptr error;  // written once before done = true
};

void Event::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lk(state_->mu);
  if (!state_->done) {  // bounded by the collective watchdog (include/moe/watchdog.h)
    WatchedWait w("side-engine event wait", "event '" + state_->name + "'", /*collective=*/false);
    const BlockedWaiter blocked;  // the worker's polite waits poll without sleeping meanwhile
    state_->cv.wait(lk, [&] { return state_->done; });
  }
  if (!state_->error) return;
  state_->reported = true;
  std::rethrow_exception(state_->error);
}

bool Event::ready() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->done;
}

const std::string& Event::name() const {
  static const std::string none;
  return state_ ? state_->name : none;
}

SideEngine::SideEngine(int n_threads, bool realtime) {
  MOE_ASSERT(n_threads >= 0, "side engine thread count must be >= 0");
  for (int i = 0; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  if (!realtime || workers_.empty()) return;
  realtime_ = true;
  sched_param sp{};
  sp.sched_priority = 1;  // the lowest real-time priority: above every normal thread, below the kernel's
  for (std::thread& t : workers_)
    realtime_ = pthread_setschedparam(t.native_handle(), SCHED_FIFO, &sp) == 0 && realtime_;
}

SideEngine::~SideEngine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;  // workers exit only once the queue is empty: a drain
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

// The first failed task whose error nobody has seen yet (marked reported), or
// null. The list is cleared: only the first error is rethrown.
std::exception_ptr SideEngine::take_error_locked() {
  std::exception_ptr first;
  for (const auto& s : failed_) {
    std::lock_guard<std::mutex> lk(s->mu);
    if (!s->reported) {
      s->reported = true;
      first = s->error;
      break;
    }
  }
  failed_.clear();
  return first;
}

Event SideEngine::submit(std::string name, std::function<void()> task) {
  if (workers_.empty())
    fail("[side_engine] cannot run '", name,
         "': this side engine has no threads (side_engine_threads is 0); set side_engine_threads >= 1 "
         "or moe_offload_targets=\"\"");
  auto state = std::make_shared<Event::State>();
  state->name = std::move(name);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (std::exception_ptr err = take_error_locked()) std::rethrow_exception(err);
    queue_.push_back(Job{std::move(task), state});
    ++pending_;
  }
  cv_work_.notify_one();
  return Event(std::move(state));
}

void SideEngine::sync() {
  MOE_ASSERT(t_worker_of != this, "SideEngine::sync() called from one of its own tasks (deadlock)");
  std::unique_lock<std::mutex> lk(mu_);
  if (pending_ != 0) {
    WatchedWait w("side-engine sync", std::to_string(pending_) + " task(s) pending", /*collective=*/false);
    cv_idle_.wait(lk, [&] { return pending_ == 0; });
  }
  if (std::exception_ptr err = take_error_locked()) std::rethrow_exception(err);
}

void SideEngine::finish(const std::shared_ptr<Event::State>& state, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lk(state->mu);
    state->error = err;
    state->done = true;
  }
  state->cv.notify_all();
  std::lock_guard<std::mutex> lk(mu_);
  if (err) failed_.push_back(state);
  if (--pending_ == 0) cv_idle_.notify_all();
}

void SideEngine::worker_loop() {
  t_worker_of = this;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      job.fn();
    } catch (...) {
      err = std::current_exception();
    }
    job.fn = nullptr;  // release captures before the event completes
    finish(job.state, err);
  }
}

bool side_engine_realtime_requested() {
  const char* rt = std::getenv("MOE_SIDE_ENGINE_RT");
  return rt && std::string(rt) == "1";
}

}  // namespace moe
