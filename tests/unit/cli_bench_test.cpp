// `moe bench` through the binary: the JSON of SPEC.md §7, PASS checks, errors;
// and the report helpers in-process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "bench/dense_baseline.h"
#include "bench/harness.h"
#include "moe/isa.h"
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
    ASSERT_TRUE(row.contains("retimed") && row.at("retimed").is_number_integer()) << row.dump();
    EXPECT_LE(row.at("retimed").get<int>(), bench::kRetimes);
    ASSERT_TRUE(row.contains("dense_slow_phase") && row.at("dense_slow_phase").is_boolean()) << row.dump();
    std::string v = row.at("variant");
    variants.insert(v);
    EXPECT_EQ(row.at("check"), v == "reference" ? "ref" : "PASS") << v;
  }
  EXPECT_EQ(variants, (std::set<std::string>{"reference", "fused", "split"}));
  // The dense baseline is timed beside each variant's steps: a variant's fwd and fwd+bwd rows
  // (the same steps) divide by the same dense rate, and the fraction is exactly that quotient.
  for (size_t i = 0; i + 1 < rows.size(); i += 2) {
    ASSERT_EQ(rows[i].at("variant"), rows[i + 1].at("variant"));
    EXPECT_EQ(rows[i].at("pass"), "fwd");
    EXPECT_EQ(rows[i].at("dense_gflops").get<double>(), rows[i + 1].at("dense_gflops").get<double>());
    for (const auto* row : {&rows[i], &rows[i + 1]})
      EXPECT_DOUBLE_EQ(row->at("fraction_of_dense").get<double>(),
                       row->at("gflops").get<double>() / row->at("dense_gflops").get<double>());
  }
  // The setup beside the rows: the kernel level and the dense baseline that ran.
  EXPECT_EQ(doc.at("isa"), isa_name(active_isa()));
  EXPECT_EQ(doc.at("isa_available").size(), isa_available().size());
  const auto& dense = doc.at("dense_baseline");
  for (const char* key : {"impl", "dtype", "why"})
    EXPECT_TRUE(dense.at(key).is_string()) << key << dense.dump();
  EXPECT_FALSE(dense.at("why").get<std::string>().empty());
#ifdef MOE_HAVE_ONEDNN
  EXPECT_EQ(dense.at("impl"), "onednn");
  EXPECT_EQ(dense.at("dtype"),
            active_isa() == Isa::avx512_bf16 || active_isa() == Isa::amx_bf16 ? "bf16" : "f32")
      << dense.dump();
#else
  EXPECT_EQ(dense.at("impl"), "grouped_gemm");
  EXPECT_NE(dense.at("why").get<std::string>().find("oneDNN is not compiled in"), std::string::npos);
#endif
  for (const auto& row : rows) {
    EXPECT_EQ(row.at("dense_dtype"), dense.at("dtype"));
    EXPECT_EQ(row.at("dense_impl"), dense.at("impl"));
  }
  const std::string setup = std::string("kernel level: ") + isa_name(active_isa()) +
                            " (available: " + isa_list(isa_available()) + "); dense baseline: ";
  EXPECT_EQ(r.out.rfind(setup, 0), 0u) << "the setup line comes first:\n" << r.out;
  // FLOPs: forward = 6*R*D*F + 2*T*D*E, forward+backward = 3x.
  const double fwd = 6.0 * 128 * 64 * 32 + 2.0 * 64 * 64 * 8;
  EXPECT_EQ(rows[0].at("flops").get<double>(), fwd);
  EXPECT_EQ(rows[1].at("flops").get<double>(), 3 * fwd);
}

// A variant is timed again when the median of its paired dense runs is more than kSlowPhase times
// the case's reference (harness.h): the median, not one slow run, decides.
TEST(BenchSlowPhase, TheMedianOfThePairedDenseRunsDecides) {
  EXPECT_FALSE(bench::slow_phase({10, 10, 10}, 10));
  EXPECT_FALSE(bench::slow_phase({10, 30, 12.5}, 10));  // one slow run; the median 12.5 is at the bound
  EXPECT_TRUE(bench::slow_phase({12.6, 30, 13}, 10));
  EXPECT_TRUE(bench::slow_phase({20, 21, 19}, 10));  // oneDNN at half rate
  EXPECT_FALSE(bench::slow_phase({}, 10));           // nothing timed
  EXPECT_FALSE(bench::slow_phase({20}, 0));          // no reference
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
  r = testing::run_moe("bench --case tiny X=4 --iters 1", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("moe bench: override 'X=4' is not one of T=, D=, F=, E=, K="), std::string::npos) << r.err;
}

