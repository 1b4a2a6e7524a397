// Inputs the fuzz targets (fuzz/, scripts/fuzz.sh) found crashing, hanging or
// tripping a sanitizer, each kept as fuzz/<target>/corpus/crash-* and
// checked here in the normal suite.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "moe/config.h"
#include "moe/error.h"
#include "moe/topology.h"
#include "testing/temp_dir.h"
#include "train/report.h"

namespace moe {
namespace {

std::string corpus_file(const std::string& target, const std::string& name) {
  return std::string(MOE_SOURCE_DIR) + "/fuzz/" + target + "/corpus/" + name;
}

// `moe report` of a metrics file, in a death-test child that must finish
// within 1 s of CPU time (an endless loop dies of SIGXCPU instead of hanging
// the suite and filling memory; drawing takes milliseconds, under ASan too);
// exit status 0 for a whole SVG.
[[noreturn]] void draw_report(const std::string& path) {
  const rlimit cpu{1, 1};
  ::setrlimit(RLIMIT_CPU, &cpu);
  const std::string svg = train::render_report_svg(train::read_metrics(path), path);
  std::_Exit(svg.size() < 100000 && svg.find("</svg>") != std::string::npos ? 0 : 1);
}

void expect_report_finishes(const std::string& path) {
  EXPECT_EXIT(draw_report(path), ::testing::ExitedWithCode(0), "") << path;
}

// One line at step 1e17: the x axis spans [1e17, 1e17 + 1] = [1e17, 1e17], and the tick loop
// (v += 2) never passed the end, growing a vector until memory ran out.
TEST(FuzzRegression, ReportOfAStepNear1e17Finishes) {
  expect_report_finishes(corpus_file("metrics", "crash-step_1e17_endless_ticks"));
}

// One loss of 1e308: the log axis went up to 1e309 = inf and the decade count log10(inf) was cast
// to int (UBSan: inf is outside the range of int); the loss axis was drawn without ticks.
TEST(FuzzRegression, ReportOfALossNearDblMaxHasTicks) {
  const std::string path = corpus_file("metrics", "crash-loss_1e308_inf_to_int");
  expect_report_finishes(path);
  const std::string svg = train::render_report_svg(train::read_metrics(path), "t");
  EXPECT_NE(svg.find(">1e+308</text>"), std::string::npos);
  EXPECT_NE(svg.find(">1e+307</text>"), std::string::npos);
}

// data_parallelism = fsdp_parallelism = 2^32: their product overflowed int64 in the mesh check
// (UBSan: signed integer overflow) that `moe validate --topology` and every run make.
TEST(FuzzRegression, ParallelismProductOverflowIsAMeshMismatch) {
  const std::string path = corpus_file("config", "crash-parallelism_product_overflow");
  const Config c = load_config(path, {}).config;
  for (const char* spec : {"ranks=1", "ranks=8,mpi_thread=multiple"}) {
    const TargetCheck t = check_target(c, parse_topology(spec), true);
    ASSERT_EQ(t.problems.size(), 1u) << spec;
    EXPECT_NE(
        t.problems[0].find("data_parallelism=4294967296, fsdp_parallelism=4294967296, expert_parallelism=1: "
                           "the product does not equal the world size"),
        std::string::npos)
        << t.problems[0];
  }
  // A product that wrapped around to the world size was taken for that mesh ((2^61 + 1) x 8 = 8).
  Config w = c;
  w.data_parallelism = (int64_t(1) << 61) + 1;
  w.fsdp_parallelism = 8;
  EXPECT_NE(mesh_problems(w, 8).at(0).find("the product does not equal the world size 8"), std::string::npos);
  w.expert_parallelism = -1;
  EXPECT_NE(mesh_problems(w, 8).at(0).find("the product of the values other than -1 does not divide"),
            std::string::npos);
}

}  // namespace
}  // namespace moe
