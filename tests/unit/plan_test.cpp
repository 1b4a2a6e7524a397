// moe plan's cost formulas against hand-computed cases (docs/distributed.md,
// "Model of scale"): the cluster string, groups on hosts, the α–β cost of each
// collective algorithm, the schedule's overlap/exposed arithmetic, the
// ranking, and the rates file.
#include <gtest/gtest.h>

#include <cmath>

#include "moe/comm.h"
#include "moe/error.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/collectives.h"
#include "plan/ranking.h"
#include "plan/rates.h"
#include "plan/step_model.h"

namespace moe::plan {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PlanCluster, ParsesEveryItemWithUnits) {
  Cluster c = parse_cluster(
      "hosts=16,cores=32,ranks_per_host=4,inter_bw=10Gbit,inter_lat=20us,intra_bw=20GB/s,intra_lat=500ns");
  EXPECT_EQ(c.hosts, 16);
  EXPECT_EQ(c.ranks(), 64);
  EXPECT_DOUBLE_EQ(c.cores_per_rank(), 8.0);
  EXPECT_DOUBLE_EQ(c.inter.bw_Bps, 1.25e9);
  EXPECT_DOUBLE_EQ(c.inter.lat_s, 20e-6);
  EXPECT_DOUBLE_EQ(c.intra.bw_Bps, 20e9);
  EXPECT_DOUBLE_EQ(c.intra.lat_s, 500e-9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("x", "800Mbit"), 1e8);
  EXPECT_DOUBLE_EQ(parse_duration("x", "1.5ms"), 1.5e-3);
  EXPECT_DOUBLE_EQ(parse_cluster("cores=2,ranks_per_host=4").cores_per_rank(), 0.5);  // oversubscribed
  EXPECT_DOUBLE_EQ(c.inter.a2a_bw_Bps, 0.0);  // not given: the all-to-alls' NIC bandwidth is inter_bw
  EXPECT_DOUBLE_EQ(c.inter.many_peers_bw(), 1.25e9);
  const Cluster a = parse_cluster("hosts=2,inter_bw=1Gbit,inter_a2a_bw=400Mbit");
  EXPECT_DOUBLE_EQ(a.inter.a2a_bw_Bps, 5e7);
  EXPECT_NE(format_cluster(a).find("inter all-to-all 0.4 Gbit/s"), std::string::npos) << format_cluster(a);
}

TEST(PlanCluster, BadItemsNameTheItem) {
  EXPECT_NE(
      error_of([] { parse_cluster("hosts=2,inter_bw=10Gbps"); }).find("inter_bw=10Gbps: unknown unit 'Gbps'"),
      std::string::npos);
  EXPECT_NE(error_of([] { parse_cluster("hosts=0"); }).find("hosts=0: expected a positive integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_cluster("nodes=4"); }).find("unknown item 'nodes'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_cluster("hosts"); }).find("item 'hosts': expected key=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_cluster("hosts=2"); }).find("needs inter_bw"), std::string::npos);
  EXPECT_NE(error_of([] { parse_cluster("inter_lat=fast"); }).find("inter_lat=fast: expected a number"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_cluster("inter_a2a_bw=1Gbit"); }).find("inter_a2a_bw needs inter_bw"),
            std::string::npos);
}

TEST(PlanGroups, PlacementOnHosts) {
  Group ep = make_group(4, 1, 4);  // expert axis, 4 ranks per host: inside one host
  EXPECT_EQ(ep.p_local, 4);
  EXPECT_EQ(ep.hosts(), 1);
  EXPECT_EQ(ep.sharing, 1);
  Group fs = make_group(8, 4, 4);  // fsdp at stride EP=4: one member per host, 4 groups share each NIC
  EXPECT_EQ(fs.p_local, 1);
  EXPECT_EQ(fs.hosts(), 8);
  EXPECT_EQ(fs.sharing, 4);
  Group g = make_group(8, 2, 4);  // stride 2: 2 members per host, 2 groups per host
  EXPECT_EQ(g.p_local, 2);
  EXPECT_EQ(g.hosts(), 4);
  EXPECT_EQ(g.sharing, 2);
}

const Link kIntra{1e9, 1e-6};      // 1 GB/s, 1 us
const Link kInter{1.25e9, 10e-6};  // 10 Gbit/s, 10 us

TEST(PlanCollectives, FlatAllToAllOneHost) {
  // P=4, n=4 MB: 3 messages of 1 MB through shared memory.
  Cost c = all_to_all(A2AAlgo::flat, make_group(4, 1, 4), 4e6, kIntra, kInter);
  EXPECT_DOUBLE_EQ(c.alpha_s, 3e-6);
  EXPECT_DOUBLE_EQ(c.beta_s, 3e-3);
  // Hierarchical inside one host is the flat one.
  Cost h = all_to_all(A2AAlgo::hierarchical, make_group(4, 1, 4), 4e6, kIntra, kInter);
  EXPECT_DOUBLE_EQ(h.total(), c.total());
  EXPECT_DOUBLE_EQ(all_to_all(A2AAlgo::flat, make_group(1, 1, 4), 4e6, kIntra, kInter).total(), 0.0);
}

TEST(PlanCollectives, FlatAndHierarchicalAcrossHosts) {
  // P=8 over 4 hosts, 2 per host (2 ranks per host: one group per NIC), n=8 MB.
  Group g = make_group(8, 1, 2);
  ASSERT_EQ(g.p_local, 2);
  ASSERT_EQ(g.sharing, 1);
  Cost f = all_to_all(A2AAlgo::flat, g, 8e6, kIntra, kInter);
  EXPECT_NEAR(f.alpha_s, 1 * 1e-6 + 6 * 10e-6, 1e-15);  // 1 local peer, 6 remote
  // 1 MB local, 6 MB through the NIC, which carries the other local member's 6 MB at the same time.
  EXPECT_NEAR(f.beta_s, 1e6 / 1e9 + 2 * 6e6 / 1.25e9, 1e-15);
  Cost h = all_to_all(A2AAlgo::hierarchical, g, 8e6, kIntra, kInter);
  EXPECT_NEAR(h.alpha_s, 1 * 1e-6 + 3 * 10e-6, 1e-15);  // 1 local peer, then 3 other hosts on the lane
  // Half the rows move inside the host; both local lanes cross the NIC at once.
  EXPECT_NEAR(h.beta_s, 4e6 / 1e9 + 2 * 8e6 * 0.75 / 1.25e9, 1e-15);
  // Latency-bound (small n, many hosts): hierarchical wins; bandwidth-bound with a slow intra link: flat.
  Group wide = make_group(256, 1, 8);
  EXPECT_LT(all_to_all(A2AAlgo::hierarchical, wide, 1e4, kIntra, kInter).total(),
            all_to_all(A2AAlgo::flat, wide, 1e4, kIntra, kInter).total());
  const Link slow{1e8, 1e-6};
  EXPECT_GT(all_to_all(A2AAlgo::hierarchical, make_group(8, 1, 2), 8e6, slow, kInter).total(),
            all_to_all(A2AAlgo::flat, make_group(8, 1, 2), 8e6, slow, kInter).total());
  // The NIC's many-streams bandwidth (inter_a2a_bw: 0.5 GB/s here) where a rank sends to more than
  // one other host's ranks: the flat one's 6 remote peers and the hierarchical lanes' 3 other hosts.
  Link many = kInter;
  many.a2a_bw_Bps = 0.5e9;
  EXPECT_NEAR(all_to_all(A2AAlgo::flat, g, 8e6, kIntra, many).beta_s, 1e6 / 1e9 + 2 * 6e6 / 0.5e9, 1e-15);
  EXPECT_NEAR(all_to_all(A2AAlgo::hierarchical, g, 8e6, kIntra, many).beta_s, 4e6 / 1e9 + 2 * 8e6 * 0.75 / 0.5e9,
              1e-15);
  // One remote peer (2 hosts, one member each): a stream per pair of hosts, at inter_bw.
  const Group pair = make_group(2, 2, 2);
  ASSERT_EQ(pair.p_local, 1);
  EXPECT_DOUBLE_EQ(all_to_all(A2AAlgo::flat, pair, 8e6, kIntra, many).total(),
                   all_to_all(A2AAlgo::flat, pair, 8e6, kIntra, kInter).total());
  // The gathers are pairwise steps: never at the many-streams bandwidth.
  EXPECT_DOUBLE_EQ(ring_all_gather(make_group(4, 4, 4), 1e6, kIntra, many).total(),
                   ring_all_gather(make_group(4, 4, 4), 1e6, kIntra, kInter).total());
}

TEST(PlanCollectives, RingAllGatherAndReduceScatter) {
  // One host, P=4, 1 MB blocks: 3 steps of (1 us + 1 ms).
  Cost c = ring_all_gather(make_group(4, 1, 4), 1e6, kIntra, kInter);
  EXPECT_NEAR(c.total(), 3 * (1e-6 + 1e-3), 1e-15);
  // Across 4 hosts, one member per host, 4 rings share each NIC: 3 steps of (10 us + 4 MB / 1.25 GB/s).
  Cost x = ring_all_gather(make_group(4, 4, 4), 1e6, kIntra, kInter);
  EXPECT_NEAR(x.total(), 3 * (10e-6 + 4e6 / 1.25e9), 1e-15);
  EXPECT_DOUBLE_EQ(ring_reduce_scatter(make_group(4, 4, 4), 1e6, kIntra, kInter).total(), x.total());
}

