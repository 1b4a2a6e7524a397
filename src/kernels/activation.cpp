#include "kernels/activation.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/dispatch.h"
#include "moe/thread_pool.h"

namespace moe {
namespace {

template <class T>
T* at(const RowView& v, int64_t r) {
  return const_cast<T*>(static_cast<const T*>(v.t.raw())) + r * v.ld + v.col0;
}

// A row as f32: the row itself (f32) or a converted copy in `buf` (bf16).
template <class T>
const float* as_f32(const T* row, int64_t n, std::vector<float>& buf) {
  if constexpr (std::is_same_v<T, float>) {
    return row;
  } else {
    buf.resize(size_t(n));
    kernels::table().bf16_to_f32(row, buf.data(), n);
    return buf.data();
  }
}

void store_f32(const float* src, float* dst, int64_t n) { std::copy(src, src + n, dst); }
void store_f32(const float* src, bf16* dst, int64_t n) { kernels::table().f32_to_bf16(src, dst, n); }

template <class T>
void forward_rows(Activation act, const RowView& h0, const RowView& h1, T* a, int64_t F, int64_t b, int64_t e) {
  std::vector<float> gb, ub, out(static_cast<size_t>(F));
  for (int64_t r = b; r < e; ++r) {
    const float* g = as_f32(at<T>(h0, r), F, gb);
    const float* u = as_f32(at<T>(h1, r), F, ub);
    kernels::table().act_forward(act, g, u, out.data(), F);
    store_f32(out.data(), a + r * F, F);
  }
}

template <class T>
void backward_rows(Activation act, const RowView& h0, const RowView& h1, const T* da, const RowView& dh0,
                   const RowView& dh1, int64_t F, int64_t b, int64_t e) {
  std::vector<float> gb, ub, db, dg(static_cast<size_t>(F)), du(static_cast<size_t>(F));
  for (int64_t r = b; r < e; ++r) {
    const float* g = as_f32(at<T>(h0, r), F, gb);
    const float* u = as_f32(at<T>(h1, r), F, ub);
    const float* d = as_f32(da + r * F, F, db);
    kernels::table().act_backward(act, g, u, d, dg.data(), du.data(), F);
    store_f32(dg.data(), at<T>(dh0, r), F);
    store_f32(du.data(), at<T>(dh1, r), F);
  }
}

template <class T>
void forward_typed(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a) {
  T* A = a.data<T>();
  parallel_for(rows, 32, [&](int64_t b, int64_t e) {
    forward_rows<T>(act, h0, h1, A, F, b, e);
  });
}

template <class T>
void backward_typed(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                    int64_t F, const RowView& dh0, const RowView& dh1) {
  const T* DA = da.data<T>();
  parallel_for(rows, 32, [&](int64_t b, int64_t e) {
    backward_rows<T>(act, h0, h1, DA, dh0, dh1, F, b, e);
  });
}

// f64 rows (the reference-only double path): the f64 twins of activation.h, element by element.
void forward_f64(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a) {
  double* A = a.data<double>();
  parallel_for(rows, 32, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const double* g = at<double>(h0, r);
      const double* u = at<double>(h1, r);
      for (int64_t i = 0; i < F; ++i)
        A[r * F + i] = (act == Activation::silu ? silu(g[i]) : gelu(g[i])) * u[i];
    }
  });
}

void backward_f64(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                  int64_t F, const RowView& dh0, const RowView& dh1) {
  const double* DA = da.data<double>();
  parallel_for(rows, 32, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const double* g = at<double>(h0, r);
      const double* u = at<double>(h1, r);
      double* dg = at<double>(dh0, r);
      double* du = at<double>(dh1, r);
      for (int64_t i = 0; i < F; ++i) {
        const ActValueGrad64 v = act == Activation::silu ? silu_value_grad(g[i]) : gelu_value_grad(g[i]);
        const double d = DA[r * F + i];
        dg[i] = d * u[i] * v.grad;
        du[i] = d * v.value;
      }
    }
  });
}

}  // namespace

void gated_act_forward(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a) {
  if (a.dtype() == DType::f64)
    forward_f64(act, h0, h1, rows, F, a);
  else if (a.dtype() == DType::bf16)
    forward_typed<bf16>(act, h0, h1, rows, F, a);
  else
    forward_typed<float>(act, h0, h1, rows, F, a);
}

void gated_act_backward(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                        int64_t F, const RowView& dh0, const RowView& dh1) {
  if (da.dtype() == DType::f64)
    backward_f64(act, h0, h1, da, rows, F, dh0, dh1);
  else if (da.dtype() == DType::bf16)
    backward_typed<bf16>(act, h0, h1, da, rows, F, dh0, dh1);
  else
    backward_typed<float>(act, h0, h1, da, rows, F, dh0, dh1);
}

}  // namespace moe
