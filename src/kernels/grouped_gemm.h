// Grouped GEMM kernels (megablox gmm / tgmm on CPUs). SPEC.md §2 step 5.
//
// Rows of `lhs` are grouped: group g owns rows [offset[g], offset[g] +
// group_sizes[g]) with offset = exclusive cumsum of group_sizes (groups may
// be empty). `rhs` holds the weights of n_local = rhs groups starting at
// global group `group_offset` (n_local == G for a plain call; the split
// layout calls twice with half the experts each).
//
// Contract shared by every implementation (reference twin and fast ones):
//  - accumulation is f32; inputs are f32 or bf16 (lhs and rhs the same type),
//    or, for gmm and gmm_drhs only, a bf16 lhs with f32 weights / f32 dout and
//    an f32 output (the router's GEMMs on the layer's bf16 x): bit for bit the
//    f32 op on the lhs widened (exact), at every level, without a widened copy;
//    outputs are rounded (RNE) to the output type once, at the end. f64 inputs
//    (the double path of an f64 layer) always run the reference twin, with f64
//    accumulation and f64 outputs (drhs too), whatever the active level.
//  - only rows of local groups are written by gmm / gmm_dlhs; other rows are
//    left untouched (callers zero-fill the rest, or chain two calls into one
//    shared output buffer).
//  - ROW INDEPENDENCE: out[r] depends only on lhs[r], the weights of r's group,
//    and the sizes (Kc, N): never on which other rows are in the call, M, or
//    r's position. Expert parallelism and the split layout rely on it for
//    bit-exact results. drhs[g] depends only on the rows of group g (in order).
//  - results do not depend on the thread count.
//
// moe::gmm / gmm_dlhs / gmm_drhs check their arguments and call the active
// kernel level (include/moe/isa.h, kernels/dispatch.h): the x86 kernels of
// src/kernels/x86/ (FMA for f32; bf16 widened to f32 at avx2 / avx512,
// vdpbf16ps at avx512_bf16) or the reference twin. Levels may differ in
// rounding (summation order; vdpbf16ps also flushes bf16 denormals); each is
// deterministic and keeps every contract above.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/tensor.h"
#include "route/group_layout.h"

namespace moe {

// The lhs of gmm, gmm_pair and the weight gradients: a tensor [M, Kc], or its rows read through an
// index, row r = src[index[r]] (index i32 [M], each in [0, src rows)): the fused permute's gather
// done by the GEMM as it copies its operand, so the sorted rows xs [M, Kc] are never written
// (SPEC.md section 4). Every op gives a gathered lhs the bits of the same rows materialized; a level
// without a gathering kernel (gathers_lhs) materializes them for the call.
struct Lhs {
  Lhs() = default;
  Lhs(const Tensor& rows) : src(rows) {}  // NOLINT: a plain tensor is an lhs
  Lhs(const Tensor& src_rows, const Tensor& row_index) : src(src_rows), index(row_index), gather(true) {}
  Tensor src, index;
  bool gather = false;
  bool gathered() const { return gather; }
  int64_t rows() const { return gather ? index.dim(0) : src.dim(0); }
  int64_t cols() const { return src.dim(1); }
  DType dtype() const { return src.dtype(); }
  // The rows themselves: src, or a fresh [M, Kc] tensor of src's gathered rows.
  Tensor materialized() const;
};

// Whether the active level reads a gathered lhs of `dtype` in its kernels (else each call materializes
// it, and a caller that keeps the rows for a later op is better off materializing them once).
bool gathers_lhs(DType dtype);

// out[M, N] (rows of local groups) = lhs[M, Kc] @ rhs[g - group_offset]  rhs: [n_local, Kc, N]
// out dtype: f32 or the lhs dtype.
void gmm(const Lhs& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset, Tensor& out);

// Two products of one lhs side by side (the up projection with separate wi_0 / wi_1):
// out[M, N0 + N1] (rows of local groups): columns [0, N0) = lhs @ rhs0[g], columns [N0, N0 + N1) =
// lhs @ rhs1[g] (rhs0 [n_local, Kc, N0], rhs1 [n_local, Kc, N1]). Each column is the chain gmm gives
// it (a column's bits depend only on its row of lhs, its column of weights and Kc), so the result is
// bit for bit that of gmm(lhs, rhs0) and gmm(lhs, rhs1) written into the two column windows; lhs is
// read (and at avx2 widened) once for both.
void gmm_pair(const Lhs& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
              int64_t group_offset, Tensor& out);

// dlhs[M, Kc] (rows of local groups) = dout[M, N] @ rhs[g]^T, reading rhs [n_local, Kc, N] transposed in place.
void gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
              Tensor& dlhs);

// gmm_dlhs with an f32 addend (the separate layout's data gradient, p0 + dh1 @ wi_1^T):
// dlhs[r, k] (rows of local groups) = round(addend[r, k] + (dout @ rhs[g]^T)[r, k]), addend f32
// [M, Kc]: one f32 addition after the whole chain, then the output's rounding. Bit for bit
// gmm_dlhs into an f32 tensor, added to the addend in f32 and rounded to dlhs's dtype, without the
// f32 product ever written.
void gmm_dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
                  const Tensor& addend, Tensor& dlhs);

// drhs[n_local, Kc, N] (f32) = for each local group g: lhs[rows g]^T @ dout[rows g]; zero for an empty group.
void gmm_drhs(const Lhs& lhs, const Tensor& dout, const GroupLayout& groups, int64_t group_offset,
              Tensor& drhs);

// Gradient accumulation in place: acc[n_local, Kc, N] (f32) := acc + gmm_drhs's product, element by
// element one f32 addition of the whole chain (bit for bit gmm_drhs into a scratch, then added), so
// an empty group adds +0. f32 or bf16 inputs.
void gmm_drhs_acc(const Lhs& lhs, const Tensor& dout, const GroupLayout& groups, int64_t group_offset,
                  Tensor& acc);

// The separate layout's data gradient: dlhs = round(p0 + p1) with p0 = dout0 @ rhs0[g]^T and p1 =
// dout1 @ rhs1[g]^T in f32 (rhs0, rhs1 [n_local, Kc, N]), bit for bit gmm_dlhs(dout0, rhs0) into an
// f32 tensor followed by gmm_dlhs_add(dout1, rhs1, that tensor); a level may keep p0 in its tiles.
void gmm_dlhs_sum(const Tensor& dout0, const Tensor& rhs0, const Tensor& dout1, const Tensor& rhs1,
                  const GroupLayout& groups, int64_t group_offset, Tensor& dlhs);

// The weight gradients of one lhs against two douts (the separate wi_0 / wi_1 layout): out0 from
// dout0, out1 from dout1, as gmm_drhs (accumulate: gmm_drhs_acc) would write them, bit for bit;
// a level that copies lhs^T copies it once for both.
void gmm_drhs_pair(const Lhs& lhs, const Tensor& dout0, const Tensor& dout1, const GroupLayout& groups,
                   int64_t group_offset, Tensor& out0, Tensor& out1, bool accumulate);

namespace reference {
// Plain loops with the same contract: the spec every fast kernel is tested against.
void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset, Tensor& out);
void gmm_pair(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
              int64_t group_offset, Tensor& out);
void gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
              Tensor& dlhs);
void gmm_dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t group_offset,
                  const Tensor& addend, Tensor& dlhs);
void gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t group_offset,
              Tensor& drhs);
}  // namespace reference

}  // namespace moe
