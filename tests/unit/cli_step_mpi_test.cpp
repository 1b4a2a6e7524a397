// `moe step` under mpirun reads and writes the same files as a single
// process (SPEC.md §7): y, grad.x, the routing and the losses bit for bit;
// expert weight gradients bit for bit with pure expert parallelism, within
// the stated bound when ranks add partial sums (FSDP); bad layouts are
// named errors on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "moe/safetensors.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"
#include "testing/tensors.h"

#ifdef MOE_MPIEXEC
namespace moe {
namespace {

const char* kConfig = "num_experts: 8\nnum_experts_per_tok: 2\nemb_dim: 32\nmoe_mlp_dim: 16\ndtype: bf16\n"
                      "router_z_loss_weight: 0.001\n";

class CliStepMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.file("c.yml")) << kConfig;
    auto r = moe("init --config " + dir_.file("c.yml") + " --out " + dir_.file("w.st") + " --seed 4 --inputs " +
                 dir_.file("in.st") + " --tokens 32");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    r = moe(step_args("single.st"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::string step_args(const std::string& out) const {
    return "step --config " + dir_.file("c.yml") + " --weights " + dir_.file("w.st") + " --inputs " +
           dir_.file("in.st") + " --out " + dir_.file(out);
  }
  testing::RunResult moe(const std::string& args, const std::string& launcher = "") {
    return testing::run_moe(args, dir_.path(), launcher);
  }
  testing::RunResult mpirun(int np, const std::string& args) {
    // As root OpenMPI needs the two variables; harmless otherwise. The session directory in the
    // test's own: these tests are discovered ones, outside cmake/mpi_session_dirs.cmake, and two of
    // them may start mpiexec in one instant (ctest -j).
    return moe(args, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_orte_tmpdir_base=" +
                         dir_.file("ompi") + " " + std::string(MOE_MPIEXEC) + " --oversubscribe -np " +
                         std::to_string(np));
  }
  testing::TempDir dir_;
};

void expect_same_file(const std::string& a, const std::string& b, bool expert_grads_exact) {
  SafetensorsFile x = read_safetensors(a), y = read_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (size_t i = 0; i < x.tensors.size(); ++i) {
    const auto& [name, t] = x.tensors[i];
    const Tensor& u = y.at(name);
    bool weight_grad = name.rfind("grad.", 0) == 0 && name != "grad.x";
    bool exact = !weight_grad || (expert_grads_exact && name != "grad.router.kernel");
    if (exact)
      EXPECT_TRUE(t.bit_equal(u)) << name;
    else  // partial sums added across ranks: a few f32 ulps of the largest entry
      EXPECT_LE(testing::max_abs_diff(t, u), 1e-5 * std::max(1.0, testing::max_abs(t))) << name;
  }
}

TEST_F(CliStepMpi, ExpertParallelFilesEqualSingleProcess) {
  auto r = mpirun(4, step_args("ep4.st") + " expert_parallelism=4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_file(dir_.file("single.st"), dir_.file("ep4.st"), true);
  r = mpirun(2, step_args("ring.st") + " expert_parallelism=2 use_ring_of_experts=true moe_offload_targets=all");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_file(dir_.file("single.st"), dir_.file("ring.st"), true);
}

TEST_F(CliStepMpi, FsdpFilesEqualSingleProcessWithinBound) {
  auto r = mpirun(4, step_args("f2e2.st") + " fsdp_parallelism=2 expert_parallelism=2 num_moe_token_chunks=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_same_file(dir_.file("single.st"), dir_.file("f2e2.st"), false);
}

// One NaN in a token of the last rank's rows: the files still equal the single process's (the aux
// losses NaN, every finite token's rows bit for bit), with offload on and off.
TEST_F(CliStepMpi, NonFiniteTokenOnOneRankGivesTheSingleProcessFile) {
  SafetensorsFile in = read_safetensors(dir_.file("in.st"));
  Tensor x = in.at("x").to(DType::f32);
  x.data<float>()[20 * 32 + 3] = std::numeric_limits<float>::quiet_NaN();  // token 20: rank 1 of 2
  write_safetensors(dir_.file("in.st"), {{"x", x}, {"dy", in.at("dy")}});
  auto r = moe(step_args("single.st"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("nonfinite_tokens=1"), std::string::npos) << r.out;
  SafetensorsFile single = read_safetensors(dir_.file("single.st"));
  EXPECT_TRUE(std::isnan(single.at("aux.load_balance_loss").get_f32(0)));
  EXPECT_TRUE(std::isnan(single.at("aux.z_loss").get_f32(0)));
  for (const char* extra : {"", " moe_offload_targets=all num_moe_token_chunks=2"}) {
    r = mpirun(2, step_args("ep2.st") + " expert_parallelism=2" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("nonfinite_tokens=1"), std::string::npos) << r.out;
    expect_same_file(dir_.file("single.st"), dir_.file("ep2.st"), true);
  }
}

TEST_F(CliStepMpi, BadLayoutsAreNamedErrors) {
  struct Case {
    int np;
    std::string extra, needle;
  };
  const Case cases[] = {
      {4, " expert_parallelism=3", "num_experts must be divisible by expert_parallelism"},
      {3, " expert_parallelism=2", "the product does not equal the world size 3"},
      {3, " data_parallelism=-1", "not divisible by the 3 ranks"},  // 32 tokens over 3 ranks
  };
  for (const Case& c : cases) {
    auto r = mpirun(c.np, step_args("bad.st") + c.extra);
    EXPECT_NE(r.exit_code, 0) << c.extra;
    EXPECT_NE((r.out + r.err).find(c.needle), std::string::npos) << c.extra << "\n" << r.err;
  }
  auto r = moe(step_args("bad.st") + " expert_parallelism=2");  // no launcher
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("mpirun"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moe
#endif
