// Communication substrate of the distributed layer (SPEC.md §3): an abstract
// communicator over a group of ranks (MLX-style), with a single-process
// implementation that is always built and an MPI one (when CMake finds MPI).
//
// Collectives move bytes; the only arithmetic is the deterministic f32 sum of
// all_reduce_sum / reduce_scatter_sum, done by the engine in rank order
// (rank 0 + rank 1 + ... sequentially, in f32) after MPI moved the
// contributions, so the bits never depend on the MPI library's algorithm.
// all_reduce_sum over W >= 3 ranks whose all-gather would bring each rank
// kSplitAllReduceBytes (2 MiB) or more ((W-1)*n floats) is a rank-order reduce-scatter
// (rank j sums part j of every rank's vector) and an all-gather of the sums:
// 2(W-1)/W*n floats in per rank, as a ring all-reduce; a smaller one (or over
// 2 ranks) is one all-gather of the whole vectors and the rank-order sum on
// every rank: (W-1)*n floats in, one collective's latency. Both give the same bits (each element is the same
// chain of additions). reduce_scatter_sum moves the same (W-1)/W of its input
// as a ring reduce-scatter and holds one copy of it.
//
// Counters: every call of a counted collective (AG, A2A, AR, RS; SO is filled
// by the side engine) adds 1 to its count and the bytes this rank contributes
// (see CollKind), also when size() == 1, so single-process and multi-rank op
// counts are comparable (MaxText counts HLO ops whatever the mesh size).
// broadcast, gatherv, scatterv, barrier and split are setup / file I/O
// traffic and are not counted. Sub-communicators made by split() report into
// their parent's CommCounters object.
//
// Failure: an MPI error aborts every rank with the message (an error handler
// calls MPI_Abort); abort(msg) does the same on purpose, and
// run_collectively() calls it for any exception of a multi-rank job. If a
// rank dies, mpirun (OpenMPI default) kills the others; if one is stopped or
// stuck, the collective watchdog (moe/watchdog.h, collective_timeout_s) of a
// waiting peer ends the job: no rank is left hanging.
//
// Thread safety: a Communicator is used by one thread at a time (collectives
// on one communicator must be issued in the same order on every rank anyway).
// Different communicators (e.g. one made by split() for the side engine) may
// be used concurrently from different threads when thread_level() is
// ThreadLevel::multiple. CommCounters is safe to update from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "moe/error.h"

namespace moe {

// Counted collective kinds. Bytes counted per call (this rank's payload):
// AG: the block it contributes; A2A: the sum of its send counts; AR: the
// n floats it contributes; RS: its full-size input (W blocks); SO: given by
// the side engine.
enum class CollKind : int { AR = 0, AG, A2A, RS, SO };
inline constexpr int kNumCollKinds = 5;
const char* coll_kind_name(CollKind k);  // "AR", "AG", "A2A", "RS", "SO"

struct CollStat {
  int64_t count = 0;
  int64_t bytes = 0;
};

// Per-step collective counters (reset at the start of a step, read after).
// Thread safety: add/get/reset are atomic per field; a get() concurrent with
// an add() may see the count without the bytes.
class CommCounters {
 public:
  void add(CollKind k, int64_t bytes);
  CollStat get(CollKind k) const;
  void reset();
  // "AR 1 (64 B), AG 2 (128 B), A2A 0 (0 B), RS 0 (0 B), SO 0 (0 B)"
  std::string summary() const;
  // Bytes counted by add() on the calling thread so far, over every counter
  // of the process (never reset): the difference around an op is the bytes
  // that op's collectives moved (the step trace's per-op bytes).
  static int64_t thread_bytes();

 private:
  std::array<std::atomic<int64_t>, kNumCollKinds> count_{};
  std::array<std::atomic<int64_t>, kNumCollKinds> bytes_{};
};

// MPI thread support provided (single-process: multiple, nothing shared).
enum class ThreadLevel { single, funneled, serialized, multiple };
const char* thread_level_name(ThreadLevel t);

// Event of a non-blocking collective: wait() returns when the output buffer
// is complete (and, for ireduce_scatter_sum, summed). Buffers passed to the
// call must stay valid and untouched until then. The destructor waits if
// wait() was not called. Thread safety: wait() is called by one thread.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
};
using CommRequestPtr = std::unique_ptr<CommRequest>;

