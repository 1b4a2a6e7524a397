// Fast grouped GEMM (moe::gmm / gmm_dlhs / gmm_drhs) at every fast kernel level
// this CPU runs (avx2, avx512, avx512_bf16; tests/testing/levels.h) against the
// reference twin, plus the contract within each level: untouched rows, guard
// bytes, misaligned views, empty groups, row independence and drhs group
// independence (exact).
//
// Tolerance: both paths accumulate the same exact products (bf16*bf16 and
// f32*f32 products are exact or correctly rounded in f32) in f32 but in a
// different order, so each differs from the exact sum by at most
// ~L * 2^-24 * sum|a*b| (L = reduction length) and from each other by twice
// that. We check |fast - ref| <= 2 * (L + 2) * 2^-24 * S per element with
// S = sum_l |a_l * b_l| computed in double; bf16 outputs add one bf16 rounding
// on each side: + 2^-8 * (|ref| + bound).
//
// neon_bf16: BFDOT without FEAT_EBF16 rounds its two additions per pair (the
// pair's sum, then the accumulator's) to odd, an error below 2^-23 (not 2^-24)
// of the result each, so the fast side's chain may be off by L * 2^-23 * S
// and the bound there is 3 * (L + 2) * 2^-24 * S (kBf16DotFactor). The
// difference measured against the exact sum: Bf16DotRoundingIsMeasured below
// (numbers in docs/architecture.md, "AArch64").
#include "kernels/grouped_gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>

#include "core/allocator.h"
#include "kernels/dispatch.h"
#include "kernels/grouped_gemm_internal.h"
#include "testing/levels.h"

namespace moe {
namespace {

constexpr float kCanary = -1536.0f;  // exact in bf16, far from any output here

// A [rows, cols] view at element offset `pad` inside a buffer with `pad`
// canary elements before and after (misaligned when pad is not a multiple of 16).
struct Guarded {
  Tensor buf, view;
  int64_t pad;
  Guarded(DType t, int64_t rows, int64_t cols, int64_t pad_) : pad(pad_) {
    buf = Tensor::empty(t, {rows * cols + 2 * pad});
    for (int64_t i = 0; i < buf.numel(); ++i) set(buf, i, kCanary);
    view = buf.slice_rows(pad, pad + rows * cols).reshaped({rows, cols});
  }
  static void set(Tensor& t, int64_t i, float v) {
    if (t.dtype() == DType::f32) t.data<float>()[i] = v;
    else t.data<bf16>()[i] = to_bf16(v);
  }
  bool guards_intact() const {
    for (int64_t i = 0; i < pad; ++i)
      if (buf.get_f32(i) != kCanary || buf.get_f32(buf.numel() - 1 - i) != kCanary) return false;
    return true;
  }
};

Tensor random_tensor(DType t, Shape s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor x = Tensor::empty(t, s);
  for (int64_t i = 0; i < x.numel(); ++i) Guarded::set(x, i, u(rng));
  return x;
}

// The factor of (L + 2) * 2^-24 * S in the bound at the active level (above).
constexpr double kBf16DotFactor = 3.0;
double tolerance_factor() { return active_isa() == Isa::neon_bf16 ? kBf16DotFactor : 2.0; }

// |fast - ref| <= bound(S) for every element; S[i] = sum |a b| for element i.
void expect_close(const Tensor& fast, const Tensor& ref, const std::vector<double>& S, int64_t L,
                  const char* what) {
  ASSERT_EQ(fast.numel(), ref.numel());
  int bad = 0;
  for (int64_t i = 0; i < ref.numel() && bad < 5; ++i) {
    double r = ref.get_f32(i), f = fast.get_f32(i);
    double tol = tolerance_factor() * double(L + 2) * std::ldexp(1.0, -24) * S[size_t(i)];
    if (fast.dtype() == DType::bf16) tol += std::ldexp(1.0, -8) * (std::fabs(r) + tol);
    if (!(std::fabs(f - r) <= tol)) {
      ++bad;
      ADD_FAILURE() << what << " element " << i << ": fast " << f << " ref " << r << " tol " << tol;
    }
  }
}

struct Case {
  std::vector<int64_t> sizes;
  int64_t Kc, N, goff, n_local;
  int64_t extra_rows;  // rows past the last group (must stay untouched)
};

int64_t rows_of(const Case& c, const GroupLayout& g) { return g.total() + c.extra_rows; }

// Rows of the local groups: [first, last).
std::pair<int64_t, int64_t> local_rows(const Case& c, const GroupLayout& g) {
  return {g.offsets[size_t(c.goff)], g.offsets[size_t(c.goff + c.n_local)]};
}

// Untouched rows keep the canary; local rows are finite.
void expect_rows_untouched(const Tensor& out, const Case& c, const GroupLayout& g, const char* what) {
  auto [a, b] = local_rows(c, g);
  int64_t cols = out.dim(1);
  for (int64_t r = 0; r < out.dim(0); ++r)
    for (int64_t j = 0; j < cols; ++j) {
      float v = out.get_f32(r * cols + j);
      bool local = r >= a && r < b;
      if (local ? v == kCanary : v != kCanary) {
        ADD_FAILURE() << what << " row " << r << " col " << j << " local " << local << " value " << v;
        return;
      }
    }
}

// S[r, j] = sum_l |x[r, l] * W[l, j]| with W = rhs[g(r)] (transposed: rhs[g(r)]^T),
// for rows of local groups; the scale of the rounding error of out[r, j].
std::vector<double> abs_sums(const Tensor& x, const Tensor& rhs, const Case& c, const GroupLayout& g,
                             bool transposed) {
  int64_t M = x.dim(0), L = x.dim(1), cols = transposed ? c.Kc : c.N;
  std::vector<double> S(size_t(M * cols), 0.0);
  for (int64_t r = 0; r < M; ++r) {
    int64_t gi = int64_t(std::upper_bound(g.offsets.begin(), g.offsets.end(), r) - g.offsets.begin()) - 1 - c.goff;
    if (gi < 0 || gi >= c.n_local) continue;
    for (int64_t l = 0; l < L; ++l)
      for (int64_t j = 0; j < cols; ++j) {
        int64_t wi = transposed ? (gi * c.Kc + j) * c.N + l : (gi * c.Kc + l) * c.N + j;
        S[size_t(r * cols + j)] += std::fabs(double(x.get_f32(r * L + l)) * rhs.get_f32(wi));
      }
  }
  return S;
}

void run_forward_and_dlhs(DType in, DType out_t, const Case& c, int64_t pad) {
  GroupLayout g = GroupLayout::from_sizes(c.sizes);
  int64_t M = rows_of(c, g);
  Tensor lhs = random_tensor(in, {M, c.Kc}, 1), rhs = random_tensor(in, {c.n_local, c.Kc, c.N}, 2);
  Tensor dout = random_tensor(in, {M, c.N}, 3);
  // Forward.
  Guarded fast(out_t, M, c.N, pad), ref(out_t, M, c.N, pad);
  gmm(lhs, rhs, g, c.goff, fast.view);
  reference::gmm(lhs, rhs, g, c.goff, ref.view);
  expect_close(fast.view, ref.view, abs_sums(lhs, rhs, c, g, false), c.Kc, "gmm");
  expect_rows_untouched(fast.view, c, g, "gmm");
  EXPECT_TRUE(fast.guards_intact()) << "gmm wrote outside its output";
  // dlhs.
  Guarded dfast(out_t, M, c.Kc, pad), dref(out_t, M, c.Kc, pad);
  gmm_dlhs(dout, rhs, g, c.goff, dfast.view);
  reference::gmm_dlhs(dout, rhs, g, c.goff, dref.view);
  expect_close(dfast.view, dref.view, abs_sums(dout, rhs, c, g, true), c.N, "gmm_dlhs");
  expect_rows_untouched(dfast.view, c, g, "gmm_dlhs");
  EXPECT_TRUE(dfast.guards_intact()) << "gmm_dlhs wrote outside its output";
}

void run_drhs(DType in, const Case& c, int64_t pad) {
  GroupLayout g = GroupLayout::from_sizes(c.sizes);
  int64_t M = rows_of(c, g);
  Tensor lhs = random_tensor(in, {M, c.Kc}, 4), dout = random_tensor(in, {M, c.N}, 5);
  Guarded fast(DType::f32, c.n_local * c.Kc, c.N, pad);
  Tensor fview = fast.view.reshaped({c.n_local, c.Kc, c.N});
  Tensor ref(DType::f32, {c.n_local, c.Kc, c.N});
  gmm_drhs(lhs, dout, g, c.goff, fview);
  reference::gmm_drhs(lhs, dout, g, c.goff, ref);
  std::vector<double> S(size_t(ref.numel()), 0.0);
  for (int64_t lg = 0; lg < c.n_local; ++lg)
    for (int64_t r = g.offsets[size_t(c.goff + lg)]; r < g.offsets[size_t(c.goff + lg + 1)]; ++r)
      for (int64_t k = 0; k < c.Kc; ++k)
        for (int64_t n = 0; n < c.N; ++n)
          S[size_t((lg * c.Kc + k) * c.N + n)] += std::fabs(double(lhs.get_f32(r * c.Kc + k)) * dout.get_f32(r * c.N + n));
  int64_t L = *std::max_element(c.sizes.begin(), c.sizes.end()) + 1;
  expect_close(fview, ref, S, L, "gmm_drhs");
  EXPECT_TRUE(fast.guards_intact()) << "gmm_drhs wrote outside its output";
}

// Every test below runs once per fast level, at that level.
class GroupedGemm : public testing::LevelTest<Isa> {};
INSTANTIATE_TEST_SUITE_P(Levels, GroupedGemm, ::testing::ValuesIn(testing::fast_levels()), testing::level_param_name);

// The dispatched kernels are the level's own, never the reference twin compared with itself.
TEST_P(GroupedGemm, DispatchesToTheLevelsKernels) {
  const kernels::Table& t = kernels::table();
  EXPECT_EQ(t.isa, GetParam());
  EXPECT_NE(t.gmm, &reference::gmm);
  EXPECT_NE(t.gmm_dlhs, &reference::gmm_dlhs);
  EXPECT_NE(t.gmm_drhs, &reference::gmm_drhs);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {{3, 17, 33}, 130, 65, 0, 3, 0},                 // odd sizes, M not a tile multiple
      {{0, 5, 0, 65, 0}, 33, 130, 0, 5, 2},            // leading / middle / trailing empty, extra rows
      {{0, 0, 0}, 17, 33, 0, 3, 4},                    // all empty
      {{7, 1, 20, 9, 3}, 65, 17, 2, 2, 3},             // group_offset != 0, fewer local groups
      {{1}, 1, 1, 0, 1, 0},                            // 1x1x1
      {{13, 40}, 3, 129, 1, 1, 1},                     // Kc = 3 (odd pairs), N > 2 panels
      {{4, 9, 0, 2, 7, 1, 5, 3, 6, 0, 8, 2, 1}, 17, 33, 0, 13, 1},  // many small groups (drhs per-group tasks)
  };
  return all;
}

TEST_P(GroupedGemm, MatchesReferenceBf16) {
  for (const Case& c : cases())
    for (int64_t pad : {0, 1, 3}) {
      SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " pad " << pad);
      run_forward_and_dlhs(DType::bf16, DType::bf16, c, pad);
      run_forward_and_dlhs(DType::bf16, DType::f32, c, pad);
      run_drhs(DType::bf16, c, pad);
    }
}

