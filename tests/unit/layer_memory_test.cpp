// The memory of one layer step (docs/architecture.md, "Memory of one step"): the backward's
// release_saved and accumulate options give the plain backward's bits, lower the tensor peak, and
// the measured peak stays within 1.25x of the analytic minimum (step_minimum).
#include <gtest/gtest.h>

#include <cstring>

#include "moe/isa.h"
#include "moe/layer.h"
#include "moe/memory_estimate.h"
#include "moe/tensor.h"
#include "testing/tensors.h"

namespace moe {
namespace {

struct Layout {
  const char* name;
  bool prefused, split;
  DType dtype, weight_dtype;
};

const Layout kLayouts[] = {
    {"separate_f32", false, false, DType::f32, DType::f32},
    {"separate_bf16_f32_masters", false, false, DType::bf16, DType::f32},
    {"prefused_bf16", true, false, DType::bf16, DType::bf16},
    {"split_bf16_f32_masters", true, true, DType::bf16, DType::f32},
};

Config config_of(const Layout& l) {
  Config c;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.emb_dim = 64;
  c.moe_mlp_dim = 48;
  c.dtype = l.dtype;
  c.weight_dtype = l.weight_dtype;
  c.prefuse_moe_weights = l.prefused;
  c.moe_split_expert_weight_layout = l.split;
  c.load_balance_loss_weight = 0.01;
  c.router_z_loss_weight = 0.001;
  return c;
}

std::vector<Tensor> tensors(const Config& c, const LayerWeights& w) {
  std::vector<Tensor> v;
  w.for_each(c, [&](const std::string&, const Tensor& t) { v.push_back(t); });
  return v;
}

LayerWeights clone_grads(const Config& c, const LayerWeights& g) {
  LayerWeights out = g;
  out.for_each(c, [](const std::string&, Tensor& t) { t = t.clone(); });
  return out;
}

// Micro-batch 1 and 2 with the plain backward; then release_saved alone, and micro-batch 2
// accumulated into a copy of micro-batch 1's gradients: every bit as the plain run (the
// accumulated ones as the f32 sum g1 + g2, element by element).
TEST(LayerMemory, ReleaseAndAccumulateGiveThePlainBits) {
  for (const Layout& l : kLayouts) {
    const Config c = config_of(l);
    const LayerWeights w = init_weights(c, 5);
    const Tensor x1 = testing::uniform({96, c.emb_dim}, 1), dy1 = testing::uniform({96, c.emb_dim}, 2);
    const Tensor x2 = testing::uniform({40, c.emb_dim}, 3), dy2 = testing::uniform({40, c.emb_dim}, 4);
    LayerOutputs o;
    LayerGrads g1 = layer_backward(c, *layer_forward(c, w, x1, nullptr, o), dy1, {0.5, 2.0});
    LayerGrads g2 = layer_backward(c, *layer_forward(c, w, x2, nullptr, o), dy2, {0.5, 2.0});

    auto f = layer_forward(c, w, x2, nullptr, o);
    LayerGrads r = layer_backward(c, *f, dy2, {0.5, 2.0}, BackwardOptions{.release_saved = true});
    EXPECT_TRUE(r.dx.bit_equal(g2.dx)) << l.name;
    std::vector<Tensor> want = tensors(c, g2.weights), got = tensors(c, r.weights);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_TRUE(got[i].bit_equal(want[i])) << l.name << " weight " << i;

    for (bool release : {false, true}) {
      LayerWeights acc = clone_grads(c, g1.weights);
      auto f2 = layer_forward(c, w, x2, nullptr, o);
      LayerGrads a = layer_backward(c, *f2, dy2, {0.5, 2.0},
                                    BackwardOptions{.release_saved = release, .accumulate = &acc});
      EXPECT_TRUE(a.dx.bit_equal(g2.dx)) << l.name;
      std::vector<Tensor> one = tensors(c, g1.weights), two = tensors(c, g2.weights), sum = tensors(c, acc),
                          ret = tensors(c, a.weights);
      for (size_t i = 0; i < one.size(); ++i) {
        Tensor expect = one[i].clone();
        for (int64_t k = 0; k < expect.numel(); ++k)
          expect.data<float>()[k] = one[i].data<float>()[k] + two[i].data<float>()[k];
        EXPECT_TRUE(sum[i].bit_equal(expect)) << l.name << " weight " << i << " release " << release;
        EXPECT_EQ(ret[i].raw(), sum[i].raw()) << "the returned gradients are the accumulation buffers";
      }
    }
  }
}

TEST(LayerMemory, AccumulateChecksItsBuffers) {
  const Config c = config_of(kLayouts[1]);
  const LayerWeights w = init_weights(c, 5);
  const Tensor x = testing::uniform({16, c.emb_dim}, 1);
  LayerOutputs o;
  LayerWeights acc = clone_grads(c, layer_backward(c, *layer_forward(c, w, x, nullptr, o), x).weights);
  acc.wo = acc.wo.to(DType::bf16);
  auto f = layer_forward(c, w, x, nullptr, o);
  try {
    layer_backward(c, *f, x, {}, BackwardOptions{.accumulate = &acc});
    FAIL() << "a bf16 accumulation buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gradient 'experts.wo': expected f32, got bf16"), std::string::npos)
        << e.what();
  }
  acc.wo = Tensor(DType::f32, {1, 2});
  try {
    layer_backward(c, *f, x, {}, BackwardOptions{.accumulate = &acc});
    FAIL() << "a misshapen accumulation buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.wo"), std::string::npos) << e.what();
  }
}

