// The layer against the independent naive f64 formulation (MoeLoopBlock), and
// its gradients against finite differences of that formulation.
#include "moe/layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "route/router.h"
#include "testing/levels.h"
#include "testing/naive_moe.h"
#include "testing/tensors.h"

namespace moe {
namespace {

using testing::naive_forward;
using testing::naive_params;
using testing::NaiveParams;

Config small_config(int64_t E = 4, int64_t K = 2, int64_t D = 8, int64_t F = 6) {
  Config c;
  c.num_experts = E;
  c.num_experts_per_tok = K;
  c.emb_dim = D;
  c.moe_mlp_dim = F;
  c.dtype = DType::f32;
  c.weight_dtype = DType::f32;
  c.load_balance_loss_weight = 0.1;
  c.router_z_loss_weight = 0.05;
  return c;
}

struct Variant {
  const char* name;
  void (*apply)(Config&);
};

const Variant kVariants[] = {
    {"mixtral", [](Config&) {}},
    {"sigmoid_scaled", [](Config& c) { c.routed_score_func = ScoreFunc::sigmoid; c.routed_scaling_factor = 2.5; }},
    {"no_norm_gelu", [](Config& c) { c.norm_topk_prob = false; c.mlp_activation = Activation::gelu; }},
    {"prefused", [](Config& c) { c.prefuse_moe_weights = true; }},
    {"capacity", [](Config& c) { c.capacity_factor = 0.5; }},
    {"k1", [](Config& c) { c.num_experts_per_tok = 1; }},
    {"k_equals_e", [](Config& c) { c.num_experts_per_tok = c.num_experts; }},
    {"f32_sum_off", [](Config& c) { c.float32_weight_sum = false; }},
};

// Each variant at every kernel level.
class LayerVariant : public testing::LevelTest<std::tuple<Variant, Isa>> {
 protected:
  const Variant& variant() const { return std::get<0>(GetParam()); }
};

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.get_f32(i);
  return v;
}

TEST_P(LayerVariant, ForwardMatchesNaiveLoop) {
  Config cfg = small_config();
  variant().apply(cfg);
  const int64_t T = 7;
  LayerWeights w = init_weights(cfg, 3);
  Tensor x = testing::uniform({T, cfg.emb_dim}, 11);
  LayerOutputs out;
  auto fwd = layer_forward(cfg, w, x, nullptr, out);
  NaiveParams p = naive_params(cfg, w, x);
  auto ref = naive_forward(cfg, p, T, std::vector<double>(size_t(T * cfg.emb_dim), 0.0));
  double ymax = 0;
  for (double v : ref.y) ymax = std::max(ymax, std::abs(v));
  // f32 sums of a few dozen terms: relative error ~1e-6; the non-f32 weight sum rounds each add.
  double tol = 1e-5 * std::max(1.0, ymax);
  for (int64_t i = 0; i < out.y.numel(); ++i) EXPECT_NEAR(out.y.get_f32(i), ref.y[size_t(i)], tol) << i;
  for (int64_t i = 0; i < out.topk_idx.numel(); ++i) {
    EXPECT_EQ(out.topk_idx.data<int32_t>()[i], ref.idx[size_t(i)]);
    EXPECT_NEAR(out.topk_weights.get_f32(i), ref.w[size_t(i)], 1e-6);
  }
  EXPECT_NEAR(out.load_balance_loss, ref.lb, 1e-6);
  EXPECT_NEAR(out.z_loss, ref.zl, 1e-6);
}

// d(sum(y*dy) + aux)/d(param) by central differences of the f64 naive model
// (eps 1e-6: truncation ~1e-12, cancellation ~1e-10) against the engine's f32
// analytic gradient. The engine's f32 error is ~1e-6 relative to the largest
// gradient entry, so the bound is 1e-4 of max(1, max |grad|).
TEST_P(LayerVariant, GradientsMatchFiniteDifferences) {
  Config cfg = small_config();
  variant().apply(cfg);
  const int64_t T = 6, D = cfg.emb_dim;
  LayerWeights w = init_weights(cfg, 5);
  Tensor x = testing::uniform({T, D}, 21);
  Tensor dy = testing::uniform({T, D}, 22);
  LayerOutputs out;
  auto fwd = layer_forward(cfg, w, x, nullptr, out);
  LayerGrads g = layer_backward(cfg, *fwd, dy);
  NaiveParams base = naive_params(cfg, w, x);
  std::vector<double> dyv = doubles(dy);
  // Keep the routing of the unperturbed point (a perturbation of 1e-6 must not flip top-k).
  auto check = [&](const char* name, std::vector<double> NaiveParams::*field, const Tensor& grad,
                   const std::function<int64_t(int64_t)>& to_naive) {
    double gmax = testing::max_abs(grad), worst = 0;
    for (int64_t i = 0; i < grad.numel(); ++i) {
      NaiveParams p = base;
      double& v = (p.*field)[size_t(to_naive(i))];
      const double eps = 1e-6, v0 = v;
      v = v0 + eps;
      double lp = naive_forward(cfg, p, T, dyv).loss;
      v = v0 - eps;
      double lm = naive_forward(cfg, p, T, dyv).loss;
      double fd = (lp - lm) / (2 * eps);
      worst = std::max(worst, std::abs(fd - grad.get_f32(i)));
    }
    EXPECT_LE(worst, 1e-4 * std::max(1.0, gmax)) << name << " max |grad| " << gmax;
    std::printf("  [%s] %-12s max |fd - grad| = %.3g (max |grad| %.3g)\n", variant().name, name, worst, gmax);
  };
  auto same = [](int64_t i) { return i; };
  check("x", &NaiveParams::x, g.dx, same);
  check("router", &NaiveParams::router, g.weights.router, same);
  check("wo", &NaiveParams::wo, g.weights.wo, same);
  const int64_t F = cfg.moe_mlp_dim;
  if (cfg.prefuse_moe_weights) {
    // wi [E, D, 2F]: column f < F is wi0, else wi1.
    Tensor g0(DType::f32, {cfg.num_experts, D, F}), g1(DType::f32, {cfg.num_experts, D, F});
    for (int64_t i = 0; i < g0.numel(); ++i) {
      g0.data<float>()[i] = g.weights.wi.data<float>()[(i / F) * 2 * F + i % F];
      g1.data<float>()[i] = g.weights.wi.data<float>()[(i / F) * 2 * F + F + i % F];
    }
    check("wi[:, :, :F]", &NaiveParams::wi0, g0, same);
    check("wi[:, :, F:]", &NaiveParams::wi1, g1, same);
  } else {
    check("wi_0", &NaiveParams::wi0, g.weights.wi_0, same);
    check("wi_1", &NaiveParams::wi1, g.weights.wi_1, same);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, LayerVariant,
                         ::testing::Combine(::testing::ValuesIn(kVariants), ::testing::ValuesIn(testing::all_levels())),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" + isa_name(std::get<1>(info.param));
                         });

// Forced routing: an expert with no tokens, and every token to one expert.
TEST(Layer, ForcedRoutingEdgeCases) {
  Config cfg = small_config();
  const int64_t T = 5, K = 2;
  LayerWeights w = init_weights(cfg, 8);
  Tensor x = testing::uniform({T, cfg.emb_dim}, 9);
  for (std::vector<int> ids : {std::vector<int>{0, 1, 0, 1, 1, 0, 0, 1, 1, 0},   // experts 2, 3 empty
                               std::vector<int>{3, 2, 3, 2, 3, 2, 3, 2, 3, 2}}) {  // leading experts empty
    Tensor forced = Tensor::empty(DType::i32, {T, K});
    for (int64_t i = 0; i < T * K; ++i) forced.data<int32_t>()[i] = ids[size_t(i)];
    LayerOutputs out;
    auto fwd = layer_forward(cfg, w, x, &forced, out);
    auto ref = naive_forward(cfg, naive_params(cfg, w, x), T, std::vector<double>(size_t(T * cfg.emb_dim)), &ids);
    for (int64_t i = 0; i < out.y.numel(); ++i) EXPECT_NEAR(out.y.get_f32(i), ref.y[size_t(i)], 1e-5);
    EXPECT_TRUE(out.topk_idx.bit_equal(forced));
    int64_t total = 0;
    for (int e = 0; e < 4; ++e) total += out.group_sizes.data<int32_t>()[e];
    EXPECT_EQ(total, T * K);
  }
}

// The router's top-K against a sort of every token's ids in score order (NaN last, then the higher
// score, then the lower id), on rows with ties, NaN and infinities, K from 1 to E. The logits are x
// itself (an identity kernel: each is one product by 1 plus zeros, exact).
TEST(Router, TopKIsTheFirstKIdsInScoreOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (ScoreFunc fn : {ScoreFunc::softmax, ScoreFunc::sigmoid})
    for (int64_t E : {1, 5, 32, 64})
      for (int64_t K : {int64_t(1), std::min<int64_t>(2, E), std::min<int64_t>(8, E), E}) {
        Config c = small_config(E, K, E, 4);
        c.routed_score_func = fn;
        const int64_t T = 40;
        Tensor x = Tensor::empty(DType::f32, {T, E}), kernel = Tensor::empty(DType::f32, {E, E});
        for (int64_t i = 0; i < E * E; ++i) kernel.data<float>()[i] = i / E == i % E ? 1.0f : 0.0f;
        uint32_t state = 12345;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < E; ++e) {
            state = state * 1664525u + 1013904223u;
            float v = float(int(state >> 28) - 8);  // 16 values: many ties
            if (t % 5 == 1 && e % 3 == 0) v = nan;
            if (t % 7 == 2 && e == E / 2) v = inf;
            if (t % 7 == 3 && e == 0) v = -inf;
            if (t == 4) v = float(E - e);  // strictly decreasing
            if (t == 5) v = float(e);      // strictly increasing: every id inserted at the top
            x.data<float>()[t * E + e] = v;
          }
        const RouterOutput r = router_forward(c, x, kernel, nullptr);
        for (int64_t t = 0; t < T; ++t) {
          const float* sc = r.scores.data<float>() + t * E;
          std::vector<int32_t> ids(static_cast<size_t>(E));
          for (int32_t e = 0; e < int32_t(E); ++e) ids[size_t(e)] = e;
          std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
            if (std::isnan(sc[a]) != std::isnan(sc[b])) return std::isnan(sc[b]);
            return !std::isnan(sc[a]) && sc[a] > sc[b];
          });
          for (int64_t k = 0; k < K; ++k)
            ASSERT_EQ(r.topk_idx.data<int32_t>()[t * K + k], ids[size_t(k)])
                << (fn == ScoreFunc::softmax ? "softmax" : "sigmoid") << " E " << E << " K " << K << " token "
                << t << " slot " << k;
        }
      }
}

