// `moe init` and `moe step` end to end through the real binary: the file
// contract of SPEC.md §7, equality with the in-process layer, clear errors.
#include <gtest/gtest.h>

#include <thread>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/counter_rng.h"
#include "moe/config.h"
#include "moe/layer.h"
#include "moe/safetensors.h"
#include "moe/dist_runtime.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

using testing::run_moe;

const char* kConfig = "num_experts: 6\nnum_experts_per_tok: 2\nemb_dim: 16\nmoe_mlp_dim: 8\ndtype: bf16\n";

class CliStep : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = dir_.file("c.yml");
    std::ofstream(cfg_) << kConfig;
  }
  testing::RunResult moe(const std::string& args) { return run_moe(args, dir_.path()); }
  testing::TempDir dir_;
  std::string cfg_;
};

TEST_F(CliStep, WritesTheContractedOutputs) {
  auto r = moe("init --config " + cfg_ + " --out " + dir_.file("w.st") + " --seed 3 --inputs " + dir_.file("in.st") +
               " --tokens 10");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = moe("step --config " + cfg_ + " --weights " + dir_.file("w.st") + " --inputs " + dir_.file("in.st") +
          " --out " + dir_.file("out.st"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile out = read_safetensors(dir_.file("out.st"));
  const std::vector<std::pair<std::string, Shape>> want = {
      {"y", {10, 16}},           {"topk_idx", {10, 2}},    {"topk_weights", {10, 2}},
      {"group_sizes", {6}},      {"aux.load_balance_loss", {}}, {"aux.z_loss", {}},
      {"grad.x", {10, 16}},      {"grad.router.kernel", {16, 6}}, {"grad.experts.wi_0", {6, 16, 8}},
      {"grad.experts.wi_1", {6, 16, 8}}, {"grad.experts.wo", {6, 8, 16}}};
  ASSERT_EQ(out.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, want[i].first);
    EXPECT_EQ(out.tensors[i].second.shape(), want[i].second) << want[i].first;
  }
  EXPECT_EQ(out.at("y").dtype(), DType::bf16);
  EXPECT_EQ(out.at("topk_idx").dtype(), DType::i32);
  EXPECT_EQ(out.at("group_sizes").dtype(), DType::i32);
  EXPECT_EQ(out.at("grad.x").dtype(), DType::f32);
  // The binary computes exactly what the library computes.
  Config cfg = parse_config(kConfig, "c", {}).config;
  SafetensorsFile wf = read_safetensors(dir_.file("w.st")), in = read_safetensors(dir_.file("in.st"));
  LayerWeights w = weights_from(cfg, [&](const std::string& n) { return wf.find(n); }, "", wf.path);
  LayerOutputs o;
  auto fwd = layer_forward(cfg, w, in.at("x"), nullptr, o);
  EXPECT_TRUE(o.y.bit_equal(out.at("y")));
  EXPECT_TRUE(layer_backward(cfg, *fwd, in.at("dy")).dx.bit_equal(out.at("grad.x")));
  // The inputs are the documented draws (docs/formats.md, "Random weights").
  EXPECT_TRUE(in.at("x").bit_equal(normal_tensor({10, 16}, named_key(3, "x"))));
  EXPECT_TRUE(in.at("dy").bit_equal(normal_tensor({10, 16}, named_key(3, "dy"))));
}

TEST_F(CliStep, ForcedRoutingAndForwardOnly) {
  ASSERT_EQ(moe("init --config " + cfg_ + " --out " + dir_.file("w.st")).exit_code, 0);
  Tensor x(DType::f32, {3, 16}), idx(DType::i32, {3, 2});
  const int32_t ids[] = {5, 0, 5, 1, 4, 5};
  std::copy(ids, ids + 6, idx.data<int32_t>());
  write_safetensors(dir_.file("in.st"), {{"x", x}, {"topk_idx", idx}});
  auto r = moe("step --config " + cfg_ + " --weights " + dir_.file("w.st") + " --inputs " + dir_.file("in.st") +
               " --out " + dir_.file("out.st"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile out = read_safetensors(dir_.file("out.st"));
  EXPECT_TRUE(out.at("topk_idx").bit_equal(idx));
  EXPECT_EQ(out.find("grad.x"), nullptr);
  EXPECT_EQ(out.at("group_sizes").data<int32_t>()[5], 3);
}

TEST_F(CliStep, BadInputsAreNamedErrors) {
  ASSERT_EQ(moe("init --config " + cfg_ + " --out " + dir_.file("w.st")).exit_code, 0);
  write_safetensors(dir_.file("nox.st"), {{"dy", Tensor(DType::f32, {2, 16})}});
  write_safetensors(dir_.file("badx.st"), {{"x", Tensor(DType::f32, {2, 15})}});
  std::ofstream(dir_.file("trunc.st")) << "garbage";
  auto step = [&](const std::string& weights, const std::string& inputs, const std::string& extra = "") {
    return moe("step --config " + cfg_ + " --weights " + weights + " --inputs " + inputs + " --out " +
               dir_.file("o.st") + extra);
  };
  struct Case {
    testing::RunResult r;
    const char* needle;
  };
  const Case cases[] = {
      {step(dir_.file("w.st"), dir_.file("nox.st")), "no tensor named 'x'"},
      {step(dir_.file("w.st"), dir_.file("badx.st")), "x: expected shape [T, 16]"},
      {step(dir_.file("trunc.st"), dir_.file("nox.st")), "trunc.st"},
      {step(dir_.file("w.st"), dir_.file("nox.st"), " emb_dim=32"), "weight 'router.kernel' has shape [16, 6], the config needs [32, 6]"},
      {step(dir_.file("w.st"), dir_.file("nox.st"), " prefuse_moe_weights=true"), "missing weight 'experts.wi'"},
      {step(dir_.file("missing.st"), dir_.file("nox.st")), "missing.st"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.r.exit_code, 1) << c.needle;
    EXPECT_NE(c.r.err.find(c.needle), std::string::npos) << c.needle << "\n" << c.r.err;
    EXPECT_EQ(c.r.err.find("terminate"), std::string::npos) << c.r.err;
  }
  // Forced routing that repeats an expert in a token's row: an error naming the tensor, no output.
  Tensor idx(DType::i32, {2, 2});
  const int32_t ids[] = {0, 1, 4, 4};
  std::copy(ids, ids + 4, idx.data<int32_t>());
  write_safetensors(dir_.file("dup.st"), {{"x", Tensor(DType::f32, {2, 16})}, {"topk_idx", idx}});
  auto r = step(dir_.file("w.st"), dir_.file("dup.st"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("topk_idx: token 1 names expert 4 twice"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("o.st")));
  EXPECT_NE(moe("--help").out.find("step"), std::string::npos);
  EXPECT_NE(moe("step --help").out.find("--weights"), std::string::npos);
}

// A NaN and an inf token: NaN aux losses in the file, the count in the summary, the other
// tokens' rows of y as in the clean step.
TEST_F(CliStep, NonFiniteTokensGiveNanAuxLosses) {
  ASSERT_EQ(moe("init --config " + cfg_ + " --out " + dir_.file("w.st") + " --inputs " + dir_.file("in.st") +
                " --tokens 10")
                .exit_code,
            0);
  const std::string step = "step --config " + cfg_ + " --weights " + dir_.file("w.st") + " --inputs ";
  auto r = moe(step + dir_.file("in.st") + " --out " + dir_.file("clean.st"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("nonfinite_tokens"), std::string::npos) << r.out;
  SafetensorsFile in = read_safetensors(dir_.file("in.st"));
  Tensor x = in.at("x").to(DType::f32);
  x.data<float>()[2 * 16 + 5] = std::numeric_limits<float>::quiet_NaN();
  x.data<float>()[7 * 16 + 0] = -std::numeric_limits<float>::infinity();
  write_safetensors(dir_.file("bad.st"), {{"x", x}});
  r = moe(step + dir_.file("bad.st") + " --out " + dir_.file("bad_out.st"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("nonfinite_tokens=2"), std::string::npos) << r.out;
  SafetensorsFile clean = read_safetensors(dir_.file("clean.st")),
                  bad = read_safetensors(dir_.file("bad_out.st"));
  EXPECT_TRUE(std::isnan(bad.at("aux.load_balance_loss").get_f32(0)));
  EXPECT_TRUE(std::isnan(bad.at("aux.z_loss").get_f32(0)));
  for (int64_t t = 0; t < 10; ++t) {
    if (t == 2 || t == 7) continue;
    EXPECT_TRUE(bad.at("y").slice_rows(t, t + 1).bit_equal(clean.at("y").slice_rows(t, t + 1))) << t;
    EXPECT_TRUE(bad.at("topk_idx").slice_rows(t, t + 1).bit_equal(clean.at("topk_idx").slice_rows(t, t + 1)))
        << t;
  }
}

// --trace on one rank: the distributed path (bit-identical to the plain
// step) and a Chrome trace JSON with the step's ops on rank 0's compute track.
TEST_F(CliStep, TraceWritesChromeJsonOfTheStep) {
  ASSERT_EQ(moe("init --config " + cfg_ + " --out " + dir_.file("w.st") + " --inputs " + dir_.file("in.st") +
                " --tokens 12").exit_code, 0);
  const std::string step = "step --config " + cfg_ + " --weights " + dir_.file("w.st") + " --inputs " + dir_.file("in.st");
  auto r = moe(step + " --out " + dir_.file("plain.st"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = moe(step + " --out " + dir_.file("traced.st") + " --trace " + dir_.file("t.json") + " num_moe_token_chunks=2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile plain = read_safetensors(dir_.file("plain.st")), traced = read_safetensors(dir_.file("traced.st"));
  for (const char* n : {"y", "grad.x", "grad.router.kernel", "grad.experts.wi_0", "grad.experts.wo"})
    EXPECT_TRUE(plain.at(n).bit_equal(traced.at(n))) << n;
  nlohmann::json doc = nlohmann::json::parse(testing::slurp_text(dir_.file("t.json")));
  std::set<std::string> names;
  for (const auto& ev : doc.at("traceEvents")) {
    if (ev.at("ph") != "X") continue;
    EXPECT_EQ(ev.at("pid"), 0);
    EXPECT_EQ(ev.at("tid"), 0);  // no offload target: compute track only
    EXPECT_GE(ev.at("dur").get<int64_t>(), 0);
    names.insert(ev.at("name").get<std::string>());
  }
  for (const char* n : {"router", "AG:aux_stats", "sort[0]", "permute[1]", "ffn[0]", "combine[1]",
                        "combine_backward[0]", "ffn_backward[1]", "permute_backward[0]", "weight_grads",
                        "router_backward", "AR:grad.router.kernel"})
    EXPECT_TRUE(names.count(n)) << "missing op " << n;
}

// The side engine without a core of its own warns once, naming the remedy: a traced step with offload
// runs through a DistRuntime; twice the machine's CPUs as pool threads leave it none.
TEST_F(CliStep, SideEngineWithoutACoreWarnsOnce) {
  ASSERT_EQ(moe("init --config " + cfg_ + " --out " + dir_.file("w.st") + " --inputs " + dir_.file("in.st") +
                " --tokens 12").exit_code, 0);
  const std::string step = "step --config " + cfg_ + " --weights " + dir_.file("w.st") + " --inputs " +
                           dir_.file("in.st") + " --out " + dir_.file("o.st") + " --trace " + dir_.file("t.json") +
                           " moe_offload_targets=ragged_sort";
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const std::string warning = "has no core of its own: " + std::to_string(2 * hw) + " compute thread(s)";
  auto r = run_moe(step, dir_.path(), "env MOE_NUM_THREADS=" + std::to_string(2 * hw));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t at = r.err.find(warning);
  EXPECT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(warning, at + 1), std::string::npos) << r.err;  // once per process
  EXPECT_NE(r.err.find("leave a core per rank free (fewer MOE_NUM_THREADS, or fewer ranks per host)"),
            std::string::npos)
      << r.err;
  if (hw >= 2) {  // one pool thread leaves a core free
    r = run_moe(step, dir_.path(), "env MOE_NUM_THREADS=1");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.err.find("has no core of its own"), std::string::npos) << r.err;
  }
}

TEST(SideEngineCoreWarning, OnlyWhenThePoolFillsTheRanksCores) {
  EXPECT_EQ(side_engine_core_warning(2, 1, false), "");
  EXPECT_EQ(side_engine_core_warning(8, 4, false), "");
  // SCHED_FIFO workers shorten the exposed waits, not the step (docs/offload.md): still a warning,
  // which says so.
  EXPECT_NE(side_engine_core_warning(2, 2, true).find("MOE_SIDE_ENGINE_RT=1 hides the waits"),
            std::string::npos);
  EXPECT_EQ(side_engine_core_warning(2, 2, false).find("MOE_SIDE_ENGINE_RT"), std::string::npos);
  EXPECT_NE(side_engine_core_warning(2, 2, false).find("2 compute thread(s) on this rank's 2 CPU(s)"), std::string::npos);
  EXPECT_NE(side_engine_core_warning(0.5, 1, false).find("1 compute thread(s) on this rank's 0.5 CPU(s)"),
            std::string::npos);  // 4 ranks on 2 cores
}

}  // namespace
}  // namespace moe