TEST_P(GroupedGemm, MatchesReferenceF32) {
  for (const Case& c : cases())
    for (int64_t pad : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " pad " << pad);
      run_forward_and_dlhs(DType::f32, DType::f32, c, pad);
      run_drhs(DType::f32, c, pad);
    }
}

// With a reduction length of 1 the f32 sum is 0 + the exact product, so a bf16
// output is exactly to_bf16(0 + a * b) (round to nearest even, infinities kept),
// except that a product below the smallest normal f32 may be flushed to zero:
// the AVX-512 BF16 dot product (VDPBF16PS, level avx512_bf16) always flushes
// denormal results; the other levels (FMA on widened f32) round them. Documented in docs/architecture.md.
TEST_P(GroupedGemm, Bf16OutputRoundsLikeToBf16) {
  const float lhs_vals[] = {1e-20f, -3e-20f, 1.5e-19f, 7e-21f, 1.0f, -2.5f, 3e38f, 0.0f};
  const int64_t M = 8, N = 35;  // N: two full 16-lane blocks and a masked tail
  Tensor lhs(DType::bf16, {M, 1}), rhs(DType::bf16, {1, 1, N});
  for (int64_t i = 0; i < M; ++i) lhs.data<bf16>()[i] = to_bf16(lhs_vals[i]);
  for (int64_t j = 0; j < N; ++j) rhs.data<bf16>()[j] = to_bf16(float(j + 1) * 1.7e-20f * (j % 2 ? -1.0f : 1.0f));
  rhs.data<bf16>()[N - 1] = to_bf16(1e30f);  // 3e38 * 1e30: +inf; 0 * 1e30: 0
  Tensor out(DType::bf16, {M, N});
  GroupLayout g = GroupLayout::from_sizes({M});
  gmm(lhs, rhs, g, 0, out);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float exact = 0.0f + to_f32(lhs.data<bf16>()[i]) * to_f32(rhs.data<bf16>()[j]);  // the sum starts at +0
      uint16_t got = out.data<bf16>()[i * N + j].bits;
      bool flushed = std::fpclassify(exact) == FP_SUBNORMAL && (got & 0x7fff) == 0;
      if (!flushed)
        ASSERT_EQ(got, to_bf16(exact).bits) << "row " << i << " col " << j << " exact " << exact;
    }
}

// The bf16 dot products' rounding, measured: a bf16 gmm with f32 output over a
// long reduction (L = 4096, inputs uniform in [-1, 1], no denormals), each
// element's error against the exact sum (double) in units of 2^-24 * S, the
// largest over the output, for this level and for the reference twin. Printed
// (docs/architecture.md quotes it); the test fails only past the bound the
// other tests use: L * 2^-23 * S (round to odd) or L * 2^-24 * S (round to
// nearest), plus the same for the twin.
TEST_P(GroupedGemm, Bf16DotRoundingIsMeasured) {
  const int64_t M = 48, Kc = 4096, N = 64;
  Tensor lhs = random_tensor(DType::bf16, {M, Kc}, 21), rhs = random_tensor(DType::bf16, {1, Kc, N}, 22);
  Tensor fast(DType::f32, {M, N}), ref(DType::f32, {M, N});
  GroupLayout g = GroupLayout::from_sizes({M});
  gmm(lhs, rhs, g, 0, fast);
  reference::gmm(lhs, rhs, g, 0, ref);
  double worst_fast = 0, worst_ref = 0, worst_diff = 0, sum_fast = 0, sum_ref = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double exact = 0, S = 0;
      for (int64_t l = 0; l < Kc; ++l) {
        const double p = double(lhs.get_f32(i * Kc + l)) * rhs.get_f32(l * N + j);
        exact += p, S += std::fabs(p);
      }
      const double unit = std::ldexp(S, -24), f = fast.get_f32(i * N + j), r = ref.get_f32(i * N + j);
      worst_fast = std::max(worst_fast, std::fabs(f - exact) / unit);
      worst_ref = std::max(worst_ref, std::fabs(r - exact) / unit);
      worst_diff = std::max(worst_diff, std::fabs(f - r) / unit);
      sum_fast += std::fabs(f - exact) / unit, sum_ref += std::fabs(r - exact) / unit;
    }
  std::printf("[ bf16 rounding ] level %s, L = %lld: |fast - exact| max %.2f, mean %.3f; |reference - exact| max "
              "%.2f, mean %.3f; |fast - reference| max %.2f (units of 2^-24 * sum|a*b|)\n",
              isa_name(active_isa()), (long long)Kc, worst_fast, sum_fast / double(M * N), worst_ref,
              sum_ref / double(M * N), worst_diff);
  const double fast_bound = (active_isa() == Isa::neon_bf16 ? 2.0 : 1.0) * double(Kc + 2);
  EXPECT_LE(worst_fast, fast_bound);
  EXPECT_LE(worst_ref, double(Kc + 2));
  EXPECT_LE(worst_diff, tolerance_factor() * double(Kc + 2));
}

// A weight gradient of 64 MiB or more is written with non-temporal stores
// (simd/gemm_impl.h, kStreamBytes): same values, full tiles streamed,
// the partial last column panel (N = 4112: rows 64-byte aligned, 16 columns past the last full panel) stored normally.
TEST_P(GroupedGemm, LargeGradientWithStreamedStores) {
  run_drhs(DType::bf16, Case{{3, 2}, 4096, 4112, 0, 2, 0}, 0);
}

// Copies rows [b, e) of x into rows starting at `at` of y.
void copy_rows(const Tensor& x, int64_t b, int64_t e, Tensor& y, int64_t at) {
  size_t row = size_t(x.numel() / x.dim(0)) * dtype_size(x.dtype());
  std::memcpy(static_cast<std::byte*>(y.raw()) + size_t(at) * row, static_cast<const std::byte*>(x.raw()) + size_t(b) * row,
              size_t(e - b) * row);
}

bool rows_bit_equal(const Tensor& x, int64_t xb, const Tensor& y, int64_t yb, int64_t n) {
  size_t row = size_t(x.numel() / x.dim(0)) * dtype_size(x.dtype());
  return std::memcmp(static_cast<const std::byte*>(x.raw()) + size_t(xb) * row,
                     static_cast<const std::byte*>(y.raw()) + size_t(yb) * row, size_t(n) * row) == 0;
}

