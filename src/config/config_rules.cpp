// The rules a resolved Config must satisfy (SPEC.md §3, §5, §6, §7), the
// offload-target parser. Every message starts with the key it is about.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <set>
#include <sstream>

#include "config/config_keys.h"
#include "moe/config.h"
#include "moe/memory_estimate.h"

namespace moe {
namespace {

using Problems = std::vector<std::string>;

template <class... Args>
void add(Problems& out, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  out.push_back(os.str());
}

// " (got <printed value of key>)"
std::string got(const Config& c, const char* key) { return " (got " + config_value(c, key) + ")"; }

void require_int_at_least(Problems& out, const Config& c, const char* key, int64_t v, int64_t min) {
  if (v < min) add(out, key, " must be >= ", min, got(c, key));
}

// Finite and > 0 (strict) or >= 0.
void require_nonneg_float(Problems& out, const Config& c, const char* key, double v, bool strict) {
  bool ok = std::isfinite(v) && (strict ? v > 0 : v >= 0);
  if (!ok) add(out, key, " must be finite and ", strict ? "> 0" : ">= 0", got(c, key));
}

void check_layer(Problems& out, const Config& c) {
  const std::array<std::pair<const char*, int64_t>, 4> required{
      {{"num_experts", c.num_experts},
       {"num_experts_per_tok", c.num_experts_per_tok},
       {"emb_dim", c.emb_dim},
       {"moe_mlp_dim", c.moe_mlp_dim}}};
  for (const auto& [key, v] : required)
    if (v <= 0) add(out, key, " is required and must be > 0", got(c, key));
  if (c.num_experts > 0 && c.num_experts_per_tok > c.num_experts)
    add(out, "num_experts_per_tok must be <= num_experts (got ", c.num_experts_per_tok, " > ", c.num_experts,
        ")");
  require_nonneg_float(out, c, "routed_scaling_factor", c.routed_scaling_factor, true);
  require_nonneg_float(out, c, "load_balance_loss_weight", c.load_balance_loss_weight, false);
  require_nonneg_float(out, c, "router_z_loss_weight", c.router_z_loss_weight, false);
  if (!(c.capacity_factor == -1.0 || c.capacity_factor > 0))
    add(out, "capacity_factor must be -1 (dropless) or > 0", got(c, "capacity_factor"));
  if (c.moe_split_expert_weight_layout) {
    if (!c.prefuse_moe_weights)
      add(out, "moe_split_expert_weight_layout=true requires prefuse_moe_weights=true");
    if (c.num_experts % 2 != 0)
      add(out, "moe_split_expert_weight_layout=true requires an even num_experts", got(c, "num_experts"));
    if (c.emb_dim % 2 != 0)
      add(out, "moe_split_expert_weight_layout=true requires an even emb_dim", got(c, "emb_dim"));
  }
}

void check_parallelism(Problems& out, const Config& c) {
  require_nonneg_float(out, c, "collective_timeout_s", c.collective_timeout_s, false);
  require_nonneg_float(out, c, "collective_liveness_s", c.collective_liveness_s, false);
  const std::array<std::pair<const char*, int64_t>, 3> axes{{{"data_parallelism", c.data_parallelism},
                                                             {"fsdp_parallelism", c.fsdp_parallelism},
                                                             {"expert_parallelism", c.expert_parallelism}}};
  std::string rest;  // the axes set to -1
  for (const auto& [key, v] : axes) {
    if (v < 1 && v != -1) add(out, key, " must be >= 1 or -1 (the rest)", got(c, key));
    if (v == -1) rest += (rest.empty() ? "" : ", ") + std::string(key);
  }
  if (rest.find(',') != std::string::npos)
    add(out, "at most one of data_parallelism, fsdp_parallelism, expert_parallelism may be -1 (got -1 for ",
        rest, ")");
  if (c.expert_parallelism > 0 && c.num_experts > 0 && c.num_experts % c.expert_parallelism != 0)
    add(out, "num_experts must be divisible by expert_parallelism (got ", c.num_experts, " and ",
        c.expert_parallelism, ")");
  if (c.expert_parallelism == 1 && c.use_ring_of_experts)
    add(out, "When expert_parallelism is 1, use_ring_of_experts must be false");
  if (c.expert_parallelism == 1 && c.ragged_buffer_factor != -1.0)
    add(out, "When expert_parallelism is 1, ragged_buffer_factor must be -1", got(c, "ragged_buffer_factor"));
  if (c.use_ring_of_experts && c.ep_all_to_all == EpAllToAll::hierarchical)
    add(out, "ep_all_to_all=hierarchical needs the all-to-all, which use_ring_of_experts=true replaces (use flat or "
        "auto with the ring of experts)");
  require_int_at_least(out, c, "num_moe_token_chunks", c.num_moe_token_chunks, 1);
  if (!(c.ragged_buffer_factor == -1.0 || c.ragged_buffer_factor > 0))
    add(out, "ragged_buffer_factor must be -1 or > 0", got(c, "ragged_buffer_factor"));
}

// dtype=f64 (the reference-only double path, docs/config.md) runs on one process only.
void check_f64(Problems& out, const Config& c) {
  if (c.dtype != DType::f64) return;
  const std::array<std::pair<const char*, int64_t>, 3> axes{{{"data_parallelism", c.data_parallelism},
                                                             {"fsdp_parallelism", c.fsdp_parallelism},
                                                             {"expert_parallelism", c.expert_parallelism}}};
  for (const auto& [key, v] : axes)
    if (v != 1)
      add(out, "dtype=f64 runs on one process only (reference kernels): ", key, " must be 1", got(c, key));
}

// The offload items of `spec`: split on commas, spaces trimmed, empty items dropped.
std::vector<std::string> offload_items(const std::string& spec) {
  std::vector<std::string> items;
  std::istringstream in(spec);
  for (std::string item; std::getline(in, item, ',');) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) items.push_back(item.substr(b, e - b + 1));
  }
  return items;
}

