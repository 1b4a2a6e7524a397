// The one kernel dispatch: a table of kernels per level (include/moe/isa.h),
// looked up by the active level. Each SIMD level's table (x86 and Arm) is
// built from one source (src/kernels/simd/gemm_impl.h, rows_impl.h and
// row_loops.h compiled for that level over its vector traits); the reference table holds the reference GEMM twins and the
// portable row loops.
//
// Row primitives give the same bits at every level (no fma, a fixed order of
// additions: kernels/row_ops.h); the grouped GEMM's bits may differ between
// levels (kernels/grouped_gemm.h), never within one.
#pragma once

#include <cstdint>

#include "moe/config.h"
#include "moe/dtype.h"
#include "moe/isa.h"
#include "moe/tensor.h"
#include "route/group_layout.h"

namespace moe::kernels {

using GemmFn = void (*)(const Tensor&, const Tensor&, const GroupLayout&, int64_t, Tensor&);
using GemmPairFn = void (*)(const Tensor&, const Tensor&, const Tensor&, const GroupLayout&, int64_t,
                            Tensor&);
using GemmAddFn = void (*)(const Tensor&, const Tensor&, const GroupLayout&, int64_t, const Tensor&, Tensor&);
using DlhsSumFn = void (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const GroupLayout&,
                           int64_t, Tensor&);
using DrhsPairFn = void (*)(const Tensor&, const Tensor&, const Tensor&, const GroupLayout&, int64_t, Tensor&,
                            Tensor&, bool);

// Kernels reading a gathered lhs (grouped_gemm.h, Lhs: row r = src[index[r]], index i32 [M]), bf16
// inputs only; the same contracts and bits as the table's ops on the materialized rows.
struct GatherTable {
  void (*gmm)(const Tensor& src, const Tensor& index, const Tensor& rhs, const GroupLayout&, int64_t,
              Tensor& out);
  void (*gmm_pair)(const Tensor& src, const Tensor& index, const Tensor& rhs0, const Tensor& rhs1,
                   const GroupLayout&, int64_t, Tensor& out);
  // gmm_drhs, or gmm_drhs_acc when accumulating.
  void (*gmm_drhs)(const Tensor& src, const Tensor& index, const Tensor& dout, const GroupLayout&, int64_t,
                   Tensor& drhs, bool accumulate);
  void (*gmm_drhs_pair)(const Tensor& src, const Tensor& index, const Tensor& dout0, const Tensor& dout1,
                        const GroupLayout&, int64_t, Tensor& out0, Tensor& out1, bool accumulate);
};

// The per-step constants of one AdamW update (train/optimizer.h has the formula).
struct AdamWStep {
  float b1, a1, b2, a2;  // beta1, 1 - beta1, beta2, 1 - beta2
  float c1, c2;          // bias corrections 1 / (1 - beta^t)
  float lr, eps, wd;     // wd: lr * weight_decay, or 0 for parameters without decay
};

struct Table {
  Isa isa;
  // Grouped GEMM (arguments checked by the callers in grouped_gemm.cpp).
  GemmFn gmm, gmm_dlhs, gmm_drhs;
  GemmPairFn gmm_pair;
  GemmAddFn gmm_dlhs_add;
  // gmm_drhs_acc (acc := acc + drhs); null (the reference level): a scratch of a few groups and an
  // add (drhs_acc_by_chunks).
  GemmFn gmm_drhs_acc = nullptr;
  // gmm_drhs_pair; null: two calls (drhs_pair_by_calls).
  DrhsPairFn gmm_drhs_pair = nullptr;
  // gmm_dlhs_sum; null: gmm_dlhs into an f32 partial, then gmm_dlhs_add (dlhs_sum_by_calls).
  DlhsSumFn gmm_dlhs_sum = nullptr;
  // The gathered-lhs kernels; null: the entry points materialize the rows for the call.
  const GatherTable* gather = nullptr;
  // Row primitives (kernels/row_ops.h has their contracts).
  void (*weighted_sum_bb)(const float*, const bf16* const*, int64_t, bf16*, int64_t, const bf16* const*);
  void (*weighted_sum_bf)(const float*, const bf16* const*, int64_t, float*, int64_t, const bf16* const*);
  void (*weighted_sum_ff)(const float*, const float* const*, int64_t, float*, int64_t, const float* const*);
  void (*axpy_f32_b)(float, const bf16*, float*, int64_t);
  void (*axpy_f32_f)(float, const float*, float*, int64_t);
  void (*axpy_rounded_b)(float, const bf16*, bf16*, int64_t);
  void (*scale_b)(float, const bf16*, bf16*, int64_t);
  void (*scale_f)(float, const float*, float*, int64_t);
  float (*dot_b)(const bf16*, const bf16*, int64_t);
  float (*dot_f)(const float*, const float*, int64_t);
  // The combine's backward for one token: dots[k] = dot(dy, src[k]), dst[k] = scale(w[k], dy); the
  // next token's rows (optional) prefetched.
  void (*dot_scale_b)(const bf16*, const bf16* const*, const float*, bf16* const*, float*, int64_t, int64_t,
                      const bf16* const*, bf16* const*);
  void (*dot_scale_f)(const float*, const float* const*, const float*, float* const*, float*, int64_t,
                      int64_t, const float* const*, float* const*);
  // Casts of contiguous rows: f32 -> bf16 (round to nearest even, as to_bf16) and back.
  void (*f32_to_bf16)(const float*, bf16*, int64_t);
  void (*bf16_to_f32)(const bf16*, float*, int64_t);
  // Gated activation over n elements of a row (kernels/activation.h): a = act(g) * u; backward
  // dg = d * u * act'(g), du = d * act(g). In f32 from the stored values, rounded once to the row
  // type; the bits of the scalar functions of activation.h (NaN payloads aside).
  void (*act_forward_f)(Activation, const float* g, const float* u, float* a, int64_t n);
  void (*act_forward_b)(Activation, const bf16* g, const bf16* u, bf16* a, int64_t n);
  void (*act_backward_f)(Activation, const float* g, const float* u, const float* d, float* dg, float* du,
                         int64_t n);
  void (*act_backward_b)(Activation, const bf16* g, const bf16* u, const bf16* d, bf16* dg, bf16* du,
                         int64_t n);
  // AdamW on n contiguous parameters p with gradients g and moments m, v (in place).
  void (*adamw)(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& k);
};

// gmm_drhs_acc from a level's gmm_drhs: the groups' gradients a chunk of at most an eighth of them
// at a time into a scratch, each chunk then added to acc in f32 (the same bits).
void drhs_acc_by_chunks(GemmFn drhs, const Tensor& lhs, const Tensor& dout, const GroupLayout& groups,
                        int64_t group_offset, Tensor& acc);

// gmm_drhs_acc at table `t`: its own, else drhs_acc_by_chunks over its gmm_drhs.
void drhs_acc_of(const Table& t, const Tensor& lhs, const Tensor& dout, const GroupLayout& groups,
                 int64_t group_offset, Tensor& acc);

// gmm_drhs_pair as the two calls of table `t` (gmm_drhs, or gmm_drhs_acc when accumulating).
void drhs_pair_by_calls(const Table& t, const Tensor& lhs, const Tensor& dout0, const Tensor& dout1,
                        const GroupLayout& groups, int64_t group_offset, Tensor& out0, Tensor& out1,
                        bool accumulate);

// gmm_dlhs_sum as table `t`'s gmm_dlhs into an f32 partial and its gmm_dlhs_add.
void dlhs_sum_by_calls(const Table& t, const Tensor& dout0, const Tensor& rhs0, const Tensor& dout1,
                       const Tensor& rhs1, const GroupLayout& groups, int64_t group_offset, Tensor& dlhs);

// The table of `isa` (REQUIRES: isa_supported(isa)).
const Table& table(Isa isa);
// The table of the active level.
inline const Table& table() { return table(active_isa()); }

}  // namespace moe::kernels
