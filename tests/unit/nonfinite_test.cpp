// Non-finite in, non-finite out (docs/reliability.md): a NaN or inf in any
// token makes both aux losses NaN, while the other tokens' rows of y, their
// routing and (aux weights 0) their rows of grad.x keep their bits; the
// fixed-point statistics leave such tokens out and count them, and a z-loss
// sum past the fixed-point range is +inf, never wrapped-around garbage.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "moe/layer.h"
#include "route/aux_loss.h"
#include "testing/levels.h"
#include "testing/tensors.h"
#include "train/step.h"

namespace moe {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor logits_of(int64_t T, int64_t E, std::initializer_list<std::pair<int64_t, float>> set,
                 uint64_t seed = 5) {
  Tensor z = testing::uniform({T, E}, seed, -3.0f, 3.0f);
  for (auto [i, v] : set) z.data<float>()[i] = v;
  return z;
}

std::vector<int64_t> counts(int64_t E, int64_t per_expert) {
  return std::vector<int64_t>(size_t(E), per_expert);
}

void expect_same_sums(const AuxStats& a, const AuxStats& b) {
  EXPECT_TRUE(a.prob_sum == b.prob_sum);
  EXPECT_TRUE(a.lse_sq_sum == b.lse_sq_sum);
  EXPECT_EQ(a.lse_overflow, b.lse_overflow);
}

Config aux_config(double lb = 0.01, double z = 0.001) {
  Config c;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.load_balance_loss_weight = lb;
  c.router_z_loss_weight = z;
  return c;
}

// NaN, +inf and -inf logits: the token is counted, left out of the sums (which
// equal those of the finite tokens alone, bit for bit) and both losses are NaN.
TEST(NonFiniteAux, TokensAreCountedAndLeftOutOfTheSums) {
  const int64_t T = 6, E = 4;
  Tensor z = logits_of(T, E, {{1 * E + 2, kNan}, {3 * E + 0, kInf}, {4 * E + 3, -kInf}});
  AuxStats st = aux_stats(z, counts(E, 3));
  EXPECT_EQ(st.nonfinite, 3);
  EXPECT_EQ(st.tokens, T);
  EXPECT_EQ(st.lse_overflow, 0);
  // The finite tokens 0, 2, 5 alone.
  Tensor finite = Tensor::empty(DType::f32, {3, E});
  const int64_t keep[] = {0, 2, 5};
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t e = 0; e < E; ++e) finite.data<float>()[r * E + e] = z.data<float>()[keep[r] * E + e];
  expect_same_sums(st, aux_stats(finite, counts(E, 3)));
  for (double lb : {0.0, 0.01})
    for (double zw : {0.0, 0.001}) {
      AuxLosses l = aux_losses(aux_config(lb, zw), st);
      EXPECT_TRUE(std::isnan(l.load_balance)) << lb << " " << zw;  // whatever the weights: weight * NaN
      EXPECT_TRUE(std::isnan(l.z_loss)) << lb << " " << zw;
    }
  // The same logits without the bad entries: finite losses.
  AuxLosses clean = aux_losses(aux_config(), aux_stats(logits_of(T, E, {}), counts(E, 3)));
  EXPECT_TRUE(std::isfinite(clean.load_balance) && std::isfinite(clean.z_loss));
}

// Shards added in any grouping give the whole batch's statistics, the count included:
// one rank's non-finite token makes every rank's losses NaN.
TEST(NonFiniteAux, ShardsAddUpToTheWhole) {
  const int64_t E = 4;
  Tensor z = logits_of(8, E, {{6 * E + 1, kNan}});
  AuxStats whole = aux_stats(z, counts(E, 4));
  AuxStats a = aux_stats(z.slice_rows(0, 4), counts(E, 2)), b = aux_stats(z.slice_rows(4, 8), counts(E, 2));
  EXPECT_EQ(a.nonfinite, 0);
  EXPECT_EQ(b.nonfinite, 1);
  AuxStats ab = a, ba = b;
  ab.add(b);
  ba.add(a);
  for (const AuxStats* s : {&ab, &ba}) {
    expect_same_sums(*s, whole);
    EXPECT_EQ(s->nonfinite, 1);
    EXPECT_EQ(s->tokens, 8);
    EXPECT_TRUE(std::isnan(aux_losses(aux_config(), *s).load_balance));
  }
  EXPECT_TRUE(std::isfinite(aux_losses(aux_config(), a).z_loss));  // the clean shard alone
}

