// MpiComm: Communicator over an MPI communicator. Collectives map 1:1 onto
// MPI_Allgather / MPI_Alltoallv (and their I-variants); element sizes become
// contiguous MPI datatypes so counts are in elements. Counts and offsets must
// fit in int (MPI-3): a larger message is an error naming the op.
// Every collective and every completion wait is a WatchedWait (the collective
// watchdog, include/moe/watchdog.h): blocking calls stay blocking, the
// watchdog's thread ends the job from outside when one lasts too long.
//
// The liveness probe (docs/reliability.md): every communicator has an id that
// its members compute alike (the world's from the runtime, a split's from its
// parent's id, split count and color) and counts the collectives it issued;
// each collective's wait carries (id, sequence number). With
// MPI_THREAD_MULTIPLE the runtime duplicates MPI_COMM_WORLD once more for
// probes and runs a responder thread: it answers a peer's probe with how many
// collectives this process issued on that communicator and what it is doing
// (watchdog_state_text), without the main thread. The watchdog's thread
// probes (probe_peers): a request to every other member, answers awaited for
// a bounded time.
#include "comm/mpi_comm.h"

#include <mpi.h>
#include <sched.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moe/error.h"
#include "moe/isa.h"
#include "moe/watchdog.h"

namespace moe {
namespace {

int g_world_rank = -1;  // set once MPI is initialized, read by the watchdog's thread

// Seconds MPI_Abort gets to end this process before it exits by itself
// (MOE_ABORT_GRACE_S, default 20; 0: never). The launcher's abort path needs
// every host's daemon: with a host cut off it can hang (docs/reliability.md,
// "Across hosts"), and a rank must not outlive its job.
double abort_grace_s() {
  const char* v = std::getenv("MOE_ABORT_GRACE_S");
  if (!v || !*v) return 20;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  return *end == '\0' && s >= 0 && s < 1e9 ? s : 20;
}

// Every rank goes: MPI_Abort, after a pause that lets the launcher forward
// the fatal line just written (its abort path can overtake the output and
// lose it), and with a timer that ends this process with status 1 if
// MPI_Abort has not within abort_grace_s().
[[noreturn]] void abort_world() {
  const double grace = abort_grace_s();
  if (grace > 0) {
    try {
      std::thread([grace] {
        std::this_thread::sleep_for(std::chrono::duration<double>(grace));
        std::fprintf(stderr,
                     "moe: rank %d: MPI_Abort did not end this process within %g s (MOE_ABORT_GRACE_S: the "
                     "launcher's abort did not arrive); exiting with status 1\n",
                     g_world_rank, grace);
        std::fflush(stderr);
        std::_Exit(1);
      }).detach();
    } catch (...) {  // no thread: MPI_Abort alone
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void on_mpi_error(MPI_Comm* comm, int* code, ...) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(*code, text, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "moe: MPI error on rank %d: %s; aborting every rank\n", rank, text);
  std::fflush(stderr);
  abort_world();
}

void print_fatal(const std::string& msg) {
  std::fprintf(stderr, "moe: fatal on rank %d: %s\n", g_world_rank, msg.c_str());
  std::fflush(stderr);
}

// The watchdog's expiry action: the message, then every rank goes.
void abort_on_expiry(const std::string& msg) {
  print_fatal(msg);
  abort_world();
}

// During MPI_Finalize (MPI_Abort may no longer work): the message, then this
// process exits non-zero, and mpirun ends the others.
void exit_on_expiry(const std::string& msg) {
  print_fatal(msg);
  std::_Exit(1);
}

std::string bytes_text(int64_t bytes, const char* what = "") { return std::to_string(bytes) + " B" + what; }

// One communicator as the liveness probe sees it: its id, its members' world
// ranks and the collectives this process issued on it.
struct CommTrack {
  uint64_t id = 0;
  std::vector<int> world_ranks;
  std::atomic<int64_t> issued{0};
  std::atomic<int64_t> splits{0};  // splits made from it (part of a child's id)
};

// Every communicator's track, by id; never freed (the responder may read it
// while a communicator goes away; a freed one keeps its final count).
struct Tracks {
  std::mutex mu;
  std::map<uint64_t, std::shared_ptr<CommTrack>> by_id;  // GUARDED_BY(mu)
};
Tracks& tracks() {
  static Tracks* t = new Tracks;
  return *t;
}

uint64_t mix(uint64_t a, uint64_t b) {  // splitmix64 of a combination
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z ? z : 1;
}

std::shared_ptr<CommTrack> make_track(MPI_Comm comm, uint64_t id) {
  auto t = std::make_shared<CommTrack>();
  t->id = id;
  int n = 0;
  MPI_Comm_size(comm, &n);
  std::vector<int> local(size_t(n), 0);
  for (int i = 0; i < n; ++i) local[size_t(i)] = i;
  t->world_ranks.assign(size_t(n), -1);
  MPI_Group g, w;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  MPI_Group_translate_ranks(g, n, local.data(), w, t->world_ranks.data());
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  std::lock_guard<std::mutex> lk(tracks().mu);
  tracks().by_id[id] = t;
  return t;
}

std::shared_ptr<CommTrack> find_track(uint64_t id) {
  std::lock_guard<std::mutex> lk(tracks().mu);
  auto it = tracks().by_id.find(id);
  return it == tracks().by_id.end() ? nullptr : it->second;
}

// The probe's wire format (MPI_BYTE on the probe communicator).
constexpr int kProbeTag = 0x6d6f;       // request
constexpr int kAnswerTag = 0x6d6f + 1;  // answer
struct ProbeRequest {
  uint64_t comm;
  int64_t seq;
  int64_t round;
};
struct ProbeAnswer {
  int64_t round;
  int64_t issued;  // collectives this rank issued on the communicator; -1: it knows no such communicator
  char what[232];  // watchdog_state_text(), truncated
};

MPI_Comm g_probe_comm = MPI_COMM_NULL;  // set before the probe is installed, freed after it is removed
std::mutex g_probe_mu;                  // held by a probe in progress and by the runtime removing it

// The watchdog thread's probe (LivenessProbe).
LivenessReport probe_peers(const CollectiveSite& site, double answer_bound_s) {
  LivenessReport rep;
  std::lock_guard<std::mutex> lk(g_probe_mu);
  const std::shared_ptr<CommTrack> track = find_track(site.comm);
  if (g_probe_comm == MPI_COMM_NULL || !track) return rep;
  static int64_t round = 0;
  ++round;
  std::vector<int> peers;
  for (int r : track->world_ranks)
    if (r != g_world_rank && r >= 0) peers.push_back(r);
  const size_t n = peers.size();
  // Leaked if a peer never answers (the job is about to end then): MPI may
  // still write into them.
  auto* req = new ProbeRequest{site.comm, site.seq, round};
  auto* answers = new std::vector<ProbeAnswer>(n);
  std::vector<MPI_Request> sends(n, MPI_REQUEST_NULL), recvs(n, MPI_REQUEST_NULL);
  std::vector<char> got(n, 0);
  for (size_t i = 0; i < n; ++i) {
    MPI_Isend(req, int(sizeof *req), MPI_BYTE, peers[i], kProbeTag, g_probe_comm, &sends[i]);
    MPI_Irecv(&(*answers)[i], int(sizeof(ProbeAnswer)), MPI_BYTE, peers[i], kAnswerTag, g_probe_comm,
              &recvs[i]);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(answer_bound_s);
  size_t pending = n;
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < n; ++i) {
      if (got[i]) continue;
      int done = 0;
      MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE);
      if (!done) continue;
      if ((*answers)[i].round != round) {  // a late answer to an earlier probe
        MPI_Irecv(&(*answers)[i], int(sizeof(ProbeAnswer)), MPI_BYTE, peers[i], kAnswerTag, g_probe_comm,
                  &recvs[i]);
        continue;
      }
      got[i] = 1;
      --pending;
    }
    if (pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  rep.probed = true;
  for (size_t i = 0; i < n; ++i) {
    if (!got[i]) {
      rep.silent.push_back(peers[i]);
      continue;
    }
    ++rep.answered;
    const ProbeAnswer& a = (*answers)[i];
    std::string what(a.what, strnlen(a.what, sizeof a.what));
    if (a.issued < site.seq)
      rep.absent.push_back(rank_text(peers[i]) + " had not issued it (" +
                           std::to_string(a.issued < 0 ? 0 : a.issued) + " of " + std::to_string(site.seq) +
                           " collectives on its communicator): " + what);
  }
  if (pending == 0) {  // every send was received
    MPI_Waitall(int(n), sends.data(), MPI_STATUSES_IGNORE);
    delete req;
    delete answers;
  } else {
    for (auto& r : sends)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    for (auto& r : recvs)
      if (r != MPI_REQUEST_NULL) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
  }
  return rep;
}

// Answers the peers' probes until `stop`: polls for a request every 20 ms
// (MPI's blocking receive would spin a core).
void respond(std::atomic<bool>* stop) {
  while (!stop->load()) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kProbeTag, g_probe_comm, &flag, &st);
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    ProbeRequest req{};
    MPI_Recv(&req, int(sizeof req), MPI_BYTE, st.MPI_SOURCE, kProbeTag, g_probe_comm, MPI_STATUS_IGNORE);
    ProbeAnswer a{};
    a.round = req.round;
    const std::shared_ptr<CommTrack> t = find_track(req.comm);
    a.issued = t ? t->issued.load() : -1;
    const std::string what = watchdog_state_text();
    std::strncpy(a.what, what.c_str(), sizeof a.what - 1);
    MPI_Send(&a, int(sizeof a), MPI_BYTE, st.MPI_SOURCE, kAnswerTag, g_probe_comm);
  }
}

ThreadLevel level_from_mpi(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return ThreadLevel::multiple;
  if (provided >= MPI_THREAD_SERIALIZED) return ThreadLevel::serialized;
  if (provided >= MPI_THREAD_FUNNELED) return ThreadLevel::funneled;
  return ThreadLevel::single;
}

// Every rank runs the same kernel level (include/moe/isa.h): the lowest any
// rank chose (one forced lower with MOE_GEMM_ISA, or an older CPU; every rank
// runs every level below its own). A rank that cannot choose (a bad
// MOE_GEMM_ISA) contributes -1, and then every rank throws here, so none is
// left waiting in a later collective. One MPI_Allreduce (MINLOC: the lowest
// level and the lowest rank holding it).
void agree_on_isa() {
  struct {
    int level, rank;
  } mine{-1, 0}, low{-1, 0};
  MPI_Comm_rank(MPI_COMM_WORLD, &mine.rank);
  std::string own_error;
  try {
    mine.level = int(active_isa());
  } catch (const Error& e) {
    own_error = e.what();
  }
  {
    WatchedWait w("agree_on_isa all_reduce", "8 B");
    MPI_Allreduce(&mine, &low, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD);
  }
  if (low.level >= 0) return set_active_isa(Isa(low.level));
  if (!own_error.empty()) throw Error(own_error);
  fail("another rank (rank ", low.rank, ") could not choose a kernel level (its error names its ",
       "MOE_GEMM_ISA); every rank stops");
}

// The host of every world rank for the watchdog's messages (set_rank_hosts):
// one MPI_Allgather of the processor names.
void gather_rank_hosts() {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0, n = 0;
  MPI_Get_processor_name(name, &len);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<char> all(size_t(n) * MPI_MAX_PROCESSOR_NAME);
  {
    WatchedWait w("host names all_gather", std::to_string(MPI_MAX_PROCESSOR_NAME) + " B per rank");
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                  MPI_COMM_WORLD);
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) {
    const char* p = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    hosts.emplace_back(p, strnlen(p, MPI_MAX_PROCESSOR_NAME));
  }
  set_rank_hosts(std::move(hosts));
}

// A write to a TCP peer whose host died raises SIGPIPE, whose default action ends the process at
// once: a surviving rank then dies "on signal 13 (Broken pipe)" before the watchdog names the host
// that failed, and mpirun may report that rank (the first death it hears of) instead of the dead
// host's (seen under load in cluster_fail_kill_1, 2026-12-05). Ignored, the write fails with EPIPE,
// the collective waits, and the watchdog ends the job naming the silent host. Only a default
// disposition is changed (a handler the program installed stays; Python already ignores SIGPIPE).
void ignore_sigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) signal(SIGPIPE, SIG_IGN);
}

