// `moe train` and `moe report` end to end through the real binary.
#include <gtest/gtest.h>

#include <fstream>

#include "moe/safetensors.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

using testing::run_moe;

const char* kConfig =
    "num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 16\nmoe_mlp_dim: 16\ndtype: bf16\nnum_layers: 2\n"
    "batch_tokens: 32\nlearning_rate: 0.01\nwarmup_steps: 2\nsteps: 6\nlog_period: 2\n";

class CliTrain : public ::testing::Test {
 protected:
  void SetUp() override { std::ofstream(dir_.file("c.yml")) << kConfig; }
  testing::RunResult moe(const std::string& args) { return run_moe(args, dir_.path()); }
  std::string cfg() const { return dir_.file("c.yml"); }
  testing::TempDir dir_;
};

TEST_F(CliTrain, ResumeThroughTheBinaryIsBitExact) {
  auto r = moe("train " + cfg() + " checkpoint_dir=" + dir_.file("a"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = moe("train " + cfg() + " checkpoint_dir=" + dir_.file("b") + " --until 3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = moe("train " + cfg() + " --resume " + dir_.file("b"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("resumed from " + dir_.file("b") + " at step 3"), std::string::npos) << r.out;
  SafetensorsFile a = read_safetensors(dir_.file("a/ckpt-00000006.safetensors"));
  SafetensorsFile b = read_safetensors(dir_.file("b/ckpt-00000006.safetensors"));
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i)
    EXPECT_TRUE(a.tensors[i].second.bit_equal(b.tensors[i].second)) << a.tensors[i].first;
}

TEST_F(CliTrain, PrintsTheTableLogLinesAndSummary) {
  auto r = moe("train " + cfg() + " metrics_file=" + dir_.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* s : {"num_layers", "step 2/6", "step 6/6", "last/first", "GFLOP/s",
                        "fraction of dense GEMM peak: ", "dense baseline", "max/mean tokens per expert",
                        "time split", "gemm", "permute/combine", "router", "exposed comm"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(r.out.find("peak: n/a"), std::string::npos) << "the dense baseline is measured";
  r = moe("report " + dir_.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string svg = testing::read_bytes(dir_.file("m.svg"));
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
  r = moe("report " + dir_.file("nope.jsonl") + " --out " + dir_.file("x.svg"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope.jsonl: cannot open"), std::string::npos) << r.err;
}

// The summary's dense baseline follows the rule of `moe bench` (src/bench/dense_baseline.h): a bf16
// run where oneDNN has no bf16 matmul (ONEDNN_MAX_CPU_ISA=AVX2) measures the f32 matmul and says so.
TEST_F(CliTrain, Bf16WithoutOnednnBf16UsesAnF32Baseline) {
#ifndef MOE_HAVE_ONEDNN
  GTEST_SKIP() << "oneDNN is not compiled in";
#else
  auto r = run_moe("train " + cfg() + " steps=3 checkpoint_dir=" + dir_.file("c"), dir_.path(),
                   "ONEDNN_MAX_CPU_ISA=AVX2");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("measured after the steps): oneDNN f32 matmul ("), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("peak: n/a"), std::string::npos) << r.out;
#endif
}

TEST_F(CliTrain, EmbeddedDefaultConfigRuns) {
  auto r = moe("train steps=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("emb_dim"), std::string::npos);
  EXPECT_NE(r.out.find("summary (2 steps"), std::string::npos) << r.out;
}

TEST_F(CliTrain, ErrorsAreNamedAndExitNonZero) {
  auto r = moe("train " + cfg() +
               " learning_rate=1e30 warmup_steps=0 checkpoint_period=1 checkpoint_dir=" + dir_.file("d"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("at step 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("last good checkpoint"), std::string::npos) << r.err;
  EXPECT_EQ(testing::read_bytes(dir_.file("d/latest")), "ckpt-00000001.safetensors\n");
  r = moe("train " + cfg() + " emb_dim=32 --resume " + dir_.file("d"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("the config needs [32, 4]"), std::string::npos) << r.err;
  r = moe("train " + cfg() + " --resume " + dir_.file("missing"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no checkpoint"), std::string::npos) << r.err;
}

TEST_F(CliTrain, UntilMustBeAStep) {
  for (const char* until : {"--until=0", "--until=-5", "--until -5"}) {
    auto r = moe("train " + cfg() + " " + until);
    EXPECT_EQ(r.exit_code, 1) << until;
    EXPECT_NE(r.err.find("expected a step >= 1"), std::string::npos) << until << "\n" << r.err;
    EXPECT_EQ(r.out.find("summary"), std::string::npos) << r.out;
  }
}

// Paths that cannot be directories: clear errors naming the path, before any
// step runs (not std::filesystem errors, not a write failure at the end).
TEST_F(CliTrain, UnusablePathsAreNamedErrors) {
  const std::string file = dir_.file("a_file");
  std::ofstream(file) << "x";
  auto r = moe("train " + cfg() + " checkpoint_dir=" + file);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("checkpoint_dir: '" + file + "' exists and is not a directory"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("step 2/6"), std::string::npos) << "ran steps before failing: " << r.out;
  r = moe("train " + cfg() + " checkpoint_dir=" + file + "/sub");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'" + file + "' is not a directory"), std::string::npos) << r.err;
  r = moe("train " + cfg() + " metrics_file=" + file + "/m.jsonl");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("metrics_file " + file + "/m.jsonl: '" + file + "' exists and is not a directory"),
            std::string::npos)
      << r.err;
  const std::string bench = "bench --dist --iters 1 --warmup 0 --tokens 16 emb_dim=64 moe_mlp_dim=32 ";
  r = moe(bench + "--variant compute_only_ep2_chunks4 --trace-dir " + file + "/t");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(
      r.err.find("--trace-dir: cannot create directory '" + file + "/t': '" + file + "' is not a directory"),
      std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("filesystem error"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moe
