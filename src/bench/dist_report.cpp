// Text table and JSON of `moe bench --dist` (docs/benchmarks.md).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/dist_bench.h"
#include "moe/isa.h"

namespace moe::bench {
namespace {

constexpr const char* kRowFormat = "%-24s %5s %10s %10s %10s %8s %10s %10s  %s\n";

std::string num(double v, int prec) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// "AR 2, AG 4, A2A 0, RS 1, SO 10"
std::string counts_text(const DistResult& r) {
  std::string s;
  for (int k = 0; k < kNumCollKinds; ++k)
    s += std::string(k ? ", " : "") + coll_kind_name(CollKind(k)) + " " + std::to_string(r.counts[size_t(k)]);
  return s;
}

}  // namespace

std::string format_dist_header() {
  char buf[256];
  std::snprintf(buf, sizeof buf, kRowFormat, "variant", "ranks", "median_ms", "min_ms", "max_ms", "vs_base",
                "exposed_ms", "compute_ms", "collectives per step");
  return buf;
}

std::string format_dist_row(const DistResult& r) {
  if (!r.skipped.empty()) return r.variant + ": skipped (" + r.skipped + ")\n";
  const std::string vs = r.has_baseline ? (r.vs_baseline_pct >= 0 ? "+" : "") + num(r.vs_baseline_pct, 2) + "%" : "-";
  char buf[512];
  std::snprintf(buf, sizeof buf, kRowFormat, r.variant.c_str(), std::to_string(r.ranks).c_str(),
                num(r.median_ms, 2).c_str(), num(r.min_ms, 2).c_str(), num(r.max_ms, 2).c_str(), vs.c_str(),
                num(r.exposed_comm_ms, 2).c_str(), num(r.compute_ms, 2).c_str(), counts_text(r).c_str());
  return buf;
}

std::string dist_results_json(const std::vector<DistResult>& results) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array(), skipped = nlohmann::ordered_json::array();
  for (const DistResult& r : results) {
    if (!r.skipped.empty()) {
      skipped.push_back({{"variant", r.variant}, {"why", r.skipped}});
      continue;
    }
    nlohmann::ordered_json j, counts, bytes;
    j["variant"] = r.variant, j["ranks"] = r.ranks;
    j["median_ms"] = r.median_ms, j["min_ms"] = r.min_ms, j["max_ms"] = r.max_ms;
    j["vs_baseline_pct"] = r.has_baseline ? nlohmann::ordered_json(r.vs_baseline_pct) : nlohmann::ordered_json();
    j["baseline"] = r.baseline;
    j["exposed_comm_ms"] = r.exposed_comm_ms, j["compute_ms"] = r.compute_ms;
    for (int k = 0; k < kNumCollKinds; ++k) {
      counts[coll_kind_name(CollKind(k))] = r.counts[size_t(k)];
      bytes[coll_kind_name(CollKind(k))] = r.bytes[size_t(k)];
    }
    j["collectives"] = counts, j["bytes"] = bytes, j["iters"] = r.iters;
    if (r.probe_before_ms > 0) {
      j["speed_probe_ms"] = (r.probe_before_ms + r.probe_after_ms) / 2;
      j["speed_probe_before_ms"] = r.probe_before_ms, j["speed_probe_after_ms"] = r.probe_after_ms;
    }
    rows.push_back(std::move(j));
  }
  nlohmann::ordered_json doc;
  doc["isa"] = isa_name(active_isa());  // the level every rank agreed on (MpiComm)
  doc["dist_results"] = std::move(rows);
  doc["skipped"] = std::move(skipped);
  return doc.dump(2) + "\n";
}

}  // namespace moe::bench