TEST(Layer, EqualScoresTieToLowerExpert) {
  Config cfg = small_config(6, 3);
  LayerWeights w = init_weights(cfg, 1);
  w.router = Tensor(DType::f32, {cfg.emb_dim, cfg.num_experts});  // all logits 0
  Tensor x = testing::uniform({4, cfg.emb_dim}, 2);
  LayerOutputs out;
  layer_forward(cfg, w, x, nullptr, out);
  for (int64_t t = 0; t < 4; ++t)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(out.topk_idx.data<int32_t>()[t * 3 + k], k);
}

TEST(Layer, SingleTokenAndBf16) {
  Config cfg = small_config(4, 2, 16, 8);
  cfg.dtype = DType::bf16;
  LayerWeights w = init_weights(cfg, 4);
  for (int64_t T : {1, 9}) {
    Tensor x = testing::uniform({T, cfg.emb_dim}, 5);
    LayerOutputs out;
    auto fwd = layer_forward(cfg, w, x, nullptr, out);
    EXPECT_EQ(out.y.dtype(), DType::bf16);
    // The naive model sees the bf16-rounded x and weights; the engine also rounds
    // h, a, ys to bf16 (relative 2^-8 each), so allow a few bf16 ulps of max |y|.
    Tensor xb = x.to(DType::bf16);
    LayerWeights wb = w;
    wb.wi_0 = w.wi_0.to(DType::bf16);
    wb.wi_1 = w.wi_1.to(DType::bf16);
    wb.wo = w.wo.to(DType::bf16);
    auto ref = naive_forward(cfg, naive_params(cfg, wb, xb), T, std::vector<double>(size_t(T * cfg.emb_dim)));
    double ymax = 0;
    for (double v : ref.y) ymax = std::max(ymax, std::abs(v));
    for (int64_t i = 0; i < out.y.numel(); ++i) EXPECT_NEAR(out.y.get_f32(i), ref.y[size_t(i)], 0.02 * ymax);
    Tensor dy = testing::uniform({T, cfg.emb_dim}, 6);
    LayerGrads g = layer_backward(cfg, *fwd, dy);
    EXPECT_EQ(g.dx.shape(), (Shape{T, cfg.emb_dim}));
  }
}

