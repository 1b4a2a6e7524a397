// The distributed layer with ep_all_to_all=hierarchical against the flat
// all-to-all, as 2 hosts x 2 ranks (MOE_RANKS_PER_HOST=2, 4 ranks): y, grad.x,
// every weight gradient and the dropped counts bit for bit, forward and
// backward, bf16 and f32, one and several token chunks, dropless and with a
// capped receive buffer (rows dropped), offload of the EP collectives off and
// on; and each all-to-all counted as two A2As.
#include <gtest/gtest.h>

#include <cstdlib>
#include <ostream>
#include <string>

#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
#include "moe/layer.h"
#include "moe/mesh.h"
#include "mpi_env.h"
#include "testing/tensors.h"

namespace moe::testing {
namespace {

struct Result {
  Tensor y, dx;
  std::vector<Tensor> grads;
  int64_t dropped = 0, a2a = 0;
};

// One forward + backward of this rank's tokens; offload: a DistRuntime with
// moe_offload_targets (side engine), else a plain mesh.
Result step(const Config& cfg, const Tensor& x, const Tensor& dy) {
  Communicator& world = testing::world();
  const int W = world.size();
  std::unique_ptr<DistRuntime> rt;
  std::unique_ptr<Mesh> mesh;
  std::unique_ptr<DistLayer> layer;
  if (!cfg.moe_offload_targets.empty()) {
    rt = std::make_unique<DistRuntime>(cfg, world, /*training=*/true);
    layer = std::make_unique<DistLayer>(cfg, *rt);
  } else {
    mesh = std::make_unique<Mesh>(world, check_parallel_config(cfg, W));
    layer = std::make_unique<DistLayer>(cfg, *mesh);
  }
  LayerWeights full = init_weights(cfg, 11);
  LayerWeights shards = layer->shard(full);
  const int64_t T = x.dim(0), t0 = row_begin(T, world.rank(), W), t1 = row_begin(T, world.rank() + 1, W);
  world.counters().reset();
  LayerOutputs out;
  auto f = layer->forward(shards, x.slice_rows(t0, t1), nullptr, out);
  LayerGrads g = layer->backward(*f, dy.slice_rows(t0, t1));
  Result r;
  r.a2a = world.counters().get(CollKind::A2A).count;
  r.y = out.y;
  r.dx = g.dx;
  r.dropped = out.dropped;
  g.weights.for_each(cfg, [&](const std::string&, const Tensor& t) { r.grads.push_back(t); });
  return r;
}

struct Case {
  const char* name;
  DType dtype;
  int64_t chunks;
  double buffer_factor;
  const char* offload;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class HierLayerMpi : public ::testing::TestWithParam<Case> {};

TEST_P(HierLayerMpi, BitExactWithFlat) {
  const Case& c = GetParam();
  Communicator& world = testing::world();
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks (2 hosts x 2)";
  const char* old = std::getenv("MOE_RANKS_PER_HOST");
  const std::string saved = old ? old : "";
  setenv("MOE_RANKS_PER_HOST", "2", 1);
  Config cfg = small_layer_config();
  cfg.expert_parallelism = 4;
  cfg.dtype = c.dtype;
  cfg.num_moe_token_chunks = c.chunks;
  cfg.ragged_buffer_factor = c.buffer_factor;
  cfg.moe_offload_targets = c.offload;
  const int64_t T = 40 * world.size();
  Tensor x = uniform({T, cfg.emb_dim}, 21), dy = uniform({T, cfg.emb_dim}, 22);
  cfg.ep_all_to_all = EpAllToAll::flat;
  const Result flat = step(cfg, x, dy);
  cfg.ep_all_to_all = EpAllToAll::hierarchical;
  const Result hier = step(cfg, x, dy);
  if (old) setenv("MOE_RANKS_PER_HOST", saved.c_str(), 1);
  else unsetenv("MOE_RANKS_PER_HOST");

  EXPECT_TRUE(hier.y.bit_equal(flat.y)) << "y max diff " << max_abs_diff(hier.y, flat.y);
  EXPECT_TRUE(hier.dx.bit_equal(flat.dx)) << "dx max diff " << max_abs_diff(hier.dx, flat.dx);
  ASSERT_EQ(hier.grads.size(), flat.grads.size());
  for (size_t i = 0; i < flat.grads.size(); ++i) EXPECT_TRUE(hier.grads[i].bit_equal(flat.grads[i])) << "grad " << i;
  EXPECT_EQ(hier.dropped, flat.dropped);
  if (c.buffer_factor > 0) {  // the capped case really drops rows somewhere
    int64_t all[4] = {};
    world.all_gather(&flat.dropped, all, sizeof(int64_t));
    EXPECT_GT(all[0] + all[1] + all[2] + all[3], 0);
  }
  EXPECT_EQ(flat.a2a, 4 * c.chunks);
  EXPECT_EQ(hier.a2a, 2 * flat.a2a) << "two phases per all-to-all";
}

const Case kCases[] = {
    {"bf16", DType::bf16, 1, -1, ""},
    {"f32", DType::f32, 1, -1, ""},
    {"bf16_chunks3", DType::bf16, 3, -1, ""},
    {"f32_capped", DType::f32, 1, 0.6, ""},
    {"bf16_chunks2_capped", DType::bf16, 2, 0.6, ""},
    {"bf16_offload_ep", DType::bf16, 1, -1, "ep_collectives"},
    {"f32_chunks3_offload_all", DType::f32, 3, -1, "all"},
    {"bf16_chunks2_capped_offload_all", DType::bf16, 2, 0.6, "all"},
};

INSTANTIATE_TEST_SUITE_P(TwoByTwo, HierLayerMpi, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Unequal hosts: hierarchical is an error naming the key and the hosts on
// every rank (before any step); auto falls back to flat.
TEST(HierLayerMpiHosts, UnequalHosts) {
  Communicator& world = testing::world();
  if (world.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const char* old = std::getenv("MOE_RANKS_PER_HOST");
  const std::string saved = old ? old : "";
  setenv("MOE_RANKS_PER_HOST", "3", 1);
  Config cfg = small_layer_config();
  cfg.expert_parallelism = 4;
  Mesh mesh(world, check_parallel_config(cfg, 4));
  if (old) setenv("MOE_RANKS_PER_HOST", saved.c_str(), 1);
  else unsetenv("MOE_RANKS_PER_HOST");
  cfg.ep_all_to_all = EpAllToAll::hierarchical;
  try {
    DistLayer layer(cfg, mesh);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ep_all_to_all=hierarchical"), std::string::npos) << m;
    EXPECT_NE(m.find("2 hosts with 3, 1 ranks"), std::string::npos) << m;
  }
  cfg.ep_all_to_all = EpAllToAll::automatic;
  EXPECT_NO_THROW(DistLayer layer(cfg, mesh));
}

}  // namespace
}  // namespace moe::testing
