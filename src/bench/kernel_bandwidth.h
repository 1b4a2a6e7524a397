// Bandwidth of the permute and combine kernels alone on a case's routing,
// next to a memcpy of the same byte count measured in the same run.
#pragma once

#include "bench/cases.h"
#include "route/routing.h"

namespace moe::bench {

// GB/s = useful bytes moved (permute_bytes / combine_bytes of the case) / median time.
struct KernelBandwidth {
  double permute_fused_gbps = 0, permute_reference_gbps = 0;
  double combine_fused_gbps = 0, combine_reference_gbps = 0;
  double memcpy_gbps = 0;  // parallel memcpy reading and writing permute_bytes/2 each
};

// x: [T, D] in `dtype`; rt: the case's routing. Each kernel: one warm-up, then `iters` timed runs.
KernelBandwidth measure_kernel_bandwidth(const Case& c, DType dtype, const Tensor& x, const Routing& rt,
                                         int iters);

}  // namespace moe::bench