// MPI's lifetime: initialized by the first world communicator, finalized
// when the last communicator holding it goes (if this code initialized it).
class MpiRuntime {
 public:
  MpiRuntime() {
    int inited = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    if (!inited) {
      ignore_sigpipe();
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      owns_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    level_ = level_from_mpi(provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_world_rank);
    set_watchdog_abort(&abort_on_expiry);
    MPI_Comm_create_errhandler(&on_mpi_error, &handler_);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, handler_);
    try {
      agree_on_isa();
      gather_rank_hosts();
    } catch (...) {  // every rank is here: finalize together, then each exits with its message
      shut_down();
      throw;
    }
    // Only the runtime that initialized MPI finalizes it, so only it may run a thread that calls MPI.
    if (level_ == ThreadLevel::multiple && owns_) start_responder();
  }
  ~MpiRuntime() { shut_down(); }
  ThreadLevel level() const { return level_; }
  // A new id for a world communicator (every rank makes them in the same order).
  static uint64_t next_world_id() {
    static std::atomic<uint64_t> worlds{0};
    return mix(0x776f726c64ull, ++worlds);
  }

 private:
  // The probe communicator and its responder (every rank, collectively).
  void start_responder() {
    {
      WatchedWait w("liveness probe communicator (MPI_Comm_dup)", "");
      MPI_Comm_dup(MPI_COMM_WORLD, &g_probe_comm);
    }
    responder_ = std::thread(respond, &stop_responder_);
    set_liveness_probe(&probe_peers);
  }
  void stop_responder() {
    if (!responder_.joinable()) return;
    {
      std::lock_guard<std::mutex> lk(g_probe_mu);  // waits for a probe in progress
      set_liveness_probe(nullptr);
    }
    stop_responder_ = true;
    responder_.join();
    // A peer's request that arrived after the last poll stays unmatched; freeing the
    // communicator with it pending is allowed (MPI_Comm_free is local).
    MPI_Comm_free(&g_probe_comm);
  }

