// `moe step` under mpirun: rank 0 reads and writes whole tensors (SPEC.md §7),
// so the files are the same as single-process; the layer runs distributed
// through a DistRuntime (live offload targets run on its side engine).
#include "step_dist.h"

#include <cstdio>

#include "cli_util.h"
#include "io/atomic_file.h"
#include "moe/comm_tensor.h"
#include "moe/dist_layer.h"
#include "moe/dist_runtime.h"
#include "moe/trace_gather.h"

namespace moe::cli {
namespace {

// Whole weights on every rank: rank 0 reads the file, then broadcasts.
LayerWeights broadcast_weights(const Config& cfg, Communicator& w, const std::string& path) {
  LayerWeights full;
  if (w.rank() == 0) full = load_weights(cfg, read_safetensors(path));
  full.for_each(cfg, [&](const std::string&, Tensor& t) { t = broadcast_tensor(w, t, 0); });
  return full;
}

struct Inputs {
  Tensor x, dy, forced;  // this rank's rows (dy / forced undefined when absent)
};

Inputs scatter_inputs(Communicator& w, const std::string& path) {
  SafetensorsFile in;
  int64_t meta[3] = {0, 0, 0};  // T, has dy, has topk_idx
  if (w.rank() == 0) {
    in = read_safetensors(path);
    meta[0] = in.at("x").ndim() ? in.at("x").dim(0) : 0;
    meta[1] = in.find("dy") != nullptr;
    meta[2] = in.find("topk_idx") != nullptr;
  }
  w.broadcast(meta, sizeof(meta), 0);
  if (meta[0] % w.size())
    fail(path, ": x has ", meta[0], " tokens, not divisible by the ", w.size(), " ranks");
  auto part = [&](const char* name) { return scatter_rows(w, w.rank() == 0 ? in.at(name) : Tensor(), 0); };
  Inputs out;
  out.x = part("x");
  if (meta[1]) out.dy = part("dy");
  if (meta[2]) out.forced = part("topk_idx");
  return out;
}

// Global kept rows per expert: the sum of every rank's (gathered to rank 0).
Tensor sum_group_sizes(Communicator& w, const Tensor& local) {
  Tensor all = gather_rows(w, local.reshaped({1, local.numel()}), 0);
  if (w.rank() != 0) return Tensor();
  Tensor sum(DType::i32, {local.numel()});
  for (int64_t r = 0; r < all.dim(0); ++r)
    for (int64_t e = 0; e < local.numel(); ++e) sum.data<int32_t>()[e] += all.data<int32_t>()[r * local.numel() + e];
  return sum;
}

void write_trace(Communicator& w, const DistRuntime& rt, const std::string& path) {
  std::vector<TraceOp> ops = gather_trace_ops(w, rt.trace()->ops());
  if (w.rank() != 0) return;
  write_file_atomic(path, chrome_trace_json(ops));
  std::printf("  wrote %s (%zu ops)\n", path.c_str(), ops.size());
}

void run(const Config& cfg, const StepPaths& p, Communicator& w) {
  LayerWeights full = broadcast_weights(cfg, w, p.weights);
  Inputs in = scatter_inputs(w, p.inputs);
  const bool has_dy = in.dy.defined() && in.dy.numel();
  DistRuntime rt(cfg, w, /*training=*/has_dy);
  if (!p.trace.empty()) rt.enable_trace(true);
  DistLayer layer(cfg, rt);
  LayerWeights shards = layer.shard(full);
  LayerOutputs o;
  if (rt.trace()) rt.trace()->restart();
  auto fwd = layer.forward(shards, in.x, in.forced.defined() && in.forced.numel() ? &in.forced : nullptr, o);
  LayerGrads g;
  if (has_dy) g = layer.backward(*fwd, in.dy);
  const bool backward = g.dx.defined() && g.dx.numel();
  StepResult r;
  r.outputs.y = gather_rows(w, o.y, 0);
  r.outputs.topk_idx = gather_rows(w, o.topk_idx, 0);
  r.outputs.topk_weights = gather_rows(w, o.topk_weights, 0);
  r.outputs.group_sizes = sum_group_sizes(w, o.group_sizes);
  r.outputs.load_balance_loss = o.load_balance_loss;
  r.outputs.z_loss = o.z_loss;
  r.outputs.nonfinite_tokens = o.nonfinite_tokens;  // already global
  int64_t dropped = o.dropped;
  std::vector<int64_t> all(static_cast<size_t>(w.size()));
  w.gatherv(&dropped, sizeof(dropped), all.data(), std::vector<size_t>(size_t(w.size()), sizeof(int64_t)), 0);
  for (int64_t d : all) r.outputs.dropped += w.rank() == 0 ? d : 0;
  if (backward) {
    r.grads.dx = gather_rows(w, g.dx, 0);
    r.grads.weights = layer.unshard_to_root(g.weights);
  }
  if (w.rank() == 0) write_step_outputs(cfg, r, backward, p.out);
  if (!p.trace.empty()) write_trace(w, rt, p.trace);
}

}  // namespace

void run_step_distributed(const Config& cfg, const StepPaths& paths) { run(cfg, paths, world()); }

}  // namespace moe::cli
