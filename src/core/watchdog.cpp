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
  CollectiveSite site;         // comm 0: not a collective of a known communicator
  std::thread::id thread;      // nested waits of one thread share the innermost's site
  Clock::time_point probed{};  // the last liveness probe for this wait
};

double seconds_from_env(const char* name, const char* off) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  if (*end != '\0' || !(s >= 0) || s > 1e12) fail(name, "='", v, "': expected seconds >= 0 (0 ", off, ")");
  return s;
}
double timeout_from_env() { return seconds_from_env("MOE_COLLECTIVE_TIMEOUT_S", "turns the watchdog off"); }
double liveness_from_env() {
  return seconds_from_env("MOE_COLLECTIVE_LIVENESS_S", "turns the liveness probe off");
}

void exit_with(const std::string& msg) {
  std::fprintf(stderr, "moe: fatal on rank 0: %s\n", msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

struct Registry {
  std::atomic<double> timeout_s{kDefaultCollectiveTimeoutS};
  std::atomic<double> liveness_s{kDefaultCollectiveLivenessS};
  std::atomic<WatchdogAbort> abort{&exit_with};
  std::atomic<LivenessProbe> probe{nullptr};
  std::mutex mu;
  std::map<unsigned long long, Wait> waits;  // GUARDED_BY(mu)
  unsigned long long next_id = 1;            // GUARDED_BY(mu)
  Clock::time_point last_end = Clock::now();  // GUARDED_BY(mu): when the last wait ended
  std::once_flag thread_started;
};

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    const double env = timeout_from_env();
    if (env >= 0) reg->timeout_s = env;
    const double live = liveness_from_env();
    if (live >= 0) reg->liveness_s = live;
    return reg;
  }();
  return *r;
}

std::string seconds_text(double s, const char* fmt = "%.1f") {
  char t[32];
  std::snprintf(t, sizeof t, fmt, s);
  return t;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string ranks_word(const std::vector<int>& ranks) {
  return std::string(ranks.size() > 1 ? "ranks " : "rank ") + ranks_text(ranks);
}

// The host of every world rank (set_rank_hosts), named only when they differ.
struct Hosts {
  std::mutex mu;
  std::vector<std::string> of_rank;  // GUARDED_BY(mu); empty: not named
};
Hosts& hosts() {
  static Hosts* h = new Hosts;
  return *h;
}

// `ranks` grouped by host in order of first appearance: (host, its ranks among them).
std::vector<std::pair<std::string, std::vector<int>>> by_host(const std::vector<std::string>& of_rank,
                                                              const std::vector<int>& ranks) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r : ranks) {
    const std::string h = r >= 0 && size_t(r) < of_rank.size() ? of_rank[size_t(r)] : "?";
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == h; });
    if (it == groups.end())
      groups.push_back({h, {r}});
    else
      it->second.push_back(r);
  }
  return groups;
}

// The silent ranks: "; rank 3 did not answer ..." (one host), or with hosts:
// "; ranks 2, 3 on host b did not answer ... (stopped, dead, or cut off); host b holds ranks 2, 3".
std::string silent_text(const std::vector<int>& silent, double bound) {
  const std::string within = " did not answer a liveness probe within " + seconds_text(bound, "%g") + " s";
  std::vector<std::string> of_rank;
  {
    std::lock_guard<std::mutex> lk(hosts().mu);
    of_rank = hosts().of_rank;
  }
  if (of_rank.empty()) return "; " + ranks_word(silent) + within + " (stopped, or dead)";
  const auto groups = by_host(of_rank, silent);
  std::string m = "; ";
  for (size_t i = 0; i < groups.size(); ++i)
    m += (i ? " and " : "") + ranks_word(groups[i].second) + " on host " + groups[i].first;
  m += within + " (stopped, dead, or cut off)";
  for (const auto& g : groups) {
    std::vector<int> held;
    for (size_t r = 0; r < of_rank.size(); ++r)
      if (of_rank[r] == g.first) held.push_back(int(r));
    m += "; host " + g.first + " holds " + ranks_word(held);
  }
  return m;
}

