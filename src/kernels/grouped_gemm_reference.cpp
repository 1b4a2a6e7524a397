// Reference twin of the grouped GEMM kernels: plain loops, f32 accumulation in
// index order (f64 inputs: f64 accumulation, the only level that takes them). Multi-threaded over rows
// (forward, dlhs) or over (group, Kc) rows of the weight gradient; each output element is one sequential sum,
// so the result does not depend on the thread count. Also the portable fallback of the public entry points
// (grouped_gemm.cpp).
#include "kernels/grouped_gemm.h"
#include "kernels/grouped_gemm_internal.h"

#include <cstring>

#include "moe/thread_pool.h"

namespace moe {

namespace {

// Acc: the accumulator, acc_t<In> (f32 for f32 and bf16 inputs, f64 for f64).
// out rows [row_begin, row_end), row stride ldo (N for gmm; N0 + N1 for gmm_pair's column windows).
// W: the weights' type (In, or f32 with a bf16 lhs: the router's logits on the layer's bf16 x).
template <class In, class Out, class Acc = acc_t<In>, class W = In>
void gmm_rows(const In* lhs, const W* rhs, Out* out, int64_t ldo, int64_t Kc, int64_t N, int64_t row_begin,
              int64_t row_end) {
  std::vector<Acc> acc(static_cast<size_t>(N));
  for (int64_t r = row_begin; r < row_end; ++r) {
    std::fill(acc.begin(), acc.end(), Acc(0));
    for (int64_t k = 0; k < Kc; ++k) {
      Acc a = load_as<Acc>(lhs[r * Kc + k]);
      const W* w = rhs + k * N;
      for (int64_t n = 0; n < N; ++n) acc[size_t(n)] += a * load_as<Acc>(w[n]);
    }
    for (int64_t n = 0; n < N; ++n) out[r * ldo + n] = store_acc<Out>(acc[size_t(n)]);
  }
}

// add (optional, [M, Kc] in the accumulator type): dlhs = round(add + the sum) (gmm_dlhs_add).
template <class In, class Out, class Acc = acc_t<In>>
void dlhs_rows(const In* dout, const In* rhs, Out* dlhs, int64_t Kc, int64_t N, int64_t row_begin,
               int64_t row_end, const Acc* add = nullptr) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t k = 0; k < Kc; ++k) {
      Acc acc = Acc(0);
      const In* w = rhs + k * N;
      for (int64_t n = 0; n < N; ++n) acc += load_as<Acc>(dout[r * N + n]) * load_as<Acc>(w[n]);
      dlhs[r * Kc + k] = store_acc<Out>(add ? add[r * Kc + k] + acc : acc);
    }
  }
}

// Runs body(g, local_g, row_begin, row_end) over every row of every local group, in parallel.
template <class Body>
void for_local_rows(const GroupLayout& groups, int64_t group_offset, int64_t n_local, const Body& body) {
  int64_t begin = groups.offsets[size_t(group_offset)], end = groups.offsets[size_t(group_offset + n_local)];
  parallel_for(end - begin, 16, [&](int64_t b, int64_t e) {
    int64_t r = begin + b, stop = begin + e;
    int64_t g = group_offset;
    while (r < stop) {
      while (groups.offsets[size_t(g + 1)] <= r) ++g;
      int64_t seg_end = std::min(stop, groups.offsets[size_t(g + 1)]);
      body(g, g - group_offset, r, seg_end);
      r = seg_end;
    }
  });
}

template <class In, class Out, class Wt = In>
void gmm_typed(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  int64_t Kc = lhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  const In* L = lhs.data<In>();
  const Wt* W = rhs.data<Wt>();
  Out* O = out.data<Out>();
  for_local_rows(groups, goff, n_local, [&](int64_t, int64_t lg, int64_t b, int64_t e) {
    gmm_rows<In, Out, acc_t<In>, Wt>(L, W + lg * Kc * N, O, N, Kc, N, b, e);
  });
}

// The two products of gmm_pair, each row's columns [0, N0) then [N0, N0 + N1): gmm's loops.
template <class In, class Out>
void gmm_pair_typed(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
                    int64_t goff, Tensor& out) {
  const int64_t Kc = lhs.dim(1), N0 = rhs0.dim(2), N1 = rhs1.dim(2), n_local = rhs0.dim(0);
  const In* L = lhs.data<In>();
  const In* W0 = rhs0.data<In>();
  const In* W1 = rhs1.data<In>();
  Out* O = out.data<Out>();
  for_local_rows(groups, goff, n_local, [&](int64_t, int64_t lg, int64_t b, int64_t e) {
    gmm_rows<In, Out>(L, W0 + lg * Kc * N0, O, N0 + N1, Kc, N0, b, e);
    gmm_rows<In, Out>(L, W1 + lg * Kc * N1, O + N0, N0 + N1, Kc, N1, b, e);
  });
}

template <class In, class Out>
void dlhs_typed(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& dlhs,
                const Tensor* addend = nullptr) {
  int64_t Kc = rhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  const In* D = dout.data<In>();
  const In* W = rhs.data<In>();
  Out* O = dlhs.data<Out>();
  const acc_t<In>* add = addend ? addend->data<acc_t<In>>() : nullptr;
  for_local_rows(groups, goff, n_local, [&](int64_t, int64_t lg, int64_t b, int64_t e) {
    dlhs_rows<In, Out>(D, W + lg * Kc * N, O, Kc, N, b, e, add);
  });
}

