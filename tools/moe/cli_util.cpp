#include "cli_util.h"

#include <cmath>

namespace moe::cli {

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  return load_config(path, overrides).config;
}

LayerWeights load_weights(const Config& cfg, const SafetensorsFile& file, const std::string& prefix) {
  return weights_from(cfg, [&](const std::string& n) { return file.find(n); }, prefix, file.path);
}

std::vector<std::pair<std::string, Tensor>> named(const Config& cfg, const LayerWeights& w,
                                                   const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  w.for_each(cfg, [&](const std::string& n, const Tensor& t) { out.emplace_back(prefix + n, t); });
  return out;
}

double norm(const Tensor& t) {
  double s = 0;
  for (int64_t i = 0; i < t.numel(); ++i) s += double(t.get_f32(i)) * double(t.get_f32(i));
  return std::sqrt(s);
}

}  // namespace moe::cli
