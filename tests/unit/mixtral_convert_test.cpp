// `moe convert --from mixtral` / `--to mixtral` (src/io/mixtral.h): a synthetic
// sharded Mixtral checkpoint becomes the engine's tensors element for element
// (transposes, dtype kept), `moe step` runs on them, the round trip is
// byte-exact, conversion streams, and every bad input is a named error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/mixtral.h"
#include "moe/config.h"
#include "moe/layer.h"
#include "moe/safetensors.h"
#include "testing/cli_runner.h"
#include "testing/temp_dir.h"
#include "testing/tensors.h"

namespace moe {
namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;
using testing::uniform;

constexpr int64_t kE = 4, kD = 8, kF = 6, kLayers = 2;

std::string P(int64_t i) { return "model.layers." + std::to_string(i) + ".block_sparse_moe."; }
std::string X(int64_t i, int64_t j, int w) {
  return P(i) + "experts." + std::to_string(j) + ".w" + std::to_string(w) + ".weight";
}

// A Mixtral-like checkpoint: per layer an attention tensor and the MoE block,
// plus embeddings and the final norm (2 + kLayers tensors that are not MoE).
Named mixtral_tensors(DType dt, int64_t layers = kLayers, int64_t E = kE, int64_t D = kD, int64_t F = kF) {
  Named t{{"model.embed_tokens.weight", uniform({10, D}, 1, -1, 1, dt)}};
  uint64_t seed = 100;
  for (int64_t i = 0; i < layers; ++i) {
    t.emplace_back("model.layers." + std::to_string(i) + ".self_attn.q_proj.weight",
                   uniform({D, D}, ++seed, -1, 1, dt));
    t.emplace_back(P(i) + "gate.weight", uniform({E, D}, ++seed, -1, 1, dt));
    for (int64_t j = 0; j < E; ++j) {
      t.emplace_back(X(i, j, 1), uniform({F, D}, ++seed, -1, 1, dt));
      t.emplace_back(X(i, j, 2), uniform({D, F}, ++seed, -1, 1, dt));
      t.emplace_back(X(i, j, 3), uniform({F, D}, ++seed, -1, 1, dt));
    }
  }
  t.emplace_back("model.norm.weight", uniform({D}, 2, -1, 1, dt));
  return t;
}

const Tensor& get(const Named& t, const std::string& name) {
  for (const auto& [n, v] : t)
    if (n == name) return v;
  throw std::runtime_error("test: no tensor " + name);
}

Named without(Named t, const std::string& name) {
  std::erase_if(t, [&](const auto& p) { return p.first == name; });
  return t;
}

Named replaced(Named t, const std::string& name, Tensor v) {
  for (auto& [n, x] : t)
    if (n == name) x = std::move(v);
  return t;
}

// Shard 1: the embeddings and layer 0; shard 2: everything else. Writes the
// index (with "metadata" as transformers does) and returns its path.
std::string write_sharded(const testing::TempDir& dir, const Named& t) {
  Named a, b;
  nlohmann::json map = nlohmann::json::object();
  for (const auto& [n, v] : t) {
    const bool first = n.starts_with("model.embed") || n.starts_with("model.layers.0.");
    (first ? a : b).emplace_back(n, v);
    map[n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir.file("model-00001-of-00002.safetensors"), a, {{"format", "pt"}});
  write_safetensors(dir.file("model-00002-of-00002.safetensors"), b, {{"format", "pt"}});
  std::ofstream(dir.file("model.safetensors.index.json"))
      << nlohmann::json{{"metadata", {{"total_size", 1234}}}, {"weight_map", map}}.dump(1);
  return dir.file("model.safetensors.index.json");
}

// Element i of t as its raw bits (any dtype of 2 or 4 bytes).
uint32_t bits(const Tensor& t, int64_t i) {
  uint32_t v = 0;
  std::memcpy(&v, static_cast<const char*>(t.raw()) + size_t(i) * dtype_size(t.dtype()),
              dtype_size(t.dtype()));
  return v;
}

Config config_for(int64_t E = kE, int64_t D = kD, int64_t F = kF) {
  Config c;
  c.num_experts = int(E), c.num_experts_per_tok = 2, c.emb_dim = D, c.moe_mlp_dim = F;
  return c;
}

// The engine tensors of layer i (loaded by weights_from, prefix "layers.{i}.")
// are the transposes of the Mixtral tensors, element for element, bits kept.
void expect_layer_matches(const SafetensorsFile& out, const Named& src, int64_t i, DType dt,
                          const std::string& prefix) {
  SCOPED_TRACE("layer " + std::to_string(i));
  LayerWeights w = weights_from(
      config_for(), [&](const std::string& n) { return out.find(n); }, prefix, out.path);
  for (const Tensor* t : {&w.router, &w.wi_0, &w.wi_1, &w.wo}) ASSERT_EQ(t->dtype(), dt);
  const Tensor& gate = get(src, P(i) + "gate.weight");
  int64_t bad = 0;
  for (int64_t d = 0; d < kD; ++d)
    for (int64_t e = 0; e < kE; ++e) bad += bits(w.router, d * kE + e) != bits(gate, e * kD + d);
  for (int64_t j = 0; j < kE; ++j) {
    const Tensor &w1 = get(src, X(i, j, 1)), &w2 = get(src, X(i, j, 2)), &w3 = get(src, X(i, j, 3));
    for (int64_t d = 0; d < kD; ++d)
      for (int64_t f = 0; f < kF; ++f) {
        bad += bits(w.wi_0, (j * kD + d) * kF + f) != bits(w1, f * kD + d);
        bad += bits(w.wi_1, (j * kD + d) * kF + f) != bits(w3, f * kD + d);
        bad += bits(w.wo, (j * kF + f) * kD + d) != bits(w2, d * kF + f);
      }
  }
  EXPECT_EQ(bad, 0);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(Mixtral, ShardedCheckpointConvertsElementForElement) {
  for (DType dt : {DType::bf16, DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    testing::TempDir dir;
    const Named src = mixtral_tensors(dt);
    write_sharded(dir, src);
    MixtralConvertReport r = convert_from_mixtral(dir.path(), dir.file("out.st"), MixtralWi::separate);
    ASSERT_EQ(r.layers.size(), 2u);
    for (const MixtralLayer& L : r.layers) {
      EXPECT_EQ(L.E, kE);
      EXPECT_EQ(L.D, kD);
      EXPECT_EQ(L.F, kF);
      EXPECT_EQ(L.dtype, dt);
    }
    EXPECT_EQ(r.left_out, 4u);      // embed, norm, 2 x q_proj
    EXPECT_EQ(r.files.size(), 3u);  // index + 2 shards
    EXPECT_EQ(r.unlisted, 0u);
    EXPECT_EQ(r.tensors_written, 8u);
    SafetensorsFile out = read_safetensors(dir.file("out.st"));
    std::vector<std::string> names;
    for (const auto& [n, t] : out.tensors) names.push_back(n);
    EXPECT_EQ(names, (std::vector<std::string>{"layers.0.router.kernel", "layers.0.experts.wi_0",
                                               "layers.0.experts.wi_1", "layers.0.experts.wo",
                                               "layers.1.router.kernel", "layers.1.experts.wi_0",
                                               "layers.1.experts.wi_1", "layers.1.experts.wo"}));
    EXPECT_EQ(out.metadata.at("moe.converted_from"), "mixtral");
    if (dt == DType::f16) continue;  // weights_from widens f16 to f32: compare the file's own tensors
    for (int64_t i = 0; i < kLayers; ++i)
      expect_layer_matches(out, src, i, dt, "layers." + std::to_string(i) + ".");
  }
}

// f16 has no weights_from path that keeps the bits; check the file directly.
TEST(Mixtral, F16KeepsItsBits) {
  testing::TempDir dir;
  const Named src = mixtral_tensors(DType::f16, 1);
  write_safetensors(dir.file("m.st"), src);
  convert_from_mixtral(dir.file("m.st"), dir.file("out.st"), MixtralWi::separate);
  SafetensorsFile out = read_safetensors(dir.file("out.st"));
  const Tensor& wo = out.at("layers.0.experts.wo");
  ASSERT_EQ(wo.dtype(), DType::f16);
  const Tensor& w2 = get(src, X(0, 3, 2));
  for (int64_t f = 0; f < kF; ++f)
    for (int64_t d = 0; d < kD; ++d) ASSERT_EQ(bits(wo, (3 * kF + f) * kD + d), bits(w2, d * kF + f));
}

TEST(Mixtral, InputAsFileIndexOrDirectory) {
  testing::TempDir dir;
  const Named src = mixtral_tensors(DType::bf16);
  const std::string index = write_sharded(dir, src);
  convert_from_mixtral(index, dir.file("a.st"), MixtralWi::separate);
  testing::TempDir one;
  write_safetensors(one.file("model.safetensors"), src);
  convert_from_mixtral(one.path(), dir.file("b.st"), MixtralWi::separate);
  convert_from_mixtral(one.file("model.safetensors"), dir.file("c.st"), MixtralWi::separate);
  const std::string a = read_all(dir.file("a.st"));
  EXPECT_EQ(a, read_all(dir.file("b.st")));
  EXPECT_EQ(a, read_all(dir.file("c.st")));
}

// --prefuse: experts.wi = [wi_0 | wi_1] along the last axis; --split: the same bytes as [2, E, D/2, 2F].
TEST(Mixtral, PrefusedAndSplitLayouts) {
  testing::TempDir dir;
  write_sharded(dir, mixtral_tensors(DType::bf16));
  convert_from_mixtral(dir.path(), dir.file("sep.st"), MixtralWi::separate);
  convert_from_mixtral(dir.path(), dir.file("fused.st"), MixtralWi::prefused);
  convert_from_mixtral(dir.path(), dir.file("split.st"), MixtralWi::split);
  SafetensorsFile sep = read_safetensors(dir.file("sep.st")), fused = read_safetensors(dir.file("fused.st")),
                  split = read_safetensors(dir.file("split.st"));
  EXPECT_EQ(fused.metadata.at("moe.wi_layout"), "fused");
  EXPECT_EQ(split.metadata.at("moe.wi_layout"), "split");
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    Config c = config_for();
    c.prefuse_moe_weights = true;
    LayerWeights wf = weights_from(
        c, [&](const std::string& n) { return fused.find(n); }, p, fused.path);
    c.moe_split_expert_weight_layout = true;
    LayerWeights ws = weights_from(
        c, [&](const std::string& n) { return split.find(n); }, p, split.path);
    EXPECT_TRUE(ws.wi.reshaped({kE, kD, 2 * kF}).bit_equal(wf.wi));
    const Tensor &w0 = sep.at(p + "experts.wi_0"), &w1 = sep.at(p + "experts.wi_1");
    int64_t bad = 0;
    for (int64_t r = 0; r < kE * kD; ++r)
      for (int64_t f = 0; f < kF; ++f) {
        bad += bits(wf.wi, r * 2 * kF + f) != bits(w0, r * kF + f);
        bad += bits(wf.wi, r * 2 * kF + kF + f) != bits(w1, r * kF + f);
      }
    EXPECT_EQ(bad, 0) << p;
    EXPECT_TRUE(wf.router.bit_equal(sep.at(p + "router.kernel")));
    EXPECT_TRUE(wf.wo.bit_equal(sep.at(p + "experts.wo")));
  }
}

// Mixtral -> engine -> Mixtral -> engine -> Mixtral: the second round writes
// the same bytes as the first, from every wi layout, and the Mixtral tensors
// are the original ones.
TEST(Mixtral, RoundTripIsByteExact) {
  testing::TempDir dir;
  const Named src = mixtral_tensors(DType::bf16);
  write_sharded(dir, src);
  convert_from_mixtral(dir.path(), dir.file("b.st"), MixtralWi::separate);
  MixtralConvertReport r = convert_to_mixtral(dir.file("b.st"), dir.file("c.st"));
  EXPECT_EQ(r.layers.size(), 2u);
  EXPECT_EQ(r.left_out, 0u);
  SafetensorsFile c = read_safetensors(dir.file("c.st"));
  EXPECT_EQ(c.metadata.at("format"), "pt");
  ASSERT_EQ(c.tensors.size(), size_t(kLayers * (3 * kE + 1)));
  EXPECT_EQ(c.tensors[0].first, X(0, 0, 1));
  EXPECT_EQ(c.tensors[3 * kE].first, P(0) + "gate.weight");
  for (const auto& [n, t] : c.tensors) EXPECT_TRUE(t.bit_equal(get(src, n))) << n;
  convert_from_mixtral(dir.file("c.st"), dir.file("d.st"), MixtralWi::separate);
  EXPECT_EQ(read_all(dir.file("d.st")), read_all(dir.file("b.st")));
  convert_to_mixtral(dir.file("d.st"), dir.file("e.st"));
  EXPECT_EQ(read_all(dir.file("e.st")), read_all(dir.file("c.st")));
  // One unprefixed layer (--layer 1) comes back as model.layers.0 with layer 1's tensors.
  convert_from_mixtral(dir.path(), dir.file("l1.st"), MixtralWi::prefused, 1);
  convert_to_mixtral(dir.file("l1.st"), dir.file("l1m.st"));
  SafetensorsFile l1 = read_safetensors(dir.file("l1m.st"));
  ASSERT_EQ(l1.tensors.size(), size_t(3 * kE + 1));
  for (const auto& [n, t] : l1.tensors) {
    ASSERT_TRUE(n.starts_with("model.layers.0.")) << n;
    EXPECT_TRUE(t.bit_equal(get(src, "model.layers.1." + n.substr(15)))) << n;
  }
  for (MixtralWi wi : {MixtralWi::prefused, MixtralWi::split}) {
    convert_from_mixtral(dir.path(), dir.file("f.st"), wi);
    convert_to_mixtral(dir.file("f.st"), dir.file("g.st"));
    EXPECT_EQ(read_all(dir.file("g.st")), read_all(dir.file("c.st"))) << int(wi);
  }
}

// A `moe train`-style file: norm.scale and optimizer moments are left out and counted.
TEST(Mixtral, ToMixtralLeavesOutOtherTensors) {
  testing::TempDir dir;
  write_sharded(dir, mixtral_tensors(DType::f32));
  convert_from_mixtral(dir.path(), dir.file("b.st"), MixtralWi::separate);
  SafetensorsFile b = read_safetensors(dir.file("b.st"));
  b.tensors.emplace_back("layers.0.norm.scale", uniform({kD}, 3));
  b.tensors.emplace_back("opt.m.layers.0.router.kernel", uniform({kD, kE}, 4));
  write_safetensors(dir.file("ckpt.st"), b.tensors);
  MixtralConvertReport r = convert_to_mixtral(dir.file("ckpt.st"), dir.file("c.st"));
  EXPECT_EQ(r.left_out, 2u);
  EXPECT_EQ(r.left_out_examples,
            (std::vector<std::string>{"layers.0.norm.scale", "opt.m.layers.0.router.kernel"}));
  EXPECT_EQ(read_safetensors(dir.file("c.st")).tensors.size(), size_t(kLayers * (3 * kE + 1)));
}

// Conversion holds one output tensor and one expert tensor at a time, not the checkpoint.
TEST(Mixtral, StreamsLayerByLayer) {
  testing::TempDir dir;
  constexpr int64_t L = 16, E = 8, D = 32, F = 48;
  const Named src = mixtral_tensors(DType::f32, L, E, D, F);
  write_sharded(dir, src);
  int64_t total = 0;
  for (const auto& [n, t] : src) total += int64_t(t.nbytes());
  const int64_t before = tensor_memory_stats().current_bytes;
  reset_tensor_memory_peak();
  convert_from_mixtral(dir.path(), dir.file("out.st"), MixtralWi::prefused);
  const int64_t peak = tensor_memory_stats().peak_bytes - before;
  const int64_t wi = E * D * 2 * F * 4, expert = F * D * 4;
  EXPECT_LE(peak, wi + expert + 4096) << "total " << total;  // padding slack
  EXPECT_GT(peak, wi - 1);
  EXPECT_LT(peak * 10, total);
}

// ---- errors ----

void expect_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

void expect_from_error(const Named& t, const std::vector<std::string>& needles,
                       MixtralWi wi = MixtralWi::separate) {
  testing::TempDir dir;
  write_sharded(dir, t);
  expect_error([&] { convert_from_mixtral(dir.path(), dir.file("out.st"), wi); }, needles);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.st")));
}

TEST(Mixtral, ErrorsNameTheLayerExpertAndTensor) {
  const Named ok = mixtral_tensors(DType::bf16);
  Named t = ok;
  for (int w = 1; w <= 3; ++w) t = without(t, X(1, 3, w));
  expect_from_error(t, {"layer 1", "missing expert 3", "E = 4"});
  expect_from_error(without(ok, X(0, 2, 3)), {"layer 0", "expert 2 is missing", X(0, 2, 3), "up proj"});
  t = ok;
  for (int w = 1; w <= 3; ++w) t = without(t, X(0, 1, w));
  expect_from_error(t, {"layer 0", "not contiguous", "expert 1 is missing but expert 2 exists"});
  expect_from_error(without(ok, P(1) + "gate.weight"), {"layer 1", "missing " + P(1) + "gate.weight"});
  expect_from_error(replaced(ok, X(0, 2, 2), uniform({kD, kF + 1}, 9, -1, 1, DType::bf16)),
                    {X(0, 2, 2), "shape [8, 7], expected [8, 6]", "down proj"});
  expect_from_error(replaced(ok, X(1, 0, 1), uniform({kF, kD + 2}, 9, -1, 1, DType::bf16)),
                    {X(1, 0, 1), "expected [6, 8]"});
  expect_from_error(replaced(ok, X(0, 1, 3), uniform({kF, kD}, 9)),
                    {"model-00001-of-00002.safetensors", X(0, 1, 3), "dtype F32 differs", "BF16"});
  // Every tensor of layer 1 with F = 7: consistent in itself, not with layer 0.
  Named wide = ok;
  for (auto& [n, v] : wide)
    if (n.starts_with("model.layers.1.block_sparse_moe.experts."))
      v = uniform(n.ends_with("w2.weight") ? Shape{kD, 7} : Shape{7, kD}, 5, -1, 1, DType::bf16);
  expect_from_error(wide, {"layer 1 has E = 4, D = 8, F = 7 but layer 0 has E = 4, D = 8, F = 6"});
  Named odd = ok;
  odd.emplace_back(P(0) + "experts.1.w4.weight", uniform({kF, kD}, 9, -1, 1, DType::bf16));
  expect_from_error(odd, {P(0) + "experts.1.w4.weight", "none of gate.weight"});
  Named ints = ok;
  ints = replaced(ints, P(0) + "gate.weight", Tensor(DType::i32, {kE, kD}));
  expect_from_error(ints, {P(0) + "gate.weight", "not a float type"});
  expect_from_error({{"model.embed_tokens.weight", uniform({4, 4}, 1)}},
                    {"no Mixtral MoE block found", "1 tensors"});
  expect_from_error(mixtral_tensors(DType::bf16, 1, 3), {"--split needs an even E and D", "E = 3"},
                    MixtralWi::split);
}

TEST(Mixtral, ErrorsOfTheFiles) {
  testing::TempDir dir;
  const std::string index = write_sharded(dir, mixtral_tensors(DType::bf16));
  const std::string out = dir.file("out.st");
  // A tensor of the index absent from its shard.
  nlohmann::json j = nlohmann::json::parse(read_all(index));
  j["weight_map"]["model.layers.0.mlp.extra"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir.file("extra.json")) << j.dump();
  expect_error(
      [&] { convert_from_mixtral(dir.file("extra.json"), out, MixtralWi::separate); },
      {"extra.json", "'model.layers.0.mlp.extra'", "model-00001-of-00002.safetensors", "has no tensor"});
  // A shard listed but missing.
  j = nlohmann::json::parse(read_all(index));
  j["weight_map"]["model.norm.weight"] = "model-00003-of-00003.safetensors";
  std::ofstream(dir.file("gone.json")) << j.dump();
  expect_error([&] { convert_from_mixtral(dir.file("gone.json"), out, MixtralWi::separate); },
               {"gone.json", "shard 'model-00003-of-00003.safetensors'", "is missing"});
  // Not an index; not safetensors; a directory with neither file.
  std::ofstream(dir.file("bad.json")) << "{\"weights\": {}}";
  expect_error([&] { convert_from_mixtral(dir.file("bad.json"), out, MixtralWi::separate); },
               {"bad.json", "weight_map"});
  std::ofstream(dir.file("text.safetensors")) << "this is not a safetensors file at all";
  expect_error([&] { convert_from_mixtral(dir.file("text.safetensors"), out, MixtralWi::separate); },
               {"text.safetensors", "not a safetensors file"});
  testing::TempDir empty;
  expect_error([&] { convert_from_mixtral(empty.path(), out, MixtralWi::separate); },
               {empty.path(), "neither model.safetensors.index.json nor model.safetensors"});
  expect_error([&] { convert_from_mixtral(dir.file("nope.safetensors"), out, MixtralWi::separate); },
               {"nope.safetensors", "cannot open"});
  // A tensor in a shard but not in the index is counted, not converted.
  j = nlohmann::json::parse(read_all(index));
  j["weight_map"].erase("model.norm.weight");
  std::ofstream(dir.file("fewer.json")) << j.dump();
  EXPECT_EQ(convert_from_mixtral(dir.file("fewer.json"), out, MixtralWi::separate).unlisted, 1u);
  EXPECT_EQ(convert_from_mixtral(dir.path(), out, MixtralWi::separate, 1).layers.size(), 1u);
  expect_error([&] { convert_from_mixtral(dir.path(), out, MixtralWi::separate, 5); },
               {"--layer 5", "layers 0 .. 1"});
}

TEST(Mixtral, ToMixtralErrors) {
  testing::TempDir dir;
  write_sharded(dir, mixtral_tensors(DType::bf16));
  convert_from_mixtral(dir.path(), dir.file("b.st"), MixtralWi::separate);
  Named b = read_safetensors(dir.file("b.st")).tensors;
  auto expect_to = [&](const Named& t, const std::vector<std::string>& needles) {
    write_safetensors(dir.file("in.st"), t);
    expect_error([&] { convert_to_mixtral(dir.file("in.st"), dir.file("o.st")); }, needles);
    EXPECT_FALSE(std::filesystem::exists(dir.file("o.st")));
  };
  expect_to(without(b, "layers.1.experts.wo"), {"layer 1", "missing 'layers.1.experts.wo'"});
  expect_to(replaced(b, "layers.0.experts.wi_1", uniform({kE, kD, kF}, 1)),
            {"'layers.0.experts.wi_1'", "dtype F32 differs"});
  expect_to(replaced(b, "layers.0.experts.wi_0", uniform({kE, kD, kF + 1}, 1, -1, 1, DType::bf16)),
            {"'layers.0.experts.wi_0'", "expected [4, 8, 6]"});
  Named both = b;
  both.emplace_back("router.kernel", uniform({kD, kE}, 1));
  expect_to(both, {"ambiguous"});
  expect_to({{"x", uniform({2}, 1)}}, {"no MoE layer weights found"});
}

// ---- the CLI ----

TEST(Mixtral, CliConvertsStepsAndReportsErrors) {
  testing::TempDir dir;
  const Named src = mixtral_tensors(DType::bf16);
  write_sharded(dir, src);
  auto r = testing::run_moe("convert --from mixtral " + dir.path() + " " + dir.file("out.st"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 layers (0, 1), E=4, D=8, F=6, bf16, experts.wi_0/wi_1"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("left out 4 tensors that are not MoE-layer weights (model.embed_tokens.weight"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model.safetensors.index.json and its 2 shards"), std::string::npos) << r.out;
  r = testing::run_moe("convert --to mixtral " + dir.file("out.st") + " " + dir.file("back.st"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("engine -> Mixtral: 2 layers"), std::string::npos) << r.out;
  r = testing::run_moe("convert --from mixtral --split " + dir.file("back.st") + " " + dir.file("s.st"),
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_safetensors(dir.file("s.st")).at("layers.1.experts.wi").shape(), (Shape{2, 4, 4, 12}));

  // `moe step` on layer 1, converted alone, computes what the library computes from the stacked file.
  r = testing::run_moe("convert --from mixtral --layer 1 " + dir.file("model.safetensors.index.json") + " " +
                           dir.file("l1.st"),
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("checked all 2 MoE blocks"), std::string::npos) << r.out;
  const char* yaml = "num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 8\nmoe_mlp_dim: 6\ndtype: bf16\n";
  std::ofstream(dir.file("c.yml")) << yaml;
  const Tensor x = uniform({9, kD}, 7), dy = uniform({9, kD}, 8);
  write_safetensors(dir.file("in.st"), {{"x", x}, {"dy", dy}});
  r = testing::run_moe("step --config " + dir.file("c.yml") + " --weights " + dir.file("l1.st") +
                           " --inputs " + dir.file("in.st") + " --out " + dir.file("y.st"),
                       dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Config cfg = parse_config(yaml, "c", {}).config;
  SafetensorsFile stacked = read_safetensors(dir.file("out.st"));
  LayerWeights w = weights_from(
      cfg, [&](const std::string& n) { return stacked.find(n); }, "layers.1.", "out.st");
  LayerOutputs o;
  auto fwd = layer_forward(cfg, w, x, nullptr, o);
  SafetensorsFile y = read_safetensors(dir.file("y.st"));
  EXPECT_TRUE(o.y.bit_equal(y.at("y")));
  EXPECT_TRUE(layer_backward(cfg, *fwd, dy).dx.bit_equal(y.at("grad.x")));

  // Errors: exit 1, the message names the thing, no output file.
  std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
  r = testing::run_moe("convert --from mixtral " + dir.path() + " " + dir.file("x.st"), dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("shard 'model-00002-of-00002.safetensors'"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("x.st")));
  for (const char* bad :
       {"--from mixtral --to split", "--to split --prefuse", "--from mixtral --prefuse --split", ""}) {
    r = testing::run_moe(std::string("convert ") + bad + " " + dir.file("out.st") + " " + dir.file("x.st"),
                         dir.path());
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_FALSE(std::filesystem::exists(dir.file("x.st"))) << bad;
  }
}

// The streaming reader behind the conversion.
TEST(SafetensorsReader, ReadsRowsAndBytesAndChecksRanges) {
  testing::TempDir dir;
  const Tensor a = uniform({5, 3, 2}, 1), s = Tensor::scalar_f32(2.5f);
  write_safetensors(dir.file("r.st"), {{"s", s}, {"a", a}}, {{"k", "v"}});
  SafetensorsReader r(dir.file("r.st"));
  ASSERT_EQ(r.entries().size(), 2u);
  EXPECT_EQ(r.entries()[1].name, "a");
  EXPECT_EQ(r.metadata().at("k"), "v");
  EXPECT_TRUE(r.read("a").bit_equal(a));
  EXPECT_TRUE(r.read("s").bit_equal(s));
  EXPECT_TRUE(r.read_rows("a", 2, 2).bit_equal(a.slice_rows(2, 4).clone()));
  float v[2];
  r.read_bytes("a", 4 * 6 + 4, 8, v);
  EXPECT_EQ(v[0], a.data<float>()[7]);
  EXPECT_EQ(v[1], a.data<float>()[8]);
  expect_error([&] { r.read_rows("a", 4, 2); }, {"r.st: tensor 'a'", "rows [4, 6)", "[5, 3, 2]"});
  expect_error([&] { r.read_bytes("a", 100, 40, v); }, {"r.st: tensor 'a'", "outside its 120 bytes"});
  expect_error([&] { r.read("b"); }, {"r.st", "no tensor named 'b'"});
  EXPECT_EQ(r.find("b"), nullptr);
}

}  // namespace
}  // namespace moe
