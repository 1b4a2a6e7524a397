// Router: logits, scores, top-k selection and weights (SPEC.md §2 step 1),
// and its backward. All router math is f32; with an f64 x (the reference-only
// double path) every f32 tensor below is f64 instead and the math is in double.
#pragma once

#include "moe/config.h"
#include "moe/tensor.h"

namespace moe {

struct RouterOutput {
  Tensor x;             // [T, D]      the router's input as given (the layer's x in the compute dtype), kept
                        //             for its backward; widened to f32 inside the GEMMs, never copied in f32
  Tensor logits;        // [T, E] f32  z = x @ router.kernel
  Tensor scores;        // [T, E] f32  s = softmax(z) or sigmoid(z)
  Tensor topk_idx;      // [T, K] i32  descending score, ties to the lower expert id (or forced)
  Tensor topk_scores;   // [T, K] f32  s at idx (before normalization and scaling)
  Tensor topk_weights;  // [T, K] f32  final combine weights
};

// x: [T, D] (f32 or bf16), kernel: [D, E] f32, forced_idx: optional [T, K] i32.
RouterOutput router_forward(const Config& cfg, const Tensor& x, const Tensor& kernel, const Tensor* forced_idx);

// Backward from the combine's dW [T, K] (f32) to dlogits [T, E] (f32).
Tensor router_weights_backward(const Config& cfg, const RouterOutput& r, const Tensor& d_weights);

// dkernel[D, E] = x^T @ dlogits; dx[T, D] += dlogits @ kernel^T (both f32).
// x: the forward's RouterOutput::x (any float dtype; bf16 widened exactly inside the GEMM).
void router_matmul_backward(const Tensor& x, const Tensor& kernel, const Tensor& dlogits, Tensor& dkernel,
                            Tensor& dx);

}  // namespace moe
