#include "moe/dist_layer.h"

#include <cstring>

#include "dist/dist_weights.h"
#include "dist/ep_exchange.h"
#include "dist/ring.h"
#include "kernels/combine.h"
#include "kernels/permute.h"
#include "layer/expert_ffn.h"
#include "route/aux_loss.h"
#include "route/router.h"
#include "route/routing.h"

namespace moe {

struct Chunk {
  int64_t t0 = 0, t1 = 0;  // local token range
  Routing routing;  // this rank's tokens of the chunk (the kept slots: capacity in global order)
  RingState ring;   // ring of experts only
  Tensor xs;  // [Rc, D] sorted by global expert
  EpExchange ex;
  Tensor xl;  // [buffer_rows, D] received, sorted by local expert
  FfnActivations act;
  Tensor ys;  // [Rc, D] expert outputs back home, sorted order
};

struct DistForward {
  Tensor x;              // [T_l, D] dtype
  Tensor router_kernel;  // [D, E] f32
  RouterOutput router;
  AuxStats global;
  FfnWeights ffn;
  std::vector<Chunk> chunks;
};

void DistForwardDeleter::operator()(DistForward* p) const { delete p; }

namespace {

// Serialized AuxStats of one rank: E prob sums, E routed counts, lse sum, tokens.
struct StatsBlock {
  static size_t bytes(int64_t E) { return size_t(E) * (sizeof(FixedSum) + sizeof(int64_t)) + sizeof(FixedSum) + 8; }
};

// One AG over the world: every rank's statistics; returns the global sum (exact,
// rank order) and the routed counts of the ranks before this one.
AuxStats gather_stats(Communicator& world, const AuxStats& local, std::vector<int64_t>& prior) {
  const int64_t E = int64_t(local.prob_sum.size());
  const size_t nb = StatsBlock::bytes(E);
  std::vector<std::byte> mine(nb), all(nb * size_t(world.size()));
  std::byte* p = mine.data();
  std::memcpy(p, local.prob_sum.data(), size_t(E) * sizeof(FixedSum));
  std::memcpy(p + E * sizeof(FixedSum), local.routed_counts.data(), size_t(E) * 8);
  std::memcpy(p + E * (sizeof(FixedSum) + 8), &local.lse_sq_sum, sizeof(FixedSum));
  std::memcpy(p + E * (sizeof(FixedSum) + 8) + sizeof(FixedSum), &local.tokens, 8);
  world.all_gather(mine.data(), all.data(), nb);
  AuxStats global;
  prior.assign(size_t(E), 0);
  for (int r = 0; r < world.size(); ++r) {
    AuxStats s = local;
    const std::byte* q = all.data() + nb * size_t(r);
    std::memcpy(s.prob_sum.data(), q, size_t(E) * sizeof(FixedSum));
    std::memcpy(s.routed_counts.data(), q + E * sizeof(FixedSum), size_t(E) * 8);
    std::memcpy(&s.lse_sq_sum, q + E * (sizeof(FixedSum) + 8), sizeof(FixedSum));
    std::memcpy(&s.tokens, q + E * (sizeof(FixedSum) + 8) + sizeof(FixedSum), 8);
    if (r == 0) global = s;
    else global.add(s);
    if (r < world.rank())
      for (int64_t e = 0; e < E; ++e) prior[size_t(e)] += s.routed_counts[size_t(e)];
  }
  return global;
}

std::vector<int64_t> routed_counts(const Tensor& idx, int64_t E) {
  std::vector<int64_t> c(size_t(E), 0);
  for (int64_t i = 0; i < idx.numel(); ++i) c[size_t(idx.data<int32_t>()[i])]++;
  return c;
}

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

// Concatenates the segments' rows of one field (selected by `field`) into one tensor.
Tensor merge_rows(const std::vector<FfnGradInputs>& keeps, const std::vector<Segment>& segs, int64_t total,
                  Tensor FfnGradInputs::*field) {
  const Tensor& first = keeps[0].*field;
  if (!first.defined() || first.ndim() != 2) return Tensor();
  Tensor out(first.dtype(), {total, first.dim(1)});
  const size_t rb = size_t(first.dim(1)) * dtype_size(first.dtype());
  size_t at = 0;
  for (const Segment& s : segs) {
    const Tensor& src = keeps[s.chunk].*field;
    std::memcpy(static_cast<std::byte*>(out.raw()) + at, static_cast<const std::byte*>(src.raw()) + size_t(s.begin) * rb,
                size_t(s.rows) * rb);
    at += size_t(s.rows) * rb;
  }
  return out;
}

// Expert-parallel path of one chunk: sort, dispatch, local FFN, return, combine.
void forward_a2a(const Config& cfg, Chunk& ch, const Tensor& x, const Tensor& topk_w, const FfnWeights& ffn,
                 Communicator& ep, Tensor& y) {
  const int64_t Rc = (ch.t1 - ch.t0) * cfg.num_experts_per_tok;
  ch.xs = Tensor::empty(cfg.dtype, {Rc, cfg.emb_dim});
  permute(cfg.moe_permute_kernel, x.slice_rows(ch.t0, ch.t1), ch.routing, ch.xs);
  ch.ex = plan_exchange(ep, ch.routing.groups, cfg.num_experts, Rc, cfg.ragged_buffer_factor);
  ch.xl = ep_dispatch(ep, ch.ex, ch.xs);
  ch.act = ffn_forward(cfg, ffn, ch.xl, ch.ex.local_groups);
  ch.ys = ep_return(ep, ch.ex, ch.act.ys, Rc);
  combine(cfg.moe_combine_kernel, ch.ys, topk_w.slice_rows(ch.t0, ch.t1), ch.routing, cfg.float32_weight_sum, y);
}

// Its adjoint: writes dx rows (f32) and dW rows of the chunk; fills `keep`.
void backward_a2a(const Config& cfg, const Chunk& ch, const Tensor& dy, const Tensor& topk_w, const FfnWeights& ffn,
                  Communicator& ep, Tensor& dx, Tensor& dW, FfnGradInputs& keep) {
  const int64_t Rc = (ch.t1 - ch.t0) * cfg.num_experts_per_tok;
  Tensor dys = Tensor::empty(cfg.dtype, {Rc, cfg.emb_dim});
  combine_backward(cfg.moe_combine_kernel, dy, ch.ys, topk_w.slice_rows(ch.t0, ch.t1), ch.routing, dys, dW);
  Tensor dyl = ep_dispatch(ep, ch.ex, dys);
  Tensor dxl = ffn_backward_data(cfg, ffn, ch.xl, ch.act, dyl, ch.ex.local_groups, keep);
  Tensor dxs = ep_return(ep, ch.ex, dxl, Rc);
  permute_backward(cfg.moe_permute_kernel, dxs, ch.routing, dx);
}

}  // namespace

MeshShape check_parallel_config(const Config& cfg, int world_size) {
  MeshShape m = resolve_mesh_shape(cfg.data_parallelism, cfg.fsdp_parallelism, cfg.expert_parallelism, world_size);
  const int64_t E = cfg.num_experts, D = cfg.emb_dim;
  if (E % m.expert) fail("num_experts=", E, " is not divisible by expert_parallelism=", m.expert);
  if (cfg.use_ring_of_experts && m.expert == 1)
    fail("use_ring_of_experts=true needs expert_parallelism > 1 (it runs over the expert axis)");
  if (cfg.use_ring_of_experts && cfg.ragged_buffer_factor > 0)
    fail("ragged_buffer_factor=", cfg.ragged_buffer_factor, " caps the all-to-all buffer; the ring of experts has none "
         "(use -1 with use_ring_of_experts=true)");
  if (cfg.moe_split_expert_weight_layout) {
    if (m.expert != 1) fail("moe_split_expert_weight_layout=true needs expert_parallelism=1 (got ", m.expert, ")");
    if (E % m.fsdp) fail("moe_split_expert_weight_layout shards num_experts=", E, " over fsdp=", m.fsdp, ": not divisible");
  } else if (cfg.shard_exp_on_fsdp) {
    if (E % (int64_t(m.expert) * m.fsdp))
      fail("shard_exp_on_fsdp shards num_experts=", E, " over expert*fsdp=", m.expert * m.fsdp, ": not divisible");
  } else if (D % m.fsdp) {
    fail("emb_dim=", D, " is not divisible by fsdp_parallelism=", m.fsdp, " (expert weights shard D over fsdp)");
  }
  return m;
}

DistLayer::DistLayer(const Config& cfg, const Mesh& mesh, bool explicit_fsdp_plan)
    : cfg_(cfg), mesh_(mesh), explicit_plan_(explicit_fsdp_plan) {}

LayerWeights DistLayer::shard(const LayerWeights& full) const { return shard_weights(cfg_, mesh_, full); }

LayerWeights DistLayer::unshard_to_root(const LayerWeights& shards) const {
  return moe::unshard_to_root(cfg_, mesh_, shards);
}

DistForwardPtr DistLayer::forward(const LayerWeights& shards, const Tensor& x_in, const Tensor* forced,
                                  LayerOutputs& out) const {
  if (x_in.ndim() != 2 || x_in.dim(1) != cfg_.emb_dim)
    fail("x: expected shape [T, ", cfg_.emb_dim, "], got ", shape_str(x_in.shape()));
  const int64_t T = x_in.dim(0), K = cfg_.num_experts_per_tok, E = cfg_.num_experts, D = cfg_.emb_dim;
  DistForwardPtr f(new DistForward);
  f->x = x_in.to(cfg_.dtype);
  f->router_kernel = shards.router.to(DType::f32);
  f->router = router_forward(cfg_, f->x, f->router_kernel, forced);
  std::vector<int64_t> prior;
  f->global = gather_stats(mesh_.world(), aux_stats(f->router.logits, routed_counts(f->router.topk_idx, E)), prior);
  f->ffn = ffn_weights(cfg_, gather_weights(cfg_, mesh_, shards));
  const int64_t cap = expert_capacity(f->global.tokens, K, E, cfg_.capacity_factor);
  Communicator& ep = mesh_.comm({"expert"});
  out.y = Tensor::empty(cfg_.dtype, {T, D});
  out.dropped = 0;
  const int64_t n = std::min<int64_t>(std::max<int64_t>(cfg_.num_moe_token_chunks, 1), std::max<int64_t>(T, 1));
  for (int64_t c = 0; c < n; ++c) {
    Chunk ch;
    ch.t0 = T * c / n;
    ch.t1 = T * (c + 1) / n;
    const int64_t Tc = ch.t1 - ch.t0;
    ch.routing = compute_routing(f->router.topk_idx.data<int32_t>() + ch.t0 * K, Tc, K, E, cap, &prior);
    for (int64_t e = 0; e < E; ++e) prior[size_t(e)] += ch.routing.routed_counts[size_t(e)];
    Tensor y = out.y.slice_rows(ch.t0, ch.t1);
    if (cfg_.use_ring_of_experts) {
      ch.ring = ring_forward(cfg_, ep, f->ffn, f->x.slice_rows(ch.t0, ch.t1), f->router.topk_idx.data<int32_t>() + ch.t0 * K,
                             f->router.topk_weights.slice_rows(ch.t0, ch.t1), keep_mask(ch.routing), y);
      ch.ex = ch.ring.ex;
    } else {
      forward_a2a(cfg_, ch, f->x, f->router.topk_weights, f->ffn, ep, y);
    }
    out.dropped += ch.routing.dropped + ch.ex.dropped;
    f->chunks.push_back(std::move(ch));
  }
  out.topk_idx = f->router.topk_idx;
  out.topk_weights = f->router.topk_weights;
  out.group_sizes = Tensor(DType::i32, {E});  // this rank's kept rows per expert
  for (const Chunk& ch : f->chunks)
    for (int64_t e = 0; e < E; ++e) out.group_sizes.data<int32_t>()[e] += int32_t(ch.routing.groups.sizes[size_t(e)]);
  AuxLosses aux = aux_losses(cfg_, f->global);
  out.load_balance_loss = aux.load_balance;
  out.z_loss = aux.z_loss;
  return f;
}

LayerGrads DistLayer::backward(const DistForward& f, const Tensor& dy_in) const {
  if (dy_in.shape() != f.x.shape()) fail("dy: expected shape ", shape_str(f.x.shape()), ", got ", shape_str(dy_in.shape()));
  const Tensor dy = dy_in.to(cfg_.dtype);
  const int64_t T = f.x.dim(0), K = cfg_.num_experts_per_tok, D = cfg_.emb_dim;
  Communicator& ep = mesh_.comm({"expert"});
  LayerGrads g;
  g.dx = Tensor::empty(DType::f32, {T, D});
  Tensor dW = Tensor::empty(DType::f32, {T, K});
  std::vector<FfnGradInputs> keeps(f.chunks.size());
  for (size_t c = 0; c < f.chunks.size(); ++c) {
    const Chunk& ch = f.chunks[c];
    Tensor dWc = dW.slice_rows(ch.t0, ch.t1), dx = g.dx.slice_rows(ch.t0, ch.t1), dyc = dy.slice_rows(ch.t0, ch.t1);
    if (cfg_.use_ring_of_experts)
      ring_backward(cfg_, ep, f.ffn, ch.ring, dyc, dx, dWc, keeps[c]);
    else
      backward_a2a(cfg_, ch, dyc, f.router.topk_weights, f.ffn, ep, dx, dWc, keeps[c]);
  }
  LayerWeights needed;
  if (f.chunks.size() == 1) {
    ffn_weight_grads(f.ffn, keeps[0], f.chunks[0].ex.local_groups, needed);
  } else {
    std::vector<int64_t> sizes;
    std::vector<Segment> segs = merge_order(f.chunks, sizes);
    GroupLayout merged = GroupLayout::from_sizes(sizes);
    FfnGradInputs all;
    for (auto field : {&FfnGradInputs::xs, &FfnGradInputs::a, &FfnGradInputs::dys, &FfnGradInputs::dh,
                       &FfnGradInputs::dh0, &FfnGradInputs::dh1})
      all.*field = merge_rows(keeps, segs, merged.total(), field);
    ffn_weight_grads(f.ffn, all, merged, needed);
  }
  Tensor dz = router_weights_backward(cfg_, f.router, dW);
  aux_backward(cfg_, f.router.logits, f.global, dz);
  needed.router = Tensor(DType::f32, f.router_kernel.shape());
  router_matmul_backward(f.x, f.router_kernel, dz, needed.router, g.dx);
  g.weights = reduce_gradients(cfg_, mesh_, needed, explicit_plan_ ? GatherMode::explicit_plan : GatherMode::boundary);
  return g;
}

}  // namespace moe
