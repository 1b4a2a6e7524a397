#include "check/problem.h"

#include <cstring>

#include "bench/cases.h"

namespace moe::check {
namespace {

// [E, D, 2F] from two [E, D, F] of the same dtype: each row is wi_0's then wi_1's.
Tensor concat_last(const Tensor& a, const Tensor& b) {
  const int64_t E = a.dim(0), D = a.dim(1), F = a.dim(2);
  Tensor out = Tensor::empty(a.dtype(), {E, D, 2 * F});
  const size_t row = size_t(F) * dtype_size(a.dtype());
  auto* dst = static_cast<std::byte*>(out.raw());
  const auto* pa = static_cast<const std::byte*>(a.raw());
  const auto* pb = static_cast<const std::byte*>(b.raw());
  for (int64_t r = 0; r < E * D; ++r) {
    std::memcpy(dst + 2 * size_t(r) * row, pa + size_t(r) * row, row);
    std::memcpy(dst + (2 * size_t(r) + 1) * row, pb + size_t(r) * row, row);
  }
  return out;
}

// sum(y * dy) in f64, y and dy as the layer sees them (dy cast to dtype).
double dot(const Tensor& y, const Tensor& dy) {
  double s = 0;
  for (int64_t i = 0; i < y.numel(); ++i) s += double(y.get_f32(i)) * double(dy.get_f32(i));
  return s;
}

}  // namespace

Problem make_problem(const Config& base, int64_t tokens, uint64_t seed) {
  Problem p;
  p.base = base;
  Config unfused = base;  // one set of weights for every layout (weights_for converts)
  unfused.prefuse_moe_weights = unfused.moe_split_expert_weight_layout = false;
  p.weights = init_weights(unfused, seed);
  bench::Case c;
  c.T = tokens, c.D = base.emb_dim, c.F = base.moe_mlp_dim, c.E = base.num_experts,
  c.K = base.num_experts_per_tok;
  bench::CaseInputs in = bench::case_inputs(c, seed);
  p.x = in.x;
  p.dy = in.dy;
  return p;
}

LayerWeights weights_for(const Config& cfg, const LayerWeights& unfused) {
  if (!cfg.prefuse_moe_weights) return unfused;
  LayerWeights w;
  w.router = unfused.router;
  w.wo = unfused.wo;
  w.wi = concat_last(unfused.wi_0, unfused.wi_1);
  if (cfg.moe_split_expert_weight_layout) {
    const int64_t E = w.wi.dim(0), D = w.wi.dim(1), F2 = w.wi.dim(2);
    w.wi = w.wi.reshaped({2, E, D / 2, F2});
  }
  return w;
}

StepTensors collect(const Config& cfg, const Tensor& y, const Tensor& dx, const LayerWeights& grads,
                    const LayerOutputs& out, const Tensor& dy) {
  StepTensors s;
  s.tensors.emplace_back("y", y);
  s.tensors.emplace_back("grad.x", dx);
  grads.for_each(
      cfg, [&](const std::string& name, const Tensor& t) { s.tensors.emplace_back("grad." + name, t); });
  s.loss = dot(y, dy.to(cfg.dtype)) + double(out.load_balance_loss) + double(out.z_loss);
  return s;
}

StepTensors reference_step(const Config& cfg, const Problem& p) {
  Config single = cfg;
  single.data_parallelism = single.fsdp_parallelism = single.expert_parallelism = 1;
  single.num_moe_token_chunks = 1;
  single.use_ring_of_experts = false;
  LayerOutputs out;
  LayerForwardPtr f = layer_forward(single, weights_for(single, p.weights), p.x, nullptr, out);
  LayerGrads g = layer_backward(single, *f, p.dy);
  return collect(single, out.y, g.dx, g.weights, out, p.dy);
}

}  // namespace moe::check
