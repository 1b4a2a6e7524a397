// Public grouped GEMM entry points: check the arguments, then call the active
// level's kernel (kernels/dispatch.h; the reference twin at level reference).
#include "kernels/grouped_gemm.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "kernels/dispatch.h"
#include "kernels/grouped_gemm_internal.h"
#include "moe/thread_pool.h"

namespace moe {
namespace detail {
namespace {

void check_groups(const char* op, const GroupLayout& groups, int64_t goff, const Tensor& rhs_like, int64_t rows) {
  int64_t n_local = rhs_like.dim(0);
  if (goff < 0 || goff + n_local > groups.num_groups())
    fail("[", op, "] local groups [", goff, ", ", goff + n_local, ") outside the ", groups.num_groups(), " groups");
  if (groups.total() > rows) fail("[", op, "] groups hold ", groups.total(), " rows but the input has ", rows);
}

// `mixed`: the op also takes a bf16 lhs with an f32 second operand (gmm's weights, gmm_drhs's dout).
void check_float_pair(const char* op, DType a, const Tensor& b, bool mixed = false) {
  if (mixed && a == DType::bf16 && b.dtype() == DType::f32) return;
  if (a != b.dtype() || (a != DType::f32 && a != DType::bf16 && a != DType::f64))
    fail("[", op, "] inputs must both be f32, both bf16 or both f64, got ", dtype_name(a), " and ",
         dtype_name(b.dtype()), mixed ? " (a bf16 lhs with f32 is also taken)" : "");
}

// f64 inputs give f64 outputs only (the accumulator type).
void check_out_dtype(const char* op, DType in, const Tensor& out) {
  if (in == DType::f64 && out.dtype() != DType::f64)
    fail("[", op, "] output dtype must be f64 for f64 inputs, got ", dtype_name(out.dtype()));
  if (out.dtype() != DType::f32 && out.dtype() != in)
    fail("[", op, "] output dtype must be f32 or the input dtype, got ", dtype_name(out.dtype()));
}

// The lhs's shape as the messages print it: [M, Kc], or src's shape and the index's.
std::string lhs_str(const Lhs& lhs) {
  if (!lhs.gathered()) return shape_str(lhs.src.shape());
  return shape_str(lhs.src.shape()) + " gathered by " + shape_str(lhs.index.shape());
}

// A gathered lhs: src [S, Kc], index i32 [M] with every entry in [0, S).
void check_lhs(const char* op, const Lhs& lhs) {
  if (lhs.src.ndim() != 2) fail("[", op, "] expected lhs [M, Kc], got ", lhs_str(lhs));
  if (!lhs.gathered()) return;
  if (lhs.index.ndim() != 1 || lhs.index.dtype() != DType::i32)
    fail("[", op, "] lhs index: expected i32 [M], got ", dtype_name(lhs.index.dtype()), " ",
         shape_str(lhs.index.shape()));
  const int32_t* ix = lhs.index.data<int32_t>();
  const int64_t S = lhs.src.dim(0);
  for (int64_t r = 0; r < lhs.index.dim(0); ++r)
    if (ix[r] < 0 || ix[r] >= S)
      fail("[", op, "] lhs index: row ", r, " names source row ", ix[r], ", expected 0 <= row < ", S);
}

}  // namespace

void check_gmm(const Lhs& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff,
               const Tensor& out) {
  check_lhs("gmm", lhs);
  check_float_pair("gmm", lhs.dtype(), rhs, /*mixed=*/true);
  if (rhs.ndim() != 3 || rhs.dim(1) != lhs.cols())
    fail("[gmm] expected lhs [M, Kc] and rhs [G, Kc, N], got ", lhs_str(lhs), " and ",
         shape_str(rhs.shape()));
  check_groups("gmm", groups, goff, rhs, lhs.rows());
  expect_shape(out, {lhs.rows(), rhs.dim(2)}, "[gmm] out");
  check_out_dtype("gmm", rhs.dtype() == DType::f32 ? DType::f32 : lhs.dtype(), out);
}

void check_gmm_pair(const Lhs& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
                    int64_t goff, const Tensor& out) {
  check_lhs("gmm_pair", lhs);
  check_float_pair("gmm_pair", lhs.dtype(), rhs0);
  check_float_pair("gmm_pair", lhs.dtype(), rhs1);
  if (rhs0.ndim() != 3 || rhs1.ndim() != 3 || rhs0.dim(1) != lhs.cols() || rhs1.dim(0) != rhs0.dim(0) ||
      rhs1.dim(1) != lhs.cols())
    fail("[gmm_pair] expected lhs [M, Kc], rhs0 [G, Kc, N0] and rhs1 [G, Kc, N1], got ", lhs_str(lhs), ", ",
         shape_str(rhs0.shape()), " and ", shape_str(rhs1.shape()));
  check_groups("gmm_pair", groups, goff, rhs0, lhs.rows());
  expect_shape(out, {lhs.rows(), rhs0.dim(2) + rhs1.dim(2)}, "[gmm_pair] out");
  check_out_dtype("gmm_pair", lhs.dtype(), out);
}

void check_gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff,
                    const Tensor& dlhs) {
  check_float_pair("gmm_dlhs", dout.dtype(), rhs);
  if (dout.ndim() != 2 || rhs.ndim() != 3 || rhs.dim(2) != dout.dim(1))
    fail("[gmm_dlhs] expected dout [M, N] and rhs [G, Kc, N], got ", shape_str(dout.shape()), " and ",
         shape_str(rhs.shape()));
  check_groups("gmm_dlhs", groups, goff, rhs, dout.dim(0));
  expect_shape(dlhs, {dout.dim(0), rhs.dim(1)}, "[gmm_dlhs] dlhs");
  check_out_dtype("gmm_dlhs", dout.dtype(), dlhs);
}

void check_gmm_dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff,
                        const Tensor& addend, const Tensor& dlhs) {
  check_gmm_dlhs(dout, rhs, groups, goff, dlhs);
  const DType acc = dout.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (addend.dtype() != acc)
    fail("[gmm_dlhs_add] addend must be ", dtype_name(acc), " for ", dtype_name(dout.dtype()),
         " inputs, got ", dtype_name(addend.dtype()));
  expect_shape(addend, dlhs.shape(), "[gmm_dlhs_add] addend");
}

