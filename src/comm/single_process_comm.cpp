// SingleProcessComm: the communicator of a run without mpirun. Size 1; every
// collective is a copy of this rank's own block (counters still count).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "moe/comm.h"
#include "moe/error.h"

namespace moe {
namespace {

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
};

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n && dst != src) std::memmove(dst, src, n);
}

class SingleProcessComm : public Communicator {
 public:
  explicit SingleProcessComm(std::shared_ptr<CommCounters> c) : Communicator(std::move(c)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  ThreadLevel thread_level() const override { return ThreadLevel::multiple; }
  const char* backend() const override { return "single"; }
  void barrier() override {}

  void broadcast(void*, size_t, int root) override { check_root(root, "broadcast"); }
  void gatherv(const void* send, size_t send_bytes, void* recv, const std::vector<size_t>& recv_bytes,
               int root) override {
    check_root(root, "gatherv");
    if (recv_bytes.size() != 1 || recv_bytes[0] != send_bytes)
      fail("[gatherv] single process: recv_bytes must be {", send_bytes, "}");
    copy_bytes(recv, send, send_bytes);
  }
  void scatterv(const void* send, const std::vector<size_t>& send_bytes, void* recv, size_t recv_bytes,
                int root) override {
    check_root(root, "scatterv");
    if (send_bytes.size() != 1 || send_bytes[0] != recv_bytes)
      fail("[scatterv] single process: send_bytes must be {", recv_bytes, "}");
    copy_bytes(recv, send, recv_bytes);
  }

  std::unique_ptr<Communicator> split(int color, int) override {
    if (color < 0) fail("[split] color must be >= 0, got ", color);
    return copy();
  }

  std::unique_ptr<Communicator> split_by_host(int) override {
    ranks_per_host_override();  // a bad value is an error here too
    return copy();
  }

  [[noreturn]] void abort(const std::string& msg) override {
    std::fprintf(stderr, "moe: fatal: %s\n", msg.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }

 protected:
  void do_all_gather(const void* send, void* recv, size_t block_bytes) override {
    copy_bytes(recv, send, block_bytes);
  }
  void do_all_to_allv(const void* send, void* recv, const A2ALayout& l, size_t elem_bytes) override {
    if (l.send_counts[0] != l.recv_counts[0])
      fail("[all_to_allv] single process: sends ", l.send_counts[0], " elements to itself but expects ",
           l.recv_counts[0]);
    copy_bytes(static_cast<char*>(recv) + size_t(l.recv_offsets[0]) * elem_bytes,
               static_cast<const char*>(send) + size_t(l.send_offsets[0]) * elem_bytes,
               size_t(l.send_counts[0]) * elem_bytes);
  }
  CommRequestPtr do_iall_gather(const void* send, void* recv, size_t block_bytes) override {
    do_all_gather(send, recv, block_bytes);
    return std::make_unique<DoneRequest>();
  }
  CommRequestPtr do_iall_to_allv(const void* send, void* recv, const A2ALayout& l, size_t elem_bytes) override {
    do_all_to_allv(send, recv, l, elem_bytes);
    return std::make_unique<DoneRequest>();
  }

 private:
  // A new communicator sharing the counters, with this one's wait settings (as MPI's split).
  std::unique_ptr<Communicator> copy() {
    auto out = std::make_unique<SingleProcessComm>(shared_counters());
    out->set_polite_waits(polite_waits());
    out->set_polite_waits_from(polite_waits_from());
    return out;
  }
  static void check_root(int root, const char* op) {
    if (root != 0) fail("[", op, "] root ", root, " is not a rank of a single-process communicator");
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_comm() {
  return std::make_unique<SingleProcessComm>(std::make_shared<CommCounters>());
}

}  // namespace moe
