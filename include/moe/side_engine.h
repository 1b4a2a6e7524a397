// The side engine (SPEC.md §1, §6): dedicated worker threads that run
// offloaded work (collectives progressed on their own communicator, routing
// index math) concurrently with the compute pool. It is the CPU counterpart of
// the TPU SparseCore; what may be offloaded is decided by the offload model
// (include/moe/offload.h), not here.
//
// Thread safety: submit() and sync() may be called from any thread,
// concurrently. Tasks START in submission order (one FIFO queue per engine;
// the order of two submits racing from different threads is the order in
// which they take the engine's lock); with one thread they also finish in that
// order, with more they may overlap and finish in any order. A task may
// submit() further tasks, but must not sync() its own engine (asserted) nor
// wait() on an event of its own engine that cannot start before it finishes
// (with one thread, any later task): that is a deadlock.
// Event is a cheap shared handle: wait()/ready() may be called from any
// thread, any number of times, also after the engine is destroyed.
//
// Errors: a task's exception is stored in its Event and rethrown by every
// wait() on it, on the waiting thread. The engine also keeps the first error
// of a task whose event nobody waited for, and rethrows it (once) at the next
// submit() or sync(), so a failure is never lost. Later tasks still run.
//
// Shutdown: the destructor DRAINS: every task submitted before it ran is
// executed, then the threads join. (Cancelling would be unsafe for
// collectives: the peer ranks run their copy of the task and would hang.)
// Errors not yet reported at that point are dropped (destructors don't throw).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moe {

// Completion of one submitted task (DeepEP style: the one type for "wait for
// the communication to finish"). A default-constructed Event is ready.
class Event {
 public:
  Event() = default;
  // Blocks until the task finished; rethrows its exception, if any.
  void wait() const;
  // True once the task finished (successfully or not). Never blocks.
  bool ready() const;
  // Name given at submit ("" for a default-constructed Event).
  const std::string& name() const;

 private:
  friend class SideEngine;
  struct State;
  explicit Event(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

class SideEngine {
 public:
  // n_threads >= 0 worker threads (config key side_engine_threads). An
  // engine of 0 threads exists but rejects submit().
  // realtime: ask for SCHED_FIFO (priority 1) for the workers, so a worker
  // that becomes runnable (a poll, the next queued collective) preempts the
  // compute pool at once instead of waiting up to a scheduler tick behind it
  // on a machine with no spare core. Needs CAP_SYS_NICE; when refused the
  // workers keep the normal policy (see realtime()). Only for tasks that
  // sleep while they wait (polite waits, comm.h): a spinning real-time task
  // takes a core from everything else (the kernel's RT throttling leaves 5%).
  explicit SideEngine(int n_threads, bool realtime = false);
  ~SideEngine();
  SideEngine(const SideEngine&) = delete;
  SideEngine& operator=(const SideEngine&) = delete;

  int threads() const { return int(workers_.size()); }
  // True when every worker runs SCHED_FIFO (asked for and granted).
  bool realtime() const { return realtime_; }

  // Queues `task`; `name` appears in errors and traces.
  // Throws moe::Error if the engine has no threads, or rethrows a pending
  // unreported error of an earlier task (then `task` is NOT queued).
  Event submit(std::string name, std::function<void()> task);

  // Waits until every task submitted so far finished, then rethrows the first
  // unreported error, if any. REQUIRES: not called from this engine's threads.
  void sync();

 private:
  struct Job {
    std::function<void()> fn;
    std::shared_ptr<Event::State> state;
  };
  void worker_loop();
  void finish(const std::shared_ptr<Event::State>& state, std::exception_ptr err);
  std::exception_ptr take_error_locked();

  std::vector<std::thread> workers_;
  bool realtime_ = false;
  std::mutex mu_;
  std::condition_variable cv_work_;                    // queue non-empty or stopping
  std::condition_variable cv_idle_;                    // pending_ reached 0
  std::deque<Job> queue_;                              // GUARDED_BY(mu_)
  int64_t pending_ = 0;                                // GUARDED_BY(mu_): queued + running
  bool stop_ = false;                                  // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<Event::State>> failed_;  // GUARDED_BY(mu_): failed, in finish order
};

// MOE_SIDE_ENGINE_RT=1 in the environment: the run asks for real-time (SCHED_FIFO) side-engine
// workers (DistRuntime; moe plan --calibrate's probes use the same policy as the run they model).
bool side_engine_realtime_requested();

}  // namespace moe
