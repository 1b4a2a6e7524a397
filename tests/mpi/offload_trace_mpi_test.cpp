// SPEC.md §6 on a real mesh: with moe_offload_targets: "" the step trace is
// identical to the path without the feature (DistLayer with no runtime), and
// nothing runs on the side engine; with "all" ops do run there while loss, y
// and every gradient stay bit-identical.
#include <gtest/gtest.h>

#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
#include "mpi_env.h"
#include "testing/tensors.h"

namespace moe::testing {
namespace {

Config ep_config(int W) {
  Config c = small_layer_config();
  c.expert_parallelism = W;
  c.num_moe_token_chunks = 2;
  return c;
}

struct Stepped {
  LayerOutputs out;
  LayerGrads grads;
  std::vector<TraceOp> ops;
  int64_t so = 0;  // SO counter of the step
};

// One forward + backward of this rank's rows on `layer`, traced into `trace`.
Stepped step(const DistLayer& layer, StepTrace& trace, const Config& cfg) {
  Communicator& world = testing::world();
  const int W = world.size();
  const int64_t T = 8 * W, t0 = row_begin(T, world.rank(), W), t1 = row_begin(T, world.rank() + 1, W);
  Tensor x = uniform({T, cfg.emb_dim}, 21), dy = uniform({T, cfg.emb_dim}, 22);
  LayerWeights shards = layer.shard(init_weights(cfg, 20));
  Stepped s;
  world.counters().reset();
  trace.restart();
  auto f = layer.forward(shards, x.slice_rows(t0, t1), nullptr, s.out);
  s.grads = layer.backward(*f, dy.slice_rows(t0, t1));
  s.so = world.counters().get(CollKind::SO).count;
  s.ops = trace.ops();
  return s;
}

void expect_same_results(const Config& cfg, const Stepped& a, const Stepped& b) {
  EXPECT_TRUE(a.out.y.bit_equal(b.out.y));
  EXPECT_EQ(a.out.load_balance_loss, b.out.load_balance_loss);
  EXPECT_TRUE(a.grads.dx.bit_equal(b.grads.dx));
  std::vector<Tensor> wa;
  a.grads.weights.for_each(cfg, [&](const std::string&, const Tensor& t) { wa.push_back(t); });
  size_t i = 0;
  b.grads.weights.for_each(cfg, [&](const std::string& n, const Tensor& t) { EXPECT_TRUE(t.bit_equal(wa[i++])) << n; });
}

TEST(OffloadTraceMpi, EmptyTargetsTraceEqualsThePathWithoutTheFeature) {
  Communicator& world = testing::world();
  const Config cfg = ep_config(world.size());
  Mesh mesh(world, check_parallel_config(cfg, world.size()));
  StepTrace plain_trace(world.rank());
  DistLayer plain(cfg, mesh, false, &plain_trace);
  const Stepped without = step(plain, plain_trace, cfg);

  DistRuntime rt(cfg, world, /*training=*/true);
  rt.enable_trace(true);
  EXPECT_EQ(rt.side(), nullptr);
  DistLayer layer(cfg, rt);
  const Stepped with = step(layer, *rt.trace(), cfg);

  EXPECT_EQ(compare_op_sequences(without.ops, with.ops), "");
  EXPECT_FALSE(with.ops.empty());
  EXPECT_EQ(with.so, 0);
  EXPECT_EQ(rt.trace()->side_op_count(), 0);
  expect_same_results(cfg, without, with);
}

TEST(OffloadTraceMpi, AllTargetsRunOnTheSideEngineBitIdentically) {
  Communicator& world = testing::world();
  Config cfg = ep_config(world.size());
  Mesh mesh(world, check_parallel_config(cfg, world.size()));
  StepTrace plain_trace(world.rank());
  DistLayer plain(cfg, mesh, false, &plain_trace);
  const Stepped off = step(plain, plain_trace, cfg);

  cfg.moe_offload_targets = "all";
  DistRuntime rt(cfg, world, /*training=*/true);
  rt.enable_trace(true);
  ASSERT_NE(rt.side(), nullptr) << "the MPI backend offers no side engine here";
  DistLayer layer(cfg, rt);
  const Stepped on = step(layer, *rt.trace(), cfg);

  EXPECT_GT(rt.trace()->side_op_count(), 0);
  EXPECT_EQ(on.so, rt.trace()->side_op_count());
  EXPECT_NE(compare_op_sequences(off.ops, on.ops), "");
  expect_same_results(cfg, off, on);
}

// fsdp_all_gather: the expert gradients' reduce-scatters leave one by one, wo's while wi's are
// computed (a second weight_grads op), and the results stay bit-identical to the inline path.
TEST(OffloadTraceMpi, FsdpGradientsLeaveAsSoonAsComputed) {
  Communicator& world = testing::world();
  if (world.size() == 1) GTEST_SKIP() << "one rank: no gradient to reduce (run under mpirun -np 2 or 4)";
  Config cfg = small_layer_config();
  cfg.fsdp_parallelism = world.size();
  cfg.num_moe_token_chunks = 2;
  Mesh mesh(world, check_parallel_config(cfg, world.size()));
  StepTrace plain_trace(world.rank());
  DistLayer plain(cfg, mesh, false, &plain_trace);
  const Stepped off = step(plain, plain_trace, cfg);
  int plain_wg = 0;
  for (const TraceOp& op : off.ops) plain_wg += op.name == "weight_grads";
  EXPECT_EQ(plain_wg, 1);

  cfg.moe_offload_targets = "fsdp_all_gather";
  DistRuntime rt(cfg, world, /*training=*/true);
  rt.enable_trace(true);
  ASSERT_NE(rt.side(), nullptr) << "the MPI backend offers no side engine here";
  DistLayer layer(cfg, rt);
  const Stepped on = step(layer, *rt.trace(), cfg);
  expect_same_results(cfg, off, on);

  std::vector<const TraceOp*> wg, rs;
  for (const TraceOp& op : on.ops) {
    if (op.name == "weight_grads" && op.engine == OpEngine::compute) wg.push_back(&op);
    if (op.name.rfind("RS:grad.", 0) == 0 && op.engine == OpEngine::side) rs.push_back(&op);
  }
  ASSERT_EQ(wg.size(), 2u);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0]->name, "RS:grad.experts.wo");
  EXPECT_GE(rs[0]->start_us, wg[0]->end_us);  // submitted once wo's gradient exists
  EXPECT_LE(rs[1]->start_us, rs[2]->start_us);
  for (size_t i = 1; i < 3; ++i) EXPECT_GE(rs[i]->start_us, wg[1]->end_us) << rs[i]->name;
}

}  // namespace
}  // namespace moe::testing