void check_offload(Problems& out, const Config& c) {
  require_int_at_least(out, c, "side_engine_threads", c.side_engine_threads, 0);
  try {
    parse_offload_targets(c.moe_offload_targets);
  } catch (const Error& e) {
    out.push_back(e.what());
  }
  if (!offload_items(c.moe_offload_targets).empty() && c.side_engine_threads == 0)
    add(out, "moe_offload_targets=", c.moe_offload_targets,
        " needs a side engine, but side_engine_threads is 0");
}

void check_train(Problems& out, const Config& c) {
  require_int_at_least(out, c, "num_layers", c.num_layers, 1);
  require_int_at_least(out, c, "steps", c.steps, 1);
  require_int_at_least(out, c, "batch_tokens", c.batch_tokens, 1);
  require_nonneg_float(out, c, "learning_rate", c.learning_rate, true);
  require_int_at_least(out, c, "warmup_steps", c.warmup_steps, 0);
  require_nonneg_float(out, c, "weight_decay", c.weight_decay, false);
  if (!(c.min_lr_ratio >= 0 && c.min_lr_ratio <= 1))
    add(out, "min_lr_ratio must be in [0, 1]", got(c, "min_lr_ratio"));
  if (!(c.beta1 >= 0 && c.beta1 < 1)) add(out, "beta1 must be in [0, 1)", got(c, "beta1"));
  if (!(c.beta2 >= 0 && c.beta2 < 1)) add(out, "beta2 must be in [0, 1)", got(c, "beta2"));
  require_nonneg_float(out, c, "adam_eps", c.adam_eps, true);
  require_int_at_least(out, c, "keep_checkpoints", c.keep_checkpoints, 1);
  if (std::isnan(c.grad_clip)) add(out, "grad_clip must be a number", got(c, "grad_clip"));
  require_int_at_least(out, c, "checkpoint_period", c.checkpoint_period, 0);
  require_int_at_least(out, c, "log_period", c.log_period, 1);
  if (c.checkpoint_period > 0 && c.checkpoint_dir.empty())
    add(out, "checkpoint_period=", c.checkpoint_period, " requires checkpoint_dir");
}

