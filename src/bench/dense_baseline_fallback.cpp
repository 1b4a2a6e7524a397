// Fallback dense baseline (oneDNN or OpenMP not found at build time): the
// matmul as a grouped GEMM with one group, in the layer's own dtype at the
// active kernel level, so it computes exactly as the layer's GEMMs do.
#include "bench/dense_baseline.h"
#include "bench/timing.h"
#include "moe/isa.h"

namespace moe {

struct DenseRunner::Impl {
  GroupedGemmDense gemm;
};

// out [M, N] = a [M, K] @ b [K, N]
DenseRunner::DenseRunner(int64_t M, int64_t K, int64_t N, DType layer_dtype) : M_(M), K_(K), N_(N) {
  MOE_ASSERT(M >= 1 && K >= 1 && N >= 1, "DenseRunner: sizes must be >= 1");
  const std::string level = isa_name(active_isa());
  baseline_ = {"grouped_gemm", layer_dtype,
               "oneDNN is not compiled in (libdnnl-dev): the layer's own grouped GEMM with one group at "
               "kernel level " +
                   level,
               ""};
  impl_ = std::make_unique<Impl>(Impl{GroupedGemmDense(M, K, N, layer_dtype)});
  impl_->gemm.run();  // warm-up
}

DenseRunner::~DenseRunner() = default;
DenseRunner::DenseRunner(DenseRunner&&) noexcept = default;
DenseRunner& DenseRunner::operator=(DenseRunner&&) noexcept = default;

void DenseRunner::settle() const {}  // the engine's pool: its threads sleep when idle

std::string DenseRunner::spin_warning() { return ""; }

double DenseRunner::run_ms() {
  const double t0 = bench::now_ms();
  impl_->gemm.run();
  return bench::now_ms() - t0;
}

}  // namespace moe
