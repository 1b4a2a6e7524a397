// The row primitives of the permute/combine kernels (src/kernels/row_ops.h)
// against naive loops written from their contract, bit for bit, at every
// kernel level this CPU runs (the reference level's portable loops included),
// so every level gives these bits.
#include "kernels/row_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/dispatch.h"
#include "testing/levels.h"

namespace moe {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint16_t bits_of(bf16 h) { return h.bits; }

// Values that stress the rounding: ties, NaN, infinities, denormals, signed zeros.
template <class T>
std::vector<T> row_values(int64_t D, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 3.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(),
                            -1e-39f,
                            1.0f + 1.0f / 256.0f,  // a bf16 tie after products
                            3.0e38f};
  std::vector<T> v(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    float x = rng() % 11 == 0 ? specials[rng() % std::size(specials)] : g(rng);
    v[size_t(d)] = store_as<T>(x);
  }
  return v;
}

// The contract, one element at a time.
template <class S, class O>
std::vector<O> naive_weighted_sum(const std::vector<float>& w, const std::vector<std::vector<S>>& src, int64_t D) {
  std::vector<O> out(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    float acc = 0.0f;
    for (size_t k = 0; k < w.size(); ++k) {
      float term = w[k] * load_f32(src[k][size_t(d)]);
      acc = acc + term;
    }
    out[size_t(d)] = store_as<O>(acc);
  }
  return out;
}

template <class S, class O>
void check_weighted_sum() {
  for (int64_t K : {1, 2, 3, 8}) {
    for (int64_t D : {1, 7, 15, 16, 17, 63, 64, 65, 130, 1000}) {
      std::vector<std::vector<S>> src;
      std::vector<const S*> ptrs;
      std::vector<float> w;
      for (int64_t k = 0; k < K; ++k) {
        src.push_back(row_values<S>(D, uint32_t(100 * K + D + k)));
        w.push_back(k == 1 ? 1.0f : 0.37f * float(k + 1) - 0.5f);
      }
      for (auto& s : src) ptrs.push_back(s.data());
      // Output with guards on both sides: nothing outside [0, D) is written.
      std::vector<O> out(size_t(D) + 32, store_as<O>(-7.0f));
      rows::weighted_sum(w.data(), ptrs.data(), K, out.data() + 16, D, ptrs.data());
      std::vector<O> want = naive_weighted_sum<S, O>(w, src, D);
      for (int64_t d = 0; d < D; ++d)
        ASSERT_EQ(bits_of(out[size_t(16 + d)]), bits_of(want[size_t(d)])) << "K=" << K << " D=" << D << " d=" << d;
      for (int64_t i = 0; i < 16; ++i) {
        ASSERT_EQ(bits_of(out[size_t(i)]), bits_of(store_as<O>(-7.0f))) << "guard before, D=" << D;
        ASSERT_EQ(bits_of(out[size_t(16 + D + i)]), bits_of(store_as<O>(-7.0f))) << "guard after, D=" << D;
      }
    }
  }
}

class RowOps : public testing::LevelTest<Isa> {};
INSTANTIATE_TEST_SUITE_P(Levels, RowOps, ::testing::ValuesIn(testing::all_levels()), testing::level_param_name);

TEST_P(RowOps, WeightedSumBf16MatchesContract) { check_weighted_sum<bf16, bf16>(); }
TEST_P(RowOps, WeightedSumBf16ToF32MatchesContract) { check_weighted_sum<bf16, float>(); }
TEST_P(RowOps, WeightedSumF32MatchesContract) { check_weighted_sum<float, float>(); }

