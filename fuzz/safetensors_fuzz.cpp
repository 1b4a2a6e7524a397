// Fuzzes the safetensors reader (parse_safetensors: the size prefix, the
// JSON header, dtypes, shapes, offsets and their tiling of the data buffer)
// and weights_from over every file it accepts, for the three weight layouts
// (wi_0/wi_1, prefused wi, split prefused wi) with and without a prefix.
#include <string>

#include "fuzz_common.h"
#include "moe/layer.h"
#include "moe/safetensors.h"

namespace {

const std::vector<moe::Config>& layouts() {
  static const std::vector<moe::Config> c{
      moe::fuzz::small_config(), moe::fuzz::small_config("prefuse_moe_weights: true\n"),
      moe::fuzz::small_config("prefuse_moe_weights: true\nmoe_split_expert_weight_layout: true\n")};
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  moe::SafetensorsFile f;
  try {
    f = moe::parse_safetensors(moe::fuzz::as_text(data, size), "fuzz.safetensors");
  } catch (const moe::Error&) {
    return 0;
  }
  auto lookup = [&](const std::string& name) { return f.find(name); };
  for (const moe::Config& cfg : layouts()) {
    for (const char* prefix : {"", "layers.0."}) {
      try {
        moe::LayerWeights w = moe::weights_from(cfg, lookup, prefix, f.path);
      } catch (const moe::Error&) {
      }
    }
  }
  return 0;
}
