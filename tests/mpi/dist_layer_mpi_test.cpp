// The distributed layer against the single-process layer on the same global
// batch: every rank computes the single-process reference itself (small
// sizes), runs its shard of the distributed step, and compares its rows
// bit for bit (y, grad.x, routing, aux losses) and the reassembled weight
// gradients (bit-exact, or within the stated bound when partial sums are
// added across ranks).
#include <gtest/gtest.h>

#include <cmath>

#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/layer.h"
#include "moe/mesh.h"
#include "mpi_env.h"
#include "testing/tensors.h"

namespace moe::testing {
namespace {

struct Case {
  const char* name;
  int data, fsdp, expert;
  void (*tweak)(Config&);
  bool explicit_plan = false;
  bool tokens_exact = true;  // y and grad.x bit-exact (ring of experts with K > 2: a regrouped sum)
};

Config base_config() { return small_layer_config(); }

// Bound for weight gradients summed over ranks in another order than the
// single process: each element is a sum of n products of bf16-rounded values;
// regrouping the sum into per-rank partials changes it by at most about
// n * 2^-24 * sum|terms|. We check |a - b| <= 1e-5 * max(1, max|b|).
void expect_grads(const Config& cfg, const LayerWeights& got, const LayerWeights& want, bool exact) {
  std::vector<Tensor> w;
  want.for_each(cfg, [&](const std::string&, const Tensor& t) { w.push_back(t); });
  size_t i = 0;
  got.for_each(cfg, [&](const std::string& name, const Tensor& t) {
    const Tensor& ref = w[i++];
    ASSERT_EQ(t.shape(), ref.shape()) << name;
    if (exact && name != "router.kernel")
      EXPECT_TRUE(t.bit_equal(ref)) << "grad." << name << " max diff " << max_abs_diff(t, ref);
    else
      EXPECT_LE(max_abs_diff(t, ref), 1e-5 * std::max(1.0, max_abs(ref))) << "grad." << name;
  });
}

void run_case(const Case& c) {
  Communicator& world = testing::world();
  const int W = world.size();
  if (c.data * c.fsdp * c.expert != W) GTEST_SKIP() << "needs " << c.data * c.fsdp * c.expert << " ranks";
  Config cfg = base_config();
  cfg.data_parallelism = c.data;
  cfg.fsdp_parallelism = c.fsdp;
  cfg.expert_parallelism = c.expert;
  if (c.tweak) c.tweak(cfg);
  const int64_t T = 12 * W;
  LayerWeights full = init_weights(cfg, 7);
  Tensor x = uniform({T, cfg.emb_dim}, 8), dy = uniform({T, cfg.emb_dim}, 9);
  LayerOutputs ref;
  auto rf = layer_forward(cfg, full, x, nullptr, ref);
  LayerGrads rg = layer_backward(cfg, *rf, dy);

  Mesh mesh(world, check_parallel_config(cfg, W));
  DistLayer layer(cfg, mesh, c.explicit_plan);
  const int64_t t0 = row_begin(T, world.rank(), W), t1 = row_begin(T, world.rank() + 1, W);
  LayerOutputs out;
  auto f = layer.forward(layer.shard(full), x.slice_rows(t0, t1), nullptr, out);
  LayerGrads g = layer.backward(*f, dy.slice_rows(t0, t1));
  Tensor ry = ref.y.slice_rows(t0, t1), rdx = rg.dx.slice_rows(t0, t1);
  EXPECT_TRUE(out.topk_idx.bit_equal(ref.topk_idx.slice_rows(t0, t1)));
  EXPECT_EQ(out.load_balance_loss, ref.load_balance_loss);
  EXPECT_EQ(out.z_loss, ref.z_loss);
  if (c.tokens_exact) {
    EXPECT_TRUE(out.y.bit_equal(ry)) << "y max diff " << max_abs_diff(out.y, ry);
    EXPECT_TRUE(g.dx.bit_equal(rdx)) << "dx max diff " << max_abs_diff(g.dx, rdx);
  } else {
    // K terms summed per rank, then across ranks: a few f32 ulps, then one bf16 rounding of y
    // (which may land one bf16 ulp away).
    EXPECT_LE(max_abs_diff(out.y, ry), std::ldexp(max_abs(ry), -7)) << "y";
    EXPECT_LE(max_abs_diff(g.dx, rdx), 1e-5 * std::max(1.0, max_abs(rdx))) << "dx";
  }
  LayerWeights grads = layer.unshard_to_root(g.weights);
  // Weight gradients see bf16 values of y's inputs only, not y: exact whenever each expert's rows live on one rank.
  if (world.rank() == 0) expect_grads(cfg, grads, rg.weights, c.data == 1 && c.fsdp == 1);
}

const Case kCases[] = {
    {"ep2", 1, 1, 2, nullptr},
    {"fsdp2", 1, 2, 1, nullptr},
    {"fsdp2_explicit", 1, 2, 1, nullptr, true},
    {"data2", 2, 1, 1, nullptr},
    {"ep2_chunks3_capacity", 1, 1, 2, [](Config& c) { c.num_moe_token_chunks = 3; c.capacity_factor = 0.8; }},
    {"fsdp2_shard_exp", 1, 2, 1, [](Config& c) { c.shard_exp_on_fsdp = true; }},
    {"ep2_f32_prefused_reference", 1, 1, 2,
     [](Config& c) {
       c.dtype = DType::f32;
       c.prefuse_moe_weights = true;
       c.moe_permute_kernel = c.moe_combine_kernel = KernelChoice::reference;
     }},
    {"ep4", 1, 1, 4, nullptr},
    {"ep4_chunks4", 1, 1, 4, [](Config& c) { c.num_moe_token_chunks = 4; }},
    {"fsdp4", 1, 4, 1, nullptr},
    {"fsdp2_ep2", 1, 2, 2, nullptr},
    {"fsdp2_ep2_explicit", 1, 2, 2, nullptr, true},
    {"data2_ep2_capacity", 2, 1, 2, [](Config& c) { c.capacity_factor = 1.0; }},
    {"fsdp4_split", 1, 4, 1, [](Config& c) { c.prefuse_moe_weights = c.moe_split_expert_weight_layout = true; }},
    {"fsdp2_ep2_shard_exp_chunks2", 1, 2, 2, [](Config& c) { c.shard_exp_on_fsdp = true; c.num_moe_token_chunks = 2; }},
    {"ring_ep2", 1, 1, 2, [](Config& c) { c.use_ring_of_experts = true; }},
    {"ring_ep2_chunks3_capacity", 1, 1, 2,
     [](Config& c) { c.use_ring_of_experts = true; c.num_moe_token_chunks = 3; c.capacity_factor = 0.8; }},
    {"ring_ep2_k3", 1, 1, 2, [](Config& c) { c.use_ring_of_experts = true; c.num_experts_per_tok = 3; }, false, false},
    {"ring_ep4_chunks4", 1, 1, 4, [](Config& c) { c.use_ring_of_experts = true; c.num_moe_token_chunks = 4; }},
    {"ring_fsdp2_ep2", 1, 2, 2, [](Config& c) { c.use_ring_of_experts = true; }},
};

class DistLayerMpi : public ::testing::TestWithParam<Case> {};
TEST_P(DistLayerMpi, MatchesSingleProcess) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(Meshes, DistLayerMpi, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A capped receive buffer drops the highest senders' rows and reports them;
// a generous cap drops nothing and equals the dropless run.
TEST(DistLayerMpiBuffer, CappedBufferDropsAndReports) {
  Communicator& world = testing::world();
  const int W = world.size();
  Config cfg = base_config();
  cfg.expert_parallelism = W;
  Mesh mesh(world, check_parallel_config(cfg, W));
  DistLayer layer(cfg, mesh);
  LayerWeights full = init_weights(cfg, 3);
  Tensor x = uniform({int64_t(16) * W, cfg.emb_dim}, 4);
  const int64_t t0 = row_begin(x.dim(0), world.rank(), W), t1 = row_begin(x.dim(0), world.rank() + 1, W);
  LayerOutputs dropless, generous, tight;
  layer.forward(layer.shard(full), x.slice_rows(t0, t1), nullptr, dropless);
  cfg.ragged_buffer_factor = double(W);  // room for every row
  layer.forward(layer.shard(full), x.slice_rows(t0, t1), nullptr, generous);
  EXPECT_TRUE(generous.y.bit_equal(dropless.y));
  EXPECT_EQ(generous.dropped, 0);
  cfg.ragged_buffer_factor = 0.25;
  layer.forward(layer.shard(full), x.slice_rows(t0, t1), nullptr, tight);
  int64_t dropped = tight.dropped, total = 0;
  std::vector<int64_t> all(static_cast<size_t>(W));
  world.all_gather(&dropped, all.data(), sizeof(int64_t));
  for (int64_t d : all) total += d;
  EXPECT_GT(total, 0);
}

}  // namespace
}  // namespace moe::testing
