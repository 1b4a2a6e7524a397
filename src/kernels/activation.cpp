#include "kernels/activation.h"

#include "moe/thread_pool.h"

namespace moe {
namespace {

template <class T>
T* at(const RowView& v, int64_t r) {
  return const_cast<T*>(static_cast<const T*>(v.t.raw())) + r * v.ld + v.col0;
}

template <class T, float (*Act)(float)>
void forward_rows(const RowView& h0, const RowView& h1, T* a, int64_t F, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r) {
    const T* g = at<T>(h0, r);
    const T* u = at<T>(h1, r);
    for (int64_t f = 0; f < F; ++f) a[r * F + f] = store_as<T>(Act(load_f32(g[f])) * load_f32(u[f]));
  }
}

template <class T, ActValueGrad (*Both)(float)>
void backward_rows(const RowView& h0, const RowView& h1, const T* da, const RowView& dh0, const RowView& dh1,
                   int64_t F, int64_t b, int64_t e) {
  for (int64_t r = b; r < e; ++r) {
    const T* g = at<T>(h0, r);
    const T* u = at<T>(h1, r);
    T* dg = at<T>(dh0, r);
    T* du = at<T>(dh1, r);
    for (int64_t f = 0; f < F; ++f) {
      float d = load_f32(da[r * F + f]);
      ActValueGrad a = Both(load_f32(g[f]));
      dg[f] = store_as<T>(d * load_f32(u[f]) * a.grad);
      du[f] = store_as<T>(d * a.value);
    }
  }
}

template <class T>
void forward_typed(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a) {
  T* A = a.data<T>();
  parallel_for(rows, 32, [&](int64_t b, int64_t e) {
    if (act == Activation::silu)
      forward_rows<T, silu>(h0, h1, A, F, b, e);
    else
      forward_rows<T, gelu>(h0, h1, A, F, b, e);
  });
}

template <class T>
void backward_typed(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                    int64_t F, const RowView& dh0, const RowView& dh1) {
  const T* DA = da.data<T>();
  parallel_for(rows, 32, [&](int64_t b, int64_t e) {
    if (act == Activation::silu)
      backward_rows<T, silu_value_grad>(h0, h1, DA, dh0, dh1, F, b, e);
    else
      backward_rows<T, gelu_value_grad>(h0, h1, DA, dh0, dh1, F, b, e);
  });
}

}  // namespace

void gated_act_forward(Activation act, const RowView& h0, const RowView& h1, int64_t rows, int64_t F, Tensor& a) {
  if (a.dtype() == DType::bf16)
    forward_typed<bf16>(act, h0, h1, rows, F, a);
  else
    forward_typed<float>(act, h0, h1, rows, F, a);
}

void gated_act_backward(Activation act, const RowView& h0, const RowView& h1, const Tensor& da, int64_t rows,
                        int64_t F, const RowView& dh0, const RowView& dh1) {
  if (da.dtype() == DType::bf16)
    backward_typed<bf16>(act, h0, h1, da, rows, F, dh0, dh1);
  else
    backward_typed<float>(act, h0, h1, da, rows, F, dh0, dh1);
}

}  // namespace moe
