#include "plan/cluster.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include "moe/error.h"

namespace moe::plan {
namespace {

// Splits "12.5Gbit" into (12.5, "Gbit"); the number must be finite and > 0 (>= 0 when zero_ok).
std::pair<double, std::string> number_unit(const std::string& item, const std::string& value,
                                           const char* expected, bool zero_ok) {
  const char* s = value.c_str();
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !std::isfinite(v) || v < 0 || (v == 0 && !zero_ok))
    fail("--cluster: ", item, "=", value, ": expected ", zero_ok ? "a number >= 0" : "a positive number",
         " with a unit (", expected, ")");
  return {v, std::string(end)};
}

int positive_int(const std::string& item, const std::string& value) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 1 || v > (1 << 24))
    fail("--cluster: ", item, "=", value, ": expected a positive integer");
  return int(v);
}

}  // namespace

double parse_bandwidth(const std::string& item, const std::string& value) {
  static const char* kUnits = "Gbit, Mbit, Kbit, bit, GB, MB, KB or B, per second";
  auto [v, unit] = number_unit(item, value, kUnits, false);
  if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0) unit.resize(unit.size() - 2);
  static const std::vector<std::pair<const char*, double>> table = {
      {"Gbit", 1e9 / 8}, {"Mbit", 1e6 / 8}, {"Kbit", 1e3 / 8}, {"bit", 1.0 / 8},
      {"GB", 1e9},       {"MB", 1e6},       {"KB", 1e3},       {"B", 1.0}};
  for (const auto& [name, scale] : table)
    if (unit == name) return v * scale;
  fail("--cluster: ", item, "=", value, ": unknown unit '", unit, "' (expected ", kUnits, ")");
}

double parse_duration(const std::string& item, const std::string& value) {
  static const char* kUnits = "s, ms, us or ns";
  auto [v, unit] = number_unit(item, value, kUnits, true);
  static const std::vector<std::pair<const char*, double>> table = {
      {"s", 1}, {"ms", 1e-3}, {"us", 1e-6}, {"ns", 1e-9}};
  for (const auto& [name, scale] : table)
    if (unit == name) return v * scale;
  fail("--cluster: ", item, "=", value, ": unknown unit '", unit, "' (expected ", kUnits, ")");
}

Cluster parse_cluster(const std::string& spec) {
  Cluster c;
  bool inter_bw = false;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      fail("--cluster: item '", item,
           "': expected key=value (hosts, cores, ranks_per_host, threads, inter_bw, ",
           "inter_lat, inter_a2a_bw, intra_bw, intra_lat, sync)");
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "hosts")
      c.hosts = positive_int(key, value);
    else if (key == "cores")
      c.cores = number_unit(key, value, "none", false).first;
    else if (key == "ranks_per_host")
      c.ranks_per_host = positive_int(key, value);
    else if (key == "threads")
      c.threads = positive_int(key, value);
    else if (key == "inter_bw")
      c.inter.bw_Bps = parse_bandwidth(key, value), inter_bw = true;
    else if (key == "inter_lat")
      c.inter.lat_s = parse_duration(key, value);
    else if (key == "inter_a2a_bw")
      c.inter.a2a_bw_Bps = parse_bandwidth(key, value);
    else if (key == "intra_bw")
      c.intra.bw_Bps = parse_bandwidth(key, value);
    else if (key == "intra_lat")
      c.intra.lat_s = parse_duration(key, value);
    else if (key == "sync")
      c.intra.sync_s = parse_duration(key, value), c.sync_given = true;
    else
      fail("--cluster: unknown item '", key,
           "' (expected hosts, cores, ranks_per_host, threads, inter_bw, inter_lat, ",
           "inter_a2a_bw, intra_bw, intra_lat, sync)");
  }
  if (c.hosts > 1 && !inter_bw)
    fail("--cluster: hosts=", c.hosts, " needs inter_bw (the link between hosts, e.g. 10Gbit)");
  if (c.inter.a2a_bw_Bps > 0 && !inter_bw)
    fail("--cluster: inter_a2a_bw needs inter_bw (the link's bandwidth for one stream per pair of hosts)");
  return c;
}

std::string format_cluster(const Cluster& c) {
  char b[256];
  std::snprintf(b, sizeof b,
                "%d host(s) x %d rank(s), %.3g cores per host (%.3g per rank); inter %.3g Gbit/s %.3g us, "
                "intra %.3g GB/s %.3g us",
                c.hosts, c.ranks_per_host, c.cores, c.cores_per_rank(), c.inter.bw_Bps * 8 / 1e9,
                c.inter.lat_s * 1e6, c.intra.bw_Bps / 1e9, c.intra.lat_s * 1e6);
  std::string out = b;
  if (c.inter.a2a_bw_Bps > 0) {
    std::snprintf(b, sizeof b, "; inter all-to-all %.3g Gbit/s", c.inter.a2a_bw_Bps * 8 / 1e9);
    out += b;
  }
  return out;
}

}  // namespace moe::plan
