// The all-gather planner against every vector of MAXTEXT_NOTES §3.3, and its
// execution on a single-process mesh.
#include <gtest/gtest.h>

#include "comm/gather_plan.h"

namespace moe {
namespace {

using Axes = std::vector<std::string>;

TEST(GatherPlan, IdenticalSpecsGiveEmptyPlan) {
  auto p = all_gather_plan({{"expert"}, {"fsdp"}, {}}, {{"expert"}, {"fsdp"}, {}}, 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->empty());
}

TEST(GatherPlan, DropsLeadingFsdp) {
  // (fsdp, None, mlp) -> (None, None, mlp): [(0, (fsdp,))]
  auto p = all_gather_plan({{"fsdp"}, {}, {"mlp"}}, {{}, {}, {"mlp"}}, 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, (GatherPlan{{0, Axes{"fsdp"}}}));
}

TEST(GatherPlan, KeepsMajorAxisAndGathersMinorOnes) {
  // ((expert, fsdp), fsdp_transpose, mlp) -> (expert, None, mlp): [(0, (fsdp,)), (1, (fsdp_transpose,))]
  auto p = all_gather_plan({{"expert", "fsdp"}, {"fsdp_transpose"}, {"mlp"}}, {{"expert"}, {}, {"mlp"}}, 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, (GatherPlan{{0, Axes{"fsdp"}}, {1, Axes{"fsdp_transpose"}}}));
}

TEST(GatherPlan, ShortSpecIsPaddedWithReplicatedDims) {
  // P(fsdp) vs P(), ndim 3: [(0, (fsdp,))]
  auto p = all_gather_plan({{"fsdp"}}, {}, 3);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, (GatherPlan{{0, Axes{"fsdp"}}}));
}

TEST(GatherPlan, DeclinesGainingAnAxis) {
  EXPECT_FALSE(all_gather_plan({{}, {}, {"mlp"}}, {{"fsdp"}, {}, {"mlp"}}, 3).has_value());
}

TEST(GatherPlan, DeclinesDroppingAMajorAxis) {
  EXPECT_FALSE(all_gather_plan({{"fsdp", "expert"}, {}, {}}, {{"expert"}, {}, {}}, 3).has_value());
}

TEST(GatherPlan, DeclinesSwappingAxes) {
  EXPECT_FALSE(all_gather_plan({{"fsdp"}, {}}, {{"expert"}, {}}, 2).has_value());
  // The MAXTEXT_NOTES caution: (fsdp_transpose, tensor) -> (tensor) is not a prefix.
  EXPECT_FALSE(all_gather_plan({{}, {}, {"fsdp_transpose", "tensor"}}, {{}, {}, {"tensor"}}, 3).has_value());
}

TEST(GatherPlan, SpecLongerThanTensorIsAnError) {
  EXPECT_THROW(all_gather_plan({{}, {}, {"fsdp"}}, {}, 2), Error);
}

Tensor iota(Shape s) {
  Tensor t(DType::f32, s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(i);
  return t;
}

TEST(GatherPlan, SingleProcessExecutionIsIdentityAndCounts) {
  auto world = make_single_process_comm();
  Mesh mesh(*world, MeshShape{});
  Tensor w = iota({4, 3, 2});
  auto plan = all_gather_plan({{"expert", "fsdp"}, {"data"}}, {{"expert"}}, 3);
  ASSERT_TRUE(plan.has_value());
  world->counters().reset();
  Tensor full = gather_by_plan(mesh, w, *plan);
  EXPECT_TRUE(full.bit_equal(w));
  EXPECT_EQ(world->counters().get(CollKind::AG).count, 2);
  Tensor g = reduce_scatter_by_plan(mesh, full, *plan);
  EXPECT_TRUE(g.bit_equal(w));
  EXPECT_EQ(world->counters().get(CollKind::RS).count, 2);
  EXPECT_TRUE(local_shard(mesh, w, {{"fsdp"}, {}, {"expert"}}).bit_equal(w));
}

// Every element of every shard, from index arithmetic alone: dims cut by one axis, by two axes
// (major first), several dims cut at once, the innermost dim cut, nothing cut.
TEST(GatherPlan, ShardAtKeepsEachRanksBoxElementByElement) {
  const MeshShape shape{2, 3, 2};  // data, fsdp, expert
  const Shape dims = {12, 6, 6, 4};
  Tensor full = iota(dims);
  const std::vector<ShardSpec> specs = {
      {{"fsdp"}},
      {{}, {"data", "fsdp"}},
      {{"expert"}, {"fsdp"}, {}, {"data"}},
      {{}, {}, {}, {"expert"}},
      {{"data", "expert"}, {}, {"fsdp"}},
      {},
  };
  for (const ShardSpec& spec : specs)
    for (int r = 0; r < shape.size(); ++r) {
      const MeshCoords c = shape.coords_of(r);
      std::vector<int64_t> n(dims.size(), 1), at(dims.size(), 0);  // shards and this rank's index per dim
      for (size_t d = 0; d < spec.size(); ++d)
        for (MeshAxis a : parse_mesh_axes(spec[d])) {
          at[d] = at[d] * shape.extent(a) + c[a];
          n[d] *= shape.extent(a);
        }
      Tensor got = shard_at(shape, c, full, spec);
      Shape want_shape;
      for (size_t d = 0; d < dims.size(); ++d) want_shape.push_back(dims[d] / n[d]);
      ASSERT_EQ(got.shape(), want_shape) << "rank " << r;
      for (int64_t i = 0; i < got.numel(); ++i) {
        int64_t rest = i, src = 0, stride = 1;  // i's multi-index in the shard -> flat index in full
        for (size_t d = dims.size(); d-- > 0;) {
          const int64_t k = rest % want_shape[d];
          rest /= want_shape[d];
          src += (at[d] * want_shape[d] + k) * stride;
          stride *= dims[d];
        }
        ASSERT_EQ(got.data<float>()[i], float(src)) << "rank " << r << " element " << i;
      }
    }
  EXPECT_THROW(shard_at(shape, MeshCoords{}, iota({4, 5}), {{}, {"fsdp"}}), Error);  // 5 by 3 shards
}

TEST(GatherPlan, DimChecks) {
  auto world = make_single_process_comm();
  EXPECT_THROW(all_gather_dim(*world, iota({2, 2}), 2), Error);
  EXPECT_THROW(reduce_scatter_dim(*world, iota({2}).to(DType::bf16), 0), Error);
}

}  // namespace
}  // namespace moe