  void shut_down() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    stop_responder();
    MPI_Errhandler_free(&handler_);
    if (!owns_) return;
    set_watchdog_abort(&exit_on_expiry);  // a peer that never reaches MPI_Finalize
    WatchedWait w("MPI_Finalize", "");
    MPI_Finalize();
  }

  bool owns_ = false;
  ThreadLevel level_ = ThreadLevel::single;
  MPI_Errhandler handler_;
  std::atomic<bool> stop_responder_{false};
  std::thread responder_;
};

int as_int(int64_t v, const char* op) {
  if (v < 0 || v > INT_MAX) fail("[", op, "] count ", v, " does not fit an MPI int count");
  return int(v);
}

std::vector<int> as_ints(const std::vector<int64_t>& v, const char* op) {
  std::vector<int> out;
  out.reserve(v.size());
  for (int64_t x : v) out.push_back(as_int(x, op));
  return out;
}

// A contiguous datatype of `bytes` bytes, freed with the object (MPI keeps
// it alive for operations still in flight).
class ElemType {
 public:
  explicit ElemType(size_t bytes) {
    MPI_Type_contiguous(as_int(int64_t(bytes), "datatype"), MPI_BYTE, &t_);
    MPI_Type_commit(&t_);
  }
  ~ElemType() { MPI_Type_free(&t_); }
  MPI_Datatype get() const { return t_; }

