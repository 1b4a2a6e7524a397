// The step trace (SPEC.md §1, §6): every op of a step with the engine that
// ran it ("compute" pool or "side" engine), its rank, start and end in µs
// since the step started (steady clock), and the bytes it moved. SO, the
// count of side-engine ops, is the CPU counterpart of the seed's count of
// `sparseoffload` annotations. The trace exports to Chrome trace JSON for
// Perfetto / chrome://tracing; the format is written down in docs/offload.md.
//
// Thread safety: StepTrace::record (and so TraceScope) may be called from
// any threads concurrently (the compute thread and side-engine workers);
// ops are kept in the order their records landed. restart() and the readers
// (ops, side_op_count, to_chrome_json) may run concurrently with record but
// then see some prefix of the records; call them after the step joined.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace moe {

enum class OpEngine { compute, side };
const char* op_engine_name(OpEngine e);  // "compute" | "side"

struct TraceOp {
  std::string name;
  OpEngine engine = OpEngine::compute;
  int rank = 0;
  int64_t start_us = 0;  // since the step start
  int64_t end_us = 0;    // >= start_us
  int64_t bytes = 0;     // payload moved (0 for pure compute)
};

class StepTrace {
 public:
  // The step clock starts now.
  explicit StepTrace(int rank = 0);

  int rank() const { return rank_; }
  // Drops every op and restarts the step clock.
  void restart();
  // µs since the step start.
  int64_t now_us() const;

  // REQUIRES: start_us <= end_us.
  void record(std::string name, OpEngine engine, int64_t start_us, int64_t end_us, int64_t bytes = 0);

  std::vector<TraceOp> ops() const;  // a copy, in record order
  int64_t side_op_count() const;     // SO
  // {"traceEvents": [...]} of this rank's ops (see chrome_trace_json).
  std::string to_chrome_json() const;

 private:
  const int rank_;
  mutable std::mutex mu_;
  std::chrono::steady_clock::time_point start_;  // GUARDED_BY(mu_)
  std::vector<TraceOp> ops_;                     // GUARDED_BY(mu_)
};

// Times a region and records it when it ends (nesting is fine: inner scopes
// record first). A null trace makes it a no-op, so call sites need no branch.
class TraceScope {
 public:
  TraceScope(StepTrace* trace, std::string name, OpEngine engine, int64_t bytes = 0);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  void set_bytes(int64_t bytes) { bytes_ = bytes; }

 private:
  StepTrace* trace_;
  std::string name_;
  OpEngine engine_;
  int64_t bytes_;
  int64_t start_us_ = 0;
};

// Chrome trace JSON of ops from any ranks (e.g. gathered on rank 0): one
// complete ("ph": "X") event per op with pid = rank and tid = 0 (compute) or
// 1 (side), plus process_name / thread_name metadata ("ph": "M") for each
// track used, so Perfetto shows one track per engine per rank.
std::string chrome_trace_json(const std::vector<TraceOp>& ops);

// Compares the op sequences of two traces ignoring times and bytes: per
// (rank, engine) track, the names in start order (ties: record order) must
// be equal. Returns "" when they are, else the first difference in words.
// Concurrent ops of a side engine with several threads may start in either
// order: compare traces taken with side_engine_threads = 1.
std::string compare_op_sequences(const std::vector<TraceOp>& a, const std::vector<TraceOp>& b);

// Where the compute thread of one rank spent a step (`moe bench --dist`):
// exposed_comm_us = the union of the compute-engine ops named "AG:", "A2A:",
// "RS:", "AR:" or "wait:" (the compute thread blocked on communication);
// compute_us = the union of every other compute-engine op, less the exposed
// time nested inside it (the FFN waits for its weights inside "ffn[c]").
// Unions, so nested scopes count once. Side-engine ops are not counted.
struct ComputeSplit {
  int64_t exposed_comm_us = 0, compute_us = 0;
};
bool is_exposed_comm(const std::string& op_name);
ComputeSplit split_compute_time(const std::vector<TraceOp>& ops);

// Flat little-endian records (per op: u32 name length, name, i32 engine,
// i32 rank, i64 start, end, bytes), so ranks can send their ops to rank 0
// with a gatherv. parse_ops reads a concatenation of such buffers; a
// truncated buffer is an error.
std::string serialize_ops(const std::vector<TraceOp>& ops);
std::vector<TraceOp> parse_ops(const std::string& bytes);

}  // namespace moe
