// Reading the metrics file for `moe report`.
#include <cmath>
#include <fstream>
#include <istream>
#include <nlohmann/json.hpp>

#include "moe/error.h"
#include "train/report.h"

namespace moe::train {
namespace {

double number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) fail(where, ": missing field '", key, "'");
  if (j[key].is_null()) return std::nan("");  // non-finite values are written as null
  if (!j[key].is_number()) fail(where, ": field '", key, "' is not a number");
  return j[key].get<double>();
}

// max/mean per layer of one line's "load" (empty when absent).
std::vector<double> balance_of(const nlohmann::json& j, const std::string& where) {
  std::vector<double> out;
  if (!j.contains("load")) return out;
  if (!j["load"].is_array()) fail(where, ": field 'load' is not a list");
  for (const auto& layer : j["load"]) {
    if (!layer.is_object()) fail(where, ": field 'load' holds a non-object");
    const double mx = number(layer, "max", where), mean = number(layer, "mean", where);
    out.push_back(mean > 0 ? mx / mean : 0.0);
  }
  return out;
}

void add_line(MetricsSeries& s, const std::string& line, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(where, ": not a JSON object");
  s.step.push_back(number(j, "step", where));
  s.loss.push_back(number(j, "loss", where));
  std::vector<double> b = balance_of(j, where);
  if (s.step.size() == 1) s.balance.resize(b.size());
  if (b.size() != s.balance.size())
    fail(where, ": 'load' has ", b.size(), " layers, earlier lines have ", s.balance.size());
  for (size_t i = 0; i < b.size(); ++i) s.balance[i].push_back(b[i]);
}

}  // namespace

MetricsSeries read_metrics(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("metrics file ", path, ": cannot open (does it exist?)");
  return read_metrics(in, path);
}

MetricsSeries read_metrics(std::istream& in, const std::string& path) {
  MetricsSeries s;
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are allowed
    add_line(s, line, path + ":" + std::to_string(n));
  }
  if (s.step.empty()) fail("metrics file ", path, ": no metrics lines");
  return s;
}

}  // namespace moe::train
