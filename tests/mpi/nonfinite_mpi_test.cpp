// One rank's non-finite token makes the aux losses NaN on every rank (the
// count travels in the aux statistics' all-gather, no extra message), with
// offload on and off, while every finite token's rows of y and grad.x and its
// routing equal the single-process layer's bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
#include "moe/layer.h"
#include "moe/mesh.h"
#include "mpi_env.h"
#include "testing/tensors.h"

namespace moe::testing {
namespace {

struct Case {
  const char* name;
  void (*tweak)(Config&, int W);
  bool runtime = false;  // through a DistRuntime (moe_offload_targets applied)
};

bool rows_equal(const Tensor& a, int64_t ra, const Tensor& b, int64_t rb) {
  return a.slice_rows(ra, ra + 1).bit_equal(b.slice_rows(rb, rb + 1));
}

void run_case(const Case& c, float bad_value, bool whole_row) {
  Communicator& world = testing::world();
  const int W = world.size();
  Config cfg = small_layer_config();
  c.tweak(cfg, W);
  const int64_t T = 8 * W, D = cfg.emb_dim;
  LayerWeights full = init_weights(cfg, 31);
  Tensor x = uniform({T, D}, 32), dy = uniform({T, D}, 33);
  // The bad token: the last rank's second row (every other rank holds finite tokens only).
  const int64_t bad = row_begin(T, W - 1, W) + 1;
  for (int64_t d = whole_row ? 0 : 5; d < (whole_row ? D : 6); ++d) x.data<float>()[bad * D + d] = bad_value;

  LayerOutputs ref;
  auto rf = layer_forward(cfg, full, x, nullptr, ref);
  LayerGrads rg = layer_backward(cfg, *rf, dy);
  ASSERT_EQ(ref.nonfinite_tokens, 1);

  Mesh mesh(world, check_parallel_config(cfg, W));
  std::unique_ptr<DistRuntime> rt;
  std::unique_ptr<DistLayer> layer;
  if (c.runtime) {
    rt = std::make_unique<DistRuntime>(cfg, world, /*training=*/true);
    layer = std::make_unique<DistLayer>(cfg, *rt);
  } else {
    layer = std::make_unique<DistLayer>(cfg, mesh, false);
  }
  const int64_t t0 = row_begin(T, world.rank(), W), t1 = row_begin(T, world.rank() + 1, W);
  world.counters().reset();
  LayerOutputs out;
  auto f = layer->forward(layer->shard(full), x.slice_rows(t0, t1), nullptr, out);
  const int64_t ag_after_forward = world.counters().get(CollKind::AG).count;
  LayerGrads g = layer->backward(*f, dy.slice_rows(t0, t1));

  EXPECT_TRUE(std::isnan(out.load_balance_loss)) << "rank " << world.rank();
  EXPECT_TRUE(std::isnan(out.z_loss)) << "rank " << world.rank();
  EXPECT_EQ(out.nonfinite_tokens, 1) << "rank " << world.rank();
  EXPECT_GT(ag_after_forward, 0);
  for (int64_t t = t0; t < t1; ++t) {
    SCOPED_TRACE(t);
    EXPECT_TRUE(rows_equal(out.topk_idx, t - t0, ref.topk_idx, t)) << "topk_idx";
    if (t == bad) {
      EXPECT_TRUE(std::isnan(out.y.get_f32((t - t0) * D)));
      continue;
    }
    EXPECT_TRUE(rows_equal(out.y, t - t0, ref.y, t)) << "y";
    EXPECT_TRUE(rows_equal(out.topk_weights, t - t0, ref.topk_weights, t)) << "topk_weights";
    EXPECT_TRUE(rows_equal(g.dx, t - t0, rg.dx, t)) << "grad.x";
  }
}

// The same step on clean inputs sends the same number of all-gathers: the flag rides along.
int64_t forward_all_gathers(const Case& c, bool with_nan) {
  Communicator& world = testing::world();
  const int W = world.size();
  Config cfg = small_layer_config();
  c.tweak(cfg, W);
  const int64_t T = 8 * W;
  Tensor x = uniform({T, cfg.emb_dim}, 32);
  if (with_nan)
    x.data<float>()[row_begin(T, W - 1, W) * cfg.emb_dim] = std::numeric_limits<float>::quiet_NaN();
  Mesh mesh(world, check_parallel_config(cfg, W));
  DistLayer layer(cfg, mesh, false);
  const int64_t t0 = row_begin(T, world.rank(), W), t1 = row_begin(T, world.rank() + 1, W);
  LayerWeights shards = layer.shard(init_weights(cfg, 31));
  world.counters().reset();
  LayerOutputs out;
  layer.forward(shards, x.slice_rows(t0, t1), nullptr, out);
  return world.counters().get(CollKind::AG).count * 1000 + world.counters().get(CollKind::A2A).count;
}

const Case kCases[] = {
    {"ep", [](Config& c, int W) { c.expert_parallelism = W; }},
    {"ep_offload_all",
     [](Config& c, int W) {
       c.expert_parallelism = W;
       c.num_moe_token_chunks = 2;
       c.moe_offload_targets = "all";
     },
     true},
    {"ep_offload_none",
     [](Config& c, int W) {
       c.expert_parallelism = W;
       c.num_moe_token_chunks = 2;
     },
     true},
    {"ep_chunks_capacity",
     [](Config& c, int W) {
       c.expert_parallelism = W;
       c.num_moe_token_chunks = 3;
       c.capacity_factor = 1.0;
     }},
    {"ring",
     [](Config& c, int W) {
       c.expert_parallelism = W;
       c.use_ring_of_experts = true;
     }},
    {"data", [](Config& c, int W) { c.data_parallelism = W; }},
    {"fsdp", [](Config& c, int W) { c.fsdp_parallelism = W; }},
};

class NonFiniteMpi : public ::testing::TestWithParam<Case> {};

TEST_P(NonFiniteMpi, OneNanOnTheLastRank) {
  run_case(GetParam(), std::numeric_limits<float>::quiet_NaN(), false);
}
TEST_P(NonFiniteMpi, OneInfOnTheLastRank) {
  run_case(GetParam(), std::numeric_limits<float>::infinity(), false);
}
TEST_P(NonFiniteMpi, MinusInfRowOnTheLastRank) {
  run_case(GetParam(), -std::numeric_limits<float>::infinity(), true);
}
TEST_P(NonFiniteMpi, MessageCountsAreUnchanged) {
  EXPECT_EQ(forward_all_gathers(GetParam(), true), forward_all_gathers(GetParam(), false));
}

INSTANTIATE_TEST_SUITE_P(Meshes, NonFiniteMpi, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace moe::testing
