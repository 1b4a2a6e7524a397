// The f64 compute path (dtype=f64: every step in double on the reference
// kernels, docs/python.md "Dtypes"): against the independent naive f64
// formulation (tests/testing/naive_moe.h) to ~1e-12, its gradients against
// central differences of that formulation, its independence of the kernel
// level, and the config rule (one process only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "moe/config.h"
#include "moe/isa.h"
#include "moe/layer.h"
#include "testing/cli_runner.h"
#include "testing/errors.h"
#include "testing/naive_moe.h"
#include "testing/temp_dir.h"
#include "testing/tensors.h"

namespace moe {
namespace {

using testing::naive_forward;
using testing::naive_params;
using testing::NaiveParams;

Config f64_config() {
  Config c;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.emb_dim = 8;
  c.moe_mlp_dim = 6;
  c.dtype = DType::f64;
  c.weight_dtype = DType::f32;
  c.load_balance_loss_weight = 0.1;
  c.router_z_loss_weight = 0.05;
  return c;
}

// t in f64 plus 1e-3 * uniform[-1, 1): values no f32 holds, so an f32 step anywhere shows.
Tensor off_grid(const Tensor& t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor out = t.to(DType::f64);
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<double>()[i] += 1e-3 * (2.0 * double(rng() >> 11) * 0x1.0p-53 - 1.0);
  return out;
}

LayerWeights f64_weights(const Config& cfg, uint64_t seed) {
  LayerWeights w = init_weights(cfg, seed);
  uint64_t s = seed * 100;
  w.for_each(cfg, [&](const std::string&, Tensor& t) { t = off_grid(t, ++s); });
  return w;
}

std::vector<double> doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.get_f64(i);
  return v;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

struct Variant {
  const char* name;
  void (*apply)(Config&);
};

const Variant kVariants[] = {
    {"mixtral", [](Config&) {}},
    {"sigmoid_scaled",
     [](Config& c) {
       c.routed_score_func = ScoreFunc::sigmoid;
       c.routed_scaling_factor = 2.5;
     }},
    {"no_norm_gelu",
     [](Config& c) {
       c.norm_topk_prob = false;
       c.mlp_activation = Activation::gelu;
     }},
    {"prefused", [](Config& c) { c.prefuse_moe_weights = true; }},
    {"split",
     [](Config& c) {
       c.prefuse_moe_weights = true;
       c.moe_split_expert_weight_layout = true;
     }},
    {"capacity", [](Config& c) { c.capacity_factor = 0.5; }},
    {"fused_kernels",
     [](Config& c) {
       c.moe_permute_kernel = KernelChoice::fused;
       c.moe_combine_kernel = KernelChoice::fused;
     }},
    {"f32_sum_off", [](Config& c) { c.float32_weight_sum = false; }},
};

class F64Layer : public ::testing::TestWithParam<Variant> {};

TEST_P(F64Layer, ForwardMatchesNaiveF64) {
  Config cfg = f64_config();
  GetParam().apply(cfg);
  const int64_t T = 7;
  LayerWeights w = f64_weights(cfg, 3);
  Tensor x = off_grid(testing::uniform({T, cfg.emb_dim}, 11), 12);
  LayerOutputs out;
  auto fwd = layer_forward(cfg, w, x, nullptr, out);
  ASSERT_EQ(out.y.dtype(), DType::f64);
  ASSERT_EQ(out.topk_weights.dtype(), DType::f64);
  auto ref =
      naive_forward(cfg, naive_params(cfg, w, x), T, std::vector<double>(size_t(T * cfg.emb_dim), 0.0));
  double ymax = 0, worst = 0;
  for (double v : ref.y) ymax = std::max(ymax, std::abs(v));
  for (int64_t i = 0; i < out.y.numel(); ++i)
    worst = std::max(worst, std::abs(out.y.data<double>()[i] - ref.y[size_t(i)]));
  EXPECT_LE(worst, 1e-12 * std::max(1.0, ymax)) << "max |y| " << ymax;
  for (int64_t i = 0; i < out.topk_idx.numel(); ++i) {
    EXPECT_EQ(out.topk_idx.data<int32_t>()[i], ref.idx[size_t(i)]);
    EXPECT_NEAR(out.topk_weights.data<double>()[i], ref.w[size_t(i)], 1e-14);
  }
  // The aux statistics' fixed point (2^-40 per token's lse^2) bounds z_loss's error at ~1e-13 * weight.
  EXPECT_NEAR(out.load_balance_loss_f64, ref.lb, 1e-14);
  EXPECT_NEAR(out.z_loss_f64, ref.zl, 1e-13);
  EXPECT_EQ(out.load_balance_loss, float(out.load_balance_loss_f64));
  std::printf("  [%s] max |y - naive| = %.3g (max |y| %.3g)\n", GetParam().name, worst, ymax);
}

// d(sum(y*dy) + aux)/d(param) of the naive f64 model by central differences
// (eps 1e-6: truncation ~1e-12 * f''', cancellation ~1e-16 / 1e-6 = 1e-10)
// against the engine's f64 backward: agreement to 1e-8 of max(1, max |grad|),
// where the f32 path only reaches 1e-4 (layer_test.cpp).
TEST_P(F64Layer, GradientsMatchFiniteDifferences) {
  Config cfg = f64_config();
  GetParam().apply(cfg);
  const int64_t T = 6, D = cfg.emb_dim, F = cfg.moe_mlp_dim;
  LayerWeights w = f64_weights(cfg, 5);
  Tensor x = off_grid(testing::uniform({T, D}, 21), 23);
  Tensor dy = off_grid(testing::uniform({T, D}, 22), 24);
  LayerOutputs out;
  auto fwd = layer_forward(cfg, w, x, nullptr, out);
  LayerGrads g = layer_backward(cfg, *fwd, dy);
  ASSERT_EQ(g.dx.dtype(), DType::f64);
  NaiveParams base = naive_params(cfg, w, x);
  std::vector<double> dyv = doubles(dy);
  auto check = [&](const char* name, std::vector<double> NaiveParams::*field,
                   const std::vector<double>& grad) {
    double gmax = 0, worst = 0;
    for (double v : grad) gmax = std::max(gmax, std::abs(v));
    for (size_t i = 0; i < grad.size(); ++i) {
      NaiveParams p = base;
      double& v = (p.*field)[i];
      const double eps = 1e-6, v0 = v;
      v = v0 + eps;
      double lp = naive_forward(cfg, p, T, dyv).loss;
      v = v0 - eps;
      double lm = naive_forward(cfg, p, T, dyv).loss;
      worst = std::max(worst, std::abs((lp - lm) / (2 * eps) - grad[i]));
    }
    EXPECT_LE(worst, 1e-8 * std::max(1.0, gmax)) << name << " max |grad| " << gmax;
    std::printf("  [%s] %-12s max |fd - grad| = %.3g (max |grad| %.3g)\n", GetParam().name, name, worst,
                gmax);
  };
  check("x", &NaiveParams::x, doubles(g.dx));
  check("router", &NaiveParams::router, doubles(g.weights.router));
  check("wo", &NaiveParams::wo, doubles(g.weights.wo));
  if (cfg.prefuse_moe_weights) {
    ASSERT_EQ(g.weights.wi.dtype(), DType::f64);
    std::vector<double> wi = doubles(g.weights.wi), g0, g1;  // [E, D, 2F] (the split layout: same bytes)
    for (size_t i = 0; i < wi.size(); ++i) (int64_t(i) % (2 * F) < F ? g0 : g1).push_back(wi[i]);
    check("wi[:, :, :F]", &NaiveParams::wi0, g0);
    check("wi[:, :, F:]", &NaiveParams::wi1, g1);
  } else {
    check("wi_0", &NaiveParams::wi0, doubles(g.weights.wi_0));
    check("wi_1", &NaiveParams::wi1, doubles(g.weights.wi_1));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, F64Layer, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

// The fast levels never see f64: every level gives the reference level's bits.
TEST(F64Path, EveryLevelRunsTheReferenceKernels) {
  Config cfg = f64_config();
  const int64_t T = 9;
  LayerWeights w = f64_weights(cfg, 7);
  Tensor x = off_grid(testing::uniform({T, cfg.emb_dim}, 31), 32);
  Tensor dy = off_grid(testing::uniform({T, cfg.emb_dim}, 33), 34);
  auto step = [&](Isa isa) {
    ScopedIsa level(isa);
    LayerOutputs out;
    auto fwd = layer_forward(cfg, w, x, nullptr, out);
    LayerGrads g = layer_backward(cfg, *fwd, dy);
    return std::make_tuple(out.y, g.dx, g.weights.wi_0, g.weights.router);
  };
  auto ref = step(Isa::reference);
  for (Isa isa : isa_available()) {
    auto got = step(isa);
    EXPECT_TRUE(same_bits(std::get<0>(got), std::get<0>(ref))) << isa_name(isa) << " y";
    EXPECT_TRUE(same_bits(std::get<1>(got), std::get<1>(ref))) << isa_name(isa) << " dx";
    EXPECT_TRUE(same_bits(std::get<2>(got), std::get<2>(ref))) << isa_name(isa) << " dwi_0";
    EXPECT_TRUE(same_bits(std::get<3>(got), std::get<3>(ref))) << isa_name(isa) << " drouter";
  }
}

// f32 weights and an f32 x are widened exactly: the same step as f64 copies of them.
TEST(F64Path, F32InputsAreWidenedExactly) {
  Config cfg = f64_config();
  const int64_t T = 5;
  LayerWeights w32 = init_weights(cfg, 9), w64 = w32;
  w64.for_each(cfg, [](const std::string&, Tensor& t) { t = t.to(DType::f64); });
  Tensor x = testing::uniform({T, cfg.emb_dim}, 41);
  LayerOutputs a, b;
  layer_forward(cfg, w32, x, nullptr, a);
  layer_forward(cfg, w64, x.to(DType::f64), nullptr, b);
  EXPECT_TRUE(same_bits(a.y, b.y));
}

TEST(F64Path, GroupedGemmF64TakesF64OutputsOnly) {
  Tensor lhs = off_grid(testing::uniform({4, 3}, 51), 52),
         rhs = off_grid(testing::uniform({2, 3, 5}, 53), 54);
  GroupLayout g = GroupLayout::from_sizes({1, 3});
  Tensor out = Tensor::empty(DType::f64, {4, 5});
  gmm(lhs, rhs, g, 0, out);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t n = 0; n < 5; ++n) {
      double s = 0;
      for (int64_t k = 0; k < 3; ++k)
        s += lhs.data<double>()[r * 3 + k] * rhs.data<double>()[((r < 1 ? 0 : 1) * 3 + k) * 5 + n];
      EXPECT_EQ(out.data<double>()[r * 5 + n], s) << r << "," << n;
    }
  Tensor out32 = Tensor::empty(DType::f32, {4, 5});
  EXPECT_NE(testing::error_of([&] {
              gmm(lhs, rhs, g, 0, out32);
            }).find("output dtype must be f64 for f64 inputs, got f32"),
            std::string::npos);
  Tensor drhs32 = Tensor::empty(DType::f32, {2, 3, 5});
  EXPECT_NE(
      testing::error_of([&] { gmm_drhs(lhs, out, g, 0, drhs32); }).find("drhs must be f64 for f64 inputs"),
      std::string::npos);
  Tensor mixed = lhs.to(DType::f32);
  EXPECT_NE(testing::error_of([&] { gmm(mixed, rhs, g, 0, out); }).find("both f64, got f32 and f64"),
            std::string::npos);
}

std::vector<std::string> problems_of(const std::vector<std::string>& overrides) {
  try {
    parse_config("num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 8\nmoe_mlp_dim: 16\n", "t.yml", overrides);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

TEST(F64Path, ConfigAcceptsF64OnOneProcessOnly) {
  EXPECT_TRUE(problems_of({"dtype=f64"}).empty());
  EXPECT_EQ(parse_config("num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 8\nmoe_mlp_dim: 16\n", "t.yml",
                         {"dtype=f64"})
                .config.dtype,
            DType::f64);
  for (const char* key : {"expert_parallelism", "data_parallelism", "fsdp_parallelism"}) {
    auto p = problems_of({"dtype=f64", std::string(key) + "=2"});
    ASSERT_EQ(p.size(), 1u) << key;
    EXPECT_NE(p[0].find("dtype=f64"), std::string::npos) << p[0];
    EXPECT_NE(p[0].find(std::string(key) + " must be 1 (got 2)"), std::string::npos) << p[0];
  }
  auto p = problems_of({"weight_dtype=f64"});
  ASSERT_FALSE(p.empty());
  EXPECT_NE(p[0].find("weight_dtype"), std::string::npos) << p[0];
}

// The moe commands (files, checkpoints, training, checks) refuse dtype=f64 with a config error.
TEST(F64Path, TheCommandsRefuseF64) {
  testing::TempDir dir;
  const std::string cfg = dir.file("l.yml");
  std::ofstream(cfg) << "num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 8\nmoe_mlp_dim: 16\n";
  const std::vector<std::string> cmds = {
      "init --config " + cfg + " dtype=f64 --out " + dir.file("w.safetensors"), "train dtype=f64 steps=1",
      "check dtype=f64"};
  for (const std::string& cmd : cmds) {
    auto r = testing::run_moe(cmd, dir.path());
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find("dtype=f64 is for the library's layer and moe_engine.torch.MoELayer only"),
              std::string::npos)
        << cmd << ": " << r.err;
  }
  auto ok = testing::run_moe("validate " + cfg + " dtype=f64", dir.path());
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

}  // namespace
}  // namespace moe
