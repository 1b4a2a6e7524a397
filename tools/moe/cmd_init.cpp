// moe init --config C --out W.safetensors [--seed N] [--inputs I --tokens T] [key=value ...]
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "core/counter_rng.h"

namespace moe::cli {
namespace {
struct InitArgs {
  std::string config, out, inputs;
  uint64_t seed = 0;
  int64_t tokens = 64;
  std::vector<std::string> overrides;
};

void run_init(const InitArgs& a) {
  Config cfg = load(a.config, a.overrides);
  LayerWeights w = init_weights(cfg, a.seed);
  write_safetensors(a.out, named(cfg, w, ""), {{"format", "moe-engine layer weights"}, {"seed", std::to_string(a.seed)}});
  std::printf("moe init: wrote %s (E=%lld, D=%lld, F=%lld, %s)\n", a.out.c_str(), (long long)cfg.num_experts,
              (long long)cfg.emb_dim, (long long)cfg.moe_mlp_dim, dtype_name(cfg.weight_dtype));
  if (a.inputs.empty()) return;
  if (a.tokens <= 0) fail("--tokens must be positive, got ", a.tokens);
  // N(0, 1), keyed like the weights: every tensor written is a pure function of seed and name.
  Tensor x = normal_tensor({a.tokens, cfg.emb_dim}, named_key(a.seed, "x"));
  Tensor dy = normal_tensor({a.tokens, cfg.emb_dim}, named_key(a.seed, "dy"));
  write_safetensors(a.inputs, {{"x", x}, {"dy", dy}}, {{"format", "moe-engine step inputs"}});
  std::printf("moe init: wrote %s (x and dy, T=%lld, f32)\n", a.inputs.c_str(), (long long)a.tokens);
}
}  // namespace

void add_init(CLI::App& app) {
  auto a = std::make_shared<InitArgs>();
  CLI::App* c = app.add_subcommand("init", "Write random layer weights for a config (and optionally random step inputs)");
  c->add_option("--config", a->config, "YAML config file")->required();
  c->add_option("--out", a->out, "Output weights file (.safetensors)")->required();
  c->add_option("--seed", a->seed, "Random seed (every tensor is a pure function of seed and name)");
  c->add_option("--inputs", a->inputs, "Also write random step inputs x and dy [T, D] to this file");
  c->add_option("--tokens", a->tokens, "Tokens T for --inputs (default 64)");
  c->add_option("overrides", a->overrides, "key=value config overrides");
  c->callback([a] { run_init(*a); });
}

}  // namespace moe::cli
