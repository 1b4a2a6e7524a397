#include <cmath>

#include "core/counter_rng.h"
#include "moe/layer.h"

namespace moe {

namespace {
struct Slot {
  const char* name;
  Tensor LayerWeights::*field;
};

std::vector<Slot> slots(const Config& cfg) {
  std::vector<Slot> s{{"router.kernel", &LayerWeights::router}};
  if (cfg.prefuse_moe_weights) {
    s.push_back({"experts.wi", &LayerWeights::wi});
  } else {
    s.push_back({"experts.wi_0", &LayerWeights::wi_0});
    s.push_back({"experts.wi_1", &LayerWeights::wi_1});
  }
  s.push_back({"experts.wo", &LayerWeights::wo});
  return s;
}

// Whether an f32 tensor of `shape` can be addressed: element count and byte
// size fit in 63 bits (negative dimensions are left to the shape compare).
bool fits_in_memory(const Shape& shape) {
  int64_t bytes = int64_t(sizeof(float));
  for (int64_t d : shape)
    if (d > 0 && __builtin_mul_overflow(bytes, d, &bytes)) return false;
  return true;
}

int64_t fan_in(const std::string& name, const Config& cfg) {
  return name == "experts.wo" ? cfg.moe_mlp_dim : cfg.emb_dim;
}
}  // namespace

std::vector<std::pair<std::string, Shape>> weight_shapes(const Config& cfg) {
  const int64_t D = cfg.emb_dim, E = cfg.num_experts, F = cfg.moe_mlp_dim;
  if (F > INT64_MAX / 2) fail("moe_mlp_dim=", F, " is too large: 2 x moe_mlp_dim overflows 64 bits");
  std::vector<std::pair<std::string, Shape>> out;
  for (const Slot& s : slots(cfg)) {
    std::string n = s.name;
    Shape sh;
    if (n == "router.kernel") sh = {D, E};
    else if (n == "experts.wi") sh = cfg.moe_split_expert_weight_layout ? Shape{2, E, D / 2, 2 * F} : Shape{E, D, 2 * F};
    else if (n == "experts.wo") sh = {E, F, D};
    else sh = {E, D, F};
    out.emplace_back(n, sh);
  }
  return out;
}

void LayerWeights::for_each(const Config& cfg, const std::function<void(const std::string&, Tensor&)>& fn) {
  for (const Slot& s : slots(cfg)) fn(s.name, this->*s.field);
}
void LayerWeights::for_each(const Config& cfg,
                            const std::function<void(const std::string&, const Tensor&)>& fn) const {
  for (const Slot& s : slots(cfg)) fn(s.name, this->*s.field);
}

LayerWeights init_weights(const Config& cfg, uint64_t seed) {
  LayerWeights w;
  auto shapes = weight_shapes(cfg);
  size_t i = 0;
  w.for_each(cfg, [&](const std::string& name, Tensor& t) {
    const Shape& shape = shapes[i++].second;
    // The split layout is a pure reshape of [E, D, 2F], so it draws the same values.
    Tensor f = normal_tensor(shape, named_key(seed, name), 1.0f / std::sqrt(float(fan_in(name, cfg))));
    t = name == "router.kernel" ? f : f.to(cfg.weight_dtype);
  });
  return w;
}

LayerWeights weights_from(const Config& cfg, const std::function<const Tensor*(const std::string&)>& lookup,
                          const std::string& prefix, const std::string& origin) {
  LayerWeights w;
  auto shapes = weight_shapes(cfg);
  // parse_config rejects such shapes; a Config built in code may still hold one.
  for (const auto& [name, shape] : shapes)
    if (!fits_in_memory(shape))
      fail(origin, ": weight '", prefix + name, "': the config's shape ", shape_str(shape),
           " is too large (its element count or f32 byte size overflows 63 bits)");
  size_t i = 0;
  w.for_each(cfg, [&](const std::string& name, Tensor& t) {
    const Shape& shape = shapes[i++].second;
    const std::string full = prefix + name;
    const Tensor* src = lookup(full);
    if (!src) fail(origin, ": missing weight '", full, "' (expected shape ", shape_str(shape), ")");
    if (src->shape() != shape)
      fail(origin, ": weight '", full, "' has shape ", shape_str(src->shape()), ", the config needs ",
           shape_str(shape));
    if (src->dtype() != DType::f32 && src->dtype() != DType::bf16 && src->dtype() != DType::f16)
      fail(origin, ": weight '", full, "' has dtype ", dtype_name(src->dtype()), ", expected a float type");
    t = src->dtype() == DType::f16 ? src->to(DType::f32) : *src;
  });
  return w;
}

}  // namespace moe
