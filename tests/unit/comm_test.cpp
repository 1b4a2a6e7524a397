// SingleProcessComm semantics and the collective counters.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "comm/machines.h"
#include "moe/comm.h"
#include "moe/comm_tensor.h"

namespace moe {
namespace {

TEST(SingleProcessComm, IdentityAndThreadLevel) {
  auto c = make_single_process_comm();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_STREQ(c->backend(), "single");
  EXPECT_EQ(c->thread_level(), ThreadLevel::multiple);
  c->barrier();
}

TEST(SingleProcessComm, CollectivesAreCopies) {
  auto c = make_single_process_comm();
  std::vector<float> in = {1.5f, -2.0f, 3.25f}, out(3, 0.0f);
  c->all_gather(in.data(), out.data(), 3 * sizeof(float));
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), 0.0f);
  c->all_reduce_sum(in.data(), out.data(), 3);
  EXPECT_EQ(out, in);
  c->reduce_scatter_sum(in.data(), out.data(), 3);
  EXPECT_EQ(out, in);
  // all_to_allv honours offsets: send elements [1, 3) to position 2 of recv.
  std::vector<int32_t> src = {9, 7, 8}, dst(4, 0);
  A2ALayout l{{2}, {1}, {2}, {2}};
  c->all_to_allv(src.data(), dst.data(), l, sizeof(int32_t));
  EXPECT_EQ(dst, (std::vector<int32_t>{0, 0, 7, 8}));
  // Broadcast / gatherv / scatterv with root 0.
  c->broadcast(src.data(), 12, 0);
  std::vector<int32_t> g(3);
  c->gatherv(src.data(), 12, g.data(), {12}, 0);
  EXPECT_EQ(g, src);
  c->scatterv(src.data(), {12}, g.data(), 12, 0);
  EXPECT_EQ(g, src);
}

TEST(SingleProcessComm, BadArgumentsAreErrors) {
  auto c = make_single_process_comm();
  int32_t x = 0;
  EXPECT_THROW(c->broadcast(&x, 4, 1), Error);
  EXPECT_THROW(c->all_to_allv(&x, &x, A2ALayout{{1}, {0}, {2}, {0}}, 4), Error);
  EXPECT_THROW(c->all_to_allv(&x, &x, A2ALayout{{1, 1}, {0, 0}, {1, 1}, {0, 0}}, 4), Error);
  EXPECT_THROW(c->all_to_allv(&x, &x, A2ALayout{{-1}, {0}, {-1}, {0}}, 4), Error);
  EXPECT_THROW(c->split(-1, 0), Error);
}

TEST(SingleProcessComm, NonBlockingCompleteOnWait) {
  auto c = make_single_process_comm();
  std::vector<float> in = {1, 2, 3, 4}, out(4, 0);
  auto r1 = c->iall_gather(in.data(), out.data(), 16);
  r1->wait();
  EXPECT_EQ(out, in);
  std::vector<float> rs(4, 0);
  auto r2 = c->ireduce_scatter_sum(in.data(), rs.data(), 4);
  r2->wait();
  r2->wait();  // idempotent
  EXPECT_EQ(rs, in);
  std::vector<float> a2a(4, 0);
  c->iall_to_allv(in.data(), a2a.data(), A2ALayout::uniform(1, 4), 4)->wait();
  EXPECT_EQ(a2a, in);
}

// Size-1 collectives count (like MaxText's HLO op counts), sub-communicators
// report into the parent's counters, and setup traffic does not count.
// Which collectives wait politely: all with set_polite_waits(true); with a threshold, those sending
// that many bytes to the other ranks or more. Inherited by split(); the single process never
// communicates (and never finds several hosts).
TEST(SingleProcessComm, PoliteWaitsFromAThreshold) {
  auto c = make_single_process_comm();
  EXPECT_FALSE(c->polite_for(size_t(1) << 30));
  c->set_polite_waits_from(4096);
  EXPECT_EQ(c->polite_waits_from(), 4096u);
  EXPECT_FALSE(c->polite_for(4095));
  EXPECT_TRUE(c->polite_for(4096));
  EXPECT_EQ(c->split(0, 0)->polite_waits_from(), 4096u);
  c->set_polite_waits_from(0);
  EXPECT_FALSE(c->polite_for(size_t(1) << 30));
  c->set_polite_waits(true);
  EXPECT_TRUE(c->polite_for(0));
  EXPECT_EQ(shared_core_polite_bytes(*c), 0u);
  EXPECT_FALSE(spans_hosts(*c));
}

