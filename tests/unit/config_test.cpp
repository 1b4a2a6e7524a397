// Config parsing, rules and gates (include/moe/config.h, docs/config.md).
#include "moe/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace moe {
namespace {

const std::string kBase = "num_experts: 8\nnum_experts_per_tok: 2\nemb_dim: 16\nmoe_mlp_dim: 32\n";

// Every problem parse_config reports (empty when the config is valid).
std::vector<std::string> problems_of(const std::string& yaml,
                                     const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "test.yml", overrides);
  } catch (const ConfigError& e) {
    return e.problems();
  }
  return {};
}

// Index of the first problem containing `needle`, or -1.
int find(const std::vector<std::string>& problems, const std::string& needle) {
  for (size_t i = 0; i < problems.size(); ++i)
    if (problems[i].find(needle) != std::string::npos) return int(i);
  return -1;
}

std::string joined(const std::vector<std::string>& problems) {
  std::string s;
  for (const auto& p : problems) s += p + "\n";
  return s;
}

#define EXPECT_PROBLEM(problems, needle) EXPECT_GE(find(problems, needle), 0) << joined(problems)

const ConfigEntry& entry(const LoadedConfig& lc, const std::string& key) {
  auto it =
      std::find_if(lc.table.begin(), lc.table.end(), [&](const ConfigEntry& e) { return e.key == key; });
  EXPECT_NE(it, lc.table.end()) << key;
  return *it;
}

TEST(ConfigParse, DefaultsMatchSpec) {
  LoadedConfig lc = parse_config(kBase, "test.yml", {});
  const Config& c = lc.config;
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.dtype, DType::bf16);
  EXPECT_EQ(c.weight_dtype, DType::f32);
  EXPECT_EQ(c.routed_score_func, ScoreFunc::softmax);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.routed_scaling_factor, 1.0);
  EXPECT_EQ(c.load_balance_loss_weight, 0.01);
  EXPECT_EQ(c.mlp_activation, Activation::silu);
  EXPECT_EQ(c.capacity_factor, -1.0);
  EXPECT_EQ(c.expert_parallelism, 1);
  EXPECT_EQ(c.ragged_buffer_factor, -1.0);
  EXPECT_EQ(c.collective_timeout_s, 300.0);
  EXPECT_EQ(c.collective_liveness_s, 10.0);
  EXPECT_EQ(c.moe_offload_targets, "");
  EXPECT_EQ(c.side_engine_threads, 1);
  ASSERT_EQ(lc.table.size(), config_keys().size());
  for (size_t i = 0; i < lc.table.size(); ++i) EXPECT_EQ(lc.table[i].key, config_keys()[i]);
  EXPECT_EQ(entry(lc, "num_experts").source, "file");
  EXPECT_EQ(entry(lc, "dtype").source, "default");
  EXPECT_EQ(entry(lc, "dtype").value, "bf16");
  EXPECT_EQ(entry(lc, "learning_rate").value, "0.001");
}

TEST(ConfigParse, KeyInfosCoverEveryKey) {
  auto infos = config_key_infos();
  ASSERT_EQ(infos.size(), config_keys().size());
  const Config defaults;
  for (const auto& k : infos) {
    EXPECT_EQ(k.default_value, config_value(defaults, k.name)) << k.name;
    EXPECT_FALSE(k.help.empty()) << k.name;
    EXPECT_EQ(k.type == "enum", !k.allowed.empty()) << k.name;
  }
  EXPECT_EQ(std::count_if(infos.begin(), infos.end(), [](const ConfigKeyInfo& k) { return k.required; }), 4);
}

// Every default printed value parses back to itself (the override syntax
// round-trips the table's spelling).
TEST(ConfigParse, PrintedValuesRoundTrip) {
  for (const auto& k : config_key_infos()) {
    if (k.required) continue;
    LoadedConfig lc = parse_config(kBase, "test.yml", {k.name + "=" + k.default_value});
    EXPECT_EQ(entry(lc, k.name).value, k.default_value);
    EXPECT_EQ(entry(lc, k.name).source, "override");
  }
}

