#include "layer/expert_ffn.h"

#include "kernels/activation.h"
#include <cstring>

#include "moe/thread_pool.h"

namespace moe {

FfnWeights ffn_weights(const Config& cfg, const LayerWeights& lw) {
  const int64_t E = lw.wo.dim(0), D = cfg.emb_dim, F = cfg.moe_mlp_dim;
  FfnWeights w;
  w.prefused = cfg.prefuse_moe_weights;
  w.split = cfg.moe_split_expert_weight_layout;
  w.experts = E;
  if (w.split) {
    Tensor wi = lw.wi.to(cfg.dtype).reshaped({E, D, 2 * F});  // slice h of [2, E, D/2, 2F] is experts [hE/2, (h+1)E/2)
    w.wi_lo = wi.slice_rows(0, E / 2);
    w.wi_hi = wi.slice_rows(E / 2, E);
  } else if (w.prefused) {
    w.wi = lw.wi.to(cfg.dtype);
  } else {
    w.wi_0 = lw.wi_0.to(cfg.dtype);
    w.wi_1 = lw.wi_1.to(cfg.dtype);
  }
  w.wo = lw.wo.to(cfg.dtype);
  return w;
}

namespace {

// Expert halves [0, E/2) and [E/2, E) of an [E, ...] tensor (storage shared).
std::pair<Tensor, Tensor> halves(const Tensor& t) {
  int64_t half = t.dim(0) / 2;
  return {t.slice_rows(0, half), t.slice_rows(half, t.dim(0))};
}

// Up projection with the fused weight: one grouped GEMM, or in the split
// layout two chained ones (experts [0, E/2) then [E/2, E)) into the same h.
void up_fused(const FfnWeights& w, const Lhs& xs, const GroupLayout& g, Tensor& h) {
  if (!w.split) {
    w.ready(FfnPart::up);
    return gmm(xs, w.wi, g, 0, h);
  }
  w.ready(FfnPart::up_lo);
  gmm(xs, w.wi_lo, g, 0, h);
  w.ready(FfnPart::up_hi);
  gmm(xs, w.wi_hi, g, w.wi_lo.dim(0), h);
}

void dlhs_fused(const FfnWeights& w, const Tensor& dh, const GroupLayout& g, Tensor& dxs) {
  if (!w.split) return gmm_dlhs(dh, w.wi, g, 0, dxs);
  gmm_dlhs(dh, w.wi_lo, g, 0, dxs);
  gmm_dlhs(dh, w.wi_hi, g, w.wi_lo.dim(0), dxs);
}

// Each half's gradient is produced directly into its slice of dwi [E, D, 2F].
void drhs_fused(const FfnWeights& w, const Lhs& xs, const Tensor& dh, const GroupLayout& g, Tensor& dwi) {
  if (!w.split) return gmm_drhs(xs, dh, g, 0, dwi);
  auto [lo, hi] = halves(dwi);
  gmm_drhs(xs, dh, g, 0, lo);
  gmm_drhs(xs, dh, g, lo.dim(0), hi);
}

// Rows of the local groups [0, E_l): the rows every elementwise step covers.
int64_t local_rows(const FfnWeights& w, const GroupLayout& g) { return g.offsets[size_t(w.experts)]; }

// [R, C] whose rows [valid, R) are zero; the rest is left for the kernels to
// write (every GEMM and activation kernel writes all rows of the local groups),
// so only the tail is cleared: no memset of the whole activation.
Tensor rows_tensor(DType dt, int64_t R, int64_t C, int64_t valid) {
  Tensor t = Tensor::empty(dt, {R, C});
  const size_t rb = size_t(C) * dtype_size(dt);
  std::memset(static_cast<std::byte*>(t.raw()) + size_t(valid) * rb, 0, size_t(R - valid) * rb);
  return t;
}

}  // namespace

FfnActivations ffn_forward(const Config& cfg, const FfnWeights& w, const Lhs& xs, const GroupLayout& g) {
  const int64_t R = xs.rows(), F = cfg.moe_mlp_dim, D = cfg.emb_dim;
  const DType dt = cfg.dtype;
  FfnActivations act;
  const int64_t valid = local_rows(w, g);
  RowView v0, v1;
  if (w.prefused) {
    act.h = rows_tensor(dt, R, 2 * F, valid);
    up_fused(w, xs, g, act.h);
    v0 = {act.h, 0, 2 * F};
    v1 = {act.h, F, 2 * F};
  } else {
    // h = [xs @ wi_0 | xs @ wi_1]: one pass over xs for both (the bits of two gmm calls).
    act.h = rows_tensor(dt, R, 2 * F, valid);
    w.ready(FfnPart::up);
    gmm_pair(xs, w.wi_0, w.wi_1, g, 0, act.h);
    v0 = {act.h, 0, 2 * F};
    v1 = {act.h, F, 2 * F};
  }
  act.a = rows_tensor(dt, R, F, valid);
  gated_act_forward(cfg.mlp_activation, v0, v1, valid, F, act.a);
  act.ys = rows_tensor(dt, R, D, valid);
  w.ready(FfnPart::down);
  gmm(act.a, w.wo, g, 0, act.ys);
  return act;
}

Tensor ffn_backward_data(const Config& cfg, const FfnWeights& w, const Lhs& xs, const FfnActivations& act,
                         const Tensor& dys, const GroupLayout& g, FfnGradInputs& keep,
                         const FfnRelease& rel) {
  const int64_t R = xs.rows(), F = cfg.moe_mlp_dim, D = cfg.emb_dim;
  const DType dt = cfg.dtype;
  const int64_t rows = local_rows(w, g);
  keep.xs = xs;
  keep.a = act.a;
  keep.dys = dys;
  Tensor da = rows_tensor(dt, R, F, rows);
  gmm_dlhs(dys, w.wo, g, 0, da);
  if (rel.w) rel.w->wo = Tensor();
  Tensor dxs = rows_tensor(dt, R, D, rows);
  if (w.prefused) {
    keep.dh = rows_tensor(dt, R, 2 * F, rows);
    gated_act_backward(cfg.mlp_activation, {act.h, 0, 2 * F}, {act.h, F, 2 * F}, da, rows, F,
                       {keep.dh, 0, 2 * F}, {keep.dh, F, 2 * F});
    da = Tensor();
    if (rel.act) rel.act->h = Tensor();
    dlhs_fused(w, keep.dh, g, dxs);
    if (rel.w) rel.w->wi = rel.w->wi_lo = rel.w->wi_hi = Tensor();
    return dxs;
  }
  keep.dh0 = rows_tensor(dt, R, F, rows);
  keep.dh1 = rows_tensor(dt, R, F, rows);
  gated_act_backward(cfg.mlp_activation, {act.h, 0, 2 * F}, {act.h, F, 2 * F}, da, rows, F, {keep.dh0, 0, F},
                     {keep.dh1, 0, F});
  da = Tensor();
  if (rel.act) rel.act->h = Tensor();
  // dxs = round(p0 + dh1 @ wi_1^T), p0 = dh0 @ wi_0^T in f32 (gmm_dlhs_sum: at amx_bf16 p0 stays in
  // the tiles' sums; elsewhere it is written in f32 and the second product added to it in the tiles).
  gmm_dlhs_sum(keep.dh0, w.wi_0, keep.dh1, w.wi_1, g, 0, dxs);
  if (rel.w) rel.w->wi_0 = Tensor(), rel.w->wi_1 = Tensor();
  return dxs;
}

void ffn_weight_grads_into(const FfnWeights& w, FfnGradInputs& in, const GroupLayout& g, LayerWeights& grads,
                           bool accumulate, bool release, WeightGradPart part) {
  // Shapes from the kept rows and E_l, not from the weights (a released backward has dropped them).
  MOE_ASSERT(!release || part == WeightGradPart::all, "ffn_weight_grads_into: release drops rows a later part needs");
  const int64_t El = w.experts, F = in.a.dim(1), D = in.dys.dim(1);
  const DType acc = in.dys.dtype() == DType::f64 ? DType::f64 : DType::f32;  // f64 on the double path
  if (accumulate && acc != DType::f32) fail("layer_backward: accumulate: an f64 layer returns fresh gradients (accumulation is f32 only)");
  // gmm_drhs writes every local group (zeros for an empty one): no clearing.
  auto product = [&](const Tensor& lhs, const Tensor& dout, Tensor& out, const Shape& shape) {
    if (accumulate) return gmm_drhs_acc(lhs, dout, g, 0, out);
    out = Tensor::empty(acc, shape);
    gmm_drhs(lhs, dout, g, 0, out);
  };
  if (part != WeightGradPart::up) {
    product(in.a, in.dys, grads.wo, {El, F, D});
    if (release) in.a = in.dys = Tensor();
  }
  if (part == WeightGradPart::down) return;
  if (w.prefused) {
    // The split layout's gradient [2, E, D/2, 2F] is a reshape of [E, D, 2F]: each half's experts are
    // rows [0, E/2) and [E/2, E), and gmm_drhs of a group depends only on its rows.
    Tensor dwi;
    if (accumulate) {
      dwi = grads.wi.reshaped({El, D, 2 * F});
      gmm_drhs_acc(in.xs, in.dh, g, 0, dwi);
    } else {
      dwi = Tensor::empty(acc, {El, D, 2 * F});
      drhs_fused(w, in.xs, in.dh, g, dwi);
    }
    grads.wi = w.split ? dwi.reshaped({2, El, D / 2, 2 * F}) : dwi;
  } else {
    // One call for both: xs^T is copied once where the level copies it (the bits of two products).
    if (!accumulate) grads.wi_0 = Tensor::empty(acc, {El, D, F}), grads.wi_1 = Tensor::empty(acc, {El, D, F});
    gmm_drhs_pair(in.xs, in.dh0, in.dh1, g, 0, grads.wi_0, grads.wi_1, accumulate);
  }
  if (release) in.xs = Lhs(), in.dh = in.dh0 = in.dh1 = Tensor();
}

void ffn_weight_grads(const FfnWeights& w, const FfnGradInputs& in, const GroupLayout& g,
                      LayerWeights& grads, WeightGradPart part) {
  FfnGradInputs rows = in;
  ffn_weight_grads_into(w, rows, g, grads, /*accumulate=*/false, /*release=*/false, part);
}

Tensor ffn_backward(const Config& cfg, const FfnWeights& w, const Lhs& xs, const FfnActivations& act,
                    const Tensor& dys, const GroupLayout& g, LayerWeights& grads) {
  FfnGradInputs keep;
  Tensor dxs = ffn_backward_data(cfg, w, xs, act, dys, g, keep);
  ffn_weight_grads(w, keep, g, grads);
  return dxs;
}

}  // namespace moe