void check_gmm_drhs(const Lhs& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff,
                    const Tensor& drhs, bool mixed) {
  check_lhs("gmm_drhs", lhs);
  check_float_pair("gmm_drhs", lhs.dtype(), dout, mixed);
  if (dout.ndim() != 2 || lhs.rows() != dout.dim(0) || drhs.ndim() != 3)
    fail("[gmm_drhs] expected lhs [M, Kc], dout [M, N], drhs [G, Kc, N], got ", lhs_str(lhs), ", ",
         shape_str(dout.shape()), ", ", shape_str(drhs.shape()));
  check_groups("gmm_drhs", groups, goff, drhs, lhs.rows());
  expect_shape(drhs, {drhs.dim(0), lhs.cols(), dout.dim(1)}, "[gmm_drhs] drhs");
  const DType acc = lhs.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (drhs.dtype() != acc)
    fail("[gmm_drhs] drhs must be ", dtype_name(acc), " for ", dtype_name(lhs.dtype()), " inputs");
}

}  // namespace detail

Tensor Lhs::materialized() const {
  if (!gathered()) return src;
  const int64_t M = rows(), C = cols();
  Tensor out = Tensor::empty(src.dtype(), {M, C});
  const size_t rb = size_t(C) * dtype_size(src.dtype());
  const auto* S = static_cast<const std::byte*>(src.raw());
  auto* O = static_cast<std::byte*>(out.raw());
  const int32_t* ix = index.data<int32_t>();
  parallel_for(M, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) std::memcpy(O + size_t(r) * rb, S + size_t(ix[r]) * rb, rb);
  });
  return out;
}

