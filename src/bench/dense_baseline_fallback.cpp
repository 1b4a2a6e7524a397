// Fallback dense baseline (oneDNN or OpenMP not found at build time): the
// matmul as a grouped GEMM with one group, in the layer's own dtype at the
// active kernel level, so it computes exactly as the layer's GEMMs do.
#include "bench/dense_baseline.h"
#include "moe/isa.h"

namespace moe {

// out [M, N] = a [M, K] @ b [K, N]
DenseRate dense_matmul_rate(int64_t M, int64_t K, int64_t N, DType layer_dtype, int iters) {
  DenseRate r;
  r.baseline.impl = "grouped_gemm";
  r.baseline.dtype = layer_dtype;
  const std::string level = isa_name(active_isa());
  r.baseline.why =
      "oneDNN is not compiled in (libdnnl-dev): the layer's own grouped GEMM with one group at "
      "kernel level " +
      level;
  r.gflops = grouped_gemm_dense_gflops(M, K, N, layer_dtype, iters);
  return r;
}

}  // namespace moe
