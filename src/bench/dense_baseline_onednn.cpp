// The dense baseline of `moe bench` on oneDNN's matmul (libdnnl-dev): what a
// tuned dense GEMM library reaches on this machine for the same FLOPs,
// limited to the compute pool's thread count, in the dtype of the rule in
// dense_baseline.h.
#include <algorithm>

#include "bench/dense_baseline.h"
#include "bench/dense_matmul_onednn.h"
#include "bench/timing.h"
#include "moe/error.h"
#include "moe/isa.h"
#include "moe/thread_pool.h"

namespace moe {

// out [M, N] = a [M, K] @ b [K, N]
DenseRate dense_matmul_rate(int64_t M, int64_t K, int64_t N, DType layer_dtype, int iters) {
  MOE_ASSERT(M >= 1 && K >= 1 && N >= 1 && iters >= 1, "dense_matmul_rate: sizes and iters must be >= 1");
  (void)active_isa();  // a bad MOE_GEMM_ISA fails here, not as a "no matmul" below
  bench::dense_set_threads(ThreadPool::compute().size());
  DenseRate r;
  try {
    bench::DenseMatmul mm = bench::dense_matmul_for(M, K, N, layer_dtype, r.baseline);
    bench::Timing t = bench::time_runs(iters, [&] { mm.run(); });
    r.gflops = mm.flops() / std::max(t.median_ms, 1e-6) / 1e6;
  } catch (const Error& e) {  // not even an f32 matmul: the last resort, never an error
    r.baseline = {"grouped_gemm", layer_dtype,
                  std::string(e.what()) + ", so the baseline is moe::gmm with one group", ""};
    r.gflops = grouped_gemm_dense_gflops(M, K, N, layer_dtype, iters);
  }
  return r;
}

}  // namespace moe
