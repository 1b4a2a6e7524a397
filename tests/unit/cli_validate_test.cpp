// `moe validate` end to end: runs the real binary (MOE_BINARY) on temp YAML files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "testing/cli_runner.h"

namespace {

namespace fs = std::filesystem;

using moe::testing::RunResult;

class ConfigCliValidate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moe_cli_validate_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  // Runs `moe <args>` (args are shell words, already quoted where needed).
  RunResult run(const std::string& args) { return moe::testing::run_moe(args, dir_.string()); }

  fs::path dir_;
};

const char* kValid = "num_experts: 8\nnum_experts_per_tok: 2\nemb_dim: 16\nmoe_mlp_dim: 32\n";

TEST_F(ConfigCliValidate, ValidConfigPrintsTheTable) {
  auto cfg = write("ok.yml", kValid);
  RunResult r = run("validate " + cfg.string() + " dtype=f32 'moe_offload_targets='");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* needle :
       {"num_experts", "emb_dim", "side_engine_threads", "learning_rate", "file", "override", "default"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  EXPECT_NE(r.out.find("f32"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(ConfigCliValidate, InvalidConfigNamesEveryProblem) {
  auto cfg = write("bad.yml", std::string(kValid) + "num_expert: 4\ncapacity_factor: 0\n");
  RunResult r = run("validate " + cfg.string() +
                    " moe_offload_targets=fsdp_all_gather,tensor_core steps=1.5 use_ring_of_experts=true");
  EXPECT_EQ(r.exit_code, 1);
  for (const char* needle : {"moe: error: unknown config key 'num_expert' (did you mean 'num_experts'?)",
                             "moe: error: capacity_factor must be -1", "'tensor_core'",
                             "moe: error: steps: bad value '1.5' (expected an integer)",
                             "moe: error: When expert_parallelism is 1, use_ring_of_experts must be false"})
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << r.err;
  EXPECT_EQ(r.out.find("num_experts_per_tok"), std::string::npos) << "no table for an invalid config";
}

TEST_F(ConfigCliValidate, MissingFileAndBadSyntaxFail) {
  RunResult r = run("validate " + (dir_ / "none.yml").string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("none.yml"), std::string::npos) << r.err;
  auto cfg = write("syntax.yml", "num_experts: [8\n");
  r = run("validate " + cfg.string());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("YAML syntax error"), std::string::npos) << r.err;
  r = run("validate");
  EXPECT_NE(r.exit_code, 0);
}

TEST_F(ConfigCliValidate, WithoutTopologyDescribesThisMachine) {
  auto cfg = write("ok.yml", kValid);
  RunResult r = run("validate " + cfg.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* needle : {"target: ranks=1", "backend=single-process (this machine", "no live targets"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
}

TEST_F(ConfigCliValidate, TopologyPrintsTheOffloadPlanWithWarnings) {
  auto cfg = write("ok.yml", kValid);
  RunResult r = run("validate " + cfg.string() +
                    " moe_offload_targets=all --topology ranks=1,cores=4,mpi_thread=serialized");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* needle :
       {"target: ranks=1, cores=4, mpi_thread=serialized, backend=mpi-serialized",
        "ep_collectives: all_to_all -> side all_gather -> compute reduce_scatter -> compute",
        "ragged_sort: routing index math -> side",
        "warning: moe_offload_targets: fsdp_all_gather dropped on backend mpi-serialized"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  EXPECT_LT(r.out.find("num_experts"), r.out.find("offload plan")) << "plan after the table";
  r = run("validate " + cfg.string() + " moe_offload_targets=fsdp_all_gather --topology mpi_thread=multiple");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fsdp_all_gather: all_gather -> side reduce_scatter -> side"), std::string::npos)
      << r.out;
}

TEST_F(ConfigCliValidate, TopologyProblemsAreErrors) {
  auto cfg = write("ok.yml", kValid);
  RunResult r = run("validate " + cfg.string() +
                    " moe_offload_targets=ragged_sort --topology ranks=8,mpi_thread=funneled");
  EXPECT_EQ(r.exit_code, 1);
  for (const char* needle :
       {"the product does not equal the world size 8", "backend mpi-funneled has none", "2 problems"})
    EXPECT_NE(r.err.find(needle), std::string::npos) << needle << "\n" << r.err;
  EXPECT_EQ(r.out.find("offload plan"), std::string::npos);
  r = run("validate " + cfg.string() + " --topology ranks=2,gpus=8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--topology: unknown item 'gpus'"), std::string::npos) << r.err;
}

TEST_F(ConfigCliValidate, HelpDocumentsArguments) {
  RunResult r = run("validate --help");
  EXPECT_EQ(r.exit_code, 0);
  for (const char* needle : {"CONFIG", "key=value", "Exit status", "num_experts_per_tok", "--topology",
                             "mpi_thread", "moe_offload_targets", "softmax|sigmoid"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
}

}  // namespace