// Row independence: group g's rows computed inside a full call, and again in
// a call holding only them after `before` rows of another group, with `after`
// unrouted rows: identical bits (forward, dlhs). drhs[g] from the full call
// equals drhs of the group alone (other schedule: 1 local group). The thread
// count cannot matter either: these calls split the rows into different tasks.
void check_row_independence(DType in, DType out_t, int64_t Kc, int64_t N) {
  std::vector<int64_t> sizes = {5, 0, 37, 14, 1, 22, 9, 3, 30, 11};
  GroupLayout g = GroupLayout::from_sizes(sizes);
  int64_t G = int64_t(sizes.size()), M = g.total();
  Tensor lhs = random_tensor(in, {M, Kc}, 7), rhs = random_tensor(in, {G, Kc, N}, 8);
  Tensor dout = random_tensor(in, {M, N}, 9);
  Tensor out(out_t, {M, N}), dl(out_t, {M, Kc}), dr(DType::f32, {G, Kc, N});
  gmm(lhs, rhs, g, 0, out);
  gmm_dlhs(dout, rhs, g, 0, dl);
  gmm_drhs(lhs, dout, g, 0, dr);
  const int64_t before = 7, after = 5;
  for (int64_t gi = 0; gi < G; ++gi) {
    int64_t b = g.offsets[size_t(gi)], n = sizes[size_t(gi)];
    GroupLayout g2 = GroupLayout::from_sizes({before, n});
    int64_t M2 = before + n + after;
    Tensor lhs2 = random_tensor(in, {M2, Kc}, 10), dout2 = random_tensor(in, {M2, N}, 11);
    copy_rows(lhs, b, b + n, lhs2, before);
    copy_rows(dout, b, b + n, dout2, before);
    Tensor rhs2(in, {2, Kc, N});
    copy_rows(rhs, (gi + 1) % G, (gi + 1) % G + 1, rhs2, 0);
    copy_rows(rhs, gi, gi + 1, rhs2, 1);
    Tensor out2(out_t, {M2, N}), dl2(out_t, {M2, Kc}), dr2(DType::f32, {1, Kc, N});
    gmm(lhs2, rhs2, g2, 0, out2);
    gmm_dlhs(dout2, rhs2, g2, 0, dl2);
    gmm_drhs(lhs2, dout2, g2, 1, dr2);
    EXPECT_TRUE(rows_bit_equal(out, b, out2, before, n)) << "gmm group " << gi;
    EXPECT_TRUE(rows_bit_equal(dl, b, dl2, before, n)) << "gmm_dlhs group " << gi;
    EXPECT_TRUE(rows_bit_equal(dr, gi, dr2, 0, 1)) << "gmm_drhs group " << gi;
  }
}

TEST_P(GroupedGemm, RowIndependenceIsExact) {
  check_row_independence(DType::bf16, DType::bf16, 67, 130);
  check_row_independence(DType::bf16, DType::f32, 33, 17);
  check_row_independence(DType::f32, DType::f32, 40, 70);
  // A reduction of several slices and a tail step, columns in two blocks with a short last panel
  // (amx_bf16's schedule: kernels/x86/kernels_amx_bf16.cpp).
  check_row_independence(DType::bf16, DType::bf16, 1000, 300);
}

// A group's rows in one call, and the same rows as groups of at most 16 rows (the same weights for
// each), must come out with the same bits, with a reduction of 8,200 (257 tile steps) and output
// columns in two blocks. At amx_bf16 this compares its two copies of A: 34 rows (two row blocks)
// over this reduction do not fit the copy kept for a task's other column blocks, so each slice is
// copied before its tiles; a group of 16 rows does fit, so its copy covers the whole reduction and
// is read again by the second column block (kernels/x86/kernels_amx_bf16.cpp).
void check_split_rows_long_reduction(DType in, DType out_t) {
  const int64_t R = 34, Kc = 8200, N = 260;
  const std::vector<int64_t> pieces = {16, 16, 2};
  Tensor lhs = random_tensor(in, {R, Kc}, 41), rhs = random_tensor(in, {1, Kc, N}, 42);
  Tensor rhs_t = random_tensor(in, {1, N, Kc}, 44);
  Tensor rhs3(in, {3, Kc, N}), rhs3_t(in, {3, N, Kc});
  for (int64_t e = 0; e < 3; ++e) copy_rows(rhs, 0, 1, rhs3, e), copy_rows(rhs_t, 0, 1, rhs3_t, e);
  Tensor out(out_t, {R, N}), out3(out_t, {R, N}), dl(out_t, {R, N}), dl3(out_t, {R, N});
  gmm(lhs, rhs, GroupLayout::from_sizes({R}), 0, out);
  gmm(lhs, rhs3, GroupLayout::from_sizes(pieces), 0, out3);
  Tensor lhs_n = random_tensor(in, {R, Kc}, 45);  // dout of dlhs: [R, Kc] against rhs_t [1, N, Kc]
  gmm_dlhs(lhs_n, rhs_t, GroupLayout::from_sizes({R}), 0, dl);
  gmm_dlhs(lhs_n, rhs3_t, GroupLayout::from_sizes(pieces), 0, dl3);
  EXPECT_TRUE(rows_bit_equal(out, 0, out3, 0, R)) << "gmm: one group of 34 rows against groups of 16, 16, 2";
  EXPECT_TRUE(rows_bit_equal(dl, 0, dl3, 0, R))
      << "gmm_dlhs: one group of 34 rows against groups of 16, 16, 2";
}

TEST_P(GroupedGemm, RowsSplitIntoGroupsKeepTheirBitsOverALongReduction) {
  check_split_rows_long_reduction(DType::bf16, DType::bf16);
  check_split_rows_long_reduction(DType::bf16, DType::f32);
}

// Large groups: gmm / gmm_dlhs split a group's rows over several tasks, and
// gmm_drhs runs a large group's reduction in blocks of rows that continue the
// previous block's f32 sums (simd/gemm_impl.h). Neither may change bits:
// rows computed in a small call, and a group's drhs computed on the one-task
// schedule (many small groups), must equal the large call's exactly. 4501
// rows: several row tasks and drhs blocks, and an odd last row (a half word).
void check_large_group(DType in, int64_t Kc, int64_t N) {
  const int64_t big = 4501;
  Tensor lhs = random_tensor(in, {big, Kc}, 21), dout = random_tensor(in, {big, N}, 22);
  Tensor rhs = random_tensor(in, {1, Kc, N}, 23);
  GroupLayout one = GroupLayout::from_sizes({big});
  Tensor out(in, {big, N}), dl(in, {big, Kc}), dr(DType::f32, {1, Kc, N});
  gmm(lhs, rhs, one, 0, out);
  gmm_dlhs(dout, rhs, one, 0, dl);
  gmm_drhs(lhs, dout, one, 0, dr);
  for (auto [b, n] : {std::pair<int64_t, int64_t>{0, 7}, {250, 9}, {1000, 101}}) {
    Tensor lhs2(in, {n, Kc}), dout2(in, {n, N}), out2(in, {n, N}), dl2(in, {n, Kc});
    copy_rows(lhs, b, b + n, lhs2, 0);
    copy_rows(dout, b, b + n, dout2, 0);
    GroupLayout small = GroupLayout::from_sizes({n});
    gmm(lhs2, rhs, small, 0, out2);
    gmm_dlhs(dout2, rhs, small, 0, dl2);
    EXPECT_TRUE(rows_bit_equal(out, b, out2, 0, n)) << "gmm rows " << b << "+" << n;
    EXPECT_TRUE(rows_bit_equal(dl, b, dl2, 0, n)) << "gmm_dlhs rows " << b << "+" << n;
  }
  // The same group as group 3 of 9 (the other 8 empty): the one-task-per-group schedule.
  std::vector<int64_t> sizes(9, 0);
  sizes[3] = big;
  Tensor dr9(DType::f32, {9, Kc, N});
  gmm_drhs(lhs, dout, GroupLayout::from_sizes(sizes), 0, dr9);
  EXPECT_TRUE(rows_bit_equal(dr, 0, dr9, 3, 1)) << "gmm_drhs blocked vs one pass";
  // And against the reference, within the rounding bound of the file header.
  Tensor ref(DType::f32, {1, Kc, N});
  reference::gmm_drhs(lhs, dout, one, 0, ref);
  std::vector<double> S(size_t(Kc * N), 0.0);
  for (int64_t r = 0; r < big; ++r)
    for (int64_t k = 0; k < Kc; ++k)
      for (int64_t n = 0; n < N; ++n) S[size_t(k * N + n)] += std::fabs(double(lhs.get_f32(r * Kc + k)) * dout.get_f32(r * N + n));
  expect_close(dr, ref, S, big, "gmm_drhs (large group)");
}

TEST_P(GroupedGemm, LargeGroupsSplitWithoutChangingBits) {
  check_large_group(DType::bf16, 33, 40);
  check_large_group(DType::f32, 33, 40);
}