 private:
  MPI_Datatype t_;
};

// Completes `req` by polling (Communicator::set_polite_waits): spin for the
// first ~20 µs (short collectives finish there), then MPI_Test every ~100 µs
// and sleep in between. MPI progresses the transfer inside MPI_Test (there is
// no progress thread), so the poll interval bounds how long the socket
// buffers go unserviced: at 2 Gbit/s, 100 µs is ~25 KB, well inside them.
// (Measured on the overlap demo: 50 µs polls cost the compute thread more
// preemptions for no less exposed time; 200 µs and more left the link idle.)
int poll_interval_us() {
  static const int us = [] {
    const char* v = std::getenv("MOE_POLL_US");
    return v && std::atoi(v) > 0 ? std::atoi(v) : 100;
  }();
  return us;
}

// While a thread of this process is blocked on the result (BlockedWaiter: the compute thread
// waiting for a side-engine event), there is a core with nothing else to do: test again at once,
// yielding to anything else runnable, instead of sleeping. Not for a real-time (SCHED_FIFO)
// worker: its yield gives way to no normal thread, so it would starve the other ranks on its core;
// it wakes from each sleep at once anyway.
void polite_wait(MPI_Request* req) {  // REQUIRES: *req is not MPI_REQUEST_NULL
  using clock = std::chrono::steady_clock;
  thread_local const bool realtime = sched_getscheduler(0) == SCHED_FIFO;
  const auto spin_until = clock::now() + std::chrono::microseconds(20);
  int done = 0;
  for (;;) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (clock::now() <= spin_until) continue;
    if (!realtime && BlockedWaiter::any())
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(poll_interval_us()));
  }
}

