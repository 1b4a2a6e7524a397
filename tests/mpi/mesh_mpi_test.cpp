// Mesh sub-communicators, the gather plan with its reduce-scatter backward,
// and the expert-parallel dispatch/combine layouts on real ranks. Every test
// runs on every factorization of the world size into (data, fsdp, expert).
#include <gtest/gtest.h>

#include "comm/ep_plan.h"
#include "comm/gather_plan.h"
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
