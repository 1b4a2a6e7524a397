// The row primitives of the permute/combine kernels (src/kernels/row_ops.h)
// against naive loops written from their contract, bit for bit, at every
// kernel level this CPU runs (the reference level's portable loops included),
// so every level gives these bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/row_ops.h"
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

}  // namespace
}  // namespace moe
