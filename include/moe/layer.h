// The routed MoE layer on one process: forward and backward (SPEC.md §2).
//
// Data flow of one step: router (logits, scores, top-k) -> aux losses ->
// routing index math (sort by expert, group sizes, inverse) -> permute ->
// expert FFN (grouped GEMM up, gated activation, grouped GEMM down) ->
// combine. The backward runs the adjoints in reverse.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moe/config.h"
#include "moe/tensor.h"

namespace moe {

class StepTrace;

// Parameters of one layer, in their stored dtype (weight_dtype or the file's
// own). Unused fields stay undefined: wi_0/wi_1 without prefuse, wi with it.
struct LayerWeights {
  Tensor router;  // router.kernel [D, E] (router math is f32)
  Tensor wi_0;    // experts.wi_0 [E, D, F]
  Tensor wi_1;    // experts.wi_1 [E, D, F]
  Tensor wi;      // experts.wi [E, D, 2F], or [2, E, D/2, 2F] in the split layout
  Tensor wo;      // experts.wo [E, F, D]

  // Visits (SPEC name, tensor) for every weight the config uses, in file order.
  void for_each(const Config& cfg, const std::function<void(const std::string&, Tensor&)>& fn);
  void for_each(const Config& cfg, const std::function<void(const std::string&, const Tensor&)>& fn) const;
};

// SPEC names and shapes of the weights a config uses, in file order.
std::vector<std::pair<std::string, Shape>> weight_shapes(const Config& cfg);

// Random weights: N(0, 1/fan_in) per element from a counter-based generator
// keyed by (seed, name, index), so any shard of a tensor can be generated alone.
LayerWeights init_weights(const Config& cfg, uint64_t seed);

// Builds weights from a lookup of named tensors (e.g. a safetensors file),
// checking every name, shape and dtype against the config; `prefix` is
// prepended to names ("layers.3."). Errors name `origin` and the tensor.
LayerWeights weights_from(const Config& cfg, const std::function<const Tensor*(const std::string&)>& lookup,
                          const std::string& prefix, const std::string& origin);

// Everything the backward needs, plus the forward's outputs.
struct LayerForward;
struct LayerForwardDeleter {
  void operator()(LayerForward* p) const;
};
using LayerForwardPtr = std::unique_ptr<LayerForward, LayerForwardDeleter>;

struct LayerOutputs {
  Tensor y;                        // [T, D] dtype
  Tensor topk_idx;                 // [T, K] i32
  Tensor topk_weights;             // [T, K] f32 (f64 when cfg.dtype is f64)
  Tensor group_sizes;              // [E] i32 rows kept per expert
  float load_balance_loss = 0.0f;  // already weighted
  float z_loss = 0.0f;             // already weighted
  int64_t dropped = 0;             // slots dropped by capacity
  // Tokens whose router logits are not all finite, over all ranks (docs/reliability.md): > 0
  // makes both aux losses NaN; their rows still take K slots (scores NaN: experts 0..K-1).
  int64_t nonfinite_tokens = 0;
  // The two losses before their rounding to f32 (what an f64 layer reports); set by layer_forward.
  double load_balance_loss_f64 = 0.0, z_loss_f64 = 0.0;
};

struct LayerGrads {
  Tensor dx;             // [T, D] f32 (f64 when cfg.dtype is f64)
  LayerWeights weights;  // f32 (f64 when cfg.dtype is f64), same names and shapes as the weights
};

// x: [T, D] any float dtype (cast to cfg.dtype); forced_idx: optional [T, K] i32.
// cfg.dtype f64 (single process; config rules) runs every step in double on the
// reference kernels, whatever the kernel level: the gradcheck path (docs/python.md).
// trace (optional, must outlive the backward): the forward's and the backward's
// ops are recorded there under the distributed layer's names ("router",
// "sort", "permute", "ffn", "combine", "combine_backward", "ffn_backward",
// "permute_backward", "router_backward").
LayerForwardPtr layer_forward(const Config& cfg, const LayerWeights& w, const Tensor& x,
                              const Tensor* forced_idx, LayerOutputs& out, StepTrace* trace = nullptr);

// Whether layer_forward leaves the permuted rows xs [T*K, D] unwritten at the active kernel level:
// the fused permute kernel, and a level whose GEMMs read x's rows through the permute's index as
// they copy their operand (amx_bf16, bf16; SPEC.md section 4). The saved tensors then hold that
// index (i32 [T*K]) instead of xs. (The fused permute's own preconditions, R < 2^31, aside.)
bool layer_permutes_in_gemm(const Config& cfg);
// The distributed layer (moe train, DistLayer) does the same where no rows move between ranks:
// expert parallelism 1 (`expert_ranks`) and one token chunk.
bool dist_permutes_in_gemm(const Config& cfg, int64_t expert_ranks);

// The incoming gradients of the two (weighted) aux losses: the backward computes the gradient of
// load_balance * lb + z_loss * z, so an autograd caller passes its cotangents (0 when a loss is
// unused). The default (1, 1) is the plain sum; bit for bit the same as before the cotangents.
struct AuxCotangents {
  double load_balance = 1.0;
  double z_loss = 1.0;
};

// Backward of L = sum(y * dy) + the weighted aux losses (each times its cotangent).
// dy: [T, D] any float dtype.
LayerGrads layer_backward(const Config& cfg, const LayerForward& fwd, const Tensor& dy,
                          const AuxCotangents& aux = {});

// How a backward may use memory (docs/architecture.md, "Memory of one step"). Every option gives
// the same bits as the plain backward above.
struct BackwardOptions {
  // Drop each saved tensor of the forward, and the weights' compute-dtype copies, as soon as the
  // backward has used it (before the weight gradients are allocated): `fwd` cannot be used again.
  bool release_saved = false;
  // Gradient accumulation in place: add this step's weight gradients into these f32 tensors (every
  // weight the config uses, in the weights' shapes) instead of returning new ones; each element
  // becomes acc + g, the f32 sum an optimizer's `grad += g` gives. The expert gradients are added
  // in the weight gradient's store (gmm_drhs_acc; through a small scratch at the reference level):
  // never a second full set. The returned LayerGrads::weights are these same tensors.
  LayerWeights* accumulate = nullptr;
};
LayerGrads layer_backward(const Config& cfg, LayerForward& fwd, const Tensor& dy, const AuxCotangents& aux,
                          const BackwardOptions& opts);

}  // namespace moe