namespace {
// The active level's gathering kernels for this lhs and the call's other operand (null: materialize
// the rows for the call; a bf16 lhs with f32 weights or dout is never gathered by the kernels).
const kernels::GatherTable* gathering(const Lhs& lhs, const Tensor& other) {
  const kernels::GatherTable* t = kernels::table().gather;
  return lhs.gathered() && lhs.dtype() == DType::bf16 && other.dtype() == DType::bf16 ? t : nullptr;
}
}  // namespace

bool gathers_lhs(DType dtype) { return dtype == DType::bf16 && kernels::table().gather != nullptr; }

void gmm(const Lhs& lhs, const Tensor& rhs, const GroupLayout& g, int64_t o, Tensor& out) {
  detail::check_gmm(lhs, rhs, g, o, out);
  if (const kernels::GatherTable* t = gathering(lhs, rhs)) return t->gmm(lhs.src, lhs.index, rhs, g, o, out);
  const Tensor rows = lhs.materialized();
  if (rows.dtype() == DType::f64) return reference::gmm(rows, rhs, g, o, out);  // f64: reference level only
  kernels::table().gmm(rows, rhs, g, o, out);
}

void gmm_pair(const Lhs& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& g, int64_t o,
              Tensor& out) {
  detail::check_gmm_pair(lhs, rhs0, rhs1, g, o, out);
  if (const kernels::GatherTable* t = gathering(lhs, rhs0))
    return t->gmm_pair(lhs.src, lhs.index, rhs0, rhs1, g, o, out);
  const Tensor rows = lhs.materialized();
  if (rows.dtype() == DType::f64) return reference::gmm_pair(rows, rhs0, rhs1, g, o, out);
  kernels::table().gmm_pair(rows, rhs0, rhs1, g, o, out);
}

void gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t o, Tensor& dlhs) {
  detail::check_gmm_dlhs(dout, rhs, g, o, dlhs);
  if (dout.dtype() == DType::f64) return reference::gmm_dlhs(dout, rhs, g, o, dlhs);
  kernels::table().gmm_dlhs(dout, rhs, g, o, dlhs);
}

void gmm_dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t o,
                  const Tensor& addend, Tensor& dlhs) {
  detail::check_gmm_dlhs_add(dout, rhs, g, o, addend, dlhs);
  if (dout.dtype() == DType::f64) return reference::gmm_dlhs_add(dout, rhs, g, o, addend, dlhs);
  kernels::table().gmm_dlhs_add(dout, rhs, g, o, addend, dlhs);
}

void gmm_drhs(const Lhs& lhs, const Tensor& dout, const GroupLayout& g, int64_t o, Tensor& drhs) {
  detail::check_gmm_drhs(lhs, dout, g, o, drhs, /*mixed=*/true);
  if (const kernels::GatherTable* t = gathering(lhs, dout))
    return t->gmm_drhs(lhs.src, lhs.index, dout, g, o, drhs, false);
  const Tensor rows = lhs.materialized();
  if (rows.dtype() == DType::f64) return reference::gmm_drhs(rows, dout, g, o, drhs);
  kernels::table().gmm_drhs(rows, dout, g, o, drhs);
}

void gmm_drhs_acc(const Lhs& lhs, const Tensor& dout, const GroupLayout& g, int64_t o, Tensor& acc) {
  if (lhs.dtype() == DType::f64) fail("[gmm_drhs_acc] f64 inputs: accumulation is f32 only");
  detail::check_gmm_drhs(lhs, dout, g, o, acc);
  if (const kernels::GatherTable* t = gathering(lhs, dout))
    return t->gmm_drhs(lhs.src, lhs.index, dout, g, o, acc, true);
  kernels::drhs_acc_of(kernels::table(), lhs.materialized(), dout, g, o, acc);
}

