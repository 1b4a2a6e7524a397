// `moe bench --scenario` (src/bench/real_use.h) on the tiny case: the phases,
// the T range of the changing steps, the fresh-process half of `sequential`
// and the 1.25 T baseline of `changing-t` (the moe binary re-executed), the
// JSON fields, and the errors.
#include "bench/real_use.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "moe/error.h"

namespace moe::bench {
namespace {

RealUseOptions tiny(const std::string& scenario) {
  RealUseOptions o;
  o.scenario = scenario;
  o.cases = {"tiny"};
  o.steps = 3;
  o.warmup = 1;
  o.self_exe = MOE_BINARY;
  return o;
}

TEST(RealUse, ChangingTRunsAFixedThenAChangingPhaseThenTheBaselineAtTmax) {
  RealUseReport r = run_real_use(tiny("changing-t"));
  ASSERT_EQ(r.rows.size(), 3u);
  EXPECT_EQ(r.rows[2].phase, "fixed-tmax");  // a fresh process at 1.25 T: the RSS baseline
  EXPECT_EQ(r.rows[2].T_min, 80);
  EXPECT_EQ(r.rows[2].T_max, 80);
  EXPECT_GT(r.rows[2].peak_rss_mib, 0);
  EXPECT_EQ(r.rows[0].phase, "fixed-t");
  EXPECT_EQ(r.rows[0].T_min, 64);
  EXPECT_EQ(r.rows[0].T_max, 64);
  EXPECT_EQ(r.rows[1].phase, "changing-t");
  EXPECT_GE(r.rows[1].T_min, 48);
  EXPECT_LE(r.rows[1].T_max, 80);
  for (const RealUseRow& row : r.rows) {
    EXPECT_EQ(row.steps, 3);  // the baseline runs min(steps, 3)
    EXPECT_GT(row.flops, 0);
    EXPECT_GT(row.gflops, 0);
    EXPECT_GT(row.peak_rss_mib, 0);
  }
  ASSERT_EQ(r.summary.size(), 4u);
  EXPECT_EQ(r.summary[0].name, "tiny: changing_over_fixed_gflops");
  EXPECT_EQ(r.summary[1].name, "tiny: peak_rss_changing_over_fixed_at_tmax");
  EXPECT_TRUE(r.summary[2].info);
  nlohmann::json j = nlohmann::json::parse(real_use_json(r));
  EXPECT_EQ(j["scenario"], "changing-t");
  for (const char* key : {"gflops", "sys_share", "minflt_per_step", "peak_rss_mib", "rss_mib", "alloc_hits",
                          "alloc_partial", "alloc_misses", "alloc_evictions"})
    EXPECT_TRUE(j["rows"][1].contains(key)) << key;
  EXPECT_NE(format_real_use(r).find("changing-t"), std::string::npos);
}

TEST(RealUse, SequentialComparesOneProcessWithFreshProcesses) {
  RealUseOptions o = tiny("sequential");
  o.cases = {"tiny", "k2"};
  o.steps = 2;
  RealUseReport r = run_real_use(o);
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[0].phase, "one-process");
  EXPECT_EQ(r.rows[1].phase, "fresh-process");
  EXPECT_EQ(r.rows[1].case_name, "tiny");
  EXPECT_EQ(r.rows[1].steps, 2);
  EXPECT_GT(r.rows[1].flops, 0);
  EXPECT_EQ(r.rows[3].case_name, "k2");
}

TEST(RealUse, AccumulateKeepsGradientsOverTwoMicroBatches) {
  RealUseReport r = run_real_use(tiny("accumulate"));
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[1].phase, "accumulate");
  EXPECT_DOUBLE_EQ(r.rows[1].flops, 2 * r.rows[0].flops);  // two micro-batches per step
}

TEST(RealUse, BadArgumentsAreNamed) {
  RealUseOptions o = tiny("sideways");
  EXPECT_THROW(run_real_use(o), Error);
  o = tiny("changing-t");
  o.overrides = {"Q=3"};
  try {
    run_real_use(o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q=3"), std::string::npos) << e.what();
  }
  o.overrides = {"K=100"};
  EXPECT_THROW(run_real_use(o), Error);
  o = tiny("changing-t");
  o.steps = 0;
  EXPECT_THROW(run_real_use(o), Error);
}

}  // namespace
}  // namespace moe::bench
