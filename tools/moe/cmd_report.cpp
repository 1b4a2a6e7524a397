// moe report METRICS [--out FILE.svg]: draws a metrics file (JSON lines from
// `moe train`) as an SVG: loss (log y) and per-layer expert load over steps.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "io/atomic_file.h"
#include "train/report.h"

namespace moe::cli {
namespace {

struct ReportArgs {
  std::string metrics, out;
};

void run_report(const ReportArgs& a) {
  const train::MetricsSeries s = train::read_metrics(a.metrics);
  const std::string out =
      a.out.empty() ? std::filesystem::path(a.metrics).replace_extension(".svg").string() : a.out;
  write_file_atomic(out, train::render_report_svg(s, "moe train: " + a.metrics));
  std::printf("moe report: %zu steps -> %s\n", s.step.size(), out.c_str());
}

}  // namespace

void add_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* c = app.add_subcommand("report", "Draw a metrics file (JSON lines from moe train) as an SVG");
  c->add_option("METRICS", a->metrics, "metrics file (metrics_file of moe train)")->required();
  c->add_option("--out", a->out, "SVG file to write (default: METRICS with the extension .svg)");
  c->callback([a] { run_report(*a); });
}

}  // namespace moe::cli
