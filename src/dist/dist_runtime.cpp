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
  mesh_ = std::make_unique<Mesh>(world, check_parallel_config(cfg, world.size()));
  if (offload_.live.empty()) return;
  // The side engine gets communicators of its own (same ranks, same order),
  // so its collectives never interleave with the compute thread's.
  side_world_ = world.split(0, world.rank());
  side_world_->set_polite_waits(true);  // its waits must not take a core from the compute pool
  side_mesh_ = std::make_unique<Mesh>(*side_world_, mesh_->shape());
  const char* rt = std::getenv("MOE_SIDE_ENGINE_RT");
  const bool realtime = rt && std::string(rt) == "1";
  side_ = std::make_unique<SideEngine>(int(cfg.side_engine_threads), realtime);
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
