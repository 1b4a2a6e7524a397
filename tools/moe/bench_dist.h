// `moe bench --dist`: the distributed layer's benchmark table (under mpirun;
// src/bench/dist_bench.h, docs/benchmarks.md "Distributed").
#pragma once

#include <string>
#include <vector>

namespace moe::cli {

struct BenchDistArgs {
  std::vector<std::string> variants, overrides;
  std::string json, trace_dir;
  int iters = 5, warmup = 1;
  int64_t tokens = 256;  // per rank
  uint64_t seed = 0;
  double probe_mb = 0;  // > 0: only the link probe (all-to-alls of this many MB per rank in all)
  int probe_calls = 1;  // in that many calls
  std::string probe_pattern = "all-to-all";  // or "pairs": bench::probe_pairs
  int speed_probe = 0;  // > 0: bench::SpeedProbe with this many steps around each variant
  bool list = false;
};

void run_bench_dist(const BenchDistArgs& a);

}  // namespace moe::cli