// weighted_sum is the fill / axpy_f32 / store_row sequence in one pass.
TEST_P(RowOps, WeightedSumEqualsAxpySequence) {
  const int64_t D = 333, K = 4;
  std::vector<std::vector<bf16>> src;
  std::vector<const bf16*> ptrs;
  std::vector<float> w = {0.25f, -1.5f, 3.0f, 0.1f};
  for (int64_t k = 0; k < K; ++k) src.push_back(row_values<bf16>(D, uint32_t(k + 1)));
  for (auto& s : src) ptrs.push_back(s.data());
  std::vector<float> acc(size_t(D), 0.0f);
  for (int64_t k = 0; k < K; ++k) rows::axpy_f32(w[size_t(k)], ptrs[size_t(k)], acc.data(), D);
  std::vector<bf16> a(static_cast<size_t>(D)), b(static_cast<size_t>(D));
  rows::store_row(acc.data(), a.data(), D);
  rows::weighted_sum(w.data(), ptrs.data(), K, b.data(), D);
  for (int64_t d = 0; d < D; ++d) ASSERT_EQ(a[size_t(d)].bits, b[size_t(d)].bits) << d;
}

// A NaN where the contract gives one (NaN payloads are not part of the contract), else the same bits.
template <class T>
bool same_or_both_nan(T got, T want) {
  const float g = load_f32(got), w = load_f32(want);
  return std::isnan(w) ? std::isnan(g) : bits_of(got) == bits_of(want);
}

// dot and scale (the combine's backward) against their contracts: 16 lane sums in order, the lanes
// added 0..15, then the tail; scale one product and one rounding per element.
template <class T>
float naive_dot(const std::vector<T>& a, const std::vector<T>& b) {
  const int64_t D = int64_t(a.size());
  float lane[16] = {};
  int64_t d = 0;
  for (; d + 16 <= D; d += 16)
    for (int j = 0; j < 16; ++j) lane[j] = lane[j] + load_f32(a[size_t(d + j)]) * load_f32(b[size_t(d + j)]);
  float s = 0.0f;
  for (int j = 0; j < 16; ++j) s = s + lane[j];
  for (; d < D; ++d) s = s + load_f32(a[size_t(d)]) * load_f32(b[size_t(d)]);
  return s;
}

template <class T>
void check_dot_scale() {
  for (int64_t D : {1, 7, 15, 16, 17, 31, 32, 33, 100, 1024, 1031}) {
    // Finite values (a NaN or infinity would make every sum NaN or infinite), with denormals.
    std::vector<T> a = row_values<T>(D, uint32_t(D)), b = row_values<T>(D, uint32_t(D + 7));
    for (auto* v : {&a, &b})
      for (T& x : *v)
        if (!std::isfinite(load_f32(x))) x = store_as<T>(0.5f);
    ASSERT_EQ(bits_of(rows::dot(a.data(), b.data(), D)), bits_of(naive_dot(a, b))) << "D=" << D;
    std::vector<T> out(size_t(D) + 32, store_as<T>(-7.0f));
    std::vector<T> src = row_values<T>(D, uint32_t(D + 11));
    rows::scale(-0.37f, src.data(), out.data() + 16, D);
    for (int64_t d = 0; d < D; ++d) {
      const T want = store_as<T>(-0.37f * load_f32(src[size_t(d)]));
      ASSERT_TRUE(same_or_both_nan(out[size_t(16 + d)], want)) << "D=" << D << " d=" << d;
    }
    for (int64_t i = 0; i < 16; ++i) {
      ASSERT_EQ(bits_of(out[size_t(i)]), bits_of(store_as<T>(-7.0f))) << "guard before, D=" << D;
      ASSERT_EQ(bits_of(out[size_t(16 + D + i)]), bits_of(store_as<T>(-7.0f))) << "guard after, D=" << D;
    }
  }
}

TEST_P(RowOps, DotAndScaleBf16MatchContract) { check_dot_scale<bf16>(); }
TEST_P(RowOps, DotAndScaleF32MatchContract) { check_dot_scale<float>(); }