TEST(ConfigParse, TypedValues) {
  LoadedConfig lc = parse_config(
      kBase + "dtype: f32\nrouted_scaling_factor: 2.5\nnorm_topk_prob: false\n", "t",
      {"weight_dtype=bf16", "routed_score_func=sigmoid", "mlp_activation=gelu", "capacity_factor=1.25",
       "checkpoint_dir=\"/tmp/ck\"", "metrics_file=", "seed=+7", "router_z_loss_weight=1e-3"});
  const Config& c = lc.config;
  EXPECT_EQ(c.dtype, DType::f32);
  EXPECT_EQ(c.weight_dtype, DType::bf16);
  EXPECT_EQ(c.routed_scaling_factor, 2.5);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.routed_score_func, ScoreFunc::sigmoid);
  EXPECT_EQ(c.mlp_activation, Activation::gelu);
  EXPECT_EQ(c.capacity_factor, 1.25);
  EXPECT_EQ(c.checkpoint_dir, "/tmp/ck");
  EXPECT_EQ(c.metrics_file, "");
  EXPECT_EQ(c.seed, 7);
  EXPECT_EQ(c.router_z_loss_weight, 1e-3);
}

TEST(ConfigParse, EveryTypeErrorNamesKeyValueAndExpectation) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"steps=1.5", "steps: bad value '1.5' (expected an integer)"},
      {"steps=abc", "steps: bad value 'abc' (expected an integer)"},
      {"steps=", "steps: bad value '' (expected an integer)"},
      {"learning_rate=fast", "learning_rate: bad value 'fast' (expected a number)"},
      {"norm_topk_prob=yes", "norm_topk_prob: bad value 'yes' (expected true or false)"},
      {"norm_topk_prob=1", "norm_topk_prob: bad value '1' (expected true or false)"},
      {"dtype=f16", "dtype: bad value 'f16' (expected one of bf16|f32|f64)"},
      {"weight_dtype=i32", "weight_dtype: bad value 'i32' (expected one of f32|bf16)"},
      {"routed_score_func=relu", "routed_score_func: bad value 'relu' (expected one of softmax|sigmoid)"},
      {"mlp_activation=relu", "mlp_activation: bad value 'relu' (expected one of silu|gelu)"},
      {"moe_permute_kernel=xla", "moe_permute_kernel: bad value 'xla' (expected one of reference|fused)"},
      {"moe_combine_kernel=tc", "moe_combine_kernel: bad value 'tc' (expected one of reference|fused)"},
      {"ep_all_to_all=2d", "ep_all_to_all: bad value '2d' (expected one of flat|hierarchical|auto)"},
  };
  for (const auto& [override, message] : cases) {
    auto p = problems_of(kBase, {override});
    ASSERT_EQ(p.size(), 1u) << override << "\n" << joined(p);
    EXPECT_EQ(p[0], message);
  }
}

TEST(ConfigParse, NestedValueIsAnErrorNamingTheKey) {
  auto p = problems_of(kBase + "dtype:\n  a: 1\nsteps: [1, 2]\n");
  EXPECT_PROBLEM(p, "dtype: expected a single value, got a mapping");
  EXPECT_PROBLEM(p, "steps: expected a single value, got a list");
  EXPECT_PROBLEM(problems_of(kBase, {"emb_dim=[1]"}), "emb_dim: expected a single value, got a list");
}

TEST(ConfigParse, StructuralErrors) {
  EXPECT_PROBLEM(problems_of("- 1\n- 2\n"), "expected a mapping");
  EXPECT_PROBLEM(problems_of("num_experts: [1\n"), "YAML syntax error at line");
  EXPECT_PROBLEM(problems_of(kBase + "num_experts: 4\n"), "num_experts: set more than once");
  EXPECT_PROBLEM(problems_of(kBase, {"steps"}), "override 'steps' is not of the form key=value");
  EXPECT_PROBLEM(problems_of(kBase, {"=3"}), "override '=3' is not of the form key=value");
  EXPECT_THROW(load_config("/nonexistent/cfg.yml", {}), Error);
}

TEST(ConfigParse, UnknownKeySuggestsClosest) {
  auto p = problems_of(kBase + "num_expert: 8\n", {"lerning_rate=1", "zzzzzz=1"});
  EXPECT_PROBLEM(p, "unknown config key 'num_expert' (did you mean 'num_experts'?)");
  EXPECT_PROBLEM(p, "unknown config key 'lerning_rate' (did you mean 'learning_rate'?)");
  EXPECT_PROBLEM(p, "unknown config key 'zzzzzz' (see");
}

TEST(ConfigParse, OverridesWinOverTheFile) {
  LoadedConfig lc = parse_config(kBase + "steps: 5\ndtype: f16\n", "t", {"steps=9", "dtype=f32", "steps=11"});
  EXPECT_EQ(lc.config.steps, 11);
  EXPECT_EQ(lc.config.dtype, DType::f32);  // the file's bad value is replaced, never reported
  EXPECT_EQ(entry(lc, "steps").source, "override");
  LoadedConfig only = parse_config("", "<embedded>",
                                   {"num_experts=4", "num_experts_per_tok=1", "emb_dim=8", "moe_mlp_dim=8"});
  EXPECT_EQ(only.config.num_experts, 4);
}

