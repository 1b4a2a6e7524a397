// The dense GEMM baseline of `moe bench` and `moe train`'s summary: the
// throughput a plain dense matmul reaches on this machine, measured in the
// same run as the layer, so `fraction_of_dense` = layer GFLOP/s / dense
// GFLOP/s compares like with like.
//
// The rule (docs/benchmarks.md, "The dense baseline"): the baseline computes
// in the dtype the active kernel level computes in. bf16 only at avx512_bf16,
// amx_bf16 and neon_bf16 (native bf16 dot products); at avx2, avx512, neon and
// reference a bf16 layer widens bf16 to f32, so its baseline is an f32 matmul
// of the same FLOPs.
// When the library has no bf16 matmul here (e.g. ONEDNN_MAX_CPU_ISA=AVX2),
// f32 again, and `why` says so. Never an error.
//
// One implementation of DenseRunner is linked: dense_baseline_onednn.cpp
// (oneDNN's matmul) or dense_baseline_fallback.cpp (moe::gmm with one group,
// when oneDNN is not found); dense_baseline.cpp holds what both share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "moe/dtype.h"
#include "moe/tensor.h"
#include "route/group_layout.h"

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

// out[M, N] = a[M, K] @ b[K, N] for a layer computing in `layer_dtype` (f32
// or bf16): the baseline the rule picks, built once (inputs filled, one
// untimed warm-up run) and then run as often as asked. `moe bench` times one
// run beside each timed layer step, interleaved, so that a slow phase of a
// shared machine slows both sides alike (docs/benchmarks.md, "The dense
// baseline"). Throws moe::Error only when the level cannot be chosen (a bad
// MOE_GEMM_ISA). REQUIRES: M, K, N >= 1.
class DenseRunner {
 public:
  DenseRunner(int64_t M, int64_t K, int64_t N, DType layer_dtype);
  ~DenseRunner();
  DenseRunner(DenseRunner&&) noexcept;
  DenseRunner& operator=(DenseRunner&&) noexcept;

  double run_ms();  // one run, waited for; its wall time in ms
  // Returns once the baseline's worker threads have let go of the cores, so the
  // layer step timed next does not share them: oneDNN's OpenMP workers spin
  // after each run unless OMP_WAIT_POLICY is PASSIVE (libgomp: 300,000 spins
  // when unset, 5-14 ms here), so this sleeps past that spin; with PASSIVE,
  // and for the fallback (the engine's own pool), it returns at once.
  void settle() const;
  // "" when settle() can do its job here, else why the comparison is biased
  // (OMP_WAIT_POLICY=ACTIVE or an infinite GOMP_SPINCOUNT: the workers spin for ever).
  static std::string spin_warning();
  double flops() const { return 2.0 * double(M_) * double(K_) * double(N_); }
  double gflops(double ms) const;  // flops() / ms
  const DenseBaseline& baseline() const { return baseline_; }

 private:
  struct Impl;  // the linked implementation's state
  std::unique_ptr<Impl> impl_;
  DenseBaseline baseline_;
  int64_t M_, K_, N_;
};

struct DenseRate {
  double gflops = 0;  // 2*M*K*N / median seconds / 1e9
  DenseBaseline baseline;
};

// A DenseRunner's rate over `iters` runs (median), for summaries that time the
// baseline on its own (`moe train`). REQUIRES: M, K, N, iters >= 1.
DenseRate dense_matmul_rate(int64_t M, int64_t K, int64_t N, DType layer_dtype, int iters);

// The same FLOPs on moe::gmm with a single group at the active kernel level,
// inputs in `dtype` (the fallback baseline, and the last resort of the oneDNN
// one): operands filled once, run() computes out = a @ b[0].
struct GroupedGemmDense {
  GroupedGemmDense(int64_t M, int64_t K, int64_t N, DType dtype);
  void run();
  Tensor a, b, out;
  GroupLayout one;
};

}  // namespace moe
