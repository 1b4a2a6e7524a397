// The backward schedule of a distributed step: per chunk the adjoints of the
// forward in reverse (combine, return, FFN, dispatch, permute); the weight
// gradients once over every chunk's rows in single-process order (after the
// last chunk's FFN backward, while the last returns are in flight), then
// their reduction to the stored shards.
#include <cstring>
#include <functional>
#include <string>

#include "distributed/dist_step.h"
#include "distributed/dist_weights.h"
#include "kernels/combine.h"
#include "kernels/permute.h"

namespace moe {
namespace {

std::string at(const char* name, int64_t c) { return std::string(name) + "[" + std::to_string(c) + "]"; }

// Row segments (chunk, first row, rows) in single-process order for the weight
// gradients: per local expert g, per sender i, per chunk c.
struct Segment {
  size_t chunk;
  int64_t begin, rows;
};

std::vector<Segment> merge_order(const std::vector<Chunk>& chunks, std::vector<int64_t>& merged_sizes) {
  const int64_t El = chunks[0].ex.local_groups.num_groups();
  const int senders = chunks[0].ex.ep;
  std::vector<Segment> segs;
  merged_sizes.assign(size_t(El), 0);
  for (int64_t g = 0; g < El; ++g)
    for (int i = 0; i < senders; ++i)
      for (size_t c = 0; c < chunks.size(); ++c) {
        const EpExchange& ex = chunks[c].ex;
        int64_t begin = ex.local_groups.offsets[size_t(g)];
        for (int j = 0; j < i; ++j) begin += ex.rows_from[size_t(j * El + g)];
        int64_t n = ex.rows_from[size_t(i * El + g)];
        if (n) segs.push_back({c, begin, n});
        merged_sizes[size_t(g)] += n;
      }
  return segs;
}

// Concatenates the segments' rows of one field (field(keep) is that field's tensor) into one tensor.
template <class Field>
Tensor merge_rows(const std::vector<FfnGradInputs>& keeps, const std::vector<Segment>& segs, int64_t total,
                  Field field) {
  const Tensor& first = field(keeps[0]);
  if (!first.defined() || first.ndim() != 2) return Tensor();
  Tensor out(first.dtype(), {total, first.dim(1)});
  const size_t rb = size_t(first.dim(1)) * dtype_size(first.dtype());
  size_t pos = 0;
  for (const Segment& s : segs) {
    const Tensor& src = field(keeps[s.chunk]);
    std::memcpy(static_cast<std::byte*>(out.raw()) + pos,
                static_cast<const std::byte*>(src.raw()) + size_t(s.begin) * rb, size_t(s.rows) * rb);
    pos += size_t(s.rows) * rb;
  }
  return out;
}

}  // namespace

LayerGrads DistLayer::backward(const DistForward& f, const Tensor& dy_in, const AuxCotangents& aux) const {
  if (dy_in.shape() != f.x.shape()) fail("dy: expected shape ", shape_str(f.x.shape()), ", got ", shape_str(dy_in.shape()));
  const StepExec ex(mesh_, rt_, rt_ ? rt_->trace() : trace_);
  const int64_t T = f.x.dim(0), K = cfg_.num_experts_per_tok, D = cfg_.emb_dim;
  const Tensor dy = dy_in.to(cfg_.dtype);
  LayerGrads g;
  g.dx = Tensor::empty(DType::f32, {T, D});
  Tensor dW = Tensor::empty(DType::f32, {T, K});
  std::vector<ChunkGrad> cg(f.chunks.size());
  // The expert weight gradients need only the FFN's saved rows, not the
  // returned input gradients: they run while the last chunks' returns are in
  // flight, and their reductions are queued right behind those returns.
  const GatherMode mode = explicit_plan_ ? GatherMode::explicit_plan : GatherMode::boundary;
  LayerWeights needed;
  std::vector<Event> reduced;
  // Offloaded, each expert gradient leaves as soon as it is computed: wo's reduction runs on the
  // side engine while wi's gradients are computed (the same ops, so the same bits). Inline, the
  // gradients are computed first, then reduced one after the other.
  const Collective kind = mode == GatherMode::explicit_plan ? Collective::reduce_scatter : Collective::all_reduce;
  const bool early =
      ex.offloaded(OffloadTarget::fsdp_all_gather, kind) && reduce_moves_data(cfg_, mesh_, "experts.wo");
  auto reduce = [&](WeightGradPart part) {
    needed.for_each(cfg_, [&](const std::string& name, Tensor& t) {
      if (name == "router.kernel" || !reduce_moves_data(cfg_, mesh_, name)) return;
      if (part != WeightGradPart::all && (name == "experts.wo") != (part == WeightGradPart::down)) return;
      Tensor* slot = &t;
      const std::string op = std::string(kind == Collective::reduce_scatter ? "RS:grad." : "AR:grad.") + name;
      reduced.push_back(ex.collective(OffloadTarget::fsdp_all_gather, kind, op,
                                      [this, slot, name, mode](const Mesh& m) { *slot = reduce_gradient(cfg_, m, name, *slot, mode); }));
    });
  };
  auto weight_grads = [&] {
    FfnGradInputs rows;  // every chunk's kept rows in single-process order
    GroupLayout groups;
    auto merge = [&] {
      std::vector<FfnGradInputs> keeps;
      for (auto& c : cg) keeps.push_back(std::move(c.keep));
      if (f.chunks.size() == 1) return void((rows = std::move(keeps[0]), groups = f.chunks[0].ex.local_groups));
      std::vector<int64_t> sizes;
      std::vector<Segment> segs = merge_order(f.chunks, sizes);
      groups = GroupLayout::from_sizes(sizes);
      // The chunks' rows came through the all-to-alls: xs is materialized (never a gathered lhs).
      rows.xs = merge_rows(keeps, segs, groups.total(), [](const FfnGradInputs& k) -> const Tensor& {
        MOE_ASSERT(!k.xs.gathered(), "dist backward: a chunk's xs is a gathered lhs");
        return k.xs.src;
      });
      for (auto field : {&FfnGradInputs::a, &FfnGradInputs::dys, &FfnGradInputs::dh, &FfnGradInputs::dh0,
                         &FfnGradInputs::dh1})
        rows.*field = merge_rows(keeps, segs, groups.total(),
                                 [field](const FfnGradInputs& k) -> const Tensor& { return k.*field; });
    };
    if (!early) {
      ex.compute("weight_grads", [&] { merge(), ffn_weight_grads(f.ffn, rows, groups, needed); });
      return reduce(WeightGradPart::all);
    }
    // Expert gradients go home (target fsdp_all_gather: the gathers' reduce-scatters on the side
    // engine) while the rest is computed, the pipeline drains and the router's backward runs.
    ex.compute("weight_grads", [&] { merge(), ffn_weight_grads(f.ffn, rows, groups, needed, WeightGradPart::down); });
    reduce(WeightGradPart::down);
    ex.compute("weight_grads", [&] { ffn_weight_grads(f.ffn, rows, groups, needed, WeightGradPart::up); });
    reduce(WeightGradPart::up);
  };
  if (cfg_.use_ring_of_experts)
    backward_ring(ex, f, dy, g.dx, dW, cg, weight_grads);
  else
    backward_a2a(ex, f, dy, g.dx, dW, cg, weight_grads);
  ex.compute("router_backward", [&] {
    Tensor dz = router_weights_backward(cfg_, f.router, dW);
    aux_backward(cfg_, f.router.logits, f.global, dz, aux);
    needed.router = Tensor(DType::f32, f.router_kernel.shape());
    router_matmul_backward(f.router.x, f.router_kernel, dz, needed.router, g.dx);
  });
  ex.compute("AR:grad.router.kernel", [&] { needed.router = reduce_gradient(cfg_, mesh_, "router.kernel", needed.router, mode); });
  for (const Event& e : reduced) ex.wait(e);
  g.weights = needed;
  return g;
}

void DistLayer::backward_a2a(const StepExec& ex, const DistForward& f, const Tensor& dy, Tensor& dx, Tensor& dW,
                             std::vector<ChunkGrad>& cg, const std::function<void()>& before_drain) const {
  const int64_t K = cfg_.num_experts_per_tok, D = cfg_.emb_dim;
  auto prepare = [&](int64_t c) {
    const Chunk& ch = f.chunks[size_t(c)];
    ChunkGrad& g = cg[size_t(c)];
    ex.compute(at("combine_backward", c), [&] {
      g.buf = Tensor::empty(cfg_.dtype, {(ch.t1 - ch.t0) * K, D});
      Tensor dWc = dW.slice_rows(ch.t0, ch.t1);
      combine_backward(cfg_.moe_combine_kernel, dy.slice_rows(ch.t0, ch.t1), ch.ys,
                       f.router.topk_weights.slice_rows(ch.t0, ch.t1), ch.routing, g.buf, dWc);
    });
    if (ch.ex.identity()) return;
    Tensor dys = g.buf;
    g.sent = ex.collective(OffloadTarget::ep_collectives, Collective::all_to_all, at("A2A:dispatch_grad", c),
                           [&g, &ch, dys, h = hier_a2a_](const Mesh& m) { g.buf = ep_send(ep_comm(m, h), ch.ex, dys); });
  };
  auto compute = [&](int64_t c) {
    const Chunk& ch = f.chunks[size_t(c)];
    ChunkGrad& g = cg[size_t(c)];
    ex.wait(g.sent);
    Tensor dxl, back;  // back: dxl in sender order (dense row movement: part of the traced op)
    ex.compute(at("ffn_backward", c), [&] {
      Tensor dyl = ch.ex.identity() ? g.buf : ep_sort_local(ch.ex, g.buf);
      dxl = ffn_backward_data(cfg_, f.ffn, ch.xl, ch.act, dyl, ch.ex.local_groups, g.keep);
      if (!ch.ex.identity()) back = ep_unsort_local(ch.ex, dxl);
    });
    if (ch.ex.identity()) return void(g.buf = dxl);
    const int64_t Rc = (ch.t1 - ch.t0) * K;
    g.returned = ex.collective(OffloadTarget::ep_collectives, Collective::all_to_all, at("A2A:return_grad", c),
                               [&g, &ch, back, Rc, h = hier_a2a_](const Mesh& m) { g.buf = ep_send_back(ep_comm(m, h), ch.ex, back, Rc); });
  };
  auto finish = [&](int64_t c) {
    const Chunk& ch = f.chunks[size_t(c)];
    ChunkGrad& g = cg[size_t(c)];
    ex.wait(g.returned);
    ex.compute(at("permute_backward", c), [&] {
      Tensor dxc = dx.slice_rows(ch.t0, ch.t1);
      permute_backward(cfg_.moe_permute_kernel, g.buf, ch.routing, dxc);
      g.buf = Tensor();
    });
  };
  run_pipeline(int64_t(f.chunks.size()), ex.pipelined() ? 1 : 0, prepare, compute, finish, before_drain);
}

void DistLayer::backward_ring(const StepExec& ex, const DistForward& f, const Tensor& dy, Tensor& dx, Tensor& dW,
                              std::vector<ChunkGrad>& cg, const std::function<void()>& before_drain) const {
  auto prepare = [&](int64_t c) {
    const Chunk& ch = f.chunks[size_t(c)];
    ChunkGrad& g = cg[size_t(c)];
    Tensor dyc = dy.slice_rows(ch.t0, ch.t1);
    g.sent = ex.collective(OffloadTarget::ep_collectives, Collective::all_gather, at("AG:dy", c),
                           [&g, dyc](const Mesh& m) { g.buf = gather_rows_over(m.comm({"expert"}), dyc); });
  };
  auto compute = [&](int64_t c) {
    const Chunk& ch = f.chunks[size_t(c)];
    ChunkGrad& g = cg[size_t(c)];
    ex.wait(g.sent);
    RingGrads parts;
    ex.compute(at("ffn_backward", c), [&] { parts = ring_backward_compute(cfg_, f.ffn, ch.ring, g.buf, g.keep); });
    g.returned = ex.collective(OffloadTarget::ep_collectives, Collective::reduce_scatter, at("RS:dx", c),
                               [&g, parts](const Mesh& m) {
                                 g.dx_rows = reduce_scatter_rows(m.comm({"expert"}), parts.dx);
                                 g.dW_rows = reduce_scatter_rows(m.comm({"expert"}), parts.dW);
                               });
  };
  auto finish = [&](int64_t c) {
    const Chunk& ch = f.chunks[size_t(c)];
    ChunkGrad& g = cg[size_t(c)];
    ex.wait(g.returned);
    std::memcpy(dx.slice_rows(ch.t0, ch.t1).raw(), g.dx_rows.raw(), g.dx_rows.nbytes());
    std::memcpy(dW.slice_rows(ch.t0, ch.t1).raw(), g.dW_rows.raw(), g.dW_rows.nbytes());
  };
  run_pipeline(int64_t(f.chunks.size()), ex.pipelined() ? 1 : 0, prepare, compute, finish, before_drain);
}

}  // namespace moe