// Event of one MPI non-blocking call; owns the count arrays MPI reads until completion.
class MpiRequest : public CommRequest {
 public:
  MpiRequest(const char* op, std::string detail, bool polite, CollectiveSite site = {})
      : op_(op), detail_(std::move(detail)), polite_(polite), site_(site) {}
  ~MpiRequest() override { wait(); }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    WatchedWait w(op_, detail_, site_);
    if (polite_) polite_wait(&req_);
    else MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  MPI_Request* handle() { return &req_; }
  std::vector<int> sc, so, rc, ro;

 private:
  const char* op_;  // for the watchdog's message
  std::string detail_;
  bool polite_;
  CollectiveSite site_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

class MpiComm : public Communicator {
 public:
  MpiComm(std::shared_ptr<MpiRuntime> rt, MPI_Comm comm, std::shared_ptr<CommCounters> counters, uint64_t id)
      : Communicator(std::move(counters)), rt_(std::move(rt)), comm_(comm), track_(make_track(comm, id)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override { free_comm(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  ThreadLevel thread_level() const override { return rt_->level(); }
  const char* backend() const override { return "mpi"; }
  void barrier() override {
    WatchedWait w("barrier", "", next_site());
    MPI_Barrier(comm_);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    WatchedWait w("broadcast", bytes_text(int64_t(bytes), " from rank ") + std::to_string(root), next_site());
    MPI_Bcast(buf, as_int(int64_t(bytes), "broadcast"), MPI_BYTE, root, comm_);
  }
  void gatherv(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
               int root) override;
  void scatterv(const void* send, const std::vector<size_t>& send_bytes, void* recv, size_t recv_bytes,
                int root) override;

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail("[split] color must be >= 0, got ", color);
    MPI_Comm sub;
    const uint64_t id = mix(mix(track_->id, uint64_t(++track_->splits)), uint64_t(color));
    WatchedWait w("split", "", next_site());
    MPI_Comm_split(comm_, color, key, &sub);
    auto out = std::make_unique<MpiComm>(rt_, sub, shared_counters(), id);
    out->set_polite_waits(polite_waits());
    out->set_polite_waits_from(polite_waits_from());
    return out;
  }

  std::unique_ptr<Communicator> split_by_host(int key) override {
    const int per_host = ranks_per_host_override();  // checked before the collective
    MPI_Comm sub;
    const uint64_t id = mix(mix(track_->id, uint64_t(++track_->splits)), 0x686f7374ull);
    WatchedWait w("split_by_host", "", next_site());
    if (per_host > 0) MPI_Comm_split(comm_, g_world_rank / per_host, key, &sub);
    else MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &sub);
    auto out = std::make_unique<MpiComm>(rt_, sub, shared_counters(), id);
    out->set_polite_waits(polite_waits());
    out->set_polite_waits_from(polite_waits_from());
    return out;
  }

  [[noreturn]] void abort(const std::string& msg) override {
    print_fatal(msg);
    abort_world();
  }

 protected:
  void do_all_gather(const void* send, void* recv, size_t block_bytes) override {
    if (polite_for(block_bytes * size_t(size_ - 1))) return do_iall_gather(send, recv, block_bytes)->wait();
    int n = as_int(int64_t(block_bytes), "all_gather");
    WatchedWait w("all_gather", bytes_text(n, " per rank"), next_site());
    MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_);
  }
  void do_all_to_allv(const void* send, void* recv, const A2ALayout& l, size_t elem_bytes) override {
    if (polite_for(bytes_out(l, elem_bytes))) return do_iall_to_allv(send, recv, l, elem_bytes)->wait();
    MpiRequest r("all_to_allv", "", false);
    fill_counts(r, l);
    ElemType t(elem_bytes);
    WatchedWait w("all_to_allv", a2a_text(l, elem_bytes), next_site());
    MPI_Alltoallv(send, r.sc.data(), r.so.data(), t.get(), recv, r.rc.data(), r.ro.data(), t.get(), comm_);
  }
  CommRequestPtr do_iall_gather(const void* send, void* recv, size_t block_bytes) override {
    int n = as_int(int64_t(block_bytes), "iall_gather");
    auto r = std::make_unique<MpiRequest>("all_gather wait", bytes_text(n, " per rank"),
                                          polite_for(block_bytes * size_t(size_ - 1)),
                                          next_site());
    MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, r->handle());
    return r;
  }
  CommRequestPtr do_iall_to_allv(const void* send, void* recv, const A2ALayout& l,
                                 size_t elem_bytes) override {
    auto r = std::make_unique<MpiRequest>("all_to_allv wait", a2a_text(l, elem_bytes),
                                          polite_for(bytes_out(l, elem_bytes)),
                                          next_site());
    fill_counts(*r, l);
    ElemType t(elem_bytes);
    MPI_Ialltoallv(send, r->sc.data(), r->so.data(), t.get(), recv, r->rc.data(), r->ro.data(), t.get(),
                   comm_, r->handle());
    return r;
  }

