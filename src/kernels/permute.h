// Permute: tokens into expert-sorted rows (SPEC.md §2 step 4, §4), and back.
#pragma once

#include "moe/config.h"
#include "moe/tensor.h"
#include "route/routing.h"

namespace moe::reference {

// xs [R, D] = repeat(x, K)[order]: materializes the K-fold copy [R, D] first
// (MaxText's repeat-then-sort), then gathers it. x, xs: dtype.
void permute(const Tensor& x, const Routing& rt, Tensor& xs);

// dx [T, D] f32 = sum_k dxs[inv[t*K+k]] in slot order k = 0..K-1: unsorts dxs
// into the K-fold copy [R, D], then sums each token's K rows. f64 rows: dx f64
// (the reference-only double path; the dispatchers below take the reference for f64).
void permute_backward(const Tensor& dxs, const Routing& rt, Tensor& dx);

}  // namespace moe::reference

namespace moe::fused {

// Preconditions of the fused permute (both directions): f32/bf16 rows,
// R = T*K rows, and R < 2^31 (int32 sort indices).
bool permute_supported(DType dtype, const Routing& rt);

// xs [R, D] = x[order[r] / K]: gathers straight from x, no K-fold copy.
// Reads R*D and writes R*D elements (the reference moves 2x that).
void permute(const Tensor& x, const Routing& rt, Tensor& xs);

// dx [T, D] f32 = sum_k dxs[inv[t*K+k]]: the fused combine's forward with unit
// weights (no unsorted copy). Bit-identical to reference::permute_backward.
void permute_backward(const Tensor& dxs, const Routing& rt, Tensor& dx);

// The permute fused into the GEMMs' operand copies (SPEC.md section 4, "Best"; layer_permutes_in_gemm
// says where, permute_supported for which shapes): xs is never written, the up projection and its
// weight gradient read x's rows through this index, i32 [R], row r = order[r] / K (the row
// fused::permute copies).
Tensor permute_index(const Routing& rt);

}  // namespace moe::fused

namespace moe {

void log_fallback_once(const char* kernel);  // "permute" or "combine"
// Runs the chosen kernel; the fused one falls back to the reference (with one
// log line) when fused::permute_supported is false.
void permute(KernelChoice k, const Tensor& x, const Routing& rt, Tensor& xs);
void permute_backward(KernelChoice k, const Tensor& dxs, const Routing& rt, Tensor& dx);
}  // namespace moe