void gmm_dlhs_sum(const Tensor& dout0, const Tensor& rhs0, const Tensor& dout1, const Tensor& rhs1,
                  const GroupLayout& g, int64_t o, Tensor& dlhs) {
  detail::check_gmm_dlhs(dout0, rhs0, g, o, dlhs);
  detail::check_gmm_dlhs(dout1, rhs1, g, o, dlhs);
  if (dout0.dtype() == DType::f64) {
    Tensor p0(DType::f64, dlhs.shape());
    reference::gmm_dlhs(dout0, rhs0, g, o, p0);
    return reference::gmm_dlhs_add(dout1, rhs1, g, o, p0, dlhs);
  }
  const kernels::Table& t = kernels::table();
  if (t.gmm_dlhs_sum) return t.gmm_dlhs_sum(dout0, rhs0, dout1, rhs1, g, o, dlhs);
  kernels::dlhs_sum_by_calls(t, dout0, rhs0, dout1, rhs1, g, o, dlhs);
}

void gmm_drhs_pair(const Lhs& in, const Tensor& dout0, const Tensor& dout1, const GroupLayout& g, int64_t o,
                   Tensor& out0, Tensor& out1, bool accumulate) {
  if (accumulate && in.dtype() == DType::f64) fail("[gmm_drhs_acc] f64 inputs: accumulation is f32 only");
  detail::check_gmm_drhs(in, dout0, g, o, out0);
  detail::check_gmm_drhs(in, dout1, g, o, out1);
  if (const kernels::GatherTable* t = gathering(in, dout0))
    return t->gmm_drhs_pair(in.src, in.index, dout0, dout1, g, o, out0, out1, accumulate);
  const Tensor lhs = in.materialized();
  if (lhs.dtype() == DType::f64) {
    reference::gmm_drhs(lhs, dout0, g, o, out0);
    return reference::gmm_drhs(lhs, dout1, g, o, out1);
  }
  const kernels::Table& t = kernels::table();
  if (t.gmm_drhs_pair) return t.gmm_drhs_pair(lhs, dout0, dout1, g, o, out0, out1, accumulate);
  kernels::drhs_pair_by_calls(t, lhs, dout0, dout1, g, o, out0, out1, accumulate);
}

namespace kernels {
void dlhs_sum_by_calls(const Table& t, const Tensor& dout0, const Tensor& rhs0, const Tensor& dout1,
                       const Tensor& rhs1, const GroupLayout& g, int64_t o, Tensor& dlhs) {
  Tensor p0 = Tensor::empty(DType::f32, dlhs.shape());
  t.gmm_dlhs(dout0, rhs0, g, o, p0);
  t.gmm_dlhs_add(dout1, rhs1, g, o, p0, dlhs);
}

void drhs_pair_by_calls(const Table& t, const Tensor& lhs, const Tensor& dout0, const Tensor& dout1,
                        const GroupLayout& g, int64_t o, Tensor& out0, Tensor& out1, bool accumulate) {
  for (auto [dout, out] : {std::pair<const Tensor*, Tensor*>{&dout0, &out0}, {&dout1, &out1}}) {
    if (accumulate)
      drhs_acc_of(t, lhs, *dout, g, o, *out);
    else
      t.gmm_drhs(lhs, *dout, g, o, *out);
  }
}

void drhs_acc_of(const Table& t, const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t o,
                 Tensor& acc) {
  if (t.gmm_drhs_acc) return t.gmm_drhs_acc(lhs, dout, g, o, acc);
  drhs_acc_by_chunks(t.gmm_drhs, lhs, dout, g, o, acc);
}

void drhs_acc_by_chunks(GemmFn drhs, const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t o,
                        Tensor& acc) {
  const int64_t E = acc.dim(0), chunk = std::max<int64_t>(1, (E + 7) / 8);
  Tensor scratch = Tensor::empty(DType::f32, {std::min(chunk, E), acc.dim(1), acc.dim(2)});
  for (int64_t e0 = 0; e0 < E; e0 += chunk) {
    const int64_t n = std::min(chunk, E - e0);
    Tensor part = scratch.slice_rows(0, n), dst = acc.slice_rows(e0, e0 + n);
    drhs(lhs, dout, g, o + e0, part);
    float* d = dst.data<float>();
    const float* p = part.data<float>();
    parallel_for(part.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) d[i] = d[i] + p[i];
    });
  }
}
}  // namespace kernels

}  // namespace moe