TEST(ConfigParse, LoadConfigReadsFile) {
  auto path = std::filesystem::temp_directory_path() / "moe_config_test.yml";
  std::ofstream(path) << kBase;
  EXPECT_EQ(load_config(path.string(), {"emb_dim=32"}).config.emb_dim, 32);
  std::filesystem::remove(path);
}

TEST(ConfigRules, MissingRequiredKeys) {
  auto p = problems_of("dtype: f32\n");
  for (const char* key : {"num_experts", "num_experts_per_tok", "emb_dim", "moe_mlp_dim"})
    EXPECT_PROBLEM(p, std::string(key) + " is required and must be > 0 (got 0)");
  EXPECT_EQ(p.size(), 4u) << joined(p);
}

TEST(ConfigRules, EachRuleNamesItsKey) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"num_experts_per_tok=9"}, "num_experts_per_tok must be <= num_experts (got 9 > 8)"},
      {{"num_experts_per_tok=-1"}, "num_experts_per_tok is required and must be > 0 (got -1)"},
      {{"routed_scaling_factor=0"}, "routed_scaling_factor must be finite and > 0 (got 0)"},
      {{"routed_scaling_factor=inf"}, "routed_scaling_factor must be finite and > 0 (got inf)"},
      {{"load_balance_loss_weight=-0.5"}, "load_balance_loss_weight must be finite and >= 0 (got -0.5)"},
      {{"router_z_loss_weight=-1"}, "router_z_loss_weight must be finite and >= 0 (got -1)"},
      {{"capacity_factor=0"}, "capacity_factor must be -1 (dropless) or > 0 (got 0)"},
      {{"capacity_factor=-2"}, "capacity_factor must be -1 (dropless) or > 0 (got -2)"},
      {{"moe_split_expert_weight_layout=true"},
       "moe_split_expert_weight_layout=true requires prefuse_moe_weights=true"},
      {{"moe_split_expert_weight_layout=true", "num_experts=7", "num_experts_per_tok=1"},
       "requires an even num_experts (got 7)"},
      {{"moe_split_expert_weight_layout=true", "emb_dim=15"}, "requires an even emb_dim (got 15)"},
      {{"data_parallelism=0"}, "data_parallelism must be >= 1 or -1 (the rest) (got 0)"},
      {{"fsdp_parallelism=-2"}, "fsdp_parallelism must be >= 1 or -1 (the rest) (got -2)"},
      {{"data_parallelism=-1", "expert_parallelism=-1"}, "at most one of data_parallelism, fsdp_parallelism"},
      {{"expert_parallelism=3"}, "num_experts must be divisible by expert_parallelism (got 8 and 3)"},
      {{"use_ring_of_experts=true"}, "When expert_parallelism is 1, use_ring_of_experts must be false"},
      {{"ragged_buffer_factor=2"}, "When expert_parallelism is 1, ragged_buffer_factor must be -1 (got 2)"},
      {{"expert_parallelism=2", "ragged_buffer_factor=0"}, "ragged_buffer_factor must be -1 or > 0 (got 0)"},
      {{"num_moe_token_chunks=0"}, "num_moe_token_chunks must be >= 1 (got 0)"},
      {{"expert_parallelism=2", "use_ring_of_experts=true", "ep_all_to_all=hierarchical"},
       "ep_all_to_all=hierarchical needs the all-to-all, which use_ring_of_experts=true replaces"},
      {{"collective_timeout_s=-1"}, "collective_timeout_s must be finite and >= 0 (got -1)"},
      {{"collective_timeout_s=inf"}, "collective_timeout_s must be finite and >= 0 (got inf)"},
      {{"collective_liveness_s=-2"}, "collective_liveness_s must be finite and >= 0 (got -2)"},
      {{"side_engine_threads=-1"}, "side_engine_threads must be >= 0 (got -1)"},
      {{"num_layers=0"}, "num_layers must be >= 1 (got 0)"},
      {{"steps=0"}, "steps must be >= 1 (got 0)"},
      {{"batch_tokens=0"}, "batch_tokens must be >= 1 (got 0)"},
      {{"learning_rate=0"}, "learning_rate must be finite and > 0 (got 0)"},
      {{"warmup_steps=-1"}, "warmup_steps must be >= 0 (got -1)"},
      {{"weight_decay=-0.1"}, "weight_decay must be finite and >= 0 (got -0.1)"},
      {{"grad_clip=nan"}, "grad_clip must be a number (got nan)"},
      {{"checkpoint_period=-1"}, "checkpoint_period must be >= 0 (got -1)"},
      {{"log_period=0"}, "log_period must be >= 1 (got 0)"},
      {{"checkpoint_period=5"}, "checkpoint_period=5 requires checkpoint_dir"},
  };
  for (const auto& [overrides, message] : cases) EXPECT_PROBLEM(problems_of(kBase, overrides), message);
  EXPECT_TRUE(problems_of(kBase, {"checkpoint_period=5", "checkpoint_dir=/tmp/ck"}).empty());
  EXPECT_TRUE(problems_of(kBase, {"capacity_factor=1.5", "grad_clip=0"}).empty());
  EXPECT_TRUE(problems_of(kBase, {"collective_timeout_s=0"}).empty());  // 0: the watchdog is off
  EXPECT_TRUE(problems_of(kBase, {"expert_parallelism=2", "use_ring_of_experts=true", "ep_all_to_all=auto"}).empty());
  EXPECT_TRUE(problems_of(kBase, {"ep_all_to_all=hierarchical"}).empty());  // one expert rank: the flat exchange
  EXPECT_TRUE(problems_of(kBase, {"collective_timeout_s=2.5"}).empty());
}

