// The step trace and its Chrome trace JSON export (include/moe/trace.h;
// format in docs/offload.md).
#include "moe/trace.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "moe/error.h"

namespace moe {

const char* op_engine_name(OpEngine e) { return e == OpEngine::side ? "side" : "compute"; }

StepTrace::StepTrace(int rank) : rank_(rank), start_(std::chrono::steady_clock::now()) {}

void StepTrace::restart() {
  std::lock_guard<std::mutex> lk(mu_);
  ops_.clear();
  start_ = std::chrono::steady_clock::now();
}

int64_t StepTrace::now_us() const {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  return std::chrono::duration_cast<std::chrono::microseconds>(now - start_).count();
}

void StepTrace::record(std::string name, OpEngine engine, int64_t start_us, int64_t end_us, int64_t bytes) {
  MOE_ASSERT(start_us <= end_us, "trace op '" + name + "' ends before it starts");
  TraceOp op{std::move(name), engine, rank_, start_us, end_us, bytes};
  std::lock_guard<std::mutex> lk(mu_);
  ops_.push_back(std::move(op));
}

std::vector<TraceOp> StepTrace::ops() const {
  std::lock_guard<std::mutex> lk(mu_);
  return ops_;
}

int64_t StepTrace::side_op_count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return std::count_if(ops_.begin(), ops_.end(),
                       [](const TraceOp& op) { return op.engine == OpEngine::side; });
}

std::string StepTrace::to_chrome_json() const { return chrome_trace_json(ops()); }

TraceScope::TraceScope(StepTrace* trace, std::string name, OpEngine engine, int64_t bytes)
    : trace_(trace), name_(std::move(name)), engine_(engine), bytes_(bytes) {
  if (trace_) start_us_ = trace_->now_us();
}

TraceScope::~TraceScope() {
  if (trace_) trace_->record(std::move(name_), engine_, start_us_, trace_->now_us(), bytes_);
}

namespace {

int track_tid(OpEngine e) { return e == OpEngine::side ? 1 : 0; }

nlohmann::json metadata(const char* what, int pid, int tid, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

std::string chrome_trace_json(const std::vector<TraceOp>& ops) {
  nlohmann::json events = nlohmann::json::array();
  std::set<int> ranks;
  std::set<std::pair<int, OpEngine>> tracks;
  for (const TraceOp& op : ops) {
    ranks.insert(op.rank);
    tracks.insert({op.rank, op.engine});
  }
  for (int r : ranks) events.push_back(metadata("process_name", r, 0, "rank " + std::to_string(r)));
  for (const auto& [r, e] : tracks)
    events.push_back(metadata("thread_name", r, track_tid(e), op_engine_name(e)));
  for (const TraceOp& op : ops)
    events.push_back({{"name", op.name},
                      {"cat", op_engine_name(op.engine)},
                      {"ph", "X"},
                      {"ts", op.start_us},
                      {"dur", op.end_us - op.start_us},
                      {"pid", op.rank},
                      {"tid", track_tid(op.engine)},
                      {"args", {{"bytes", op.bytes}}}});
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  return doc.dump(1) + "\n";
}

namespace {

using Track = std::pair<int, OpEngine>;

// Op names per track, in start order (stable: ties keep record order).
std::map<Track, std::vector<std::string>> sequences(const std::vector<TraceOp>& ops) {
  std::vector<const TraceOp*> sorted;
  for (const TraceOp& op : ops) sorted.push_back(&op);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const TraceOp* a, const TraceOp* b) { return a->start_us < b->start_us; });
  std::map<Track, std::vector<std::string>> out;
  for (const TraceOp* op : sorted) out[{op->rank, op->engine}].push_back(op->name);
  return out;
}

std::string track_name(const Track& t) {
  return "rank " + std::to_string(t.first) + " " + op_engine_name(t.second);
}

// First difference between two name lists of one track, "" if equal.
std::string compare_track(const Track& t, const std::vector<std::string>& a,
                          const std::vector<std::string>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string na = i < a.size() ? a[i] : "<end>", nb = i < b.size() ? b[i] : "<end>";
    if (na != nb) {
      std::ostringstream os;
      os << track_name(t) << ": op " << i << " is '" << na << "' in the first trace and '" << nb
         << "' in the second (" << a.size() << " vs " << b.size() << " ops)";
      return os.str();
    }
  }
  return "";
}

}  // namespace

