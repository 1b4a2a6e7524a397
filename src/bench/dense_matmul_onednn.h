// The dense baseline for the grouped GEMM benchmark: oneDNN's matmul of the
// same FLOPs, run interleaved with ours in the same process (so the noise of a
// shared machine hits both sides alike).
#pragma once

#include <cstdint>
#include <memory>

#include "moe/dtype.h"

namespace moe::bench {

// Limits oneDNN (OpenMP runtime in the Debian build) to `threads` threads.
void dense_set_threads(int threads);

// C[M, N] = A[M, K] @ B[K, N], all row-major, f32 accumulation; inputs `in`
// (f32 or bf16), output in the input dtype. B is a plain row-major operand
// (oneDNN packs it per call, as our kernels pack weight panels per call).
class DenseMatmul {
 public:
  DenseMatmul(int64_t M, int64_t K, int64_t N, DType in);
  ~DenseMatmul();
  DenseMatmul(DenseMatmul&&) noexcept;
  void run();  // one call, waits for completion
  double flops() const { return flops_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double flops_;
};

}  // namespace moe::bench