TEST(PlanCollectives, RecursiveDoublingAndTheLibrarysChoice) {
  // One host, P=8: 3 steps, 7 blocks.
  Cost rd = rd_all_gather(make_group(8, 1, 8), 1e3, kIntra, kInter);
  EXPECT_NEAR(rd.total(), 3e-6 + 7e3 / 1e9, 1e-15);
  // Small blocks: recursive doubling (3 α instead of 7); MPI_Allgather takes it.
  EXPECT_DOUBLE_EQ(all_gather(make_group(8, 1, 8), 1e3, kIntra, kInter).total(), rd.total());
  // Across 8 hosts with 4 ranks per host: RD's inter steps carry every local member's data at once.
  Group g = make_group(8, 4, 4);
  Cost rdx = rd_all_gather(g, 1e6, kIntra, kInter);
  EXPECT_NEAR(rdx.beta_s, 1e6 * 7 / (1.25e9 / 4), 1e-12);
  EXPECT_NEAR(rdx.alpha_s, 3 * 10e-6, 1e-15);
}

// Rates with round numbers: 1 GFLOP/s everywhere, 1 GB/s everywhere, no side hand-off.
Rates round_rates() {
  Rates r;
  r.gemm.push_back({DType::bf16, 64, 32, 1, 1, 1, 1});
  r.router_gflops = r.router_backward_gflops = 1;
  r.sort_ns_per_row = 1;
  r.permute_gbps = r.combine_gbps = r.combine_backward_gbps = r.permute_backward_gbps = r.memcpy_gbps = 1;
  r.intra = kIntra;
  r.side_op_overhead_us = 0;
  return r;
}

LayerShape small_layer() { return {"t", 64, 64, 32, 8, 2, DType::bf16, DType::bf16}; }

TEST(PlanStep, OneRankIsTheSumOfItsOps) {
  const Rates r = round_rates();
  const LayerShape L = small_layer();
  Cluster cl;
  cl.cores = 1;
  const Prediction p = predict_step(L, Layout{}, cl, r);
  const double T = 64, D = 64, F = 32, E = 8, R = 128, b = 2;
  const double expect = 2 * T * D * E * 1e-9 + R * 1e-9 + 2 * R * D * b * 1e-9 + 6 * R * D * F * 1e-9 +
                        (R + T) * D * b * 1e-9 + 2 * R * D * b * 1e-9 + 6 * R * D * F * 1e-9 +
                        (R * D * b + T * D * 4) * 1e-9 + 6 * R * D * F * 1e-9 + 4 * T * D * E * 1e-9 +
                        (E * 24 + 40) / 1e9 * 0;  // stats: P=1 costs 0
  EXPECT_NEAR(p.step_s, expect, 1e-12);
  EXPECT_NEAR(p.compute_s, expect, 1e-12);
  EXPECT_DOUBLE_EQ(p.exposed_comm_s, 0.0);
  // Half a core: every compute op takes twice as long.
  cl.cores = 0.5;
  EXPECT_NEAR(predict_step(L, Layout{}, cl, r).step_s, 2 * expect, 1e-12);
}

TEST(PlanStep, InlineCollectivesAreExposedAndStepIsComputePlusExposed) {
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 2;  // one core per rank
  Layout ep2;
  ep2.expert = 2;
  const Prediction p = predict_step(small_layer(), ep2, cl, r);
  EXPECT_NEAR(p.step_s, p.compute_s + p.exposed_comm_s, 1e-12);
  // Every collective inline: exposed = their α–β costs + the router AR's ordered sum (2 copies of
  // D·E f32 read, one written, at 1 GB/s).
  EXPECT_NEAR(p.exposed_comm_s, p.comm_s + 3 * 64 * 8 * 4 / 1e9, 1e-12);
  // Four A2As of R·D·2 bytes over 2 ranks: each (α + n/2/β).
  const double n = 128 * 64 * 2;
  EXPECT_NEAR(p.terms.at("A2A"), 4 * (1e-6 + n / 2 / 1e9), 1e-12);
}

// The expert gradients' all-reduce over data=4 (Communicator::all_reduce_sum): below the split an
// all-gather of the whole gradient and the sum of all 4 copies on every rank; from it, an
// all-to-all of quarters, the sum of 4 quarters, an all-gather of the quarters.
TEST(PlanStep, ExpertGradientAllReduceSplitsFromItsSize) {
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 4, cl.ranks_per_host = 4;  // one core per rank: speed 1
  Layout d4;
  d4.data = 4;
  const Group g = make_group(4, 1, 4);
  auto term = [&](int64_t D) {
    LayerShape L = small_layer();
    L.D = D;
    return predict_step(L, d4, cl, r).terms.at("grad:experts");
  };
  // D = 16: 8 experts x 16 x 32 f32 = 16 KiB per weight, 48 KiB for the all-gather: under the split.
  const double small = 8.0 * 16 * 32 * 4;
  ASSERT_FALSE(Communicator::all_reduce_splits(4, size_t(small / 4)));
  EXPECT_NEAR(term(16), 3 * (all_gather(g, small, kIntra, {}).total() + (4 * small + small) / 1e9), 1e-12);
  // D = 2048: 2 MiB per weight, 6 MiB for the all-gather.
  const double big = 8.0 * 2048 * 32 * 4;
  ASSERT_TRUE(Communicator::all_reduce_splits(4, size_t(big / 4)));
  const double split = all_to_all(A2AAlgo::flat, g, big, kIntra, {}).total() +
                       all_gather(g, big / 4, kIntra, {}).total() + (big + big / 4) / 1e9;
  EXPECT_NEAR(term(2048), 3 * split, 1e-12);
  // Against the one all-gather it replaces: 3/4 of the bytes in twice, not 3 whole copies, and a
  // quarter of the sums.
  EXPECT_LT(split, all_gather(g, big, kIntra, {}).total() + (4 * big + big) / 1e9);
}

// The network stack's CPU of that all-reduce across hosts: below the split each rank sends its whole
// gradient to each of the G-1 others; from it, (G-1)/G of it in the all-to-all and as much again in
// the all-gather. data=G on G one-core hosts, so the CPU moves nothing else (a core per rank) and
// the only collectives with CPU are the three expert gradients' all-reduces.
TEST(PlanStep, AllReduceAcrossHostsCountsTheBytesEachRankSends) {
  auto cpu_of_ar = [](int G, int64_t D) {
    Cluster cl;
    cl.hosts = G, cl.cores = 1, cl.ranks_per_host = 1;
    cl.inter.bw_Bps = 1e9, cl.inter.lat_s = 20e-6;
    Layout l;
    l.data = G;
    Rates with = round_rates(), without = round_rates();
    with.comm_cpu_ns_per_byte = 10, without.comm_cpu_ns_per_byte = 0;
    LayerShape L = small_layer();
    L.D = D;
    return predict_step(L, l, cl, with).cpu_s - predict_step(L, l, cl, without).cpu_s;
  };
  const double small = 8.0 * 16 * 32 * 4, big = 8.0 * 2048 * 32 * 4;  // one weight's f32 gradient
  ASSERT_FALSE(Communicator::all_reduce_splits(4, size_t(small / 4)));
  EXPECT_NEAR(cpu_of_ar(2, 16), 3 * small * 10e-9, 1e-15);
  EXPECT_NEAR(cpu_of_ar(4, 16), 3 * 3 * small * 10e-9, 1e-15);
  ASSERT_TRUE(Communicator::all_reduce_splits(4, size_t(big / 4)));
  EXPECT_NEAR(cpu_of_ar(4, 2048), 3 * 2 * (big * 3 / 4) * 10e-9, 1e-12);
}

// Offloaded FSDP gradients go back as reduce_to_shard: each member's shard packed out of the full
// gradient (one copy of it), one all-to-all of shards, then the rank-order sum of the G shards.
TEST(PlanStep, OffloadedGradientReduceScatterPacksSendsAndSums) {
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 8, cl.ranks_per_host = 4, cl.threads = 1;  // a spare core per rank, speed 1
  Layout f4;
  f4.fsdp = 4, f4.off_fsdp = true;
  ModelOptions o;
  o.steal = 0;
  const LayerShape L = small_layer();
  const Prediction p = predict_step(L, f4, cl, r, o);
  const double full = 8.0 * 64 * 32 * 4, shard = full / 4;  // one weight's f32 gradient, its shard
  const Group g = make_group(4, 1, 4);
  const double one = all_to_all(A2AAlgo::flat, g, full, kIntra, {}).total() + full / 1e9 + (full + shard) / 1e9;
  EXPECT_NEAR(p.terms.at("grad:experts"), 3 * one, 1e-12);
  // wo's gradient first (a third of the FLOPs), its reduce-scatter on the side engine while wi's
  // two are computed, then theirs.
  std::vector<const SimOp*> wg, rs;
  for (const SimOp& op : p.ops) {
    if (op.name == "weight_grads") wg.push_back(&op);
    if (op.name.rfind("RS:grad.", 0) == 0 && op.side) rs.push_back(&op);
  }
  ASSERT_EQ(wg.size(), 2u);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_NEAR(2 * (wg[0]->end - wg[0]->start), wg[1]->end - wg[1]->start, 1e-12);
  EXPECT_NEAR(wg[0]->end - wg[0]->start + wg[1]->end - wg[1]->start, p.terms.at("weight_grads"), 1e-12);
  EXPECT_EQ(rs[0]->name, "RS:grad.experts.wo");
  EXPECT_GE(rs[0]->start, wg[0]->end);
  EXPECT_LT(rs[0]->start, wg[1]->end);
  EXPECT_GE(rs[1]->start, rs[0]->end);  // one side engine: in the order submitted
  // Inline, the gradients are computed in one op and reduced after it.
  f4.off_fsdp = false;
  int inline_wg = 0;
  for (const SimOp& op : predict_step(L, f4, cl, r, o).ops) inline_wg += op.name == "weight_grads";
  EXPECT_EQ(inline_wg, 1);
}