// What the peers said, for a message: "; ranks 3 did not answer ...; rank 2 had not
// issued it: <what it was doing>".
std::string peers_text(const LivenessReport& rep, double bound) {
  std::string m;
  if (!rep.silent.empty()) m += silent_text(rep.silent, bound);
  for (const std::string& a : rep.absent) m += "; " + a;
  return m;
}

std::string op_text(const Wait& w) {
  std::string m = std::string(w.op);
  if (!w.detail.empty()) m += " (" + w.detail + ")";
  return m;
}

// `rep`: the probe made at expiry (rep.probed false: none could be made).
std::string expiry_message(const Wait& w, double timeout, const LivenessReport& rep, double bound) {
  std::string m =
      op_text(w) + " did not complete within " + seconds_text(timeout, "%g") + " s (collective_timeout_s)";
  if (!w.collective)
    m += "; the side-engine task it waits for is stuck (its own collective, if any, is reported by the rank "
         "that waits in it)";
  else if (!rep.probed)
    m += "; the ranks that did not arrive are not known here (no liveness probe: a single process, or MPI "
         "without MPI_THREAD_MULTIPLE): a rank that was stopped, is stuck or died prints no such line";
  else if (rep.silent.empty() && rep.absent.empty())
    m += "; every other rank of its communicator (" + std::to_string(rep.answered) +
         ") answered and had issued it (a transfer that does not progress)";
  else
    m += peers_text(rep, bound);
  return m + "; ending every rank";
}

// A wait whose peers did not all answer the liveness probe.
std::string silence_message(const Wait& w, double age, const LivenessReport& rep, double bound) {
  return op_text(w) + " has waited " + seconds_text(age) + " s (collective_liveness_s " +
         seconds_text(registry().liveness_s.load(), "%g") + ")" + peers_text(rep, bound) +
         "; ending every rank";
}

// The site of `w`: its own, or that of the innermost wait of its thread
// (all_reduce_sum names the op, the transport's all_gather inside it the site).
CollectiveSite site_of(const Registry& r, const Wait& w) {  // REQUIRES: r.mu held
  if (w.site.comm != 0) return w.site;
  CollectiveSite s;
  for (const auto& [id, v] : r.waits)
    if (v.thread == w.thread && v.site.comm != 0) s = v.site;  // later ids are inner
  return s;
}

// The expired wait to report (collectives before side-engine waits), if any.
bool find_expired(Registry& r, double timeout, Wait& out) {
  const auto now = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout);
  std::lock_guard<std::mutex> lk(r.mu);
  bool found = false;
  for (const auto& [id, w] : r.waits) {
    if (now - w.since <= limit) continue;
    if (!found || (w.collective && !out.collective)) {
      out = w;
      out.site = site_of(r, w);
    }
    found = true;
  }
  return found;
}

// A collective wait due for a liveness probe (older than `liveness`, not probed
// within the last `liveness`), marked as probed now. `out` names the outermost
// wait of its thread (all_reduce_sum rather than its transport's all_gather).
bool find_due(Registry& r, double liveness, unsigned long long& id, Wait& out) {
  const auto now = Clock::now();
  const auto interval = std::chrono::duration<double>(liveness);
  std::lock_guard<std::mutex> lk(r.mu);
  for (auto& [i, w] : r.waits) {
    if (w.site.comm == 0 || now - w.since < interval || now - w.probed < interval) continue;
    w.probed = now;
    id = i;
    for (const auto& [j, v] : r.waits)  // ids ascend: the first of this thread is the outermost
      if (v.thread == w.thread) {
        out = v;
        break;
      }
    out.site = w.site;
    return true;
  }
  return false;
}

bool still_waiting(Registry& r, unsigned long long id) {
  std::lock_guard<std::mutex> lk(r.mu);
  return r.waits.count(id) > 0;
}

