// `moe bench` through the binary: the JSON of SPEC.md §7, PASS checks, errors;
// and the report helpers in-process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "bench/harness.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

TEST(CliBench, TinyWritesTheContractedJson) {
  testing::TempDir dir;
  auto r = testing::run_moe("bench --case tiny --iters 2 --json " + dir.file("b.json"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
  nlohmann::json doc = nlohmann::json::parse(testing::read_bytes(dir.file("b.json")));
  const auto& rows = doc.at("results");
  ASSERT_EQ(rows.size(), 6u);  // reference, fused, split x fwd, fwd+bwd
  std::set<std::string> variants;
  for (const auto& row : rows) {
    for (const char* key : {"median_ms", "min_ms", "max_ms", "gflops", "dense_gflops", "fraction_of_dense",
                            "peak_rss_mib", "peak_alloc_mib", "permute_gbps", "combine_gbps", "memcpy_gbps",
                            "permute_fraction_of_memcpy", "combine_fraction_of_memcpy"}) {
      ASSERT_TRUE(row.contains(key) && row.at(key).is_number()) << key << "\n" << row.dump();
      EXPECT_GE(row.at(key).get<double>(), 0.0) << key;
    }
    EXPECT_EQ(row.at("case"), "tiny");
    EXPECT_EQ(row.at("dtype"), "bf16");
    EXPECT_TRUE(row.at("pass") == "fwd" || row.at("pass") == "fwd+bwd") << row.dump();
    EXPECT_LE(row.at("min_ms").get<double>(), row.at("median_ms").get<double>());
    EXPECT_LE(row.at("median_ms").get<double>(), row.at("max_ms").get<double>());
    EXPECT_GT(row.at("gflops").get<double>(), 0.0);
    EXPECT_GT(row.at("peak_alloc_mib").get<double>(), 0.0);
    EXPECT_EQ(row.at("iters"), 2);
    std::string v = row.at("variant");
    variants.insert(v);
    EXPECT_EQ(row.at("check"), v == "reference" ? "ref" : "PASS") << v;
  }
  EXPECT_EQ(variants, (std::set<std::string>{"reference", "fused", "split"}));
  // FLOPs: forward = 6*R*D*F + 2*T*D*E, forward+backward = 3x.
  const double fwd = 6.0 * 128 * 64 * 32 + 2.0 * 64 * 64 * 8;
  EXPECT_EQ(rows[0].at("flops").get<double>(), fwd);
  EXPECT_EQ(rows[1].at("flops").get<double>(), 3 * fwd);
}

TEST(CliBench, BadArgumentsAreErrors) {
  testing::TempDir dir;
  auto r = testing::run_moe("bench --case nosuch --iters 1", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown case 'nosuch'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("median_ms"), std::string::npos) << "no table header before an argument error: " << r.out;
  // An output file in a directory that does not exist: refused before anything runs.
  r = testing::run_moe("bench --case tiny --iters 1 --json no/such/dir/out.json", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--json no/such/dir/out.json: directory 'no/such/dir' does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("tiny"), std::string::npos) << "ran before failing: " << r.out;
  r = testing::run_moe("bench --case tiny --iters 0", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--iters"), std::string::npos) << r.err;
  EXPECT_NE(testing::run_moe("bench --dtype f16", dir.path()).exit_code, 0);
  r = testing::run_moe("bench --list", dir.path());
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("seed-mixtral"), std::string::npos);
}

TEST(BenchReport, FailRowsAreReported) {
  bench::BenchResult ok, bad;
  ok.case_name = bad.case_name = "tiny";
  ok.check = "PASS";
  bad.check = "FAIL";
  bad.check_detail = "y differs vs reference";
  EXPECT_TRUE(bench::all_checks_passed({ok}));
  EXPECT_FALSE(bench::all_checks_passed({ok, bad}));
  EXPECT_NE(bench::format_table_row(bad).find("FAIL: y differs vs reference"), std::string::npos);
  auto doc = nlohmann::json::parse(bench::results_json({ok, bad}));
  EXPECT_EQ(doc.at("results").at(1).at("check_detail"), "y differs vs reference");
  EXPECT_EQ(doc.at("results").at(0).begin().key(), "case");  // SPEC.md §7 fields first
}

}  // namespace
}  // namespace moe