// Large finite logits: |logsumexp| >= 2^11.5 used to leave llround's range
// (a finite, negative z-loss); now exact up to lse^2 < 2^86, then +inf.
TEST(NonFiniteAux, LargeLogitsGiveTheZLossOrInfinity) {
  const int64_t E = 4;
  Tensor z(DType::f32, {2, E});
  z.data<float>()[0] = 5000.0f;       // lse = 5000 (the other logits 0: exp(-5000) = 0)
  z.data<float>()[E + 1] = -6000.0f;  // lse = log(3) + tiny
  AuxStats st = aux_stats(z, counts(E, 1));
  EXPECT_EQ(st.lse_overflow, 0);
  AuxLosses l = aux_losses(aux_config(0.01, 0.5), st);
  const double lse1 = std::log(3.0);
  EXPECT_NEAR(l.z_loss, 0.5 * (5000.0 * 5000.0 + lse1 * lse1) / 2, 1e-6 * 0.5 * 5000.0 * 5000.0);
  EXPECT_TRUE(std::isfinite(l.load_balance));

  // One token past the term limit: lse^2 = 1e26 >= 2^86.
  z.data<float>()[0] = 1e13f;
  st = aux_stats(z, counts(E, 1));
  EXPECT_EQ(st.lse_overflow, 1);
  EXPECT_EQ(st.nonfinite, 0);
  l = aux_losses(aux_config(0.01, 0.5), st);
  EXPECT_EQ(l.z_loss, kInf);
  EXPECT_TRUE(std::isfinite(l.load_balance));
  EXPECT_EQ(aux_losses(aux_config(0.01, 0.0), st).z_loss, 0.0f);  // weight 0 keeps 0

  // Terms each in range whose sum is not (4 * 3.97e25 >= 2^87): flagged however it is grouped.
  Tensor big(DType::f32, {4, E});
  for (int64_t t = 0; t < 4; ++t) big.data<float>()[t * E] = 6.3e12f;
  AuxStats half0 = aux_stats(big.slice_rows(0, 2), counts(E, 1)),
           half1 = aux_stats(big.slice_rows(2, 4), counts(E, 1));
  EXPECT_EQ(half0.lse_overflow, 0);
  EXPECT_EQ(half1.lse_overflow, 0);
  half0.add(half1);
  EXPECT_EQ(half0.lse_overflow, 1);
  EXPECT_EQ(aux_stats(big, counts(E, 2)).lse_overflow, 1);
  EXPECT_EQ(aux_losses(aux_config(0.01, 0.5), half0).z_loss, kInf);
}

// ---- the layer ---------------------------------------------------------------------------------

struct BadInput {
  const char* name;
  // Writes the bad values into x [T, D]; returns the tokens it touched.
  std::vector<int64_t> (*apply)(Tensor& x);
};

const BadInput kBadInputs[] = {
    {"one_nan",
     [](Tensor& x) {
       x.data<float>()[5 * x.dim(1) + 7] = kNan;
       return std::vector<int64_t>{5};
     }},
    {"one_inf",
     [](Tensor& x) {
       x.data<float>()[9 * x.dim(1) + 0] = kInf;
       return std::vector<int64_t>{9};
     }},
    {"one_minus_inf",
     [](Tensor& x) {
       x.data<float>()[0 * x.dim(1) + 31] = -kInf;
       return std::vector<int64_t>{0};
     }},
    {"nan_and_inf_rows",
     [](Tensor& x) {
       for (int64_t d = 0; d < x.dim(1); ++d) x.data<float>()[3 * x.dim(1) + d] = kNan;
       for (int64_t d = 0; d < x.dim(1); ++d) x.data<float>()[15 * x.dim(1) + d] = -kInf;
       return std::vector<int64_t>{3, 15};
     }},
    {"all_nan",
     [](Tensor& x) {
       std::vector<int64_t> all;
       for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = kNan;
       for (int64_t t = 0; t < x.dim(0); ++t) all.push_back(t);
       return all;
     }},
};

