#include "plan/ranking.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace moe::plan {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f ms", s * 1e3);
  return b;
}

int targets(const Layout& l) { return int(l.off_fsdp) + int(l.off_ep) + int(l.off_sort); }

}  // namespace

std::vector<Layout> candidate_layouts(const LayerShape& L, const Cluster& cl) {
  std::vector<Layout> out;
  const int W = cl.ranks();
  for (int e : divisors(W)) {
    if (L.E % e) continue;
    for (int f : divisors(W / e)) {
      if (L.D % f) continue;
      for (int chunks : {1, 4}) {
        if (chunks > L.T) continue;
        for (bool ring : {false, true}) {
          if (ring && e == 1) continue;
          for (int off = 0; off < 4; ++off) {  // none, ep, fsdp, all
            Layout l;
            l.data = W / (e * f), l.fsdp = f, l.expert = e, l.chunks = chunks, l.ring = ring;
            l.off_ep = off == 1 || off == 3;
            l.off_fsdp = off == 2 || off == 3;
            l.off_sort = off == 3;
            if ((l.off_ep && off != 3 && e == 1) || (l.off_fsdp && off != 3 && f == 1)) continue;
            if (off == 3 && e == 1 && f == 1) continue;
            const bool spans = make_group(e, 1, cl.ranks_per_host).hosts() > 1;
            for (A2AAlgo a : {A2AAlgo::flat, A2AAlgo::hierarchical}) {
              if (a == A2AAlgo::hierarchical && (!spans || ring)) continue;
              l.a2a = a;
              if (check_layout(L, l, cl).empty()) out.push_back(l);
            }
          }
        }
      }
    }
  }
  return out;
}

std::vector<Prediction> rank_layouts(const LayerShape& L, const Cluster& cl, const Rates& r,
                                     const std::vector<Layout>& candidates, const ModelOptions& o) {
  std::vector<Prediction> out;
  for (const Layout& l : candidates) {
    out.push_back(predict_step(L, l, cl, r, o));
    out.back().ops.clear();
  }
  std::stable_sort(out.begin(), out.end(), [](const Prediction& a, const Prediction& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    if (targets(a.layout) != targets(b.layout)) return targets(a.layout) < targets(b.layout);
    return a.layout.name() < b.layout.name();
  });
  return out;
}

std::vector<std::pair<std::string, double>> dominant_terms(const Prediction& p, size_t n) {
  std::vector<std::pair<std::string, double>> t;
  static const std::vector<std::string> comm = {"AG:weights", "AG:aux_stats", "AG:counts",    "A2A",
                                                "AG:ring",    "RS:ring",      "grad:experts", "AR:router"};
  for (const auto& [k, v] : p.terms)
    if (std::find(comm.begin(), comm.end(), k) == comm.end()) t.push_back({k, v});
  for (const auto& [k, v] : p.exposed) t.push_back({"exposed " + k, v});
  std::sort(t.begin(), t.end(), [](auto& a, auto& b) { return a.second > b.second; });
  if (t.size() > n) t.resize(n);
  return t;
}

std::string explain_winner(const std::vector<Prediction>& ranked) {
  if (ranked.empty()) return "no layout fits (see the reasons above)\n";
  const Prediction& w = ranked[0];
  std::string s = "why " + w.layout.name() + " wins: step " + ms(w.step_s) + " = compute " + ms(w.compute_s) +
                  " + exposed communication " + ms(w.exposed_comm_s) + " (of " + ms(w.comm_s) +
                  " in collectives)\n";
  s += "  dominant terms:";
  for (const auto& [k, v] : dominant_terms(w, 4)) s += " " + k + " " + ms(v) + ";";
  s += "\n";
  if (w.others_busy < 1) {
    char b[200];
    std::snprintf(b, sizeof b,
                  "  ranks sharing a core: the others on it busy %.0f%% of the step, so a rank computes at %.2f of a "
                  "core (time slices: all of them busy)\n",
                  100 * w.others_busy, w.compute_cores);
    s += b;
  }
  if (ranked.size() < 2) return s;
  const Prediction& r = ranked[1];
  s += "  against the runner-up " + r.layout.name() + " (" + ms(r.step_s) + "):";
  // The terms where the runner-up spends the most more than the winner (critical-path terms).
  std::vector<std::pair<std::string, double>> diff;
  auto all = [](const Prediction& p) {
    std::map<std::string, double> m;
    for (const auto& [k, v] : dominant_terms(p, 99)) m[k] = v;
    return m;
  };
  auto a = all(w), b = all(r);
  for (const auto& [k, v] : b) diff.push_back({k, v - (a.count(k) ? a[k] : 0)});
  for (const auto& [k, v] : a)
    if (!b.count(k)) diff.push_back({k, -v});
  std::sort(diff.begin(), diff.end(),
            [](auto& x, auto& y) { return std::abs(x.second) > std::abs(y.second); });
  for (size_t i = 0; i < std::min<size_t>(3, diff.size()); ++i)
    s += " " + diff[i].first + " " + (diff[i].second >= 0 ? "+" : "") + ms(diff[i].second) + ";";
  s += "\n";
  return s;
}

