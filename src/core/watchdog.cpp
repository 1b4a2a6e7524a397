// The collective watchdog (include/moe/watchdog.h): a registry of the waits
// in progress and one detached thread that scans it. The registry lives on
// the heap and is never freed, so the thread may outlive static destructors.
#include "moe/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "moe/error.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

thread_local std::string t_context;  // WatchContext's label on this thread

struct Wait {
  const char* op;
  std::string detail;
  bool collective;
  Clock::time_point since;
};

double timeout_from_env() {
  const char* v = std::getenv("MOE_COLLECTIVE_TIMEOUT_S");
  if (!v || !*v) return -1;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (*end != '\0' || !(s >= 0))
    fail("MOE_COLLECTIVE_TIMEOUT_S='", v, "': expected seconds >= 0 (0 turns the watchdog off)");
  return s;
}

void exit_with(const std::string& msg) {
  std::fprintf(stderr, "moe: fatal on rank 0: %s\n", msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

struct Registry {
  std::atomic<double> timeout_s{kDefaultCollectiveTimeoutS};
  std::atomic<WatchdogAbort> abort{&exit_with};
  std::mutex mu;
  std::map<unsigned long long, Wait> waits;  // GUARDED_BY(mu)
  unsigned long long next_id = 1;            // GUARDED_BY(mu)
  std::once_flag thread_started;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    const double env = timeout_from_env();
    if (env >= 0) reg->timeout_s = env;
    return reg;
  }();
  return *r;
}

std::string expiry_message(const Wait& w, double timeout) {
  char t[32];
  std::snprintf(t, sizeof t, "%g", timeout);
  std::string m = std::string(w.op);
  if (!w.detail.empty()) m += " (" + w.detail + ")";
  m += std::string(" did not complete within ") + t + " s (collective_timeout_s); ";
  m += w.collective ? "the ranks that did not arrive are not known here (MPI does not report them): a rank "
                      "that was stopped, is stuck or died prints no such line"
                    : "the side-engine task it waits for is stuck (its own collective, if any, is reported "
                      "by the rank that waits in it)";
  return m + "; ending every rank";
}

// The expired wait to report (collectives before side-engine waits), if any.
bool find_expired(Registry& r, double timeout, Wait& out) {
  const auto now = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout);
  std::lock_guard<std::mutex> lk(r.mu);
  bool found = false;
  for (const auto& [id, w] : r.waits) {
    if (now - w.since <= limit) continue;
    if (!found || (w.collective && !out.collective)) out = w;
    found = true;
  }
  return found;
}

// Restarts every wait's clock: this process was not running (SIGSTOP, a
// suspended job), so its waits say nothing about its peers. A rank stopped
// inside a collective and then resumed by mpirun's kill sequence (SIGCONT)
// must not blame the others.
void restart_clocks(Registry& r) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(r.mu);
  for (auto& [id, w] : r.waits) w.since = now;
}

// Scans every 1/10 of the timeout (at most 100 ms apart, at least 1 ms). A
// sleep that overran by more than 1 s means the process was stopped.
[[noreturn]] void watch() {
  Registry& r = registry();
  for (;;) {
    const double timeout = r.timeout_s.load();
    const double poll = timeout > 0 ? std::clamp(timeout / 10, 0.001, 0.1) : 0.1;
    const auto before = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(poll));
    if (Clock::now() - before > std::chrono::duration<double>(poll + 1.0)) {
      restart_clocks(r);
      continue;
    }
    Wait w;
    if (timeout > 0 && find_expired(r, timeout, w)) r.abort.load()(expiry_message(w, timeout));
  }
}

}  // namespace

void set_collective_timeout(double seconds) {
  if (!(seconds >= 0)) fail("collective_timeout_s must be >= 0, got ", seconds);
  registry().timeout_s = seconds;
}

double collective_timeout() { return registry().timeout_s.load(); }

void apply_collective_timeout(double seconds) {
  if (std::getenv("MOE_COLLECTIVE_TIMEOUT_S") == nullptr) set_collective_timeout(seconds);
}

void set_watchdog_abort(WatchdogAbort fn) { registry().abort = fn ? fn : &exit_with; }

WatchContext::WatchContext(std::string label) : saved_(std::exchange(t_context, std::move(label))) {}

WatchContext::~WatchContext() { t_context = std::move(saved_); }

WatchedWait::WatchedWait(const char* op, std::string detail, bool collective) {
  Registry& r = registry();
  if (r.timeout_s.load() <= 0) return;
  if (!t_context.empty()) detail += (detail.empty() ? "in " : "; in ") + t_context;
  std::call_once(r.thread_started, [] { std::thread(watch).detach(); });
  std::lock_guard<std::mutex> lk(r.mu);
  id_ = r.next_id++;
  r.waits.emplace(id_, Wait{op, std::move(detail), collective, Clock::now()});
}

WatchedWait::~WatchedWait() {
  if (id_ == 0) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.waits.erase(id_);
}

}  // namespace moe
