// Text table and JSON (SPEC.md §7) of `moe bench` results.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/harness.h"
#include "moe/isa.h"

namespace moe::bench {
namespace {
constexpr const char* kRowFormat =
    "%-18s %-9s %-5s %-8s %-5s %10s %10s %10s %9s %9s %6s %9s %9s %9s %9s %9s %9s %6s\n";
constexpr double kMiB = 1024.0 * 1024.0;

nlohmann::ordered_json isa_names(const std::vector<Isa>& levels) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (Isa i : levels) a.push_back(isa_name(i));
  return a;
}
}  // namespace

std::string format_setup_line(const DenseBaseline& dense) {
  return std::string("kernel level: ") + isa_name(active_isa()) +
         " (available: " + isa_list(isa_available()) + "); dense baseline: " + dense_baseline_name(dense) +
         " (" + dense.why + ")\n";
}

std::string format_table_header() {
  char buf[512];
  std::snprintf(buf, sizeof buf, kRowFormat, "case", "variant", "dtype", "pass", "check", "median_ms",
                "min_ms", "max_ms", "GFLOP/s", "dense", "frac", "alloc_MiB", "rss_MiB", "perm_GB/s",
                "comb_GB/s", "step_MiB", "min_MiB", "x_min");
  return buf;
}

std::string format_table_row(const BenchResult& r) {
  auto num = [](double v, int prec) {
    char b[32];
    std::snprintf(b, sizeof b, "%.*f", prec, v);
    return std::string(b);
  };
  char buf[512];
  std::snprintf(buf, sizeof buf, kRowFormat, r.case_name.c_str(), r.variant.c_str(), r.dtype.c_str(),
                r.pass.c_str(), r.check.c_str(), num(r.median_ms, 3).c_str(), num(r.min_ms, 3).c_str(),
                num(r.max_ms, 3).c_str(), num(r.gflops, 2).c_str(), num(r.dense_gflops, 2).c_str(),
                num(r.fraction_of_dense, 2).c_str(), num(r.peak_alloc_mib, 1).c_str(),
                num(r.peak_rss_mib, 0).c_str(), num(r.permute_gbps, 2).c_str(),
                num(r.combine_gbps, 2).c_str(), num(r.step_peak_mib, 1).c_str(),
                r.minimum.total() > 0 ? num(double(r.minimum.total() / kMiB), 1).c_str() : "-",
                r.minimum.total() > 0 ? num(r.peak_over_minimum, 2).c_str() : "-");
  std::string s = buf;
  if (r.minimum.total() > 0) s += "  minimum: " + r.minimum.describe() + "\n";
  if (!r.check_detail.empty()) s += "  FAIL: " + r.check_detail + "\n";
  return s;
}

// Field order: the SPEC.md §7 fields first, then the extras.
std::string results_json(const std::vector<BenchResult>& results) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const BenchResult& r : results) {
    nlohmann::ordered_json j;
    j["case"] = r.case_name, j["variant"] = r.variant, j["dtype"] = r.dtype, j["pass"] = r.pass;
    j["median_ms"] = r.median_ms, j["min_ms"] = r.min_ms, j["max_ms"] = r.max_ms;
    j["gflops"] = r.gflops, j["dense_gflops"] = r.dense_gflops, j["fraction_of_dense"] = r.fraction_of_dense;
    j["peak_rss_mib"] = r.peak_rss_mib;
    j["dense_dtype"] = dtype_name(r.dense.dtype), j["dense_impl"] = r.dense.impl;
    j["check"] = r.check;
    if (!r.check_detail.empty()) j["check_detail"] = r.check_detail;
    j["peak_alloc_mib"] = r.peak_alloc_mib;
    j["step_peak_mib"] = r.step_peak_mib;
    if (r.minimum.total() > 0) {
      const StepMinimum& m = r.minimum;
      j["minimum_mib"] = {
          {"weights", double(m.weights / kMiB)},     {"weight_copies", double(m.weight_copies / kMiB)},
          {"gradients", double(m.gradients / kMiB)}, {"saved", double(m.saved / kMiB)},
          {"io", double(m.step_io / kMiB)},          {"comm", double(m.comm / kMiB)},
          {"total", double(m.total() / kMiB)}};
      j["peak_over_minimum"] = r.peak_over_minimum;
    }
    j["retimed"] = r.retimed, j["dense_slow_phase"] = r.dense_slow_phase;
    j["flops"] = r.flops, j["iters"] = r.iters;
    j["shape"] = {{"T", r.T}, {"D", r.D}, {"F", r.F}, {"E", r.E}, {"K", r.K}};
    j["permute_gbps"] = r.permute_gbps, j["combine_gbps"] = r.combine_gbps, j["memcpy_gbps"] = r.memcpy_gbps;
    j["permute_fraction_of_memcpy"] = r.permute_fraction_of_memcpy;
    j["combine_fraction_of_memcpy"] = r.combine_fraction_of_memcpy;
    rows.push_back(std::move(j));
  }
  nlohmann::ordered_json doc;
  doc["isa"] = isa_name(active_isa());
  doc["isa_available"] = isa_names(isa_available());
  if (!results.empty()) {
    const DenseBaseline& d = results.front().dense;
    doc["dense_baseline"] = {
        {"impl", d.impl}, {"dtype", dtype_name(d.dtype)}, {"why", d.why}, {"kernel", d.kernel}};
  }
  doc["results"] = std::move(rows);
  return doc.dump(2) + "\n";
}

}  // namespace moe::bench
