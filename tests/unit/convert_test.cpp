// `moe convert` (SPEC.md §5): prefused wi [E, D, 2F] <-> split [2, E, D/2, 2F],
// bit-exact both ways, and a converted file runs the layer to the same bits.
#include "io/convert.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "moe/layer.h"
#include "moe/safetensors.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"
#include "testing/tensors.h"

namespace moe {
namespace {

using testing::uniform;

// A stacked checkpoint-like file: two layers' wi, an optimizer moment of one,
// and look-alike names that must be left alone.
std::vector<std::pair<std::string, Tensor>> checkpoint_tensors() {
  return {{"router.kernel", uniform({6, 4}, 1)},
          {"layers.0.experts.wi", uniform({4, 6, 10}, 2)},
          {"layers.1.experts.wi", uniform({4, 6, 10}, 3, -1, 1, DType::bf16)},
          {"opt.m.layers.0.experts.wi", uniform({4, 6, 10}, 4)},
          {"layers.0.experts.wi_0", uniform({4, 6, 5}, 5)},
          {"layers.0.myexperts.wi", uniform({3, 5, 10}, 6)},
          {"experts.wo", uniform({4, 5, 6}, 7)}};
}

TEST(Convert, RoundTripIsBitExact) {
  testing::TempDir dir;
  auto orig = checkpoint_tensors();
  write_safetensors(dir.file("w.st"), orig, {{"format", "test"}});
  auto names = convert_wi_file(dir.file("w.st"), dir.file("s.st"), WiLayout::split);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.experts.wi", "layers.1.experts.wi",
                                             "opt.m.layers.0.experts.wi"}));
  SafetensorsFile split = read_safetensors(dir.file("s.st"));
  EXPECT_EQ(split.metadata.at("moe.wi_layout"), "split");
  EXPECT_EQ(split.metadata.at("format"), "test");
  ASSERT_EQ(split.tensors.size(), orig.size());
  for (size_t i = 0; i < orig.size(); ++i) {
    const auto& [name, t] = split.tensors[i];
    EXPECT_EQ(name, orig[i].first);
    bool wi = is_wi_tensor_name(name);
    const Shape want = wi ? Shape{2, 4, 3, 10} : orig[i].second.shape();
    EXPECT_EQ(t.shape(), want) << name;
    EXPECT_TRUE(t.reshaped(orig[i].second.shape()).bit_equal(orig[i].second)) << name;
  }
  convert_wi_file(dir.file("s.st"), dir.file("f.st"), WiLayout::fused);
  SafetensorsFile fused = read_safetensors(dir.file("f.st"));
  EXPECT_EQ(fused.metadata.at("moe.wi_layout"), "fused");
  for (size_t i = 0; i < orig.size(); ++i)
    EXPECT_TRUE(fused.tensors[i].second.bit_equal(orig[i].second)) << i;
  // Same tensors and header order: the data buffer is byte-identical to the original's.
  std::string a = testing::read_bytes(dir.file("w.st")), b = testing::read_bytes(dir.file("f.st"));
  EXPECT_EQ(a.substr(a.size() - 2000), b.substr(b.size() - 2000));
}

// Slice h of the split tensor, read as [E/2, D, 2F], is experts [h*E/2, (h+1)*E/2).
TEST(Convert, SplitHalvesAreTheExpertHalves) {
  SafetensorsFile f;
  f.path = "mem";
  Tensor w = uniform({8, 4, 6}, 9);
  f.tensors = {{"experts.wi", w}};
  Tensor s = convert_wi_layout(f, WiLayout::split).at("experts.wi");
  ASSERT_EQ(s.shape(), (Shape{2, 8, 2, 6}));
  EXPECT_TRUE(s.slice_rows(0, 1).reshaped({4, 4, 6}).clone().bit_equal(w.slice_rows(0, 4).clone()));
  EXPECT_TRUE(s.slice_rows(1, 2).reshaped({4, 4, 6}).clone().bit_equal(w.slice_rows(4, 8).clone()));
}