TEST(ConfigRules, ProblemsOnAProgrammaticConfig) {
  Config c;
  c.num_experts = 4, c.num_experts_per_tok = 2, c.emb_dim = 8, c.moe_mlp_dim = 8;
  EXPECT_TRUE(config_problems(c).empty());
  c.num_experts_per_tok = 5;
  EXPECT_PROBLEM(config_problems(c), "num_experts_per_tok must be <= num_experts");
}

// Resources before work: expert weights larger than this machine's memory, or past 2^63 bytes
// (element counts that would overflow), fail at validation with the bytes needed.
TEST(ConfigRules, WeightsThatCannotFitAreRefusedBeforeWork) {
  Config c;
  c.num_experts = 8, c.num_experts_per_tok = 2, c.emb_dim = 64, c.moe_mlp_dim = 1000000000000;
  EXPECT_PROBLEM(config_problems(c), "the expert weights of one rank need 6144000000002048 bytes");
  EXPECT_PROBLEM(config_problems(c), "bytes of memory");
  c.num_experts = 4000000000000000000, c.emb_dim = 4000000000000000000;
  EXPECT_PROBLEM(config_problems(c), "would need more than 2^63 bytes");
  c.num_experts = 8, c.emb_dim = 64, c.moe_mlp_dim = 128;
  EXPECT_TRUE(config_problems(c).empty());
}

TEST(ConfigOffload, ParseTargets) {
  using V = std::vector<std::string>;
  EXPECT_EQ(parse_offload_targets(""), V{});
  EXPECT_EQ(parse_offload_targets(" , ,"), V{});
  EXPECT_EQ(parse_offload_targets("all"), (V{"fsdp_all_gather", "ep_collectives", "ragged_sort"}));
  EXPECT_EQ(parse_offload_targets("ragged_sort,all"),
            (V{"fsdp_all_gather", "ep_collectives", "ragged_sort"}));
  for (const char* t : {"fsdp_all_gather", "ep_collectives", "ragged_sort"})
    EXPECT_EQ(parse_offload_targets(t), V{t});
  EXPECT_EQ(parse_offload_targets(" ragged_sort, ep_collectives ,"), (V{"ep_collectives", "ragged_sort"}));
  EXPECT_EQ(parse_offload_targets("ragged_sort,ragged_sort"), V{"ragged_sort"});
  try {
    parse_offload_targets("fsdp_all_gather,tensor_core");
    FAIL() << "unknown target accepted";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'tensor_core'"), std::string::npos) << m;
    EXPECT_NE(m.find("fsdp_all_gather, ep_collectives, ragged_sort, all"), std::string::npos) << m;
  }
}

TEST(ConfigOffload, RulesInTheConfig) {
  auto p = problems_of(kBase, {"moe_offload_targets=fsdp_all_gather,tensor_core"});
  EXPECT_PROBLEM(p, "moe_offload_targets: unknown target 'tensor_core'");
  p = problems_of(kBase, {"moe_offload_targets=ragged_sort", "side_engine_threads=0"});
  EXPECT_PROBLEM(p, "moe_offload_targets=ragged_sort needs a side engine, but side_engine_threads is 0");
  EXPECT_TRUE(problems_of(kBase, {"moe_offload_targets= , ", "side_engine_threads=0"}).empty());
}