// The weight-slab schedules of simd/gemm_impl.h walk the reduction in blocks
// with the f32 partial sums kept between them, in blocks of columns, a group
// in blocks of rows: few rows per group (an average of at most 96) with a
// panel larger than a task's packing budget (a reduction beyond 2048 elements
// at avx512, 8192 at neon_bf16), and any rows per group with a long reduction
// (a panel beyond 512 KiB) on a tile of at most 6 rows (avx2's f32 tile, also
// its bf16 after widening; avx512_bf16's bf16 tile; neon's).
// Their bits must be those of the panel schedule (the whole reduction packed
// per task), which ScopedPanelSchedule forces. Groups of 130 and 7 rows next
// to a 270-row group (the long-reduction slabs, that group in two row
// blocks; 130 rows in one), and the same two groups next to a 3-row group
// (the few-rows slabs, 130 rows in two blocks), must match the panel
// schedule exactly. The reduction is odd (a half word at the end) and the
// outputs span several column blocks. (Under qemu this test is a large share
// of the arm64 suite: keep its rows few.)
void check_slab_schedule(DType in, DType out_t, int64_t Kc, int64_t N) {
  SCOPED_TRACE(::testing::Message() << "Kc " << Kc << " N " << N);
  const int64_t small = 130 + 7, M = small + 270;
  Tensor lhs = random_tensor(in, {M, Kc}, 31), dout = random_tensor(in, {M, N}, 32);
  Tensor rhs = random_tensor(in, {3, Kc, N}, 33);
  GroupLayout big = GroupLayout::from_sizes({130, 7, 270});
  Tensor out(out_t, {M, N}), dl(out_t, {M, Kc});
  {  // the panel schedule, forced
    detail::ScopedPanelSchedule panel_only;
    gmm(lhs, rhs, big, 0, out);
    gmm_dlhs(dout, rhs, big, 0, dl);
  }
  // The same call in its own schedule (long-reduction slabs where the reduction is long).
  Tensor out2(out_t, {M, N}), dl2(out_t, {M, Kc});
  gmm(lhs, rhs, big, 0, out2);
  gmm_dlhs(dout, rhs, big, 0, dl2);
  EXPECT_TRUE(rows_bit_equal(out, 0, out2, 0, M)) << "gmm, next to a 270-row group";
  EXPECT_TRUE(rows_bit_equal(dl, 0, dl2, 0, M)) << "gmm_dlhs, next to a 270-row group";
  // Few-rows slabs: the same two groups next to a 3-row group.
  GroupLayout few = GroupLayout::from_sizes({130, 7, 3});
  Tensor out3(out_t, {small + 3, N}), dl3(out_t, {small + 3, Kc});
  Tensor lhs3(in, {small + 3, Kc}), dout3(in, {small + 3, N});
  copy_rows(lhs, 0, small + 3, lhs3, 0);
  copy_rows(dout, 0, small + 3, dout3, 0);
  gmm(lhs3, rhs, few, 0, out3);
  gmm_dlhs(dout3, rhs, few, 0, dl3);
  EXPECT_TRUE(rows_bit_equal(out, 0, out3, 0, small)) << "gmm, next to a 3-row group";
  EXPECT_TRUE(rows_bit_equal(dl, 0, dl3, 0, small)) << "gmm_dlhs, next to a 3-row group";
}

TEST_P(GroupedGemm, SlabScheduleKeepsThePanelBits) {
  // A long Kc for gmm's slabs, then a long N for gmm_dlhs's.
  for (auto [Kc, N] : {std::pair<int64_t, int64_t>{8195, 130}, {130, 8195}}) {
    check_slab_schedule(DType::bf16, DType::bf16, Kc, N);
    check_slab_schedule(DType::bf16, DType::f32, Kc, N);
    check_slab_schedule(DType::f32, DType::f32, Kc, N);
  }
}

// gmm_drhs over few large groups packs into buffers of the call (`Words` in
// simd/gemm_impl.h) taken from the engine's allocator: every call after the
// first takes them from the cache with their pages resident (no fresh bytes,
// no page faults) and gives them back at its end. One group of 3,000 rows:
// the schedule of few large groups, two row blocks, a dout packing buffer of
// 1.5 MB (avx512_bf16) to 3 MB (avx2), above the allocator's large size.
TEST_P(GroupedGemm, LargeGroupGradientReusesItsScratch) {
  if (alloc::stats().cap_bytes == 0) GTEST_SKIP() << "the allocator's large-block cache is off (MOE_ALLOC_CACHE_MIB=0)";
  const int64_t rows = 3000, Kc = 256, N = 512;
  Tensor lhs = random_tensor(DType::bf16, {rows, Kc}, 41), dout = random_tensor(DType::bf16, {rows, N}, 42);
  GroupLayout g = GroupLayout::from_sizes({rows});
  Tensor dr(DType::f32, {1, Kc, N}), first(DType::f32, {1, Kc, N});
  gmm_drhs(lhs, dout, g, 0, first);
  const alloc::Stats a0 = alloc::stats();
  for (int i = 0; i < 3; ++i) gmm_drhs(lhs, dout, g, 0, dr);
  const alloc::Stats a1 = alloc::stats();
  EXPECT_EQ(a1.fresh_bytes, a0.fresh_bytes) << "a call's packing buffer was faulted in again";
  EXPECT_GE(a1.hits - a0.hits, 3u) << "each call takes its packing buffer from the cache";
  EXPECT_EQ(a1.live_bytes, a0.live_bytes) << "a call keeps its packing buffer";
  EXPECT_TRUE(rows_bit_equal(dr, 0, first, 0, 1));
}

TEST_P(GroupedGemm, EmptyGroupGradientIsZero) {
  GroupLayout g = GroupLayout::from_sizes({0, 3, 0});
  Tensor lhs = random_tensor(DType::bf16, {3, 5}, 1), dout = random_tensor(DType::bf16, {3, 7}, 2);
  Tensor dr = random_tensor(DType::f32, {3, 5, 7}, 3);  // garbage must be overwritten
  gmm_drhs(lhs, dout, g, 0, dr);
  for (int64_t i = 0; i < 35; ++i) EXPECT_EQ(dr.get_f32(i), 0.0f);
  for (int64_t i = 70; i < 105; ++i) EXPECT_EQ(dr.get_f32(i), 0.0f);
}

// A's rows at a stride that is a multiple of 4 KiB share one L1 set; where a
// level's tile has more rows than kRowsPerSetLimit (6; the 12-row f32 and
// widening tiles of avx512 and avx512_bf16), gmm and gmm_dlhs read A from a
// copy one line off that stride (copied_gemm in simd/gemm_impl.h). The copy
// holds the same words, so the bits are those of A read in place. Checked
// against a call that reads in place: the same rows and weights with 16 zero
// elements appended to each row of A and 16 zero weight rows (or columns),
// a stride of 4 KiB + 64 bytes. Each chain then runs 16 more steps that add
// exact zeros, so the bits match exactly. At the 12-row levels the copy is
// one large block of the engine's allocator; elsewhere there is none (but
// avx2's widened bf16 A is such a block at any stride).
void check_set_stride_copy(DType in, DType out_t, int64_t len, bool expect_copy) {
  const bool widened = in == DType::bf16 && (active_isa() == Isa::avx2 || active_isa() == Isa::avx512);
  const int64_t pad = 16, M = 300, N = 40;  // M rows: a copy above the allocator's large size
  const GroupLayout g = GroupLayout::from_sizes({130, 0, 170});
  Tensor rhs = random_tensor(in, {3, len, N}, 61), rhs_t = random_tensor(in, {3, N, len}, 62);
  Tensor rhs_p(in, {3, len + pad, N}), rhs_tp(in, {3, N, len + pad});  // zero-filled
  for (int64_t e = 0; e < 3; ++e) {
    for (int64_t k = 0; k < len; ++k)
      for (int64_t n = 0; n < N; ++n)
        Guarded::set(rhs_p, (e * (len + pad) + k) * N + n, rhs.get_f32((e * len + k) * N + n));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < len; ++k)
        Guarded::set(rhs_tp, (e * N + n) * (len + pad) + k, rhs_t.get_f32((e * N + n) * len + k));
  }
  Tensor a = random_tensor(in, {M, len}, 63), a_p(in, {M, len + pad});
  for (int64_t r = 0; r < M; ++r)
    for (int64_t k = 0; k < len; ++k) Guarded::set(a_p, r * (len + pad) + k, a.get_f32(r * len + k));
  Tensor out(out_t, {M, N}), out_p(out_t, {M, N}), dl(out_t, {M, N}), dl_p(out_t, {M, N});
  const uint64_t before = alloc::stats().hits + alloc::stats().partial + alloc::stats().misses;
  gmm(a, rhs, g, 0, out);
  const uint64_t gmm_blocks = alloc::stats().hits + alloc::stats().partial + alloc::stats().misses - before;
  gmm(a_p, rhs_p, g, 0, out_p);
  gmm_dlhs(a, rhs_t, g, 0, dl);  // dout [M, len] against rhs [3, N, len] read transposed
  gmm_dlhs(a_p, rhs_tp, g, 0, dl_p);
  EXPECT_TRUE(rows_bit_equal(out, 0, out_p, 0, M)) << "gmm: A copied off the set stride against A in place";
  EXPECT_TRUE(rows_bit_equal(dl, 0, dl_p, 0, M)) << "gmm_dlhs: A copied off the set stride against A in place";
  if (alloc::stats().cap_bytes > 0)  // large blocks counted
    EXPECT_EQ(gmm_blocks, expect_copy || widened ? 1u : 0u) << "large blocks gmm took at a stride of "
                                                  << len * int64_t(dtype_size(in)) << " bytes";
}

