// The collective watchdog (docs/reliability.md): a rank that is killed,
// stopped (SIGSTOP) or stuck must not leave its peers waiting forever. Every
// MPI collective and every completion wait (a CommRequest's wait(), a
// side-engine Event's wait() and sync()) is a WatchedWait; a process-wide
// thread watches them.
//
// Two bounds:
// - The liveness probe (collective_liveness_s, default 10 s, 0 = off): a
//   collective wait this old makes the watchdog ask every other rank of its
//   communicator, through the installed LivenessProbe (the MPI runtime's: a
//   dedicated communicator answered by a thread of each process, so a rank
//   busy in compute or blocked in a collective still answers), whether it is
//   alive and has issued this collective. A rank that does not answer within
//   the answer bound (liveness_answer_bound()) is stopped or dead: the job ends
//   at once, naming it. Ranks that answer are alive (slow, writing a
//   checkpoint): the wait goes on, and they are asked again every interval.
// - The timeout (collective_timeout_s, default 300 s, 0 = off): a wait older
//   than this ends the job, naming the ranks of its communicator that had not
//   issued the collective and what they were doing:
//     moe: fatal on rank R: <op> (<detail>) did not complete within T s
//     (collective_timeout_s); ...
// The end is MPI_Abort (the action the MPI runtime installs; without MPI the
// process exits with status 1).
//
// Each bound: its environment variable (MOE_COLLECTIVE_TIMEOUT_S,
// MOE_COLLECTIVE_LIVENESS_S) when set (it wins), else the config key once a
// command applies it, else the default.
//
// Thread safety: everything here may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

inline constexpr double kDefaultCollectiveTimeoutS = 300.0;
inline constexpr double kDefaultCollectiveLivenessS = 10.0;

// Seconds a watched wait may last; 0 = off. REQUIRES: seconds >= 0.
void set_collective_timeout(double seconds);
double collective_timeout();
// set_collective_timeout(seconds) unless MOE_COLLECTIVE_TIMEOUT_S is set
// (commands call it with the config key's value).
void apply_collective_timeout(double seconds);

// Age of a collective wait at which its peers are probed (and the re-probe
// period); 0 = off. REQUIRES: seconds >= 0.
void set_collective_liveness(double seconds);
double collective_liveness();
// set_collective_liveness(seconds) unless MOE_COLLECTIVE_LIVENESS_S is set.
void apply_collective_liveness(double seconds);
// How long a probe waits for the answers: liveness / 2, within [2 s, 5 s].
double liveness_answer_bound();

// Where a collective stands: its communicator (an id every member computes
// alike; 0 = none) and its position in that communicator's sequence of
// collectives (1, 2, ...).
struct CollectiveSite {
  uint64_t comm = 0;
  int64_t seq = 0;
};

// The answers to one liveness probe of a wait's communicator.
struct LivenessReport {
  bool probed = false;              // false: no probe could be made (the message says nothing of peers)
  std::vector<int> silent;          // world ranks that did not answer within the bound
  std::vector<std::string> absent;  // "rank R: <what it is doing>" for ranks alive but not in the collective
  int answered = 0;                 // ranks that answered
};
// Probes the other ranks of site.comm, waiting at most answer_bound_s. Called
// only from the watchdog's thread, one probe at a time.
using LivenessProbe = LivenessReport (*)(const CollectiveSite& site, double answer_bound_s);
void set_liveness_probe(LivenessProbe fn);  // nullptr: none (the MPI runtime removes it before finalizing)

// The host of every world rank (index: world rank), from the MPI runtime at
// start-up. When the ranks span more than one host, the messages name the
// host of each silent or absent rank and every rank that host holds:
//   rank 2 on host node7 did not answer a liveness probe ...; host node7 holds ranks 2, 3
// Empty (the default), or one host for all: ranks only.
void set_rank_hosts(std::vector<std::string> hosts);
// "rank R on host H" when hosts are named (above), else "rank R".
std::string rank_text(int world_rank);

// What this process is doing, for a peer's probe: "waiting in <op> (<detail>)
// for 12.3 s", or "in no collective or side-engine wait for 12.3 s (computing,
// writing, or stuck outside MPI)".
std::string watchdog_state_text();

// The expiry action, given the whole "fatal on rank R: ..." line's message
// part; must not return. Installed by the MPI runtime (print + MPI_Abort).
using WatchdogAbort = void (*)(const std::string& msg);
void set_watchdog_abort(WatchdogAbort fn);

// Names what the calling thread is doing, for the message of any WatchedWait
// it enters meanwhile: "(<detail>; in A2A:dispatch[2])" (the distributed
// step's op and token chunk, set by its executor). Nested contexts: the
// innermost is named.
class WatchContext {
 public:
  explicit WatchContext(std::string label);
  ~WatchContext();
  WatchContext(const WatchContext&) = delete;
  WatchContext& operator=(const WatchContext&) = delete;

 private:
  std::string saved_;
};

// Marks the calling thread as waiting in `op` (a static string) from
// construction to destruction. `detail` (bytes, event name) goes into the
// message. collective: false for side-engine waits (a collective that expires
// at the same time is reported first: it names the transfer).
class WatchedWait {
 public:
  WatchedWait(const char* op, std::string detail, bool collective = true);
  // A collective at `site` (its peers can be probed).
  WatchedWait(const char* op, std::string detail, CollectiveSite site);
  ~WatchedWait();
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

 private:
  WatchedWait(const char* op, std::string detail, bool collective, CollectiveSite site);
  unsigned long long id_ = 0;  // 0: not registered (watchdog off)
};

}  // namespace moe
