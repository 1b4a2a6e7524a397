#include "train/model.h"

#include <algorithm>
#include <chrono>

#include "core/counter_rng.h"
#include "train/rmsnorm.h"
#include "train/timer.h"

namespace moe::train {
namespace {

constexpr uint64_t kLayerStream = 0x6c61796572ull;  // "layer"

Tensor ones(int64_t n) {
  Tensor t = Tensor::empty(DType::f32, {n});
  std::fill_n(t.data<float>(), n, 1.0f);
  return t;
}

// h += y (y in any float dtype).  [T, D]
void add_into(Tensor& h, const Tensor& y) {
  Tensor y32 = y.to(DType::f32);
  float* ph = h.data<float>();
  const float* py = y32.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) ph[i] += py[i];
}

LayerStats stats_of(const LayerOutputs& o) {
  LayerStats s{o.load_balance_loss, o.z_loss, o.dropped, {}, 0, 0};
  const int32_t* g = o.group_sizes.data<int32_t>();
  for (int64_t e = 0; e < o.group_sizes.numel(); ++e) s.rows.push_back(double(g[e]));
  set_load(s);
  return s;
}

// What the backward of one block needs.
struct BlockCache {
  Tensor h_in;     // [T, D] f32
  Tensor inv_rms;  // [T]
  LayerForwardPtr moe;
  DistForwardPtr dist;  // instead of moe under a distributed exec
};

// One block's MoE forward on n [T, D] into the cache (h_in, inv_rms set by the caller).
void moe_forward(const Config& cfg, const LayerWeights& w, const Tensor& n, const LayerExec& exec,
                 BlockCache& c, LayerOutputs& o) {
  if (exec.dist)
    c.dist = exec.dist->forward(w, n, nullptr, o);
  else
    c.moe = layer_forward(cfg, w, n, nullptr, o, exec.trace);
}

LayerGrads moe_backward(const Config& cfg, const LayerExec& exec, BlockCache& c, const Tensor& g) {
  LayerGrads lg = exec.dist ? exec.dist->backward(*c.dist, g)
                            : layer_backward(cfg, *c.moe, g, {}, BackwardOptions{.release_saved = true});
  c.moe.reset();  // free the activations early
  c.dist.reset();
  return lg;
}

}  // namespace

void set_load(LayerStats& s) {
  double sum = 0;
  s.load_max = 0;
  for (double r : s.rows) {
    s.load_max = std::max(s.load_max, r);
    sum += r;
  }
  s.load_mean = sum / double(s.rows.size());
}

Model init_model(const Config& cfg, uint64_t seed) {
  Model m;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    Block b{init_weights(cfg, stream_key(seed, kLayerStream, uint64_t(i))), ones(cfg.emb_dim)};
    b.moe.for_each(cfg, [](const std::string&, Tensor& t) { t = t.to(DType::f32); });
    m.blocks.push_back(std::move(b));
  }
  return m;
}

Model zeros_like(const Config& cfg, const Model& m) {
  Model z = m;
  for (auto& b : z.blocks) {
    b.moe.for_each(cfg, [](const std::string&, Tensor& t) { t = Tensor(DType::f32, t.shape()); });
    b.norm_scale = Tensor(DType::f32, b.norm_scale.shape());
  }
  return z;
}

std::vector<Param> parameters(const Config& cfg, Model& m) {
  std::vector<Param> out;
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    m.blocks[i].moe.for_each(cfg, [&](const std::string& n, Tensor& t) {
      out.push_back({prefix + n, &t, true});
    });
    out.push_back({prefix + "norm.scale", &m.blocks[i].norm_scale, false});
  }
  return out;
}

std::vector<std::pair<std::string, Shape>> parameter_shapes(const Config& cfg) {
  std::vector<std::pair<std::string, Shape>> out;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    for (auto& [n, s] : weight_shapes(cfg)) out.emplace_back(prefix + n, s);
    out.emplace_back(prefix + "norm.scale", Shape{cfg.emb_dim});
  }
  return out;
}

