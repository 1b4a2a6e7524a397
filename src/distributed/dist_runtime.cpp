#include "moe/dist_runtime.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "moe/dist_layer.h"
#include "moe/thread_pool.h"
#include "moe/topology.h"

namespace moe {
namespace {

// This rank's share of the host's CPUs: the CPUs it may run on (its affinity: an MPI binding), at
// most the host's CPUs over its ranks there.
double rank_cores(int ranks_on_host) {
  const double host = std::max(1u, std::thread::hardware_concurrency());
  double mine = host;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) mine = std::max(1, CPU_COUNT(&set));
  return std::min(mine, host / std::max(1, ranks_on_host));
}

}  // namespace

std::string side_engine_core_warning(double cores, int pool_threads, bool realtime) {
  if (double(pool_threads) < cores) return "";
  char cpus[32];
  std::snprintf(cpus, sizeof cpus, "%.3g", cores);
  std::string w = "the side engine (moe_offload_targets) has no core of its own: " + std::to_string(pool_threads) +
                  " compute thread(s) on this rank's " + cpus +
                  " CPU(s), so its collectives take time slices from the compute and offload can make the step "
                  "slower than none (measured on 2 cores: 2 ranks up to 8% slower, 4 ranks up to 25%, "
                  "docs/offload.md). For offload to pay, leave a core per rank free (fewer MOE_NUM_THREADS, or "
                  "fewer ranks per host)";
  if (realtime)
    w += ". MOE_SIDE_ENGINE_RT=1 hides the waits the step trace counts as exposed, not the step: on cores the "
         "ranks fill, offload against none measured no better with it, and at 2 ranks per core worse (+4% to "
         "+27% on one host and +50% to +60% at 4 hosts of one rank on 2 cores, against -9% to +20% without it)";
  return w;
}

DistRuntime::DistRuntime(const Config& cfg, Communicator& world, bool training) : rank_(world.rank()) {
  TargetCheck chk = check_target(cfg, topology_of(world), training);
  if (!chk.problems.empty()) fail(chk.problems.front());
  offload_ = chk.offload;
  // Side-engine collectives overlap compute-thread MPI calls (other
  // communicators): only legal with MPI_THREAD_MULTIPLE. Below that, keep every
  // collective on the compute thread; routing index math may still move.
  if (std::string(world.backend()) != "single" && world.thread_level() != ThreadLevel::multiple &&
      !offload_.side.empty()) {
    offload_.side.clear();
    if (world.rank() == 0)
      std::fprintf(stderr, "moe: warning: MPI provides thread level %s, not multiple: offloaded collectives stay on "
                   "the compute thread\n", thread_level_name(world.thread_level()));
  }
  mesh_ = std::make_unique<Mesh>(world, check_parallel_config(cfg, world.size()));
  if (offload_.live.empty()) return;
  // The side engine gets communicators of its own (same ranks, same order),
  // so its collectives never interleave with the compute thread's.
  side_world_ = world.split(0, world.rank());
  side_world_->set_polite_waits(true);  // its waits must not take a core from the compute pool
  side_mesh_ = std::make_unique<Mesh>(*side_world_, mesh_->shape());
  // One worker: collectives on a communicator must be issued in one order on
  // every rank, so the layer's side ops run FIFO on a single thread (extra
  // side_engine_threads are accepted and left unused).
  const bool realtime = side_engine_realtime_requested();
  side_ = std::make_unique<SideEngine>(1, realtime);
  if (realtime && !side_->realtime())
    std::fprintf(stderr, "moe: warning: rank %d: MOE_SIDE_ENGINE_RT=1 but SCHED_FIFO was refused (needs "
                 "CAP_SYS_NICE); the side engine runs at normal priority\n", rank_);
  // Collective on every construction (the ranks of a run build the same runtimes; a sub-world's
  // members only theirs), so only the print is once per process.
  const std::unique_ptr<Communicator> host = side_world_->split_by_host(side_world_->rank());
  const std::string warn = side_engine_core_warning(rank_cores(host->size()), ThreadPool::compute().size(),
                                                    side_->realtime());
  static std::atomic<bool> warned{false};
  if (!warn.empty() && host->rank() == 0 && !warned.exchange(true))
    std::fprintf(stderr, "moe: warning: rank %d: %s\n", rank_, warn.c_str());
}

DistRuntime::~DistRuntime() {
  if (side_) side_->sync();
}

void DistRuntime::enable_trace(bool on) {
  if (on && !trace_) trace_ = std::make_unique<StepTrace>(rank_);
  if (!on) trace_.reset();
}

}  // namespace moe
