// `moe plan` through the binary: errors naming the bad item, a quick
// calibration writing a valid rates file, ranking and JSON.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "plan/rates.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

TEST(CliPlan, BadClusterNamesTheItem) {
  testing::TempDir dir;
  auto r = testing::run_moe("plan --rates x.json --case tiny --cluster hosts=2,inter_bw=10Gbps", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("inter_bw=10Gbps: unknown unit 'Gbps'"), std::string::npos) << r.err;
  r = testing::run_moe("plan --calibrate --tiny", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--calibrate needs --out"), std::string::npos) << r.err;
  r = testing::run_moe("plan --case tiny", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("needs --rates FILE"), std::string::npos) << r.err;
}

TEST(CliPlan, CalibrateTinyThenPlan) {
  testing::TempDir dir;
  const std::string rates = dir.file("rates.json");
  auto r = testing::run_moe("plan --calibrate --tiny --out " + rates, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const plan::Rates parsed = plan::read_rates(rates);  // throws on a bad file
  EXPECT_FALSE(parsed.gemm.empty());
  EXPECT_GT(parsed.memcpy_gbps, 0);
  // Rank the layouts of 2 hosts x 2 ranks; the winner is explained; JSON has every candidate.
  r = testing::run_moe(
      "plan --rates " + rates +
          " --case tiny --cluster hosts=2,cores=2,ranks_per_host=2,inter_bw=1Gbit,inter_lat=50us --json " +
          dir.file("p.json"),
      dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("wins: step"), std::string::npos) << r.out;
  nlohmann::json doc = nlohmann::json::parse(testing::read_bytes(dir.file("p.json")));
  ASSERT_GT(doc.at("ranked").size(), 1u);
  EXPECT_TRUE(doc.at("ranked")[0].contains("ops"));
  EXPECT_LE(doc.at("ranked")[0].at("step_ms").get<double>(), doc.at("ranked")[1].at("step_ms").get<double>());
  // A fixed layout: a moe bench --dist variant.
  r = testing::run_moe("plan --rates " + rates +
                           " --bench-variant baseline_ep4 --tokens 16 emb_dim=64 moe_mlp_dim=32 "
                           "--cluster cores=2,ranks_per_host=4",
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("d1 f1 e4 c1 +none flat"), std::string::npos) << r.out;
  // A config's own layout, checked against the described cluster (not this process's world).
  r = testing::run_moe("plan --rates " + rates + " --config " + std::string(MOE_SOURCE_DIR) +
                           "/examples/small.yaml expert_parallelism=2 --layout-from-config --tokens 32 "
                           "--cluster cores=2,ranks_per_host=2",
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("d1 f1 e2 c1 +none flat"), std::string::npos) << r.out;
  // A variant whose mesh does not match the cluster: an error naming both.
  r = testing::run_moe(
      "plan --rates " + rates + " --bench-variant baseline_ep4 --cluster cores=2,ranks_per_host=2",
      dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("data*fsdp*expert=4 but the cluster has 2 ranks"), std::string::npos) << r.err;
}

// The paired speed probe: the calibration runs it around its rates, `moe bench --dist --speed-probe`
// around each variant, and `moe plan --probe-ms` predicts at the measured run's speed.
TEST(CliPlan, PairedSpeedProbe) {
  testing::TempDir dir;
  const std::string rates = dir.file("rates.json");
  auto r = testing::run_moe("plan --calibrate --tiny --out " + rates, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("speed probe: "), std::string::npos) << r.out;
  const double cal = plan::read_rates(rates).probe_ms;
  ASSERT_GT(cal, 0);
  r = testing::run_moe("bench --dist --variant compute_only_ep2_chunks4 --iters 1 --warmup 0 --tokens 16 "
                       "emb_dim=64 moe_mlp_dim=32 --speed-probe 2 --json " + dir.file("m.json"),
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const nlohmann::json row = nlohmann::json::parse(testing::read_bytes(dir.file("m.json"))).at("dist_results")[0];
  const double before = row.at("speed_probe_before_ms").get<double>(), after = row.at("speed_probe_after_ms").get<double>();
  EXPECT_GT(before, 0);
  EXPECT_GT(after, 0);
  EXPECT_DOUBLE_EQ(row.at("speed_probe_ms").get<double>(), (before + after) / 2);
  // Without --speed-probe the row has no probe fields.
  r = testing::run_moe("bench --dist --variant compute_only_ep2_chunks4 --iters 1 --warmup 0 --tokens 16 "
                       "emb_dim=64 moe_mlp_dim=32 --json " + dir.file("n.json"),
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_FALSE(nlohmann::json::parse(testing::read_bytes(dir.file("n.json")))
                   .at("dist_results")[0]
                   .contains("speed_probe_ms"));
  // A probe twice the calibration's: the one-rank step (no collectives) takes twice as long.
  const std::string plan = "plan --rates " + rates + " --bench-variant compute_only_ep2_chunks4 --tokens 16 " +
                           "emb_dim=64 moe_mlp_dim=32 --cluster cores=1,ranks_per_host=1 --json ";
  r = testing::run_moe(plan + dir.file("p0.json"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  r = testing::run_moe(plan + dir.file("p2.json") + " --probe-ms " + std::to_string(2 * cal), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("paired speed probe: "), std::string::npos) << r.out;
  const auto step = [&](const std::string& f) {
    return nlohmann::json::parse(testing::read_bytes(dir.file(f))).at("ranked")[0].at("step_ms").get<double>();
  };
  EXPECT_NEAR(step("p2.json"), 2 * step("p0.json"), 1e-6 * step("p0.json"));
  // Bad values, and rates from before the probe: errors that say what to do.
  r = testing::run_moe(plan + dir.file("p3.json") + " --probe-ms -1", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--probe-ms must be > 0 (got -1)"), std::string::npos) << r.err;
  nlohmann::json old = nlohmann::json::parse(testing::read_bytes(rates));
  old.erase("speed_probe_ms");
  testing::write_bytes(dir.file("old.json"), old.dump());
  r = testing::run_moe("plan --rates " + dir.file("old.json") +
                           " --bench-variant compute_only_ep2_chunks4 --tokens 16 emb_dim=64 moe_mlp_dim=32 "
                           "--cluster cores=1,ranks_per_host=1 --probe-ms 5",
                       dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--probe-ms: " + dir.file("old.json") + " has no speed_probe_ms"), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace moe
