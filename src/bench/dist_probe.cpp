// The link probe of `moe bench --dist --probe-mb` (scripts/overlap.sh checks
// that a rate limit takes effect with it).
#include <algorithm>
#include <vector>

#include "bench/dist_bench.h"
#include "bench/timing.h"

namespace moe::bench {

ProbeResult probe_all_to_all(Communicator& world, int64_t bytes, int iters, int calls) {
  const int W = world.size();
  calls = std::max(calls, 1);
  const int64_t block = std::max<int64_t>(bytes / (int64_t(W) * calls), 1);
  std::vector<char> send(size_t(block * W), 1), recv(send.size());
  const A2ALayout layout = A2ALayout::uniform(W, block);
  std::vector<double> ms;
  for (int i = 0; i < iters + 1; ++i) {
    world.barrier();
    const double t0 = now_ms();
    for (int c = 0; c < calls; ++c) world.all_to_allv(send.data(), recv.data(), layout, 1);
    world.barrier();
    if (i > 0) ms.push_back(now_ms() - t0);  // the first one connects
  }
  ProbeResult r;
  r.median_ms = summarize(ms).median_ms;
  r.bytes_out = block * (W - 1) * calls;
  r.mbit_per_s = r.median_ms > 0 ? double(r.bytes_out) * 8 / (r.median_ms * 1e3) : 0;
  return r;
}

}  // namespace moe::bench
