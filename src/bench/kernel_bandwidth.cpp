#include "bench/kernel_bandwidth.h"

#include <algorithm>
#include <cstring>

#include "bench/timing.h"
#include "kernels/combine.h"
#include "kernels/permute.h"
#include "moe/thread_pool.h"

namespace moe::bench {
namespace {

double gbps(double bytes, const Timing& t) { return bytes / std::max(t.median_ms, 1e-6) / 1e6; }

// dst = src, `bytes` each, split over the compute pool like the kernels are.
void parallel_memcpy(const std::byte* src, std::byte* dst, size_t bytes) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t n = int64_t((bytes + kChunk - 1) / kChunk);
  parallel_for(n, 1, [&](int64_t b, int64_t e) {
    size_t begin = size_t(b * kChunk), end = std::min(bytes, size_t(e * kChunk));
    std::memcpy(dst + begin, src + begin, end - begin);
  });
}

}  // namespace

KernelBandwidth measure_kernel_bandwidth(const Case& c, DType dtype, const Tensor& x, const Routing& rt,
                                         int iters) {
  MOE_ASSERT(x.dtype() == dtype, "measure_kernel_bandwidth: x must be in the bench dtype");
  const int64_t R = rt.rows(), T = rt.tokens, K = rt.top_k, D = x.dim(1);
  KernelBandwidth bw;
  // permute: x [T, D] -> xs [R, D]
  Tensor xs = Tensor::empty(dtype, {R, D});
  const double pb = permute_bytes(c, dtype), cb = combine_bytes(c, dtype);
  bw.permute_reference_gbps =
      gbps(pb, time_runs(iters, [&] { permute(KernelChoice::reference, x, rt, xs); }));
  bw.permute_fused_gbps = gbps(pb, time_runs(iters, [&] { permute(KernelChoice::fused, x, rt, xs); }));
  // combine: ys [R, D] (the permuted rows stand in for expert outputs), w [T, K] -> y [T, D]
  Tensor w(DType::f32, {T, K}), y = Tensor::empty(dtype, {T, D});
  std::fill(w.data<float>(), w.data<float>() + w.numel(), 1.0f / float(K));
  bw.combine_reference_gbps =
      gbps(cb, time_runs(iters, [&] { combine(KernelChoice::reference, xs, w, rt, true, y); }));
  bw.combine_fused_gbps =
      gbps(cb, time_runs(iters, [&] { combine(KernelChoice::fused, xs, w, rt, true, y); }));
  // memcpy: reads pb/2 and writes pb/2 bytes
  Tensor dst = Tensor::empty(dtype, {R, D});
  const auto* src = static_cast<const std::byte*>(xs.raw());
  bw.memcpy_gbps = gbps(
      pb, time_runs(iters, [&] { parallel_memcpy(src, static_cast<std::byte*>(dst.raw()), xs.nbytes()); }));
  return bw;
}

}  // namespace moe::bench
