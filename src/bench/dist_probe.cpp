// The link probes of `moe bench --dist --probe-mb` (scripts/overlap.sh checks
// that a rate limit takes effect with it; scripts/plan_cluster.sh measures the links with them).
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/dist_bench.h"
#include "bench/engine_bytes.h"
#include "bench/timing.h"
#include "moe/error.h"

namespace moe::bench {
namespace {

// Busy jiffies of all cores together (the first line of /proc/stat, less idle and iowait).
struct CpuTicks {
  bool ok = false;
  long long busy = 0;
};
CpuTicks cpu_ticks() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  long long v[8] = {};
  if (!(f >> cpu) || cpu != "cpu") return {};
  for (long long& x : v)
    if (!(f >> x)) return {};
  // user nice system idle iowait irq softirq steal
  return {true, v[0] + v[1] + v[2] + v[5] + v[6] + v[7]};
}

// Times `one_iteration` (collective over `world`) `iters` times after one that connects, once with
// MPI's own (spinning) waits and once with polite ones (ProbeResult).
template <class F>
ProbeResult timed_probe(Communicator& world, int iters, int64_t bytes_out, F one_iteration) {
  auto pass = [&](bool polite, double* busy_core_ms) {
    const bool was_polite = world.polite_waits();
    world.set_polite_waits(polite);
    std::vector<double> ms;
    CpuTicks busy0;
    for (int i = 0; i < iters + 1; ++i) {
      world.barrier();
      if (i == 1) busy0 = cpu_ticks();
      const double t0 = now_ms();
      one_iteration();
      world.barrier();
      if (i > 0) ms.push_back(now_ms() - t0);  // the first one connects
    }
    const CpuTicks busy1 = cpu_ticks();
    world.set_polite_waits(was_polite);
    *busy_core_ms = busy0.ok && busy1.ok && iters > 0
                       ? double(busy1.busy - busy0.busy) * 1000.0 / double(sysconf(_SC_CLK_TCK)) / iters
                       : -1;
    return summarize(ms).median_ms;
  };
  ProbeResult r;
  double spinning_busy = 0;  // not reported: spinning waits keep every core busy whatever the link does
  r.median_ms = pass(false, &spinning_busy);         // MPI's own (spinning) waits: the link's time
  r.polite_median_ms = pass(true, &r.busy_core_ms);  // the side engine's waits: what it costs the CPUs
  r.bytes_out = bytes_out;
  r.mbit_per_s = r.median_ms > 0 ? double(r.bytes_out) * 8 / (r.median_ms * 1e3) : 0;
  return r;
}

}  // namespace

ProbeResult probe_all_to_all(Communicator& world, int64_t bytes, int iters, int calls) {
  const int W = world.size();
  calls = std::max(calls, 1);
  const int64_t block = std::max<int64_t>(bytes / (int64_t(W) * calls), 1);
  EngineBytes send(size_t(block * W), 1), recv(send.size(), 0);  // the tensors' pages
  const A2ALayout layout = A2ALayout::uniform(W, block);
  return timed_probe(world, iters, block * (W - 1) * calls, [&] {
    for (int c = 0; c < calls; ++c) world.all_to_allv(send.data(), recv.data(), layout, 1);
  });
}

ProbeResult probe_pairs(Communicator& world, int64_t bytes, int iters, int calls) {
  const int W = world.size(), r = world.rank();
  if (W % 2 != 0)
    throw Error("moe bench --dist --probe-pattern pairs: needs an even number of ranks (got " + std::to_string(W) +
                ")");
  calls = std::max(calls, 1);
  const int64_t block = std::max<int64_t>(bytes / calls, 1);
  std::unique_ptr<Communicator> pair = world.split(r / 2, r);
  EngineBytes send(size_t(block), 1), recv(size_t(2 * block), 0);
  return timed_probe(world, iters, block * calls, [&] {
    pair->set_polite_waits(world.polite_waits());  // split() copied the flag once; the passes change it
    for (int c = 0; c < calls; ++c) pair->all_gather(send.data(), recv.data(), size_t(block));
  });
}

}  // namespace moe::bench