TEST(PlanStep, BusiestRanksRowsTimeTheExpertOps) {
  // EP=2, one chunk: the busiest rank's experts get 160 rows instead of T·K = 128; the expert ops
  // (FFN, its backward with the local sort's copies, weight gradients) grow by the 32 rows, nothing else.
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 2;
  Layout ep2;
  ep2.expert = 2;
  LayerShape L = small_layer();
  const Prediction u = predict_step(L, ep2, cl, r);
  L.busiest_chunk_rows = {160};
  L.busiest_step_rows = 160;
  const Prediction b = predict_step(L, ep2, cl, r);
  const double D = 64, F = 32, dr = 32, bytes = 2;
  EXPECT_NEAR(b.terms.at("weight_grads") - u.terms.at("weight_grads"), 6 * dr * D * F * 1e-9, 1e-12);
  EXPECT_NEAR(b.terms.at("ffn_backward") - u.terms.at("ffn_backward"),
              6 * dr * D * F * 1e-9 + 3 * dr * D * bytes * 1e-9, 1e-12);
  EXPECT_NEAR(b.terms.at("ffn") - u.terms.at("ffn"), 6 * dr * D * F * 1e-9 + 3 * dr * D * bytes * 1e-9,
              1e-12);
  EXPECT_DOUBLE_EQ(b.terms.at("permute"), u.terms.at("permute"));  // this rank's own tokens: unchanged
  // Rows for another number of chunks than the layout's: uniform routing.
  Layout c4 = ep2;
  c4.chunks = 4;
  EXPECT_DOUBLE_EQ(predict_step(L, c4, cl, r).step_s, predict_step(small_layer(), c4, cl, r).step_s);
}

TEST(PlanStep, SideEngineOverlapHandComputed) {
  // fsdp=2, weights gathered on the side engine while the router, sort and permute run; the FFN
  // waits for wi_1 (up) and wo (down). No casts (bf16 weights), no steal, no hand-off.
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 4, cl.ranks_per_host = 2, cl.threads = 1;  // a spare core per rank, speed 1
  Layout l;
  l.fsdp = 2;
  l.off_fsdp = true;
  ModelOptions o;
  o.steal = 0;
  const LayerShape L = small_layer();
  const Prediction p = predict_step(L, l, cl, r, o);
  const double T = 64, D = 64, F = 32, E = 8, R = 128, b = 2;
  const double shard = 8 * D * F / 2 * b;                      // one weight's shard, bf16
  const double ag = 1e-6 + shard / 1e9 + 2 * shard * 2 / 1e9;  // ring step + placement copy
  const double before = 2 * T * D * E * 1e-9 + (1e-6 + (E * 24 + 40) / 1e9) + R * 1e-9 + 2 * R * D * b * 1e-9;
  ASSERT_GT(2 * ag, before);  // the FFN waits for wi_1
  const double ffn = 6 * R * D * F * 1e-9;
  // ffn part 1 starts at 2·ag, then waits for wo (3·ag) if not there yet.
  const double t_wo = std::max(2 * ag + ffn * 2 / 3, 3 * ag);
  const double expect_wait = (2 * ag - before) + std::max(0.0, 3 * ag - (2 * ag + ffn * 2 / 3));
  EXPECT_NEAR(p.exposed.at("AG:weights"), expect_wait, 1e-12);
  double rest = ffn / 3 + (R + T) * D * b * 1e-9;  // wo GEMM, combine
  // The forward ends at t_wo + rest; the backward adds only compute and the gradient RSs.
  double fwd_end = 0;
  for (const SimOp& op : p.ops)
    if (op.name == "combine") fwd_end = op.end;
  EXPECT_NEAR(fwd_end, t_wo + rest, 1e-12);
  // Without offload the gathers are inline: all 3 exposed in full.
  l.off_fsdp = false;
  const Prediction q = predict_step(L, l, cl, r, o);
  EXPECT_NEAR(q.exposed.at("AG:weights"), 3 * ag, 1e-12);
  EXPECT_LT(p.exposed_comm_s, q.exposed_comm_s);
}

// Without a core to spare (a core or less per rank), an offloaded collective inside one host is all
// copies on the rank's own core share: it runs as inline (measured no faster offloaded there).
// Across hosts it still runs beside the compute.
TEST(PlanStep, NoSpareCoreRunsHostLocalOffloadInline) {
  const Rates r = round_rates();
  Layout l;
  l.fsdp = 2;
  ModelOptions o;
  o.steal = 0;
  const LayerShape L = small_layer();
  Cluster one;
  one.cores = 2, one.ranks_per_host = 2;  // one core per rank
  const Prediction inl = predict_step(L, l, one, r, o);
  l.off_fsdp = true;
  const Prediction off = predict_step(L, l, one, r, o);
  for (const SimOp& op : off.ops) EXPECT_FALSE(op.side) << op.name;
  EXPECT_NEAR(off.exposed.at("AG:weights"), inl.exposed.at("AG:weights"), 1e-15);
  EXPECT_DOUBLE_EQ(off.side_busy_s, 0);
  Cluster spare = one;
  spare.cores = 4, spare.threads = 1;  // the same with a spare core: beside the compute
  int side = 0;
  for (const SimOp& op : predict_step(L, l, spare, r, o).ops) side += op.side;
  EXPECT_EQ(side, 6);  // 3 gathers, 3 gradient reduce-scatters
  Cluster across;
  across.hosts = 2, across.cores = 1, across.ranks_per_host = 1;  // one core per rank, fsdp across hosts
  across.inter.bw_Bps = 1e9, across.inter.lat_s = 1e-6;
  side = 0;
  for (const SimOp& op : predict_step(L, l, across, r, o).ops) side += op.side;
  EXPECT_EQ(side, 6);
}

TEST(PlanStep, StealStretchesComputeUnderSideWork) {
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 3, cl.ranks_per_host = 2, cl.threads = 1;  // 1.5 cores per rank: the side ops run beside
  Layout l;
  l.expert = 2, l.chunks = 4, l.off_ep = true;
  ModelOptions none, full;
  none.steal = 0, full.steal = 1;
  const Prediction a = predict_step(small_layer(), l, cl, r, none),
                   b = predict_step(small_layer(), l, cl, r, full);
  EXPECT_GT(b.compute_s, a.compute_s);
  EXPECT_LE(b.compute_s - a.compute_s, b.side_busy_s + 1e-12);  // at most the side engine's work
}

// A side op's CPU work shares the rank's core with the compute thread: while the compute thread
// computes, the op takes 1 + steal x (its CPU seconds / its cost) times its cost; once the compute
// thread blocks on it, the rest runs at full speed. Two chunks' routing index math offloaded
// (64 routed rows each: 64 ns of one core, all CPU), one rank on one core, no hand-off.
TEST(PlanStep, SideOpsShareTheCoreWithTheComputeThread) {
  const Rates r = round_rates();
  Cluster cl;
  cl.cores = 1;
  Layout l;
  l.chunks = 2, l.off_sort = true;
  const LayerShape L = small_layer();
  auto sorts = [&](double steal) {
    ModelOptions o;
    o.steal = steal;
    const Prediction p = predict_step(L, l, cl, r, o);
    std::vector<SimOp> s;
    for (const SimOp& op : p.ops)
      if (op.name == "sort" || op.name == "permute") s.push_back(op);
    return s;
  };
  const double t0 = 2.0 * 64 * 64 * 8 * 1e-9;  // the router (AG:aux_stats of one rank costs 0)
  const double sort = 64e-9, permute = 2.0 * 64 * 64 * 2 * 1e-9;
  const std::vector<SimOp> a = sorts(1);
  ASSERT_EQ(a.size(), 4u);  // sort, sort, permute, permute
  // Chunk 0's sort: the compute thread blocks on it at once, so it runs at full speed.
  EXPECT_NEAR(a[0].start, t0, 1e-15);
  EXPECT_NEAR(a[0].end, t0 + sort, 1e-15);
  // Chunk 1's sort runs beside chunk 0's permute: twice its cost; the permute loses the half of
  // the core the sort takes over that span (its CPU over its span, 0.5, for the 128 ns).
  EXPECT_NEAR(a[1].start, t0 + sort, 1e-15);
  EXPECT_NEAR(a[1].end, t0 + 3 * sort, 1e-15);
  EXPECT_NEAR(a[2].start, t0 + sort, 1e-15);
  EXPECT_NEAR(a[2].end, t0 + sort + permute + 0.5 * 2 * sort, 1e-15);
  // Without steal nothing is shared: the sort takes its cost, the permute its own.
  const std::vector<SimOp> b = sorts(0);
  EXPECT_NEAR(b[1].end, t0 + 2 * sort, 1e-15);
  EXPECT_NEAR(b[2].end, t0 + sort + permute, 1e-15);
}

