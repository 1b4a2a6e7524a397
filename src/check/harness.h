// `moe check`: the gradient-equivalence harness of the first seed on this
// engine (docs/check.md). Every selected variant runs one distributed step
// on the same problem and is compared with the single-process layer.
//
// Ranks: a variant of n ranks runs on world ranks [0, n) (a communicator
// split off the world; the others sit it out and make none of its calls); a
// variant needing more ranks than the world has is skipped, as is one whose
// config is not allowed (config rules, mesh divisibility) or whose feature
// is not implemented yet. These decisions are computed identically on every
// rank from the config alone, so every rank makes the same world calls.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "check/compare.h"
#include "moe/comm.h"
#include "moe/config.h"

namespace moe::check {

struct CheckOptions {
  Config base;                        // the layer config; variants set parallelism and features
  int64_t tokens = 64;                // T of the global batch
  uint64_t seed = 0;                  // weights and inputs
  std::vector<std::string> variants;  // names; empty = all
};

// Collective over `world`. Returns the reports on world rank 0 (in variant
// order, calling on_report as each finishes); the other ranks get none.
std::vector<VariantReport> run_check(const CheckOptions& o, Communicator& world,
                                     const std::function<void(const VariantReport&)>& on_report);

}  // namespace moe::check
