// What a distributed step runs on beyond its config: the mesh, the offload
// plan and, when a target is live, the side engine with its own
// communicators (SPEC.md §6), plus the optional step trace.
//
// Thread safety: built and used by one thread (the step's compute thread);
// the side engine's worker runs the offloaded collectives on the side mesh's
// communicators, never on the compute mesh's, so the two threads never share
// a communicator. Two threads calling MPI at once needs MPI_THREAD_MULTIPLE.
// Known gap: the mpi-serialized capability row offloads the all-to-alls, but
// no lock serializes them against the compute thread's MPI calls, so that
// row is only safe for planning (moe validate --topology), not for a run.
// The side collectives also rely on ONE side-engine thread (FIFO order, the
// same on every rank); side_engine_threads > 1 is not safe here.
#pragma once

#include <memory>
#include <string>

#include "moe/comm.h"
#include "moe/config.h"
#include "moe/mesh.h"
#include "moe/offload.h"
#include "moe/side_engine.h"
#include "moe/trace.h"

namespace moe {

// What a rank is told when the compute pool leaves its side engine no core of
// its own: `pool_threads` compute threads on `cores` CPUs (the rank's share:
// the CPUs it may run on, at most the host's CPUs over its ranks there; below 1
// when ranks share a CPU). "" when a core is free (pool_threads < cores).
// `realtime` (SCHED_FIFO workers) adds that they hide the exposed waits but do
// not shorten the step there (docs/offload.md, measured 2026-12-05).
std::string side_engine_core_warning(double cores, int pool_threads, bool realtime);

class DistRuntime {
 public:
  // Collective over `world`. The plan comes from the world's capability
  // (topology_of(world)); `training`: gradients will be computed (the
  // transposition rule applies). Throws moe::Error for a config the target
  // cannot run.
  //
  // Environment: MOE_SIDE_ENGINE_RT=1 asks for real-time side-engine workers
  // (SideEngine's `realtime`; its communicators wait politely, so they sleep
  // while a transfer runs). Off by default: it needs CAP_SYS_NICE, and where
  // the ranks leave no core free for the side engine it shortens the waits the
  // step trace counts as exposed (the overlap demo, docs/benchmarks.md) but
  // not the step (docs/offload.md). A refusal is one warning on stderr. Where
  // the compute pools of the host's ranks leave the side engine no core
  // (side_engine_core_warning), the first host rank warns once per process:
  // each side-engine collective then takes time slices from the compute, and
  // offload can make the step slower than none.
  DistRuntime(const Config& cfg, Communicator& world, bool training);
  ~DistRuntime();

  const Mesh& mesh() const { return *mesh_; }
  const ResolvedOffload& offload() const { return offload_; }
  // Null when no target is live.
  SideEngine* side() const { return side_.get(); }
  const Mesh* side_mesh() const { return side_mesh_.get(); }
  // Null unless enable_trace(true).
  StepTrace* trace() const { return trace_.get(); }
  void enable_trace(bool on);

 private:
  ResolvedOffload offload_;
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<Communicator> side_world_;
  std::unique_ptr<Mesh> side_mesh_;
  std::unique_ptr<SideEngine> side_;
  std::unique_ptr<StepTrace> trace_;
  int rank_ = 0;
};

}  // namespace moe
