// The engine's configuration: every key of SPEC.md §7 (layer, parallelism,
// offload) plus the training keys, parsed from YAML and `key=value`
// overrides and validated in one place (src/config/config.cpp). The key
// table, defaults and rules are documented in docs/config.md.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe/dtype.h"
#include "moe/error.h"

namespace moe {

enum class ScoreFunc { softmax, sigmoid };
enum class Activation { silu, gelu };  // gelu = tanh approximation
enum class KernelChoice { reference, fused };
// The expert-parallel ragged all-to-all (docs/distributed.md, "Hierarchical all-to-all").
enum class EpAllToAll { flat, hierarchical, automatic };  // "flat" | "hierarchical" | "auto"

struct Config {
  // --- the layer (SPEC.md §2) ---
  int64_t num_experts = 0;          // E (required)
  int64_t num_experts_per_tok = 0;  // K (required)
  int64_t emb_dim = 0;              // D (required)
  int64_t moe_mlp_dim = 0;          // F (required)
  DType dtype = DType::bf16;        // activations and GEMM inputs: bf16 | f32
  DType weight_dtype = DType::f32;  // stored weights: f32 | bf16
  ScoreFunc routed_score_func = ScoreFunc::softmax;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  double load_balance_loss_weight = 0.01;
  double router_z_loss_weight = 0.0;
  Activation mlp_activation = Activation::silu;
  double capacity_factor = -1.0;  // -1: dropless; > 0: per-expert slot cap
  bool prefuse_moe_weights = false;
  bool moe_split_expert_weight_layout = false;
  KernelChoice moe_permute_kernel = KernelChoice::fused;
  KernelChoice moe_combine_kernel = KernelChoice::fused;
  bool float32_weight_sum = true;

  // --- parallelism (SPEC.md §3) ---
  int64_t data_parallelism = 1;  // one of the three may be -1: "the rest"
  int64_t fsdp_parallelism = 1;
  int64_t expert_parallelism = 1;
  bool shard_exp_on_fsdp = false;
  bool use_ring_of_experts = false;
  int64_t num_moe_token_chunks = 1;
  double ragged_buffer_factor = -1.0;
  EpAllToAll ep_all_to_all = EpAllToAll::flat;  // hierarchical: within hosts, then between them
  double collective_timeout_s = 300.0;  // the collective watchdog (include/moe/watchdog.h); 0: off
  double collective_liveness_s = 10.0;  // probe the peers of a wait this old (include/moe/watchdog.h); 0: off

  // --- offload (SPEC.md §6) ---
  std::string moe_offload_targets;  // "" | comma list | "all"
  int64_t side_engine_threads = 1;

  // --- training (`moe train`) ---
  int64_t num_layers = 2;
  int64_t steps = 100;
  int64_t batch_tokens = 256;  // tokens per step (global)
  double learning_rate = 1e-3;
  int64_t warmup_steps = 10;
  double min_lr_ratio = 0.1;  // cosine decay ends at min_lr_ratio * learning_rate
  double beta1 = 0.9;         // AdamW first-moment decay
  double beta2 = 0.999;       // AdamW second-moment decay
  double adam_eps = 1e-8;     // AdamW denominator epsilon
  double weight_decay = 0.01;
  double grad_clip = 1.0;  // global-norm clip; <= 0 disables
  int64_t seed = 0;
  int64_t teacher_seed = 1;
  std::string checkpoint_dir;  // "" = no checkpoints
  int64_t checkpoint_period = 0;
  int64_t keep_checkpoints = 3;  // newest checkpoints kept in checkpoint_dir
  std::string metrics_file;      // "" = none
  int64_t log_period = 10;
};

// One resolved key: name, printed value, and where it came from
// ("default", "file", "override").
struct ConfigEntry {
  std::string key;
  std::string value;
  std::string source;
};

struct LoadedConfig {
  Config config;
  std::vector<ConfigEntry> table;  // every key, in documentation order
};

// Every problem found while resolving a config (unknown keys, bad values,
// violated rules), one message per entry, each
// naming its key. what() is a header line followed by one problem per line.
class ConfigError : public Error {
 public:
  ConfigError(const std::string& origin, std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

// Parses YAML text (may be empty) then applies `key=value` overrides, and
// validates. Throws moe::Error listing every problem (one per line), each
// naming its key; an unknown key names the closest valid one.
// `origin` names the source in messages (a file path or "<embedded>").
LoadedConfig parse_config(const std::string& yaml_text, const std::string& origin,
                          const std::vector<std::string>& overrides);
// Reads the file, then parse_config. A missing or unreadable file is an error naming it.
LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides);

// Every rule violated by `c` (empty when `c` can run). parse_config calls this; it is public so tests, run-time
// checks and `moe validate --topology` reuse the same code.
std::vector<std::string> config_problems(const Config& c);

// The offload targets of SPEC.md §6. Splits `spec` on commas, trims spaces,
// ignores empty items; "all" expands to every target. Returns each target at
// most once, in the order fsdp_all_gather, ep_collectives, ragged_sort.
// Throws moe::Error naming every unknown item and listing the valid ones.
std::vector<std::string> parse_offload_targets(const std::string& spec);

// Names of every known key, in documentation order (for help text and suggestions).
const std::vector<std::string>& config_keys();

// Description of one key, for docs and help: type is "int", "float", "bool",
// "string" or "enum" (then `allowed` lists the values); group is "layer",
// "parallelism", "offload" or "train"; default_value is printed as in the table.
struct ConfigKeyInfo {
  std::string name;
  std::string type;
  std::string default_value;
  std::vector<std::string> allowed;
  std::string help;
  std::string group;
  bool required = false;
};
// Every key, in documentation order (grouped by `group`).
std::vector<ConfigKeyInfo> config_key_infos();

// Printed value of `key` in `c` ("8", "bf16", "true", "0.01", ""); the
// same spelling the resolved table and the override syntax use.
// REQUIRES: key is one of config_keys().
std::string config_value(const Config& c, const std::string& key);

// Human-readable table "key  value  source", aligned and grouped by section,
// for rank 0 to print. Empty string values print as "".
std::string format_config_table(const std::vector<ConfigEntry>& table);

// The key list for --help: one line per key (name, type, default, help),
// grouped by section.
std::string format_config_help();

}  // namespace moe
