#include "plan/rates.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/error.h"

namespace moe::plan {

namespace {
// Keeps the points nearest by log distance of key(point) to `want` (every point at that distance).
template <class Key>
void keep_nearest(std::vector<GemmPoint>& pts, double want, Key key) {
  auto dist = [&](const GemmPoint& p) { return std::fabs(std::log(key(p) / want)); };
  double nearest = 1e300;
  for (const GemmPoint& p : pts) nearest = std::min(nearest, dist(p));
  std::erase_if(pts, [&](const GemmPoint& p) { return dist(p) > nearest + 1e-9; });
}
}  // namespace

GemmPoint Rates::ffn_at(DType dtype, int64_t D, int64_t F, double rows_per_expert, int64_t experts) const {
  if (gemm.empty()) fail("plan rates: no \"gemm\" points (run moe plan --calibrate)");
  bool any_same = false;
  for (const GemmPoint& p : gemm) any_same |= p.dtype == dtype;
  std::vector<GemmPoint> pts;
  for (const GemmPoint& p : gemm)
    if (p.dtype == dtype || !any_same) pts.push_back(p);
  // The nearest size D·F among the points of the dtype.
  keep_nearest(pts, double(D * F), [](const GemmPoint& p) { return double(p.D * p.F); });
  // Then the nearest expert count, where the query and the points name one: the calibration's
  // shapes can share D·F (E = 8 and E = 128 at 1024 x 512) and at `amx_bf16` their rates at the
  // same rows per expert differ by 1.5x (the weights of 128 experts come from DRAM), so
  // interpolating over both shapes' points priced a rank with 4 experts at 32 rows each at the
  // 128-expert point (docs/distributed.md, out/v85).
  if (experts > 0 && std::all_of(pts.begin(), pts.end(), [](const GemmPoint& p) { return p.experts > 0; }))
    keep_nearest(pts, double(experts), [](const GemmPoint& p) { return double(p.experts); });
  std::sort(pts.begin(), pts.end(),
            [](const GemmPoint& a, const GemmPoint& b) { return a.rows_per_expert < b.rows_per_expert; });
  const double m = std::max(rows_per_expert, 1e-9);
  if (m <= pts.front().rows_per_expert) return pts.front();
  if (m >= pts.back().rows_per_expert) return pts.back();
  for (size_t i = 1; i < pts.size(); ++i) {
    const GemmPoint &a = pts[i - 1], &b = pts[i];
    if (m > b.rows_per_expert) continue;
    const double w = std::log(m / a.rows_per_expert) / std::log(b.rows_per_expert / a.rows_per_expert);
    GemmPoint r = a;
    r.rows_per_expert = m;
    r.ffn_gflops = a.ffn_gflops + w * (b.ffn_gflops - a.ffn_gflops);
    r.ffn_backward_gflops = a.ffn_backward_gflops + w * (b.ffn_backward_gflops - a.ffn_backward_gflops);
    r.weight_grads_gflops = a.weight_grads_gflops + w * (b.weight_grads_gflops - a.weight_grads_gflops);
    r.pool_speedup = a.pool_speedup > 0 && b.pool_speedup > 0 ? a.pool_speedup + w * (b.pool_speedup - a.pool_speedup)
                                                              : std::max(a.pool_speedup, b.pool_speedup);
    return r;
  }
  return pts.back();
}

double Rates::speed(double cores, int threads, const GemmPoint* at) const {
  const double c = std::min(cores, double(std::max(threads, 1)));
  if (c <= 1) return std::max(c, 1e-6);
  const double speedup = at && at->pool_speedup > 0 ? at->pool_speedup : pool_speedup;
  // Clamped to [0, 1] per extra thread: a speedup below 1 (measured on a loaded machine) adds nothing.
  const double per_thread = pool_threads > 1 ? std::clamp((speedup - 1) / (pool_threads - 1), 0.0, 1.0) : 1.0;
  return 1 + (c - 1) * per_thread;
}

double Contention::wait_after(double c) const {
  if (compute_s.empty()) return 0;
  if (c <= compute_s.front()) return wait_s.front();
  for (size_t i = 1; i < compute_s.size(); ++i)
    if (c <= compute_s[i])
      return wait_s[i - 1] +
             (c - compute_s[i - 1]) / (compute_s[i] - compute_s[i - 1]) * (wait_s[i] - wait_s[i - 1]);
  return wait_s.back();
}

namespace {
// f over the rows at ranks per core x: linear between rows, from 0 at x = 0, the last row beyond.
template <class F>
double over_rows(const std::vector<Contention>& rows, double x, F f, double at_zero = 0) {
  if (rows.empty() || x <= 0) return at_zero;
  double x0 = 0, y0 = at_zero;
  for (const Contention& row : rows) {
    const double y1 = f(row);
    if (x <= row.ranks_per_core) return y0 + (x - x0) / (row.ranks_per_core - x0) * (y1 - y0);
    x0 = row.ranks_per_core, y0 = y1;
  }
  return y0;
}
}  // namespace

double Rates::wait_at(double rpc, double c) const {
  return over_rows(contention, rpc, [&](const Contention& row) { return row.wait_after(c); });
}

double Rates::side_busy_at(double rpc) const {
  return over_rows(contention, rpc, [](const Contention& row) { return row.side_busy_s; });
}

double Rates::side_cpu_frac_at(double rpc) const {
  return over_rows(contention, rpc, [](const Contention& row) { return row.side_cpu_frac; });
}

double Rates::side_wait_frac_at(double rpc) const {
  return over_rows(contention, rpc, [](const Contention& row) { return row.side_wait_frac; });
}

double Contention::slowdown_at(double bytes) const {
  if (bytes <= 0 || small_weight_bytes <= 0 || weight_bytes <= small_weight_bytes) return compute_slowdown;
  const double t = std::clamp(std::log(bytes / small_weight_bytes) / std::log(weight_bytes / small_weight_bytes), 0.0, 1.0);
  return small_compute_slowdown + t * (compute_slowdown - small_compute_slowdown);
}

double Rates::compute_slowdown_at(double rpc, double weight_bytes) const {
  return over_rows(
      contention, rpc, [&](const Contention& row) { return row.slowdown_at(weight_bytes); }, 1.0);
}

namespace {
// A bandwidth of the contention rows that measured it (`field` > 0), by ranks per core; 0: none did.
double measured_bw_at(const std::vector<Contention>& contention, double rpc, double Contention::*field) {
  std::vector<Contention> rows;
  for (const Contention& c : contention)
    if (c.*field > 0) rows.push_back(c);
  if (rows.empty()) return 0;
  // From the first measured row's value at 0 ranks per core: flat up to that row.
  return over_rows(rows, rpc, [&](const Contention& row) { return row.*field; }, rows.front().*field);
}
}  // namespace

double Rates::ag_bw_at(double rpc) const { return measured_bw_at(contention, rpc, &Contention::ag_bw_Bps); }
double Rates::a2a_bw_at(double rpc) const { return measured_bw_at(contention, rpc, &Contention::a2a_bw_Bps); }

double Rates::ar_bw_at(double rpc, int ranks) const {
  std::vector<Contention> rows = contention;
  double first = 0;  // ranks per core of the first row that measured this group size
  for (Contention& c : rows) {
    c.ar_bw_Bps = c.ar_ranks == ranks ? c.ar_bw_Bps : ranks == 2 ? c.ar_pair_bw_Bps : 0;
    if (c.ar_bw_Bps > 0 && first == 0) first = c.ranks_per_core;
  }
  // A group measured only where ranks shared cores says nothing of fewer ranks per core.
  if (first > 1 && rpc < first) return 0;
  return measured_bw_at(rows, rpc, &Contention::ar_bw_Bps);
}

void Rates::set_contention(const Contention& c) {
  auto same = [&](const Contention& x) { return std::fabs(x.ranks_per_core - c.ranks_per_core) < 1e-9; };
  contention.erase(std::remove_if(contention.begin(), contention.end(), same), contention.end());
  contention.push_back(c);
  std::sort(contention.begin(), contention.end(),
            [](const Contention& a, const Contention& b) { return a.ranks_per_core < b.ranks_per_core; });
}

std::string rates_json(const Rates& r) {
  nlohmann::json j;
  j["format"] = "moe-plan-rates";
  j["version"] = 1;
  j["machine"] = r.machine;
  j["isa"] = r.isa;
  j["pool_threads"] = r.pool_threads;
  j["pool_speedup"] = r.pool_speedup;
  j["gemm"] = nlohmann::json::array();
  for (const GemmPoint& p : r.gemm) {
    j["gemm"].push_back({{"dtype", dtype_name(p.dtype)},
                         {"D", p.D},
                         {"F", p.F},
                         {"rows_per_expert", p.rows_per_expert},
                         {"ffn_gflops", p.ffn_gflops},
                         {"ffn_backward_gflops", p.ffn_backward_gflops},
                         {"weight_grads_gflops", p.weight_grads_gflops}});
    if (p.pool_speedup > 0) j["gemm"].back()["pool_speedup"] = p.pool_speedup;
    if (p.experts > 0) j["gemm"].back()["experts"] = p.experts;
  }
  j["router_gflops"] = r.router_gflops;
  j["router_backward_gflops"] = r.router_backward_gflops;
  j["sort_ns_per_row"] = r.sort_ns_per_row;
  j["permute_gbps"] = r.permute_gbps;
  j["combine_gbps"] = r.combine_gbps;
  j["combine_backward_gbps"] = r.combine_backward_gbps;
  j["permute_backward_gbps"] = r.permute_backward_gbps;
  j["memcpy_gbps"] = r.memcpy_gbps;
  j["intra"] = {{"bw_gbps", r.intra.bw_Bps / 1e9},
                {"lat_us", r.intra.lat_s * 1e6},
                {"sync_us", r.intra.sync_s * 1e6},
                {"measured", r.intra_measured}};
  j["side_op_overhead_us"] = r.side_op_overhead_us;
  j["comm_cpu_ns_per_byte"] = r.comm_cpu_ns_per_byte;
  if (r.probe_ms > 0) j["speed_probe_ms"] = r.probe_ms;
  j["contention"] = nlohmann::json::array();
  for (const Contention& c : r.contention) {
    nlohmann::json row = {{"ranks_per_core", c.ranks_per_core},
                          {"side_busy_us", c.side_busy_s * 1e6},
                          {"compute_slowdown", c.compute_slowdown},
                          {"side_cpu_frac", c.side_cpu_frac}};
    if (c.side_wait_frac > 0) row["side_wait_frac"] = c.side_wait_frac;
    if (c.ag_bw_Bps > 0) row["ag_bw_gbps"] = c.ag_bw_Bps / 1e9;
    if (c.a2a_bw_Bps > 0) row["a2a_bw_gbps"] = c.a2a_bw_Bps / 1e9;
    if (c.ar_bw_Bps > 0) row["ar_bw_gbps"] = c.ar_bw_Bps / 1e9, row["ar_ranks"] = c.ar_ranks;
    if (c.ar_pair_bw_Bps > 0) row["ar_pair_bw_gbps"] = c.ar_pair_bw_Bps / 1e9;
    if (c.small_weight_bytes > 0 && c.weight_bytes > 0) {
      row["weight_mb"] = c.weight_bytes / 1e6, row["small_weight_mb"] = c.small_weight_bytes / 1e6;
      row["small_compute_slowdown"] = c.small_compute_slowdown;
    }
    row["compute_us"] = nlohmann::json::array();
    row["wait_us"] = nlohmann::json::array();
    for (size_t i = 0; i < c.compute_s.size(); ++i)
      row["compute_us"].push_back(c.compute_s[i] * 1e6), row["wait_us"].push_back(c.wait_s[i] * 1e6);
    j["contention"].push_back(row);
  }
  return j.dump(2) + "\n";
}

namespace {

double positive(const nlohmann::json& j, const char* key, const std::string& where, bool zero_ok = false) {
  if (!j.contains(key)) fail(where, ": missing field '", key, "'");
  if (!j[key].is_number()) fail(where, ": field '", key, "' must be a number");
  const double v = j[key].get<double>();
  if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok))
    fail(where, ": field '", key, "' must be ", zero_ok ? ">= 0" : "> 0", " (got ", v, ")");
  return v;
}

