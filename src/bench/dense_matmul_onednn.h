// The dense baseline for the grouped GEMM benchmark: oneDNN's matmul of the
// same FLOPs, run interleaved with ours in the same process (so the noise of a
// shared machine hits both sides alike).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bench/dense_baseline.h"
#include "moe/dtype.h"

namespace moe::bench {

// Limits oneDNN (OpenMP runtime in the Debian build) to `threads` threads.
void dense_set_threads(int threads);

// C[M, N] = A[M, K] @ B[K, N], all row-major, f32 accumulation; inputs `in`
// (f32 or bf16), output in the input dtype. B is a plain row-major operand
// (oneDNN packs it per call, as our kernels pack weight panels per call).
class DenseMatmul {
 public:
  // Throws moe::Error (with oneDNN's message) when oneDNN has no matmul for
  // `in` on this CPU, e.g. bf16 under ONEDNN_MAX_CPU_ISA=AVX2.
  DenseMatmul(int64_t M, int64_t K, int64_t N, DType in);
  ~DenseMatmul();
  DenseMatmul(DenseMatmul&&) noexcept;
  void run();  // one call, waits for completion
  double flops() const { return flops_; }
  // oneDNN's name for the implementation it chose ("brg:avx512_core_bf16").
  std::string kernel() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double flops_;
};

// oneDNN's matmul for a layer computing in `layer_dtype`: in the dtype of
// dense_compute_dtype(), or f32 when oneDNN has no bf16 matmul here; `chosen`
// says which and why. Throws moe::Error only when not even f32 can be created.
DenseMatmul dense_matmul_for(int64_t M, int64_t K, int64_t N, DType layer_dtype, DenseBaseline& chosen);

}  // namespace moe::bench
