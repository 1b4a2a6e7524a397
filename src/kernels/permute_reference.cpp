#include <vector>

#include "kernels/permute.h"
#include "kernels/row_ops.h"
#include "moe/thread_pool.h"

namespace moe::reference {
namespace {

template <class T>
void permute_typed(const Tensor& x, const Routing& rt, Tensor& xs) {
  const int64_t R = rt.rows(), K = rt.top_k, D = x.dim(1);
  Tensor rep = Tensor::empty(x.dtype(), {R, D});  // the K-fold copy the fused kernel avoids
  const T* X = x.data<T>();
  T* P = rep.data<T>();
  parallel_for(R, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rows::copy(X + (r / K) * D, P + r * D, D);
  });
  T* S = xs.data<T>();
  parallel_for(R, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rows::copy(P + int64_t(rt.order[size_t(r)]) * D, S + r * D, D);
  });
}

template <class T>
void permute_backward_typed(const Tensor& dxs, const Routing& rt, Tensor& dx) {
  const int64_t R = rt.rows(), K = rt.top_k, T_ = rt.tokens, D = dxs.dim(1);
  Tensor unsorted = Tensor::empty(dxs.dtype(), {R, D});
  const T* G = dxs.data<T>();
  T* U = unsorted.data<T>();
  parallel_for(R, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rows::copy(G + int64_t(rt.inv[size_t(r)]) * D, U + r * D, D);
  });
  acc_t<T>* DX = dx.data<acc_t<T>>();  // f32 (f64 for f64 rows)
  parallel_for(T_, 16, [&](int64_t b, int64_t e) {
    std::vector<const T*> src(static_cast<size_t>(K));
    const std::vector<acc_t<T>> ones(static_cast<size_t>(K), acc_t<T>(1));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t k = 0; k < K; ++k) src[size_t(k)] = U + (t * K + k) * D;
      rows::weighted_sum(ones.data(), src.data(), K, DX + t * D, D);
    }
  });
}

}  // namespace

// xs [R, D] = repeat(x, K)[order]
void permute(const Tensor& x, const Routing& rt, Tensor& xs) {
  expect_shape(xs, {rt.rows(), x.dim(1)}, "[permute] xs");
  if (x.dtype() == DType::f64)
    permute_typed<double>(x, rt, xs);
  else if (x.dtype() == DType::bf16)
    permute_typed<bf16>(x, rt, xs);
  else
    permute_typed<float>(x, rt, xs);
}

// dx [T, D] f32 = sum_k dxs[inv[t*K+k]]
void permute_backward(const Tensor& dxs, const Routing& rt, Tensor& dx) {
  expect_shape(dx, {rt.tokens, dxs.dim(1)}, "[permute_backward] dx");
  if (dxs.dtype() == DType::f64)
    permute_backward_typed<double>(dxs, rt, dx);
  else if (dxs.dtype() == DType::bf16)
    permute_backward_typed<bf16>(dxs, rt, dx);
  else
    permute_backward_typed<float>(dxs, rt, dx);
}

}  // namespace moe::reference