void expect_error(const SafetensorsFile& f, WiLayout to, const std::vector<std::string>& needles) {
  try {
    convert_wi_layout(f, to);
    ADD_FAILURE() << "no error for " << f.path;
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(Convert, ErrorsNameTheFileAndTensor) {
  auto file = [](std::vector<std::pair<std::string, Tensor>> t) {
    SafetensorsFile f;
    f.path = "ckpt.st";
    f.tensors = std::move(t);
    return f;
  };
  Tensor fused = uniform({4, 6, 10}, 1), split = fused.reshaped({2, 4, 3, 10});
  expect_error(file({{"a.experts.wi", split}}), WiLayout::split,
               {"ckpt.st", "'a.experts.wi'", "already the split"});
  expect_error(file({{"experts.wi", fused}}), WiLayout::fused,
               {"ckpt.st", "'experts.wi'", "already the prefused"});
  expect_error(file({{"experts.wi", uniform({3, 6, 10}, 1)}}), WiLayout::split,
               {"'experts.wi'", "odd number of experts E = 3"});
  expect_error(file({{"experts.wi", uniform({4, 5, 10}, 1)}}), WiLayout::split,
               {"'experts.wi'", "odd emb_dim D = 5"});
  expect_error(file({{"experts.wi", uniform({4, 10}, 1)}}), WiLayout::split, {"'experts.wi'", "[4, 10]"});
  expect_error(file({{"experts.wi", uniform({3, 4, 3, 10}, 1)}}), WiLayout::fused,
               {"'experts.wi'", "[3, 4, 3, 10]"});
  expect_error(file({{"experts.wi_0", fused}}), WiLayout::split, {"ckpt.st", "nothing to convert"});
  EXPECT_THROW(convert_wi_file("/nonexistent/w.st", "/tmp/x.st", WiLayout::split), Error);
}

struct Step {
  LayerOutputs out;
  LayerGrads grads;
};

Step run(const Config& cfg, const LayerWeights& w, const Tensor& x, const Tensor& dy) {
  Step s;
  auto fwd = layer_forward(cfg, w, x, nullptr, s.out);
  s.grads = layer_backward(cfg, *fwd, dy);
  return s;
}

// A converted file loads with moe_split_expert_weight_layout=true and computes
// the same bits as the original file without it.
TEST(Convert, ConvertedFileRunsTheLayerBitIdentically) {
  testing::TempDir dir;
  Config cfg;
  cfg.num_experts = 8, cfg.num_experts_per_tok = 2, cfg.emb_dim = 16, cfg.moe_mlp_dim = 12;
  cfg.prefuse_moe_weights = true;
  std::vector<std::pair<std::string, Tensor>> named;
  init_weights(cfg, 4).for_each(cfg,
                                [&](const std::string& n, const Tensor& t) { named.emplace_back(n, t); });
  write_safetensors(dir.file("w.st"), named);
  convert_wi_file(dir.file("w.st"), dir.file("s.st"), WiLayout::split);
  Config split_cfg = cfg;
  split_cfg.moe_split_expert_weight_layout = true;
  auto load = [](const Config& c, const SafetensorsFile& f) {
    return weights_from(
        c, [&](const std::string& n) { return f.find(n); }, "", f.path);
  };
  SafetensorsFile wf = read_safetensors(dir.file("w.st")), sf = read_safetensors(dir.file("s.st"));
  EXPECT_THROW(load(cfg, sf), Error);  // the split file does not load as prefused
  Tensor x = uniform({21, 16}, 5), dy = uniform({21, 16}, 6);
  Step a = run(cfg, load(cfg, wf), x, dy), b = run(split_cfg, load(split_cfg, sf), x, dy);
  EXPECT_TRUE(a.out.y.bit_equal(b.out.y));
  EXPECT_TRUE(a.grads.dx.bit_equal(b.grads.dx));
  EXPECT_TRUE(a.grads.weights.router.bit_equal(b.grads.weights.router));
  EXPECT_TRUE(a.grads.weights.wo.bit_equal(b.grads.weights.wo));
  EXPECT_TRUE(a.grads.weights.wi.reshaped({2, 8, 8, 24}).bit_equal(b.grads.weights.wi));
}

TEST(Convert, CliConvertsAndReportsErrors) {
  testing::TempDir dir;
  write_safetensors(dir.file("w.st"), checkpoint_tensors());
  auto r = testing::run_moe("convert --to split " + dir.file("w.st") + " " + dir.file("s.st"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("3 tensors to the split layout"), std::string::npos) << r.out;
  EXPECT_EQ(read_safetensors(dir.file("s.st")).at("layers.1.experts.wi").shape(), (Shape{2, 4, 3, 10}));
  r = testing::run_moe("convert --to split " + dir.file("s.st") + " " + dir.file("t.st"), dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("s.st: tensor 'layers.0.experts.wi'"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("t.st")));
  r = testing::run_moe("convert --to other " + dir.file("s.st") + " " + dir.file("t.st"), dir.path());
  EXPECT_NE(r.exit_code, 0);
  r = testing::run_moe("convert --to fused " + dir.file("missing.st") + " " + dir.file("t.st"), dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing.st"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moe
