#include "check/report.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace moe::check {
namespace {

std::string line(const char* fmt, const char* name, int ranks, const char* loss, const char* grads,
                 const char* err) {
  char b[160];
  std::snprintf(b, sizeof b, fmt, name, ranks, loss, grads, err);
  return b;
}

}  // namespace

std::string format_table_header() {
  char b[200];
  std::snprintf(b, sizeof b, "%-22s %5s  %-9s  %-5s  %-13s %4s %4s %4s %4s %4s  %s\n", "variant", "ranks",
                "loss", "grads", "worst rel err", "AR", "AG", "A2A", "RS", "SO", "verdict");
  return b;
}

std::string format_table_row(const VariantReport& r) {
  char grads[16], err[32], counts[64];
  std::snprintf(grads, sizeof grads, "%d/%d", r.grads_bit_exact, r.grads_total);
  std::snprintf(err, sizeof err, "%.3e", r.worst_rel_err);
  std::string s;
  if (r.skipped) {
    s = line("%-22s %5d  %-9s  %-5s  %-13s", r.name.c_str(), r.ranks, "-", "-", "-");
    std::snprintf(counts, sizeof counts, " %4s %4s %4s %4s %4s", "-", "-", "-", "-", "-");
  } else {
    s = line("%-22s %5d  %-9s  %-5s  %-13s", r.name.c_str(), r.ranks,
             r.loss_bit_exact ? "bit-exact" : "DIFFERS", grads, err);
    const auto& c = r.counts;
    std::snprintf(counts, sizeof counts, " %4lld %4lld %4lld %4lld %4lld", (long long)c[0], (long long)c[1],
                  (long long)c[2], (long long)c[3], (long long)c[4]);
  }
  s += counts;
  s += std::string("  ") + r.verdict() + "\n";
  if (!r.note.empty()) s += "    " + std::string(r.skipped ? "skipped: " : "missed: ") + r.note + "\n";
  return s;
}

std::string reports_json(const std::vector<VariantReport>& reports) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const VariantReport& r : reports) {
    nlohmann::ordered_json j, c;
    for (int k = 0; k < kNumCollKinds; ++k) c[coll_kind_name(CollKind(k))] = r.counts[size_t(k)];
    j["name"] = r.name;
    j["ranks"] = r.ranks;
    j["loss_bit_exact"] = r.loss_bit_exact;
    j["grads_bit_exact"] = r.grads_bit_exact;
    j["grads_total"] = r.grads_total;
    j["worst_rel_err"] = r.worst_rel_err;
    j["collectives"] = c;
    j["requirement"] = r.requirement;
    j["verdict"] = r.verdict();
    j["skipped"] = r.skipped;
    j["note"] = r.note;
    j["loss"] = r.loss;
    rows.push_back(j);
  }
  nlohmann::ordered_json out;
  out["variants"] = rows;
  return out.dump(2) + "\n";
}

}  // namespace moe::check
