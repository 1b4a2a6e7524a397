// The backend-independent half of Communicator: argument checks, counters,
// and the deterministic f32 reductions built on the byte-moving primitives.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "core/allocator.h"
#include "moe/comm.h"
#include "moe/error.h"
#include "moe/watchdog.h"

namespace moe {

A2ALayout A2ALayout::uniform(int size, int64_t block) {
  A2ALayout l;
  for (int r = 0; r < size; ++r) {
    l.send_counts.push_back(block);
    l.send_offsets.push_back(r * block);
    l.recv_counts.push_back(block);
    l.recv_offsets.push_back(r * block);
  }
  return l;
}

void ordered_sum(const float* blocks, int count, size_t n, size_t stride, float* out) {
  MOE_ASSERT(count >= 1, "ordered_sum: no blocks");
  for (size_t i = 0; i < n; ++i) out[i] = blocks[i];
  for (int b = 1; b < count; ++b) {
    const float* src = blocks + size_t(b) * stride;
    for (size_t i = 0; i < n; ++i) out[i] += src[i];
  }
}

void run_collectively(Communicator& comm, const std::function<void()>& body) {
  try {
    body();
  } catch (...) {
    if (comm.size() == 1) throw;
    const std::string msg = current_exception_text();
    std::fflush(stdout);  // the lines printed so far, before the abort message
    comm.abort(msg);
  }
}

Communicator::Communicator(std::shared_ptr<CommCounters> counters) : counters_(std::move(counters)) {
  MOE_ASSERT(counters_ != nullptr, "Communicator: null counters");
}

void Communicator::check_layout(const A2ALayout& l, const char* op) const {
  const size_t w = size_t(size());
  if (l.send_counts.size() != w || l.send_offsets.size() != w || l.recv_counts.size() != w ||
      l.recv_offsets.size() != w)
    fail("[", op, "] layout needs ", w, " entries per vector (one per rank), got send ", l.send_counts.size(),
         "/", l.send_offsets.size(), " recv ", l.recv_counts.size(), "/", l.recv_offsets.size());
  for (size_t j = 0; j < w; ++j)
    if (l.send_counts[j] < 0 || l.send_offsets[j] < 0 || l.recv_counts[j] < 0 || l.recv_offsets[j] < 0)
      fail("[", op, "] negative count or offset for rank ", j);
}

namespace {
int64_t send_elems(const A2ALayout& l) {
  int64_t s = 0;
  for (int64_t c : l.send_counts) s += c;
  return s;
}

// The receive buffer of a reducing collective (W blocks, summed in rank order
// afterwards), from the engine's caching allocator: a fresh glibc mapping per
// call has MPI move every byte into pages that fault in on first touch (an
// all-reduce of the FSDP expert gradients, 4 ranks x 50 MB, spent seconds in
// the kernel), where a cached block's pages are resident. Moves with a request.
class Staging {
 public:
  // The size is rounded up to the alignment (aligned_alloc's rule for the small blocks).
  explicit Staging(size_t floats) : bytes_((std::max<size_t>(floats, 1) * sizeof(float) + 63) / 64 * 64) {
    p_ = static_cast<float*>(alloc::acquire(bytes_, 64));
    if (!p_) fail("collective staging: out of memory for ", bytes_, " bytes");
  }
  ~Staging() {
    if (p_) alloc::release(p_, bytes_);
  }
  Staging(Staging&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(o.bytes_) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  Staging& operator=(Staging&&) = delete;
  float* data() const { return p_; }

 private:
  float* p_ = nullptr;
  size_t bytes_;
};

// ireduce_scatter_sum's event: the all-to-all of blocks, then the ordered
// add into the caller's output when waited on.
class OrderedSumRequest : public CommRequest {
 public:
  OrderedSumRequest(CommRequestPtr inner, Staging staging, float* out, int count, size_t block)
      : inner_(std::move(inner)), staging_(std::move(staging)), out_(out), count_(count), block_(block) {}
  ~OrderedSumRequest() override { wait(); }
  void wait() override {
    if (done_) return;
    inner_->wait();
    ordered_sum(staging_.data(), count_, block_, block_, out_);
    done_ = true;
  }

