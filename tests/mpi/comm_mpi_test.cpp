// Collectives on the MPI world (2 or 4 ranks): payloads are tagged with
// (source rank, destination, index) so a misrouted row is caught, and
// reductions are compared bit for bit with the rank-order sum computed locally.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <thread>

#include "moe/comm_tensor.h"
#include "mpi_env.h"

namespace moe::testing {
namespace {

struct Row {
  int32_t src, dst, k;
  bool operator==(const Row&) const = default;
};

// Rows rank s sends to rank j: 1..3 of them, varying with (s, j).
int64_t rows_between(int s, int j) { return (s + 2 * j) % 3 + 1; }

TEST(MpiComm, BackendAndThreadLevel) {
  Communicator& w = world();
  EXPECT_STREQ(w.backend(), "mpi");
  EXPECT_GE(w.size(), 2);
  // Recorded for the capability table; OpenMPI 4.1 provides MULTIPLE.
  EXPECT_NE(w.thread_level(), ThreadLevel::single) << thread_level_name(w.thread_level());
}

// The runtime that initializes MPI ignores SIGPIPE (mpi_comm.cpp, ignore_sigpipe): a write to a dead
// host's socket fails with EPIPE instead of ending this rank before the watchdog names that host.
TEST(MpiComm, SigpipeIsIgnored) {
  world();
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN) << "SIGPIPE still ends the process";
}

TEST(MpiComm, AllGatherInRankOrder) {
  Communicator& w = world();
  std::vector<int32_t> mine(5), all(size_t(5 * w.size()));
  for (int i = 0; i < 5; ++i) mine[size_t(i)] = w.rank() * 1000 + i;
  w.all_gather(mine.data(), all.data(), mine.size() * sizeof(int32_t));
  for (int r = 0; r < w.size(); ++r)
    for (int i = 0; i < 5; ++i) EXPECT_EQ(all[size_t(r * 5 + i)], r * 1000 + i);
}

// Layout with a one-row gap after every block on both sides, so offsets matter.
A2ALayout tagged_layout(const Communicator& w, std::vector<Row>& send, size_t& recv_rows) {
  A2ALayout l;
  int64_t off = 0;
  for (int j = 0; j < w.size(); ++j) {
    l.send_offsets.push_back(off);
    l.send_counts.push_back(rows_between(w.rank(), j));
    for (int64_t k = 0; k < rows_between(w.rank(), j); ++k) send.push_back(Row{w.rank(), j, int32_t(k)});
    send.push_back(Row{-1, -1, -1});
    off += rows_between(w.rank(), j) + 1;
  }
  off = 0;
  for (int i = 0; i < w.size(); ++i) {
    l.recv_offsets.push_back(off);
    l.recv_counts.push_back(rows_between(i, w.rank()));
    off += rows_between(i, w.rank()) + 1;
  }
  recv_rows = size_t(off);
  return l;
}

void expect_tagged(const Communicator& w, const A2ALayout& l, const std::vector<Row>& recv) {
  for (int i = 0; i < w.size(); ++i) {
    for (int64_t k = 0; k < l.recv_counts[size_t(i)]; ++k)
      EXPECT_EQ(recv[size_t(l.recv_offsets[size_t(i)] + k)], (Row{i, w.rank(), int32_t(k)}))
          << "row " << k << " from rank " << i;
    EXPECT_EQ(recv[size_t(l.recv_offsets[size_t(i)] + l.recv_counts[size_t(i)])], (Row{-7, -7, -7}))
        << "gap after rank " << i << " was written";
  }
}

TEST(MpiComm, AllToAllvRoutesTaggedRows) {
  Communicator& w = world();
  std::vector<Row> send;
  size_t n = 0;
  A2ALayout l = tagged_layout(w, send, n);
  std::vector<Row> recv(n, Row{-7, -7, -7});
  w.all_to_allv(send.data(), recv.data(), l, sizeof(Row));
  expect_tagged(w, l, recv);
}

TEST(MpiComm, NonBlockingAllToAllvAndAllGather) {
  Communicator& w = world();
  std::vector<Row> send;
  size_t n = 0;
  A2ALayout l = tagged_layout(w, send, n);
  std::vector<Row> recv(n, Row{-7, -7, -7});
  int32_t mine = 100 + w.rank();
  std::vector<int32_t> all(size_t(w.size()));
  CommRequestPtr a = w.iall_to_allv(send.data(), recv.data(), l, sizeof(Row));
  CommRequestPtr g = w.iall_gather(&mine, all.data(), sizeof(int32_t));
  g->wait();
  a->wait();
  expect_tagged(w, l, recv);
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(all[size_t(r)], 100 + r);
}

std::vector<float> contribution(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = seeded_float(rank, int64_t(i), 7);
  return v;
}

// The expectation, computed locally: rank 0 + rank 1 + ... in f32.
std::vector<float> rank_order_sum(int ranks, size_t n, size_t first, size_t count) {
  std::vector<float> all;
  for (int r = 0; r < ranks; ++r) {
    std::vector<float> c = contribution(r, n);
    all.insert(all.end(), c.begin() + std::ptrdiff_t(first), c.begin() + std::ptrdiff_t(first + count));
  }
  std::vector<float> out(count);
  ordered_sum(all.data(), ranks, count, count, out.data());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Below and above the split (one all-gather; a reduce-scatter and an all-gather from 3 ranks on),
// sizes that do and do not divide by the rank count: the same bits as the rank-order sum.
TEST(MpiComm, AllReduceIsTheRankOrderSumBitForBit) {
  Communicator& w = world();
  const size_t per = sizeof(float) * size_t(std::max(w.size() - 1, 1));
  const size_t split = (Communicator::kSplitAllReduceBytes + per - 1) / per;  // the first n that splits
  EXPECT_EQ(Communicator::all_reduce_splits(w.size(), split), w.size() >= 3);
  EXPECT_FALSE(Communicator::all_reduce_splits(w.size(), split - 1));
  for (size_t n : {size_t(1), size_t(1000), split - 1, split, split + 1, 3 * split + 7}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> in = contribution(w.rank(), n), out(n);
    w.all_reduce_sum(in.data(), out.data(), n);
    EXPECT_TRUE(same_bits(out, rank_order_sum(w.size(), n, 0, n)));
    w.all_reduce_sum(in.data(), in.data(), n);  // in place
    EXPECT_TRUE(same_bits(in, out));
  }
}

TEST(MpiComm, ReduceScatterIsTheRankOrderSumBitForBit) {
  Communicator& w = world();
  const size_t block = 333, n = block * size_t(w.size());
  std::vector<float> in = contribution(w.rank(), n), out(block), out_nb(block);
  w.reduce_scatter_sum(in.data(), out.data(), block);
  std::vector<float> expect = rank_order_sum(w.size(), n, block * size_t(w.rank()), block);
  EXPECT_TRUE(same_bits(out, expect));
  w.ireduce_scatter_sum(in.data(), out_nb.data(), block)->wait();
  EXPECT_TRUE(same_bits(out_nb, expect));
}

// Integer-valued contributions: the exact sum, whatever the rank count.
TEST(MpiComm, ReductionsMatchARankCountIndependentExpectation) {
  Communicator& w = world();
  const size_t n = 64;
  std::vector<float> in(n), out(n);
  for (size_t i = 0; i < n; ++i) in[i] = float((w.rank() + 1) * int(i));
  w.all_reduce_sum(in.data(), out.data(), n);
  const float tri = float(w.size() * (w.size() + 1) / 2);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], tri * float(i));
}

