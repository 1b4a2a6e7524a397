#include <algorithm>
#include <vector>

#include "kernels/combine.h"
#include "kernels/permute.h"
#include "kernels/row_ops.h"
#include "moe/thread_pool.h"

namespace moe {
namespace fused {
namespace {

template <class T>
void combine_typed(const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y) {
  const int64_t K = rt.top_k, D = ys.dim(1);
  const T* S = ys.data<T>();
  const float* W = w.data<float>();
  T* Y = y.data<T>();
  parallel_for(rt.tokens, rows::row_grain((K + 1) * D * int64_t(sizeof(T)), 16), [&](int64_t b, int64_t e) {
    std::vector<const T*> src(static_cast<size_t>(K)), next(static_cast<size_t>(K));
    for (int64_t t = b; t < e; ++t) {
      const int32_t* rows_of_t = rt.inv.data() + t * K;
      if (f32_sum) {
        const int32_t* rows_of_next = rt.inv.data() + std::min(t + 1, e - 1) * K;
        for (int64_t k = 0; k < K; ++k) {
          src[size_t(k)] = S + int64_t(rows_of_t[k]) * D;
          next[size_t(k)] = S + int64_t(rows_of_next[k]) * D;
        }
        rows::weighted_sum(W + t * K, src.data(), K, Y + t * D, D, next.data());
      } else {
        std::fill(Y + t * D, Y + (t + 1) * D, store_as<T>(0.0f));
        for (int64_t k = 0; k < K; ++k) rows::axpy_rounded(W[t * K + k], S + int64_t(rows_of_t[k]) * D, Y + t * D, D);
      }
    }
  });
}

template <class T>
void backward_typed(const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt, Tensor& dys,
                    Tensor& dw) {
  const int64_t K = rt.top_k, D = ys.dim(1);
  const T* S = ys.data<T>();
  const T* DY = dy.data<T>();
  const float* W = w.data<float>();
  T* DS = dys.data<T>();
  float* DW = dw.data<float>();
  // Per token, dw[t, k] = dot(dy[t], ys[row]) and dys[row] = scale(w[t, k], dy[t]) for its K rows in one
  // pass over dy[t] (rows::dot_scale: the bits of the two calls per row, the reference's).
  parallel_for(rt.tokens, rows::row_grain((K + 1) * D * int64_t(sizeof(T)), 16), [&](int64_t b, int64_t e) {
    // Token t's rows and the next token's (prefetched as t runs), in two halves that swap roles.
    std::vector<const T*> src(static_cast<size_t>(2 * K));
    std::vector<T*> dst(static_cast<size_t>(2 * K));
    const T** cur_src = src.data();
    const T** next_src = src.data() + K;
    T** cur_dst = dst.data();
    T** next_dst = dst.data() + K;
    auto rows_of = [&](int64_t t, const T** s_rows, T** d_rows) {
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = rt.inv[size_t(t * K + k)];
        s_rows[k] = S + row * D;
        d_rows[k] = DS + row * D;
      }
    };
    rows_of(b, cur_src, cur_dst);
    for (int64_t t = b; t < e; ++t) {
      rows_of(std::min(t + 1, e - 1), next_src, next_dst);
      rows::dot_scale(DY + t * D, cur_src, W + t * K, cur_dst, DW + t * K, K, D, next_src, next_dst);
      std::swap(cur_src, next_src);
      std::swap(cur_dst, next_dst);
    }
  });
}

}  // namespace

bool combine_supported(DType dtype, const Routing& rt) {
  return (dtype == DType::f32 || dtype == DType::bf16) && rt.rows() == rt.tokens * rt.top_k &&
         rt.rows() < (int64_t(1) << 31);
}

// y [T, D] = sum_k w[t,k] * ys[inv[t*K+k]]
void combine(const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y) {
  expect_shape(y, {rt.tokens, ys.dim(1)}, "[fused combine] y");
  ys.dtype() == DType::bf16 ? combine_typed<bf16>(ys, w, rt, f32_sum, y) : combine_typed<float>(ys, w, rt, f32_sum, y);
}

// dys [R, D], dw [T, K]
void combine_backward(const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt, Tensor& dys,
                      Tensor& dw) {
  expect_shape(dys, ys.shape(), "[fused combine_backward] dys");
  expect_shape(dw, {rt.tokens, rt.top_k}, "[fused combine_backward] dw");
  ys.dtype() == DType::bf16 ? backward_typed<bf16>(dy, ys, w, rt, dys, dw) : backward_typed<float>(dy, ys, w, rt, dys, dw);
}

}  // namespace fused

void combine(KernelChoice k, const Tensor& ys, const Tensor& w, const Routing& rt, bool f32_sum, Tensor& y) {
  if (k == KernelChoice::fused && fused::combine_supported(ys.dtype(), rt)) return fused::combine(ys, w, rt, f32_sum, y);
  if (k == KernelChoice::fused && ys.dtype() != DType::f64) log_fallback_once("combine");
  reference::combine(ys, w, rt, f32_sum, y);
}

void combine_backward(KernelChoice k, const Tensor& dy, const Tensor& ys, const Tensor& w, const Routing& rt,
                      Tensor& dys, Tensor& dw) {
  if (k == KernelChoice::fused && fused::combine_supported(ys.dtype(), rt))
    return fused::combine_backward(dy, ys, w, rt, dys, dw);
  if (k == KernelChoice::fused && ys.dtype() != DType::f64) log_fallback_once("combine");
  reference::combine_backward(dy, ys, w, rt, dys, dw);
}

}  // namespace moe