Tensor model_forward(const Config& cfg, const Model& m, const Tensor& x, const LayerExec& exec) {
  Tensor h = x.to(DType::f32).clone();
  for (const Block& b : m.blocks) {
    RmsNormOut n = rmsnorm_forward(h, b.norm_scale);
    LayerOutputs o;
    BlockCache c;
    moe_forward(cfg, b.moe, n.y, exec, c, o);
    add_into(h, o.y);
  }
  return h;
}

namespace {

// Student forward through every block, keeping what the backward needs.
// Returns h_L [T, D] f32.
Tensor forward_blocks(const Config& cfg, const Model& m, const Tensor& x, const LayerExec& exec,
                      std::vector<BlockCache>& caches, LossTerms& loss, PhaseTimes& times) {
  Tensor h = x.to(DType::f32).clone();
  for (const Block& b : m.blocks) {
    auto t0 = Clock::now();
    RmsNormOut n = rmsnorm_forward(h, b.norm_scale);
    times.norm += ms_since(t0);
    auto t1 = Clock::now();
    LayerOutputs o;
    caches.push_back({h.clone(), n.inv_rms, nullptr, nullptr});
    moe_forward(cfg, b.moe, n.y, exec, caches.back(), o);
    times.moe_forward += ms_since(t1);
    loss.layers.push_back(stats_of(o));
    loss.lb += o.load_balance_loss;
    loss.z += o.z_loss;
    add_into(h, o.y);
  }
  return h;
}

// Squared error into loss.mse_sum; returns dL/dh = 2 (h - target) / N, N = global_tokens * D.
Tensor mse_grad(const Tensor& h, const Tensor& target, int64_t global_tokens, LossTerms& loss) {
  expect_shape(target, h.shape(), "target");
  const double inv_n = 1.0 / (double(global_tokens) * double(h.dim(1)));
  Tensor g = Tensor::empty(DType::f32, h.shape());
  const float *ph = h.data<float>(), *pt = target.data<float>();
  float* pg = g.data<float>();
  for (int64_t i = 0; i < h.numel(); ++i) {
    const float e = ph[i] - pt[i];
    loss.mse_sum += double(e) * e;
    pg[i] = float(2.0 * inv_n * e);
  }
  return g;
}

// Top block down: g = dL/dh_i enters block i's MoE as dy and flows on through
// the residual plus the RMSNorm's input gradient.
void backward_blocks(const Config& cfg, const Model& m, const LayerExec& exec,
                     std::vector<BlockCache>& caches, Tensor g, Model& grads, PhaseTimes& times) {
  for (size_t i = m.blocks.size(); i-- > 0;) {
    auto t0 = Clock::now();
    LayerGrads lg = moe_backward(cfg, exec, caches[i], g);
    times.moe_backward += ms_since(t0);
    auto t1 = Clock::now();
    grads.blocks[i].moe = lg.weights;
    RmsNormGrads ng = rmsnorm_backward(caches[i].h_in, m.blocks[i].norm_scale, caches[i].inv_rms, lg.dx);
    grads.blocks[i].norm_scale = ng.dscale;
    float* pg = g.data<float>();
    const float* pn = ng.dx.data<float>();
    for (int64_t j = 0; j < g.numel(); ++j) pg[j] += pn[j];
    times.norm += ms_since(t1);
  }
}

}  // namespace

LossTerms loss_and_grads(const Config& cfg, const Model& m, const Tensor& x, const Tensor& target,
                         int64_t global_tokens, Model& grads, PhaseTimes& times, const LayerExec& exec) {
  LossTerms loss;
  std::vector<BlockCache> caches;
  Tensor h = forward_blocks(cfg, m, x, exec, caches, loss, times);
  backward_blocks(cfg, m, exec, caches, mse_grad(h, target, global_tokens, loss), grads, times);
  return loss;
}

}  // namespace moe::train