TEST(CommCounters, CountEveryCollectiveIncludingSizeOne) {
  auto c = make_single_process_comm();
  std::vector<float> buf(8, 1.0f), out(8);
  c->all_gather(buf.data(), out.data(), 32);
  c->all_reduce_sum(buf.data(), out.data(), 8);
  c->reduce_scatter_sum(buf.data(), out.data(), 8);
  c->all_to_allv(buf.data(), out.data(), A2ALayout::uniform(1, 2), 4);
  auto sub = c->split(0, 0);
  sub->all_gather(buf.data(), out.data(), 4);
  c->iall_gather(buf.data(), out.data(), 4)->wait();
  c->broadcast(buf.data(), 32, 0);
  c->barrier();
  const CommCounters& k = c->counters();
  EXPECT_EQ(k.get(CollKind::AG).count, 3);
  EXPECT_EQ(k.get(CollKind::AG).bytes, 40);
  EXPECT_EQ(k.get(CollKind::AR).count, 1);
  EXPECT_EQ(k.get(CollKind::AR).bytes, 32);
  EXPECT_EQ(k.get(CollKind::RS).bytes, 32);
  EXPECT_EQ(k.get(CollKind::A2A).bytes, 8);
  EXPECT_EQ(k.get(CollKind::SO).count, 0);
  c->counters().add(CollKind::SO, 0);
  EXPECT_EQ(sub->counters().get(CollKind::SO).count, 1);
  EXPECT_NE(k.summary().find("AG 3 (40 B)"), std::string::npos);
  c->counters().reset();
  EXPECT_EQ(k.get(CollKind::AG).count, 0);
  EXPECT_EQ(k.get(CollKind::AG).bytes, 0);
}

TEST(OrderedSum, AddsSequentiallyInRankOrder) {
  // (1e8 + 1) + -1e8 = 0 in f32 sequentially, while 1 + (1e8 + -1e8) = 1.
  const float blocks[3] = {1e8f, 1.0f, -1e8f};
  float out = -1;
  ordered_sum(blocks, 3, 1, 1, &out);
  EXPECT_EQ(out, 0.0f);
}

TEST(World, SingleProcessWithoutLauncher) {
  if (launched_by_mpi()) GTEST_SKIP() << "running under a launcher";
  auto w = make_world_comm();
  EXPECT_EQ(w->size(), 1);
  EXPECT_STREQ(w->backend(), "single");
#ifdef MOE_HAVE_MPI
  EXPECT_TRUE(mpi_compiled_in());
#else
  EXPECT_FALSE(mpi_compiled_in());
#endif
}

TEST(World, LauncherDetectionReadsEnvironment) {
  if (launched_by_mpi()) GTEST_SKIP() << "running under a launcher";
  ::setenv("PMIX_RANK", "0", 1);
  EXPECT_TRUE(launched_by_mpi());
  ::unsetenv("PMIX_RANK");
  EXPECT_FALSE(launched_by_mpi());
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

TEST(CommTensor, SingleProcessRoundTripsAndRowSplit) {
  auto c = make_single_process_comm();
  Tensor t(DType::bf16, {5, 3});
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bf16>()[i] = to_bf16(float(i));
  EXPECT_TRUE(scatter_rows(*c, t, 0).bit_equal(t));
  EXPECT_TRUE(gather_rows(*c, t, 0).bit_equal(t));
  EXPECT_TRUE(broadcast_tensor(*c, t, 0).bit_equal(t));
  EXPECT_EQ(row_begin(10, 1, 4), 2);
  EXPECT_EQ(row_begin(10, 4, 4), 10);
  EXPECT_EQ(c->counters().get(CollKind::AG).count, 0);  // file I/O is not counted
}

}  // namespace
}  // namespace moe