// Restarts every wait's clock: this process was not running (SIGSTOP, a
// suspended job), so its waits say nothing about its peers. A rank stopped
// inside a collective and then resumed by mpirun's kill sequence (SIGCONT)
// must not blame the others.
void restart_clocks(Registry& r) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(r.mu);
  for (auto& [id, w] : r.waits) w.since = w.probed = now;
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
    if (timeout <= 0) continue;
    const LivenessProbe probe = r.probe.load();
    const double bound = liveness_answer_bound();
    Wait w;
    if (find_expired(r, timeout, w)) {
      LivenessReport rep;
      if (probe && w.collective && w.site.comm != 0) rep = probe(w.site, bound);
      r.abort.load()(expiry_message(w, timeout, rep, bound));
    }
    const double liveness = r.liveness_s.load();
    unsigned long long id = 0;
    if (!probe || liveness <= 0 || liveness >= timeout || !find_due(r, liveness, id, w)) continue;
    const LivenessReport rep = probe(w.site, bound);
    // A wait that completed meanwhile had every rank: a late answer is no death.
    if (!rep.silent.empty() && still_waiting(r, id)) {
      const double age = std::chrono::duration<double>(Clock::now() - w.since).count();
      r.abort.load()(silence_message(w, age, rep, bound));
    }
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

void set_collective_liveness(double seconds) {
  if (!(seconds >= 0)) fail("collective_liveness_s must be >= 0, got ", seconds);
  registry().liveness_s = seconds;
}

double collective_liveness() { return registry().liveness_s.load(); }

void apply_collective_liveness(double seconds) {
  if (std::getenv("MOE_COLLECTIVE_LIVENESS_S") == nullptr) set_collective_liveness(seconds);
}

double liveness_answer_bound() { return std::clamp(registry().liveness_s.load() / 2, 2.0, 5.0); }

void set_liveness_probe(LivenessProbe fn) { registry().probe = fn; }

void set_rank_hosts(std::vector<std::string> of_rank) {
  const bool one_host =
      std::all_of(of_rank.begin(), of_rank.end(), [&](const std::string& h) { return h == of_rank.front(); });
  std::lock_guard<std::mutex> lk(hosts().mu);
  hosts().of_rank = one_host ? std::vector<std::string>{} : std::move(of_rank);
}

std::string rank_text(int world_rank) {
  std::lock_guard<std::mutex> lk(hosts().mu);
  const std::vector<std::string>& h = hosts().of_rank;
  std::string m = "rank " + std::to_string(world_rank);
  if (world_rank >= 0 && size_t(world_rank) < h.size()) m += " on host " + h[size_t(world_rank)];
  return m;
}

std::string watchdog_state_text() {
  Registry& r = registry();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(r.mu);
  const Wait* oldest = nullptr;
  for (const auto& [id, w] : r.waits)
    if (!oldest || (w.collective && !oldest->collective)) oldest = &w;  // ids ascend: the first is the oldest
  if (!oldest)
    return "in no collective or side-engine wait for " +
           seconds_text(std::chrono::duration<double>(now - r.last_end).count()) +
           " s (computing, writing, or stuck outside MPI)";
  return "waiting in " + op_text(*oldest) + " for " +
         seconds_text(std::chrono::duration<double>(now - oldest->since).count()) + " s";
}

WatchContext::WatchContext(std::string label) : saved_(std::exchange(t_context, std::move(label))) {}

WatchContext::~WatchContext() { t_context = std::move(saved_); }

WatchedWait::WatchedWait(const char* op, std::string detail, bool collective)
    : WatchedWait(op, std::move(detail), collective, CollectiveSite{}) {}

WatchedWait::WatchedWait(const char* op, std::string detail, CollectiveSite site)
    : WatchedWait(op, std::move(detail), true, site) {}

WatchedWait::WatchedWait(const char* op, std::string detail, bool collective, CollectiveSite site) {
  Registry& r = registry();
  if (r.timeout_s.load() <= 0) return;
  if (!t_context.empty()) detail += (detail.empty() ? "in " : "; in ") + t_context;
  std::call_once(r.thread_started, [] { std::thread(watch).detach(); });
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(r.mu);
  id_ = r.next_id++;
  r.waits.emplace(id_, Wait{op, std::move(detail), collective, now, site, std::this_thread::get_id(), now});
}

WatchedWait::~WatchedWait() {
  if (id_ == 0) return;
  Registry& r = registry();
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lk(r.mu);
  r.waits.erase(id_);
  r.last_end = now;
}

}  // namespace moe