// dot_scale (the fused combine's backward, K rows of a token in one pass) gives the bits of dot and
// scale called row by row, for row counts around its groups of rows and lengths with tails.
template <class T>
void check_dot_scale_rows() {
  for (int64_t K : {1, 2, 3, 4, 5, 8, 9, 17})
    for (int64_t D : {1, 7, 16, 17, 33, 100, 1031}) {
      std::vector<T> dy = row_values<T>(D, uint32_t(D * 31 + K));
      for (T& x : dy)
        if (!std::isfinite(load_f32(x))) x = store_as<T>(-2.5f);
      const size_t n = static_cast<size_t>(K);
      std::vector<std::vector<T>> src(n), got(n), want(n);
      std::vector<const T*> sp(n);
      std::vector<T*> gp(n);
      std::vector<float> w(n), dots(n, -1.0f);
      for (int64_t k = 0; k < K; ++k) {
        src[size_t(k)] = row_values<T>(D, uint32_t(D + 100 * k + 5));
        got[size_t(k)].assign(size_t(D) + 32, store_as<T>(-7.0f));
        want[size_t(k)].assign(size_t(D), store_as<T>(0.0f));
        sp[size_t(k)] = src[size_t(k)].data();
        gp[size_t(k)] = got[size_t(k)].data() + 16;
        w[size_t(k)] = 0.25f * float(k) - 1.3f;
      }
      // Odd K with the next call's rows to prefetch (its own rows here): the same bits.
      if (K % 2)
        rows::dot_scale(dy.data(), sp.data(), w.data(), gp.data(), dots.data(), K, D, sp.data(), gp.data());
      else
        rows::dot_scale(dy.data(), sp.data(), w.data(), gp.data(), dots.data(), K, D);
      for (int64_t k = 0; k < K; ++k) {
        const float want_dot = rows::dot(dy.data(), src[size_t(k)].data(), D);
        ASSERT_TRUE(bits_of(dots[size_t(k)]) == bits_of(want_dot) ||
                    (std::isnan(dots[size_t(k)]) && std::isnan(want_dot)))
            << "K=" << K << " D=" << D << " k=" << k;
        rows::scale(w[size_t(k)], dy.data(), want[size_t(k)].data(), D);
        for (int64_t d = 0; d < D; ++d)
          ASSERT_EQ(bits_of(got[size_t(k)][size_t(16 + d)]), bits_of(want[size_t(k)][size_t(d)]))
              << "K=" << K << " D=" << D << " k=" << k << " d=" << d;
        for (int64_t i = 0; i < 16; ++i) {
          ASSERT_EQ(bits_of(got[size_t(k)][size_t(i)]), bits_of(store_as<T>(-7.0f))) << "guard before";
          ASSERT_EQ(bits_of(got[size_t(k)][size_t(16 + D + i)]), bits_of(store_as<T>(-7.0f)))
              << "guard after";
        }
      }
    }
}

TEST_P(RowOps, DotScaleRowsAreDotAndScaleBf16) { check_dot_scale_rows<bf16>(); }
TEST_P(RowOps, DotScaleRowsAreDotAndScaleF32) { check_dot_scale_rows<float>(); }

