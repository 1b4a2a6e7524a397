#include "dist/ring.h"

#include <cstring>

#include "kernels/combine.h"
#include "kernels/permute.h"
#include "kernels/row_ops.h"
#include "moe/thread_pool.h"

namespace moe {
namespace {

// Tiled all-gather of rows: [n, ...] per rank -> [EP*n, ...] in rank order (one AG).
Tensor gather_rows_over(Communicator& comm, const Tensor& t) {
  Shape s = t.shape();
  s[0] *= comm.size();
  Tensor out = Tensor::empty(t.dtype(), s);
  comm.all_gather(t.raw(), out.raw(), t.nbytes());
  return out;
}

// Deterministic reduce-scatter of f32 rows [EP*n, C] -> [n, C] (one RS).
Tensor reduce_scatter_rows(Communicator& comm, const Tensor& t) {
  Tensor out = Tensor::empty(DType::f32, {t.dim(0) / comm.size(), t.dim(1)});
  comm.reduce_scatter_sum(t.data<float>(), out.data<float>(), size_t(out.numel()));
  return out;
}

// Per slot: (rolled expert id, weight bits, kept) -> one AG of 3 int32 per slot.
struct GatheredRouting {
  std::vector<int32_t> idx;
  std::vector<uint8_t> keep;
  Tensor w;
};

GatheredRouting gather_routing(Communicator& ep, const int32_t* idx, const Tensor& w, const std::vector<uint8_t>& keep,
                               int64_t E) {
  const int64_t slots = w.numel(), K = w.dim(1), El = E / ep.size();
  std::vector<int32_t> mine(size_t(slots) * 3), all(mine.size() * size_t(ep.size()));
  for (int64_t r = 0; r < slots; ++r) {
    mine[size_t(3 * r)] = idx[r];
    std::memcpy(&mine[size_t(3 * r + 1)], w.data<float>() + r, 4);
    mine[size_t(3 * r + 2)] = keep[size_t(r)];
  }
  ep.all_gather(mine.data(), all.data(), mine.size() * sizeof(int32_t));
  GatheredRouting g;
  const int64_t n = slots * ep.size();
  g.idx.resize(size_t(n));
  g.keep.resize(size_t(n));
  g.w = Tensor::empty(DType::f32, {n / K, K});
  const int64_t shift = int64_t(ep.rank()) * El;
  for (int64_t r = 0; r < n; ++r) {
    g.idx[size_t(r)] = int32_t((all[size_t(3 * r)] - shift + E) % E);  // this rank's experts first
    std::memcpy(g.w.data<float>() + r, &all[size_t(3 * r + 1)], 4);
    g.keep[size_t(r)] = uint8_t(all[size_t(3 * r + 2)]);
  }
  return g;
}

// Rows of sender i for local expert g (kept slots only), like EpExchange::rows_from.
EpExchange local_layout(const Routing& rt, const std::vector<int32_t>& idx, const std::vector<uint8_t>& keep, int ep,
                        int64_t El) {
  EpExchange ex;
  ex.ep = ep;
  ex.experts_per_rank = El;
  ex.local_groups = GroupLayout::from_sizes(std::vector<int64_t>(rt.groups.sizes.begin(), rt.groups.sizes.begin() + El));
  ex.rows_from.assign(size_t(ep * El), 0);
  const int64_t per_sender = int64_t(idx.size()) / ep;
  for (size_t r = 0; r < idx.size(); ++r)
    if (keep[r] && idx[r] < El) ex.rows_from[size_t(int64_t(r) / per_sender * El + idx[r])]++;
  return ex;
}

// partial [T, D] f32 = sum over the kept local slots of w * ys[row], in slot order.
template <class T>
void combine_partial(const Tensor& ys, const Tensor& w, const Routing& rt, int64_t local_rows, Tensor& partial) {
  const int64_t K = rt.top_k, D = ys.dim(1);
  const T* S = ys.data<T>();
  parallel_for(rt.tokens, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* acc = partial.data<float>() + t * D;
      std::fill(acc, acc + D, 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        int64_t row = rt.inv[size_t(t * K + k)];
        if (row < local_rows) rows::axpy_f32(w.data<float>()[t * K + k], S + row * D, acc, D);
      }
    }
  });
}

}  // namespace

RingState ring_forward(const Config& cfg, Communicator& ep, const FfnWeights& w, const Tensor& x_c,
                       const int32_t* idx_c, const Tensor& w_c, const std::vector<uint8_t>& keep, Tensor& y_c) {
  const int64_t K = cfg.num_experts_per_tok, E = cfg.num_experts, D = cfg.emb_dim;
  const int64_t El = E / ep.size();
  RingState st;
  Tensor xg = gather_rows_over(ep, x_c);
  GatheredRouting g = gather_routing(ep, idx_c, w_c, keep, E);
  const int64_t Tg = xg.dim(0);
  st.routing = compute_routing_masked(g.idx.data(), Tg, K, E, g.keep.data());
  st.wg = g.w;
  st.ex = local_layout(st.routing, g.idx, g.keep, ep.size(), El);
  st.xs = Tensor::empty(cfg.dtype, {Tg * K, D});
  permute(cfg.moe_permute_kernel, xg, st.routing, st.xs);
  st.act = ffn_forward(cfg, w, st.xs, st.ex.local_groups);
  Tensor partial = Tensor::empty(DType::f32, {Tg, D});
  if (cfg.dtype == DType::bf16)
    combine_partial<bf16>(st.act.ys, st.wg, st.routing, st.ex.local_groups.total(), partial);
  else
    combine_partial<float>(st.act.ys, st.wg, st.routing, st.ex.local_groups.total(), partial);
  Tensor sum = reduce_scatter_rows(ep, partial);
  Tensor rounded = sum.to(cfg.dtype);
  std::memcpy(y_c.raw(), rounded.raw(), y_c.nbytes());
  return st;
}

void ring_backward(const Config& cfg, Communicator& ep, const FfnWeights& w, const RingState& st, const Tensor& dy_c,
                   Tensor& dx_c, Tensor& dW_c, FfnGradInputs& keep) {
  const int64_t K = cfg.num_experts_per_tok, D = cfg.emb_dim;
  Tensor dyg = gather_rows_over(ep, dy_c);
  const int64_t Tg = dyg.dim(0);
  Tensor dys = Tensor::empty(cfg.dtype, {Tg * K, D}), dWg = Tensor::empty(DType::f32, {Tg, K});
  combine_backward(cfg.moe_combine_kernel, dyg, st.act.ys, st.wg, st.routing, dys, dWg);
  Tensor dxs = ffn_backward_data(cfg, w, st.xs, st.act, dys, st.ex.local_groups, keep);
  Tensor dxp = Tensor::empty(DType::f32, {Tg, D});
  permute_backward(cfg.moe_permute_kernel, dxs, st.routing, dxp);
  Tensor dx = reduce_scatter_rows(ep, dxp), dW = reduce_scatter_rows(ep, dWg);
  std::memcpy(dx_c.raw(), dx.raw(), dx_c.nbytes());
  std::memcpy(dW_c.raw(), dW.raw(), dW_c.nbytes());
}

}  // namespace moe