TEST_P(GroupedGemm, ACopyOffTheSetStrideKeepsTheBits) {
  const Isa isa = GetParam();
  const bool twelve_rows =
      isa == Isa::avx512 || isa == Isa::avx512_bf16 || isa == Isa::amx_bf16;  // their f32 tiles
  check_set_stride_copy(DType::f32, DType::f32, 1024, twelve_rows);   // 4 KiB rows
  check_set_stride_copy(DType::f32, DType::f32, 2048, twelve_rows);   // 8 KiB rows
  check_set_stride_copy(DType::f32, DType::f32, 1040, false);         // 4 KiB + 64: in place everywhere
  // bf16: avx2 and avx512 widen ahead (one copy either way); avx512_bf16's dot-product tile has 6 rows.
  check_set_stride_copy(DType::bf16, DType::bf16, 2048, false);
  check_set_stride_copy(DType::bf16, DType::f32, 2051, false);  // odd: a half word, no copy
}

// gmm_pair(lhs, rhs0, rhs1) is bit for bit gmm(lhs, rhs0) and gmm(lhs, rhs1) side by side, in its
// one-GEMM form (N0 a whole number of the tile's panels: 16, 32 or 64 columns at these levels, so
// N0 = 64 and 128 take it) and in its fallback of two GEMMs into column windows (N0 = 17, 40),
// with the rows outside the local groups and the bytes around the output untouched. The cases:
// the shared ones (odd reductions, empty groups, group offsets, extra rows), plus few rows per
// group with a long reduction (the weight slabs), and rows of 4 KiB (a copy of A off the L1 sets'
// stride at the 12-row tiles).
void check_pair(DType in, DType out_t, const Case& c, int64_t N0, int64_t N1) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N0 " << N0 << " N1 " << N1 << " in "
                                    << dtype_name(in) << " out " << dtype_name(out_t));
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g), pad = 5;
  Tensor lhs = random_tensor(in, {M, c.Kc}, 71);
  Tensor rhs0 = random_tensor(in, {c.n_local, c.Kc, N0}, 72),
         rhs1 = random_tensor(in, {c.n_local, c.Kc, N1}, 73);
  Guarded pair(out_t, M, N0 + N1, pad);
  gmm_pair(lhs, rhs0, rhs1, g, c.goff, pair.view);
  Tensor o0(out_t, {M, N0}), o1(out_t, {M, N1});
  gmm(lhs, rhs0, g, c.goff, o0);
  gmm(lhs, rhs1, g, c.goff, o1);
  const auto [a, b] = local_rows(c, g);
  const size_t es = dtype_size(out_t);
  const auto* p = static_cast<const std::byte*>(pair.view.raw());
  for (int64_t r = a; r < b; ++r) {
    const bool same =
        std::memcmp(p + size_t(r * (N0 + N1)) * es,
                    static_cast<const std::byte*>(o0.raw()) + size_t(r * N0) * es, size_t(N0) * es) == 0 &&
        std::memcmp(p + size_t(r * (N0 + N1) + N0) * es,
                    static_cast<const std::byte*>(o1.raw()) + size_t(r * N1) * es, size_t(N1) * es) == 0;
    if (!same) {
      ADD_FAILURE() << "gmm_pair row " << r << " differs from the two gmm calls";
      break;
    }
  }
  expect_rows_untouched(pair.view, c, g, "gmm_pair");
  EXPECT_TRUE(pair.guards_intact()) << "gmm_pair wrote outside its output";
}

std::vector<Case> pair_cases() {
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 2100, 0, 0, 3, 1});  // few rows per group, a long reduction: the slabs
  all.push_back({{70, 0, 90}, 2048, 0, 1, 2, 0});  // 4 KiB bf16 / 8 KiB f32 rows, a group offset
  return all;
}

TEST_P(GroupedGemm, PairIsTwoGemmsBitForBit) {
  for (const Case& c : pair_cases())
    for (auto [N0, N1] : {std::pair<int64_t, int64_t>{64, 64}, {128, 40}, {17, 33}, {40, 64}}) {
      check_pair(DType::bf16, DType::bf16, c, N0, N1);
      check_pair(DType::bf16, DType::f32, c, N0, N1);
      check_pair(DType::f32, DType::f32, c, N0, N1);
    }
}

// A bf16 lhs with f32 weights (gmm) or an f32 dout (gmm_drhs), the router's GEMMs on the layer's bf16 x:
// bit for bit the f32 op on the lhs widened (what the router ran before, on x.to(f32)), with the rows
// outside the local groups and the bytes around the output untouched. The shared cases (odd
// reductions: the last word widened half; empty groups; group offsets), few rows per group with a
// long reduction (the weight slabs), rows of 4 KiB bf16 (copied off the L1 sets' stride at the
// 12-row tiles) and the router's shape (one group of many rows, E columns).
void check_mixed(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " groups " << c.sizes.size());
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g), pad = 3;
  Tensor lhs = random_tensor(DType::bf16, {M, c.Kc}, 91),
         rhs = random_tensor(DType::f32, {c.n_local, c.Kc, c.N}, 92);
  Tensor dout = random_tensor(DType::f32, {M, c.N}, 93);
  const Tensor wide = lhs.to(DType::f32);
  Guarded mixed(DType::f32, M, c.N, pad);
  gmm(lhs, rhs, g, c.goff, mixed.view);
  Tensor f32(DType::f32, {M, c.N});
  gmm(wide, rhs, g, c.goff, f32);
  const auto [a, b] = local_rows(c, g);
  EXPECT_EQ(
      std::memcmp(mixed.view.data<float>() + a * c.N, f32.data<float>() + a * c.N, size_t((b - a) * c.N) * 4),
      0)
      << "gmm of a bf16 lhs with f32 weights differs from the f32 gmm of the lhs widened";
  expect_rows_untouched(mixed.view, c, g, "gmm (bf16 lhs, f32 weights)");
  EXPECT_TRUE(mixed.guards_intact()) << "gmm (bf16 lhs, f32 weights) wrote outside its output";
  Guarded dmixed(DType::f32, c.n_local * c.Kc, c.N, pad);
  Tensor dview = dmixed.view.reshaped({c.n_local, c.Kc, c.N});
  Tensor d32(DType::f32, {c.n_local, c.Kc, c.N});
  gmm_drhs(lhs, dout, g, c.goff, dview);
  gmm_drhs(wide, dout, g, c.goff, d32);
  EXPECT_EQ(std::memcmp(dview.raw(), d32.raw(), d32.nbytes()), 0)
      << "gmm_drhs of a bf16 lhs with an f32 dout differs from the f32 gmm_drhs of the lhs widened";
  EXPECT_TRUE(dmixed.guards_intact()) << "gmm_drhs (bf16 lhs, f32 dout) wrote outside its output";
}

std::vector<Case> mixed_cases() {
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 2100, 24, 0, 3, 1});  // few rows per group, a long reduction: the slabs
  all.push_back({{70, 0, 90}, 2048, 40, 1, 2, 0});  // rows of 4 KiB bf16, a group offset
  all.push_back({{1000}, 1024, 32, 0, 1, 0});       // the router: one group, D 1,024, E 32
  all.push_back({{515}, 2051, 8, 0, 1, 2});         // one group, an odd D, E 8
  return all;
}

TEST_P(GroupedGemm, Bf16LhsWithF32OperandIsTheF32OpOnTheWidenedLhs) {
  for (const Case& c : mixed_cases()) check_mixed(c);
}

TEST(GroupedGemmReference, Bf16LhsWithF32OperandIsTheF32OpOnTheWidenedLhs) {
  ScopedIsa scoped(Isa::reference);
  for (const Case& c : cases()) check_mixed(c);
}

