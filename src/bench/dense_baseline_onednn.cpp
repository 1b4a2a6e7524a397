// The dense baseline of `moe bench` on oneDNN's matmul (libdnnl-dev): what a
// tuned dense GEMM library reaches on this machine for the same FLOPs,
// limited to the compute pool's thread count.
#include <algorithm>

#include "bench/dense_baseline.h"
#include "bench/dense_matmul_onednn.h"
#include "bench/timing.h"
#include "moe/error.h"
#include "moe/thread_pool.h"

namespace moe {

// out [M, N] = a [M, K] @ b [K, N]
double dense_matmul_gflops(int64_t M, int64_t K, int64_t N, DType dtype, int iters) {
  MOE_ASSERT(M >= 1 && K >= 1 && N >= 1 && iters >= 1, "dense_matmul_gflops: sizes and iters must be >= 1");
  bench::dense_set_threads(ThreadPool::compute().size());
  bench::DenseMatmul mm(M, K, N, dtype);
  bench::Timing t = bench::time_runs(iters, [&] { mm.run(); });
  return mm.flops() / std::max(t.median_ms, 1e-6) / 1e6;
}

}  // namespace moe