 private:
  // The next collective on this communicator (issued now).
  CollectiveSite next_site() { return CollectiveSite{track_->id, ++track_->issued}; }
  // Bytes this rank sends to the other ranks.
  size_t bytes_out(const A2ALayout& l, size_t elem_bytes) const {
    int64_t out = 0;
    for (size_t j = 0; j < l.send_counts.size(); ++j)
      if (int(j) != rank_) out += l.send_counts[j];
    return size_t(out) * elem_bytes;
  }
  // "N B out, M B in" of this rank.
  static std::string a2a_text(const A2ALayout& l, size_t elem_bytes) {
    int64_t out = 0, in = 0;
    for (int64_t c : l.send_counts) out += c;
    for (int64_t c : l.recv_counts) in += c;
    return bytes_text(out * int64_t(elem_bytes), " out, ") + bytes_text(in * int64_t(elem_bytes), " in");
  }
  static void fill_counts(MpiRequest& r, const A2ALayout& l) {
    r.sc = as_ints(l.send_counts, "all_to_allv");
    r.so = as_ints(l.send_offsets, "all_to_allv");
    r.rc = as_ints(l.recv_counts, "all_to_allv");
    r.ro = as_ints(l.recv_offsets, "all_to_allv");
  }
  void free_comm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  std::shared_ptr<MpiRuntime> rt_;
  MPI_Comm comm_;
  std::shared_ptr<CommTrack> track_;
  int rank_ = 0, size_ = 1;
};

namespace {
// Byte counts and packed displacements for the v-variants (ints for MPI).
void packed(const std::vector<size_t>& bytes, std::vector<int>& counts, std::vector<int>& displs,
            const char* op) {
  int64_t off = 0;
  for (size_t b : bytes) {
    counts.push_back(as_int(int64_t(b), op));
    displs.push_back(as_int(off, op));
    off += int64_t(b);
  }
}
}  // namespace

void MpiComm::gatherv(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
                      int root) {
  std::vector<int> counts, displs;
  if (rank_ == root) {
    if (recv_bytes.size() != size_t(size_)) fail("[gatherv] recv_bytes needs ", size_, " entries");
    packed(recv_bytes, counts, displs, "gatherv");
  }
  WatchedWait w("gatherv", bytes_text(int64_t(send_bytes), " to rank ") + std::to_string(root), next_site());
  MPI_Gatherv(send, as_int(int64_t(send_bytes), "gatherv"), MPI_BYTE, recv, counts.data(), displs.data(),
              MPI_BYTE, root, comm_);
}

void MpiComm::scatterv(const void* send, const std::vector<size_t>& send_bytes, void* recv, size_t recv_bytes,
                       int root) {
  std::vector<int> counts, displs;
  if (rank_ == root) {
    if (send_bytes.size() != size_t(size_)) fail("[scatterv] send_bytes needs ", size_, " entries");
    packed(send_bytes, counts, displs, "scatterv");
  }
  WatchedWait w("scatterv", bytes_text(int64_t(recv_bytes), " from rank ") + std::to_string(root),
                next_site());
  MPI_Scatterv(send, counts.data(), displs.data(), MPI_BYTE, recv, as_int(int64_t(recv_bytes), "scatterv"),
               MPI_BYTE, root, comm_);
}

std::unique_ptr<Communicator> make_mpi_world_comm() {
  auto rt = std::make_shared<MpiRuntime>();
  MPI_Comm world;
  WatchedWait w("world communicator (MPI_Comm_dup)", "");
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  const uint64_t id = MpiRuntime::next_world_id();
  return std::make_unique<MpiComm>(std::move(rt), world, std::make_shared<CommCounters>(), id);
}

}  // namespace moe
