#include "distributed/dist_weights.h"

#include <cstring>

namespace moe {
namespace {

const std::vector<std::string> kTokenAxes = {"data", "fsdp"};  // axes an expert's partial gradients span

// Drops axes of extent 1 (a trivial axis moves nothing).
ShardSpec normalized(const Mesh& mesh, ShardSpec spec) {
  for (auto& dim : spec)
    std::erase_if(dim, [&](const std::string& a) { return mesh.extent({a}) == 1; });
  return spec;
}

std::vector<std::string> nontrivial(const Mesh& mesh, std::vector<std::string> axes) {
  std::erase_if(axes, [&](const std::string& a) { return mesh.extent({a}) == 1; });
  return axes;
}

// Per dim, the axes `stored` shards over beyond `needed` (the plan's axes).
ShardSpec relative_spec(const ShardSpec& stored, const ShardSpec& needed, int ndim) {
  ShardSpec rel(static_cast<size_t>(ndim));
  for (int d = 0; d < ndim; ++d) {
    const auto& s = size_t(d) < stored.size() ? stored[size_t(d)] : std::vector<std::string>{};
    size_t n = size_t(d) < needed.size() ? needed[size_t(d)].size() : 0;
    rel[size_t(d)].assign(s.begin() + long(std::min(n, s.size())), s.end());
  }
  return rel;
}

GatherPlan plan_for(const Config& cfg, const Mesh& mesh, const std::string& name, int ndim) {
  auto plan = all_gather_plan(stored_spec(cfg, mesh, name), needed_spec(cfg, mesh, name), ndim);
  MOE_ASSERT(plan.has_value(), "stored and needed weight specs must differ by a pure all-gather");
  return *plan;
}

// Split layout: each expert half [1, E/f, D/2, 2F] is gathered on its own.
Tensor gather_split(const Mesh& mesh, const Tensor& wi, const GatherPlan& plan) {
  std::vector<Tensor> halves;
  for (int h = 0; h < 2; ++h) halves.push_back(gather_by_plan(mesh, wi.slice_rows(h, h + 1).clone(), plan));
  Shape full = halves[0].shape();
  full[0] = 2;
  Tensor out = Tensor::empty(halves[0].dtype(), full);
  for (size_t h = 0; h < 2; ++h)
    std::memcpy(static_cast<std::byte*>(out.raw()) + h * halves[h].nbytes(), halves[h].raw(), halves[h].nbytes());
  return out;
}

}  // namespace

ShardSpec stored_spec(const Config& cfg, const Mesh& mesh, const std::string& name) {
  ShardSpec s;
  if (name == "router.kernel") s = {};
  else if (cfg.moe_split_expert_weight_layout) s = name == "experts.wi" ? ShardSpec{{}, {"fsdp"}, {}, {}} : ShardSpec{{"fsdp"}};
  else if (cfg.shard_exp_on_fsdp) s = {{"expert", "fsdp"}};
  else if (name == "experts.wo") s = {{"expert"}, {}, {"fsdp"}};
  else s = {{"expert"}, {"fsdp"}, {}};
  return normalized(mesh, s);
}

ShardSpec needed_spec(const Config& cfg, const Mesh& mesh, const std::string& name) {
  if (name == "router.kernel" || cfg.moe_split_expert_weight_layout) return {};
  return normalized(mesh, {{"expert"}});
}

LayerWeights shard_weights(const Config& cfg, const Mesh& mesh, const LayerWeights& full) {
  LayerWeights out = full;
  out.for_each(cfg, [&](const std::string& name, Tensor& t) { t = local_shard(mesh, t, stored_spec(cfg, mesh, name)); });
  return out;
}

Tensor gather_weight(const Config& cfg, const Mesh& mesh, const std::string& name, const Tensor& local) {
  GatherPlan plan = plan_for(cfg, mesh, name, local.ndim());
  return plan.empty() ? local : gather_by_plan(mesh, local, plan);
}

bool needs_gather(const Config& cfg, const Mesh& mesh, const std::string& name, int ndim) {
  return !plan_for(cfg, mesh, name, ndim).empty();
}

Tensor gather_wi_half(const Config& cfg, const Mesh& mesh, const Tensor& wi, int h) {
  const int64_t E = cfg.num_experts, D = cfg.emb_dim, F = cfg.moe_mlp_dim;
  Tensor half = wi.slice_rows(h, h + 1);
  GatherPlan plan = plan_for(cfg, mesh, "experts.wi", wi.ndim());
  Tensor full = plan.empty() ? half : gather_by_plan(mesh, half.clone(), plan);
  return full.reshaped({E / 2, D, 2 * F});  // slice h of [2, E, D/2, 2F] is experts [hE/2, (h+1)E/2)
}

LayerWeights gather_weights(const Config& cfg, const Mesh& mesh, const LayerWeights& shards) {
  LayerWeights out = shards;
  out.for_each(cfg, [&](const std::string& name, Tensor& t) {
    if (name == "router.kernel") return void(t = t.to(DType::f32));
    Tensor local = t.to(cfg.dtype);  // cast before the gather: bf16 moves half the bytes
    GatherPlan plan = plan_for(cfg, mesh, name, local.ndim());
    if (plan.empty()) return void(t = local);
    bool split_wi = cfg.moe_split_expert_weight_layout && name == "experts.wi";
    t = split_wi ? gather_split(mesh, local, plan) : gather_by_plan(mesh, local, plan);
  });
  return out;
}

Tensor reduce_gradient(const Config& cfg, const Mesh& mesh, const std::string& name, const Tensor& grad,
                       GatherMode mode) {
  bool router = name == "router.kernel";
  auto axes = nontrivial(mesh, router ? std::vector<std::string>{"data", "fsdp", "expert"} : kTokenAxes);
  ShardSpec rel = relative_spec(stored_spec(cfg, mesh, name), needed_spec(cfg, mesh, name), grad.ndim());
  bool sharded = false;
  for (const auto& d : rel) sharded |= !d.empty();
  if (mode == GatherMode::explicit_plan && sharded) return reduce_to_shard(mesh, grad, rel, axes);
  Tensor g = grad;
  if (!axes.empty()) {
    g = Tensor::empty(DType::f32, grad.shape());
    mesh.comm(axes).all_reduce_sum(grad.data<float>(), g.data<float>(), size_t(grad.numel()));
  }
  return sharded ? local_shard(mesh, g, rel) : g;
}

bool reduce_moves_data(const Config& cfg, const Mesh& mesh, const std::string& name) {
  bool router = name == "router.kernel";
  auto axes = nontrivial(mesh, router ? std::vector<std::string>{"data", "fsdp", "expert"} : kTokenAxes);
  ShardSpec rel = relative_spec(stored_spec(cfg, mesh, name), needed_spec(cfg, mesh, name), 4);
  bool sharded = false;
  for (const auto& d : rel) sharded |= !d.empty();
  return sharded || !axes.empty();
}

LayerWeights reduce_gradients(const Config& cfg, const Mesh& mesh, const LayerWeights& grads, GatherMode mode) {
  LayerWeights out = grads;
  out.for_each(cfg, [&](const std::string& name, Tensor& g) { g = reduce_gradient(cfg, mesh, name, g, mode); });
  return out;
}

// Copies `block` into `full` at per-dim offsets `start` (row-major, any rank).
void place_block(Tensor& full, const Tensor& block, const std::vector<int64_t>& start) {
  const int nd = full.ndim();
  const size_t es = dtype_size(full.dtype());
  if (nd == 0) return void(std::memcpy(full.raw(), block.raw(), es));
  const int64_t run = block.dim(nd - 1);
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t r = 0; r < (run ? block.numel() / run : 0); ++r) {
    int64_t rem = r, off = 0;
    for (int d = nd - 2; d >= 0; --d) {
      idx[size_t(d)] = rem % block.dim(d);
      rem /= block.dim(d);
    }
    for (int d = 0; d < nd - 1; ++d) off = off * full.dim(d) + start[size_t(d)] + idx[size_t(d)];
    off = off * full.dim(nd - 1) + start[size_t(nd - 1)];
    std::memcpy(static_cast<std::byte*>(full.raw()) + size_t(off) * es,
                static_cast<const std::byte*>(block.raw()) + size_t(r * run) * es, size_t(run) * es);
  }
}

