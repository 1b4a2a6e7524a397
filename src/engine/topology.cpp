// Targets (include/moe/topology.h): --topology parsing and the checks a run
// makes against its target.
#include "moe/topology.h"

#include <charconv>
#include <climits>
#include <sstream>
#include <thread>

#include "moe/comm.h"
#include "moe/dist_layer.h"
#include "moe/error.h"
#include "moe/memory_estimate.h"

namespace moe {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Ranks and cores are ints to MPI and the mesh.
int64_t positive_int(const std::string& key, const std::string& value) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 1 || v > INT_MAX)
    fail("--topology: ", key, " must be an integer in [1, ", INT_MAX, "] (got '", value, "')");
  return v;
}

void set_item(Topology& t, const std::string& key, const std::string& value) {
  if (key == "ranks") {
    t.ranks = positive_int(key, value);
  } else if (key == "cores") {
    t.cores = positive_int(key, value);
  } else if (key == "mpi_thread") {
    if (value != "single" && value != "funneled" && value != "serialized" && value != "multiple")
      fail("--topology: mpi_thread must be single, funneled, serialized or multiple (got '", value, "')");
    t.mpi_thread = value;
  } else if (key == "backend") {
    try {
      builtin_capability(value);
    } catch (const Error& e) {
      fail("--topology: ", e.what());
    }
    t.backend = value;
  } else {
    fail("--topology: unknown item '", key, "' (expected ranks, cores, mpi_thread, backend)");
  }
}

}  // namespace

std::string Topology::describe() const {
  std::ostringstream os;
  os << "ranks=" << ranks << ", cores=" << (cores > 0 ? std::to_string(cores) : "?")
     << ", mpi_thread=" << (mpi_thread.empty() ? "-" : mpi_thread) << ", backend=" << backend;
  return os.str();
}

Topology parse_topology(const std::string& spec) {
  Topology t;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    item = trim(item);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) fail("--topology: item '", item, "' is not of the form key=value");
    set_item(t, trim(item.substr(0, eq)), trim(item.substr(eq + 1)));
  }
  if (t.backend.empty() && !t.mpi_thread.empty()) t.backend = "mpi-" + t.mpi_thread;
  if (t.backend.empty() && t.ranks == 1) t.backend = "single-process";
  if (t.backend.empty())
    fail("--topology: ranks=", t.ranks,
         " needs mpi_thread=single|funneled|serialized|multiple (or backend=NAME)");
  return t;
}

Topology this_machine() {
  Topology t;
  t.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  t.backend = "single-process";
  return t;
}

std::vector<std::string> mesh_problems(const Config& c, int64_t ranks) {
  try {
    check_parallel_config(c, int(ranks));
  } catch (const Error& e) {
    return {e.what()};
  }
  return {};
}

Topology topology_of(const Communicator& world) {
  Topology t = this_machine();
  t.ranks = world.size();
  if (std::string(world.backend()) == "single") return t;
  t.mpi_thread = thread_level_name(world.thread_level());
  t.backend = "mpi-" + t.mpi_thread;
  return t;
}

TargetCheck check_target(const Config& c, const Topology& t, bool training) {
  TargetCheck out;
  out.topology = t;
  out.capability = builtin_capability(t.backend);
  out.problems = mesh_problems(c, t.ranks);
  if (t.backend == "single-process" && t.ranks != 1)
    out.problems.push_back("backend single-process runs one rank (got ranks=" + std::to_string(t.ranks) +
                           ")");
  try {
    out.offload = resolve_offload(c.moe_offload_targets, out.capability, training, c.side_engine_threads);
  } catch (const Error& e) {
    out.problems.push_back(e.what());
  }
  out.warnings = out.offload.warnings;
  // Resources before work: one layer's step at batch_tokens over the ranks (its activations and the
  // distributed layer's buffers) must fit; config_problems already checked the weights alone.
  for (auto& p : memory_problems(c, t.ranks, /*train_stack=*/false, physical_memory_bytes()))
    out.problems.push_back(std::move(p));
  if (!out.offload.live.empty() && t.cores > 0 && c.side_engine_threads >= t.cores)
    out.warnings.push_back("side_engine_threads=" + std::to_string(c.side_engine_threads) + " takes all " +
                           std::to_string(t.cores) + " cores of a rank: the compute pool will share them");
  return out;
}

}  // namespace moe
