// Kernel backward passes against finite differences, routing index math, and
// the MaxText vectors of MAXTEXT_NOTES.md §5.1.
//
// Finite differences run on the f32 kernels. Each loss here is LINEAR in the
// perturbed input (gmm in lhs or rhs, permute in x, combine in ys or w), so the
// central difference has no truncation error: fd = (L(v+h) - L(v-h)) / 2h
// differs from the exact derivative only by f32 rounding of the two sums,
// about n * 2^-24 * sum|terms| / h. With h = 0.5 and sums of O(100) terms of
// O(1) that is < 1e-3; the bound used is 2e-3 * max(1, max|grad|).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "kernels/activation.h"
#include "kernels/combine.h"
#include "kernels/grouped_gemm.h"
#include "kernels/permute.h"
#include "route/routing.h"
#include "testing/levels.h"
#include "testing/tensors.h"

namespace moe {
namespace {

using testing::uniform;

double dot_f32(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += double(a.get_f32(i)) * double(b.get_f32(i));
  return s;
}

// Checks grad against central differences of loss() over every element of v (f32).
void expect_fd(Tensor v, const Tensor& grad, const std::function<double()>& loss, double h = 0.5,
               double rel = 2e-3) {
  double gmax = testing::max_abs(grad);
  for (int64_t i = 0; i < v.numel(); ++i) {
    float v0 = v.data<float>()[i];
    v.data<float>()[i] = v0 + float(h);
    double lp = loss();
    v.data<float>()[i] = v0 - float(h);
    double lm = loss();
    v.data<float>()[i] = v0;
    EXPECT_NEAR((lp - lm) / (2 * h), grad.get_f32(i), rel * std::max(1.0, gmax)) << "element " << i;
  }
}

// The kernels' backward passes at every kernel level.
class KernelGrad : public testing::LevelTest<Isa> {};
INSTANTIATE_TEST_SUITE_P(Levels, KernelGrad, ::testing::ValuesIn(testing::all_levels()), testing::level_param_name);

TEST_P(KernelGrad, GroupedGemmDlhsDrhs) {
  // Groups include an empty one and rows past the last group.
  GroupLayout g = GroupLayout::from_sizes({3, 0, 4, 2});
  const int64_t M = 11, Kc = 5, N = 6;
  Tensor lhs = uniform({M, Kc}, 1), rhs = uniform({4, Kc, N}, 2), dout = uniform({M, N}, 3);
  auto loss = [&] {
    Tensor out(DType::f32, {M, N});
    reference::gmm(lhs, rhs, g, 0, out);
    return dot_f32(out, dout);
  };
  Tensor dlhs(DType::f32, {M, Kc}), drhs(DType::f32, {4, Kc, N});
  reference::gmm_dlhs(dout, rhs, g, 0, dlhs);
  reference::gmm_drhs(lhs, dout, g, 0, drhs);
  expect_fd(lhs, dlhs, loss);
  expect_fd(rhs, drhs, loss);
  // Rows past the groups and the empty group's weights get zero gradient.
  for (int64_t k = 0; k < Kc; ++k) EXPECT_EQ(dlhs.data<float>()[10 * Kc + k], 0.0f);
  for (int64_t i = 0; i < Kc * N; ++i) EXPECT_EQ(drhs.data<float>()[Kc * N + i], 0.0f);
}

Routing sample_routing(int64_t T, int64_t K, int64_t E, int64_t cap, uint64_t seed) {
  std::vector<int32_t> idx(static_cast<size_t>(T * K));
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(static_cast<size_t>(E));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    std::copy_n(e.begin(), K, idx.begin() + t * K);
  }
  return compute_routing(idx.data(), T, K, E, cap);
}

TEST_P(KernelGrad, PermuteBackward) {
  Routing rt = sample_routing(5, 3, 4, -1, 7);
  Tensor x = uniform({5, 4}, 4), dxs = uniform({15, 4}, 5);
  auto loss = [&] {
    Tensor xs(DType::f32, {15, 4});
    reference::permute(x, rt, xs);
    return dot_f32(xs, dxs);
  };
  Tensor dx(DType::f32, {5, 4});
  reference::permute_backward(dxs, rt, dx);
  expect_fd(x, dx, loss);
}

TEST_P(KernelGrad, CombineBackward) {
  for (int64_t cap : {int64_t(-1), int64_t(2)}) {  // with capacity some slots are dropped (rows past groups)
    Routing rt = sample_routing(6, 2, 4, cap, 9);
    Tensor ys = uniform({12, 5}, 6), w = uniform({6, 2}, 7, 0.0f, 1.0f), dy = uniform({6, 5}, 8);
    for (int64_t r = rt.groups.total(); r < 12; ++r)
      for (int64_t d = 0; d < 5; ++d) ys.data<float>()[r * 5 + d] = 0.0f;  // the FFN leaves dropped rows zero
    auto loss = [&] {
      Tensor y(DType::f32, {6, 5});
      reference::combine(ys, w, rt, true, y);
      return dot_f32(y, dy);
    };
    Tensor dys(DType::f32, {12, 5}), dw(DType::f32, {6, 2});
    reference::combine_backward(dy, ys, w, rt, dys, dw);
    expect_fd(ys, dys, loss);
    expect_fd(w, dw, loss);
  }
}

// The activation is not linear: h = 1e-3 gives truncation ~h^2 * |f'''| ~ 1e-6
// and f32 cancellation ~ 2^-24 * |L| / h ~ 1e-4 for |L| ~ 10: bound 1e-3.
TEST_P(KernelGrad, GatedActivation) {
  for (Activation act : {Activation::silu, Activation::gelu}) {
    const int64_t R = 4, F = 3;
    Tensor h = uniform({R, 2 * F}, 10, -3.0f, 3.0f), da = uniform({R, F}, 11);
    auto loss = [&] {
      Tensor a(DType::f32, {R, F});
      gated_act_forward(act, {h, 0, 2 * F}, {h, F, 2 * F}, R, F, a);
      return dot_f32(a, da);
    };
    Tensor dh(DType::f32, {R, 2 * F});
    gated_act_backward(act, {h, 0, 2 * F}, {h, F, 2 * F}, da, R, F, {dh, 0, 2 * F}, {dh, F, 2 * F});
    expect_fd(h, dh, loss, 1e-3, 1e-3);
  }
}

// A NaN reaching the activation (a diverged step) comes out as NaN, never as a number, and the
// float-to-int conversion inside exp_approx stays defined for it (UBSan in scripts/sanitize.sh
// reported it before exp_approx converted 0 in place of NaN).
TEST(Activation, NanInNanOut) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(exp_approx(nan)));
  EXPECT_TRUE(std::isnan(silu(nan)));
  EXPECT_TRUE(std::isnan(gelu(nan)));
  EXPECT_TRUE(std::isnan(silu_value_grad(nan).value));
  EXPECT_TRUE(std::isnan(gelu_value_grad(nan).grad));
  EXPECT_NEAR(exp_approx(1.0f), 2.7182818f, 1e-6f);
  EXPECT_NEAR(exp_approx(-2.5f), 0.0820850f, 1e-7f);
  for (Activation act : {Activation::silu, Activation::gelu}) {
    const int64_t F = 3;
    Tensor h = uniform({1, 2 * F}, 12, -3.0f, 3.0f), a(DType::f32, {1, F});
    h.data<float>()[1] = nan;  // act(h0[1]) * h1[1]
    gated_act_forward(act, {h, 0, 2 * F}, {h, F, 2 * F}, 1, F, a);
    EXPECT_TRUE(std::isfinite(a.data<float>()[0]));
    EXPECT_TRUE(std::isnan(a.data<float>()[1]));
    EXPECT_TRUE(std::isfinite(a.data<float>()[2]));
  }
}

