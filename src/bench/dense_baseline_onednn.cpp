// The dense baseline of `moe bench` on oneDNN's matmul (libdnnl-dev): what a
// tuned dense GEMM library reaches on this machine for the same FLOPs,
// limited to the compute pool's thread count, in the dtype of the rule in
// dense_baseline.h.
#include <strings.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "bench/dense_baseline.h"
#include "bench/dense_matmul_onednn.h"
#include "bench/timing.h"
#include "moe/error.h"
#include "moe/isa.h"
#include "moe/thread_pool.h"

namespace moe {

// oneDNN's matmul, or (not even an f32 one here) the one-group grouped GEMM.
struct DenseRunner::Impl {
  std::optional<bench::DenseMatmul> onednn;
  std::optional<GroupedGemmDense> fallback;
  void run() { onednn ? onednn->run() : fallback->run(); }
};

// out [M, N] = a [M, K] @ b [K, N]
DenseRunner::DenseRunner(int64_t M, int64_t K, int64_t N, DType layer_dtype)
    : impl_(std::make_unique<Impl>()), M_(M), K_(K), N_(N) {
  MOE_ASSERT(M >= 1 && K >= 1 && N >= 1, "DenseRunner: sizes must be >= 1");
  (void)active_isa();  // a bad MOE_GEMM_ISA fails here, not as a "no matmul" below
  bench::dense_set_threads(ThreadPool::compute().size());
  try {
    impl_->onednn.emplace(bench::dense_matmul_for(M, K, N, layer_dtype, baseline_));
  } catch (const Error& e) {  // not even an f32 matmul: the last resort, never an error
    baseline_ = {"grouped_gemm", layer_dtype,
                 std::string(e.what()) + ", so the baseline is moe::gmm with one group", ""};
    impl_->fallback.emplace(M, K, N, layer_dtype);
  }
  impl_->run();  // warm-up
}

DenseRunner::~DenseRunner() = default;
DenseRunner::DenseRunner(DenseRunner&&) noexcept = default;
DenseRunner& DenseRunner::operator=(DenseRunner&&) noexcept = default;

namespace {
// libgomp's wait policy from the environment (read once at its start, as libgomp does).
enum class Spin { none, bounded, forever };
Spin openmp_spin() {
  static const Spin spin = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    const char* count = std::getenv("GOMP_SPINCOUNT");
    if (count && (strncasecmp(count, "inf", 3) == 0)) return Spin::forever;
    if (count) return std::strtoll(count, nullptr, 10) == 0 ? Spin::none : Spin::bounded;
    if (policy && strcasecmp(policy, "passive") == 0) return Spin::none;
    if (policy && strcasecmp(policy, "active") == 0) return Spin::forever;
    return Spin::bounded;
  }();
  return spin;
}

// Longer than libgomp's default spin of 300,000 pause instructions: 5-14 ms on this project's
// Zen 4 / Zen 5 VMs (2026-12-04); a pause of 140 cycles at 2 GHz would make it 21 ms.
constexpr auto kSpinSettle = std::chrono::milliseconds(30);
}  // namespace

void DenseRunner::settle() const {
  if (impl_->onednn && openmp_spin() == Spin::bounded) std::this_thread::sleep_for(kSpinSettle);
}

std::string DenseRunner::spin_warning() {
  if (openmp_spin() != Spin::forever) return "";
  return "OMP_WAIT_POLICY=ACTIVE (or an infinite GOMP_SPINCOUNT) keeps oneDNN's OpenMP threads spinning "
         "between dense runs, on the cores the layer's steps run on: the fractions of dense are biased "
         "against the layer; run with OMP_WAIT_POLICY=PASSIVE";
}

double DenseRunner::run_ms() {
  const double t0 = bench::now_ms();
  impl_->run();
  return bench::now_ms() - t0;
}

}  // namespace moe
