// Permute: tokens into expert-sorted rows (SPEC.md §2 step 4, §4), and back.
#pragma once

#include "moe/tensor.h"
#include "route/routing.h"

namespace moe::reference {

// xs [R, D] = repeat(x, K)[order]: materializes the K-fold copy [R, D] first
// (MaxText's repeat-then-sort), then gathers it. x, xs: dtype.
void permute(const Tensor& x, const Routing& rt, Tensor& xs);

// dx [T, D] f32 = sum_k dxs[inv[t*K+k]] in slot order k = 0..K-1: unsorts dxs
// into the K-fold copy [R, D], then sums each token's K rows.
void permute_backward(const Tensor& dxs, const Routing& rt, Tensor& dx);

}  // namespace moe::reference