// Layout of a ragged all-to-all, in elements (of the element size given with
// it), one entry per rank of the communicator: this rank sends
// send_counts[j] elements starting at send_offsets[j] to rank j, and receives
// recv_counts[i] elements from rank i at recv_offsets[i] of its buffer.
struct A2ALayout {
  std::vector<int64_t> send_counts, send_offsets, recv_counts, recv_offsets;
  // Equal blocks of `block` elements to and from every rank, packed by rank.
  static A2ALayout uniform(int size, int64_t block);
};

// Marks the calling thread as blocked on polled work for its lifetime (see
// Communicator::set_polite_waits). Process-wide count; any thread.
class BlockedWaiter {
 public:
  BlockedWaiter();
  ~BlockedWaiter();
  BlockedWaiter(const BlockedWaiter&) = delete;
  BlockedWaiter& operator=(const BlockedWaiter&) = delete;
  // True while at least one BlockedWaiter lives in this process.
  static bool any();
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual ThreadLevel thread_level() const = 0;
  virtual const char* backend() const = 0;  // "single" | "mpi"
  virtual void barrier() = 0;

  // --- counted collectives (blocking) ---
  // recv [size * block_bytes] = every rank's send [block_bytes], in rank order.
  void all_gather(const void* send, void* recv, size_t block_bytes);
  // Ragged all-to-all (see A2ALayout); elem_bytes > 0.
  void all_to_allv(const void* send, void* recv, const A2ALayout& layout, size_t elem_bytes);
  // out[n] = in_0 + in_1 + ... + in_{W-1} (rank order, f32). out may alias in.
  void all_reduce_sum(const float* in, float* out, size_t n);
  // all_reduce_sum reduce-scatters, then all-gathers, over W >= 3 ranks where its all-gather
  // would bring each rank this many bytes or more ((W-1)·4n): all_reduce_splits(W, n).
  static constexpr size_t kSplitAllReduceBytes = size_t(2) << 20;
  static bool all_reduce_splits(int W, size_t n) {
    return W >= 3 && size_t(W - 1) * n * sizeof(float) >= kSplitAllReduceBytes;
  }
  // in [W * block]; out [block] = sum over ranks r (in rank order) of block
  // `rank()` of rank r's input. out must not alias in.
  void reduce_scatter_sum(const float* in, float* out, size_t block);

  // --- counted collectives (non-blocking; counted when issued) ---
  CommRequestPtr iall_gather(const void* send, void* recv, size_t block_bytes);
  CommRequestPtr iall_to_allv(const void* send, void* recv, const A2ALayout& layout, size_t elem_bytes);
  CommRequestPtr ireduce_scatter_sum(const float* in, float* out, size_t block);

  // --- uncounted (setup and file I/O) ---
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // root receives recv_bytes[r] bytes from rank r, packed in rank order.
  // recv and recv_bytes are only read on root.
  virtual void gatherv(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
                       int root) = 0;
  // Inverse of gatherv: rank r receives send_bytes[r] bytes of root's buffer.
  virtual void scatterv(const void* send, const std::vector<size_t>& send_bytes, void* recv, size_t recv_bytes,
                        int root) = 0;

  // Collective: ranks with the same color (>= 0) form a new communicator,
  // ordered by key (ties by rank). The result shares this one's counters.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  // Collective: the ranks of this communicator on this rank's host, ordered
  // by key (ties by rank); shares this one's counters. A host is what MPI
  // calls a shared-memory node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)),
  // unless ranks_per_host_override() is set: then world rank r is on host
  // r / n. Single process: a copy of itself.
  virtual std::unique_ptr<Communicator> split_by_host(int key) = 0;
  // Takes every rank of the job down with the message (exit status 1).
  [[noreturn]] virtual void abort(const std::string& msg) = 0;

  CommCounters& counters() const { return *counters_; }
  const std::shared_ptr<CommCounters>& shared_counters() const { return counters_; }

