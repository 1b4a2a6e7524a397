// moe step --config C --weights W --inputs I --out O [--trace FILE] [key=value ...]
// One forward (and backward when the inputs hold dy); the output file
// contract is SPEC.md §7 (docs/formats.md). Under mpirun with any
// parallelism the files are the same as single-process (step_dist.cpp).
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "step_dist.h"

namespace moe::cli {
namespace {
struct StepArgs {
  std::string config;
  StepPaths paths;
  std::vector<std::string> overrides;
};

void print_summary(const StepResult& r, bool backward, const std::string& out) {
  const LayerOutputs& o = r.outputs;
  std::printf("moe step: T=%lld  |y|=%.6g  load_balance_loss=%.6g  z_loss=%.6g  dropped=%lld\n",
              (long long)o.y.dim(0), norm(o.y), o.load_balance_loss, o.z_loss, (long long)o.dropped);
  std::printf("  group_sizes:");
  for (int64_t e = 0; e < o.group_sizes.numel(); ++e) std::printf(" %d", o.group_sizes.data<int32_t>()[e]);
  std::printf("\n");
  if (o.nonfinite_tokens > 0)
    std::printf("  nonfinite_tokens=%lld: router logits not all finite; the aux losses are NaN\n",
                (long long)o.nonfinite_tokens);
  if (backward)
    std::printf("  |grad.x|=%.6g  |grad.router.kernel|=%.6g\n", norm(r.grads.dx), norm(r.grads.weights.router));
  std::printf("  wrote %s\n", out.c_str());
}

void run_single(const Config& cfg, const StepPaths& p) {
  LayerWeights w = load_weights(cfg, read_safetensors(p.weights));
  SafetensorsFile in = read_safetensors(p.inputs);
  const Tensor* dy = in.find("dy");
  StepResult r;
  auto fwd = layer_forward(cfg, w, in.at("x"), in.find("topk_idx"), r.outputs);
  if (dy) r.grads = layer_backward(cfg, *fwd, *dy);
  write_step_outputs(cfg, r, dy != nullptr, p.out);
}

// Under mpirun an error on any rank (config, weights, inputs) ends the whole job.
void run_step(const StepArgs& a) {
  run_collectively(world(), [&] {
    Config cfg = load(a.config, a.overrides);
    if (distributed(cfg) || !a.paths.trace.empty())
      run_step_distributed(cfg, a.paths);
    else
      run_single(cfg, a.paths);
  });
}
}  // namespace

void write_step_outputs(const Config& cfg, const StepResult& r, bool backward, const std::string& path) {
  const LayerOutputs& o = r.outputs;
  std::vector<std::pair<std::string, Tensor>> out = {
      {"y", o.y},
      {"topk_idx", o.topk_idx},
      {"topk_weights", o.topk_weights},
      {"group_sizes", o.group_sizes},
      {"aux.load_balance_loss", Tensor::scalar_f32(o.load_balance_loss)},
      {"aux.z_loss", Tensor::scalar_f32(o.z_loss)},
  };
  if (backward) {
    out.emplace_back("grad.x", r.grads.dx);
    for (auto& [name, t] : named(cfg, r.grads.weights, "grad.")) out.emplace_back(name, t);
  }
  write_safetensors(path, out, {{"format", "moe-engine step outputs"}});
  print_summary(r, backward, path);
}

void add_step(CLI::App& app) {
  auto a = std::make_shared<StepArgs>();
  CLI::App* c = app.add_subcommand(
      "step",
      "Run one layer step: forward, and backward when the inputs hold dy.\n"
      "Inputs file: x [T, D]; optional dy [T, D]; optional topk_idx [T, K] i32 (forced routing, K distinct ids per token).\n"
      "Outputs file: y, topk_idx, topk_weights, group_sizes, aux.load_balance_loss, aux.z_loss,\n"
      "and with dy: grad.x and grad.<weight name> for every weight (f32).\n"
      "Under mpirun the layer runs distributed (parallelism keys); rank 0 reads and writes the files.");
  c->add_option("--config", a->config, "YAML config file")->required();
  c->add_option("--weights", a->paths.weights, "Weights file (.safetensors, names of SPEC.md §7)")->required();
  c->add_option("--inputs", a->paths.inputs, "Inputs file (.safetensors)")->required();
  c->add_option("--out", a->paths.out, "Outputs file (.safetensors), written atomically")->required();
  c->add_option("--trace", a->paths.trace,
                "Write the step trace as Chrome trace JSON (Perfetto): every rank's ops, one track per\n"
                "engine per rank (docs/offload.md). The step then runs through the distributed layer.");
  c->add_option("overrides", a->overrides, "key=value config overrides");
  c->callback([a] { run_step(*a); });
}

}  // namespace moe::cli