// `--case NAME T=16`: the case runs at the overridden shape (one name per --case; the rest are overrides).
TEST(CliBench, ShapeOverrideChangesTheCase) {
  testing::TempDir dir;
  auto r = testing::run_moe("bench --case tiny T=16 --iters 1 --warmup 0 --json " + dir.file("out.json"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto doc = nlohmann::json::parse(testing::read_bytes(dir.file("out.json")));
  ASSERT_FALSE(doc.at("results").empty());
  for (const auto& row : doc.at("results")) {
    EXPECT_EQ(row.at("case"), "tiny");
    EXPECT_EQ(row.at("shape").at("T"), 16) << row.dump();
    EXPECT_NE(row.at("check"), "FAIL") << row.dump();
  }
}

// The baseline computes in the dtype the kernel level computes in: bf16 only at the levels with a
// bf16 dot product (avx512_bf16, amx_bf16, neon_bf16).
TEST(BenchDenseBaseline, DtypeFollowsTheKernelLevel) {
  for (Isa level : isa_available()) {
    ScopedIsa scoped(level);
    std::string why;
    EXPECT_EQ(dense_compute_dtype(DType::f32, why), DType::f32) << isa_name(level);
    const DType bf16_layer = dense_compute_dtype(DType::bf16, why);
    const bool native = level == Isa::avx512_bf16 || level == Isa::amx_bf16 || level == Isa::neon_bf16;
    EXPECT_EQ(bf16_layer, native ? DType::bf16 : DType::f32) << isa_name(level);
    EXPECT_NE(why.find(isa_name(level)), std::string::npos) << why;
    DenseRate rate = dense_matmul_rate(32, 16, 24, DType::bf16, 1);
    EXPECT_GT(rate.gflops, 0.0);
    // The runner `moe bench` times beside each step: built once, run again and again.
    DenseRunner runner(32, 16, 24, DType::bf16);
    for (int i = 0; i < 3; ++i) EXPECT_GE(runner.run_ms(), 0.0);
    EXPECT_EQ(runner.flops(), 2.0 * 32 * 16 * 24);
    EXPECT_DOUBLE_EQ(runner.gflops(2.0), runner.flops() / 2e6);
    EXPECT_EQ(runner.baseline().impl, rate.baseline.impl);
    EXPECT_EQ(runner.baseline().dtype, rate.baseline.dtype);
#ifdef MOE_HAVE_ONEDNN
    if (bf16_layer == DType::f32) EXPECT_EQ(rate.baseline.dtype, DType::f32) << rate.baseline.why;
    EXPECT_EQ(dense_baseline_name(rate.baseline),
              std::string("oneDNN ") + dtype_name(rate.baseline.dtype) + " matmul");
#else
    EXPECT_EQ(rate.baseline.impl, "grouped_gemm");
#endif
  }
}

// The dense baseline runs between the layer's timed steps: with OpenMP workers that spin for ever
// (OMP_WAIT_POLICY=active) the comparison is biased, and the bench says so; with PASSIVE it does not.
TEST(CliBench, SpinningOpenmpWorkersAreNamed) {
#ifndef MOE_HAVE_ONEDNN
  GTEST_SKIP() << "the fallback baseline runs on the engine's own pool (no OpenMP)";
#endif
  testing::TempDir dir;
  auto active = testing::run_moe("bench --case tiny --iters 1 --warmup 0", dir.path(), "OMP_WAIT_POLICY=active");
  ASSERT_EQ(active.exit_code, 0) << active.err;
  EXPECT_NE(active.err.find("moe: warning: bench: OMP_WAIT_POLICY=ACTIVE"), std::string::npos) << active.err;
  auto passive = testing::run_moe("bench --case tiny --iters 1 --warmup 0", dir.path(), "OMP_WAIT_POLICY=PASSIVE");
  ASSERT_EQ(passive.exit_code, 0) << passive.err;
  EXPECT_EQ(passive.err.find("warning"), std::string::npos) << passive.err;
}

// A bf16 bench where our level widens bf16 (MOE_GEMM_ISA=avx2): an f32 baseline, exit 0.
TEST(CliBench, Avx2LevelHasAnF32Baseline) {
  if (!isa_supported(Isa::avx2)) GTEST_SKIP() << "no avx2 level here: " << isa_list(isa_available());
  testing::TempDir dir;
  auto r = testing::run_moe("bench --case tiny --iters 1 --dtype bf16 --json " + dir.file("b.json"),
                            dir.path(), "MOE_GEMM_ISA=avx2");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  nlohmann::json doc = nlohmann::json::parse(testing::read_bytes(dir.file("b.json")));
  EXPECT_EQ(doc.at("isa"), "avx2");
  EXPECT_NE(r.out.find("kernel level: avx2 "), std::string::npos) << r.out;
#ifdef MOE_HAVE_ONEDNN
  EXPECT_EQ(doc.at("dense_baseline").at("dtype"), "f32") << doc.at("dense_baseline").dump();
  EXPECT_NE(r.out.find("dense baseline: oneDNN f32 matmul (bf16 layer at kernel level avx2"),
            std::string::npos)
      << r.out;
#endif
}

// oneDNN limited below its bf16 level (no bf16 matmul at AVX2): the bf16 bench still runs, on
// an f32 baseline that says why.
TEST(CliBench, OnednnWithoutBf16FallsBackToF32) {
#ifndef MOE_HAVE_ONEDNN
  GTEST_SKIP() << "oneDNN is not compiled in";
#else
  testing::TempDir dir;
  auto r = testing::run_moe("bench --case tiny --iters 1 --dtype bf16 --json " + dir.file("b.json"),
                            dir.path(), "ONEDNN_MAX_CPU_ISA=AVX2");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  nlohmann::json doc = nlohmann::json::parse(testing::read_bytes(dir.file("b.json")));
  const auto& dense = doc.at("dense_baseline");
  EXPECT_EQ(dense.at("impl"), "onednn");
  EXPECT_EQ(dense.at("dtype"), "f32");
  EXPECT_GT(doc.at("results").at(0).at("dense_gflops").get<double>(), 0.0);
  EXPECT_EQ(doc.at("results").at(0).at("dense_dtype"), "f32");
  if (active_isa() == Isa::avx512_bf16 || active_isa() == Isa::amx_bf16)  // else the level alone picks f32
    EXPECT_NE(dense.at("why").get<std::string>().find("ONEDNN_MAX_CPU_ISA=AVX2"), std::string::npos)
        << dense.dump();
  EXPECT_NE(r.out.find("dense baseline: oneDNN f32 matmul"), std::string::npos) << r.out;
#endif
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
