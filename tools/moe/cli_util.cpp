#include "cli_util.h"

#include <filesystem>

#include <cmath>
#include <cstdio>

#include "moe/topology.h"
#include "moe/watchdog.h"

namespace moe::cli {

namespace {
std::unique_ptr<Communicator>& world_slot() {
  static std::unique_ptr<Communicator> w;
  return w;
}
}  // namespace

Communicator& world() {
  std::unique_ptr<Communicator>& w = world_slot();
  if (!w) w = make_world_comm();
  return *w;
}

Communicator* world_if_made() { return world_slot().get(); }

void check_output_dir(const std::string& path, const char* option) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
    fail(option, " ", path, ": directory '", dir.string(), "' does not exist");
}

bool distributed(const Config& c) {
  return world().size() > 1 || c.data_parallelism != 1 || c.fsdp_parallelism != 1 || c.expert_parallelism != 1;
}

void refuse_f64(const Config& cfg, const std::string& origin) {
  if (cfg.dtype == DType::f64)
    throw ConfigError(origin,
                      {"dtype=f64 is for the library's layer and moe_engine.torch.MoELayer only (checks, "
                       "docs/python.md); the moe commands need dtype f32 or bf16"});
}

Config load(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = load_config(path, overrides).config;
  refuse_f64(c, path);
  apply_collective_timeout(c.collective_timeout_s);
  apply_collective_liveness(c.collective_liveness_s);
  // The same target check as `moe validate` (training: the stricter plan).
  TargetCheck chk = check_target(c, topology_of(world()), /*training=*/true);
  if (!chk.problems.empty()) throw ConfigError(path, chk.problems);
  for (const auto& w : chk.warnings) std::fprintf(stderr, "moe: warning: %s\n", w.c_str());
  return c;
}

LayerWeights load_weights(const Config& cfg, const SafetensorsFile& file, const std::string& prefix) {
  return weights_from(
      cfg, [&](const std::string& n) { return file.find(n); }, prefix, file.path);
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
