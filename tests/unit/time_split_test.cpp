// The summary's time split (src/train/time_split.h): categories by op name,
// exclusive time of nested ops, side-engine ops left out; and a single-process
// run reports the split from the layer's own trace.
#include "train/time_split.h"

#include <gtest/gtest.h>

#include "moe/train.h"

namespace moe {
namespace {

TraceOp op(const char* name, int64_t start, int64_t end, OpEngine e = OpEngine::compute) {
  return TraceOp{name, e, 0, start, end, 0};
}

TEST(TimeSplit, ClassifiesByNameAndCountsNestedTimeOnce) {
  // ffn[0] 0..10 µs waits 4 µs inside; a side-engine all-to-all overlaps it.
  std::vector<TraceOp> ops = {op("wait:AG:experts.wo", 2000, 6000),
                              op("ffn[0]", 0, 10000),
                              op("A2A:dispatch[1]", 0, 9000, OpEngine::side),
                              op("router", 10000, 11000),
                              op("sort[0]", 11000, 11500),
                              op("permute[0]", 11500, 12000),
                              op("combine_backward[0]", 12000, 13000),
                              op("weight_grads", 13000, 15000),
                              op("AR:grad.router.kernel", 15000, 16000),
                              op("rmsnorm", 16000, 17000)};
  train::TimeSplit t;
  train::add_time_split(ops, t);
  EXPECT_DOUBLE_EQ(t.gemm, 6.0 + 2.0);
  EXPECT_DOUBLE_EQ(t.exposed_comm, 4.0 + 1.0);
  EXPECT_DOUBLE_EQ(t.router, 1.0);
  EXPECT_DOUBLE_EQ(t.permute_combine, 0.5 + 0.5 + 1.0);
}

TEST(TimeSplit, SingleProcessRunReportsEveryCategoryButCommunication) {
  Config cfg = parse_config(
                   "num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 16\nmoe_mlp_dim: 32\ndtype: f32\n"
                   "num_layers: 2\nbatch_tokens: 64\nsteps: 3\n",
                   "t", {})
                   .config;
  TrainOptions opt;
  opt.measure_dense = false;
  TrainSummary s = run_training(cfg, opt);
  EXPECT_GT(s.ms_gemm, 0);
  EXPECT_GT(s.ms_router + s.ms_permute_combine, 0);
  EXPECT_LT(s.ms_exposed_comm, 0.1 * (s.ms_gemm + s.ms_rest + 1));
  EXPECT_EQ(s.ranks, 1);
  EXPECT_LT(s.fraction_of_dense, 0);  // not measured
}

}  // namespace
}  // namespace moe