TEST(MpiComm, CountersAgreeAcrossRanksAndSplitReportsToParent) {
  Communicator& w = world();
  w.counters().reset();
  float x = 1, y[8];
  w.all_gather(&x, y, sizeof(float));
  w.all_reduce_sum(&x, y, 1);
  auto sub = w.split(w.rank() % 2, w.rank());
  sub->all_gather(&x, y, sizeof(float));
  EXPECT_EQ(w.counters().get(CollKind::AG).count, 2);
  EXPECT_EQ(w.counters().get(CollKind::AG).bytes, 8);
  EXPECT_EQ(w.counters().get(CollKind::AR).count, 1);
  float counts[2] = {float(w.counters().get(CollKind::AG).count), 0}, all[16];
  w.all_gather(counts, all, sizeof(counts));
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(all[2 * r], 2.0f);
}

TEST(MpiComm, SplitOrdersByKey) {
  Communicator& w = world();
  auto rev = w.split(0, w.size() - w.rank());  // reversed order
  EXPECT_EQ(rev->size(), w.size());
  EXPECT_EQ(rev->rank(), w.size() - 1 - w.rank());
  auto parity = w.split(w.rank() % 2, w.rank());
  EXPECT_EQ(parity->size(), (w.size() + 1 - w.rank() % 2) / 2);
  EXPECT_EQ(parity->rank(), w.rank() / 2);
}