// A contention row at `rpc` ranks per core: the wait curve (compute s, wait s), side_busy, slowdown.
Contention row(double rpc, std::vector<double> c, std::vector<double> w, double side_busy = 0,
               double slow = 1) {
  Contention x;
  x.ranks_per_core = rpc, x.compute_s = std::move(c), x.wait_s = std::move(w);
  x.side_busy_s = side_busy, x.compute_slowdown = slow;
  return x;
}

// r with one more contention row (replacing a row at the same ranks per core).
Rates with_row(Rates r, const Contention& c) {
  r.set_contention(c);
  return r;
}

// r with a row at 2 ranks per core (no wait curve) that measured one bandwidth (`field`: ag_bw_Bps
// or a2a_bw_Bps; 0: not measured).
Rates with_bw_row(const Rates& r, double Contention::*field, double bw) {
  Contention c = row(2, {0}, {0});
  c.*field = bw;
  return with_row(r, c);
}

TEST(PlanContention, WaitCurveAndRowsInterpolate) {
  const Contention one = row(1, {1e-3, 3e-3}, {100e-6, 500e-6});
  EXPECT_NEAR(one.wait_after(2e-3), 300e-6, 1e-15);    // halfway between the points
  EXPECT_NEAR(one.wait_after(0.5e-3), 100e-6, 1e-15);  // before the first point: its wait
  EXPECT_NEAR(one.wait_after(10e-3), 500e-6, 1e-15);   // beyond the last: the last
  Rates r = round_rates();
  EXPECT_DOUBLE_EQ(r.wait_at(2, 1e-3), 0.0);  // no rows (a file from before them): no contention
  EXPECT_DOUBLE_EQ(r.compute_slowdown_at(2), 1.0);
  r.set_contention(row(2, {1e-3, 3e-3}, {1e-3, 3e-3}, 8e-3, 1.6));
  r.set_contention(row(1, {1e-3, 3e-3}, {100e-6, 500e-6}, 4e-3, 1.2));
  ASSERT_EQ(r.contention.size(), 2u);
  EXPECT_DOUBLE_EQ(r.contention[0].ranks_per_core, 1.0);  // kept sorted
  // 1.5 ranks per core: halfway between the rows, at the same compute.
  EXPECT_NEAR(r.wait_at(1.5, 2e-3), (300e-6 + 2e-3) / 2, 1e-15);
  EXPECT_NEAR(r.side_busy_at(1.5), 6e-3, 1e-15);
  EXPECT_NEAR(r.compute_slowdown_at(1.5), 1.4, 1e-12);
  // Below the first row: from nothing at 0 ranks per core (slowdown 1); beyond the last: the last.
  EXPECT_NEAR(r.wait_at(0.5, 2e-3), 150e-6, 1e-15);
  EXPECT_NEAR(r.compute_slowdown_at(0.5), 1.1, 1e-12);
  EXPECT_NEAR(r.wait_at(4, 2e-3), 2e-3, 1e-15);
  // A row measured again at the same ranks per core replaces the old one.
  r.set_contention(row(2, {1e-3}, {5e-3}));
  ASSERT_EQ(r.contention.size(), 2u);
  EXPECT_NEAR(r.wait_at(2, 0), 5e-3, 1e-15);
}

TEST(PlanContention, RatesFileRoundTripsAndOldFilesLoad) {
  Rates r = round_rates();
  r.pool_threads = 1, r.pool_speedup = 1;
  r.set_contention(row(0.5, {}, {}));  // one rank alone on 2 cores: no waits
  r.set_contention(row(2, {0, 9e-3, 21e-3}, {0, 2.2e-3, 2.9e-3}, 6.8e-3, 1.1));
  const Rates back = parse_rates(rates_json(r), "mem");
  ASSERT_EQ(back.contention.size(), 2u);
  EXPECT_TRUE(back.contention[0].compute_s.empty());
  EXPECT_NEAR(back.contention[1].wait_after(15e-3), 2.55e-3, 1e-12);
  EXPECT_NEAR(back.contention[1].side_busy_s, 6.8e-3, 1e-12);
  EXPECT_NEAR(back.contention[1].compute_slowdown, 1.1, 1e-12);
  // A file written before the contention rows: loads, with no contention terms.
  std::string old = rates_json(round_rates());
  const size_t at = old.find("\"contention\": [],");
  ASSERT_NE(at, std::string::npos) << old;
  old.erase(at, std::string("\"contention\": [],").size());
  const Rates o = parse_rates(old, "old.json");
  EXPECT_TRUE(o.contention.empty());
  EXPECT_DOUBLE_EQ(o.wait_at(2, 1.0), 0.0);
  // Points must ascend in compute.
  std::string bad = rates_json(r);
  const size_t c = bad.find("9000.0");
  ASSERT_NE(c, std::string::npos) << bad;
  bad.replace(c, 6, "90000.0");  // point 1 after point 2
  EXPECT_NE(error_of([&] {
              parse_rates(bad, "f.json");
            }).find("f.json: contention[1]: point 2: 'compute_us' must ascend"),
            std::string::npos)
      << error_of([&] { parse_rates(bad, "f.json"); });
}

// The paired speed probe (ModelOptions::probe_ms) scales the compute by the probe's time over what
// the calibration predicts for it (rates' probe x max(1, ranks per core) x the whole layer's
// slowdown), slower or faster.
TEST(PlanStep, PairedProbeScalesTheComputeInPlaceOfTheSlowdown) {
  Rates r = round_rates();
  r.probe_ms = 20;
  const LayerShape L = small_layer();
  Cluster one;
  one.cores = 1;  // one rank on one core: ranks per core 1
  const Prediction base = predict_step(L, Layout{}, one, r);
  ModelOptions slow;
  slow.probe_ms = 30;  // the machine 1.5x slower than at calibration
  EXPECT_NEAR(compute_slowdown(L, Layout{}, one, r, slow), 1.5, 1e-12);
  EXPECT_NEAR(predict_step(L, Layout{}, one, r, slow).step_s, 1.5 * base.step_s, 1e-12);
  ModelOptions fast;
  fast.probe_ms = 16;
  EXPECT_NEAR(predict_step(L, Layout{}, one, r, fast).step_s, 0.8 * base.step_s, 1e-12);
  // With a calibrated slowdown, the probe is compared with what the calibration predicts for it
  // (20 ms x 1.3): the same 1.5.
  r.set_contention(row(1, {}, {}, 0, 1.3));
  EXPECT_NEAR(compute_slowdown(L, Layout{}, one, r, {}), 1.3, 1e-12);
  EXPECT_NEAR(predict_step(L, Layout{}, one, r, slow).step_s, 1.5 * base.step_s, 1e-12);
  // Two ranks per core: the time slices are the cores' share (0.5 of a core each, as before); the
  // probe of both ranks at once takes at least twice one rank's time, and only what is beyond that
  // slows the compute: 50 ms against 2 x 20 is 1.25.
  Cluster shared;
  shared.cores = 1, shared.ranks_per_host = 2;
  Layout ep2;
  ep2.expert = 2;
  ModelOptions both;
  both.probe_ms = 50;
  both.others_busy = 1;  // both ranks computing at once, as the probe ran
  EXPECT_NEAR(compute_slowdown(L, ep2, shared, r, both), 1.25, 1e-12);
  const Prediction pb = predict_step(L, ep2, shared, r, both);
  ModelOptions even;
  even.probe_ms = 40;
  even.others_busy = 1;
  EXPECT_NEAR(pb.compute_s, 1.25 * predict_step(L, ep2, shared, r, even).compute_s, 1e-12);
  // Rates without a probe of their own: a clear error.
  Rates old = round_rates();
  EXPECT_NE(error_of([&] { predict_step(L, Layout{}, one, old, slow); }).find("speed_probe_ms"),
            std::string::npos);
  // The rates file keeps the probe; a file without it loads with none.
  EXPECT_DOUBLE_EQ(parse_rates(rates_json(r), "mem").probe_ms, 20.0);
  EXPECT_DOUBLE_EQ(parse_rates(rates_json(old), "mem").probe_ms, 0.0);
}

