// The step trace (include/moe/trace.h). Also run under ThreadSanitizer.
#include "moe/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "moe/error.h"
#include "moe/side_engine.h"

namespace moe {
namespace {

using namespace std::chrono_literals;

TEST(StepTrace, NestedScopesRecordInnerFirstAndNest) {
  StepTrace trace(3);
  {
    TraceScope outer(&trace, "moe_layer", OpEngine::compute);
    std::this_thread::sleep_for(1ms);
    {
      TraceScope inner(&trace, "grouped_gemm", OpEngine::compute, 4096);
      std::this_thread::sleep_for(1ms);
    }
    std::this_thread::sleep_for(1ms);
  }
  auto ops = trace.ops();
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].name, "grouped_gemm");
  EXPECT_EQ(ops[1].name, "moe_layer");
  EXPECT_EQ(ops[0].bytes, 4096);
  EXPECT_EQ(ops[0].rank, 3);
  EXPECT_LE(ops[1].start_us, ops[0].start_us);
  EXPECT_GE(ops[1].end_us, ops[0].end_us);
  EXPECT_LT(ops[1].start_us, ops[1].end_us);
  EXPECT_EQ(trace.side_op_count(), 0);
}

TEST(StepTrace, NullTraceScopeIsANoOp) {
  TraceScope scope(nullptr, "nothing", OpEngine::side);
  scope.set_bytes(8);
}

TEST(StepTrace, RecordsFromComputeAndSideThreadsAndCountsSO) {
  StepTrace trace(0);
  {
    SideEngine side(2);
    std::vector<Event> events;
    for (int i = 0; i < 40; ++i)
      events.push_back(
          side.submit("all_to_all", [&trace] { TraceScope s(&trace, "all_to_all", OpEngine::side, 128); }));
    for (int i = 0; i < 25; ++i) TraceScope c(&trace, "gemm", OpEngine::compute);
    for (const Event& e : events) e.wait();
  }
  EXPECT_EQ(trace.ops().size(), 65u);
  EXPECT_EQ(trace.side_op_count(), 40);
  trace.restart();
  EXPECT_TRUE(trace.ops().empty());
  EXPECT_EQ(trace.side_op_count(), 0);
}

TEST(StepTrace, ChromeJsonIsWellFormed) {
  std::vector<TraceOp> ops = {{"router", OpEngine::compute, 0, 0, 10, 0},
                              {"all_to_all \"dispatch\"", OpEngine::side, 0, 5, 30, 1024},
                              {"router", OpEngine::compute, 1, 1, 9, 0}};
  auto doc = nlohmann::json::parse(chrome_trace_json(ops));
  const auto& events = doc.at("traceEvents");
  int complete = 0, thread_names = 0, process_names = 0;
  for (const auto& e : events) {
    std::string ph = e.at("ph");
    if (ph == "X") {
      ++complete;
      EXPECT_GE(e.at("dur").get<int64_t>(), 0);
      EXPECT_TRUE(e.contains("ts") && e.contains("pid") && e.contains("tid") && e.contains("name"));
    } else {
      ASSERT_EQ(ph, "M");
      std::string what = e.at("name");
      (what == "thread_name" ? thread_names : process_names)++;
    }
  }
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(thread_names, 3);  // rank 0 compute, rank 0 side, rank 1 compute
  EXPECT_EQ(process_names, 2);
  const auto& a2a = events[events.size() - 2];
  EXPECT_EQ(a2a.at("name"), "all_to_all \"dispatch\"");
  EXPECT_EQ(a2a.at("cat"), "side");
  EXPECT_EQ(a2a.at("tid"), 1);
  EXPECT_EQ(a2a.at("ts"), 5);
  EXPECT_EQ(a2a.at("dur"), 25);
  EXPECT_EQ(a2a.at("args").at("bytes"), 1024);
  EXPECT_EQ(events.back().at("pid"), 1);
}

TEST(StepTrace, EmptyTraceIsValidJson) {
  StepTrace trace;
  auto doc = nlohmann::json::parse(trace.to_chrome_json());
  EXPECT_TRUE(doc.at("traceEvents").empty());
}

TEST(StepTrace, CompareOpSequencesIgnoresTimesButNotNamesOrEngines) {
  std::vector<TraceOp> a = {{"router", OpEngine::compute, 0, 0, 5, 0},
                            {"sort", OpEngine::side, 0, 1, 2, 0},
                            {"gemm", OpEngine::compute, 0, 6, 9, 0}};
  std::vector<TraceOp> b = {{"sort", OpEngine::side, 0, 10, 20, 64},  // other times, other record order
                            {"router", OpEngine::compute, 0, 0, 7, 0},
                            {"gemm", OpEngine::compute, 0, 8, 30, 0}};
  EXPECT_EQ(compare_op_sequences(a, b), "");
  auto moved = b;
  moved[0].engine = OpEngine::compute;  // same name, other engine
  EXPECT_NE(compare_op_sequences(a, moved), "");
  auto renamed = b;
  renamed[2].name = "gemm_fused";
  EXPECT_NE(compare_op_sequences(a, renamed).find("'gemm' in the first trace and 'gemm_fused'"),
            std::string::npos)
      << compare_op_sequences(a, renamed);
  auto shorter = b;
  shorter.pop_back();
  EXPECT_NE(compare_op_sequences(a, shorter).find("<end>"), std::string::npos);
  auto other_rank = b;
  other_rank[1].rank = 1;
  EXPECT_NE(compare_op_sequences(a, other_rank), "");
}

TEST(StepTrace, SplitComputeTimeCountsNestedWaitsOnce) {
  // ffn [10, 50) holds a wait [20, 30); an all-gather [0, 10); a side op is ignored.
  std::vector<TraceOp> ops = {{"wait:AG:experts.wo", OpEngine::compute, 0, 20, 30, 0},
                              {"ffn[0]", OpEngine::compute, 0, 10, 50, 0},
                              {"AG:aux_stats", OpEngine::compute, 0, 0, 10, 64},
                              {"A2A:dispatch[0]", OpEngine::side, 0, 0, 100, 0},
                              {"combine[0]", OpEngine::compute, 0, 60, 65, 0}};
  ComputeSplit s = split_compute_time(ops);
  EXPECT_EQ(s.exposed_comm_us, 20);
  EXPECT_EQ(s.compute_us, 35);
  EXPECT_TRUE(is_exposed_comm("RS:dx[1]"));
  EXPECT_FALSE(is_exposed_comm("router"));
}

TEST(StepTrace, SerializedOpsRoundTripAndConcatenate) {
  std::vector<TraceOp> a = {{"router", OpEngine::compute, 0, 1, 2, 3}, {"A2A:x", OpEngine::side, 0, 4, 9, 1 << 20}};
  std::vector<TraceOp> b = {{"", OpEngine::side, 1, 0, 0, 0}};
  std::vector<TraceOp> got = parse_ops(serialize_ops(a) + serialize_ops(b));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[1].name, "A2A:x");
  EXPECT_EQ(got[1].engine, OpEngine::side);
  EXPECT_EQ(got[1].end_us, 9);
  EXPECT_EQ(got[1].bytes, 1 << 20);
  EXPECT_EQ(got[2].rank, 1);
  std::string cut = serialize_ops(a);
  cut.pop_back();
  EXPECT_THROW(parse_ops(cut), Error);
}

}  // namespace
}  // namespace moe
