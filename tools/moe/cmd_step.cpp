// moe step --config C --weights W --inputs I --out O [key=value ...]
// One forward (and backward when the inputs hold dy); the output file
// contract is SPEC.md §7 (docs/formats.md).
#include <cstdio>

#include "cli_util.h"
#include "commands.h"

namespace moe::cli {
namespace {
struct StepArgs {
  std::string config, weights, inputs, out;
  std::vector<std::string> overrides;
};

void print_summary(const LayerOutputs& o, const LayerGrads* g, const std::string& out) {
  std::printf("moe step: T=%lld  |y|=%.6g  load_balance_loss=%.6g  z_loss=%.6g  dropped=%lld\n",
              (long long)o.y.dim(0), norm(o.y), o.load_balance_loss, o.z_loss, (long long)o.dropped);
  std::printf("  group_sizes:");
  for (int64_t e = 0; e < o.group_sizes.numel(); ++e) std::printf(" %d", o.group_sizes.data<int32_t>()[e]);
  std::printf("\n");
  if (g) std::printf("  |grad.x|=%.6g  |grad.router.kernel|=%.6g\n", norm(g->dx), norm(g->weights.router));
  std::printf("  wrote %s\n", out.c_str());
}

void run_step(const StepArgs& a) {
  Config cfg = load(a.config, a.overrides);
  SafetensorsFile wf = read_safetensors(a.weights);
  LayerWeights w = load_weights(cfg, wf);
  SafetensorsFile in = read_safetensors(a.inputs);
  const Tensor& x = in.at("x");
  const Tensor* dy = in.find("dy");
  const Tensor* forced = in.find("topk_idx");
  LayerOutputs o;
  auto fwd = layer_forward(cfg, w, x, forced, o);
  std::vector<std::pair<std::string, Tensor>> out = {
      {"y", o.y},
      {"topk_idx", o.topk_idx},
      {"topk_weights", o.topk_weights},
      {"group_sizes", o.group_sizes},
      {"aux.load_balance_loss", Tensor::scalar_f32(o.load_balance_loss)},
      {"aux.z_loss", Tensor::scalar_f32(o.z_loss)},
  };
  LayerGrads g;
  if (dy) {
    g = layer_backward(cfg, *fwd, *dy);
    out.emplace_back("grad.x", g.dx);
    for (auto& [name, t] : named(cfg, g.weights, "grad.")) out.emplace_back(name, t);
  }
  write_safetensors(a.out, out, {{"format", "moe-engine step outputs"}});
  print_summary(o, dy ? &g : nullptr, a.out);
}
}  // namespace

void add_step(CLI::App& app) {
  auto a = std::make_shared<StepArgs>();
  CLI::App* c = app.add_subcommand(
      "step",
      "Run one layer step: forward, and backward when the inputs hold dy.\n"
      "Inputs file: x [T, D]; optional dy [T, D]; optional topk_idx [T, K] i32 (forced routing).\n"
      "Outputs file: y, topk_idx, topk_weights, group_sizes, aux.load_balance_loss, aux.z_loss,\n"
      "and with dy: grad.x and grad.<weight name> for every weight (f32).");
  c->add_option("--config", a->config, "YAML config file")->required();
  c->add_option("--weights", a->weights, "Weights file (.safetensors, names of SPEC.md §7)")->required();
  c->add_option("--inputs", a->inputs, "Inputs file (.safetensors)")->required();
  c->add_option("--out", a->out, "Outputs file (.safetensors), written atomically")->required();
  c->add_option("overrides", a->overrides, "key=value config overrides");
  c->callback([a] { run_step(*a); });
}

}  // namespace moe::cli