// The slowdown of ranks sharing cores falls with the expert weights each rank touches: linear in
// log(bytes) between the whole layer's and E / ranks experts', the nearer one outside.
TEST(PlanContention, SlowdownFallsWithTheRanksWeightBytes) {
  const LayerShape L = small_layer();  // D 64, F 32, bf16 weights and compute: 12,288 B per expert
  EXPECT_DOUBLE_EQ(expert_weight_bytes(L, 8), 8 * 3 * 64 * 32 * 2.0);
  LayerShape cast = L;
  cast.weight_dtype = DType::f32;  // f32 stored, bf16 copies: 6 bytes per weight
  EXPECT_DOUBLE_EQ(expert_weight_bytes(cast, 2), 2 * 3 * 64 * 32 * 6.0);
  Contention c = row(2, {}, {}, 0, 1.16);
  c.weight_bytes = expert_weight_bytes(L, 8), c.small_weight_bytes = expert_weight_bytes(L, 2);
  c.small_compute_slowdown = 1.04;
  EXPECT_NEAR(c.slowdown_at(expert_weight_bytes(L, 8)), 1.16, 1e-12);
  EXPECT_NEAR(c.slowdown_at(expert_weight_bytes(L, 2)), 1.04, 1e-12);
  EXPECT_NEAR(c.slowdown_at(expert_weight_bytes(L, 4)), 1.10, 1e-12);  // halfway in log(bytes)
  EXPECT_NEAR(c.slowdown_at(expert_weight_bytes(L, 1)), 1.04, 1e-12);
  EXPECT_NEAR(c.slowdown_at(expert_weight_bytes(L, 64)), 1.16, 1e-12);
  EXPECT_NEAR(c.slowdown_at(0), 1.16, 1e-12);  // 0: the whole layer's
  Rates r = round_rates();
  r.set_contention(c);
  // Four ranks on two cores: expert parallelism over 4 holds 2 experts a rank, FSDP all 8.
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 4;
  Layout ep4, fsdp4, ep2;
  ep4.expert = 4, fsdp4.fsdp = 4, ep2.expert = 2, ep2.fsdp = 2;
  EXPECT_NEAR(compute_slowdown(L, ep4, cl, r, {}), 1.04, 1e-12);
  EXPECT_NEAR(compute_slowdown(L, fsdp4, cl, r, {}), 1.16, 1e-12);
  EXPECT_NEAR(compute_slowdown(L, ep2, cl, r, {}), 1.10, 1e-12);
  // With a probe, its factor comes from the whole layer's slowdown (the probe's own weights):
  // 20 ms alone, 2 x 1.16 x 20 predicted at 2 ranks per core; measured 1.25x that.
  r.probe_ms = 20;
  ModelOptions o;
  o.probe_ms = 1.25 * 2 * 1.16 * 20;
  EXPECT_NEAR(compute_slowdown(L, ep4, cl, r, o), 1.25 * 1.04, 1e-12);
  // The file keeps the pair; a row without it loads with one slowdown for every size.
  const Rates back = parse_rates(rates_json(r), "mem");
  ASSERT_EQ(back.contention.size(), 1u);
  EXPECT_NEAR(back.contention[0].slowdown_at(expert_weight_bytes(L, 2)), 1.04, 1e-12);
  r.contention[0].small_weight_bytes = 0;
  EXPECT_NEAR(parse_rates(rates_json(r), "mem").contention[0].slowdown_at(expert_weight_bytes(L, 2)), 1.16, 1e-12);
}

TEST(PlanStep, ContentionWaitOfInlineCollectivesHandComputed) {
  Rates r = round_rates();
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 2;  // 1 rank per core
  Layout ep2;
  ep2.expert = 2;
  const Prediction base = predict_step(small_layer(), ep2, cl, r);
  // A constant wait of 100 us: once per inline collective (AG:aux_stats, AG:counts, 4 A2As, AR:router).
  r.set_contention(row(1, {0}, {100e-6}));
  const Prediction flat = predict_step(small_layer(), ep2, cl, r);
  EXPECT_NEAR(flat.terms.at("contention wait"), 7 * 100e-6, 1e-12);
  EXPECT_NEAR(flat.step_s, base.step_s + 7 * 100e-6, 1e-12);
  EXPECT_NEAR(flat.exposed_comm_s, base.exposed_comm_s + 7 * 100e-6, 1e-12);
  // A wait of 10% of the compute since the previous collective: the compute between the step's
  // collectives adds up to all of it (the last op is the router's AR).
  r.set_contention(row(1, {0, 1}, {0, 0.1}));
  const Prediction lin = predict_step(small_layer(), ep2, cl, r);
  EXPECT_NEAR(lin.terms.at("contention wait"), 0.1 * base.compute_s, 1e-12);
  EXPECT_NEAR(lin.step_s, base.step_s + 0.1 * base.compute_s, 1e-12);
  // The compute slowdown stretches every compute op (one rank on one core: 1 rank per core).
  r.contention.clear();
  r.set_contention(row(1, {}, {}, 0, 1.5));
  Cluster one;
  one.cores = 1;
  EXPECT_NEAR(predict_step(small_layer(), Layout{}, one, r).step_s,
              1.5 * predict_step(small_layer(), Layout{}, one, round_rates()).step_s, 1e-12);
}

// parse_rates's error for the rates file `json` with its text `good` replaced by `bad` ("" when it
// parses; a `good` not in the file fails the test).
std::string error_with(std::string json, const std::string& good, const std::string& bad) {
  const size_t at = json.find(good);
  EXPECT_NE(at, std::string::npos) << json;
  if (at == std::string::npos) return "";
  json.replace(at, good.size(), bad);
  return error_of([&] { parse_rates(json, "f.json"); });
}

TEST(PlanStep, SideCpuFracStretchesComputeOverlappingSideOps) {
  // The FSDP gathers offloaded across 2 one-core hosts: on the wire, they keep no core busy in the
  // model (comm_cpu_ns_per_byte 0); a measured side_cpu_frac stretches the compute that overlaps
  // them, by at most that fraction of the side ops' spans, and only where the side engine has no
  // spare core.
  Rates r = round_rates();
  Cluster cl;
  cl.hosts = 2, cl.cores = 1, cl.ranks_per_host = 1;
  cl.inter.bw_Bps = 1e8, cl.inter.lat_s = 20e-6;
  Layout l;
  l.fsdp = 2, l.off_fsdp = true;
  ModelOptions steal;
  steal.steal = 1;
  auto with_frac = [&](double f) {
    Contention c = row(1, {0}, {0});
    c.side_cpu_frac = f;
    return with_row(r, c);
  };
  const Prediction p0 = predict_step(small_layer(), l, cl, with_frac(0), steal);
  const Prediction p5 = predict_step(small_layer(), l, cl, with_frac(0.5), steal);
  double spans = 0;
  for (const SimOp& op : p5.ops)
    if (op.side) spans += op.end - op.start;
  EXPECT_GT(p5.compute_s, p0.compute_s);
  EXPECT_LE(p5.compute_s - p0.compute_s, 0.5 * spans + 1e-12);
  EXPECT_GT(p5.step_s, p0.step_s);
  // A spare core (steal 0): the fraction changes nothing.
  ModelOptions spare;
  spare.steal = 0;
  EXPECT_DOUBLE_EQ(predict_step(small_layer(), l, cl, with_frac(0.5), spare).step_s,
                   predict_step(small_layer(), l, cl, with_frac(0), spare).step_s);
  // An offloaded sort is all CPU (its own cost fills its span): a fraction below 1 adds nothing.
  Layout sort;
  sort.off_sort = true;
  Cluster one;
  one.cores = 1;
  EXPECT_DOUBLE_EQ(predict_step(small_layer(), sort, one, with_frac(0.9), steal).step_s,
                   predict_step(small_layer(), sort, one, with_frac(0), steal).step_s);
  // The rates file keeps it; a value above 1 is refused by name.
  Rates back = parse_rates(rates_json(with_frac(0.25)), "mem");
  ASSERT_EQ(back.contention.size(), 1u);
  EXPECT_NEAR(back.side_cpu_frac_at(1), 0.25, 1e-12);
  EXPECT_NEAR(back.side_cpu_frac_at(0.5), 0.125, 1e-12);  // from 0 at 0 ranks per core
  const std::string err =
      error_with(rates_json(with_frac(0.25)), "\"side_cpu_frac\": 0.25", "\"side_cpu_frac\": 1.5");
  EXPECT_NE(err.find("f.json: contention[0]: 'side_cpu_frac' must be in [0, 1]"), std::string::npos) << err;
}

TEST(PlanStep, SideStretchOverSpansAndWhileTheWorkerWaitsForLatePeers) {
  // Compute [0, 4) beside two ops not yet waited for: [1, 2) with no CPU of its own, [2.5, 3) with
  // 0.25 s of CPU (0.5 of its span); steal 1, cpu_frac 0.1, wait_frac 0.5.
  const std::vector<SideSpan> ops = {{1, 2, 0}, {2.5, 3, 0.25}};
  // Peers on time: the spans at max(own CPU, cpu_frac): 0.1 * 1 + 0.5 * 0.5 = 0.35.
  EXPECT_NEAR(side_stretch(ops, 0, 4, 1, 0.1, 0.5, false), 0.35, 1e-12);
  // Peers late: the spans at max(own CPU, cpu_frac, wait_frac): 0.5 * 1 + 0.5 * 0.5 = 0.75, and 0.5
  // of the time from the first op's start (1) to the compute's end (4) outside them (3 - 1.5): 0.75.
  EXPECT_NEAR(side_stretch(ops, 0, 4, 1, 0.1, 0.5, true), 1.5, 1e-12);
  // Without wait_frac, late or not: 0.35.
  EXPECT_NEAR(side_stretch(ops, 0, 4, 1, 0.1, 0, true), 0.35, 1e-12);
  // Compute that starts after the first op's start counts from its own start: [2, 4) overlaps the
  // second span 0.5 (0.25) and waits 1.5 outside it (0.75).
  EXPECT_NEAR(side_stretch(ops, 2, 2, 1, 0.1, 0.5, true), 1.0, 1e-12);
  // steal scales it all; nothing pending, nothing added.
  EXPECT_NEAR(side_stretch(ops, 0, 4, 0.5, 0.1, 0.5, true), 0.75, 1e-12);
  EXPECT_EQ(side_stretch({}, 0, 4, 1, 0.1, 0.5, true), 0.0);
  // Through the model: 2 hosts of 1 core, 2 ranks each (2 ranks per core, peers late), ep4 in 4
  // chunks with the EP collectives offloaded; a measured side_wait_frac stretches the compute, and
  // 0 gives the prediction without it.
  Rates r = round_rates();
  Cluster cl;
  cl.hosts = 2, cl.cores = 1, cl.ranks_per_host = 2;
  cl.inter.bw_Bps = 1e8, cl.inter.lat_s = 20e-6;
  Layout l;
  l.expert = 4, l.chunks = 4, l.off_ep = true;
  auto with_wait = [&](double f) {
    Contention c = row(2, {0}, {0});
    c.side_wait_frac = f;
    return with_row(r, c);
  };
  ModelOptions steal;
  steal.steal = 1;
  const Prediction p0 = predict_step(small_layer(), l, cl, with_wait(0), steal);
  const Prediction p5 = predict_step(small_layer(), l, cl, with_wait(0.5), steal);
  EXPECT_GT(p5.compute_s, p0.compute_s);
  EXPECT_GE(p5.step_s, p0.step_s);
  // The rates file keeps it; a value above 3 is refused by name.
  Rates back = parse_rates(rates_json(with_wait(0.5)), "mem");
  EXPECT_NEAR(back.side_wait_frac_at(2), 0.5, 1e-12);
  const std::string err =
      error_with(rates_json(with_wait(0.5)), "\"side_wait_frac\": 0.5", "\"side_wait_frac\": 3.5");
  EXPECT_NE(err.find("f.json: contention[0]: 'side_wait_frac' must be in [0, 3]"), std::string::npos) << err;
}