// The dtypes a mixed call may take: a bf16 lhs with f32 weights or dout, an f32 output, and only in
// gmm and gmm_drhs (the pair, dlhs and accumulating ops take one input dtype).
TEST(GroupedGemmChecks, MixedInputsOnlyWhereTheyAreTaken) {
  const GroupLayout g = GroupLayout::from_sizes({4, 4});
  Tensor xb(DType::bf16, {8, 12}), xf(DType::f32, {8, 12}), wf(DType::f32, {2, 12, 16}),
      wb(DType::bf16, {2, 12, 16});
  Tensor df(DType::f32, {8, 16}), outb(DType::bf16, {8, 16}), grad(DType::f32, {2, 12, 16});
  try {
    gmm(xb, wf, g, 0, outb);
    ADD_FAILURE() << "a bf16 output of a bf16 lhs with f32 weights was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[gmm] output dtype must be f32"), std::string::npos) << e.what();
  }
  try {
    Tensor outf(DType::f32, {8, 16});
    gmm(xf, wb, g, 0, outf);
    ADD_FAILURE() << "an f32 lhs with bf16 weights was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("got f32 and bf16 (a bf16 lhs with f32 is also taken)"),
              std::string::npos)
        << e.what();
  }
  Tensor pair_out(DType::f32, {8, 32});
  EXPECT_THROW(gmm_pair(xb, wf, wf, g, 0, pair_out), Error);
  EXPECT_THROW(gmm_drhs_acc(xb, df, g, 0, grad), Error);
  Tensor g1(DType::f32, {2, 12, 16});
  EXPECT_THROW(gmm_drhs_pair(xb, df, df, g, 0, grad, g1, false), Error);
}

// gmm_dlhs_add(dout, rhs, addend) is bit for bit gmm_dlhs into f32, added to the addend in f32 and
// rounded to the output's dtype (the separate layout's p0 + p1), on the shared cases plus a long
// reduction over few rows per group (the weight slabs, whose last reduction block adds) and rows
// of 4 KiB (A copied off the L1 sets' stride at the 12-row tiles).
void check_dlhs_add(DType in, DType out_t, const Case& c) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " in " << dtype_name(in) << " out "
                                    << dtype_name(out_t));
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g);
  Tensor dout = random_tensor(in, {M, c.N}, 81), rhs = random_tensor(in, {c.n_local, c.Kc, c.N}, 82);
  Tensor addend = random_tensor(DType::f32, {M, c.Kc}, 83);
  Guarded fused(out_t, M, c.Kc, 3);
  gmm_dlhs_add(dout, rhs, g, c.goff, addend, fused.view);
  Tensor part(DType::f32, {M, c.Kc});
  gmm_dlhs(dout, rhs, g, c.goff, part);
  const auto [a, b] = local_rows(c, g);
  for (int64_t i = a * c.Kc; i < b * c.Kc; ++i) {
    const float sum = addend.data<float>()[i] + part.data<float>()[i];
    const bool same = out_t == DType::bf16 ? fused.view.data<bf16>()[i].bits == to_bf16(sum).bits
                                           : std::memcmp(&fused.view.data<float>()[i], &sum, 4) == 0;
    if (!same) {
      ADD_FAILURE() << "gmm_dlhs_add element " << i << " differs from gmm_dlhs + the addend, rounded";
      break;
    }
  }
  expect_rows_untouched(fused.view, c, g, "gmm_dlhs_add");
  EXPECT_TRUE(fused.guards_intact()) << "gmm_dlhs_add wrote outside its output";
}

TEST_P(GroupedGemm, DlhsAddIsDlhsThenAddBitForBit) {
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 40, 2100, 0, 3, 1});  // few rows per group, a long reduction: the slabs
  all.push_back({{70, 0, 90}, 24, 2048, 1, 2, 0});  // dout rows of 4 KiB bf16 / 8 KiB f32, a group offset
  for (const Case& c : all) {
    check_dlhs_add(DType::bf16, DType::bf16, c);
    check_dlhs_add(DType::bf16, DType::f32, c);
    check_dlhs_add(DType::f32, DType::f32, c);
  }
}

TEST(GroupedGemmReference, DlhsAddIsDlhsThenAddBitForBit) {
  ScopedIsa scoped(Isa::reference);
  for (const Case& c : cases()) {
    check_dlhs_add(DType::bf16, DType::bf16, c);
    check_dlhs_add(DType::f32, DType::f32, c);
  }
}

// gmm_drhs_acc: acc + gmm_drhs's gradient, one f32 addition per element, bit for bit (acc holds
// -0, +-inf and NaN-free random values; an empty group adds +0, so -0 becomes +0).
void check_drhs_acc(DType in, const Case& c) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " in " << dtype_name(in));
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g);
  Tensor lhs = random_tensor(in, {M, c.Kc}, 91), dout = random_tensor(in, {M, c.N}, 92);
  Tensor acc = random_tensor(DType::f32, {c.n_local, c.Kc, c.N}, 93);
  float* a = acc.data<float>();
  for (int64_t i = 0; i < acc.numel(); i += 7) a[i] = -0.0f;
  if (acc.numel() > 3) a[3] = INFINITY, a[acc.numel() - 1] = -INFINITY;
  Tensor before = acc.clone(), part(DType::f32, acc.shape());
  gmm_drhs(lhs, dout, g, c.goff, part);
  gmm_drhs_acc(lhs, dout, g, c.goff, acc);
  for (int64_t i = 0; i < acc.numel(); ++i) {
    const float sum = before.data<float>()[i] + part.data<float>()[i];
    if (std::memcmp(&acc.data<float>()[i], &sum, 4) != 0) {
      ADD_FAILURE() << "gmm_drhs_acc element " << i << " is " << acc.data<float>()[i]
                    << ", gmm_drhs + acc is " << sum;
      break;
    }
  }
}

TEST_P(GroupedGemm, DrhsAccIsDrhsThenAddBitForBit) {
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 40, 2100, 0, 3, 1});  // few rows per group, long rows of dout
  all.push_back({{70, 0, 90}, 24, 2048, 1, 2, 0});  // a group offset, an empty local group
  all.push_back({{2, 4500, 0}, 9, 40, 0, 3, 0});    // a group of several row blocks (a scratch)
  for (const Case& c : all) {
    check_drhs_acc(DType::bf16, c);
    check_drhs_acc(DType::f32, c);
  }
}

// gmm_drhs_pair: the two gmm_drhs (accumulating: gmm_drhs_acc) calls, bit for bit.
void check_drhs_pair(DType in, const Case& c, bool accumulate) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " in " << dtype_name(in) << " acc "
                                    << accumulate);
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g), N1 = c.N + 7;
  Tensor lhs = random_tensor(in, {M, c.Kc}, 94), d0 = random_tensor(in, {M, c.N}, 95),
         d1 = random_tensor(in, {M, N1}, 96);
  Tensor o0 = random_tensor(DType::f32, {c.n_local, c.Kc, c.N}, 97),
         o1 = random_tensor(DType::f32, {c.n_local, c.Kc, N1}, 98);
  Tensor e0 = o0.clone(), e1 = o1.clone();
  gmm_drhs_pair(lhs, d0, d1, g, c.goff, o0, o1, accumulate);
  if (accumulate) {
    gmm_drhs_acc(lhs, d0, g, c.goff, e0);
    gmm_drhs_acc(lhs, d1, g, c.goff, e1);
  } else {
    gmm_drhs(lhs, d0, g, c.goff, e0);
    gmm_drhs(lhs, d1, g, c.goff, e1);
  }
  EXPECT_EQ(std::memcmp(o0.raw(), e0.raw(), o0.nbytes()), 0) << "out0";
  EXPECT_EQ(std::memcmp(o1.raw(), e1.raw(), o1.nbytes()), 0) << "out1";
}

TEST_P(GroupedGemm, DrhsPairIsTwoDrhsBitForBit) {
  std::vector<Case> all = cases();
  // dout0's columns a whole number of 32-column panels (amx_bf16 runs both in one pass then): with
  // empty groups and a group offset, and with 288 + 295 columns (a task on both sides).
  all.push_back({{0, 5, 0, 65, 0}, 33, 64, 1, 3, 2});
  all.push_back({{3, 130, 2}, 40, 288, 0, 3, 1});
  for (const Case& c : all)
    for (bool acc : {false, true}) {
      check_drhs_pair(DType::bf16, c, acc);
      check_drhs_pair(DType::f32, c, acc);
    }
}

// The weight gradient's lhs^T transposed by the tasks as they copy A (amx_bf16, groups of up to
// 1,024 rows) or written out whole first (ScopedLhsTCopy: what larger groups take): the same bits,
// for gmm_drhs, gmm_drhs_acc and gmm_drhs_pair. (The hook changes nothing at the other levels.)
void check_lhs_t_by_task(DType in, const Case& c) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " in " << dtype_name(in));
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g);
  Tensor lhs = random_tensor(in, {M, c.Kc}, 81), d0 = random_tensor(in, {M, c.N}, 82),
         d1 = random_tensor(in, {M, c.N}, 83);
  const Shape shape = {c.n_local, c.Kc, c.N};
  auto run = [&](std::vector<Tensor>& out) {
    out = {Tensor(DType::f32, shape), Tensor(DType::f32, shape), Tensor(DType::f32, shape),
           random_tensor(DType::f32, shape, 84)};
    gmm_drhs(lhs, d0, g, c.goff, out[0]);
    gmm_drhs_pair(lhs, d0, d1, g, c.goff, out[1], out[2], false);
    gmm_drhs_acc(lhs, d1, g, c.goff, out[3]);
  };
  std::vector<Tensor> by_task, copied;
  run(by_task);
  {
    detail::ScopedLhsTCopy copy_first;
    run(copied);
  }
  const char* what[] = {"gmm_drhs", "gmm_drhs_pair out0", "gmm_drhs_pair out1", "gmm_drhs_acc"};
  for (size_t i = 0; i < by_task.size(); ++i)
    EXPECT_EQ(std::memcmp(by_task[i].raw(), copied[i].raw(), by_task[i].nbytes()), 0) << what[i];
}

