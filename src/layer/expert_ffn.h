// The expert FFN on expert-sorted rows (SPEC.md §2 step 5, §5):
//   h = xs @ wi (per group), a = act(h0) * h1, ys = a @ wo (per group),
// with separate wi_0/wi_1, prefused wi, or the split layout (two chained
// grouped GEMMs over the two expert halves into one shared buffer).
#pragma once

#include <functional>

#include "kernels/grouped_gemm.h"
#include "moe/config.h"
#include "moe/layer.h"

namespace moe {

// Expert weights cast to the compute dtype. In the split layout the two
// expert halves are separate tensors wi_lo, wi_hi [E/2, D, 2F] (each a
// reshape of one slice of the stored [2, E, D/2, 2F]; never concatenated).
// `await` (optional) is called before the first use of each part, so weights
// still in flight (an FSDP gather on the side engine) are waited for as late
// as possible: in the split layout the second half's gather overlaps the
// first half's GEMM.
enum class FfnPart { up, up_lo, up_hi, down };
struct FfnWeights {
  Tensor wi_0, wi_1, wi, wo;
  Tensor wi_lo, wi_hi;
  bool prefused = false, split = false;
  int64_t experts = 0;  // E_l: experts these weights hold (known before the weights arrive)
  std::function<void(FfnPart)> await;
  void ready(FfnPart p) const {
    if (await) await(p);
  }
};
FfnWeights ffn_weights(const Config& cfg, const LayerWeights& w);

struct FfnActivations {
  Tensor h;   // [R, 2F]: [h0 | h1] (xs @ wi_0 | xs @ wi_1, or xs @ wi prefused)
  Tensor a;   // [R, F]
  Tensor ys;  // [R, D]
};

// xs: [R, D] dtype, or x's rows gathered through the permute's index (layer_permutes_in_gemm:
// the GEMMs read them as they copy their operand); E_l = w.experts local experts (groups may list
// more: only the first E_l are computed). Rows past them in every output are zero.
FfnActivations ffn_forward(const Config& cfg, const FfnWeights& w, const Lhs& xs, const GroupLayout& groups);

// What the weight gradients need from one backward: the GEMM inputs and the
// output gradients, row for row (dh is [R, 2F] prefused, else dh0/dh1 [R, F]).
struct FfnGradInputs {
  Lhs xs;
  Tensor a, dys, dh, dh0, dh1;
};

// Where the data backward may drop what it has used (the layer's release_saved): the compute-dtype
// weight copies after their last product, the up projection h after the activation's backward.
// Point them at the same objects passed as `w` and `act`.
struct FfnRelease {
  FfnWeights* w = nullptr;
  FfnActivations* act = nullptr;
};

// The data part of the backward. dys: [R, D] dtype. Returns dxs [R, D] dtype;
// fills `keep` with the rows the weight gradients need.
Tensor ffn_backward_data(const Config& cfg, const FfnWeights& w, const Lhs& xs, const FfnActivations& act,
                         const Tensor& dys, const GroupLayout& groups, FfnGradInputs& keep,
                         const FfnRelease& release = {});

// ffn_weight_grads with two memory options. accumulate: add into the existing f32 gradients of
// `grads` (names and shapes as the weights): g := g + this step's, element by element, each chunk
// of experts computed into a scratch of at most ceil(E_l/8) experts (gmm_drhs of a group depends
// only on its rows: the bits of ffn_weight_grads, then one f32 add). release: drop in.a and in.dys
// after the wo gradient, in.xs and dh after wi's. Shapes come from `in` and w.experts, so the
// weight tensors in `w` may already be released.
// part: which gradients this call computes (down: wo; up: wi, or wi_0 and wi_1), so a caller can
// send one on its way while the other is computed; each is the same bits as in the whole call.
enum class WeightGradPart { all, down, up };
void ffn_weight_grads_into(const FfnWeights& w, FfnGradInputs& in, const GroupLayout& groups,
                           LayerWeights& grads, bool accumulate, bool release,
                           WeightGradPart part = WeightGradPart::all);

// f32 weight gradients (names as LayerWeights; E_l = w.experts experts)
// from the kept rows: dwo = a^T dys, dwi = xs^T dh per group.
void ffn_weight_grads(const FfnWeights& w, const FfnGradInputs& in, const GroupLayout& groups,
                      LayerWeights& grads, WeightGradPart part = WeightGradPart::all);

// Both parts: returns dxs and writes the weight gradients.
Tensor ffn_backward(const Config& cfg, const FfnWeights& w, const Lhs& xs, const FfnActivations& act,
                    const Tensor& dys, const GroupLayout& groups, LayerWeights& grads);

}  // namespace moe