// Bytes above what was live before: forward + backward of (x, dy) with `opts`.
int64_t step_peak(const Config& c, const LayerWeights& w, const Tensor& x, const Tensor& dy,
                  const BackwardOptions& opts) {
  const TensorMemoryStats before = reset_tensor_memory_peak();
  {
    LayerOutputs o;
    auto f = layer_forward(c, w, x, nullptr, o);
    LayerGrads g = layer_backward(c, *f, dy, {}, opts);
  }
  return tensor_memory_stats().peak_bytes - before.current_bytes;
}

int64_t bytes_of(const Config& c, const LayerWeights& w) {
  int64_t b = 0;
  w.for_each(c, [&](const std::string&, const Tensor& t) { b += int64_t(t.nbytes()); });
  return b;
}

// An expert-heavy step (the weights and their gradients dominate, as in the real models' cases of
// `moe bench`): bf16 compute on f32 masters, the PyTorch MoELayer's setting.
TEST(LayerMemory, PeakIsWithinAQuarterOfTheMinimum) {
  Config c = config_of(kLayouts[1]);
  c.num_experts = 16, c.emb_dim = 256, c.moe_mlp_dim = 512;
  const int64_t T = 64;
  const LayerWeights w = init_weights(c, 5);
  const Tensor x = testing::uniform({T, c.emb_dim}, 1), dy = testing::uniform({T, c.emb_dim}, 2);
  const int64_t inputs = int64_t(x.nbytes() + dy.nbytes()) + bytes_of(c, w);
  const StepMinimum m = step_minimum(c, T, DType::f32, w.router.dtype());
  const int64_t plain = inputs + step_peak(c, w, x, dy, {});
  const int64_t released = inputs + step_peak(c, w, x, dy, BackwardOptions{.release_saved = true});
  std::printf("plain %lld B, released %lld B, minimum %.0Lf B (%s)\n", (long long)plain, (long long)released,
              m.total(), m.describe().c_str());
  EXPECT_LT(released, plain);
  EXPECT_LE(double(released), 1.25 * double(m.total()));
  // Micro-batch 2 into micro-batch 1's gradients: no second full set of f32 gradients.
  LayerOutputs o;
  LayerWeights acc = layer_backward(c, *layer_forward(c, w, x, nullptr, o), dy).weights;
  const int64_t accumulated =
      inputs + bytes_of(c, acc) +
      step_peak(c, w, x, dy, BackwardOptions{.release_saved = true, .accumulate = &acc});
  std::printf("accumulating step %lld B\n", (long long)accumulated);
  EXPECT_LE(double(accumulated), 1.25 * double(m.total()));
}