TEST_P(GroupedGemm, DrhsLhsTransposedByTasksOrCopiedFirstKeepsTheBits) {
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 40, 300, 0, 3, 1});  // a reduction of several slices, a short last step
  all.push_back({{70, 0, 90}, 24, 64, 1, 2, 0});   // a group offset, an empty local group
  all.push_back({{37, 300}, 530, 40, 0, 2, 0});    // lhs^T rows in several tasks, a short last block
  all.push_back({{5, 1030}, 520, 20, 0, 2, 0});    // a group too large for the tasks' copy
  for (const Case& c : all) check_lhs_t_by_task(DType::bf16, c);
}

// A gathered lhs (Lhs(src, index): row r = src[index[r]], the fused permute's gather) gives every op
// the bits of the same rows materialized: amx_bf16 reads the rows through the index as it copies A
// (and as its weight gradient transposes lhs, by the tasks or written out first); the other levels
// materialize them for the call. The outputs start from the same canary, so rows of other groups
// must stay untouched alike.
void check_gathered(DType in, const Case& c, bool lhs_t_copied) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " in " << dtype_name(in)
                                    << (lhs_t_copied ? " lhs^T copied first" : ""));
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g), S = M / 3 + 2;  // fewer source rows than M: rows repeat
  Tensor src = random_tensor(in, {S, c.Kc}, 91), index = Tensor::empty(DType::i32, {M});
  std::mt19937 rng(92);
  for (int64_t r = 0; r < M; ++r) index.data<int32_t>()[r] = int32_t(rng() % uint32_t(S));
  const Lhs gathered(src, index);
  const Tensor rows = gathered.materialized();
  for (int64_t r = 0; r < M; ++r)
    ASSERT_EQ(std::memcmp(
                  static_cast<const std::byte*>(rows.raw()) + r * c.Kc * dtype_size(in),
                  static_cast<const std::byte*>(src.raw()) + index.data<int32_t>()[r] * c.Kc * dtype_size(in),
                  size_t(c.Kc) * dtype_size(in)),
              0)
        << "materialized row " << r;
  Tensor w0 = random_tensor(in, {c.n_local, c.Kc, c.N}, 93),
         w1 = random_tensor(in, {c.n_local, c.Kc, 32}, 94);
  Tensor d0 = random_tensor(in, {M, c.N}, 95), d1 = random_tensor(in, {M, 32}, 96);
  std::optional<detail::ScopedLhsTCopy> copy_first;
  if (lhs_t_copied) copy_first.emplace();
  auto same = [](const Tensor& a, const Tensor& b, const char* what) {
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << what << ": gathered differs from materialized";
  };
  auto canary = [](DType t, Shape s) {
    Tensor x = Tensor::empty(t, s);
    for (int64_t i = 0; i < x.numel(); ++i) Guarded::set(x, i, kCanary);
    return x;
  };
  for (DType out_t : {in, DType::f32}) {
    Tensor a = canary(out_t, {M, c.N}), b = canary(out_t, {M, c.N});
    gmm(gathered, w0, g, c.goff, a);
    gmm(rows, w0, g, c.goff, b);
    same(a, b, "gmm");
    for (Tensor* w : {&w0, &w1}) {  // N0 = N (any), then 32 (a whole panel: amx_bf16's one pass)
      const int64_t N0 = w->dim(2), N1 = c.N;
      Tensor p = canary(out_t, {M, N0 + N1}), q = canary(out_t, {M, N0 + N1});
      gmm_pair(gathered, *w, w0, g, c.goff, p);
      gmm_pair(rows, *w, w0, g, c.goff, q);
      same(p, q, "gmm_pair");
    }
  }
  const Shape s0 = {c.n_local, c.Kc, c.N}, s1 = {c.n_local, c.Kc, 32};
  Tensor a = canary(DType::f32, s0), b = canary(DType::f32, s0);
  gmm_drhs(gathered, d0, g, c.goff, a);
  gmm_drhs(rows, d0, g, c.goff, b);
  same(a, b, "gmm_drhs");
  Tensor acc_a = random_tensor(DType::f32, s0, 97), acc_b = random_tensor(DType::f32, s0, 97);
  gmm_drhs_acc(gathered, d0, g, c.goff, acc_a);
  gmm_drhs_acc(rows, d0, g, c.goff, acc_b);
  same(acc_a, acc_b, "gmm_drhs_acc");
  for (bool acc : {false, true}) {
    // dout0 with 32 columns first (one pass at amx_bf16), then with N (two calls unless N is 32k).
    for (int order = 0; order < 2; ++order) {
      const Tensor& da = order == 0 ? d1 : d0;
      const Tensor& db = order == 0 ? d0 : d1;
      const Shape sa = order == 0 ? s1 : s0, sb = order == 0 ? s0 : s1;
      Tensor x0 = random_tensor(DType::f32, sa, 98), x1 = random_tensor(DType::f32, sb, 99);
      Tensor y0 = random_tensor(DType::f32, sa, 98), y1 = random_tensor(DType::f32, sb, 99);
      gmm_drhs_pair(gathered, da, db, g, c.goff, x0, x1, acc);
      gmm_drhs_pair(rows, da, db, g, c.goff, y0, y1, acc);
      same(x0, y0, acc ? "gmm_drhs_pair (accumulate) out0" : "gmm_drhs_pair out0");
      same(x1, y1, acc ? "gmm_drhs_pair (accumulate) out1" : "gmm_drhs_pair out1");
    }
  }
}

TEST_P(GroupedGemm, GatheredLhsIsTheMaterializedRowsBitForBit) {
  EXPECT_EQ(gathers_lhs(DType::bf16), GetParam() == Isa::amx_bf16);
  EXPECT_FALSE(gathers_lhs(DType::f32));
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 40, 300, 0, 3, 1});   // a reduction of several slices, a short last step
  all.push_back({{70, 0, 90}, 1024, 64, 1, 2, 0});  // rows of 2 KiB, a group offset, an empty group
  all.push_back({{5, 1030}, 520, 20, 0, 2, 0});     // a group too large for the tasks' copy of lhs^T
  all.push_back({{9}, 70, 40, 0, 1, 0});            // fewer than 16 rows: the zero-padded copy
  for (const Case& c : all)
    for (bool copied : {false, true}) {
      check_gathered(DType::bf16, c, copied);
      if (!copied) check_gathered(DType::f32, c, false);
    }
}

TEST(GroupedGemmChecks, GatheredLhsNamesItsIndex) {
  const GroupLayout g = GroupLayout::from_sizes({4, 4});
  Tensor src(DType::bf16, {5, 16}), w(DType::bf16, {2, 16, 8}), out(DType::bf16, {8, 8});
  Tensor index = Tensor::empty(DType::i32, {8});
  for (int r = 0; r < 8; ++r) index.data<int32_t>()[r] = r % 5;
  gmm(Lhs(src, index), w, g, 0, out);
  index.data<int32_t>()[6] = 5;
  try {
    gmm(Lhs(src, index), w, g, 0, out);
    ADD_FAILURE() << "an index past src's rows was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[gmm] lhs index: row 6 names source row 5, expected 0 <= row < 5"),
              std::string::npos)
        << e.what();
  }
  Tensor i64 = Tensor::empty(DType::i64, {8}), short_index = Tensor::empty(DType::i32, {7});
  for (int r = 0; r < 7; ++r) short_index.data<int32_t>()[r] = 0;
  std::memset(i64.raw(), 0, i64.nbytes());
  EXPECT_THROW(gmm(Lhs(src, i64), w, g, 0, out), Error);
  Tensor dout(DType::bf16, {8, 8}), grad(DType::f32, {2, 16, 8});
  EXPECT_THROW(gmm_drhs(Lhs(src, short_index), dout, g, 0, grad), Error);  // 7 rows against dout's 8
}

