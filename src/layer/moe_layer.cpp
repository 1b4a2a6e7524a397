// Composition of one layer step: route -> sort -> permute -> FFN -> combine,
// and the adjoints in reverse order.
#include "kernels/combine.h"
#include "kernels/permute.h"
#include "layer/expert_ffn.h"
#include "moe/layer.h"
#include "moe/trace.h"
#include "route/aux_loss.h"
#include "route/router.h"
#include "route/routing.h"

namespace moe {

struct LayerForward {
  Tensor x;              // [T, D] dtype
  Tensor router_kernel;  // [D, E] f32 (f64 on the double path)
  RouterOutput router;
  Routing routing;
  AuxStats aux;
  FfnWeights ffn_w;
  Lhs xs;  // [R, D], or x's rows through the permute's index (layer_permutes_in_gemm)
  FfnActivations ffn;
  StepTrace* trace = nullptr;  // optional
};

void LayerForwardDeleter::operator()(LayerForward* p) const { delete p; }

namespace {
void check_tokens(const Config& cfg, const Tensor& t, const char* what) {
  if (t.ndim() != 2 || t.dim(1) != cfg.emb_dim)
    fail(what, ": expected shape [T, ", cfg.emb_dim, "] (emb_dim = ", cfg.emb_dim, "), got ",
         shape_str(t.shape()));
  if (!is_float(t.dtype())) fail(what, ": expected a float dtype, got ", dtype_name(t.dtype()));
}

// The router's and the gradients' dtype: f32, or f64 on the double path (cfg.dtype f64).
DType acc_dtype(const Config& cfg) { return cfg.dtype == DType::f64 ? DType::f64 : DType::f32; }

Tensor group_sizes_i32(const GroupLayout& g) {
  Tensor t = Tensor::empty(DType::i32, {g.num_groups()});
  for (int64_t e = 0; e < g.num_groups(); ++e) t.data<int32_t>()[e] = int32_t(g.sizes[size_t(e)]);
  return t;
}
}  // namespace

bool layer_permutes_in_gemm(const Config& cfg) {
  return cfg.moe_permute_kernel == KernelChoice::fused && gathers_lhs(cfg.dtype);
}

bool dist_permutes_in_gemm(const Config& cfg, int64_t expert_ranks) {
  return expert_ranks == 1 && cfg.num_moe_token_chunks <= 1 && layer_permutes_in_gemm(cfg);
}

LayerForwardPtr layer_forward(const Config& cfg, const LayerWeights& w, const Tensor& x_in,
                              const Tensor* forced, LayerOutputs& out, StepTrace* trace) {
  check_tokens(cfg, x_in, "x");
  LayerForwardPtr f(new LayerForward);
  f->trace = trace;
  f->x = x_in.to(cfg.dtype);
  const int64_t T = f->x.dim(0), K = cfg.num_experts_per_tok, E = cfg.num_experts, D = cfg.emb_dim;
  {
    TraceScope s(trace, "router", OpEngine::compute);
    f->router_kernel = w.router.to(acc_dtype(cfg));
    f->router = router_forward(cfg, f->x, f->router_kernel, forced);
  }
  {
    TraceScope s(trace, "sort", OpEngine::compute);
    int64_t cap = expert_capacity(T, K, E, cfg.capacity_factor);
    f->routing = compute_routing(f->router.topk_idx.data<int32_t>(), T, K, E, cap);
  }
  {
    TraceScope s(trace, "router", OpEngine::compute);
    f->aux = aux_stats(f->router.logits, f->routing.routed_counts);
  }
  f->ffn_w = ffn_weights(cfg, w);
  {
    // The fused permute is done by the up projection's operand copies where the level reads a
    // gathered lhs: only the index is made here, and xs is never written.
    TraceScope s(trace, "permute", OpEngine::compute);
    if (layer_permutes_in_gemm(cfg) && fused::permute_supported(cfg.dtype, f->routing)) {
      f->xs = Lhs(f->x, fused::permute_index(f->routing));
    } else {
      Tensor xs = Tensor::empty(cfg.dtype, {T * K, D});
      permute(cfg.moe_permute_kernel, f->x, f->routing, xs);
      f->xs = xs;
    }
  }
  {
    TraceScope s(trace, "ffn", OpEngine::compute);
    f->ffn = ffn_forward(cfg, f->ffn_w, f->xs, f->routing.groups);
  }
  out.y = Tensor::empty(cfg.dtype, {T, D});
  {
    TraceScope s(trace, "combine", OpEngine::compute);
    combine(cfg.moe_combine_kernel, f->ffn.ys, f->router.topk_weights, f->routing, cfg.float32_weight_sum,
            out.y);
  }
  out.topk_idx = f->router.topk_idx;
  out.topk_weights = f->router.topk_weights;
  out.group_sizes = group_sizes_i32(f->routing.groups);
  AuxLosses aux = aux_losses(cfg, f->aux);
  out.load_balance_loss = aux.load_balance;
  out.z_loss = aux.z_loss;
  out.load_balance_loss_f64 = aux.load_balance_f64;
  out.z_loss_f64 = aux.z_loss_f64;
  out.dropped = f->routing.dropped;
  out.nonfinite_tokens = f->aux.nonfinite;
  return f;
}

namespace {
// The accumulation targets: every weight the config uses, f32, in the weight's shape.
void check_accumulate(const Config& cfg, const LayerWeights& acc) {
  if (cfg.dtype == DType::f64)
    fail("layer_backward: accumulate: an f64 layer returns fresh f64 gradients (accumulation is f32 only)");
  const auto shapes = weight_shapes(cfg);
  size_t i = 0;
  acc.for_each(cfg, [&](const std::string& name, const Tensor& t) {
    const Shape& want = shapes[i++].second;
    if (t.numel() == 0 && shape_numel(want) != 0)
      fail("layer_backward: accumulate: gradient '", name, "' is missing (expected f32 ", shape_str(want),
           ")");
    if (t.dtype() != DType::f32)
      fail("layer_backward: accumulate: gradient '", name, "': expected f32, got ", dtype_name(t.dtype()));
    expect_shape(t, want, "layer_backward: accumulate: gradient '" + name + "'");
  });
}

// rel: the same forward state, whose saved tensors may be dropped once used (release_saved);
// acc: gradients to add into. Without either: today's backward, call for call.
LayerGrads backward_impl(const Config& cfg, const LayerForward& f, LayerForward* rel, const Tensor& dy_in,
                         const AuxCotangents& aux, LayerWeights* acc) {
  check_tokens(cfg, dy_in, "dy");
  if (dy_in.dim(0) != f.x.dim(0)) fail("dy: expected ", f.x.dim(0), " tokens like x, got ", dy_in.dim(0));
  if (acc) check_accumulate(cfg, *acc);
  const Tensor dy = dy_in.to(cfg.dtype);
  const int64_t T = f.x.dim(0), K = cfg.num_experts_per_tok, D = cfg.emb_dim;
  if (rel) rel->x = Tensor();  // the router keeps its own input; xs holds the permuted rows
  LayerGrads g;
  if (acc) g.weights = *acc;
  Tensor dys = Tensor::empty(cfg.dtype, {T * K, D});
  Tensor dW = Tensor::empty(acc_dtype(cfg), {T, K});
  {
    TraceScope s(f.trace, "combine_backward", OpEngine::compute);
    combine_backward(cfg.moe_combine_kernel, dy, f.ffn.ys, f.router.topk_weights, f.routing, dys, dW);
  }
  if (rel) rel->ffn.ys = Tensor();
  Tensor dxs;
  {
    TraceScope s(f.trace, "ffn_backward", OpEngine::compute);
    if (!rel && !acc) {
      dxs = ffn_backward(cfg, f.ffn_w, f.xs, f.ffn, dys, f.routing.groups, g.weights);
    } else {
      FfnGradInputs keep;
      FfnRelease r;
      if (rel) r = {&rel->ffn_w, &rel->ffn};
      dxs = ffn_backward_data(cfg, f.ffn_w, f.xs, f.ffn, dys, f.routing.groups, keep, r);
      if (rel) {  // keep holds the only references now: the weight gradients drop them as they go
        dys = Tensor();
        rel->xs = Lhs();
        rel->ffn.a = Tensor();
      }
      ffn_weight_grads_into(f.ffn_w, keep, f.routing.groups, g.weights, acc != nullptr, rel != nullptr);
    }
  }
  g.dx = Tensor::empty(acc_dtype(cfg), {T, D});
  {
    TraceScope s(f.trace, "permute_backward", OpEngine::compute);
    permute_backward(cfg.moe_permute_kernel, dxs, f.routing, g.dx);
  }
  dxs = Tensor();
  TraceScope s(f.trace, "router_backward", OpEngine::compute);
  Tensor dz = router_weights_backward(cfg, f.router, dW);
  aux_backward(cfg, f.router.logits, f.aux, dz, aux);
  Tensor drouter(acc_dtype(cfg), f.router_kernel.shape());
  router_matmul_backward(f.router.x, f.router_kernel, dz, drouter, g.dx);
  if (acc) {
    float* a = g.weights.router.data<float>();
    const float* d = drouter.data<float>();
    for (int64_t i = 0; i < drouter.numel(); ++i) a[i] = a[i] + d[i];
  } else {
    g.weights.router = drouter;
  }
  return g;
}
}  // namespace

LayerGrads layer_backward(const Config& cfg, const LayerForward& f, const Tensor& dy_in,
                          const AuxCotangents& aux) {
  return backward_impl(cfg, f, nullptr, dy_in, aux, nullptr);
}

LayerGrads layer_backward(const Config& cfg, LayerForward& f, const Tensor& dy, const AuxCotangents& aux,
                          const BackwardOptions& opts) {
  return backward_impl(cfg, f, opts.release_saved ? &f : nullptr, dy, aux, opts.accumulate);
}

}  // namespace moe
