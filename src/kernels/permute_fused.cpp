#include <algorithm>
#include <cstdio>
#include <mutex>
#include <vector>

#include "kernels/permute.h"
#include "kernels/row_ops.h"
#include "moe/thread_pool.h"

namespace moe {
namespace fused {
namespace {

template <class T>
void gather_rows(const Tensor& x, const Routing& rt, Tensor& xs) {
  const int64_t K = rt.top_k, D = x.dim(1);
  const T* X = x.data<T>();
  T* S = xs.data<T>();
  parallel_for(rt.rows(), rows::row_grain(2 * D * int64_t(sizeof(T)), 64), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) rows::copy(X + (rt.order[size_t(r)] / K) * D, S + r * D, D);
  });
}

template <class T>
void sum_token_rows(const Tensor& dxs, const Routing& rt, Tensor& dx) {
  const int64_t K = rt.top_k, D = dxs.dim(1);
  const T* G = dxs.data<T>();
  float* DX = dx.data<float>();
  parallel_for(rt.tokens, rows::row_grain((K * int64_t(sizeof(T)) + 4) * D, 16), [&](int64_t b, int64_t e) {
    std::vector<const T*> src(static_cast<size_t>(K)), next(static_cast<size_t>(K));
    const std::vector<float> ones(static_cast<size_t>(K), 1.0f);
    for (int64_t t = b; t < e; ++t) {
      const int64_t tn = std::min(t + 1, e - 1);
      for (int64_t k = 0; k < K; ++k) {
        src[size_t(k)] = G + int64_t(rt.inv[size_t(t * K + k)]) * D;
        next[size_t(k)] = G + int64_t(rt.inv[size_t(tn * K + k)]) * D;
      }
      rows::weighted_sum(ones.data(), src.data(), K, DX + t * D, D, next.data());
    }
  });
}

}  // namespace

bool permute_supported(DType dtype, const Routing& rt) {
  return (dtype == DType::f32 || dtype == DType::bf16) && rt.rows() == rt.tokens * rt.top_k &&
         rt.rows() < (int64_t(1) << 31);
}

// xs [R, D] = x[order[r] / K]
void permute(const Tensor& x, const Routing& rt, Tensor& xs) {
  expect_shape(xs, {rt.rows(), x.dim(1)}, "[fused permute] xs");
  x.dtype() == DType::bf16 ? gather_rows<bf16>(x, rt, xs) : gather_rows<float>(x, rt, xs);
}

Tensor permute_index(const Routing& rt) {
  Tensor ix = Tensor::empty(DType::i32, {rt.rows()});
  int32_t* p = ix.data<int32_t>();
  const int32_t K = int32_t(rt.top_k);
  for (int64_t r = 0; r < rt.rows(); ++r) p[r] = rt.order[size_t(r)] / K;
  return ix;
}

// dx [T, D] f32 = sum_k dxs[inv[t*K+k]]
void permute_backward(const Tensor& dxs, const Routing& rt, Tensor& dx) {
  expect_shape(dx, {rt.tokens, dxs.dim(1)}, "[fused permute_backward] dx");
  dxs.dtype() == DType::bf16 ? sum_token_rows<bf16>(dxs, rt, dx) : sum_token_rows<float>(dxs, rt, dx);
}

}  // namespace fused

// One log line per kernel and process when a fused kernel falls back.
void log_fallback_once(const char* kernel) {
  static std::mutex mu;
  static bool logged_permute = false, logged_combine = false;
  std::lock_guard<std::mutex> lk(mu);
  bool& logged = kernel[0] == 'p' ? logged_permute : logged_combine;
  if (logged) return;
  logged = true;
  std::fprintf(stderr, "moe: fused %s kernel does not support this shape; using the reference kernel\n", kernel);
}

void permute(KernelChoice k, const Tensor& x, const Routing& rt, Tensor& xs) {
  if (k == KernelChoice::fused && fused::permute_supported(x.dtype(), rt)) return fused::permute(x, rt, xs);
  if (k == KernelChoice::fused && x.dtype() != DType::f64) log_fallback_once("permute");
  reference::permute(x, rt, xs);
}

void permute_backward(KernelChoice k, const Tensor& dxs, const Routing& rt, Tensor& dx) {
  if (k == KernelChoice::fused && fused::permute_supported(dxs.dtype(), rt))
    return fused::permute_backward(dxs, rt, dx);
  if (k == KernelChoice::fused && dxs.dtype() != DType::f64) log_fallback_once("permute");
  reference::permute_backward(dxs, rt, dx);
}

}  // namespace moe
