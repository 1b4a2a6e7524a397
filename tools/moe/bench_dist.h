// `moe bench --dist`: the distributed layer's benchmark table (under mpirun;
// src/bench/dist_bench.h, docs/benchmarks.md "Distributed").
#pragma once

#include <string>
#include <vector>

namespace moe::cli {

struct BenchDistArgs {
  std::vector<std::string> variants, overrides;
  std::string json;
  int iters = 5, warmup = 1;
  int64_t tokens = 256;  // per rank
  uint64_t seed = 0;
  double probe_mb = 0;  // > 0: only the link probe (an all-to-all of this many MB per rank)
  bool list = false;
};

void run_bench_dist(const BenchDistArgs& a);

}  // namespace moe::cli
