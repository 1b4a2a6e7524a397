// What both dense baselines share (dense_baseline.h): the dtype rule, the
// names, and the one-group grouped GEMM.
#include "bench/dense_baseline.h"

#include <algorithm>

#include "bench/timing.h"
#include "kernels/grouped_gemm.h"
#include "moe/isa.h"

namespace moe {
namespace {
// Small exact values (multiples of 1/16 in [-0.375, 0.375]): no denormals, no overflow.
Tensor pattern(Shape shape, DType dtype, int64_t salt) {
  Tensor t = Tensor::empty(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float((i * 7 + salt) % 13 - 6) / 16.0f;
  return t.to(dtype);
}
}  // namespace

std::string dense_baseline_name(const DenseBaseline& b) {
  const std::string dt = dtype_name(b.dtype);
  if (b.impl == "onednn") return "oneDNN " + dt + " matmul";
  return "grouped GEMM (one group) " + dt;
}

DType dense_compute_dtype(DType layer_dtype, std::string& why) {
  const Isa isa = active_isa();
  if (layer_dtype != DType::bf16) {
    why = std::string(dtype_name(layer_dtype)) + " layer: a matmul in its dtype";
    return layer_dtype;
  }
  if (isa == Isa::avx512_bf16 || isa == Isa::amx_bf16 || isa == Isa::neon_bf16) {
    why = std::string("bf16 layer at kernel level ") + isa_name(isa) + ": native bf16 dot products";
    return DType::bf16;
  }
  why = std::string("bf16 layer at kernel level ") + isa_name(isa) +
        ", which widens bf16 to f32: the baseline is an f32 matmul of the same FLOPs";
  return DType::f32;
}

// out [M, N] = a [M, K] @ b[0] [K, N]
GroupedGemmDense::GroupedGemmDense(int64_t M, int64_t K, int64_t N, DType dtype)
    : a(pattern({M, K}, dtype, 1)),
      b(pattern({1, K, N}, dtype, 2)),
      out(Tensor::empty(dtype, {M, N})),
      one(GroupLayout::from_sizes({M})) {}

void GroupedGemmDense::run() { gmm(a, b, one, 0, out); }

double DenseRunner::gflops(double ms) const { return flops() / std::max(ms, 1e-6) / 1e6; }

DenseRate dense_matmul_rate(int64_t M, int64_t K, int64_t N, DType layer_dtype, int iters) {
  MOE_ASSERT(iters >= 1, "dense_matmul_rate: iters must be >= 1");
  DenseRunner runner(M, K, N, layer_dtype);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(runner.run_ms());
  return {runner.gflops(bench::summarize(std::move(ms)).median_ms), runner.baseline()};
}

}  // namespace moe
