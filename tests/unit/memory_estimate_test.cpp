// Resources before work (docs/reliability.md): the memory estimate against the
// tensor peak the code really reaches, normal configs passing, and configs
// whose activations or buffers cannot fit refused before any allocation.
#include "moe/memory_estimate.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "moe/layer.h"
#include "moe/tensor.h"
#include "moe/topology.h"
#include "moe/train.h"
#include "testing/tensors.h"

namespace moe {
namespace {

Config layer_config() {
  Config c;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.emb_dim = 128;
  c.moe_mlp_dim = 256;
  c.dtype = DType::f32;
  c.weight_dtype = DType::f32;
  return c;
}

Config train_config(const std::vector<std::string>& overrides = {}) {
  return parse_config(default_train_config(), "<embedded default>", overrides).config;
}

// estimate / measured, printed for docs/reliability.md.
double ratio(const char* what, long double estimate, int64_t measured) {
  const double r = double(estimate) / double(measured);
  std::printf("%s: estimate %.0Lf B, measured tensor peak %lld B, ratio %.3f\n", what, estimate,
              (long long)measured, r);
  return r;
}

TEST(MemoryEstimate, LayerStepIsCloseToTheMeasuredTensorPeak) {
  for (const char* variant : {"plain", "bf16", "prefused"}) {
    Config c = layer_config();
    if (std::string(variant) == "bf16") c.dtype = DType::bf16;
    if (std::string(variant) == "prefused") c.prefuse_moe_weights = true;
    const int64_t T = 512;
    const LayerWeights w = init_weights(c, 1);
    const Tensor x = testing::uniform({T, c.emb_dim}, 2);
    const Tensor dy = testing::uniform({T, c.emb_dim}, 3);
    const TensorMemoryStats before = reset_tensor_memory_peak();
    {
      LayerOutputs out;
      LayerForwardPtr f = layer_forward(c, w, x, nullptr, out);
      LayerGrads g = layer_backward(c, *f, dy);
    }
    const int64_t measured = tensor_memory_stats().peak_bytes - before.current_bytes;
    const MemoryEstimate m = estimate_memory(c, T, 1, false);
    const double r = ratio(variant, m.activations, measured);
    EXPECT_GE(r, 0.9) << variant << ": the estimate is below what the layer allocates";
    EXPECT_LE(r, 1.5) << variant << ": the estimate is far above what the layer allocates";
  }
}

// step_minimum's terms the layer allocates itself (copies, gradients, saved tensors, y and dx) are a
// lower bound of the plain backward's measured peak, and within a small factor of it.
TEST(MemoryEstimate, StepMinimumIsBelowTheMeasuredTensorPeak) {
  for (const char* variant : {"plain", "bf16", "bf16_f32_masters", "prefused"}) {
    Config c = layer_config();
    const std::string v = variant;
    if (v != "plain") c.dtype = DType::bf16;
    if (v == "bf16") c.weight_dtype = DType::bf16;
    if (v == "prefused") c.prefuse_moe_weights = true;
    const int64_t T = 512;
    const LayerWeights w = init_weights(c, 1);
    const Tensor x = testing::uniform({T, c.emb_dim}, 2);
    const Tensor dy = testing::uniform({T, c.emb_dim}, 3);
    const TensorMemoryStats before = reset_tensor_memory_peak();
    {
      LayerOutputs out;
      LayerForwardPtr f = layer_forward(c, w, x, nullptr, out);
      LayerGrads g = layer_backward(c, *f, dy);
    }
    const int64_t measured = tensor_memory_stats().peak_bytes - before.current_bytes;
    const StepMinimum m = step_minimum(c, T, DType::f32, w.router.dtype());
    const long double own = m.weight_copies + m.gradients + m.saved + m.step_io - 2 * x.nbytes();
    const double r = ratio(variant, own, measured);
    EXPECT_LE(r, 1.0) << variant << ": the minimum is above what the layer allocates";
    EXPECT_GE(r, 0.5) << variant << ": the layer allocates more than twice the minimum";
  }
}

TEST(MemoryEstimate, TrainRunIsCloseToTheMeasuredTensorPeak) {
  Config c = train_config({"steps=1", "batch_tokens=512", "emb_dim=128", "moe_mlp_dim=256", "num_layers=3"});
  TrainOptions opt;
  opt.measure_dense = false;
  const TensorMemoryStats before = reset_tensor_memory_peak();
  run_training(c, opt);
  const int64_t measured = tensor_memory_stats().peak_bytes - before.current_bytes;
  const MemoryEstimate m = estimate_memory(c, c.batch_tokens, 1, true);
  const double r = ratio("moe train, 3 layers", m.total(), measured);
  EXPECT_GE(r, 0.9);
  EXPECT_LE(r, 1.5);
}

TEST(MemoryEstimate, NormalConfigsPass) {
  const uint64_t mem = physical_memory_bytes();
  ASSERT_GT(mem, 0u);
  EXPECT_TRUE(memory_problems(train_config(), 1, true, mem).empty());
  EXPECT_TRUE(check_target(train_config(), this_machine(), true).problems.empty());
  for (const char* axis : {"data_parallelism=-1", "fsdp_parallelism=-1", "expert_parallelism=-1"})
    for (int64_t ranks : {2, 4}) {
      const Config c = train_config({axis});
      EXPECT_TRUE(memory_problems(c, ranks, true, mem).empty()) << axis << " ranks " << ranks;
      EXPECT_TRUE(memory_problems(c, ranks, false, mem).empty()) << axis << " ranks " << ranks;
    }
}

TEST(MemoryEstimate, ActivationsThatCannotFitAreRefusedBeforeWork) {
  // 10^12 tokens of 64 floats: the weights fit, the activations do not.
  const Config c = train_config({"batch_tokens=1000000000000"});
  const std::vector<std::string> p = memory_problems(c, 1, false, 16ull << 30);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("one MoE layer's step needs about"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("activations"), std::string::npos) << p[0];
  EXPECT_NE(p[0].find("but this machine has 17179869184 bytes of memory (16 GiB)"), std::string::npos)
      << p[0];
  // The real run's check refuses it too.
  const TargetCheck chk = check_target(c, this_machine(), true);
  ASSERT_FALSE(chk.problems.empty());
  EXPECT_NE(chk.problems.back().find("activations"), std::string::npos);
}

TEST(MemoryEstimate, AllToAllBuffersGrowWithExpertParallelism) {
  // The worst-case receive buffer holds min(EP, E/K) times the rows sent.
  const Config c = train_config({"expert_parallelism=4", "num_experts=8", "num_experts_per_tok=2"});
  const MemoryEstimate one =
      estimate_memory(train_config({"num_experts=8", "num_experts_per_tok=2"}), 64, 1, false);
  const MemoryEstimate four = estimate_memory(c, 64, 4, false);
  EXPECT_EQ(one.buffers, 0.0L);
  EXPECT_GT(four.buffers, 0.0L);
  EXPECT_EQ(four.ffn_rows, 64 * 2 * 4);
  const MemoryEstimate capped =
      estimate_memory(train_config({"expert_parallelism=4", "num_experts=8", "num_experts_per_tok=2",
                                    "ragged_buffer_factor=1.5"}),
                      64, 4, false);
  EXPECT_EQ(capped.ffn_rows, 64 * 2 * 3 / 2);
  // A batch whose buffers do not fit 1 GiB names them.
  const std::vector<std::string> p =
      memory_problems(train_config({"expert_parallelism=4", "batch_tokens=40000000"}), 4, false, 1ull << 30);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].find("distributed-layer buffers"), std::string::npos) << p[0];
}

TEST(MemoryEstimate, NoOverflowWithHugeKeys) {
  Config c = train_config();  // set directly: the weights check of parse_config would refuse these
  c.batch_tokens = 9000000000000000000;
  c.emb_dim = 4000000000;
  const MemoryEstimate m = estimate_memory(c, c.batch_tokens, 1, true);
  EXPECT_GT(m.total(), 1e27L);
  EXPECT_EQ(memory_problems(c, 1, true, 1ull << 40).size(), 1u);
}

}  // namespace
}  // namespace moe
