#include "train/time_split.h"

#include <algorithm>
#include <string_view>

namespace moe::train {
namespace {

// The category of an op name ("ffn[1]" -> gemm); null: other.
double* category(std::string_view name, TimeSplit& t) {
  auto starts = [&](std::string_view p) { return name.substr(0, p.size()) == p; };
  for (std::string_view p : {"AG:", "A2A:", "RS:", "AR:", "grad:", "wait:"})
    if (starts(p)) return &t.exposed_comm;
  if (starts("ffn") || starts("weight_grads")) return &t.gemm;
  if (starts("router")) return &t.router;
  for (std::string_view p : {"sort", "permute", "combine"})
    if (starts(p)) return &t.permute_combine;
  return nullptr;
}

}  // namespace

void add_time_split(const std::vector<TraceOp>& all, TimeSplit& into) {
  std::vector<TraceOp> ops;
  for (const TraceOp& op : all)
    if (op.engine == OpEngine::compute) ops.push_back(op);
  // Parents before their children: by start, then the longer first.
  std::stable_sort(ops.begin(), ops.end(), [](const TraceOp& a, const TraceOp& b) {
    return a.start_us != b.start_us ? a.start_us < b.start_us : a.end_us > b.end_us;
  });
  std::vector<const TraceOp*> open;  // enclosing ops of the current one (start <= its start, end >= its end)
  for (const TraceOp& op : ops) {
    while (!open.empty() && open.back()->end_us < op.end_us) open.pop_back();
    const double ms = double(op.end_us - op.start_us) * 1e-3;
    if (double* c = category(op.name, into)) *c += ms;
    if (!open.empty())
      if (double* p = category(open.back()->name, into)) *p -= ms;  // the parent's time excludes this
    open.push_back(&op);
  }
}

}  // namespace moe::train
