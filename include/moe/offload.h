// The offload model (SPEC.md §6; docs/offload.md): which ops of a step go to
// the side engine on a given backend.
//
//  - Targets (config key moe_offload_targets): fsdp_all_gather,
//    ep_collectives, ragged_sort, or all.
//  - Capability table: per backend, whether it has a side engine and which
//    collective kinds that engine may run concurrently with the compute pool.
//  - Transposition rule: when gradients are computed, a collective may be
//    offloaded only if its transpose can be too (the backward runs it).
//  - Warn and drop: a target whose required collective cannot be offloaded is
//    dropped with one warning, so one config runs on every backend. A target
//    on a backend without a side engine is an error.
//
// Pure functions of their arguments (no MPI, no threads): `moe validate
// --topology` and a real run call the same code. Thread safety: everything
// here is immutable after construction and may be read from any thread.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace moe {

enum class Collective { all_gather, reduce_scatter, all_reduce, all_to_all };
enum class OffloadTarget { fsdp_all_gather, ep_collectives, ragged_sort };

const char* collective_name(Collective c);  // "all_gather", ...
const char* target_name(OffloadTarget t);   // "fsdp_all_gather", ...
// The collective that runs in the backward of `c`: all_gather <-> reduce_scatter;
// all_to_all and all_reduce are their own transposes.
Collective transpose_of(Collective c);

// What a backend's side engine can do.
struct Capability {
  std::string backend;               // e.g. "mpi-multiple"
  bool side_engine = false;          // a side engine exists at all
  std::set<Collective> offloadable;  // kinds it may run concurrently with the compute pool
  std::string why;                   // one line: the reason for this row (shown by validate)
};

// The builtin rows: "mpi-multiple", "mpi-serialized", "mpi-funneled",
// "mpi-single", "single-process" (docs/offload.md justifies each).
// Throws moe::Error naming an unknown backend and listing the known ones.
const Capability& builtin_capability(const std::string& backend);
std::vector<std::string> builtin_backends();

// The per-collective gate: the side engine exists, can run `c`, and (when
// `training`) can run transpose_of(c) too.
bool can_offload(const Capability& cap, Collective c, bool training);

// The collectives a target moves when live, and the one it cannot do without.
std::vector<Collective> target_collectives(OffloadTarget t);
// fsdp_all_gather: all_gather; ep_collectives: all_to_all; ragged_sort: none.
bool target_requires(OffloadTarget t, Collective c);

struct ResolvedOffload {
  std::set<OffloadTarget> live;       // targets that will move ops
  std::vector<std::string> warnings;  // one per dropped target
  bool training = true;
  std::set<Collective> side;  // kinds that pass the gate on this backend

  bool is_live(OffloadTarget t) const { return live.count(t) != 0; }
  // Whether the collective `c` issued on behalf of target `t` runs on the
  // side engine: t is live, t moves c, and c passes the gate. Collectives not
  // offloaded stay on the compute pool (ep_collectives on a backend that
  // cannot offload all_gather keeps its all-to-alls on the side engine and
  // its all-gathers / reduce-scatters on the compute pool).
  bool offload(OffloadTarget t, Collective c) const;
};

// Resolves `targets` (the moe_offload_targets string) for a backend.
// Throws moe::Error: an unknown target (parse_offload_targets' message), or
// any target when side_engine_threads == 0 or the backend has no side engine.
ResolvedOffload resolve_offload(const std::string& targets, const Capability& cap, bool training,
                                int64_t side_engine_threads = 1);

// Human-readable plan: backend, live targets and where each of their
// collectives runs, warnings. Ends with a newline.
std::string format_offload_plan(const ResolvedOffload& plan, const Capability& cap);

}  // namespace moe