  // Waiting without holding a core (the side engine's communicators, which
  // share the cores with the compute pool): a blocking collective is issued
  // non-blocking and polled, sleeping between polls, instead of MPI's
  // spinning wait, which takes a core from the compute thread for as long as
  // the transfer lasts (on a slow link, most of a step). Same bytes, same
  // results; costs up to a few tens of µs of latency per collective.
  // Inherited by split(). No-op for the single-process communicator.
  // While a thread of the process is blocked on the completion of such work (a
  // BlockedWaiter: the compute thread in a side-engine Event::wait), polite
  // waits poll without sleeping: that thread's core has nothing else to do, so
  // the transfer gets MPI's progress at every test instead of once per poll
  // interval (a large shared-memory transfer moves only inside the tests).
  void set_polite_waits(bool on) { polite_waits_ = on; }
  bool polite_waits() const { return polite_waits_; }
  // Polite waits for large transfers only: a blocking collective that sends at least `bytes` out
  // of this rank to the others waits as set_polite_waits(true) makes it; smaller ones keep MPI's
  // wait. 0 (the default): off. Inherited by split() and split_by_host(). Mesh sets it on its
  // groups that span hosts when a machine runs more ranks than it has cores: there the
  // kernel's TCP work shares the cores with the waiting ranks (docs/distributed.md, "Waiting
  // on shared cores").
  void set_polite_waits_from(size_t bytes) { polite_from_ = bytes; }
  size_t polite_waits_from() const { return polite_from_; }
  // Whether a collective sending `bytes_out` to the other ranks waits politely.
  bool polite_for(size_t bytes_out) const {
    return polite_waits_ || (polite_from_ > 0 && bytes_out >= polite_from_);
  }

 protected:
  explicit Communicator(std::shared_ptr<CommCounters> counters);

  // Uncounted transport, implemented per backend. Arguments are checked.
  virtual void do_all_gather(const void* send, void* recv, size_t block_bytes) = 0;
  virtual void do_all_to_allv(const void* send, void* recv, const A2ALayout& layout, size_t elem_bytes) = 0;
  virtual CommRequestPtr do_iall_gather(const void* send, void* recv, size_t block_bytes) = 0;
  virtual CommRequestPtr do_iall_to_allv(const void* send, void* recv, const A2ALayout& layout,
                                         size_t elem_bytes) = 0;

 private:
  void check_layout(const A2ALayout& layout, const char* op) const;
  std::shared_ptr<CommCounters> counters_;
  bool polite_waits_ = false;
  size_t polite_from_ = 0;
};

// The exception boundary of a multi-rank job: runs body(); any exception
// (moe::Error or any other type) escaping it on a communicator of several
// ranks ends the whole job through abort(), "moe: fatal on rank R: <message>",
// so no peer is left waiting in a collective while this rank returns into
// MPI_Finalize. On one rank the exception propagates unchanged.
void run_collectively(Communicator& comm, const std::function<void()>& body);

// MOE_RANKS_PER_HOST=n (n >= 1): world ranks [0, n) are host 0, [n, 2n)
// host 1, ... (the last host may have fewer). For tests on one machine (the
// suite runs `mpirun -np 4` as 2 hosts x 2 ranks) and for users whose MPI
// cannot tell hosts apart (e.g. network namespaces without a UTS namespace).
// Returns 0 when unset; any other value than a positive integer is an error
// naming the variable.
int ranks_per_host_override();

// The single-process communicator: size 1, collectives are copies.
std::unique_ptr<Communicator> make_single_process_comm();

// True when this process was started by a launcher (mpirun / srun): one of
// OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK is set.
bool launched_by_mpi();
// True when the engine was built with MPI (MOE_HAVE_MPI).
bool mpi_compiled_in();
// The world: MPI when launched_by_mpi() and MPI is compiled in, else single
// process. Launched with several ranks but built without MPI is an error.
std::unique_ptr<Communicator> make_world_comm();

// out[i] = blocks[0][i] + blocks[1][i] + ... (sequentially, f32); blocks are
// `count` arrays of n floats, `stride` floats apart. The engine's one
// definition of "the rank-order sum" (tests compute expectations with it).
void ordered_sum(const float* blocks, int count, size_t n, size_t stride, float* out);

}  // namespace moe
