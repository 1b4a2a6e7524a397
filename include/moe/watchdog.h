// The collective watchdog (docs/reliability.md): a rank that is killed,
// stopped (SIGSTOP) or stuck must not leave its peers waiting forever. Every
// MPI collective and every completion wait (a CommRequest's wait(), a
// side-engine Event's wait() and sync()) is a WatchedWait; a process-wide
// thread ends the job when one has lasted longer than the timeout, with
//   moe: fatal on rank R: <op> (<detail>) did not complete within T s
//   (collective_timeout_s); ...
// and then MPI_Abort (the action the MPI runtime installs; without MPI the
// process exits with status 1).
//
// The timeout: MOE_COLLECTIVE_TIMEOUT_S when set (it wins), else the config
// key collective_timeout_s once a command applies it, else 300 s. 0 = off.
// Which peers did not arrive is not known: a blocking MPI collective does not
// report it (the message says so; the stopped or stuck rank is the one that
// prints no such line).
//
// Thread safety: everything here may be called from any thread.
#pragma once

#include <string>

namespace moe {

inline constexpr double kDefaultCollectiveTimeoutS = 300.0;

// Seconds a watched wait may last; 0 = off. REQUIRES: seconds >= 0.
void set_collective_timeout(double seconds);
double collective_timeout();
// set_collective_timeout(seconds) unless MOE_COLLECTIVE_TIMEOUT_S is set
// (commands call it with the config key's value).
void apply_collective_timeout(double seconds);

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
  ~WatchedWait();
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

 private:
  unsigned long long id_ = 0;  // 0: not registered (watchdog off)
};

}  // namespace moe
