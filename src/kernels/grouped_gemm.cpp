// Public grouped GEMM entry points: check the arguments, then call the active
// level's kernel (kernels/dispatch.h; the reference twin at level reference).
#include "kernels/grouped_gemm.h"

#include <algorithm>
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

void check_float_pair(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() ||
      (a.dtype() != DType::f32 && a.dtype() != DType::bf16 && a.dtype() != DType::f64))
    fail("[", op, "] inputs must both be f32, both bf16 or both f64, got ", dtype_name(a.dtype()), " and ",
         dtype_name(b.dtype()));
}

// f64 inputs give f64 outputs only (the accumulator type).
void check_out_dtype(const char* op, const Tensor& in, const Tensor& out) {
  if (in.dtype() == DType::f64 && out.dtype() != DType::f64)
    fail("[", op, "] output dtype must be f64 for f64 inputs, got ", dtype_name(out.dtype()));
  if (out.dtype() != DType::f32 && out.dtype() != in.dtype())
    fail("[", op, "] output dtype must be f32 or the input dtype, got ", dtype_name(out.dtype()));
}

}  // namespace

void check_gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, const Tensor& out) {
  check_float_pair("gmm", lhs, rhs);
  if (lhs.ndim() != 2 || rhs.ndim() != 3 || rhs.dim(1) != lhs.dim(1))
    fail("[gmm] expected lhs [M, Kc] and rhs [G, Kc, N], got ", shape_str(lhs.shape()), " and ",
         shape_str(rhs.shape()));
  check_groups("gmm", groups, goff, rhs, lhs.dim(0));
  expect_shape(out, {lhs.dim(0), rhs.dim(2)}, "[gmm] out");
  check_out_dtype("gmm", lhs, out);
}

void check_gmm_pair(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
                    int64_t goff, const Tensor& out) {
  check_float_pair("gmm_pair", lhs, rhs0);
  check_float_pair("gmm_pair", lhs, rhs1);
  if (lhs.ndim() != 2 || rhs0.ndim() != 3 || rhs1.ndim() != 3 || rhs0.dim(1) != lhs.dim(1) ||
      rhs1.dim(0) != rhs0.dim(0) || rhs1.dim(1) != lhs.dim(1))
    fail("[gmm_pair] expected lhs [M, Kc], rhs0 [G, Kc, N0] and rhs1 [G, Kc, N1], got ",
         shape_str(lhs.shape()), ", ", shape_str(rhs0.shape()), " and ", shape_str(rhs1.shape()));
  check_groups("gmm_pair", groups, goff, rhs0, lhs.dim(0));
  expect_shape(out, {lhs.dim(0), rhs0.dim(2) + rhs1.dim(2)}, "[gmm_pair] out");
  check_out_dtype("gmm_pair", lhs, out);
}

void check_gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff,
                    const Tensor& dlhs) {
  check_float_pair("gmm_dlhs", dout, rhs);
  if (dout.ndim() != 2 || rhs.ndim() != 3 || rhs.dim(2) != dout.dim(1))
    fail("[gmm_dlhs] expected dout [M, N] and rhs [G, Kc, N], got ", shape_str(dout.shape()), " and ",
         shape_str(rhs.shape()));
  check_groups("gmm_dlhs", groups, goff, rhs, dout.dim(0));
  expect_shape(dlhs, {dout.dim(0), rhs.dim(1)}, "[gmm_dlhs] dlhs");
  check_out_dtype("gmm_dlhs", dout, dlhs);
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

void check_gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff,
                    const Tensor& drhs) {
  check_float_pair("gmm_drhs", lhs, dout);
  if (lhs.ndim() != 2 || dout.ndim() != 2 || lhs.dim(0) != dout.dim(0) || drhs.ndim() != 3)
    fail("[gmm_drhs] expected lhs [M, Kc], dout [M, N], drhs [G, Kc, N], got ", shape_str(lhs.shape()), ", ",
         shape_str(dout.shape()), ", ", shape_str(drhs.shape()));
  check_groups("gmm_drhs", groups, goff, drhs, lhs.dim(0));
  expect_shape(drhs, {drhs.dim(0), lhs.dim(1), dout.dim(1)}, "[gmm_drhs] drhs");
  const DType acc = lhs.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (drhs.dtype() != acc)
    fail("[gmm_drhs] drhs must be ", dtype_name(acc), " for ", dtype_name(lhs.dtype()), " inputs");
}

}  // namespace detail

void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& g, int64_t o, Tensor& out) {
  detail::check_gmm(lhs, rhs, g, o, out);
  if (lhs.dtype() == DType::f64) return reference::gmm(lhs, rhs, g, o, out);  // f64: reference level only
  kernels::table().gmm(lhs, rhs, g, o, out);
}

void gmm_pair(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& g, int64_t o,
              Tensor& out) {
  detail::check_gmm_pair(lhs, rhs0, rhs1, g, o, out);
  if (lhs.dtype() == DType::f64) return reference::gmm_pair(lhs, rhs0, rhs1, g, o, out);
  kernels::table().gmm_pair(lhs, rhs0, rhs1, g, o, out);
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

void gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t o, Tensor& drhs) {
  detail::check_gmm_drhs(lhs, dout, g, o, drhs);
  if (lhs.dtype() == DType::f64) return reference::gmm_drhs(lhs, dout, g, o, drhs);
  kernels::table().gmm_drhs(lhs, dout, g, o, drhs);
}

void gmm_drhs_acc(const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t o, Tensor& acc) {
  if (lhs.dtype() == DType::f64) fail("[gmm_drhs_acc] f64 inputs: accumulation is f32 only");
  detail::check_gmm_drhs(lhs, dout, g, o, acc);
  kernels::drhs_acc_of(kernels::table(), lhs, dout, g, o, acc);
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

void gmm_drhs_pair(const Tensor& lhs, const Tensor& dout0, const Tensor& dout1, const GroupLayout& g,
                   int64_t o, Tensor& out0, Tensor& out1, bool accumulate) {
  if (accumulate && lhs.dtype() == DType::f64) fail("[gmm_drhs_acc] f64 inputs: accumulation is f32 only");
  detail::check_gmm_drhs(lhs, dout0, g, o, out0);
  detail::check_gmm_drhs(lhs, dout1, g, o, out1);
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
