// Registries of mesh variants (`moe check`, `moe bench --dist`): each variant
// is a mesh (data, fsdp, expert), a config tweak and the name of the variant
// it is compared with. V needs: name, data, fsdp, expert, tweak, ranks(), and
// the compared-with name as the member given to select_mesh_variants.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "moe/config.h"
#include "moe/dist_layer.h"
#include "moe/error.h"

namespace moe {

// The named variants (all when `names` is empty) in registry order, each
// preceded by the variant it is compared with. An unknown name is an error
// listing the known ones.
template <class V>
std::vector<V> select_mesh_variants(const std::vector<V>& all, const std::vector<std::string>& names,
                                    std::string V::*compared_with) {
  if (names.empty()) return all;
  auto find = [&](const std::string& n) { return std::find_if(all.begin(), all.end(), [&](const V& v) { return v.name == n; }); };
  std::vector<std::string> want;
  for (const std::string& n : names) {
    auto it = find(n);
    if (it == all.end()) {
      std::string known;
      for (const V& k : all) known += (known.empty() ? "" : ", ") + k.name;
      fail("unknown variant '", n, "' (known variants: ", known, ")");
    }
    if (!((*it).*compared_with).empty()) want.push_back((*it).*compared_with);
    want.push_back(n);
  }
  std::vector<V> out;
  for (const V& v : all)
    if (std::find(want.begin(), want.end(), v.name) != want.end()) out.push_back(v);
  return out;
}

// `base` with the variant's mesh and features.
template <class V>
Config mesh_variant_config(const Config& base, const V& v) {
  Config c = base;
  c.data_parallelism = v.data;
  c.fsdp_parallelism = v.fsdp;
  c.expert_parallelism = v.expert;
  if (v.tweak) v.tweak(c);
  return c;
}

// Why `v` (with its config `cfg`) cannot run in a world of `world_size`
// ranks ("" when it can); the same answer on every rank.
template <class V>
std::string mesh_skip_reason(const Config& cfg, const V& v, int world_size) {
  if (v.ranks() > world_size)
    return "needs " + std::to_string(v.ranks()) + " ranks, the world has " + std::to_string(world_size) +
           (world_size == 1 ? " (run under mpirun -np 4)" : "");
  std::vector<std::string> problems = config_problems(cfg);
  if (!problems.empty()) return problems[0];
  try {
    check_parallel_config(cfg, v.ranks());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moe