std::string format_prediction(const Prediction& p) {
  char b[256];
  std::snprintf(b, sizeof b, "%-48s %10.2f %10.2f %10.2f %10.2f\n", p.layout.name().c_str(), p.step_s * 1e3,
                p.compute_s * 1e3, p.exposed_comm_s * 1e3, p.comm_s * 1e3);
  return b;
}

std::string prediction_json(const Prediction& p, bool with_ops) {
  nlohmann::json j;
  const Layout& l = p.layout;
  j["layout"] = {{"name", l.name()},
                 {"data_parallelism", l.data},
                 {"fsdp_parallelism", l.fsdp},
                 {"expert_parallelism", l.expert},
                 {"num_moe_token_chunks", l.chunks},
                 {"use_ring_of_experts", l.ring},
                 {"moe_offload_targets", l.offload_text()},
                 {"all_to_all", a2a_algo_name(l.a2a)}};
  j["step_ms"] = p.step_s * 1e3;
  j["compute_ms"] = p.compute_s * 1e3;
  j["exposed_comm_ms"] = p.exposed_comm_s * 1e3;
  j["comm_ms"] = p.comm_s * 1e3;
  j["side_busy_ms"] = p.side_busy_s * 1e3;
  j["cpu_ms"] = p.cpu_s * 1e3;
  j["others_busy"] = p.others_busy;
  j["compute_cores"] = p.compute_cores;
  for (const auto& [k, v] : p.terms) j["terms_ms"][k] = v * 1e3;
  j["exposed_ms"] = nlohmann::json::object();
  for (const auto& [k, v] : p.exposed) j["exposed_ms"][k] = v * 1e3;
  if (with_ops) {
    j["ops"] = nlohmann::json::array();
    for (const SimOp& o : p.ops)
      j["ops"].push_back({{"name", o.name},
                          {"engine", o.side ? "side" : "compute"},
                          {"comm", o.comm},
                          {"start_ms", o.start * 1e3},
                          {"end_ms", o.end * 1e3}});
  }
  return j.dump();
}

std::vector<SweepRow> sweep(const std::vector<LayerShape>& layers, const Rates& r, const SweepOptions& o) {
  std::vector<SweepRow> rows;
  for (const LayerShape& L : layers)
    for (size_t li = 0; li < o.inter_gbit.size(); ++li) {
      double prev = 0;
      bool stopped = false;
      for (int h : o.hosts) {
        Cluster cl;
        cl.hosts = h, cl.cores = o.cores, cl.ranks_per_host = o.ranks_per_host;
        cl.inter.bw_Bps = o.inter_gbit[li] * 1e9 / 8;
        cl.inter.lat_s = o.inter_lat_us[std::min(li, o.inter_lat_us.size() - 1)] * 1e-6;
        std::vector<Prediction> ranked = rank_layouts(L, cl, r, candidate_layouts(L, cl));
        if (ranked.empty()) continue;
        SweepRow row;
        row.layer = L.name, row.hosts = h, row.inter_gbit = o.inter_gbit[li], row.best = ranked[0];
        row.tokens_per_s = double(cl.ranks()) * double(L.T) / row.best.step_s;
        row.gain = prev > 0 ? row.tokens_per_s / prev : 0;
        if (prev > 0 && !stopped && row.gain < 1.5) row.stops_paying = stopped = true;
        prev = row.tokens_per_s;
        rows.push_back(row);
      }
    }
  return rows;
}

std::string format_sweep(const std::vector<SweepRow>& rows) {
  std::string s =
      "| layer | hosts | link Gbit/s | step ms | exposed comm ms | compute ms | layout picked | Mtokens/s | "
      "gain vs half the hosts |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  for (const SweepRow& r : rows) {
    char b[512];
    std::snprintf(b, sizeof b, "| %s | %d | %.0f | %.1f | %.1f | %.1f | %s | %.2f | %s%s |\n",
                  r.layer.c_str(), r.hosts, r.inter_gbit, r.best.step_s * 1e3, r.best.exposed_comm_s * 1e3,
                  r.best.compute_s * 1e3, r.best.layout.name().c_str(), r.tokens_per_s / 1e6,
                  r.gain > 0 ? (std::to_string(r.gain).substr(0, 4) + "x").c_str() : "—",
                  r.stops_paying ? " **stops paying**" : "");
    s += b;
  }
  return s;
}

}  // namespace moe::plan
