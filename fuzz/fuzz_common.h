// Helpers shared by the fuzz targets (fuzz/*_fuzz.cpp). Each target feeds
// its input to one reader and accepts only moe::Error: any other exception
// escapes and libFuzzer reports it, as it does a crash, a leak or a
// sanitizer report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "moe/config.h"

namespace moe::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// The small layer the targets check their input against: E=2, K=1, D=4, F=2,
// plus `extra` YAML lines (e.g. "prefuse_moe_weights: true\n").
inline Config small_config(const std::string& extra = "") {
  return parse_config("num_experts: 2\nnum_experts_per_tok: 1\nemb_dim: 4\nmoe_mlp_dim: 2\n" + extra,
                      "<fuzz>", {})
      .config;
}

}  // namespace moe::fuzz
