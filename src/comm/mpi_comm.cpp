// MpiComm: Communicator over an MPI communicator. Collectives map 1:1 onto
// MPI_Allgather / MPI_Alltoallv (and their I-variants); element sizes become
// contiguous MPI datatypes so counts are in elements. Counts and offsets must
// fit in int (MPI-3): a larger message is an error naming the op.
// Every collective and every completion wait is a WatchedWait (the collective
// watchdog, include/moe/watchdog.h): blocking calls stay blocking, the
// watchdog's thread ends the job from outside when one lasts too long.
#include "comm/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "moe/error.h"
#include "moe/isa.h"
#include "moe/watchdog.h"

namespace moe {
namespace {

void on_mpi_error(MPI_Comm* comm, int* code, ...) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(*code, text, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "moe: MPI error on rank %d: %s; aborting every rank\n", rank, text);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

int g_world_rank = -1;  // set once MPI is initialized, read by the watchdog's thread

void print_fatal(const std::string& msg) {
  std::fprintf(stderr, "moe: fatal on rank %d: %s\n", g_world_rank, msg.c_str());
  std::fflush(stderr);
}

// The watchdog's expiry action: the message, then every rank goes.
void abort_on_expiry(const std::string& msg) {
  print_fatal(msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// During MPI_Finalize (MPI_Abort may no longer work): the message, then this
// process exits non-zero, and mpirun ends the others.
void exit_on_expiry(const std::string& msg) {
  print_fatal(msg);
  std::_Exit(1);
}

std::string bytes_text(int64_t bytes, const char* what = "") { return std::to_string(bytes) + " B" + what; }

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

// MPI's lifetime: initialized by the first world communicator, finalized
// when the last communicator holding it goes (if this code initialized it).
class MpiRuntime {
 public:
  MpiRuntime() {
    int inited = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    if (!inited) {
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
    } catch (...) {  // every rank is here: finalize together, then each exits with its message
      shut_down();
      throw;
    }
  }
  ~MpiRuntime() { shut_down(); }
  ThreadLevel level() const { return level_; }

 private:
  void shut_down() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Errhandler_free(&handler_);
    if (!owns_) return;
    set_watchdog_abort(&exit_on_expiry);  // a peer that never reaches MPI_Finalize
    WatchedWait w("MPI_Finalize", "");
    MPI_Finalize();
  }

  bool owns_ = false;
  ThreadLevel level_ = ThreadLevel::single;
  MPI_Errhandler handler_;
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

void polite_wait(MPI_Request* req) {  // REQUIRES: *req is not MPI_REQUEST_NULL
  using clock = std::chrono::steady_clock;
  const auto spin_until = clock::now() + std::chrono::microseconds(20);
  int done = 0;
  for (;;) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(poll_interval_us()));
  }
}

// Event of one MPI non-blocking call; owns the count arrays MPI reads until completion.
class MpiRequest : public CommRequest {
 public:
  MpiRequest(const char* op, std::string detail, bool polite)
      : op_(op), detail_(std::move(detail)), polite_(polite) {}
  ~MpiRequest() override { wait(); }
  void wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    WatchedWait w(op_, detail_);
    if (polite_) polite_wait(&req_);
    else MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  MPI_Request* handle() { return &req_; }
  std::vector<int> sc, so, rc, ro;

 private:
  const char* op_;  // for the watchdog's message
  std::string detail_;
  bool polite_;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

}  // namespace

class MpiComm : public Communicator {
 public:
  MpiComm(std::shared_ptr<MpiRuntime> rt, MPI_Comm comm, std::shared_ptr<CommCounters> counters)
      : Communicator(std::move(counters)), rt_(std::move(rt)), comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override { free_comm(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  ThreadLevel thread_level() const override { return rt_->level(); }
  const char* backend() const override { return "mpi"; }
  void barrier() override {
    WatchedWait w("barrier", "");
    MPI_Barrier(comm_);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    WatchedWait w("broadcast", bytes_text(int64_t(bytes), " from rank ") + std::to_string(root));
    MPI_Bcast(buf, as_int(int64_t(bytes), "broadcast"), MPI_BYTE, root, comm_);
  }
  void gatherv(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
               int root) override;
  void scatterv(const void* send, const std::vector<size_t>& send_bytes, void* recv, size_t recv_bytes,
                int root) override;

  std::unique_ptr<Communicator> split(int color, int key) override {
    if (color < 0) fail("[split] color must be >= 0, got ", color);
    MPI_Comm sub;
    WatchedWait w("split", "");
    MPI_Comm_split(comm_, color, key, &sub);
    auto out = std::make_unique<MpiComm>(rt_, sub, shared_counters());
    out->set_polite_waits(polite_waits());
    return out;
  }

  [[noreturn]] void abort(const std::string& msg) override {
    int world_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    std::fprintf(stderr, "moe: fatal on rank %d: %s\n", world_rank, msg.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

 protected:
  void do_all_gather(const void* send, void* recv, size_t block_bytes) override {
    if (polite_waits()) return do_iall_gather(send, recv, block_bytes)->wait();
    int n = as_int(int64_t(block_bytes), "all_gather");
    WatchedWait w("all_gather", bytes_text(n, " per rank"));
    MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_);
  }
  void do_all_to_allv(const void* send, void* recv, const A2ALayout& l, size_t elem_bytes) override {
    if (polite_waits()) return do_iall_to_allv(send, recv, l, elem_bytes)->wait();
    MpiRequest r("all_to_allv", "", false);
    fill_counts(r, l);
    ElemType t(elem_bytes);
    WatchedWait w("all_to_allv", a2a_text(l, elem_bytes));
    MPI_Alltoallv(send, r.sc.data(), r.so.data(), t.get(), recv, r.rc.data(), r.ro.data(), t.get(), comm_);
  }
  CommRequestPtr do_iall_gather(const void* send, void* recv, size_t block_bytes) override {
    int n = as_int(int64_t(block_bytes), "iall_gather");
    auto r = std::make_unique<MpiRequest>("all_gather wait", bytes_text(n, " per rank"), polite_waits());
    MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, r->handle());
    return r;
  }
  CommRequestPtr do_iall_to_allv(const void* send, void* recv, const A2ALayout& l,
                                 size_t elem_bytes) override {
    auto r = std::make_unique<MpiRequest>("all_to_allv wait", a2a_text(l, elem_bytes), polite_waits());
    fill_counts(*r, l);
    ElemType t(elem_bytes);
    MPI_Ialltoallv(send, r->sc.data(), r->so.data(), t.get(), recv, r->rc.data(), r->ro.data(), t.get(),
                   comm_, r->handle());
    return r;
  }

 private:
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
  WatchedWait w("gatherv", bytes_text(int64_t(send_bytes), " to rank ") + std::to_string(root));
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
  WatchedWait w("scatterv", bytes_text(int64_t(recv_bytes), " from rank ") + std::to_string(root));
  MPI_Scatterv(send, counts.data(), displs.data(), MPI_BYTE, recv, as_int(int64_t(recv_bytes), "scatterv"),
               MPI_BYTE, root, comm_);
}

std::unique_ptr<Communicator> make_mpi_world_comm() {
  auto rt = std::make_shared<MpiRuntime>();
  MPI_Comm world;
  WatchedWait w("world communicator (MPI_Comm_dup)", "");
  MPI_Comm_dup(MPI_COMM_WORLD, &world);
  return std::make_unique<MpiComm>(std::move(rt), world, std::make_shared<CommCounters>());
}

}  // namespace moe
