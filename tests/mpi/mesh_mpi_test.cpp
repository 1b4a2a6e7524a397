// Mesh sub-communicators, the gather plan with its reduce-scatter backward,
// and the expert-parallel dispatch/combine layouts on real ranks. Every test
// runs on every factorization of the world size into (data, fsdp, expert).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "comm/ep_plan.h"
#include "comm/gather_plan.h"
#include "comm/machines.h"
#include "moe/error.h"
#include "moe/mesh.h"
#include "mpi_env.h"

namespace moe::testing {
namespace {

std::vector<MeshShape> factorizations(int w) {
  std::vector<MeshShape> out;
  for (int d = 1; d <= w; ++d)
    for (int f = 1; d * f <= w; ++f)
      if (w % (d * f) == 0) out.push_back(MeshShape{d, f, w / (d * f)});
  return out;
}

const std::vector<std::vector<std::string>> kAxisLists = {
    {},         {"data"},          {"fsdp"},           {"expert"},       {"fsdp", "expert"},
    {"expert", "fsdp"}, {"data", "expert"}, {"data", "fsdp", "expert"}, {"expert", "data", "fsdp"}};

// World rank of the member with index t of `axes` in this rank's group.
int member_rank(const Mesh& mesh, const std::vector<std::string>& axes, int t) {
  return mesh.shape().rank_of(mesh.member_coords(parse_mesh_axes(axes), t));
}

TEST(MpiMesh, SubCommunicatorsFollowCoordinateOrder) {
  Communicator& w = world();
  for (MeshShape s : factorizations(w.size())) {
    Mesh mesh(w, s);
    EXPECT_EQ(s.rank_of(mesh.coords()), w.rank());
    for (const auto& axes : kAxisLists) {
      Communicator& c = mesh.comm(axes);
      ASSERT_EQ(c.size(), mesh.extent(axes));
      EXPECT_EQ(c.rank(), mesh.index(axes));
      int32_t me = w.rank();
      std::vector<int32_t> members(size_t(c.size()));
      c.all_gather(&me, members.data(), sizeof(me));
      for (int t = 0; t < c.size(); ++t)
        EXPECT_EQ(members[size_t(t)], member_rank(mesh, axes, t)) << "mesh " << s.data << "x" << s.fsdp << "x"
                                                                  << s.expert << " axes " << axes.size();
    }
  }
}

// The wait policy for large transfers (Communicator::set_polite_waits_from): the groups that cross
// hosts get the threshold, the groups inside one host and the rank alone do not. Hosts from
// MOE_RANKS_PER_HOST; the threshold forced with MOE_POLITE_FROM_BYTES (whatever this machine's cores).
TEST(MpiMesh, GroupsAcrossHostsWaitPolitelyForLargeTransfers) {
  Communicator& w = world();
  ScopedEnv from("MOE_POLITE_FROM_BYTES", "12345");
  for (int per_host : {1, 2}) {
    if (w.size() % per_host) continue;
    ScopedEnv hosts("MOE_RANKS_PER_HOST", std::to_string(per_host));
    for (MeshShape s : factorizations(w.size())) {
      Mesh mesh(w, s);
      for (const auto& axes : kAxisLists) {
        Communicator& c = mesh.comm(axes);
        // Members' world ranks: the group crosses hosts where two differ in rank / per_host.
        bool across = false;
        for (int t = 1; t < c.size(); ++t)
          across = across || member_rank(mesh, axes, t) / per_host != member_rank(mesh, axes, 0) / per_host;
        EXPECT_EQ(c.polite_waits_from(), across ? 12345u : 0u)
            << "mesh " << s.data << "x" << s.fsdp << "x" << s.expert << " axes " << axes.size() << " per host "
            << per_host;
        // Same results either way: an all-gather above the threshold, waited for politely.
        std::vector<float> mine(4000, float(w.rank())), all(mine.size() * size_t(c.size()));
        c.all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
        for (int t = 0; t < c.size(); ++t)
          EXPECT_EQ(all[size_t(t) * mine.size() + 17], float(member_rank(mesh, axes, t)));
      }
    }
  }
  {  // MPI's own hosts: one under plain mpirun, one per rank or pair of ranks in the cluster tests.
    ScopedEnv hosts("MOE_RANKS_PER_HOST", "");
    Mesh mesh(w, MeshShape{1, 1, w.size()});
    const bool across = w.split_by_host(w.rank())->size() < w.size();
    EXPECT_EQ(mesh.comm({"expert"}).polite_waits_from(), across ? 12345u : 0u);
  }
  {  // Off.
    ScopedEnv hosts("MOE_RANKS_PER_HOST", "1"), off("MOE_POLITE_FROM_BYTES", "0");
    Mesh mesh(w, MeshShape{1, 1, w.size()});
    EXPECT_EQ(mesh.comm({"expert"}).polite_waits_from(), 0u);
  }
}

// Without the override the threshold follows the machine: every rank of this test is on one
// machine (one boot id), so with one rank per host it applies exactly when the ranks outnumber its
// cores.
TEST(MpiMesh, PoliteThresholdFollowsRanksAgainstCores) {
  Communicator& w = world();
  ScopedEnv hosts("MOE_RANKS_PER_HOST", "1"), from("MOE_POLITE_FROM_BYTES", "");
  const bool over = unsigned(w.size()) > std::max(1u, std::thread::hardware_concurrency());
  EXPECT_EQ(shared_core_polite_bytes(w), over ? kSharedCorePoliteBytes : 0u);
}

TEST(MpiMesh, BadPoliteThresholdNamesTheVariable) {
  ScopedEnv from("MOE_POLITE_FROM_BYTES", "2MiB");
  try {
    shared_core_polite_bytes(world());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MOE_POLITE_FROM_BYTES"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2MiB"), std::string::npos) << e.what();
  }
}

