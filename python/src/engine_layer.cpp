#include "engine_layer.h"

#include <cstdio>
#include <mutex>

#include "moe/comm_tensor.h"
#include "moe/topology.h"
#include "moe/watchdog.h"

namespace moe::python {
namespace {
std::mutex g_world_mu;
std::shared_ptr<Communicator> g_world;  // GUARDED_BY(g_world_mu)

bool parallel_keys_set(const Config& c) {
  return c.data_parallelism != 1 || c.fsdp_parallelism != 1 || c.expert_parallelism != 1;
}

// Global kept rows per expert: every rank's counts summed (one all-gather of E int32).
Tensor sum_over_ranks(Communicator& w, const Tensor& local) {
  const int64_t E = local.numel();
  std::vector<int32_t> all(size_t(E * w.size()));
  w.all_gather(local.raw(), all.data(), local.nbytes());
  Tensor sum(DType::i32, {E});
  for (int r = 0; r < w.size(); ++r)
    for (int64_t e = 0; e < E; ++e) sum.data<int32_t>()[e] += all[size_t(r * E + e)];
  return sum;
}
}  // namespace

std::shared_ptr<Communicator> world() {
  std::lock_guard<std::mutex> lk(g_world_mu);
  if (!g_world) g_world = make_world_comm();
  return g_world;
}

Communicator* world_if_made() {
  std::lock_guard<std::mutex> lk(g_world_mu);
  return g_world.get();
}

EngineLayer::EngineLayer(const std::vector<std::string>& overrides, std::optional<bool> distributed) {
  LoadedConfig lc = parse_config("", "MoELayer", overrides);
  cfg_ = lc.config;
  table_ = std::move(lc.table);
  const bool dist = distributed.value_or(parallel_keys_set(cfg_) || (launched_by_mpi() && world()->size() > 1));
  if (!dist) {
    shapes_ = weight_shapes(cfg_);
    return;
  }
  apply_collective_timeout(cfg_.collective_timeout_s);
  world_ = world();
  // The same checks as the CLI (tools/moe/cli_util.cpp): the target, then the mesh.
  TargetCheck chk = check_target(cfg_, topology_of(*world_), /*training=*/true);
  if (!chk.problems.empty()) throw ConfigError("MoELayer", chk.problems);
  if (world_->rank() == 0)
    for (const auto& w : chk.warnings) std::fprintf(stderr, "moe: warning: %s\n", w.c_str());
  rt_ = std::make_unique<DistRuntime>(cfg_, *world_, /*training=*/true);
  dist_ = std::make_unique<DistLayer>(cfg_, *rt_);
  // This rank's shapes: those of the shards of full-shape weights (sharding is pure slicing).
  LayerWeights probe;
  for (const auto& [name, shape] : weight_shapes(cfg_)) {
    Tensor t = Tensor::empty(name == "router.kernel" ? DType::f32 : cfg_.weight_dtype, shape);
    probe.for_each(cfg_, [&](const std::string& n, Tensor& slot) { if (n == name) slot = t; });
  }
  LayerWeights part = dist_->shard(probe);
  part.for_each(cfg_, [&](const std::string& n, const Tensor& t) { shapes_.emplace_back(n, t.shape()); });
}

EngineLayer::~EngineLayer() = default;

void EngineLayer::collectively(const std::function<void()>& body) const {
  if (world_ && world_->size() > 1) return run_collectively(*world_, body);
  body();
}

LayerWeights EngineLayer::weights_of(const std::map<std::string, Tensor>& params) const {
  LayerWeights w;
  size_t i = 0;
  w.for_each(cfg_, [&](const std::string& name, Tensor& slot) {
    const Shape& shape = shapes_[i++].second;
    auto it = params.find(name);
    if (it == params.end()) fail("MoELayer: missing parameter '", name, "'");
    const Tensor& t = it->second;
    if (t.shape() != shape)
      fail("MoELayer: parameter '", name, "': expected shape ", shape_str(shape), ", got ", shape_str(t.shape()));
    if (t.dtype() != DType::f32 && t.dtype() != DType::bf16 && t.dtype() != DType::f64)
      fail("MoELayer: parameter '", name, "': expected float32, bfloat16 or float64, got ",
           dtype_name(t.dtype()));
    slot = t;
  });
  return w;
}

std::map<std::string, Tensor> EngineLayer::shard(const std::map<std::string, Tensor>& full) const {
  LayerWeights w = weights_from(cfg_, [&](const std::string& n) {
    auto it = full.find(n);
    return it == full.end() ? nullptr : &it->second;
  }, "", "MoELayer");
  if (dist_) w = dist_->shard(w);
  std::map<std::string, Tensor> out;
  w.for_each(cfg_, [&](const std::string& n, const Tensor& t) { out[n] = t; });
  return out;
}

std::map<std::string, Tensor> EngineLayer::unshard(const std::map<std::string, Tensor>& parts) const {
  LayerWeights w = weights_of(parts);
  std::map<std::string, Tensor> out;
  if (!dist_) {
    w.for_each(cfg_, [&](const std::string& n, const Tensor& t) { out[n] = t; });
    return out;
  }
  collectively([&] {
    LayerWeights full = dist_->unshard_to_root(w);
    full.for_each(cfg_, [&](const std::string& n, const Tensor& t) { out[n] = broadcast_tensor(*world_, t, 0); });
  });
  return out;
}

ForwardResult EngineLayer::forward(const std::map<std::string, Tensor>& params, const Tensor& x,
                                   bool keep_state) const {
  auto st = std::make_shared<ForwardState>();
  st->weights = weights_of(params);
  st->x_dtype = x.dtype();
  if (x.ndim() != 2 || x.dim(1) != cfg_.emb_dim)
    fail("MoELayer: x: expected shape [T, ", cfg_.emb_dim, "] (emb_dim = ", cfg_.emb_dim, "), got ",
         shape_str(x.shape()));
  if (!is_float(x.dtype()))
    fail("MoELayer: x: expected float32, bfloat16 or float64, got ", dtype_name(x.dtype()));
  LayerOutputs o;
  ForwardResult r;
  collectively([&] {
    if (dist_) {
      st->dist = dist_->forward(st->weights, x, nullptr, o);
      r.group_sizes = sum_over_ranks(*world_, o.group_sizes);
    } else {
      st->local = layer_forward(cfg_, st->weights, x, nullptr, o);
      r.group_sizes = o.group_sizes;
    }
  });
  r.y = o.y;
  r.topk_idx = o.topk_idx;
  r.topk_weights = o.topk_weights;
  const bool f64 = cfg_.dtype == DType::f64;  // single-process only (config rules)
  r.load_balance_loss = f64 ? o.load_balance_loss_f64 : double(o.load_balance_loss);
  r.z_loss = f64 ? o.z_loss_f64 : double(o.z_loss);
  r.dropped = o.dropped;
  r.nonfinite_tokens = o.nonfinite_tokens;
  if (keep_state) r.state = std::move(st);
  return r;
}

std::pair<Tensor, std::map<std::string, Tensor>> EngineLayer::backward(
    const ForwardState& st, const Tensor& dy, const AuxCotangents& aux,
    const std::map<std::string, Tensor>& accumulate) const {
  if (!st.local && !st.dist) fail("MoELayer: backward: the forward state was already used or not kept");
  if (dist_ && !accumulate.empty()) fail("MoELayer: accumulating gradients in place needs the single-process layer");
  // An f64 layer keeps its saved tensors for another backward (retain_graph: gradcheck).
  BackwardOptions opts{.release_saved = cfg_.dtype != DType::f64};
  LayerWeights acc;
  if (!accumulate.empty()) acc = weights_of(accumulate), opts.accumulate = &acc;
  LayerGrads g;
  collectively([&] {
    g = dist_ ? dist_->backward(*st.dist, dy, aux) : layer_backward(cfg_, *st.local, dy, aux, opts);
  });
  std::map<std::string, Tensor> grads;
  g.weights.for_each(cfg_, [&](const std::string& n, const Tensor& t) { grads[n] = t; });
  return {g.dx.to(st.x_dtype), std::move(grads)};
}

}  // namespace moe::python