GemmPoint parse_point(const nlohmann::json& p, const std::string& where) {
  if (!p.is_object()) fail(where, ": expected an object");
  GemmPoint g;
  if (!p.contains("dtype") || !p["dtype"].is_string())
    fail(where, ": field 'dtype' must be \"bf16\" or \"f32\"");
  const std::string dt = p["dtype"].get<std::string>();
  if (dt != "bf16" && dt != "f32")
    fail(where, ": field 'dtype' must be \"bf16\" or \"f32\" (got \"", dt, "\")");
  g.dtype = dt == "bf16" ? DType::bf16 : DType::f32;
  g.D = int64_t(positive(p, "D", where));
  g.F = int64_t(positive(p, "F", where));
  g.rows_per_expert = positive(p, "rows_per_expert", where);
  g.experts = p.contains("experts") ? int64_t(positive(p, "experts", where)) : 0;  // optional (older files)
  g.ffn_gflops = positive(p, "ffn_gflops", where);
  g.ffn_backward_gflops = positive(p, "ffn_backward_gflops", where);
  g.weight_grads_gflops = positive(p, "weight_grads_gflops", where);
  g.pool_speedup = p.contains("pool_speedup") ? positive(p, "pool_speedup", where) : 0.0;  // optional
  return g;
}

}  // namespace

