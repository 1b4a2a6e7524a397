// The gated activation's row entries over the vector traits V (the x86 levels): the scalar
// functions of kernels/activation.h lane by lane, the same float operations in the same order (an
// fma where the scalar function calls std::fma, and nowhere else), so every lane holds the scalar
// function's bits, and one pass over each row: the bf16 inputs are widened in registers and the
// outputs rounded there, with no f32 copies of the rows. The portable loops (kernels/row_loops.h)
// stay where a level has no such traits (the Arm levels). Included inside a level's target region
// after rows_impl.h; internal linkage.
#pragma once

#include <cstdint>

#include "kernels/activation.h"
#include "moe/config.h"

namespace moe::simd {
namespace {

template <class V>
struct ActMath {
  using F = typename V::F;
  static F c(float f) { return V::set1(f); }

  // exp_approx: the clamp (NaN passes: max_else / min_else return their second operand then), the
  // nearest integer n, r = x - n ln2 (two fused parts), the polynomial and the scale 2^n. The
  // rounding adds 0.5 with t's sign (half_with_sign): for t = -0 that is -0.5 where the scalar
  // function adds +0.5, and n = 0 either way. A NaN x gives n = INT32_MIN here (0 in the scalar
  // function, where converting NaN is undefined): r, p and the result are x's NaN all the same.
  static F exp(F x) {
    x = V::min_else(c(kExpHi), V::max_else(c(kExpLo), x));
    const F t = V::mul(x, c(kLog2e));
    const typename V::I ni = V::trunc_i32(V::add(t, V::half_with_sign(t)));
    const F n = V::to_f(ni);
    const F r = V::fma(n, c(2.12194440e-4f), V::fma(n, c(-0.693359375f), x));
    F p = c(1.9875691500e-4f);
    p = V::fma(p, r, c(1.3981999507e-3f));
    p = V::fma(p, r, c(8.3334519073e-3f));
    p = V::fma(p, r, c(4.1665795894e-2f));
    p = V::fma(p, r, c(1.6666665459e-1f));
    p = V::fma(p, r, c(5.0000001201e-1f));
    p = V::add(V::fma(V::mul(p, r), r, r), c(1.0f));
    return V::mul(p, V::pow2(ni));
  }
  static F sigmoid(F x) { return V::div(c(1.0f), V::add(c(1.0f), exp(V::neg(x)))); }
  static F tanh(F z) { return V::sub(c(1.0f), V::div(c(2.0f), V::add(exp(V::mul(c(2.0f), z)), c(1.0f)))); }
  // tanh_approx(kGeluC * (x + 0.044715 x^3)), the product left to right as in gelu().
  static F gelu_tanh(F x) {
    const F cube = V::mul(V::mul(V::mul(c(0.044715f), x), x), x);
    return tanh(V::mul(c(kGeluC), V::add(x, cube)));
  }
  static F gelu_value(F x, F th) { return V::mul(V::mul(c(0.5f), x), V::add(c(1.0f), th)); }

  struct Silu {
    static F value(F x) { return V::mul(x, sigmoid(x)); }
    static void value_grad(F x, F& value, F& grad) {
      const F s = sigmoid(x);
      value = V::mul(x, s);
      grad = V::mul(s, V::fma(x, V::sub(c(1.0f), s), c(1.0f)));
    }
  };
  struct Gelu {
    static F value(F x) { return gelu_value(x, gelu_tanh(x)); }
    static void value_grad(F x, F& value, F& grad) {
      static constexpr float kC3 = 3.0f * 0.044715f;  // the scalar function's constant product
      const F th = gelu_tanh(x);
      value = gelu_value(x, th);
      const F slope = V::add(c(1.0f), V::mul(V::mul(c(kC3), x), x));
      const F rest =
          V::mul(V::mul(V::mul(V::mul(c(0.5f), x), V::sub(c(1.0f), V::mul(th, th))), c(kGeluC)), slope);
      grad = V::add(V::mul(c(0.5f), V::add(c(1.0f), th)), rest);
    }
  };
};

// a = act(g) * u; n - i < L on the last step (masked loads and stores).
template <class V, class Fn, class T>
void act_forward_row(const T* g, const T* u, T* a, int64_t n) {
  for (int64_t i = 0; i < n; i += V::L) {
    const int64_t m = n - i;
    store_row<V>(a + i, V::mul(Fn::value(load_row<V>(g + i, m)), load_row<V>(u + i, m)), m);
  }
}
// dg = d * u * act'(g), du = d * act(g).
template <class V, class Fn, class T>
void act_backward_row(const T* g, const T* u, const T* d, T* dg, T* du, int64_t n) {
  for (int64_t i = 0; i < n; i += V::L) {
    const int64_t m = n - i;
    typename V::F value, grad;
    Fn::value_grad(load_row<V>(g + i, m), value, grad);
    const typename V::F dv = load_row<V>(d + i, m);
    store_row<V>(dg + i, V::mul(V::mul(dv, load_row<V>(u + i, m)), grad), m);
    store_row<V>(du + i, V::mul(dv, value), m);
  }
}

template <class V, class T>
void act_forward_rows(Activation act, const T* g, const T* u, T* a, int64_t n) {
  act == Activation::silu ? act_forward_row<V, typename ActMath<V>::Silu>(g, u, a, n)
                          : act_forward_row<V, typename ActMath<V>::Gelu>(g, u, a, n);
}
template <class V, class T>
void act_backward_rows(Activation act, const T* g, const T* u, const T* d, T* dg, T* du, int64_t n) {
  act == Activation::silu ? act_backward_row<V, typename ActMath<V>::Silu>(g, u, d, dg, du, n)
                          : act_backward_row<V, typename ActMath<V>::Gelu>(g, u, d, dg, du, n);
}

// `t` with the activation's row entries of traits V.
template <class V>
kernels::Table with_act_rows(kernels::Table t) {
  t.act_forward_f = act_forward_rows<V, float>;
  t.act_forward_b = act_forward_rows<V, bf16>;
  t.act_backward_f = act_backward_rows<V, float>;
  t.act_backward_b = act_backward_rows<V, bf16>;
  return t;
}

}  // namespace
}  // namespace moe::simd