TEST(ConfigFeatures, EveryFeatureKeyIsAccepted) {
  EXPECT_TRUE(problems_of(kBase, {"moe_split_expert_weight_layout=true", "prefuse_moe_weights=true",
                                  "moe_permute_kernel=fused", "moe_combine_kernel=reference",
                                  "moe_offload_targets=all", "expert_parallelism=2", "fsdp_parallelism=-1",
                                  "num_moe_token_chunks=2", "shard_exp_on_fsdp=true", "use_ring_of_experts=true"})
                  .empty());
}

TEST(ConfigRules, FeatureRules) {
  auto p = problems_of(kBase, {"use_ring_of_experts=true"});
  EXPECT_PROBLEM(p, "When expert_parallelism is 1, use_ring_of_experts must be false");
  p = problems_of(kBase, {"moe_split_expert_weight_layout=true"});
  EXPECT_PROBLEM(p, "requires prefuse_moe_weights=true");
}

TEST(ConfigErrors, AllProblemsReportedAtOnce) {
  std::vector<std::string> p;
  try {
    parse_config("num_expert: 8\nnum_experts_per_tok: 2\nemb_dim: 1.5\nmoe_mlp_dim: 32\n", "bad.yml",
                 {"capacity_factor=0", "moe_offload_targets=tensor_core", "use_ring_of_experts=true"});
    FAIL() << "invalid config accepted";
  } catch (const ConfigError& e) {
    p = e.problems();
    std::string what = e.what();
    EXPECT_EQ(what.rfind("invalid config bad.yml (", 0), 0u) << what;
    for (const auto& problem : p) EXPECT_NE(what.find("\n  " + problem), std::string::npos) << problem;
  }
  EXPECT_PROBLEM(p, "unknown config key 'num_expert'");
  EXPECT_PROBLEM(p, "num_experts is required");
  EXPECT_PROBLEM(p, "emb_dim: bad value '1.5'");
  EXPECT_PROBLEM(p, "capacity_factor must be -1");
  EXPECT_PROBLEM(p, "unknown target 'tensor_core'");
  EXPECT_PROBLEM(p, "When expert_parallelism is 1, use_ring_of_experts must be false");
  EXPECT_EQ(find(p, "emb_dim is required"), -1) << "a bad value is reported once";
}

TEST(ConfigFormat, TableIsAlignedAndGrouped) {
  LoadedConfig lc = parse_config(kBase, "t", {"metrics_file=m.jsonl"});
  std::string table = format_config_table(lc.table);
  for (const char* g : {"\nlayer:\n", "\nparallelism:\n", "\noffload:\n", "\ntrain:\n"})
    EXPECT_NE(table.find(g), std::string::npos) << g;
  EXPECT_LT(table.find("\nlayer:"), table.find("\ntrain:"));
  // Every row puts its value at the same column.
  size_t column = std::string::npos;
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  ", 0) != 0) continue;
    size_t key_end = line.find(' ', 2);
    size_t value_at = line.find_first_not_of(' ', key_end);
    if (column == std::string::npos) column = value_at;
    EXPECT_EQ(value_at, column) << line;
  }
  EXPECT_NE(table.find("m.jsonl"), std::string::npos);
  EXPECT_NE(table.find("override"), std::string::npos);
  EXPECT_NE(table.find("\"\""), std::string::npos);  // empty strings are visible
  std::string help = format_config_help();
  for (const auto& k : config_keys()) EXPECT_NE(help.find(k), std::string::npos) << k;
}

// docs/config.md has a row per key, with the type and default of the key table.
TEST(ConfigFormat, DocsListEveryKeyWithItsDefault) {
  std::ifstream in(std::string(MOE_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md missing";
  std::map<std::string, std::string> rows;  // key -> its table row
  for (std::string line; std::getline(in, line);)
    if (line.rfind("| `", 0) == 0)
      rows.emplace(line.substr(3, line.find('`', 3) - 3), line);  // first row wins
  for (const auto& k : config_key_infos()) {
    ASSERT_TRUE(rows.count(k.name)) << k.name;
    std::string type = k.type;
    if (type == "enum") {
      type.clear();
      for (const auto& a : k.allowed) type += (type.empty() ? "`" : "\\|`") + a + "`";
    }
    std::string dflt = k.required                ? "required"
                       : k.default_value.empty() ? "`\"\"`"
                                                 : "`" + k.default_value + "`";
    EXPECT_EQ(rows[k.name].rfind("| `" + k.name + "` | " + type + " | " + dflt + " |", 0), 0u)
        << rows[k.name];
  }
}

}  // namespace
}  // namespace moe
