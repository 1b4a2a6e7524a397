// The dense GEMM baseline of `moe bench` and `moe train`'s summary: the
// throughput a plain dense matmul reaches on this machine, measured in the
// same run as the layer, so `fraction_of_dense` = layer GFLOP/s / dense
// GFLOP/s compares like with like.
//
// The rule (docs/benchmarks.md, "The dense baseline"): the baseline computes
// in the dtype the active kernel level computes in. bf16 only at avx512_bf16
// and neon_bf16 (native bf16 dot products); at avx2, avx512, neon and
// reference a bf16 layer widens bf16 to f32, so its baseline is an f32 matmul
// of the same FLOPs.
// When the library has no bf16 matmul here (e.g. ONEDNN_MAX_CPU_ISA=AVX2),
// f32 again, and `why` says so. Never an error.
//
// One implementation of dense_matmul_rate is linked: dense_baseline_onednn.cpp
// (oneDNN's matmul) or dense_baseline_fallback.cpp (moe::gmm with one group,
// when oneDNN is not found); dense_baseline.cpp holds what both share.
#pragma once

#include <cstdint>
#include <string>

#include "moe/dtype.h"

namespace moe {

// Which dense matmul ran, in which dtype, and why that one.
struct DenseBaseline {
  std::string impl;          // "onednn" (oneDNN's matmul) | "grouped_gemm" (moe::gmm, one group)
  DType dtype = DType::f32;  // the matmul's input dtype (f32 accumulation either way)
  std::string why;           // one sentence: why this dtype and implementation
  std::string kernel;        // the library's own implementation name ("brg:avx512_core_bf16"), or ""
};

// "oneDNN f32 matmul", "grouped GEMM (one group) bf16".
std::string dense_baseline_name(const DenseBaseline& b);

// The dtype the baseline of a layer in `layer_dtype` computes in at the active
// kernel level (the rule above); `why` gets the reason. Throws moe::Error only
// when the level cannot be chosen (a bad MOE_GEMM_ISA).
DType dense_compute_dtype(DType layer_dtype, std::string& why);

struct DenseRate {
  double gflops = 0;  // 2*M*K*N / median seconds / 1e9
  DenseBaseline baseline;
};

// out[M, N] = a[M, K] @ b[K, N] for a layer computing in `layer_dtype` (f32
// or bf16): the baseline the rule picks, timed over `iters` runs after one
// warm-up run. REQUIRES: M, K, N, iters >= 1.
DenseRate dense_matmul_rate(int64_t M, int64_t K, int64_t N, DType layer_dtype, int iters);

// The same FLOPs on moe::gmm with a single group at the active kernel level,
// inputs in `dtype` (the fallback baseline, and the last resort of the oneDNN one).
double grouped_gemm_dense_gflops(int64_t M, int64_t K, int64_t N, DType dtype, int iters);

}  // namespace moe