// exp_approx against double-precision exp: within 1 ulp of f32 over its clamped range (a step of
// 2^-10 from kExpLo up, plus the clamp points); saturated, never infinite, above kExpHi (the scale
// 2^n stays <= 2^127).
TEST(Activation, ExpApproxIsWithinOneUlpAndSaturatesFinite) {
  double worst = 0;
  for (double x = kExpLo; x <= kExpHi; x += 1.0 / 1024) {
    const float xf = float(x), got = exp_approx(xf);
    const double want = std::exp(double(xf));
    const double ulp = std::nextafter(float(want), std::numeric_limits<float>::infinity()) - float(want);
    worst = std::max(worst, std::abs(double(got) - want) / ulp);
  }
  EXPECT_LE(worst, 1.0);  // 0.97 at these points (0.95 with the unfused polynomial before)
  EXPECT_EQ(exp_approx(1e30f), exp_approx(kExpHi));
  EXPECT_EQ(exp_approx(std::numeric_limits<float>::infinity()), exp_approx(kExpHi));
  EXPECT_TRUE(std::isfinite(exp_approx(kExpHi)));
  EXPECT_GT(exp_approx(kExpHi), 2.3e38f);
  EXPECT_EQ(exp_approx(-1e30f), exp_approx(kExpLo));
  EXPECT_GT(exp_approx(kExpLo), 0.0f);
}