// drhs in the accumulator type (f32; f64 for f64 inputs). Dt: dout's type (In, or f32 with a bf16
// lhs: the router's kernel gradient on the layer's bf16 x).
template <class In, class Dt = In, class Acc = acc_t<In>>
void drhs_typed(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff,
                Tensor& drhs) {
  int64_t Kc = lhs.dim(1), N = dout.dim(1), n_local = drhs.dim(0);
  const In* L = lhs.data<In>();
  const Dt* D = dout.data<Dt>();
  Acc* G = drhs.data<Acc>();
  // One task per (local group, k): a row of the weight gradient.
  parallel_for(n_local * Kc, 4, [&](int64_t b, int64_t e) {
    std::vector<Acc> acc(static_cast<size_t>(N));
    for (int64_t i = b; i < e; ++i) {
      int64_t lg = i / Kc, k = i % Kc;
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t r = groups.offsets[size_t(goff + lg)]; r < groups.offsets[size_t(goff + lg + 1)]; ++r) {
        Acc a = load_as<Acc>(L[r * Kc + k]);
        for (int64_t n = 0; n < N; ++n) acc[size_t(n)] += a * load_as<Acc>(D[r * N + n]);
      }
      std::memcpy(G + (lg * Kc + k) * N, acc.data(), size_t(N) * sizeof(Acc));
    }
  });
}

}  // namespace

namespace reference {

void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  detail::check_gmm(lhs, rhs, groups, goff, out);
  bool bf = lhs.dtype() == DType::bf16;
  if (lhs.dtype() == DType::f64)
    gmm_typed<double, double>(lhs, rhs, groups, goff, out);
  else if (bf && rhs.dtype() == DType::f32)
    gmm_typed<bf16, float, float>(lhs, rhs, groups, goff, out);
  else if (out.dtype() == DType::f32)
    bf ? gmm_typed<bf16, float>(lhs, rhs, groups, goff, out) : gmm_typed<float, float>(lhs, rhs, groups, goff, out);
  else if (out.dtype() == DType::bf16 && bf)
    gmm_typed<bf16, bf16>(lhs, rhs, groups, goff, out);
  else
    fail("[gmm] output dtype must be f32 or the input dtype");
}

void gmm_pair(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
              int64_t goff, Tensor& out) {
  detail::check_gmm_pair(lhs, rhs0, rhs1, groups, goff, out);
  const bool bf = lhs.dtype() == DType::bf16;
  if (lhs.dtype() == DType::f64)
    gmm_pair_typed<double, double>(lhs, rhs0, rhs1, groups, goff, out);
  else if (out.dtype() == DType::f32)
    bf ? gmm_pair_typed<bf16, float>(lhs, rhs0, rhs1, groups, goff, out)
       : gmm_pair_typed<float, float>(lhs, rhs0, rhs1, groups, goff, out);
  else
    gmm_pair_typed<bf16, bf16>(lhs, rhs0, rhs1, groups, goff, out);
}

void gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& dlhs) {
  detail::check_gmm_dlhs(dout, rhs, groups, goff, dlhs);
  bool bf = dout.dtype() == DType::bf16;
  if (dout.dtype() == DType::f64)
    dlhs_typed<double, double>(dout, rhs, groups, goff, dlhs);
  else if (dlhs.dtype() == DType::f32)
    bf ? dlhs_typed<bf16, float>(dout, rhs, groups, goff, dlhs)
       : dlhs_typed<float, float>(dout, rhs, groups, goff, dlhs);
  else if (dlhs.dtype() == DType::bf16 && bf)
    dlhs_typed<bf16, bf16>(dout, rhs, groups, goff, dlhs);
  else
    fail("[gmm_dlhs] output dtype must be f32 or the input dtype");
}

void gmm_dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff,
                  const Tensor& addend, Tensor& dlhs) {
  detail::check_gmm_dlhs_add(dout, rhs, groups, goff, addend, dlhs);
  const bool bf = dout.dtype() == DType::bf16;
  if (dout.dtype() == DType::f64)
    dlhs_typed<double, double>(dout, rhs, groups, goff, dlhs, &addend);
  else if (dlhs.dtype() == DType::f32)
    bf ? dlhs_typed<bf16, float>(dout, rhs, groups, goff, dlhs, &addend)
       : dlhs_typed<float, float>(dout, rhs, groups, goff, dlhs, &addend);
  else
    dlhs_typed<bf16, bf16>(dout, rhs, groups, goff, dlhs, &addend);
}

void gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs) {
  detail::check_gmm_drhs(lhs, dout, groups, goff, drhs, /*mixed=*/true);
  if (lhs.dtype() == DType::f64) return drhs_typed<double>(lhs, dout, groups, goff, drhs);
  if (lhs.dtype() == DType::bf16 && dout.dtype() == DType::f32)
    return drhs_typed<bf16, float>(lhs, dout, groups, goff, drhs);
  lhs.dtype() == DType::bf16 ? drhs_typed<bf16>(lhs, dout, groups, goff, drhs)
                             : drhs_typed<float>(lhs, dout, groups, goff, drhs);
}

}  // namespace reference

}  // namespace moe