// Integer-valued tensor depending on (rank, salt): sums are exact.
Tensor int_tensor(Shape shape, int rank, int salt) {
  Tensor t(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float((i * 7 + rank * 13 + salt) % 101 - 50);
  return t;
}

struct PlanCase {
  ShardSpec stored, needed;
};
const std::vector<PlanCase> kPlanCases = {
    {{{"expert"}, {"fsdp"}, {}}, {{"expert"}, {}, {}}},
    {{{"expert", "fsdp"}, {"data"}}, {{"expert"}}},
    {{{"fsdp", "expert", "data"}}, {}},
    {{{}, {"data", "fsdp"}, {"expert"}}, {}},
};

TEST(MpiGatherPlan, GathersTheNeededLayout) {
  Communicator& w = world();
  const Tensor full = int_tensor({8, 8, 8}, 0, 1);
  for (MeshShape s : factorizations(w.size())) {
    Mesh mesh(w, s);
    for (const PlanCase& pc : kPlanCases) {
      auto plan = all_gather_plan(pc.stored, pc.needed, 3);
      ASSERT_TRUE(plan.has_value());
      w.counters().reset();
      Tensor got = gather_by_plan(mesh, local_shard(mesh, full, pc.stored), *plan);
      EXPECT_TRUE(got.bit_equal(local_shard(mesh, full, pc.needed)));
      EXPECT_EQ(w.counters().get(CollKind::AG).count, int64_t(plan->size()));
    }
  }
}

// Backward: rank r's shard gradient = its shard of the sum of the full-size
// gradients of every rank that gathered with it.
TEST(MpiGatherPlan, ReduceScatterBackwardSumsTheGroup) {
  Communicator& w = world();
  for (MeshShape s : factorizations(w.size())) {
    Mesh mesh(w, s);
    for (const PlanCase& pc : kPlanCases) {
      if (!pc.needed.empty()) continue;  // full-size gradient: needed is replicated
      auto plan = all_gather_plan(pc.stored, pc.needed, 3);
      ASSERT_TRUE(plan.has_value());
      Tensor got = reduce_scatter_by_plan(mesh, int_tensor({8, 8, 8}, w.rank(), 3), *plan);
      Tensor sum(DType::f32, {8, 8, 8});
      for (int q = 0; q < w.size(); ++q) {
        MeshCoords a = s.coords_of(q), b = mesh.coords();
        bool same_group = true;  // plans here gather over every axis the spec uses
        for (int ax = 0; ax < kNumMeshAxes; ++ax) {
          bool used = false;
          for (const auto& dim : pc.stored)
            for (const auto& name : dim) used = used || name == mesh_axis_name(MeshAxis(ax));
          if (!used) same_group = same_group && a[MeshAxis(ax)] == b[MeshAxis(ax)];
        }
        if (!same_group) continue;
        Tensor g = int_tensor({8, 8, 8}, q, 3);
        for (int64_t i = 0; i < sum.numel(); ++i) sum.data<float>()[i] += g.data<float>()[i];
      }
      EXPECT_TRUE(got.bit_equal(local_shard(mesh, sum, pc.stored)));
    }
  }
}

// The one-collective gradient path gives the bits of the baseline
// (all-reduce over the group in world order, then keep the shard).
TEST(MpiGatherPlan, ReduceToShardMatchesAllReduceThenShardBitForBit) {
  Communicator& w = world();
  Tensor g(DType::f32, {8, 8, 8});
  for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = seeded_float(w.rank(), i, 11);
  const std::vector<std::string> all_axes = {"expert", "data", "fsdp"};  // any order: summed in world order
  for (MeshShape s : factorizations(w.size())) {
    Mesh mesh(w, s);
    Tensor summed = Tensor::empty(DType::f32, g.shape());
    w.all_reduce_sum(g.data<float>(), summed.data<float>(), size_t(g.numel()));
    for (const PlanCase& pc : kPlanCases) {
      w.counters().reset();
      Tensor got = reduce_to_shard(mesh, g, pc.stored, all_axes);
      EXPECT_TRUE(got.bit_equal(local_shard(mesh, summed, pc.stored)));
      EXPECT_EQ(w.counters().get(CollKind::RS).count, 1);
    }
  }
}

struct Row {
  int32_t src, dst, k;
};

CountMatrix ep_counts(int ep) {
  CountMatrix a(ep, ep);
  for (int i = 0; i < ep; ++i)
    for (int j = 0; j < ep; ++j) a.at(i, j) = (i * 3 + j * 5) % 4 + 1;
  return a;
}

// Dispatch tagged rows with a capped buffer, mark them, combine them back:
// kept rows return to their original slots, dropped slots are never written.
void dispatch_and_combine(Communicator& w, int64_t cap) {
  const int s = w.rank();
  CountMatrix a = ep_counts(w.size()), hat = truncate_counts(a, cap);
  std::vector<Row> send;
  for (int j = 0; j < w.size(); ++j)
    for (int64_t k = 0; k < a.at(s, j); ++k) send.push_back(Row{s, j, int32_t(k)});
  std::vector<Row> buf(size_t(cap), Row{-7, -7, -7});
  w.all_to_allv(send.data(), buf.data(), dispatch_layout(a, hat, s), sizeof(Row));
  std::vector<int64_t> at = exclusive_cumsum(hat.col(s));
  for (int i = 0; i < w.size(); ++i)
    for (int64_t k = 0; k < hat.at(i, s); ++k) {
      Row r = buf[size_t(at[size_t(i)] + k)];
      EXPECT_TRUE(r.src == i && r.dst == s && r.k == k) << "dispatch row " << k << " from " << i;
      buf[size_t(at[size_t(i)] + k)].k += 1000;
    }
  std::vector<Row> back(send.size(), Row{-7, -7, -7});
  w.all_to_allv(buf.data(), back.data(), combine_layout(a, hat, s), sizeof(Row));
  std::vector<int64_t> slot = exclusive_cumsum(a.row(s));
  for (int j = 0; j < w.size(); ++j)
    for (int64_t k = 0; k < a.at(s, j); ++k) {
      Row r = back[size_t(slot[size_t(j)] + k)];
      if (k < hat.at(s, j))
        EXPECT_TRUE(r.src == s && r.dst == j && r.k == k + 1000) << "combine row " << k << " to " << j;
      else
        EXPECT_EQ(r.src, -7) << "dropped slot " << k << " of shard " << j << " was written";
    }
}

TEST(MpiEpPlan, DispatchAndCombineRoundTrip) {
  Communicator& w = world();
  const CountMatrix a = ep_counts(w.size());
  int64_t worst = 0;
  for (int j = 0; j < w.size(); ++j) {
    int64_t c = 0;
    for (int i = 0; i < w.size(); ++i) c += a.at(i, j);
    worst = std::max(worst, c);
  }
  dispatch_and_combine(w, worst);      // dropless
  dispatch_and_combine(w, worst / 2);  // capped: lower senders win
}

}  // namespace
}  // namespace moe::testing
