// Combine: expert outputs back to tokens, weighted (SPEC.md §2 step 6, §4).
#pragma once

#include "moe/config.h"
#include "moe/tensor.h"
#include "route/routing.h"

namespace moe::reference {

// y [T, D] = sum_k w[t, k] * ys[inv[t*K+k]] summed in slot order k = 0..K-1, in
// f32 (f32_sum) or rounding to y's dtype after every add; cast to y's dtype.
// Unsorts ys into a [R, D] copy first. ys, y: dtype; w: [T, K] f32 (f64 with f64
// rows: the reference-only double path, sums in f64; the dispatcher below always
// takes the reference for f64).
void combine(const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y);

// dys [R, D] (dtype) = w[t, k] * dy[t] at row inv[t*K+k]; dw [T, K] f32 = <dy[t], ys[inv[t*K+k]]>.
void combine_backward(const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt, Tensor& dys,
                      Tensor& dw);

}  // namespace moe::reference

namespace moe::fused {

// Preconditions: f32/bf16 rows, R = T*K rows, R < 2^31.
bool combine_supported(DType dtype, const Routing& rt);

// Same contract as reference::combine, one pass per token over its K rows
// (no unsorted [R, D] copy): reads R*D + T*K, writes T*D elements.
void combine(const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y);

// dys is a scaled permutation of dy (each row written once: no scatter-add, no
// atomics); dw a per-row dot product. Bit-identical to the reference.
void combine_backward(const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt, Tensor& dys,
                      Tensor& dw);

}  // namespace moe::fused

namespace moe {

void combine(KernelChoice k, const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y);
void combine_backward(KernelChoice k, const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt,
                      Tensor& dys, Tensor& dw);
}  // namespace moe