// The tensors a forward keeps for its backward are step_minimum's saved terms plus y and a few
// bytes (the group sizes: 64 B here): in particular the router keeps x in the compute dtype, not an
// f32 copy of it (T * D * 4 = 64 KiB here; such a copy fails this test), at every level.
TEST(LayerMemory, ForwardKeepsTheMinimumsSavedTensors) {
  Config c = config_of(kLayouts[2]);  // bf16 compute, bf16 weights: no weight copies
  const int64_t T = 256, D = c.emb_dim;
  const LayerWeights w = init_weights(c, 1);
  const Tensor x = testing::uniform({T, D}, 2).to(DType::bf16);  // given in the compute dtype
  for (Isa isa : {Isa::reference, Isa::avx512_bf16, Isa::amx_bf16}) {
    if (!isa_supported(isa)) continue;
    ScopedIsa level(isa);
    const TensorMemoryStats before = reset_tensor_memory_peak();
    LayerOutputs o;
    auto f = layer_forward(c, w, x, nullptr, o);
    const int64_t kept = tensor_memory_stats().current_bytes - before.current_bytes;
    const StepMinimum m = step_minimum(c, T, DType::bf16, w.router.dtype());
    const long double over = (long double)kept - m.saved - m.weight_copies - (long double)(T * D * 2);
    std::printf("%s: kept %lld B, minimum's saved %.0Lf B, over %.0Lf B\n", isa_name(isa), (long long)kept,
                m.saved, over);
    EXPECT_GE(over, 0.0L) << isa_name(isa);
    EXPECT_LE(over, 1024.0L) << isa_name(isa) << ": the forward keeps more than the minimum's tensors";
  }
}

TEST(LayerMemory, MinimumTermsFollowTheShapes) {
  Config c = config_of(kLayouts[1]);
  const int64_t T = 10, E = 8, K = 2, D = 64, F = 48, R = T * K;
  const StepMinimum m = step_minimum(c, T, DType::f32, DType::f32);
  EXPECT_EQ(m.weights, (long double)(E * 3 * D * F * 4 + E * D * 4));
  EXPECT_EQ(m.weight_copies, (long double)(E * 3 * D * F * 2));
  EXPECT_EQ(m.gradients, (long double)((E * 3 * D * F + E * D) * 4));
  // The permuted rows xs [R, D] bf16, or their i32 index where the level's GEMMs gather them.
  const int64_t xs = layer_permutes_in_gemm(c) ? R * 4 : R * D * 2;
  // x in the compute dtype (bf16, converted from the f32 x given) is the router's saved input too: no
  // f32 copy of it is kept between the passes.
  EXPECT_EQ(m.saved,
            (long double)(T * D * 2 + 2 * T * E * 4 + 3 * T * K * 4 + xs + R * 3 * F * 2 + R * D * 2));
  // Given in the compute dtype, x is the caller's tensor (counted in step_io), not a saved copy.
  EXPECT_EQ(step_minimum(c, T, DType::bf16, DType::f32).saved, m.saved - (long double)(T * D * 2));
  for (Isa isa : {Isa::reference, Isa::amx_bf16})
    for (KernelChoice permute : {KernelChoice::reference, KernelChoice::fused}) {
      if (!isa_supported(isa)) continue;
      ScopedIsa level(isa);
      Config p = c;
      p.moe_permute_kernel = permute;
      const bool gathered = isa == Isa::amx_bf16 && permute == KernelChoice::fused;
      EXPECT_EQ(layer_permutes_in_gemm(p), gathered) << isa_name(isa);
      // The distributed layer only where no rows move: expert parallelism 1, one token chunk.
      EXPECT_EQ(dist_permutes_in_gemm(p, 1), gathered) << isa_name(isa);
      EXPECT_FALSE(dist_permutes_in_gemm(p, 2)) << isa_name(isa);
      Config chunked = p;
      chunked.num_moe_token_chunks = 4;
      EXPECT_FALSE(dist_permutes_in_gemm(chunked, 1)) << isa_name(isa);
      EXPECT_EQ(step_minimum(p, T, DType::f32, DType::f32).saved - m.saved,
                (long double)((gathered ? R * 4 : R * D * 2) - xs))
          << isa_name(isa);
    }
  EXPECT_EQ(m.step_io, (long double)(T * D * 4 * 2 + T * D * 2 + T * D * 4));
  EXPECT_EQ(m.comm, 0.0L);
  c.weight_dtype = DType::bf16;
  EXPECT_EQ(step_minimum(c, T, DType::f32, DType::f32).weight_copies, 0.0L);
  EXPECT_EQ(step_minimum(c, T, DType::f32, DType::bf16).weight_copies, (long double)(E * D * 4));
  EXPECT_NE(m.describe().find("gradients "), std::string::npos);
}

}  // namespace
}  // namespace moe