Rates parse_rates(const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) fail(where, ": not a JSON object (expected a moe plan rates file)");
  if (j.value("format", "") != "moe-plan-rates") fail(where, ": field 'format' must be \"moe-plan-rates\"");
  if (j.value("version", 0) != 1) fail(where, ": field 'version' must be 1");
  Rates r;
  r.machine = j.value("machine", "");
  r.isa = j.value("isa", "");
  r.pool_threads = int(positive(j, "pool_threads", where));
  r.pool_speedup = positive(j, "pool_speedup", where);
  if (!j.contains("gemm") || !j["gemm"].is_array() || j["gemm"].empty())
    fail(where, ": field 'gemm' must be a non-empty list of points");
  for (size_t i = 0; i < j["gemm"].size(); ++i)
    r.gemm.push_back(parse_point(j["gemm"][i], where + ": gemm[" + std::to_string(i) + "]"));
  r.router_gflops = positive(j, "router_gflops", where);
  r.router_backward_gflops = positive(j, "router_backward_gflops", where);
  r.sort_ns_per_row = positive(j, "sort_ns_per_row", where);
  r.permute_gbps = positive(j, "permute_gbps", where);
  r.combine_gbps = positive(j, "combine_gbps", where);
  r.combine_backward_gbps = positive(j, "combine_backward_gbps", where);
  r.permute_backward_gbps = positive(j, "permute_backward_gbps", where);
  r.memcpy_gbps = positive(j, "memcpy_gbps", where);
  if (!j.contains("intra") || !j["intra"].is_object())
    fail(where, ": field 'intra' must be an object {bw_gbps, lat_us, measured}");
  r.intra.bw_Bps = positive(j["intra"], "bw_gbps", where + ": intra") * 1e9;
  r.intra.lat_s = positive(j["intra"], "lat_us", where + ": intra", true) * 1e-6;
  r.intra.sync_s =
      j["intra"].contains("sync_us") ? positive(j["intra"], "sync_us", where + ": intra", true) * 1e-6 : 0;
  r.intra_measured = j["intra"].value("measured", false);
  r.side_op_overhead_us = positive(j, "side_op_overhead_us", where, true);
  r.comm_cpu_ns_per_byte = positive(j, "comm_cpu_ns_per_byte", where, true);
  r.probe_ms = j.contains("speed_probe_ms") ? positive(j, "speed_probe_ms", where) : 0.0;  // optional
  if (j.contains("contention")) {  // optional: files written before it have no contention terms
    if (!j["contention"].is_array()) fail(where, ": field 'contention' must be a list of rows");
    for (size_t i = 0; i < j["contention"].size(); ++i) {
      const nlohmann::json& c = j["contention"][i];
      const std::string at = where + ": contention[" + std::to_string(i) + "]";
      if (!c.is_object()) fail(at, ": expected an object");
      Contention row;
      row.ranks_per_core = positive(c, "ranks_per_core", at);
      row.side_busy_s = positive(c, "side_busy_us", at, true) * 1e-6;
      row.compute_slowdown = c.contains("compute_slowdown") ? positive(c, "compute_slowdown", at) : 1.0;
      row.side_cpu_frac = c.contains("side_cpu_frac") ? positive(c, "side_cpu_frac", at, true) : 0.0;
      if (row.side_cpu_frac > 1) fail(at, ": 'side_cpu_frac' must be in [0, 1], got ", row.side_cpu_frac);
      row.side_wait_frac = c.contains("side_wait_frac") ? positive(c, "side_wait_frac", at, true) : 0.0;  // optional
      if (row.side_wait_frac > 3) fail(at, ": 'side_wait_frac' must be in [0, 3], got ", row.side_wait_frac);
      row.ag_bw_Bps = c.contains("ag_bw_gbps") ? positive(c, "ag_bw_gbps", at) * 1e9 : 0.0;     // optional
      row.a2a_bw_Bps = c.contains("a2a_bw_gbps") ? positive(c, "a2a_bw_gbps", at) * 1e9 : 0.0;  // optional
      if (c.contains("ar_bw_gbps")) {  // optional, with the group it measured
        row.ar_bw_Bps = positive(c, "ar_bw_gbps", at) * 1e9;
        const double ranks = positive(c, "ar_ranks", at);
        if (ranks < 2 || ranks != std::floor(ranks))
          fail(at, ": 'ar_ranks' must be a whole number >= 2, got ", ranks);
        row.ar_ranks = int(ranks);
      }
      row.ar_pair_bw_Bps =
          c.contains("ar_pair_bw_gbps") ? positive(c, "ar_pair_bw_gbps", at) * 1e9 : 0.0;  // optional
      if (c.contains("small_weight_mb")) {  // optional: the slowdown of smaller weights
        row.weight_bytes = positive(c, "weight_mb", at) * 1e6;
        row.small_weight_bytes = positive(c, "small_weight_mb", at) * 1e6;
        row.small_compute_slowdown = positive(c, "small_compute_slowdown", at);
        if (row.small_weight_bytes >= row.weight_bytes)
          fail(at, ": 'small_weight_mb' must be below 'weight_mb' (got ", row.small_weight_bytes / 1e6, " and ",
               row.weight_bytes / 1e6, ")");
      }
      for (const char* key : {"compute_us", "wait_us"})
        if (!c.contains(key) || !c[key].is_array() || c[key].size() != c["compute_us"].size())
          fail(at, ": fields 'compute_us' and 'wait_us' must be lists of the same length");
      for (size_t k = 0; k < c["compute_us"].size(); ++k) {
        const nlohmann::json pt = {{"compute_us", c["compute_us"][k]}, {"wait_us", c["wait_us"][k]}};
        const std::string ak = at + ": point " + std::to_string(k);
        row.compute_s.push_back(positive(pt, "compute_us", ak, true) * 1e-6);
        row.wait_s.push_back(positive(pt, "wait_us", ak, true) * 1e-6);
        if (k > 0 && row.compute_s[k] <= row.compute_s[k - 1]) fail(ak, ": 'compute_us' must ascend");
      }
      r.set_contention(row);
    }
  }
  return r;
}

Rates read_rates(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--rates ", path, ": cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_rates(ss.str(), path);
}

}  // namespace moe::plan