// The aux losses' cotangents scale their gradient terms: (1, 1) is the default bit for bit;
// (c_lb, c_z) gives the bits of a config whose loss weights are multiplied by them (exact for
// powers of two); (0, 0) leaves only the gradient of sum(y * dy).
TEST(Layer, AuxCotangentsScaleTheAuxGradients) {
  Config cfg = small_config(8, 2, 16, 8);
  LayerWeights w = init_weights(cfg, 2);
  Tensor x = testing::uniform({12, cfg.emb_dim}, 3), dy = testing::uniform({12, cfg.emb_dim}, 4);
  auto router_grad = [&](const Config& c, AuxCotangents s) {
    LayerOutputs out;
    auto fwd = layer_forward(c, w, x, nullptr, out);
    LayerGrads g = layer_backward(c, *fwd, dy, s);
    return std::make_pair(g.weights.router, g.dx);
  };
  auto base = router_grad(cfg, {});
  auto ones = router_grad(cfg, {1.0, 1.0});
  EXPECT_TRUE(base.first.bit_equal(ones.first) && base.second.bit_equal(ones.second));
  Config scaled = cfg;
  scaled.load_balance_loss_weight *= 4.0;
  scaled.router_z_loss_weight = 0.0;
  auto by_cotangent = router_grad(cfg, {4.0, 0.0});
  auto by_weight = router_grad(scaled, {});
  EXPECT_TRUE(by_cotangent.first.bit_equal(by_weight.first));
  Config none = cfg;
  none.load_balance_loss_weight = none.router_z_loss_weight = 0.0;
  EXPECT_TRUE(router_grad(cfg, {0.0, 0.0}).first.bit_equal(router_grad(none, {}).first));
  EXPECT_FALSE(router_grad(cfg, {0.0, 0.0}).first.bit_equal(base.first));
}