std::string compare_op_sequences(const std::vector<TraceOp>& a, const std::vector<TraceOp>& b) {
  auto sa = sequences(a), sb = sequences(b);
  static const std::vector<std::string> kNone;
  std::set<Track> tracks;
  for (const auto& kv : sa) tracks.insert(kv.first);
  for (const auto& kv : sb) tracks.insert(kv.first);
  for (const Track& t : tracks) {
    auto ia = sa.find(t), ib = sb.find(t);
    std::string diff =
        compare_track(t, ia == sa.end() ? kNone : ia->second, ib == sb.end() ? kNone : ib->second);
    if (!diff.empty()) return diff;
  }
  return "";
}

bool is_exposed_comm(const std::string& n) {
  for (const char* p : {"AG:", "A2A:", "RS:", "AR:", "wait:"})
    if (n.rfind(p, 0) == 0) return true;
  return false;
}

namespace {

// Total length of the union of [start, end) intervals.
int64_t union_us(std::vector<std::pair<int64_t, int64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  int64_t total = 0, cur_b = 0, cur_e = -1;
  for (const auto& [b, e] : iv) {
    if (b > cur_e) {
      if (cur_e > cur_b) total += cur_e - cur_b;
      cur_b = b, cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (cur_e > cur_b) total += cur_e - cur_b;
  return total;
}

}  // namespace

ComputeSplit split_compute_time(const std::vector<TraceOp>& ops) {
  std::vector<std::pair<int64_t, int64_t>> comm, all;
  for (const TraceOp& op : ops) {
    if (op.engine != OpEngine::compute) continue;
    all.push_back({op.start_us, op.end_us});
    if (is_exposed_comm(op.name)) comm.push_back({op.start_us, op.end_us});
  }
  ComputeSplit s;
  s.exposed_comm_us = union_us(std::move(comm));
  s.compute_us = std::max<int64_t>(union_us(std::move(all)) - s.exposed_comm_us, 0);
  return s;
}

namespace {

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <class T>
T take(const std::string& in, size_t& pos) {
  if (pos + sizeof(T) > in.size()) fail("trace records: truncated at byte ", pos, " of ", in.size());
  T v;
  std::memcpy(&v, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

}  // namespace

std::string serialize_ops(const std::vector<TraceOp>& ops) {
  std::string out;
  for (const TraceOp& op : ops) {
    put(out, uint32_t(op.name.size()));
    out += op.name;
    put(out, int32_t(op.engine));
    put(out, int32_t(op.rank));
    put(out, op.start_us);
    put(out, op.end_us);
    put(out, op.bytes);
  }
  return out;
}

std::vector<TraceOp> parse_ops(const std::string& in) {
  std::vector<TraceOp> ops;
  size_t pos = 0;
  while (pos < in.size()) {
    TraceOp op;
    const uint32_t n = take<uint32_t>(in, pos);
    if (pos + n > in.size()) fail("trace records: truncated name at byte ", pos);
    op.name = in.substr(pos, n);
    pos += n;
    op.engine = take<int32_t>(in, pos) == int32_t(OpEngine::side) ? OpEngine::side : OpEngine::compute;
    op.rank = take<int32_t>(in, pos);
    op.start_us = take<int64_t>(in, pos);
    op.end_us = take<int64_t>(in, pos);
    op.bytes = take<int64_t>(in, pos);
    ops.push_back(std::move(op));
  }
  return ops;
}

}  // namespace moe
