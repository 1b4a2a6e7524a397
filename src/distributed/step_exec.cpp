#include "distributed/step_exec.h"

#include "moe/watchdog.h"

namespace moe {

StepExec::StepExec(const Mesh& mesh, const DistRuntime* rt, StepTrace* trace) : mesh_(mesh), rt_(rt), trace_(trace) {}

Event StepExec::side(std::string name, std::function<void()> fn) const {
  StepTrace* trace = trace_;
  CommCounters& counters = mesh_.world().counters();
  return rt_->side()->submit(name, [trace, &counters, name, fn = std::move(fn)] {
    TraceScope scope(trace, name, OpEngine::side);
    WatchContext context(name);  // the watchdog names the op and chunk
    counters.add(CollKind::SO, 0);
    const int64_t bytes0 = CommCounters::thread_bytes();
    fn();
    scope.set_bytes(CommCounters::thread_bytes() - bytes0);
  });
}

Event StepExec::collective(OffloadTarget t, Collective c, std::string name, std::function<void(const Mesh&)> fn) const {
  if (offloaded(t, c)) {
    const Mesh* m = rt_->side_mesh();
    return side(std::move(name), [m, fn = std::move(fn)] { fn(*m); });
  }
  compute(name, [&] { fn(mesh_); });
  return Event();
}

Event StepExec::index_math(std::string name, std::function<void()> fn) const {
  if (rt_ && rt_->side() && rt_->offload().is_live(OffloadTarget::ragged_sort)) return side(std::move(name), std::move(fn));
  compute(name, fn);
  return Event();
}

void StepExec::compute(const std::string& name, const std::function<void()>& fn) const {
  TraceScope scope(trace_, name, OpEngine::compute);
  WatchContext context(name);  // the watchdog names the op and chunk
  const int64_t bytes0 = CommCounters::thread_bytes();
  fn();
  scope.set_bytes(CommCounters::thread_bytes() - bytes0);  // collectives run inline (not offloaded)
}

void StepExec::wait(const Event& e) const {
  if (e.ready()) return e.wait();  // finished (or inline): nothing exposed
  TraceScope scope(trace_, "wait:" + e.name(), OpEngine::compute);
  e.wait();
}

bool StepExec::offloaded(OffloadTarget t, Collective c) const {
  return rt_ && rt_->side() && rt_->offload().offload(t, c);
}

bool StepExec::pipelined() const {
  return rt_ && rt_->side() && rt_->offload().offload(OffloadTarget::ep_collectives, Collective::all_to_all);
}

}  // namespace moe