// Ranks sharing a core: a rank waiting in a collective yields the core to the one beside it, so the
// compute gets 1 / (1 + (ranks per core - 1) u) of a core, u the fraction of the step the others
// demand it; predict_step finds u as its own prediction's CPU seconds over its step.
TEST(PlanStep, RanksSharingACoreComputeFasterWhileTheOthersWait) {
  EXPECT_DOUBLE_EQ(core_share(0.5, 1), 0.5);  // every rank computing: the time slice
  EXPECT_DOUBLE_EQ(core_share(0.5, 0), 1.0);  // the others always waiting: the whole core
  EXPECT_DOUBLE_EQ(core_share(0.5, 0.25), 0.8);
  EXPECT_DOUBLE_EQ(core_share(1.0 / 3, 0.5), 0.5);  // 3 ranks per core, the others half the time
  EXPECT_DOUBLE_EQ(core_share(2, 0.1), 2.0);        // cores to spare: unchanged
  // The calibrated slowdown (every rank computing at once) counts by the same fraction: 1.2 -> 1.1.
  Rates r = round_rates();
  r.set_contention(row(2, {}, {}, 0, 1.2));
  const LayerShape L = small_layer();
  Cluster one_host;
  one_host.cores = 1, one_host.ranks_per_host = 2;
  Layout ep2;
  ep2.expert = 2;
  EXPECT_NEAR(compute_slowdown(L, ep2, one_host, r, {}, 0.5), 1.1, 1e-12);
  EXPECT_NEAR(compute_slowdown(L, ep2, one_host, r, {}, 1), 1.2, 1e-12);
  // 2 hosts of one core and 2 ranks each, a slow link: the all-to-alls dominate the step.
  Cluster cl;
  cl.hosts = 2, cl.cores = 1, cl.ranks_per_host = 2;
  cl.inter = {1e6, 50e-6, 0};  // 1 MB/s
  Layout ep4;
  ep4.expert = 4;
  ModelOptions sliced;
  sliced.others_busy = 1;
  const Prediction s = predict_step(L, ep4, cl, r, sliced);
  const Prediction p = predict_step(L, ep4, cl, r);
  EXPECT_DOUBLE_EQ(s.others_busy, 1.0);
  EXPECT_LT(p.others_busy, 0.5);
  EXPECT_GT(p.others_busy, 0.0);
  // A fixed point: its own CPU seconds over its own step, and the prediction pinned there.
  EXPECT_NEAR(p.others_busy, p.cpu_s / p.step_s, 2e-4);
  ModelOptions at;
  at.others_busy = p.others_busy;
  EXPECT_DOUBLE_EQ(predict_step(L, ep4, cl, r, at).step_s, p.step_s);
  // The compute gets the larger share; the collectives cost the same.
  const double share = core_share(0.5, p.others_busy), slow = 1 + 0.2 * p.others_busy;
  EXPECT_NEAR(p.terms.at("ffn") * share / slow, s.terms.at("ffn") * 0.5 / 1.2, 1e-12);
  EXPECT_LT(p.compute_s, s.compute_s);
  EXPECT_DOUBLE_EQ(p.comm_s, s.comm_s);
  // Hosts sharing the machine's cores (4 hosts of one rank on half a core each): the rank beside it
  // is another host's, and it yields its core alike.
  Cluster four;
  four.hosts = 4, four.cores = 0.5, four.ranks_per_host = 1;
  four.inter = cl.inter;
  const Prediction f = predict_step(L, ep4, four, r);
  EXPECT_LT(f.others_busy, 0.5);
  EXPECT_GT(f.others_busy, 0.0);
  EXPECT_NEAR(f.others_busy, f.cpu_s / f.step_s, 2e-4);
  EXPECT_LT(f.step_s, predict_step(L, ep4, four, r, sliced).step_s);
  // One rank per core, or a job of one rank: nothing to share, the time slices as given.
  Cluster own;
  own.hosts = 2, own.cores = 2, own.ranks_per_host = 2;
  own.inter = cl.inter;
  EXPECT_DOUBLE_EQ(predict_step(L, ep4, own, r).others_busy, 1.0);
  Cluster half;
  half.cores = 0.5;
  EXPECT_DOUBLE_EQ(predict_step(L, Layout{}, half, r).others_busy, 1.0);
}

TEST(PlanStep, MeasuredAllToAllBandwidthPricesTheAllToAlls) {
  // 4 ranks on 2 cores: where the contention row measured a large all-to-all's bandwidth, the
  // all-to-alls (expert parallelism's four here, T·K rows of D bf16 each) are priced at it instead
  // of the halved link (1 GB/s -> 0.5); the all-gathers do not move.
  Rates r = round_rates();
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 4;
  Layout ep4;
  ep4.expert = 4;
  const LayerShape L = small_layer();
  auto with_a2a = [&](double bw) { return with_bw_row(r, &Contention::a2a_bw_Bps, bw); };
  ModelOptions sliced;
  sliced.others_busy = 1;
  const Prediction halved = predict_step(L, ep4, cl, with_a2a(0), sliced);
  const Prediction measured = predict_step(L, ep4, cl, with_a2a(0.25e9), sliced);
  const double bytes = 64.0 * 2 * 64 * 2;  // T·K rows of D, bf16
  EXPECT_NEAR(measured.terms.at("A2A") - halved.terms.at("A2A"), 4 * bytes * 3 / 4 * (1 / 0.25e9 - 1 / 0.5e9), 1e-12);
  EXPECT_DOUBLE_EQ(measured.terms.at("AG:aux_stats"), halved.terms.at("AG:aux_stats"));
  // A link given in the cluster description wins; rows interpolate; files keep it, or leave it out.
  Cluster given = cl;
  given.intra = Link{1e9, 1e-6};
  EXPECT_DOUBLE_EQ(predict_step(L, ep4, given, with_a2a(0.25e9)).step_s, predict_step(L, ep4, given, with_a2a(0)).step_s);
  Rates two = with_a2a(2e9);
  Contention one = row(1, {0}, {0});
  one.a2a_bw_Bps = 4e9;
  two.set_contention(one);
  EXPECT_NEAR(two.a2a_bw_at(1.5), 3e9, 1e-3);
  EXPECT_NEAR(two.a2a_bw_at(0.5), 4e9, 1e-3);
  EXPECT_DOUBLE_EQ(two.ag_bw_at(1.5), 0.0);
  EXPECT_NEAR(parse_rates(rates_json(two), "mem").a2a_bw_at(1.5), 3e9, 1e-3);
  EXPECT_EQ(rates_json(with_a2a(0)).find("a2a_bw_gbps"), std::string::npos);
}

