#include "comm/machines.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "moe/error.h"

namespace moe {
namespace {

struct MachineRecord {
  uint64_t machine = 0, cores = 0;
};

// Every member's record, on every member (rank order).
std::vector<MachineRecord> gather_records(Communicator& comm) {
  MachineRecord mine{machine_id(), std::max<uint64_t>(1, std::thread::hardware_concurrency())};
  std::vector<MachineRecord> all(size_t(comm.size()));
  comm.gatherv(&mine, sizeof mine, all.data(), std::vector<size_t>(all.size(), sizeof mine), 0);
  comm.broadcast(all.data(), all.size() * sizeof(MachineRecord), 0);
  return all;
}

// MOE_POLITE_FROM_BYTES: -1 when unset, else its value (a non-negative integer).
long long polite_from_env() {
  const char* v = std::getenv("MOE_POLITE_FROM_BYTES");
  if (!v || !*v) return -1;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno != 0 || *end != '\0' || n < 0)
    fail(
        "MOE_POLITE_FROM_BYTES must be a non-negative integer (bytes; 0 turns polite waits for large "
        "transfers off), got '",
        v, "'");
  return n;
}

}  // namespace

std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

uint64_t machine_id() {
  std::string id = boot_id();
  if (id.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof host - 1) == 0) id = host;
  }
  return std::hash<std::string>{}(id);
}

size_t shared_core_polite_bytes(Communicator& comm) {
  if (std::string(comm.backend()) == "single" || comm.size() < 2) return 0;
  const long long env = polite_from_env();  // checked on every rank before the collectives
  const std::vector<MachineRecord> all = gather_records(comm);
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> machines;  // machine -> (ranks, cores)
  for (const MachineRecord& r : all) {
    auto& [ranks, cores] = machines[r.machine];
    ranks += 1;
    cores = std::max(cores, r.cores);
  }
  bool shared = false;
  for (const auto& [id, m] : machines) shared = shared || m.first > m.second;
  uint64_t from = 0;
  if (spans_hosts(comm)) from = env >= 0 ? uint64_t(env) : shared ? kSharedCorePoliteBytes : 0;
  comm.broadcast(&from, sizeof from, 0);  // rank 0's environment decides for all
  return size_t(from);
}

bool spans_hosts(Communicator& comm) {
  if (std::string(comm.backend()) == "single" || comm.size() < 2) return false;
  return comm.split_by_host(comm.rank())->size() < comm.size();
}

}  // namespace moe