// The level's f32 -> bf16 row cast against moe::to_bf16: 2^20 f32 bit patterns spread over every
// exponent (denormals, infinities and NaN included; the levels with AVX-512 BF16 round with
// VCVTNEPS2BF16 except in vectors with a denormal lane), in rows whose lengths leave tails.
TEST_P(RowOps, CastToBf16IsToBf16ForEveryExponent) {
  std::vector<float> f;
  for (uint32_t hi = 0; hi < (1u << 20); ++hi) {
    const uint32_t b = (hi << 12) | (hi % 3 == 0   ? 0x800u
                                     : hi % 3 == 1 ? 0x7ffu
                                                   : 0x801u);  // ties and near-ties
    float x;
    std::memcpy(&x, &b, 4);
    f.push_back(x);
  }
  for (int64_t n : {int64_t(f.size()) - 3, int64_t(1), int64_t(15), int64_t(17), int64_t(33)}) {  // from f[3]
    std::vector<bf16> out(static_cast<size_t>(n));
    kernels::table().f32_to_bf16(f.data() + 3, out.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(out[size_t(i)].bits, to_bf16(f[size_t(i + 3)]).bits)
          << "f32 bits " << bits_of(f[size_t(i + 3)]);
  }
}

// The gated activation's row entries at each level against the scalar functions of activation.h
// element by element (same_or_both_nan).

template <class T>
void check_act_rows(Activation act, const std::vector<T>& g, const std::vector<T>& u,
                    const std::vector<T>& d) {
  const kernels::Table& t = kernels::table();
  const int64_t n = int64_t(g.size());
  std::vector<T> a(g.size()), dg(g.size()), du(g.size());
  if constexpr (std::is_same_v<T, bf16>) {
    t.act_forward_b(act, g.data(), u.data(), a.data(), n);
    t.act_backward_b(act, g.data(), u.data(), d.data(), dg.data(), du.data(), n);
  } else {
    t.act_forward_f(act, g.data(), u.data(), a.data(), n);
    t.act_backward_f(act, g.data(), u.data(), d.data(), dg.data(), du.data(), n);
  }
  for (size_t i = 0; i < g.size(); ++i) {
    const float x = load_f32(g[i]), uu = load_f32(u[i]), dd = load_f32(d[i]);
    const ActValueGrad v = act == Activation::silu ? silu_value_grad(x) : gelu_value_grad(x);
    const float fwd = (act == Activation::silu ? silu(x) : gelu(x)) * uu;
    ASSERT_TRUE(same_or_both_nan(a[i], store_as<T>(fwd)))
        << "forward, g bits " << bits_of(g[i]) << " u " << uu;
    ASSERT_TRUE(same_or_both_nan(dg[i], store_as<T>(dd * uu * v.grad))) << "dg, g bits " << bits_of(g[i]);
    ASSERT_TRUE(same_or_both_nan(du[i], store_as<T>(dd * v.value))) << "du, g bits " << bits_of(g[i]);
  }
}

// Every bf16 g (the clamps of exp at kExpLo / kExpHi, the rounding of n, infinities, NaN, denormals),
// against a few u and d, in rows of 65,536 and in short rows (the masked tails).
TEST_P(RowOps, GatedActivationBf16IsTheScalarFunctionForEveryInput) {
  std::vector<bf16> g(65536);
  for (size_t i = 0; i < g.size(); ++i) g[i].bits = uint16_t(i);
  for (Activation act : {Activation::silu, Activation::gelu})
    for (float uv : {1.0f, -3.0f, 0.1f, 3.0e38f}) {
      SCOPED_TRACE(std::string(act == Activation::silu ? "silu" : "gelu") + " u=" + std::to_string(uv));
      std::vector<bf16> u(g.size(), to_bf16(uv)), d(g.size(), to_bf16(0.7f - uv));
      check_act_rows(act, g, u, d);
    }
  for (int64_t n : {1, 7, 15, 16, 17, 33}) {
    std::vector<bf16> gs = row_values<bf16>(n, uint32_t(n)), us = row_values<bf16>(n, uint32_t(n + 50)),
                      ds = row_values<bf16>(n, uint32_t(n + 90));
    check_act_rows(Activation::silu, gs, us, ds);
    check_act_rows(Activation::gelu, gs, us, ds);
  }
}

// f32 rows: every f32 whose low 14 bits are a fixed pattern (2^18 values across all exponents),
// the stress values, and short rows.
TEST_P(RowOps, GatedActivationF32IsTheScalarFunction) {
  std::vector<float> g;
  for (uint32_t hi = 0; hi < (1u << 18); ++hi) {
    const uint32_t b = (hi << 14) | 0x15a3u;
    float f;
    std::memcpy(&f, &b, 4);
    g.push_back(f);
  }
  std::vector<float> u(g.size(), -1.25f), d(g.size(), 0.375f);
  check_act_rows(Activation::silu, g, u, d);
  check_act_rows(Activation::gelu, g, u, d);
  for (int64_t n : {1, 5, 8, 9, 16, 31, 1000}) {
    std::vector<float> gs = row_values<float>(n, uint32_t(n)), us = row_values<float>(n, uint32_t(n + 50)),
                       ds = row_values<float>(n, uint32_t(n + 90));
    check_act_rows(Activation::silu, gs, us, ds);
    check_act_rows(Activation::gelu, gs, us, ds);
  }
}

}  // namespace
}  // namespace moe