TEST(PlanStep, MeasuredAllReduceBandwidthPricesOneHostsAllReduces) {
  // 4 ranks on 2 cores; the expert gradients' all-reduce over data=4 at a size that splits (D 2048:
  // 2 MiB per weight). Where the contention row measured the engine's all-reduce over the host's 4
  // ranks, each of the three is priced at it: β = n / bw, the parts' α (an all-to-all of 3
  // messages, then the all-gather the halved link picks: recursive doubling, 2 steps), and no sums
  // of their own. A group of 2 takes the row's pairs; without the row, or across hosts, the parts.
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 4;
  LayerShape L = small_layer();
  L.D = 2048;
  Contention c = row(2, {0}, {0});
  c.ar_bw_Bps = 0.25e9, c.ar_ranks = 4, c.ar_pair_bw_Bps = 0.5e9;
  const Rates measured = with_row(round_rates(), c), parts = with_row(round_rates(), row(2, {0}, {0}));
  ModelOptions sliced;
  sliced.others_busy = 1;
  auto grads = [&](const Layout& l, const Cluster& on, const Rates& r) {
    return predict_step(L, l, on, r, sliced).terms.at("grad:experts");
  };
  Layout d4;
  d4.data = 4;
  const double n4 = 8.0 * 2048 * 32 * 4;  // one weight's f32 gradient
  const Link halved{0.5e9, 1e-6};
  const Group g4 = make_group(4, 1, 4);
  ASSERT_TRUE(Communicator::all_reduce_splits(4, size_t(n4 / 4)));
  const double alpha4 =
      all_to_all(A2AAlgo::flat, g4, n4, halved, {}).alpha_s + all_gather(g4, n4 / 4, halved, {}).alpha_s;
  EXPECT_NEAR(alpha4, 5e-6, 1e-15);
  EXPECT_NEAR(grads(d4, cl, measured), 3 * (alpha4 + n4 / 0.25e9), 1e-12);
  EXPECT_GT(std::fabs(grads(d4, cl, parts) - grads(d4, cl, measured)), 1e-4);
  // data 2 x expert 2: pairs of ranks 2 apart inside the host, 4 experts' gradient each (no split).
  Layout d2e2;
  d2e2.data = 2, d2e2.expert = 2;
  const double n2 = n4 / 2;
  const double alpha2 = all_gather(make_group(2, 2, 4), n2, halved, {}).alpha_s;
  EXPECT_NEAR(grads(d2e2, cl, measured), 3 * (alpha2 + n2 / 0.5e9), 1e-12);
  // Across hosts (2 hosts of 2 ranks on 1 core each) the measurement inside a host does not apply.
  Cluster two_hosts;
  two_hosts.hosts = 2, two_hosts.cores = 1, two_hosts.ranks_per_host = 2, two_hosts.inter = kInter;
  EXPECT_DOUBLE_EQ(grads(d4, two_hosts, measured), grads(d4, two_hosts, parts));
  // Lookups: by the group's size (pairs from ar_pair_bw, and from a row whose host had 2 ranks),
  // linear between rows; files keep the fields, and an all-reduce bandwidth names its group.
  Rates rows = measured;
  Contention one = row(1, {0}, {0});
  one.ar_bw_Bps = one.ar_pair_bw_Bps = 1e9, one.ar_ranks = 2;
  rows.set_contention(one);
  EXPECT_NEAR(rows.ar_bw_at(1.5, 2), 0.75e9, 1e-3);
  EXPECT_NEAR(rows.ar_bw_at(0.5, 2), 1e9, 1e-3);   // below a row of a core per rank: that row's
  EXPECT_NEAR(rows.ar_bw_at(3, 4), 0.25e9, 1e-3);  // beyond the last row: its value
  EXPECT_DOUBLE_EQ(rows.ar_bw_at(1.5, 4), 0.0);    // 4 ranks measured only at 2 ranks per core
  EXPECT_DOUBLE_EQ(rows.ar_bw_at(2, 3), 0.0);
  const Rates back = parse_rates(rates_json(rows), "mem");
  EXPECT_NEAR(back.ar_bw_at(1.5, 2), 0.75e9, 1e-3);
  EXPECT_NEAR(back.ar_bw_at(2, 4), 0.25e9, 1e-3);
  EXPECT_EQ(rates_json(parts).find("ar_bw_gbps"), std::string::npos);  // not measured: not written
  std::string text = rates_json(rows);
  const std::string field = "\"ar_ranks\": 4";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  text.replace(text.find(field), field.size(), "\"ar_ranks\": 1.5");
  EXPECT_NE(
      error_of([&] { parse_rates(text, "r.json"); }).find("'ar_ranks' must be a whole number >= 2, got 1.5"),
      std::string::npos);
}

TEST(PlanStep, MeasuredAllGatherBandwidthPricesTheGathersOnly) {
  // 4 ranks on 2 cores (2 ranks per core): the intra link's bandwidth is halved for the half core
  // (1 GB/s -> 0.5), unless the contention row measured the all-gather's own: then every
  // all-gather (the weight gathers here) is priced at it, and the all-to-alls keep the halved link.
  Rates r = round_rates();
  Cluster cl;
  cl.cores = 2, cl.ranks_per_host = 4;
  Layout fsdp4;
  fsdp4.fsdp = 4;
  const LayerShape L = small_layer();
  auto with_ag = [&](double bw) { return with_bw_row(r, &Contention::ag_bw_Bps, bw); };
  ModelOptions sliced;
  sliced.others_busy = 1;  // the same compute speed in both (the placement copies depend on it)
  const Prediction halved = predict_step(L, fsdp4, cl, with_ag(0), sliced);
  const Prediction measured = predict_step(L, fsdp4, cl, with_ag(2e9), sliced);
  // Three weights, each a ring of 3 steps of one shard (E·D·F/4 elements of 2 bytes): only β moves.
  const double shard = 8.0 * 64 * 32 / 4 * 2;
  EXPECT_NEAR(halved.terms.at("AG:weights") - measured.terms.at("AG:weights"), 3 * 3 * shard * (1 / 0.5e9 - 1 / 2e9),
              1e-15);
  // The all-to-alls of expert parallelism do not move.
  Layout ep4;
  ep4.expert = 4;
  EXPECT_DOUBLE_EQ(predict_step(L, ep4, cl, with_ag(2e9)).terms.at("A2A"),
                   predict_step(L, ep4, cl, with_ag(0)).terms.at("A2A"));
  // A link given in the cluster description wins over the rates' measurement.
  Cluster given = cl;
  given.intra = Link{1e9, 1e-6};
  EXPECT_DOUBLE_EQ(predict_step(L, fsdp4, given, with_ag(2e9)).step_s, predict_step(L, fsdp4, given, with_ag(0)).step_s);
  // Rows: linear between the rows that measured it, the nearest one outside them; files keep it.
  Rates two = with_ag(2e9);
  Contention one = row(1, {0}, {0});
  one.ag_bw_Bps = 4e9;
  two.set_contention(one);
  two.set_contention(row(4, {0}, {0}));  // a row without the measurement is skipped
  EXPECT_NEAR(two.ag_bw_at(1.5), 3e9, 1e-3);
  EXPECT_NEAR(two.ag_bw_at(0.5), 4e9, 1e-3);
  EXPECT_NEAR(two.ag_bw_at(8), 2e9, 1e-3);
  EXPECT_DOUBLE_EQ(round_rates().ag_bw_at(2), 0.0);
  const Rates back = parse_rates(rates_json(two), "mem");
  EXPECT_NEAR(back.ag_bw_at(1.5), 3e9, 1e-3);
  EXPECT_EQ(rates_json(with_ag(0)).find("ag_bw_gbps"), std::string::npos);  // not measured: not written
}

TEST(PlanRates, PoolSpeedupPerPointSetsTheSpeedAtTheStepsRows) {
  // Two points of one shape at 1 and 100 rows per expert, the pool's speedup measured at each
  // (1.2 and 2.0, pool_threads 2); the file's own 1.5 stands in where a point has none.
  Rates r = round_rates();
  r.pool_threads = 2, r.pool_speedup = 1.5;
  r.gemm[0].pool_speedup = 1.2;
  GemmPoint hi = r.gemm[0];
  hi.rows_per_expert = 100, hi.pool_speedup = 2.0;
  r.gemm.push_back(hi);
  EXPECT_NEAR(r.speed(2, 2), 1.5, 1e-12);
  const GemmPoint at10 = r.ffn_at(DType::bf16, 64, 32, 10);  // halfway in log(rows per expert)
  EXPECT_NEAR(at10.pool_speedup, 1.6, 1e-12);
  EXPECT_NEAR(r.speed(2, 2, &at10), 1.6, 1e-12);
  GemmPoint none = r.gemm[0];
  none.pool_speedup = 0;
  EXPECT_NEAR(r.speed(2, 2, &none), 1.5, 1e-12);
  EXPECT_NEAR(r.speed(0.5, 2, &at10), 0.5, 1e-12);  // below a core: time slices, whatever the pool
  // One rank with 2 cores and 2 threads: small_layer's step (T 64, K 2, E 8: 16 rows per expert)
  // runs at 1 + (s - 1) of one thread's speed, s interpolated at 16 rows: every op is compute.
  Cluster one, two;
  one.cores = 1, two.cores = 2, two.threads = 2;
  const double s16 = 1.2 + 0.8 * std::log(16.0) / std::log(100.0);
  EXPECT_NEAR(predict_step(small_layer(), Layout{}, one, r).step_s / predict_step(small_layer(), Layout{}, two, r).step_s,
              s16, 1e-9);
  // Files keep it per point; a point without it writes none and reads back 0.
  r.gemm[0].pool_speedup = 0;
  const std::string text = rates_json(r);
  const Rates back = parse_rates(text, "mem");
  ASSERT_EQ(back.gemm.size(), 2u);
  EXPECT_DOUBLE_EQ(back.gemm[0].pool_speedup, 0.0);
  EXPECT_DOUBLE_EQ(back.gemm[1].pool_speedup, 2.0);
  EXPECT_EQ(text.find("\"pool_speedup\": 0"), std::string::npos);
}

