// The forward schedule of a distributed step (include/moe/dist_layer.h).
// Without offload every op runs in order on the compute thread; with live
// targets the same ops, in the same per-communicator order, run their
// collectives on the side engine and the chunk loop prepares one chunk ahead.
#include <cstring>
#include <string>

#include "distributed/dist_step.h"
#include "distributed/dist_weights.h"
#include "kernels/combine.h"
#include "kernels/permute.h"

namespace moe {
namespace {

std::string at(const char* name, int64_t c) { return std::string(name) + "[" + std::to_string(c) + "]"; }

std::vector<int64_t> routed_counts(const int32_t* idx, int64_t n, int64_t E) {
  std::vector<int64_t> c(size_t(E), 0);
  for (int64_t i = 0; i < n; ++i) c[size_t(idx[i])]++;
  return c;
}

// Issues the expert weights' FSDP gathers (target fsdp_all_gather); the FFN
// waits for each part right before its first GEMM.
void issue_weight_gathers(const Config& cfg, const StepExec& ex, const LayerWeights& shards, FfnWeights& w,
                          WeightEvents& ev) {
  const Mesh& mesh = ex.mesh();
  w.prefused = cfg.prefuse_moe_weights;
  w.split = cfg.moe_split_expert_weight_layout;
  w.experts = cfg.num_experts / mesh.shape().expert;
  auto gather = [&](const char* name, const Tensor& shard, std::function<void(const Mesh&, const Tensor&)> store) {
    Tensor local = shard.to(cfg.dtype);  // cast before the gather: bf16 moves half the bytes
    if (!needs_gather(cfg, mesh, name, local.ndim())) return store(mesh, local), Event();
    return ex.collective(OffloadTarget::fsdp_all_gather, Collective::all_gather, std::string("AG:") + name,
                         [store, local](const Mesh& m) { store(m, local); });
  };
  if (w.split) {
    ev.up_lo = gather("experts.wi", shards.wi, [&](const Mesh& m, const Tensor& t) { w.wi_lo = gather_wi_half(cfg, m, t, 0); });
    ev.up_hi = gather("experts.wi", shards.wi, [&](const Mesh& m, const Tensor& t) { w.wi_hi = gather_wi_half(cfg, m, t, 1); });
  } else if (w.prefused) {
    ev.up = gather("experts.wi", shards.wi, [&](const Mesh& m, const Tensor& t) { w.wi = gather_weight(cfg, m, "experts.wi", t); });
  } else {
    ev.up = gather("experts.wi_0", shards.wi_0, [&](const Mesh& m, const Tensor& t) { w.wi_0 = gather_weight(cfg, m, "experts.wi_0", t); });
    Event e1 = gather("experts.wi_1", shards.wi_1, [&](const Mesh& m, const Tensor& t) { w.wi_1 = gather_weight(cfg, m, "experts.wi_1", t); });
    if (!e1.ready()) ev.up = e1;  // FIFO side engine: wi_1 done implies wi_0 done
  }
  ev.down = gather("experts.wo", shards.wo, [&](const Mesh& m, const Tensor& t) { w.wo = gather_weight(cfg, m, "experts.wo", t); });
  w.await = [&ex, &ev](FfnPart p) {
    ex.wait(p == FfnPart::up ? ev.up : p == FfnPart::up_lo ? ev.up_lo : p == FfnPart::up_hi ? ev.up_hi : ev.down);
  };
}

// Routing of every chunk (index math: the side engine under ragged_sort).
void issue_routing(const Config& cfg, const StepExec& ex, DistForward& f, int64_t cap) {
  const int64_t K = cfg.num_experts_per_tok, E = cfg.num_experts;
  for (size_t c = 0; c < f.chunks.size(); ++c) {
    Chunk& ch = f.chunks[c];
    const int32_t* idx = f.router.topk_idx.data<int32_t>() + ch.t0 * K;
    ch.routed = ex.index_math(at("sort", int64_t(c)), [&ch, idx, K, E, cap] {
      ch.routing = compute_routing(idx, ch.t1 - ch.t0, K, E, cap, &ch.prior);
    });
  }
}

}  // namespace

DistForwardPtr DistLayer::forward(const LayerWeights& shards, const Tensor& x_in, const Tensor* forced,
                                  LayerOutputs& out) const {
  if (x_in.ndim() != 2 || x_in.dim(1) != cfg_.emb_dim)
    fail("x: expected shape [T, ", cfg_.emb_dim, "], got ", shape_str(x_in.shape()));
  const int64_t T = x_in.dim(0), K = cfg_.num_experts_per_tok, E = cfg_.num_experts, D = cfg_.emb_dim;
  const StepExec ex(mesh_, rt_, rt_ ? rt_->trace() : trace_);
  DistForwardPtr f(new DistForward);
  issue_weight_gathers(cfg_, ex, shards, f->ffn, f->weights);
  ex.compute("router", [&] {
    f->x = x_in.to(cfg_.dtype);
    f->router_kernel = shards.router.to(DType::f32);
    f->router = router_forward(cfg_, f->x, f->router_kernel, forced);
  });
  std::vector<int64_t> prior;
  ex.compute("AG:aux_stats", [&] {
    AuxStats local = aux_stats(f->router.logits, routed_counts(f->router.topk_idx.data<int32_t>(), T * K, E));
    f->global = gather_stats(mesh_.world(), local, prior);
  });
  const int64_t n = std::min<int64_t>(std::max<int64_t>(cfg_.num_moe_token_chunks, 1), std::max<int64_t>(T, 1));
  f->chunks.resize(size_t(n));
  for (int64_t c = 0; c < n; ++c) {
    Chunk& ch = f->chunks[size_t(c)];
    ch.t0 = T * c / n;
    ch.t1 = T * (c + 1) / n;
    ch.prior = prior;
    auto counts = routed_counts(f->router.topk_idx.data<int32_t>() + ch.t0 * K, (ch.t1 - ch.t0) * K, E);
    for (int64_t e = 0; e < E; ++e) prior[size_t(e)] += counts[size_t(e)];
  }
  issue_routing(cfg_, ex, *f, expert_capacity(f->global.tokens, K, E, cfg_.capacity_factor));
  out.y = Tensor::empty(cfg_.dtype, {T, D});
  if (cfg_.use_ring_of_experts)
    forward_ring(ex, *f, out.y);
  else
    forward_a2a(ex, *f, out.y);
  f->ffn.await = nullptr;  // every weight arrived (the FFN waited for it)
  out.topk_idx = f->router.topk_idx;
  out.topk_weights = f->router.topk_weights;
  out.group_sizes = Tensor(DType::i32, {E});  // this rank's kept rows per expert
  out.dropped = 0;
  for (const Chunk& ch : f->chunks) {
    for (int64_t e = 0; e < E; ++e) out.group_sizes.data<int32_t>()[e] += int32_t(ch.routing.groups.sizes[size_t(e)]);
    out.dropped += ch.routing.dropped + ch.ex.dropped;
  }
  AuxLosses aux = aux_losses(cfg_, f->global);
  out.load_balance_loss = aux.load_balance;
  out.z_loss = aux.z_loss;
  out.nonfinite_tokens = f->global.nonfinite;
  return f;
}

// Expert parallelism by ragged all-to-all: sort, dispatch, local FFN, return, combine.
void DistLayer::forward_a2a(const StepExec& ex, DistForward& f, Tensor& y) const {
  const int64_t K = cfg_.num_experts_per_tok, E = cfg_.num_experts, D = cfg_.emb_dim;
  auto prepare = [&](int64_t c) {
    Chunk& ch = f.chunks[size_t(c)];
    const int64_t Rc = (ch.t1 - ch.t0) * K;
    ex.wait(ch.routed);
    ex.compute(at("permute", c), [&] {
      const Tensor xc = f.x.slice_rows(ch.t0, ch.t1);
      // No rows to move (expert parallelism 1, one chunk): the permute inside the GEMMs, as in
      // layer_forward (the weight gradients then read the one chunk's rows as they are).
      if (dist_permutes_in_gemm(cfg_, mesh_.comm({"expert"}).size()) &&
          fused::permute_supported(cfg_.dtype, ch.routing)) {
        ch.xs = Lhs(xc, fused::permute_index(ch.routing));
      } else {
        Tensor xs = Tensor::empty(cfg_.dtype, {Rc, D});
        permute(cfg_.moe_permute_kernel, xc, ch.routing, xs);
        ch.xs = xs;
      }
    });
    if (mesh_.comm({"expert"}).size() == 1) return void(ch.ex = plan_exchange(mesh_.comm({"expert"}), ch.routing.groups, E, Rc, -1));
    const double factor = cfg_.ragged_buffer_factor;
    Event planned = ex.collective(OffloadTarget::ep_collectives, Collective::all_gather, at("AG:counts", c),
                                  [&ch, E, Rc, factor](const Mesh& m) {
                                    ch.ex = plan_exchange(m.comm({"expert"}), ch.routing.groups, E, Rc, factor);
                                  });
    if (!ex.offloaded(OffloadTarget::ep_collectives, Collective::all_to_all)) ex.wait(planned);
    ch.sent = ex.collective(
        OffloadTarget::ep_collectives, Collective::all_to_all, at("A2A:dispatch", c),
        [&ch, h = hier_a2a_](const Mesh& m) { ch.buf = ep_send(ep_comm(m, h), ch.ex, ch.xs.src); });
  };
  auto compute = [&](int64_t c) {
    Chunk& ch = f.chunks[size_t(c)];
    ex.wait(ch.sent);
    Tensor back;  // the expert outputs back in sender order (dense row movement: part of the traced op)
    ex.compute(at("ffn", c), [&] {
      ch.xl = ch.ex.identity() ? ch.xs : Lhs(ep_sort_local(ch.ex, ch.buf));
      ch.buf = Tensor();
      ch.act = ffn_forward(cfg_, f.ffn, ch.xl, ch.ex.local_groups);
      if (!ch.ex.identity()) back = ep_unsort_local(ch.ex, ch.act.ys);
    });
    if (ch.ex.identity()) return void(ch.ys = ch.act.ys);
    const int64_t Rc = (ch.t1 - ch.t0) * K;
    ch.returned = ex.collective(OffloadTarget::ep_collectives, Collective::all_to_all, at("A2A:return", c),
                                [&ch, back, Rc, h = hier_a2a_](const Mesh& m) { ch.ys = ep_send_back(ep_comm(m, h), ch.ex, back, Rc); });
  };
  auto finish = [&](int64_t c) {
    Chunk& ch = f.chunks[size_t(c)];
    ex.wait(ch.returned);
    ex.compute(at("combine", c), [&] {
      Tensor yc = y.slice_rows(ch.t0, ch.t1);
      combine(cfg_.moe_combine_kernel, ch.ys, f.router.topk_weights.slice_rows(ch.t0, ch.t1), ch.routing,
              cfg_.float32_weight_sum, yc);
    });
  };
  run_pipeline(int64_t(f.chunks.size()), ex.pipelined() ? 1 : 0, prepare, compute, finish);
}

// Ring of experts: gather the chunk's tokens, local experts only, reduce-scatter.
void DistLayer::forward_ring(const StepExec& ex, DistForward& f, Tensor& y) const {
  const int64_t K = cfg_.num_experts_per_tok, E = cfg_.num_experts;
  const int ep_size = mesh_.comm({"expert"}).size();
  auto prepare = [&](int64_t c) {
    Chunk& ch = f.chunks[size_t(c)];
    ex.wait(ch.routed);
    Tensor xc = f.x.slice_rows(ch.t0, ch.t1), wc = f.router.topk_weights.slice_rows(ch.t0, ch.t1);
    const int32_t* idx = f.router.topk_idx.data<int32_t>() + ch.t0 * K;
    ch.gathered = ex.collective(OffloadTarget::ep_collectives, Collective::all_gather, at("AG:tokens", c),
                                [&ch, xc, wc, idx, E](const Mesh& m) {
                                  ring_gather(m.comm({"expert"}), E, xc, idx, wc, keep_mask(ch.routing), ch.ring);
                                });
  };
  auto compute = [&](int64_t c) {
    Chunk& ch = f.chunks[size_t(c)];
    ex.wait(ch.gathered);
    Tensor partial;
    ex.compute(at("ffn", c), [&] {
      partial = ring_compute(cfg_, ep_size, f.ffn, ch.ring);
      ch.ex = ch.ring.ex;
    });
    ch.reduced = ex.collective(OffloadTarget::ep_collectives, Collective::reduce_scatter, at("RS:y", c),
                               [&ch, partial](const Mesh& m) { ch.ring.ysum = reduce_scatter_rows(m.comm({"expert"}), partial); });
  };
  auto finish = [&](int64_t c) {
    Chunk& ch = f.chunks[size_t(c)];
    ex.wait(ch.reduced);
    ex.compute(at("combine", c), [&] {
      Tensor rounded = ch.ring.ysum.to(cfg_.dtype);
      std::memcpy(y.slice_rows(ch.t0, ch.t1).raw(), rounded.raw(), rounded.nbytes());
    });
  };
  run_pipeline(int64_t(f.chunks.size()), ex.pipelined() ? 1 : 0, prepare, compute, finish);
}

}  // namespace moe