TEST(Layer, BadInputsAreClearErrors) {
  Config cfg = small_config();
  LayerWeights w = init_weights(cfg, 1);
  LayerOutputs out;
  Tensor bad = testing::uniform({3, cfg.emb_dim + 1}, 1);
  EXPECT_THROW(layer_forward(cfg, w, bad, nullptr, out), Error);
  Tensor x = testing::uniform({3, cfg.emb_dim}, 1);
  auto forced_error = [&](std::vector<int32_t> ids) {
    Tensor forced = Tensor::empty(DType::i32, {3, 2});
    std::copy(ids.begin(), ids.end(), forced.data<int32_t>());
    try {
      layer_forward(cfg, w, x, &forced, out);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string e = forced_error({0, 1, 2, 7, 1, 2});  // expert 7 of 4
  EXPECT_NE(e.find("topk_idx: token 1 slot 1 names expert 7, expected 0 <= id < 4"), std::string::npos) << e;
  e = forced_error({0, 1, 3, 2, 2, 2});  // token 2 routed twice to expert 2
  EXPECT_NE(e.find("topk_idx: token 2 names expert 2 twice (slots 0 and 1)"), std::string::npos) << e;
}

}  // namespace
}  // namespace moe

// Fused vs reference kernels and split vs prefused layout, bit for bit, run over
// every small case of the registry: tests/unit/cases_test.cpp.
