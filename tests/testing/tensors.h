// Seeded tensors and comparisons for tests.
#pragma once

#include <cstdint>
#include <random>

#include "moe/tensor.h"

namespace moe::testing {

// Uniform [lo, hi) values from a fixed seed, stored in `dtype`.
inline Tensor uniform(Shape shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f, DType dtype = DType::f32) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = lo + (hi - lo) * float(double(rng() >> 11) * 0x1.0p-53);
  return t.to(dtype);
}

// Largest |a - b| over elements (both read as f32).
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, double(std::abs(a.get_f32(i) - b.get_f32(i))));
  return m;
}
inline double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, double(std::abs(a.get_f32(i))));
  return m;
}

}  // namespace moe::testing
