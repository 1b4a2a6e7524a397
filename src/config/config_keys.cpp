// The key table and typed scalar conversion (see config_keys.h).
#include "config/config_keys.h"

#include <array>
#include <charconv>
#include <type_traits>

namespace moe::config_detail {
namespace {

using C = Config;
using G = Group;

// Names of the non-dtype enums, indexed by enumerator value.
template <class T>
struct EnumNames;
template <>
struct EnumNames<ScoreFunc> {
  static constexpr std::array<const char*, 2> names{"softmax", "sigmoid"};
};
template <>
struct EnumNames<Activation> {
  static constexpr std::array<const char*, 2> names{"silu", "gelu"};
};
template <>
struct EnumNames<KernelChoice> {
  static constexpr std::array<const char*, 2> names{"reference", "fused"};
};

template <>
struct EnumNames<EpAllToAll> {
  static constexpr std::array<const char*, 3> names{"flat", "hierarchical", "auto"};
};

const std::vector<std::string> kKernels{"reference", "fused"};

std::vector<KeyDef> build_table() {
  return {
      // --- layer (SPEC.md §2) ---
      {"num_experts", &C::num_experts, G::layer, "E: number of routed experts", {}, true},
      {"num_experts_per_tok",
       &C::num_experts_per_tok,
       G::layer,
       "K: experts per token, 1 <= K <= E",
       {},
       true},
      {"emb_dim", &C::emb_dim, G::layer, "D: model width", {}, true},
      {"moe_mlp_dim", &C::moe_mlp_dim, G::layer, "F: expert hidden width", {}, true},
      {"dtype", &C::dtype, G::layer, "activation and GEMM input type; f64: one process, reference kernels",
       {"bf16", "f32", "f64"}},
      {"weight_dtype", &C::weight_dtype, G::layer, "stored weight type", {"f32", "bf16"}},
      {"routed_score_func", &C::routed_score_func, G::layer, "router scores", {"softmax", "sigmoid"}},
      {"norm_topk_prob", &C::norm_topk_prob, G::layer, "renormalize the top-K weights to sum to 1"},
      {"routed_scaling_factor", &C::routed_scaling_factor, G::layer, "multiplies the top-K weights; > 0"},
      {"load_balance_loss_weight", &C::load_balance_loss_weight, G::layer,
       "weight of the load-balance loss; >= 0"},
      {"router_z_loss_weight", &C::router_z_loss_weight, G::layer, "weight of the router z-loss; >= 0"},
      {"mlp_activation",
       &C::mlp_activation,
       G::layer,
       "expert activation (gelu: tanh form)",
       {"silu", "gelu"}},
      {"capacity_factor", &C::capacity_factor, G::layer, "-1: dropless; > 0: per-expert slot cap"},
      {"prefuse_moe_weights", &C::prefuse_moe_weights, G::layer, "store wi_0|wi_1 as one wi [E, D, 2F]"},
      {"moe_split_expert_weight_layout", &C::moe_split_expert_weight_layout, G::layer,
       "store wi as [2, E, D/2, 2F]"},
      {"moe_permute_kernel", &C::moe_permute_kernel, G::layer, "permute kernel", kKernels},
      {"moe_combine_kernel", &C::moe_combine_kernel, G::layer, "combine kernel", kKernels},
      {"float32_weight_sum", &C::float32_weight_sum, G::layer, "sum the combine in f32"},
      // --- parallelism (SPEC.md §3) ---
      {"data_parallelism", &C::data_parallelism, G::parallelism, "ranks on the data axis; -1: the rest"},
      {"fsdp_parallelism", &C::fsdp_parallelism, G::parallelism, "ranks on the fsdp axis; -1: the rest"},
      {"expert_parallelism", &C::expert_parallelism, G::parallelism,
       "ranks on the expert axis; -1: the rest"},
      {"shard_exp_on_fsdp", &C::shard_exp_on_fsdp, G::parallelism, "shard E (not D) over fsdp"},
      {"use_ring_of_experts", &C::use_ring_of_experts, G::parallelism,
       "all-gather tokens instead of all-to-all"},
      {"num_moe_token_chunks", &C::num_moe_token_chunks, G::parallelism, "token chunks per rank; >= 1"},
      {"ragged_buffer_factor", &C::ragged_buffer_factor, G::parallelism,
       "-1: worst-case receive buffer; > 0: cap at R * factor rows"},
      {"ep_all_to_all", &C::ep_all_to_all, G::parallelism,
       "expert all-to-all: flat; hierarchical (within hosts, then one message per host pair and lane); auto: "
       "hierarchical when the expert group spans several hosts with the same number (> 1) of ranks each",
       {"flat", "hierarchical", "auto"}},
      {"collective_timeout_s", &C::collective_timeout_s, G::parallelism,
       "seconds a collective or completion wait may last before the job ends; 0: no limit"},
      {"collective_liveness_s", &C::collective_liveness_s, G::parallelism,
       "seconds a collective waits before its peers are probed (silent ones end the job); 0: off"},
      // --- offload (SPEC.md §6) ---
      {"moe_offload_targets", &C::moe_offload_targets, G::offload,
       "comma list of fsdp_all_gather, ep_collectives, ragged_sort, all"},
      {"side_engine_threads", &C::side_engine_threads, G::offload, "side-engine worker threads; 0: none"},
      // --- training (moe train) ---
      {"num_layers", &C::num_layers, G::train, "MoE layers in the model stack; >= 1"},
      {"steps", &C::steps, G::train, "optimizer steps; >= 1"},
      {"batch_tokens", &C::batch_tokens, G::train, "tokens per step (global); >= 1"},
      {"learning_rate", &C::learning_rate, G::train, "learning rate; > 0"},
      {"warmup_steps", &C::warmup_steps, G::train, "learning-rate warmup steps; >= 0"},
      {"min_lr_ratio", &C::min_lr_ratio, G::train,
       "final learning rate / learning_rate (cosine decay); in [0, 1]"},
      {"beta1", &C::beta1, G::train, "AdamW first-moment decay; in [0, 1)"},
      {"beta2", &C::beta2, G::train, "AdamW second-moment decay; in [0, 1)"},
      {"adam_eps", &C::adam_eps, G::train, "AdamW denominator epsilon; > 0"},
      {"weight_decay", &C::weight_decay, G::train, "weight decay; >= 0"},
      {"grad_clip", &C::grad_clip, G::train, "global-norm gradient clip; <= 0 disables"},
      {"seed", &C::seed, G::train, "seed of the student weights and data"},
      {"teacher_seed", &C::teacher_seed, G::train, "seed of the teacher weights"},
      {"checkpoint_dir", &C::checkpoint_dir, G::train, "checkpoint directory; empty: none"},
      {"checkpoint_period", &C::checkpoint_period, G::train, "steps between checkpoints; 0: none"},
      {"keep_checkpoints", &C::keep_checkpoints, G::train, "newest checkpoints kept; >= 1"},
      {"metrics_file", &C::metrics_file, G::train, "JSON-lines metrics file; empty: none"},
      {"log_period", &C::log_period, G::train, "steps between log lines; >= 1"},
  };
}

// Whole-string integer, optional leading '+'.
std::optional<int64_t> parse_int(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// Whole-string float (also accepts integers, "inf", "nan"), optional leading '+'.
std::optional<double> parse_float(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, end);
}

std::string join_allowed(const KeyDef& k) {
  std::string s;
  for (const auto& a : k.allowed) s += (s.empty() ? "" : "|") + a;
  return s;
}

bool is_allowed(const KeyDef& k, const std::string& text) {
  for (const auto& a : k.allowed)
    if (a == text) return true;
  return false;
}

template <class T>
std::optional<T> enum_from_name(const std::string& text) {
  const auto& names = EnumNames<T>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<T>(i);
  return std::nullopt;
}

}  // namespace

const std::vector<KeyDef>& key_table() {
  static const std::vector<KeyDef> table = build_table();
  return table;
}

const KeyDef* find_key(std::string_view name) {
  for (const auto& k : key_table())
    if (name == k.name) return &k;
  return nullptr;
}

const char* group_name(Group g) {
  switch (g) {
    case Group::layer:
      return "layer";
    case Group::parallelism:
      return "parallelism";
    case Group::offload:
      return "offload";
    case Group::train:
      return "train";
  }
  return "?";
}

const char* type_name(const KeyDef& k) {
  static constexpr const char* kNames[] = {"int", "float", "bool", "string", "enum", "enum", "enum", "enum", "enum"};
  return kNames[k.field.index()];
}

std::string assign_value(Config& c, const KeyDef& k, const std::string& text) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_cvref_t<decltype(c.*member)>;
        if constexpr (std::is_same_v<T, int64_t>) {
          auto v = parse_int(text);
          if (!v) return "an integer";
          c.*member = *v;
        } else if constexpr (std::is_same_v<T, double>) {
          auto v = parse_float(text);
          if (!v) return "a number";
          c.*member = *v;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") return "true or false";
          c.*member = text == "true";
        } else if constexpr (std::is_same_v<T, std::string>) {
          c.*member = text;
        } else if constexpr (std::is_same_v<T, DType>) {
          if (!is_allowed(k, text)) return "one of " + join_allowed(k);
          c.*member = *dtype_from_name(text);
        } else {
          auto v = enum_from_name<T>(text);
          if (!v || !is_allowed(k, text)) return "one of " + join_allowed(k);
          c.*member = *v;
        }
        return "";
      },
      k.field);
}

std::string format_value(const Config& c, const KeyDef& k) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_cvref_t<decltype(c.*member)>;
        const T& v = c.*member;
        if constexpr (std::is_same_v<T, int64_t>)
          return std::to_string(v);
        else if constexpr (std::is_same_v<T, double>)
          return format_double(v);
        else if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>)
          return v;
        else if constexpr (std::is_same_v<T, DType>)
          return dtype_name(v);
        else
          return EnumNames<T>::names[static_cast<size_t>(v)];
      },
      k.field);
}

}  // namespace moe::config_detail
