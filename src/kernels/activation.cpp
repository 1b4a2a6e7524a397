#include "kernels/activation.h"

#include <algorithm>

#include "kernels/dispatch.h"
#include "moe/thread_pool.h"

namespace moe {
namespace {

template <class T>
T* at(const RowView& v, int64_t r) {
  return const_cast<T*>(static_cast<const T*>(v.t.raw())) + r * v.ld + v.col0;
}

// One row of each tensor per call to the level's row entries (f32 or bf16 rows).
void act_row(Activation act, const float* g, const float* u, float* a, int64_t F) {
  kernels::table().act_forward_f(act, g, u, a, F);
}
void act_row(Activation act, const bf16* g, const bf16* u, bf16* a, int64_t F) {
  kernels::table().act_forward_b(act, g, u, a, F);
}
void act_row_backward(Activation act, const float* g, const float* u, const float* d, float* dg, float* du,
                      int64_t F) {
  kernels::table().act_backward_f(act, g, u, d, dg, du, F);
}
void act_row_backward(Activation act, const bf16* g, const bf16* u, const bf16* d, bf16* dg, bf16* du,
                      int64_t F) {
  kernels::table().act_backward_b(act, g, u, d, dg, du, F);
}

template <class T>
void forward_rows(Activation act, const RowView& h0, const RowView& h1, T* a, int64_t F, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r) act_row(act, at<T>(h0, r), at<T>(h1, r), a + r * F, F);
}

template <class T>
void backward_rows(Activation act, const RowView& h0, const RowView& h1, const T* da, const RowView& dh0,
                   const RowView& dh1, int64_t F, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r)
    act_row_backward(act, at<T>(h0, r), at<T>(h1, r), da + r * F, at<T>(dh0, r), at<T>(dh1, r), F);
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