TEST(PlanStep, SideBusyEndsWhenTheComputeThreadBlocksHandComputed) {
  // SideEngineOverlapHandComputed's layout (fsdp=2, gathers offloaded) with a constant wait w for the
  // slowest member and side_busy = 10 s: each gather would take 10 s longer, but once the compute
  // thread blocks on one, it (and those before it) end when their own cost is done and w has passed.
  Rates r = round_rates();
  const double w = 5e-6;
  r.set_contention(row(0.5, {0}, {w}, 10));
  Cluster cl;
  cl.cores = 4, cl.ranks_per_host = 2, cl.threads = 1;  // 0.5 ranks per core: the row's
  Layout l;
  l.fsdp = 2;
  l.off_fsdp = true;
  ModelOptions o;
  o.steal = 0;
  const Prediction p = predict_step(small_layer(), l, cl, r, o);
  const double T = 64, D = 64, F = 32, E = 8, R = 128, b = 2;
  const double shard = 8 * D * F / 2 * b;
  const double ag = 1e-6 + shard / 1e9 + 2 * shard * 2 / 1e9;
  // Router, AG:aux_stats (inline: + w), sort, permute; then the FFN blocks on wi_1.
  const double block1 =
      2 * T * D * E * 1e-9 + w + (1e-6 + (E * 24 + 40) / 1e9) + R * 1e-9 + 2 * R * D * b * 1e-9;
  ASSERT_GT(block1 + w, ag);  // wi_0 is cut to block1 + w, then wi_1 runs its own cost
  const double wi1 = block1 + w + ag;
  const double ffn = 6 * R * D * F * 1e-9;
  const double block2 = wi1 + ffn * 2 / 3;  // blocks on wo, whose own cost ended at wi1 + ag < block2
  ASSERT_LT(wi1 + ag, block2 + w);
  const double wo = block2 + w;
  double fwd_end = 0;
  for (const SimOp& op : p.ops)
    if (op.name == "combine") fwd_end = op.end;
  EXPECT_NEAR(fwd_end, wo + ffn / 3 + (R + T) * D * b * 1e-9, 1e-12);
  EXPECT_LT(p.step_s, 1.0);  // no op kept its 10 s
}

TEST(PlanRanking, SortedAndExplained) {
  const Rates r = round_rates();
  Cluster cl = parse_cluster("hosts=2,cores=4,ranks_per_host=2,inter_bw=1Gbit,inter_lat=50us");
  const LayerShape L = small_layer();
  const auto cands = candidate_layouts(L, cl);
  ASSERT_GT(cands.size(), 10u);
  bool hier = false;
  for (const Layout& l : cands) hier |= l.a2a == A2AAlgo::hierarchical;
  EXPECT_TRUE(hier);  // the expert group of 4 spans the 2 hosts
  const auto ranked = rank_layouts(L, cl, r, cands);
  for (size_t i = 1; i < ranked.size(); ++i) EXPECT_LE(ranked[i - 1].step_s, ranked[i].step_s);
  const std::string why = explain_winner(ranked);
  EXPECT_NE(why.find("why " + ranked[0].layout.name() + " wins"), std::string::npos) << why;
  EXPECT_NE(why.find("runner-up " + ranked[1].layout.name()), std::string::npos) << why;
  EXPECT_EQ(rank_layouts(L, Cluster{}, r, {Layout{}}).size(), 1u);
}

// Two calibrated shapes of one D·F (E = 8 and E = 128, as `moe plan --calibrate`'s defaults), the
// many-experts one slower at the same rows per expert (weights from DRAM): a rank's experts pick their
// nearest shape's points (log distance), interpolated in rows per expert within it; without the
// expert counts (older files, or a query without one) every point of the D·F as before.
TEST(PlanRates, NearestExpertCountPicksItsShapesPoints) {
  Rates r = round_rates();
  auto point = [](int64_t E, double rows, double gflops) {
    GemmPoint p{DType::bf16, 1024, 512, rows, gflops, gflops, gflops};
    p.experts = E;
    return p;
  };
  r.gemm = {point(8, 16, 172), point(8, 64, 470), point(8, 256, 713),
            point(128, 2, 18), point(128, 8, 62), point(128, 32, 210)};
  EXPECT_NEAR(r.ffn_at(DType::bf16, 1024, 512, 32, 4).ffn_gflops, 321, 1e-9);    // E=8's, halfway 16..64
  EXPECT_NEAR(r.ffn_at(DType::bf16, 1024, 512, 32, 100).ffn_gflops, 210, 1e-9);  // E=128's point
  EXPECT_NEAR(r.ffn_at(DType::bf16, 1024, 512, 4, 64).ffn_gflops, 40, 1e-9);     // E=128's, halfway 2..8
  EXPECT_NEAR(r.ffn_at(DType::bf16, 1024, 512, 4, 8).ffn_gflops, 172, 1e-9);     // E=8's, clamped
  EXPECT_NEAR(r.ffn_at(DType::bf16, 1024, 512, 32).ffn_gflops, 210, 1e-9);       // no count: every point
  const Rates back = parse_rates(rates_json(r), "mem");
  ASSERT_EQ(back.gemm.size(), 6u);
  EXPECT_EQ(back.gemm[3].experts, 128);
  r.gemm[5].experts = 0;  // a point without its count: the D·F's points all stand, as before
  EXPECT_NEAR(r.ffn_at(DType::bf16, 1024, 512, 32, 4).ffn_gflops, 210, 1e-9);
}

TEST(PlanRates, InterpolatesInRowsPerExpertAndRoundTrips) {
  Rates r = round_rates();
  r.gemm = {{DType::bf16, 64, 32, 10, 10, 20, 30}, {DType::bf16, 64, 32, 1000, 30, 40, 50}};
  GemmPoint g = r.ffn_at(DType::bf16, 64, 32, 100);
  EXPECT_NEAR(g.ffn_gflops, 20, 1e-9);
  EXPECT_NEAR(g.weight_grads_gflops, 40, 1e-9);
  EXPECT_DOUBLE_EQ(r.ffn_at(DType::bf16, 64, 32, 1).ffn_gflops, 10);   // clamped
  EXPECT_DOUBLE_EQ(r.ffn_at(DType::f32, 64, 32, 1e6).ffn_gflops, 30);  // no f32 point: any dtype
  r.pool_threads = 2, r.pool_speedup = 1.5;
  EXPECT_DOUBLE_EQ(r.speed(0.5, 1), 0.5);
  EXPECT_DOUBLE_EQ(r.speed(2, 2), 1.5);
  EXPECT_DOUBLE_EQ(r.speed(8, 8), 1 + 7 * 0.5);
  const Rates back = parse_rates(rates_json(r), "mem");
  EXPECT_EQ(back.gemm.size(), 2u);
  EXPECT_DOUBLE_EQ(back.intra.lat_s, r.intra.lat_s);
  EXPECT_NE(error_of([] {
              parse_rates("{\"format\": \"moe-plan-rates\", \"version\": 1}", "f.json");
            }).find("f.json: missing field 'pool_threads'"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_rates("[1]", "f.json"); }).find("f.json: not a JSON object"),
            std::string::npos);
}

// The network stack's CPU per byte from a probe between hosts: one machine's busy core-ms per
// iteration over the bytes its ranks sent (and received) in it.
TEST(PlanCalibrate, NetworkCpuPerByteFromTheProbesBusyTime) {
  // 4 hosts of one rank on one machine, 3 MB out of each: 150 core-ms -> 12.5 ns per byte.
  EXPECT_DOUBLE_EQ(network_cpu_ns_per_byte(150, 3000000, 4), 12.5);
  // One rank per machine (a real cluster): its host's busy time over its own bytes.
  EXPECT_DOUBLE_EQ(network_cpu_ns_per_byte(2.6, 2000000, 1), 1.3);
  // Nothing to divide by, or no busy time read (/proc/stat missing: -1): not measured.
  EXPECT_EQ(network_cpu_ns_per_byte(-1, 3000000, 4), 0);
  EXPECT_EQ(network_cpu_ns_per_byte(150, 0, 4), 0);
  EXPECT_EQ(network_cpu_ns_per_byte(150, 3000000, 0), 0);
}

// The wait curve is measured again while its ranks ran unequal, and the calmest attempt kept.
TEST(PlanCalibrate, WaitCurveKeepsTheCalmestOfItsAttempts) {
  struct Attempt {
    int id;
    double spread;
  };
  auto scripted = [](std::vector<double> spreads, int& calls) {
    return [spreads = std::move(spreads), &calls] {
      const int i = calls++;
      return Attempt{i, spreads.at(size_t(i))};
    };
  };
  std::vector<double> seen;
  int calls = 0;
  // Calm at once: one attempt.
  Attempt a = calmest_attempt(scripted({1.01, 1.0}, calls), kCurveAttempts, &seen);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(a.id, 0);
  EXPECT_EQ(seen, (std::vector<double>{1.01}));
  // out/v79's skew (1.19), then a calm attempt: that one, and no third.
  calls = 0;
  a = calmest_attempt(scripted({1.19, 1.02, 1.0}, calls), kCurveAttempts, &seen);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(a.id, 1);
  EXPECT_EQ(seen, (std::vector<double>{1.19, 1.02}));
  // A skew that lasts: kCurveAttempts attempts, the smallest spread kept (the first of equals).
  calls = 0;
  a = calmest_attempt(scripted({1.12, 1.08, 1.08, 1.0}, calls), kCurveAttempts, &seen);
  EXPECT_EQ(calls, kCurveAttempts);
  EXPECT_EQ(a.id, 1);
  calls = 0;
  a = calmest_attempt(scripted({1.08, 1.20, 1.30}, calls));
  EXPECT_EQ(a.id, 0);
  // At the bound is calm.
  calls = 0;
  a = calmest_attempt(scripted({kCalmSpread, 1.0}, calls));
  EXPECT_EQ(calls, 1);
  // One attempt allowed (ranks that share a core): measured once, however skewed.
  calls = 0;
  a = calmest_attempt(scripted({1.30, 1.0}, calls), 1, &seen);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, (std::vector<double>{1.30}));
}

}  // namespace
}  // namespace moe::plan
