// moe convert: the expert-weight layouts and Mixtral checkpoints.
//  --to split|fused IN OUT: rewrites every `experts.wi` tensor of a weights (or
//    checkpoint) file between the prefused [E, D, 2F] and the split
//    [2, E, D/2, 2F] layout (SPEC.md §5). Bytes unchanged.
//  --from mixtral IN OUT: a Mixtral checkpoint's sparse MoE blocks -> the
//    engine's names (src/io/mixtral.h); --to mixtral IN OUT: the reverse.
// OUT is always written atomically.
#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "io/convert.h"
#include "io/mixtral.h"

namespace moe::cli {
namespace {
struct ConvertArgs {
  std::string to, from, in, out;
  bool prefuse = false, split = false;
  int64_t layer = -1;
};

std::string layer_list(const std::vector<MixtralLayer>& layers) {
  std::string s;
  for (size_t k = 0; k < layers.size(); ++k) {
    if (k == 3 && layers.size() > 5) {
      s += ", ..., " + std::to_string(layers.back().index);
      break;
    }
    s += (k ? ", " : "") + std::to_string(layers[k].index);
  }
  return s;
}

// "bf16", or "bf16 and f32" when layers differ.
std::string dtypes_of(const std::vector<MixtralLayer>& layers) {
  std::vector<DType> seen;
  std::string s;
  for (const MixtralLayer& L : layers)
    if (std::find(seen.begin(), seen.end(), L.dtype) == seen.end()) {
      seen.push_back(L.dtype);
      s += (s.empty() ? "" : " and ") + std::string(dtype_name(L.dtype));
    }
  return s;
}

void print_mixtral(const MixtralConvertReport& r, const char* direction, const std::string& wi,
                   const std::string& out) {
  const MixtralLayer& L = r.layers.front();
  std::printf("moe convert: %s: %zu layer%s (%s), E=%lld, D=%lld, F=%lld, %s%s\n", direction, r.layers.size(),
              r.layers.size() == 1 ? "" : "s", layer_list(r.layers).c_str(), (long long)L.E, (long long)L.D,
              (long long)L.F, dtypes_of(r.layers).c_str(), wi.c_str());
  if (r.blocks_found > r.layers.size())
    std::printf("  checked all %zu MoE blocks of the input; wrote only the one asked for\n", r.blocks_found);
  if (r.files.size() == 1)
    std::printf("  read %s\n", r.files.front().c_str());
  else
    std::printf("  read %s and its %zu shard%s\n", r.files.front().c_str(), r.files.size() - 1,
                r.files.size() == 2 ? "" : "s");
  if (r.left_out) {
    std::printf("  left out %zu tensor%s that %s (", r.left_out, r.left_out == 1 ? "" : "s",
                r.left_out == 1 ? "is not an MoE-layer weight" : "are not MoE-layer weights");
    for (size_t k = 0; k < r.left_out_examples.size(); ++k)
      std::printf("%s%s", k ? ", " : "", r.left_out_examples[k].c_str());
    std::printf("%s)\n", r.left_out > r.left_out_examples.size() ? ", ..." : "");
  }
  if (r.unlisted)
    std::printf("  ignored %zu tensor%s present in a shard but not listed in the index\n", r.unlisted,
                r.unlisted == 1 ? "" : "s");
  std::printf("  wrote %s (%zu tensors)\n", out.c_str(), r.tensors_written);
}

void run_convert(const ConvertArgs& a) {
  const bool from_mixtral = !a.from.empty();
  if (from_mixtral == !a.to.empty())
    fail("moe convert: give exactly one of --to split|fused|mixtral and --from mixtral");
  if (!from_mixtral && (a.prefuse || a.split || a.layer >= 0))
    fail("moe convert: --prefuse, --split and --layer go with --from mixtral (--to ", a.to, " was given)");
  if (a.prefuse && a.split)
    fail("moe convert: --prefuse and --split exclude each other (--split is prefused too)");
  if (from_mixtral) {
    const MixtralWi wi = a.split ? MixtralWi::split : a.prefuse ? MixtralWi::prefused : MixtralWi::separate;
    MixtralConvertReport r = convert_from_mixtral(a.in, a.out, wi, a.layer);
    const char* layout = wi == MixtralWi::split      ? ", experts.wi split [2, E, D/2, 2F]"
                         : wi == MixtralWi::prefused ? ", experts.wi prefused [E, D, 2F]"
                                                     : ", experts.wi_0/wi_1 [E, D, F]";
    print_mixtral(r, "Mixtral -> engine", layout, a.out);
    return;
  }
  if (a.to == "mixtral") {
    MixtralConvertReport r = convert_to_mixtral(a.in, a.out);
    print_mixtral(r, "engine -> Mixtral", "", a.out);
    return;
  }
  WiLayout to = a.to == "split" ? WiLayout::split : WiLayout::fused;
  std::vector<std::string> names = convert_wi_file(a.in, a.out, to);
  std::printf("moe convert: %zu tensor%s to the %s layout:", names.size(), names.size() == 1 ? "" : "s",
              wi_layout_name(to));
  for (const auto& n : names) std::printf(" %s", n.c_str());
  std::printf("\n  wrote %s\n", a.out.c_str());
}
}  // namespace

void add_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* c = app.add_subcommand(
      "convert",
      "--to split|fused: convert the expert weight `experts.wi` (and every `*.experts.wi`: stacked\n"
      "layers, optimizer moments) between the prefused layout [E, D, 2F] and the split layout\n"
      "[2, E, D/2, 2F]. A pure reshape: the bytes are identical, only the shapes and the metadata key\n"
      "`moe.wi_layout` change. Other tensors and metadata are copied unchanged.\n"
      "--from mixtral: the sparse MoE blocks of a Mixtral checkpoint\n"
      "(model.layers.{i}.block_sparse_moe.gate.weight, experts.{j}.w1/w2/w3.weight) become the\n"
      "engine's layers.{i}.router.kernel, experts.wi_0/wi_1 (or experts.wi) and experts.wo, transposed,\n"
      "dtype kept. IN: a .safetensors file, a directory with model.safetensors.index.json (+ shards) or\n"
      "model.safetensors, or the index .json. Other tensors (attention, norms, embeddings) are left out\n"
      "and counted. Reads one expert at a time.\n"
      "--to mixtral: the reverse, into one file (bit-exact round trip).");
  c->add_option("--to", a->to, "Target: split | fused (wi layout of an engine file), mixtral (Mixtral names)")
      ->check(CLI::IsMember({"split", "fused", "mixtral"}));
  c->add_option("--from", a->from, "Source format: mixtral (a Hugging Face Mixtral checkpoint)")
      ->check(CLI::IsMember({"mixtral"}));
  c->add_flag("--prefuse", a->prefuse,
              "With --from mixtral: write experts.wi [E, D, 2F] (prefuse_moe_weights)");
  c->add_flag("--split", a->split,
              "With --from mixtral: write experts.wi in the split layout [2, E, D/2, 2F] "
              "(moe_split_expert_weight_layout)");
  c->add_option("--layer", a->layer,
                "With --from mixtral: only model.layers.{N}, written without the layers.{i}. prefix "
                "(a one-layer weights file for moe step)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("IN", a->in, "Input (.safetensors file; for --from mixtral also a directory or index .json)")
      ->required();
  c->add_option("OUT", a->out, "Output .safetensors file (written atomically; may equal IN)")->required();
  c->callback([a] { run_convert(*a); });
}

}  // namespace moe::cli