// Resources before work: the expert weights one rank holds (E / expert_parallelism experts of
// wi_0, wi_1 and wo, in the stored dtype, plus the f32 router) must fit this machine's memory,
// and their element counts must not overflow 64 bits. Only when the layer keys are valid.
void check_resources(Problems& out, const Config& c) {
  if (c.num_experts <= 0 || c.emb_dim <= 0 || c.moe_mlp_dim <= 0 || c.expert_parallelism <= 0) return;
  using U128 = unsigned __int128;
  constexpr U128 kCap = U128(1) << 100;  // saturate: far above 2^63, far below the type's range
  const auto mul = [&](U128 a, uint64_t b) { return b != 0 && a > kCap / b ? kCap : std::min(a * b, kCap); };
  const uint64_t experts = uint64_t((c.num_experts + c.expert_parallelism - 1) / c.expert_parallelism);
  const U128 bytes =
      mul(mul(mul(mul(experts, uint64_t(c.emb_dim)), uint64_t(c.moe_mlp_dim)), 3), dtype_size(c.weight_dtype)) +
      mul(mul(uint64_t(c.emb_dim), uint64_t(c.num_experts)), 4);
  const auto gib = [](long double b) {
    std::ostringstream os;
    os.precision(3);
    os << b / (1024.0L * 1024.0L * 1024.0L) << " GiB";
    return os.str();
  };
  if (bytes >> 63) {
    add(out, "moe_mlp_dim, emb_dim, num_experts: the expert weights of one rank would need more than 2^63 bytes",
        " (num_experts=", c.num_experts, ", emb_dim=", c.emb_dim, ", moe_mlp_dim=", c.moe_mlp_dim, ")");
    return;
  }
  const uint64_t mem = physical_memory_bytes();
  if (mem > 0 && bytes > mem)
    add(out, "moe_mlp_dim, emb_dim, num_experts: the expert weights of one rank need ", uint64_t(bytes), " bytes (",
        gib((long double)bytes), ", ", uint64_t(experts), " experts x 3 x ", c.emb_dim, " x ", c.moe_mlp_dim, " x ",
        dtype_size(c.weight_dtype), " bytes), but this machine has ", mem, " bytes of memory (", gib(mem), ")");
}

constexpr std::array<const char*, 3> kOffloadTargets{"fsdp_all_gather", "ep_collectives", "ragged_sort"};


}  // namespace

std::vector<std::string> parse_offload_targets(const std::string& spec) {
  std::set<std::string> wanted;
  std::vector<std::string> unknown;
  for (const auto& item : offload_items(spec)) {
    bool known = item == "all";
    for (const char* t : kOffloadTargets) known = known || item == t;
    if (!known) unknown.push_back("'" + item + "'");
    if (item == "all")
      wanted.insert(kOffloadTargets.begin(), kOffloadTargets.end());
    else
      wanted.insert(item);
  }
  if (!unknown.empty()) {
    std::string names;
    for (const auto& u : unknown) names += (names.empty() ? "" : ", ") + u;
    fail("moe_offload_targets: unknown target", unknown.size() > 1 ? "s " : " ", names, " in \"", spec,
         "\"; valid targets: fsdp_all_gather, ep_collectives, ragged_sort, all");
  }
  std::vector<std::string> out;
  for (const char* t : kOffloadTargets)
    if (wanted.count(t)) out.push_back(t);
  return out;
}

std::vector<std::string> config_problems(const Config& c) {
  Problems out;
  check_layer(out, c);
  check_parallelism(out, c);
  check_f64(out, c);
  check_offload(out, c);
  check_train(out, c);
  check_resources(out, c);
  return out;
}

}  // namespace moe
