// Resolving moe_offload_targets against a capability table (include/moe/offload.h).
#include "moe/offload.h"

#include <sstream>

#include "moe/config.h"
#include "moe/error.h"

namespace moe {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_to_all:
      return "all_to_all";
  }
  return "?";
}

const char* target_name(OffloadTarget t) {
  switch (t) {
    case OffloadTarget::fsdp_all_gather:
      return "fsdp_all_gather";
    case OffloadTarget::ep_collectives:
      return "ep_collectives";
    case OffloadTarget::ragged_sort:
      return "ragged_sort";
  }
  return "?";
}

Collective transpose_of(Collective c) {
  if (c == Collective::all_gather) return Collective::reduce_scatter;
  if (c == Collective::reduce_scatter) return Collective::all_gather;
  return c;
}

bool can_offload(const Capability& cap, Collective c, bool training) {
  if (!cap.side_engine || !cap.offloadable.count(c)) return false;
  return !training || cap.offloadable.count(transpose_of(c)) != 0;
}

std::vector<Collective> target_collectives(OffloadTarget t) {
  switch (t) {
    // The weight gathers and, in the backward, their reduce-scatters.
    case OffloadTarget::fsdp_all_gather:
      return {Collective::all_gather, Collective::reduce_scatter};
    // Ragged all-to-alls (dispatch, combine), count exchanges (all-gather),
    // ring of experts (all-gather of tokens, reduce-scatter of outputs).
    case OffloadTarget::ep_collectives:
      return {Collective::all_to_all, Collective::all_gather, Collective::reduce_scatter};
    case OffloadTarget::ragged_sort:
      return {};  // index math only
  }
  return {};
}

bool target_requires(OffloadTarget t, Collective c) {
  if (t == OffloadTarget::fsdp_all_gather) return c == Collective::all_gather;
  if (t == OffloadTarget::ep_collectives) return c == Collective::all_to_all;
  return false;
}

bool ResolvedOffload::offload(OffloadTarget t, Collective c) const {
  if (!is_live(t) || !side.count(c)) return false;
  for (Collective m : target_collectives(t))
    if (m == c) return true;
  return false;
}

namespace {

OffloadTarget target_from_name(const std::string& name) {
  for (OffloadTarget t :
       {OffloadTarget::fsdp_all_gather, OffloadTarget::ep_collectives, OffloadTarget::ragged_sort})
    if (name == target_name(t)) return t;
  MOE_ASSERT(false, "parse_offload_targets returned an unknown target " + name);
  return OffloadTarget::ragged_sort;
}

// Why the gate refuses `c` (REQUIRES: !can_offload(cap, c, training)).
std::string refusal(const Capability& cap, Collective c, bool training) {
  std::ostringstream os;
  if (!cap.offloadable.count(c))
    os << "its " << collective_name(c) << " cannot run on the side engine";
  else
    os << "its " << collective_name(c) << " can run on the side engine but the transpose "
       << collective_name(transpose_of(c)) << " (run in the backward when training) cannot";
  return os.str();
}

void require_side_engine(const std::string& targets, const Capability& cap, int64_t side_engine_threads) {
  if (side_engine_threads <= 0)
    fail("moe_offload_targets=", targets, " needs a side engine, but side_engine_threads is ",
         side_engine_threads);
  if (!cap.side_engine)
    fail("moe_offload_targets=", targets, " needs a side engine, but backend ", cap.backend, " has none (",
         cap.why, "); run with MPI_THREAD_SERIALIZED or MULTIPLE, or set moe_offload_targets=\"\"");
}

}  // namespace

ResolvedOffload resolve_offload(const std::string& targets, const Capability& cap, bool training,
                                int64_t side_engine_threads) {
  const std::vector<std::string> names = parse_offload_targets(targets);
  ResolvedOffload out;
  out.training = training;
  if (names.empty()) return out;
  require_side_engine(targets, cap, side_engine_threads);
  for (Collective c :
       {Collective::all_gather, Collective::reduce_scatter, Collective::all_reduce, Collective::all_to_all})
    if (can_offload(cap, c, training)) out.side.insert(c);
  for (const std::string& name : names) {
    OffloadTarget t = target_from_name(name);
    std::string why;
    for (Collective c : target_collectives(t))
      if (target_requires(t, c) && !can_offload(cap, c, training)) why = refusal(cap, c, training);
    if (why.empty())
      out.live.insert(t);
    else
      out.warnings.push_back("moe_offload_targets: " + name + " dropped on backend " + cap.backend + ": " +
                             why + "; its ops stay on the compute pool");
  }
  return out;
}

std::string format_offload_plan(const ResolvedOffload& plan, const Capability& cap) {
  std::ostringstream os;
  os << "offload plan (backend " << cap.backend << ", " << (plan.training ? "training" : "forward only")
     << "):\n";
  if (plan.live.empty()) os << "  no live targets: every op runs on the compute pool\n";
  for (OffloadTarget t : plan.live) {
    os << "  " << target_name(t) << ":";
    if (t == OffloadTarget::ragged_sort) os << " routing index math -> side";
    for (Collective c : target_collectives(t))
      os << " " << collective_name(c) << " -> " << (plan.offload(t, c) ? "side" : "compute");
    os << "\n";
  }
  for (const std::string& w : plan.warnings) os << "  warning: " << w << "\n";
  return os.str();
}

}  // namespace moe