class NonFiniteLayer : public testing::LevelTest<std::tuple<BadInput, DType, Isa>> {
 protected:
  const BadInput& bad() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
};

// The user's report: E=4, K=2, D=32, F=64, T=16.
Config layer_config(DType dtype, double lb = 0.01, double z = 0.001) {
  Config c = aux_config(lb, z);
  c.emb_dim = 32;
  c.moe_mlp_dim = 64;
  c.dtype = dtype;
  return c;
}

bool row_has(const Tensor& t, int64_t row, bool (*pred)(float)) {
  const int64_t n = t.dim(1);
  for (int64_t i = 0; i < n; ++i)
    if (pred(t.get_f32(row * n + i))) return true;
  return false;
}
bool is_nan(float v) { return std::isnan(v); }
bool not_finite(float v) { return !std::isfinite(v); }

bool rows_equal(const Tensor& a, const Tensor& b, int64_t row) {
  return a.slice_rows(row, row + 1).bit_equal(b.slice_rows(row, row + 1));
}

TEST_P(NonFiniteLayer, AuxLossesAreNanAndOtherTokensKeepTheirBits) {
  const int64_t T = 16;
  for (double w : {0.01, 0.0}) {  // aux weights 0: the backward has no aux terms
    SCOPED_TRACE(w);
    Config cfg = layer_config(dtype(), w, w);
    LayerWeights wts = init_weights(cfg, 3);
    Tensor x = testing::uniform({T, cfg.emb_dim}, 11), dy = testing::uniform({T, cfg.emb_dim}, 12);
    Tensor xb = x.clone();
    const std::vector<int64_t> bad_tokens = bad().apply(xb);
    std::vector<char> is_bad(size_t(T), 0);
    for (int64_t t : bad_tokens) is_bad[size_t(t)] = 1;

    LayerOutputs clean, got;
    auto cf = layer_forward(cfg, wts, x, nullptr, clean);
    LayerGrads cg = layer_backward(cfg, *cf, dy);
    auto gf = layer_forward(cfg, wts, xb, nullptr, got);
    LayerGrads gg = layer_backward(cfg, *gf, dy);

    EXPECT_TRUE(std::isfinite(clean.load_balance_loss) && std::isfinite(clean.z_loss));
    EXPECT_EQ(clean.nonfinite_tokens, 0);
    EXPECT_TRUE(std::isnan(got.load_balance_loss));
    EXPECT_TRUE(std::isnan(got.z_loss));
    EXPECT_EQ(got.nonfinite_tokens, int64_t(bad_tokens.size()));
    int64_t rows = 0;
    for (int64_t e = 0; e < cfg.num_experts; ++e) rows += got.group_sizes.data<int32_t>()[e];
    EXPECT_EQ(rows, T * cfg.num_experts_per_tok);  // every token still takes K rows (dropless)

    for (int64_t t = 0; t < T; ++t) {
      SCOPED_TRACE(t);
      if (is_bad[size_t(t)]) {
        // Softmax scores all NaN: experts 0..K-1 (ties to the lower id); y and grad.x rows NaN.
        EXPECT_EQ(got.topk_idx.data<int32_t>()[t * 2], 0);
        EXPECT_EQ(got.topk_idx.data<int32_t>()[t * 2 + 1], 1);
        EXPECT_TRUE(std::isnan(got.topk_weights.get_f32(t * 2)));
        EXPECT_FALSE(row_has(got.y, t, [](float v) { return !std::isnan(v); }));
        EXPECT_TRUE(row_has(gg.dx, t, is_nan));
        continue;
      }
      EXPECT_TRUE(rows_equal(got.y, clean.y, t)) << "y";
      EXPECT_TRUE(rows_equal(got.topk_idx, clean.topk_idx, t)) << "topk_idx";
      EXPECT_TRUE(rows_equal(got.topk_weights, clean.topk_weights, t)) << "topk_weights";
      EXPECT_FALSE(row_has(gg.dx, t, not_finite)) << "grad.x finite";
      // With aux terms the counts c_e (which include the bad tokens' slots) enter every row's
      // router gradient; without them a finite token's grad.x row is its own business.
      if (w == 0.0) {
        EXPECT_TRUE(rows_equal(gg.dx, cg.dx, t)) << "grad.x";
      }
    }
    // The router kernel's gradient sums x^T dz over every token: all NaN. Expert weights: NaN in
    // the experts that got a bad token's rows (0 and 1), the others finite.
    const Tensor& gr = gg.weights.router;
    for (int64_t i = 0; i < gr.numel(); ++i)
      ASSERT_TRUE(std::isnan(gr.get_f32(i))) << "grad.router.kernel " << i;
    const Tensor& gwo = gg.weights.wo;  // [E, F, D]
    const int64_t per = gwo.numel() / cfg.num_experts;
    for (int64_t e = 0; e < cfg.num_experts; ++e) {
      bool any_bad = false;
      for (int64_t i = 0; i < per; ++i) any_bad |= !std::isfinite(gwo.get_f32(e * per + i));
      const bool got_bad_rows = e < 2;
      EXPECT_EQ(any_bad, got_bad_rows) << "grad.experts.wo expert " << e;
    }
  }
}

