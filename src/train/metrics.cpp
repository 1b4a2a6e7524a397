#include "train/metrics.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"

namespace moe::train {

std::string metrics_json_line(const StepMetrics& m) {
  nlohmann::ordered_json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["mse"] = m.mse;
  j["lb"] = m.lb;
  j["z"] = m.z;
  j["lr"] = m.lr;
  j["grad_norm"] = m.grad_norm;
  j["step_ms"] = m.step_ms;
  j["tokens"] = m.tokens;
  j["tokens_per_s"] = m.tokens_per_s;
  j["dropped"] = m.dropped;
  j["collective_bytes"] = m.collective_bytes;
  j["side_ops"] = m.side_ops;
  nlohmann::ordered_json load = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.load_max.size(); ++i)
    load.push_back({{"max", m.load_max[i]}, {"mean", m.load_mean[i]}});
  j["load"] = load;
  return j.dump();
}

namespace {
// The lines of `path` whose step is <= keep_through (unparsable lines are dropped).
std::string kept_lines(const std::string& path, int64_t keep_through) {
  std::ifstream in(path);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= keep_through)
      out += line + "\n";
  }
  return out;
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_through) : path_(path) {
  if (path.empty()) return;
  const std::string what = "metrics_file " + path;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) ensure_directory(parent.string(), what);
  with_context(what, [&] {
    write_file_atomic(path, keep_through > 0 ? kept_lines(path, keep_through) : std::string());
  });
  f_ = std::fopen(path.c_str(), "a");
  if (!f_) fail("metrics_file ", path, ": cannot open for writing");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const StepMetrics& m) {
  if (!f_) return;
  const std::string line = metrics_json_line(m) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail("metrics_file ", path_, ": write failed");
}

}  // namespace moe::train
