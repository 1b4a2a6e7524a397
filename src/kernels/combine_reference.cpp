#include "kernels/combine.h"

#include <vector>

#include "kernels/row_ops.h"
#include "moe/thread_pool.h"

namespace moe::reference {
namespace {

// yu [R, D] = ys[inv[r]]: the unsorted copy the fused kernel avoids.
Tensor unsort(const Tensor& ys, const Routing& rt) {
  const int64_t R = rt.rows(), D = ys.dim(1);
  Tensor yu = Tensor::empty(ys.dtype(), {R, D});
  const size_t row_bytes = size_t(D) * dtype_size(ys.dtype());
  const auto* src = static_cast<const std::byte*>(ys.raw());
  auto* dst = static_cast<std::byte*>(yu.raw());
  parallel_for(R, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      std::memcpy(dst + size_t(r) * row_bytes, src + size_t(rt.inv[size_t(r)]) * row_bytes, row_bytes);
  });
  return yu;
}

template <class T>
void combine_typed(const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y) {
  const int64_t K = rt.top_k, D = ys.dim(1);
  Tensor yu = unsort(ys, rt);
  const T* U = yu.data<T>();
  const acc_t<T>* W = w.data<acc_t<T>>();
  T* Y = y.data<T>();
  parallel_for(rt.tokens, 16, [&](int64_t b, int64_t e) {
    std::vector<const T*> src(static_cast<size_t>(K));
    for (int64_t t = b; t < e; ++t) {
      if (f32_sum) {
        for (int64_t k = 0; k < K; ++k) src[size_t(k)] = U + (t * K + k) * D;
        rows::weighted_sum(W + t * K, src.data(), K, Y + t * D, D);
      } else {
        std::fill(Y + t * D, Y + (t + 1) * D, store_acc<T>(acc_t<T>(0)));
        for (int64_t k = 0; k < K; ++k) rows::axpy_rounded(W[t * K + k], U + (t * K + k) * D, Y + t * D, D);
      }
    }
  });
}

template <class T>
void combine_backward_typed(const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt, Tensor& dys,
                            Tensor& dw) {
  const int64_t K = rt.top_k, D = ys.dim(1), R = rt.rows();
  Tensor yu = unsort(ys, rt);
  const T* U = yu.data<T>();
  const T* DY = dy.data<T>();
  const acc_t<T>* W = w.data<acc_t<T>>();
  acc_t<T>* DW = dw.data<acc_t<T>>();
  // dyu [R, D] = w * dy (token order), then gathered into sorted order.
  Tensor dyu = Tensor::empty(dy.dtype(), {R, D});
  T* DU = dyu.data<T>();
  parallel_for(rt.tokens, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t k = 0; k < K; ++k) {
        int64_t s = t * K + k;
        DW[s] = rows::dot(DY + t * D, U + s * D, D);
        rows::scale(W[s], DY + t * D, DU + s * D, D);
      }
  });
  T* DS = dys.data<T>();
  parallel_for(R, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rows::copy(DU + int64_t(rt.order[size_t(r)]) * D, DS + r * D, D);
  });
}

}  // namespace

// y [T, D] = sum_k w[t,k] * ys[inv[t*K+k]]
void combine(const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y) {
  expect_shape(y, {rt.tokens, ys.dim(1)}, "[combine] y");
  if (ys.dtype() == DType::f64)
    combine_typed<double>(ys, w, rt, f32_sum, y);
  else if (ys.dtype() == DType::bf16)
    combine_typed<bf16>(ys, w, rt, f32_sum, y);
  else
    combine_typed<float>(ys, w, rt, f32_sum, y);
}

// dys [R, D], dw [T, K]
void combine_backward(const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt, Tensor& dys,
                      Tensor& dw) {
  expect_shape(dys, ys.shape(), "[combine_backward] dys");
  expect_shape(dw, {rt.tokens, rt.top_k}, "[combine_backward] dw");
  if (ys.dtype() == DType::f64)
    combine_backward_typed<double>(dy, ys, w, rt, dys, dw);
  else if (ys.dtype() == DType::bf16)
    combine_backward_typed<bf16>(dy, ys, w, rt, dys, dw);
  else
    combine_backward_typed<float>(dy, ys, w, rt, dys, dw);
}

}  // namespace moe::reference
