// The dense GEMM baseline of `moe bench`: the throughput a plain dense matmul
// reaches on this machine, measured in the same run as the layer, so
// `fraction_of_dense` = layer GFLOP/s / dense GFLOP/s compares like with like.
//
// One implementation is linked: dense_baseline_fallback.cpp (moe::gmm with a
// single group) until the oneDNN version replaces that file; the signature
// is the contract between them.
#pragma once

#include <cstdint>

#include "moe/dtype.h"

namespace moe {

// GFLOP/s (2*M*K*N / median seconds / 1e9) of out[M, N] = a[M, K] @ b[K, N]
// with inputs in `dtype` (f32 or bf16) and f32 accumulation, over `iters`
// timed runs after one warm-up run. REQUIRES: M, K, N, iters >= 1.
double dense_matmul_gflops(int64_t M, int64_t K, int64_t N, DType dtype, int iters);

}  // namespace moe
