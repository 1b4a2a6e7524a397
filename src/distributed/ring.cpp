#include "distributed/ring.h"

#include <cstring>

#include "kernels/combine.h"
#include "kernels/permute.h"
#include "kernels/row_ops.h"
#include "moe/thread_pool.h"

namespace moe {
namespace {

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

Tensor gather_rows_over(Communicator& comm, const Tensor& t) {
  Shape s = t.shape();
  s[0] *= comm.size();
  Tensor out = Tensor::empty(t.dtype(), s);
  comm.all_gather(t.raw(), out.raw(), t.nbytes());
  return out;
}

Tensor reduce_scatter_rows(Communicator& comm, const Tensor& t) {
  Tensor out = Tensor::empty(DType::f32, {t.dim(0) / comm.size(), t.dim(1)});
  comm.reduce_scatter_sum(t.data<float>(), out.data<float>(), size_t(out.numel()));
  return out;
}

void ring_gather(Communicator& ep, int64_t E, const Tensor& x_c, const int32_t* idx_c, const Tensor& w_c,
                 const std::vector<uint8_t>& keep, RingState& st) {
  st.xg = gather_rows_over(ep, x_c);
  GatheredRouting g = gather_routing(ep, idx_c, w_c, keep, E);
  st.idx = std::move(g.idx);
  st.keep = std::move(g.keep);
  st.wg = g.w;
}

Tensor ring_compute(const Config& cfg, int ep_size, const FfnWeights& w, RingState& st) {
  const int64_t K = cfg.num_experts_per_tok, E = cfg.num_experts, D = cfg.emb_dim;
  const int64_t Tg = st.xg.dim(0);
  st.routing = compute_routing_masked(st.idx.data(), Tg, K, E, st.keep.data());
  st.ex = local_layout(st.routing, st.idx, st.keep, ep_size, E / ep_size);
  st.xs = Tensor::empty(cfg.dtype, {Tg * K, D});
  permute(cfg.moe_permute_kernel, st.xg, st.routing, st.xs);
  st.act = ffn_forward(cfg, w, st.xs, st.ex.local_groups);
  Tensor partial = Tensor::empty(DType::f32, {Tg, D});
  if (cfg.dtype == DType::bf16)
    combine_partial<bf16>(st.act.ys, st.wg, st.routing, st.ex.local_groups.total(), partial);
  else
    combine_partial<float>(st.act.ys, st.wg, st.routing, st.ex.local_groups.total(), partial);
  return partial;
}

RingGrads ring_backward_compute(const Config& cfg, const FfnWeights& w, const RingState& st, const Tensor& dyg,
                                FfnGradInputs& keep) {
  const int64_t K = cfg.num_experts_per_tok, D = cfg.emb_dim, Tg = dyg.dim(0);
  Tensor dys = Tensor::empty(cfg.dtype, {Tg * K, D});
  RingGrads g;
  g.dW = Tensor::empty(DType::f32, {Tg, K});
  combine_backward(cfg.moe_combine_kernel, dyg, st.act.ys, st.wg, st.routing, dys, g.dW);
  Tensor dxs = ffn_backward_data(cfg, w, st.xs, st.act, dys, st.ex.local_groups, keep);
  g.dx = Tensor::empty(DType::f32, {Tg, D});
  permute_backward(cfg.moe_permute_kernel, dxs, st.routing, g.dx);
  return g;
}

}  // namespace moe