// gmm_dlhs_sum: gmm_dlhs into f32, then gmm_dlhs_add, bit for bit (rows of other groups untouched).
void check_dlhs_sum(DType in, DType out_t, const Case& c) {
  SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " in " << dtype_name(in) << " out "
                                    << dtype_name(out_t));
  const GroupLayout g = GroupLayout::from_sizes(c.sizes);
  const int64_t M = rows_of(c, g);
  Tensor d0 = random_tensor(in, {M, c.N}, 101), d1 = random_tensor(in, {M, c.N}, 102);
  Tensor w0 = random_tensor(in, {c.n_local, c.Kc, c.N}, 103),
         w1 = random_tensor(in, {c.n_local, c.Kc, c.N}, 104);
  Guarded fused(out_t, M, c.Kc, 3);
  gmm_dlhs_sum(d0, w0, d1, w1, g, c.goff, fused.view);
  Tensor p0(DType::f32, {M, c.Kc}), two(out_t, {M, c.Kc});
  gmm_dlhs(d0, w0, g, c.goff, p0);
  gmm_dlhs_add(d1, w1, g, c.goff, p0, two);
  const auto [a, b] = local_rows(c, g);
  const size_t eb = dtype_size(out_t);
  EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(fused.view.raw()) + size_t(a * c.Kc) * eb,
                        static_cast<const std::byte*>(two.raw()) + size_t(a * c.Kc) * eb,
                        size_t((b - a) * c.Kc) * eb),
            0)
      << "gmm_dlhs_sum differs from gmm_dlhs + gmm_dlhs_add";
  expect_rows_untouched(fused.view, c, g, "gmm_dlhs_sum");
  EXPECT_TRUE(fused.guards_intact()) << "gmm_dlhs_sum wrote outside its output";
}

TEST_P(GroupedGemm, DlhsSumIsDlhsThenDlhsAddBitForBit) {
  std::vector<Case> all = cases();
  all.push_back({{3, 130, 2}, 40, 2100, 0, 3, 1});  // few rows per group, a long reduction: several slices
  all.push_back({{70, 0, 90}, 24, 600, 1, 2, 0});   // a group offset, an empty local group
  for (const Case& c : all) {
    check_dlhs_sum(DType::bf16, DType::bf16, c);
    check_dlhs_sum(DType::bf16, DType::f32, c);
    check_dlhs_sum(DType::f32, DType::f32, c);
  }
}

TEST(GroupedGemmReference, DrhsAccIsDrhsThenAddBitForBit) {
  ScopedIsa scoped(Isa::reference);
  for (const Case& c : cases()) {
    check_drhs_acc(DType::bf16, c);
    check_drhs_acc(DType::f32, c);
  }
}

TEST(GroupedGemmChecks, DrhsAccNamesItsAccumulator) {
  const GroupLayout g = GroupLayout::from_sizes({4, 4});
  Tensor lhs(DType::bf16, {8, 12}), dout(DType::bf16, {8, 16}), bf_acc(DType::bf16, {2, 12, 16});
  Tensor short_acc(DType::f32, {2, 11, 16});
  try {
    gmm_drhs_acc(lhs, dout, g, 0, bf_acc);
    ADD_FAILURE() << "a bf16 accumulator was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[gmm_drhs] drhs must be f32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gmm_drhs_acc(lhs, dout, g, 0, short_acc), Error);
  Tensor l64(DType::f64, {8, 12}), d64(DType::f64, {8, 16}), a64(DType::f64, {2, 12, 16});
  EXPECT_THROW(gmm_drhs_acc(l64, d64, g, 0, a64), Error);
}

TEST(GroupedGemmChecks, DlhsAddNamesItsAddend) {
  const GroupLayout g = GroupLayout::from_sizes({4, 4});
  Tensor dout(DType::bf16, {8, 16}), w(DType::bf16, {2, 12, 16}), dl(DType::bf16, {8, 12});
  Tensor bf_addend(DType::bf16, {8, 12}), short_addend(DType::f32, {7, 12});
  try {
    gmm_dlhs_add(dout, w, g, 0, bf_addend, dl);
    ADD_FAILURE() << "a bf16 addend was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[gmm_dlhs_add] addend must be f32 for bf16 inputs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(gmm_dlhs_add(dout, w, g, 0, short_addend, dl), Error);
}

// The reference twin's gmm_pair: its own gmm's loops into the two column windows.
TEST(GroupedGemmReference, PairIsTwoGemmsBitForBit) {
  ScopedIsa scoped(Isa::reference);
  for (const Case& c : cases()) {
    check_pair(DType::bf16, DType::bf16, c, 24, 40);
    check_pair(DType::f32, DType::f32, c, 17, 16);
  }
}

TEST(GroupedGemmChecks, PairNamesItsShapes) {
  const GroupLayout g = GroupLayout::from_sizes({4, 4});
  Tensor lhs(DType::bf16, {8, 16}), w0(DType::bf16, {2, 16, 8}), w1(DType::bf16, {2, 12, 8});
  Tensor out(DType::bf16, {8, 16});
  try {
    gmm_pair(lhs, w0, w1, g, 0, out);
    ADD_FAILURE() << "a mismatched rhs1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("[gmm_pair] expected lhs [M, Kc], rhs0 [G, Kc, N0] and rhs1 [G, Kc, N1]"),
        std::string::npos)
        << e.what();
  }
  Tensor w1ok(DType::bf16, {2, 16, 8}), narrow(DType::bf16, {8, 8});
  EXPECT_THROW(gmm_pair(lhs, w0, w1ok, g, 0, narrow), Error);  // out is [M, N0 + N1]
}

// The levels that multiply bf16 as widened f32 with FMA (avx2, avx512) run
// each element's chain in the same order, so they must agree bit for bit,
// whatever their tiles or schedules: both widen A ahead and run their f32 tile
// against widened weights (kWidenAhead, simd/gemm_impl.h), avx2 6 x 2 vectors of
// 8, avx512 12 x 2 of 16 (its widened rows one line off a 4 KiB multiple); until
// 2026-12-07 avx512 widened in the tile (WidenStep, which the router's bf16 x
// against f32 weights still runs at avx512 and above:
// Bf16LhsWithF32OperandIsTheF32OpOnTheWidenedLhs). The cases: the shared ones (odd reductions, group
// offsets, many small groups), plus the weight-slab schedule (few rows per
// group, a long reduction), a group split into row blocks, and a widened A
// larger than one chunk.
TEST(GroupedGemmAcrossLevels, WideningLevelsAgreeBitForBit) {
  for (Isa isa : {Isa::avx2, Isa::avx512})
    if (!isa_supported(isa))
      GTEST_SKIP() << "needs levels avx2 and avx512 (this CPU or build runs " << isa_list(isa_available()) << ")";
  std::vector<Case> all = cases();
  all.push_back({{7, 3, 3}, 8195, 130, 0, 3, 0});  // slabs: a long reduction, few rows per group
  all.push_back({{5, 2}, 130, 8195, 0, 2, 1});     // slabs of gmm_dlhs (a long N)
  all.push_back({{700, 3}, 65, 70, 0, 2, 0});      // a large group in row blocks
  all.push_back({{600, 500, 3}, 8195, 24, 0, 3, 0});  // gmm's widened A in two chunks (kACopyChunkBytes)
  // 4 KiB bf16 rows: avx512 widens them to rows one line off the 4 KiB multiple, gmm's A and gmm_dlhs's
  // dout; the last case's widened copy takes a chunk per group (rows of 8,256 bytes).
  all.push_back({{40, 33, 7}, 2048, 40, 0, 3, 0});
  all.push_back({{40, 33, 7}, 40, 2048, 0, 3, 0});
  all.push_back({{4100, 4100, 3}, 2048, 24, 0, 3, 0});
  for (const Case& c : all)
    for (DType out_t : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(::testing::Message() << "Kc " << c.Kc << " N " << c.N << " out " << dtype_name(out_t));
      GroupLayout g = GroupLayout::from_sizes(c.sizes);
      const int64_t M = rows_of(c, g);
      Tensor lhs = random_tensor(DType::bf16, {M, c.Kc}, 51), dout = random_tensor(DType::bf16, {M, c.N}, 52);
      Tensor rhs = random_tensor(DType::bf16, {c.n_local, c.Kc, c.N}, 53);
      Tensor out[2], dl[2], dr[2];
      for (int l = 0; l < 2; ++l) {
        ScopedIsa scoped(l == 0 ? Isa::avx2 : Isa::avx512);
        out[l] = random_tensor(out_t, {M, c.N}, 54), dl[l] = random_tensor(out_t, {M, c.Kc}, 55);
        dr[l] = Tensor(DType::f32, {c.n_local, c.Kc, c.N});
        gmm(lhs, rhs, g, c.goff, out[l]);
        gmm_dlhs(dout, rhs, g, c.goff, dl[l]);
        gmm_drhs(lhs, dout, g, c.goff, dr[l]);
      }
      EXPECT_TRUE(rows_bit_equal(out[0], 0, out[1], 0, M)) << "gmm";
      EXPECT_TRUE(rows_bit_equal(dl[0], 0, dl[1], 0, M)) << "gmm_dlhs";
      EXPECT_TRUE(rows_bit_equal(dr[0], 0, dr[1], 0, c.n_local)) << "gmm_drhs";
    }
}

}  // namespace
}  // namespace moe
