#include "moe/dist_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "moe/dist_layer.h"
#include "moe/topology.h"

namespace moe {

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
  const char* rt = std::getenv("MOE_SIDE_ENGINE_RT");
  const bool realtime = rt && std::string(rt) == "1";
  side_ = std::make_unique<SideEngine>(1, realtime);
  if (realtime && !side_->realtime())
    std::fprintf(stderr, "moe: warning: rank %d: MOE_SIDE_ENGINE_RT=1 but SCHED_FIFO was refused (needs "
                 "CAP_SYS_NICE); the side engine runs at normal priority\n", rank_);
}

DistRuntime::~DistRuntime() {
  if (side_) side_->sync();
}

void DistRuntime::enable_trace(bool on) {
  if (on && !trace_) trace_ = std::make_unique<StepTrace>(rank_);
  if (!on) trace_.reset();
}

}  // namespace moe