 private:
  CommRequestPtr inner_;
  Staging staging_;
  float* out_;
  int count_;
  size_t block_;
  bool done_ = false;
};
}  // namespace

void Communicator::all_gather(const void* send, void* recv, size_t block_bytes) {
  counters_->add(CollKind::AG, int64_t(block_bytes));
  do_all_gather(send, recv, block_bytes);
}

void Communicator::all_to_allv(const void* send, void* recv, const A2ALayout& layout, size_t elem_bytes) {
  check_layout(layout, "all_to_allv");
  MOE_ASSERT(elem_bytes > 0, "all_to_allv: zero element size");
  counters_->add(CollKind::A2A, send_elems(layout) * int64_t(elem_bytes));
  do_all_to_allv(send, recv, layout, elem_bytes);
}

void Communicator::all_reduce_sum(const float* in, float* out, size_t n) {
  counters_->add(CollKind::AR, int64_t(n * sizeof(float)));
  const int W = size();
  // Named for the watchdog (the transport's own wait says all_gather or all_to_allv).
  WatchedWait w("all_reduce_sum", std::to_string(n * sizeof(float)) + " B per rank");
  if (!all_reduce_splits(W, n)) {
    // Every rank's whole vector to every rank, then the rank-order sum: one collective (the
    // latency of a small vector), (W-1)·n floats in.
    Staging staging(size_t(W) * n);
    do_all_gather(in, staging.data(), n * sizeof(float));
    ordered_sum(staging.data(), W, n, n, out);
    return;
  }
  // Rank j sums part j of every rank's vector (in rank order: the same chain of additions per
  // element, so the same bits), then every rank gathers the summed parts: a reduce-scatter and an
  // all-gather, 2·(W-1)/W·n floats in and n + n/W held.
  const size_t part = (n + size_t(W) - 1) / size_t(W);
  auto lo = [&](int j) { return std::min(n, size_t(j) * part); };
  auto len = [&](int j) { return std::min(n, lo(j) + part) - lo(j); };
  const int me = rank();
  const size_t mine = len(me);
  A2ALayout scatter, gather;
  for (int j = 0; j < W; ++j) {
    scatter.send_counts.push_back(int64_t(len(j)));
    scatter.send_offsets.push_back(int64_t(lo(j)));
    scatter.recv_counts.push_back(int64_t(mine));
    scatter.recv_offsets.push_back(int64_t(size_t(j) * mine));
    gather.send_counts.push_back(int64_t(mine));
    gather.send_offsets.push_back(0);
    gather.recv_counts.push_back(int64_t(len(j)));
    gather.recv_offsets.push_back(int64_t(lo(j)));
  }
  Staging staging(size_t(W + 1) * mine);  // every rank's part j, then their sum
  float* sum = staging.data() + size_t(W) * mine;
  do_all_to_allv(in, staging.data(), scatter, sizeof(float));
  ordered_sum(staging.data(), W, mine, mine, sum);
  do_all_to_allv(sum, out, gather, sizeof(float));  // `in` is read by now: out may alias it
}

void Communicator::reduce_scatter_sum(const float* in, float* out, size_t block) {
  counters_->add(CollKind::RS, int64_t(size_t(size()) * block * sizeof(float)));
  Staging staging(size_t(size()) * block);
  WatchedWait w("reduce_scatter_sum", std::to_string(size_t(size()) * block * sizeof(float)) + " B in");
  do_all_to_allv(in, staging.data(), A2ALayout::uniform(size(), int64_t(block)), sizeof(float));
  ordered_sum(staging.data(), size(), block, block, out);
}

CommRequestPtr Communicator::iall_gather(const void* send, void* recv, size_t block_bytes) {
  counters_->add(CollKind::AG, int64_t(block_bytes));
  return do_iall_gather(send, recv, block_bytes);
}

CommRequestPtr Communicator::iall_to_allv(const void* send, void* recv, const A2ALayout& layout,
                                          size_t elem_bytes) {
  check_layout(layout, "iall_to_allv");
  MOE_ASSERT(elem_bytes > 0, "iall_to_allv: zero element size");
  counters_->add(CollKind::A2A, send_elems(layout) * int64_t(elem_bytes));
  return do_iall_to_allv(send, recv, layout, elem_bytes);
}

CommRequestPtr Communicator::ireduce_scatter_sum(const float* in, float* out, size_t block) {
  counters_->add(CollKind::RS, int64_t(size_t(size()) * block * sizeof(float)));
  Staging staging(size_t(size()) * block);
  float* dst = staging.data();  // the vector's buffer moves with it into the request
  auto inner = do_iall_to_allv(in, dst, A2ALayout::uniform(size(), int64_t(block)), sizeof(float));
  return std::make_unique<OrderedSumRequest>(std::move(inner), std::move(staging), out, size(), block);
}

}  // namespace moe