TEST(MpiCommTensor, ScatterAndGatherRowsThroughRoot) {
  Communicator& w = world();
  Tensor full;
  const int64_t n = 7;  // not a multiple of the rank count
  if (w.rank() == 0) {
    full = Tensor(DType::i32, {n, 2});
    for (int64_t i = 0; i < 2 * n; ++i) full.data<int32_t>()[i] = int32_t(i);
  }
  Tensor mine = scatter_rows(w, full, 0);
  const int64_t begin = row_begin(n, w.rank(), w.size());
  ASSERT_EQ(mine.dim(0), row_begin(n, w.rank() + 1, w.size()) - begin);
  for (int64_t i = 0; i < mine.numel(); ++i) EXPECT_EQ(mine.data<int32_t>()[i], int32_t(2 * begin + i));
  Tensor back = gather_rows(w, mine, 0);
  if (w.rank() == 0) {
    EXPECT_TRUE(back.bit_equal(full));
  }
  Tensor b = broadcast_tensor(w, w.rank() == 0 ? full : Tensor(), 0);
  EXPECT_EQ(b.shape(), (Shape{n, 2}));
  EXPECT_EQ(b.data<int32_t>()[13], 13);
}

// The side-engine pattern: a second thread drives its own communicator (a
// split of the world) while the main thread runs collectives on the world.
TEST(MpiComm, TwoThreadsOnTwoCommunicators) {
  Communicator& w = world();
  if (w.thread_level() != ThreadLevel::multiple) GTEST_SKIP() << "MPI_THREAD_MULTIPLE not provided";
  auto side = w.split(0, w.rank());
  const size_t block = 64, n = block * size_t(w.size());
  std::vector<float> in = contribution(w.rank(), n), rs(block);
  std::vector<float> expect = rank_order_sum(w.size(), n, block * size_t(w.rank()), block);
  int side_ok = 0;
  std::thread t([&] {
    for (int it = 0; it < 20; ++it) {
      side->ireduce_scatter_sum(in.data(), rs.data(), block)->wait();
      side_ok += same_bits(rs, expect) ? 1 : 0;
    }
  });
  int main_ok = 0;
  for (int it = 0; it < 20; ++it) {
    int32_t me = w.rank() + it;
    std::vector<int32_t> all(size_t(w.size()));
    w.all_gather(&me, all.data(), sizeof(me));
    main_ok += all[size_t(w.size() - 1)] == w.size() - 1 + it ? 1 : 0;
  }
  t.join();
  EXPECT_EQ(side_ok, 20);
  EXPECT_EQ(main_ok, 20);
}

// Polite waits (the side engine's communicators) move the same bytes: tagged
// rows land where the spinning wait puts them, reductions keep their bits,
// and a split inherits the mode.
TEST(MpiComm, PoliteWaitsGiveTheSameResults) {
  Communicator& w = world();
  auto polite = w.split(0, w.rank());
  polite->set_polite_waits(true);
  EXPECT_TRUE(polite->split(0, w.rank())->polite_waits());
  EXPECT_FALSE(w.polite_waits());
  std::vector<Row> send;
  size_t n = 0;
  A2ALayout l = tagged_layout(w, send, n);
  std::vector<Row> recv(n, Row{-7, -7, -7});
  polite->all_to_allv(send.data(), recv.data(), l, sizeof(Row));
  expect_tagged(w, l, recv);
  std::fill(recv.begin(), recv.end(), Row{-7, -7, -7});
  polite->iall_to_allv(send.data(), recv.data(), l, sizeof(Row))->wait();
  expect_tagged(w, l, recv);
  const size_t block = 48, m = block * size_t(w.size());
  std::vector<float> in = contribution(w.rank(), m), rs(block);
  polite->reduce_scatter_sum(in.data(), rs.data(), block);
  EXPECT_TRUE(same_bits(rs, rank_order_sum(w.size(), m, block * size_t(w.rank()), block)));
  int32_t me = 10 + w.rank();
  std::vector<int32_t> all(size_t(w.size()));
  polite->all_gather(&me, all.data(), sizeof(me));
  for (int r = 0; r < w.size(); ++r) EXPECT_EQ(all[size_t(r)], 10 + r);
}

}  // namespace
}  // namespace moe::testing
