#include <sstream>

#include "moe/comm.h"
#include "moe/error.h"

namespace moe {

const char* coll_kind_name(CollKind k) {
  switch (k) {
    case CollKind::AR: return "AR";
    case CollKind::AG: return "AG";
    case CollKind::A2A: return "A2A";
    case CollKind::RS: return "RS";
    case CollKind::SO: return "SO";
  }
  MOE_ASSERT(false, "coll_kind_name: unknown kind");
  return "";
}

const char* thread_level_name(ThreadLevel t) {
  switch (t) {
    case ThreadLevel::single: return "single";
    case ThreadLevel::funneled: return "funneled";
    case ThreadLevel::serialized: return "serialized";
    case ThreadLevel::multiple: return "multiple";
  }
  MOE_ASSERT(false, "thread_level_name: unknown level");
  return "";
}

namespace {
thread_local int64_t t_bytes = 0;
}  // namespace

void CommCounters::add(CollKind k, int64_t bytes) {
  count_[size_t(k)].fetch_add(1, std::memory_order_relaxed);
  bytes_[size_t(k)].fetch_add(bytes, std::memory_order_relaxed);
  t_bytes += bytes;
}

int64_t CommCounters::thread_bytes() { return t_bytes; }

CollStat CommCounters::get(CollKind k) const {
  return CollStat{count_[size_t(k)].load(std::memory_order_relaxed),
                  bytes_[size_t(k)].load(std::memory_order_relaxed)};
}

void CommCounters::reset() {
  for (int i = 0; i < kNumCollKinds; ++i) {
    count_[size_t(i)].store(0, std::memory_order_relaxed);
    bytes_[size_t(i)].store(0, std::memory_order_relaxed);
  }
}

std::string CommCounters::summary() const {
  std::ostringstream os;
  for (int i = 0; i < kNumCollKinds; ++i) {
    CollStat s = get(CollKind(i));
    os << (i ? ", " : "") << coll_kind_name(CollKind(i)) << ' ' << s.count << " (" << s.bytes << " B)";
  }
  return os.str();
}

}  // namespace moe
