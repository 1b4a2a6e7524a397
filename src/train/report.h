// `moe report`: the metrics file (JSON lines) drawn as a standalone SVG:
// the loss over steps (log-scale y) and, below it, each layer's expert load
// (max / mean tokens per expert) over steps.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace moe::train {

// The series the report draws, one entry per metrics line.
struct MetricsSeries {
  std::vector<double> step, loss;
  std::vector<std::vector<double>> balance;  // [layer][line]: max / mean tokens per expert
};

// Reads `path`. Errors name the file and the 1-based line number: a missing
// file, a line that is not a JSON object, a missing or non-numeric `step` or
// `loss`, a `load` that is not a list of {max, mean}, layers changing count,
// or no lines at all.
MetricsSeries read_metrics(const std::string& path);
// The same from a stream; `path` names it in messages.
MetricsSeries read_metrics(std::istream& in, const std::string& path);

// The SVG document for `s` (REQUIRES: at least one line). Every series is a
// <polyline> with one point per metrics line.
std::string render_report_svg(const MetricsSeries& s, const std::string& title);

}  // namespace moe::train
