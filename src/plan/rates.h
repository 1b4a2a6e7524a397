// Kernel rates of `moe plan`: what one rank's compute pool does per second at
// one thread, measured by `moe plan --calibrate` (calibrate.h) or given
// (`--rates FILE`). File format: docs/formats.md, "Plan rates".
#pragma once

#include <string>
#include <vector>

#include "moe/dtype.h"
#include "plan/cluster.h"

namespace moe::plan {

// The expert FFN's rates at one shape (GFLOP/s of the op's useful FLOPs, one thread).
struct GemmPoint {
  DType dtype = DType::bf16;
  int64_t D = 0, F = 0;
  double rows_per_expert = 0;
  double ffn_gflops = 0;           // forward: 6·R·D·F (3 GEMMs + activation)
  double ffn_backward_gflops = 0;  // input gradients: 6·R·D·F
  double weight_grads_gflops = 0;  // weight gradients: 6·R·D·F
};

struct Rates {
  std::string machine;  // free text (CPU, date, load)
  std::string isa;
  int pool_threads = 1;     // threads of the speedup measurement
  double pool_speedup = 1;  // step time at 1 thread / at pool_threads
  std::vector<GemmPoint> gemm;
  double router_gflops = 0;           // 2·T·D·E (f32, + softmax/top-k)
  double router_backward_gflops = 0;  // 4·T·D·E (+ the aux losses' backward)
  double sort_ns_per_row = 0;         // routing index math per routed row (T·K)
  double permute_gbps = 0;            // 2·R·D·bytes (read x rows, write xs)
  double combine_gbps = 0;            // R·D·bytes + T·D·bytes
  double combine_backward_gbps = 0;   // 2·R·D·bytes
  double permute_backward_gbps = 0;   // R·D·bytes + T·D·4
  double memcpy_gbps = 0;             // row movement, casts, ordered sums (bytes read + written)
  Link intra;                         // shared memory between two ranks of this machine
  bool intra_measured = false;        // false: derived from memcpy_gbps and a default latency
  double side_op_overhead_us = 0;     // hand-off of one op to the side engine and back
  double comm_cpu_ns_per_byte = 0;    // host CPU per byte sent between hosts (TCP stack)

  // The point's GFLOP/s for (dtype, D, F, rows per expert): the nearest calibrated D·F of that
  // dtype (else any dtype), interpolated in log(rows per expert), clamped at the ends.
  GemmPoint ffn_at(DType dtype, int64_t D, int64_t F, double rows_per_expert) const;
  // Relative speed of a rank with `cores` cores running `threads` pool threads: cores below 1 are
  // time slices; above, each extra thread adds (pool_speedup-1)/(pool_threads-1).
  double speed(double cores, int threads) const;
};

// JSON text of the file, and back. read_rates throws naming the file and the field.
std::string rates_json(const Rates& r);
Rates parse_rates(const std::string& text, const std::string& where);
Rates read_rates(const std::string& path);

}  // namespace moe::plan
