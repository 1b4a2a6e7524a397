// Fallback dense baseline: the matmul as a grouped GEMM with one group, so
// the harness runs with whatever moe::gmm is built. Replaced by the oneDNN
// baseline (same signature, its own file) when that lands.
#include <algorithm>

#include "bench/dense_baseline.h"
#include "bench/timing.h"
#include "kernels/grouped_gemm.h"

namespace moe {
namespace {
// Small exact values (multiples of 1/16 in [-0.375, 0.375]): no denormals, no overflow.
Tensor pattern(Shape shape, DType dtype, int64_t salt) {
  Tensor t = Tensor::empty(DType::f32, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float((i * 7 + salt) % 13 - 6) / 16.0f;
  return t.to(dtype);
}
}  // namespace

// out [M, N] = a [M, K] @ b[0] [K, N]
double dense_matmul_gflops(int64_t M, int64_t K, int64_t N, DType dtype, int iters) {
  MOE_ASSERT(M >= 1 && K >= 1 && N >= 1 && iters >= 1, "dense_matmul_gflops: sizes and iters must be >= 1");
  Tensor a = pattern({M, K}, dtype, 1), b = pattern({1, K, N}, dtype, 2);
  Tensor out = Tensor::empty(dtype, {M, N});
  GroupLayout one = GroupLayout::from_sizes({M});
  bench::Timing t = bench::time_runs(iters, [&] { gmm(a, b, one, 0, out); });
  return 2.0 * double(M) * double(K) * double(N) / std::max(t.median_ms, 1e-6) / 1e6;
}

}  // namespace moe