TEST(Routing, StableSortGroupsInverse) {
  const std::vector<int32_t> idx = {2, 0, 0, 1, 2, 1, 0, 2};  // T=4, K=2, E=4 (expert 3 empty)
  Routing rt = compute_routing(idx.data(), 4, 2, 4, -1);
  EXPECT_EQ(rt.groups.sizes, (std::vector<int64_t>{3, 2, 3, 0}));
  EXPECT_EQ(rt.order, (std::vector<int32_t>{1, 2, 6, 3, 5, 0, 4, 7}));
  for (int r = 0; r < 8; ++r) EXPECT_EQ(rt.order[size_t(rt.inv[size_t(r)])], r);
  EXPECT_EQ(rt.dropped, 0);
}

// MaxText TokenDroppingTest.test_generate_masks: E=8, K=2, S=4 per batch row, cf=2 => C=2.
TEST(Routing, MaxTextCapacityMasks) {
  const int32_t idx[4][8] = {{0, 5, 0, 4, 1, 0, 3, 5},
                             {1, 2, 4, 1, 5, 0, 7, 1},
                             {6, 2, 2, 3, 4, 2, 1, 2},
                             {4, 1, 0, 7, 5, 0, 4, 7}};
  // Expected dropped (token, slot) per batch row: b0 t2 e0 (slot 1), b1 t3 e1 (slot 1),
  // b2 t2 e2 (slot 1), b2 t3 e2 (slot 1); b3 none.
  const std::vector<std::vector<int>> dropped = {{2 * 2 + 1}, {3 * 2 + 1}, {2 * 2 + 1, 3 * 2 + 1}, {}};
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(expert_capacity(4, 2, 8, 2.0), 2);
    Routing rt = compute_routing(idx[b], 4, 2, 8, expert_capacity(4, 2, 8, 2.0));
    std::vector<int> got;
    for (int64_t row = rt.groups.total(); row < rt.rows(); ++row) got.push_back(rt.order[size_t(row)]);
    EXPECT_EQ(got, dropped[size_t(b)]) << "batch row " << b;
  }
}

// MaxText test_permute_direct_token_gather_matches_repeat_and_sort: x = arange(24)
// as [6 tokens, 4], E=4, K=2; outputs and gradients (cotangent arange(48) as
// [12, 4]) equal the direct gather x[order // K] and its adjoint, bit for bit.
TEST(Routing, MaxTextDirectGatherMatchesRepeatSort) {
  const std::vector<int32_t> idx = {3, 1, 0, 2, 1, 3, 2, 0, 3, 2, 0, 1};
  Routing rt = compute_routing(idx.data(), 6, 2, 4, -1);
  Tensor x(DType::f32, {6, 4}), ct(DType::f32, {12, 4});
  std::iota(x.data<float>(), x.data<float>() + 24, 0.0f);
  std::iota(ct.data<float>(), ct.data<float>() + 48, 0.0f);
  Tensor xs(DType::f32, {12, 4}), dx(DType::f32, {6, 4});
  reference::permute(x, rt, xs);
  reference::permute_backward(ct, rt, dx);
  for (int64_t r = 0; r < 12; ++r)
    for (int64_t d = 0; d < 4; ++d)
      EXPECT_EQ(xs.data<float>()[r * 4 + d], x.data<float>()[(rt.order[size_t(r)] / 2) * 4 + d]);
  for (int64_t t = 0; t < 6; ++t)
    for (int64_t d = 0; d < 4; ++d) {
      float want = ct.data<float>()[rt.inv[size_t(t * 2)] * 4 + d] + ct.data<float>()[rt.inv[size_t(t * 2 + 1)] * 4 + d];
      EXPECT_EQ(dx.data<float>()[t * 4 + d], want);
    }
}

}  // namespace
}  // namespace moe
