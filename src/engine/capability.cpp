// The capability table: one row per backend (docs/offload.md, "Capability
// table", gives the reasons at length). The counterpart of the seed's chip
// table: side engine present? which collectives may it run?
#include <map>

#include "moe/error.h"
#include "moe/offload.h"

namespace moe {
namespace {

using C = Collective;

const std::map<std::string, Capability>& table() {
  static const std::map<std::string, Capability> rows = [] {
    std::map<std::string, Capability> t;
    auto add = [&t](Capability c) { t.emplace(c.backend, std::move(c)); };
    add({"mpi-multiple",
         true,
         {C::all_gather, C::reduce_scatter, C::all_reduce, C::all_to_all},
         "MPI_THREAD_MULTIPLE: the side engine issues collectives on its own communicator, "
         "concurrently with the compute pool's"});
    add({"mpi-serialized",
         true,
         {C::all_to_all},
         "MPI_THREAD_SERIALIZED: MPI calls of the two engines are serialized by one lock; only the "
         "ragged all-to-alls (their own transpose) are offloaded, all-gathers and reduce-scatters "
         "stay on the compute pool"});
    add({"mpi-funneled",
         false,
         {},
         "MPI_THREAD_FUNNELED: only the main thread may call MPI, so there is no side engine"});
    add({"mpi-single", false, {}, "MPI_THREAD_SINGLE: no threads may call MPI, so there is no side engine"});
    add({"single-process",
         true,
         {C::all_gather, C::reduce_scatter, C::all_reduce, C::all_to_all},
         "one rank: collectives are local copies, so every kind may run on the side engine"});
    return t;
  }();
  return rows;
}

}  // namespace

std::vector<std::string> builtin_backends() {
  std::vector<std::string> names;
  for (const auto& kv : table()) names.push_back(kv.first);
  return names;
}

const Capability& builtin_capability(const std::string& backend) {
  auto it = table().find(backend);
  if (it != table().end()) return it->second;
  std::string known;
  for (const auto& name : builtin_backends()) known += (known.empty() ? "" : ", ") + name;
  fail("unknown backend '", backend, "' (known backends: ", known, ")");
}

}  // namespace moe
