// Where each op of a distributed step runs (SPEC.md §6): a collective issued
// for a live offload target goes to the side engine (on the side mesh's
// communicators) and returns an Event; everything else runs on the compute
// thread at once and returns a finished Event. Every op lands in the step
// trace: collectives and index math under their own names, compute waits on
// side events as "wait:<name>" (the exposed communication time).
#pragma once

#include <functional>
#include <string>

#include "moe/dist_runtime.h"

namespace moe {

class StepExec {
 public:
  // rt: offload plan and side engine (null: everything inline); trace: optional.
  StepExec(const Mesh& mesh, const DistRuntime* rt, StepTrace* trace);

  // fn(mesh) issues the collective(s) on the given mesh's communicators.
  Event collective(OffloadTarget t, Collective c, std::string name, std::function<void(const Mesh&)> fn) const;
  // Routing index math (the ragged_sort target).
  Event index_math(std::string name, std::function<void()> fn) const;
  // A compute-pool op, traced.
  void compute(const std::string& name, const std::function<void()>& fn) const;
  // Blocks the compute thread until `e` finished (no-op for a finished event).
  void wait(const Event& e) const;

  // True when the expert-parallel all-to-alls run on the side engine, so the
  // chunk loop issues the next chunk's dispatch before this chunk's FFN.
  bool pipelined() const;
  // Whether (t, c) runs on the side engine in this step.
  bool offloaded(OffloadTarget t, Collective c) const;
  bool live(OffloadTarget t) const { return rt_ && rt_->offload().is_live(t); }
  const Mesh& mesh() const { return mesh_; }

 private:
  Event side(std::string name, std::function<void()> fn) const;
  const Mesh& mesh_;
  const DistRuntime* rt_;
  StepTrace* trace_;
};

}  // namespace moe
