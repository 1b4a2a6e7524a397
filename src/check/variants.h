// The variants of `moe check` (docs/check.md): one parallel layout or feature
// each, run as one distributed step and compared with the single-process
// layer on the same weights and inputs; some must also equal a counterpart
// variant bit for bit (chunking, explicit FSDP plan, kernel choice).
#pragma once

#include <string>
#include <vector>

#include "moe/config.h"

namespace moe::check {

// What a variant must equal besides the single-process layer.
enum class CounterpartRule {
  none,
  everything,   // loss, y and every gradient bit for bit (chunks, explicit plan)
  activations,  // loss, y and grad.x bit for bit (reference vs fused kernels, SPEC.md §4)
};

struct VariantSpec {
  std::string name;
  int data = 1, fsdp = 1, expert = 1;  // mesh; ranks = the product
  void (*tweak)(Config&) = nullptr;    // features on top of the base config
  bool explicit_plan = false;          // DistLayer's explicit FSDP gather plan
  std::string counterpart;             // variant it must equal ("" = none)
  CounterpartRule rule = CounterpartRule::none;
  std::string what;  // one line for --list and docs

  int ranks() const { return data * fsdp * expert; }
};

// Every variant, counterparts before the variants compared with them.
const std::vector<VariantSpec>& all_variants();

// The named variants (every one when `names` is empty) in registry order,
// each preceded by its counterpart. An unknown name is an error listing the
// known ones.
std::vector<VariantSpec> select_variants(const std::vector<std::string>& names);

// `base` with the variant's parallelism and features.
Config variant_config(const Config& base, const VariantSpec& v);

}  // namespace moe::check
