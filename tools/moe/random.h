// Seeded random tensors for the CLI (example inputs).
#pragma once

#include <cmath>
#include <random>

#include "moe/tensor.h"

namespace moe::cli {

inline Tensor random_normal(Shape shape, uint64_t seed, float std_dev) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    double u1 = (double(rng() >> 11) + 1.0) * 0x1.0p-53, u2 = double(rng() >> 11) * 0x1.0p-53;
    t.data<float>()[i] = std_dev * float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return t;
}

}  // namespace moe::cli