// Offsets of the shard held by the rank at `c` (per dim: index along the dim's axes times the block size).
std::vector<int64_t> shard_start(const MeshShape& shape, const MeshCoords& c, const Shape& shard, const ShardSpec& spec) {
  std::vector<int64_t> start(shard.size(), 0);
  for (size_t d = 0; d < spec.size() && d < shard.size(); ++d) {
    int64_t index = 0;
    for (const auto& a : spec[d]) {
      MeshAxis ax = *mesh_axis_from_name(a);
      index = index * shape.extent(ax) + c[ax];
    }
    start[d] = index * shard[d];
  }
  return start;
}

LayerWeights unshard_to_root(const Config& cfg, const Mesh& mesh, const LayerWeights& shards) {
  Communicator& world = mesh.world();
  const int W = world.size();
  LayerWeights out;
  auto shapes = weight_shapes(cfg);
  size_t i = 0;
  out.for_each(cfg, [&](const std::string& name, Tensor& dst) {
    const Shape& full_shape = shapes[i++].second;
    const Tensor* src = nullptr;
    shards.for_each(cfg, [&](const std::string& n, const Tensor& t) { if (n == name) src = &t; });
    const Tensor shard = src->clone();
    Tensor all;
    if (world.rank() == 0) all = Tensor::empty(shard.dtype(), {int64_t(W) * shard.numel()});
    world.gatherv(shard.raw(), shard.nbytes(), world.rank() == 0 ? all.raw() : nullptr,
                  std::vector<size_t>(size_t(W), shard.nbytes()), 0);
    if (world.rank() != 0) return;
    dst = Tensor::empty(shard.dtype(), full_shape);
    ShardSpec spec = stored_spec(cfg, mesh, name);
    for (int r = 0; r < W; ++r) {
      Tensor block = all.slice_rows(int64_t(r) * shard.numel(), int64_t(r + 1) * shard.numel()).reshaped(shard.shape());
      place_block(dst, block, shard_start(mesh.shape(), mesh.shape().coords_of(r), shard.shape(), spec));
    }
  });
  return out;
}

}  // namespace moe