std::string bad_name(const ::testing::TestParamInfo<std::tuple<BadInput, DType, Isa>>& i) {
  return std::string(std::get<0>(i.param).name) + "_" + dtype_name(std::get<1>(i.param)) + "_" +
         isa_name(std::get<2>(i.param));
}

INSTANTIATE_TEST_SUITE_P(Inputs, NonFiniteLayer,
                         ::testing::Combine(::testing::ValuesIn(kBadInputs),
                                            ::testing::Values(DType::f32, DType::bf16),
                                            ::testing::ValuesIn(testing::all_levels())),
                         bad_name);

// Router logits that overflow |lse|^2 only (finite MSE): moe train's non-finite stop fires on the
// z-loss alone and names the step.
TEST(NonFiniteTrain, AuxLossAloneStopsTheStep) {
  Config cfg = layer_config(DType::f32, 0.01, 0.001);
  cfg.num_layers = 2;
  cfg.batch_tokens = 16;
  train::TrainState st = train::fresh_state(cfg);
  Tensor& router = st.params.blocks[0].moe.router;
  for (int64_t i = 0; i < router.numel(); ++i) router.data<float>()[i] *= 1e14f;
  const train::Model teacher = train::init_model(cfg, uint64_t(cfg.teacher_seed));
  Tensor x = train::batch_inputs(cfg, 0, 0, cfg.batch_tokens);
  train::LocalSync sync;
  train::PhaseTimes times;
  std::string e;
  try {
    train::train_step(cfg, st, teacher, x, cfg.batch_tokens, sync, times);
  } catch (const NonFiniteError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("non-finite loss (inf"), std::string::npos) << e;
  EXPECT_NE(e.find("z inf"), std::string::npos) << e;
  EXPECT_NE(e.find("at step 1"), std::string::npos) << e;
  EXPECT_EQ(st.step, 0);  // no update

  // A NaN token: every term NaN, same stop.
  st = train::fresh_state(cfg);
  x.data<float>()[3] = kNan;
  e.clear();
  try {
    train::train_step(cfg, st, teacher, x, cfg.batch_tokens, sync, times);
  } catch (const NonFiniteError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("non-finite loss"), std::string::npos) << e;
  EXPECT_TRUE(e.find("lb nan") != std::string::npos || e.find("lb -nan") != std::string::npos) << e;
  EXPECT_NE(e.find("at step 1"), std::string::npos) << e;
}

}  // namespace
}  // namespace moe
