// `moe info` through the binary: the text and --json fields a bug report
// needs, the level MOE_GEMM_ISA forces, and the errors of a bad MOE_GEMM_ISA
// (which every command shares). Under mpirun: tests/mpi/isa_agree_np2.sh.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "moe/isa.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

using testing::run_moe;

std::vector<std::string> available_names() {
  std::vector<std::string> out;
  for (Isa i : isa_available()) out.push_back(isa_name(i));
  return out;
}

TEST(CliInfo, TextNamesEveryPart) {
  testing::TempDir dir;
  auto r = run_moe("info", dir.path(), "env -u MOE_GEMM_ISA");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^moe [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
  for (const char* s : {"\nbuild     ", "flags: ", "\nmpi       ", "\nonednn    ", "\ncpu       ",
                        "logical CPUs", "\nfeatures  ", "\nthreads   ", "\nranks     1\n", "\nenv       "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  const std::string kernels = std::string("\nkernels   ") + isa_name(isa_available().back()) +
                              " (available: " + isa_list(isa_available()) + ")\n";
  EXPECT_NE(r.out.find(kernels), std::string::npos) << kernels << "\n" << r.out;
}

TEST(CliInfo, JsonHasTheReportFields) {
  testing::TempDir dir;
  auto r = run_moe("info --json", dir.path(), "env -u MOE_GEMM_ISA MOE_NUM_THREADS=3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);  // one object, nothing else on stdout
  EXPECT_TRUE(std::regex_match(j.at("version").get<std::string>(), std::regex("[0-9]+\\.[0-9]+\\.[0-9]+")));
  const auto& b = j.at("build");
  for (const char* key : {"compiler", "build_type", "cxx_flags"})
    EXPECT_TRUE(b.at(key).is_string()) << key << "\n" << b.dump();
  EXPECT_FALSE(b.at("compiler").get<std::string>().empty());
#ifdef MOE_HAVE_MPI
  EXPECT_TRUE(b.at("mpi").at("compiled_in").get<bool>());
  EXPECT_FALSE(b.at("mpi").at("library").get<std::string>().empty());
#else
  EXPECT_FALSE(b.at("mpi").at("compiled_in").get<bool>());
#endif
#ifdef MOE_HAVE_ONEDNN
  EXPECT_TRUE(std::regex_match(b.at("onednn").at("version").get<std::string>(),
                               std::regex("[0-9]+\\.[0-9]+\\.[0-9]+")));
#else
  EXPECT_FALSE(b.at("onednn").at("compiled_in").get<bool>());
#endif
  const auto& c = j.at("cpu");
  EXPECT_FALSE(c.at("arch").get<std::string>().empty());
  EXPECT_GE(c.at("logical_cpus").get<int>(), 1);
  EXPECT_TRUE(c.at("features").is_array());
  EXPECT_TRUE(c.at("vendor").is_string() && c.at("model").is_string());
  EXPECT_EQ(j.at("isa_available").get<std::vector<std::string>>(), available_names());
  EXPECT_EQ(j.at("isa"), isa_name(isa_available().back())) << "the highest level when MOE_GEMM_ISA is unset";
  EXPECT_EQ(j.at("threads"), 3);
  EXPECT_EQ(j.at("ranks"), 1);
  EXPECT_EQ(j.at("env").at("MOE_NUM_THREADS"), "3");
  EXPECT_FALSE(j.at("env").contains("MOE_GEMM_ISA"));
}

TEST(CliInfo, MoeGemmIsaForcesTheLevel) {
  testing::TempDir dir;
  for (Isa level : isa_available()) {
    auto r = run_moe("info --json", dir.path(), std::string("MOE_GEMM_ISA=") + isa_name(level));
    ASSERT_EQ(r.exit_code, 0) << isa_name(level) << ": " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("isa"), isa_name(level));
    EXPECT_EQ(j.at("env").at("MOE_GEMM_ISA"), isa_name(level));
  }
}

// The message names the variable and lists the levels this CPU runs; nothing runs first.
TEST(CliInfo, BadMoeGemmIsaIsAnError) {
  testing::TempDir dir;
  const std::string runs = "this CPU runs " + isa_list(isa_available());
  for (const char* cmd : {"info", "info --json", "bench --case tiny --iters 1"}) {
    auto r = run_moe(cmd, dir.path(), "MOE_GEMM_ISA=bogus");
    EXPECT_EQ(r.exit_code, 1) << cmd;
    EXPECT_NE(r.err.find("MOE_GEMM_ISA=bogus names no kernel level"), std::string::npos)
        << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(runs), std::string::npos) << cmd << ": " << r.err;
    EXPECT_EQ(r.out, "") << cmd;
  }
}

TEST(CliInfo, LevelThisCpuLacksIsAnError) {
  std::vector<Isa> missing;
  for (Isa i : isa_all())
    if (!isa_supported(i)) missing.push_back(i);
  if (missing.empty()) GTEST_SKIP() << "this CPU and build run every level (" << isa_list(isa_all()) << ")";
  testing::TempDir dir;
  for (Isa level : missing) {
    auto r = run_moe("info", dir.path(), std::string("MOE_GEMM_ISA=") + isa_name(level));
    EXPECT_EQ(r.exit_code, 1) << isa_name(level);
    EXPECT_NE(r.err.find(std::string("MOE_GEMM_ISA=") + isa_name(level)), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("it runs " + isa_list(isa_available())), std::string::npos) << r.err;
  }
}

TEST(CliInfo, VersionFlag) {
  testing::TempDir dir;
  auto r = run_moe("--version", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex("moe [0-9]+\\.[0-9]+\\.[0-9]+\n"))) << r.out;
}

}  // namespace
}  // namespace moe
