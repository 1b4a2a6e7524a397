// Drawing the report: hand-written SVG (no dependencies), two panels sharing
// the step axis.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "moe/error.h"
#include "train/report.h"

namespace moe::train {
namespace {

constexpr double kWidth = 900, kLeft = 90, kRight = 30, kPanelH = 280;
const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                               "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};

// A value axis: maps [lo, hi] (log10 space when log) onto a pixel range.
struct Axis {
  double lo, hi;
  bool log;
  double px_lo, px_hi;  // pixel positions of lo and hi
  double operator()(double v) const {
    const double a = log ? std::log10(lo) : lo, b = log ? std::log10(hi) : hi;
    const double x = log ? std::log10(std::max(v, lo)) : v;
    return px_lo + (b > a ? (x - a) / (b - a) : 0.5) * (px_hi - px_lo);
  }
};

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : c == '"' ? "&quot;" : std::string(1, c);
  return o;
}

// About five round tick values covering [lo, hi] (none when the range is not finite). Counted by
// index: at 1e17, v + step == v (fuzz/metrics/corpus/crash-step_1e17_endless_ticks looped forever).
std::vector<double> linear_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5, mag = std::pow(10.0, std::floor(std::log10(raw > 0 ? raw : 1)));
  const double step = raw / mag < 2 ? 2 * mag : raw / mag < 5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  if (!std::isfinite(step) || !(step > 0)) return t;
  const double first = std::ceil(lo / step);
  for (int i = 0; i < 12; ++i) {
    const double v = (first + i) * step;
    if (!(v <= hi + 1e-9 * step)) break;
    if (t.empty() || v > t.back()) t.push_back(v);
  }
  return t;
}

// Powers of ten in [lo, hi], with 2 and 5 multiples when the range spans under two decades.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> t;
  const bool fine = std::log10(hi / lo) < 2;
  for (int e = int(std::floor(std::log10(lo))); e <= int(std::ceil(std::log10(hi))); ++e)
    for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
    }
  return t;
}

void frame(std::ostream& o, const Axis& x, const Axis& y, const std::string& title,
           const std::string& ylabel) {
  o << "<rect x='" << kLeft << "' y='" << y.px_hi << "' width='" << (x.px_hi - x.px_lo) << "' height='"
    << (y.px_lo - y.px_hi) << "' fill='none' stroke='#444'/>\n";
  o << "<text x='" << kLeft << "' y='" << y.px_hi - 10 << "' font-size='15' font-weight='bold'>" << title
    << "</text>\n";
  for (double v : y.log ? log_ticks(y.lo, y.hi) : linear_ticks(y.lo, y.hi))
    o << "<line x1='" << kLeft - 5 << "' x2='" << x.px_hi << "' y1='" << y(v) << "' y2='" << y(v)
      << "' stroke='#ddd'/><text x='" << kLeft - 8 << "' y='" << y(v) + 4
      << "' font-size='11' text-anchor='end'>" << fmt(v) << "</text>\n";
  for (double v : linear_ticks(x.lo, x.hi))
    o << "<line x1='" << x(v) << "' x2='" << x(v) << "' y1='" << y.px_lo << "' y2='" << y.px_lo + 5
      << "' stroke='#444'/><text x='" << x(v) << "' y='" << y.px_lo + 18
      << "' font-size='11' text-anchor='middle'>" << fmt(v) << "</text>\n";
  o << "<text x='" << (x.px_lo + x.px_hi) / 2 << "' y='" << y.px_lo + 36
    << "' font-size='12' text-anchor='middle'>step</text>\n";
  o << "<text transform='translate(" << kLeft - 62 << "," << (y.px_lo + y.px_hi) / 2
    << ") rotate(-90)' font-size='12' text-anchor='middle'>" << ylabel << "</text>\n";
}

void polyline(std::ostream& o, const Axis& x, const Axis& y, const std::vector<double>& xs,
              const std::vector<double>& ys, const char* color) {
  o << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
  for (size_t i = 0; i < xs.size(); ++i)
    o << (i ? " " : "") << fmt(x(xs[i])) << "," << fmt(y(std::isfinite(ys[i]) ? ys[i] : y.hi));
  o << "'/>\n";
}

std::pair<double, double> finite_range(const std::vector<double>& v, bool positive) {
  double lo = INFINITY, hi = -INFINITY;
  for (double a : v)
    if (std::isfinite(a) && (!positive || a > 0)) lo = std::min(lo, a), hi = std::max(hi, a);
  if (!(lo <= hi)) return {positive ? 1e-3 : 0.0, 1.0};
  return {lo, hi};
}

}  // namespace

std::string render_report_svg(const MetricsSeries& s, const std::string& title) {
  MOE_ASSERT(!s.step.empty(), "render_report_svg: no metrics lines");
  const double height = 60 + 2 * (kPanelH + 70);
  std::ostringstream o;
  o << "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' width='" << kWidth
    << "' height='" << height << "' viewBox='0 0 " << kWidth << " " << height
    << "' font-family='sans-serif'>\n";
  o << "<rect width='100%' height='100%' fill='white'/>\n<text x='" << kLeft << "' y='24' font-size='16'>"
    << xml_escape(title) << "</text>\n";
  auto [s0, s1] = finite_range(s.step, false);
  Axis x{s0, s1 > s0 ? s1 : s0 + 1, false, kLeft, kWidth - kRight};
  auto [l0, l1] = finite_range(s.loss, true);
  // One loss value spans a decade above it, or below it near DBL_MAX (an infinite end would make
  // the decade count infinite: fuzz/metrics/corpus/crash-loss_1e308_inf_to_int).
  const bool top_decade = !std::isfinite(l0 * 10);
  Axis ly{top_decade ? l0 / 10 : l0, l1 > l0 ? l1 : top_decade ? l0 : l0 * 10, true, 60 + kPanelH + 20, 80};
  frame(o, x, ly, "loss (log scale)", "loss");
  polyline(o, x, ly, s.step, s.loss, kColors[0]);
  double b1 = 1.0;
  for (const auto& layer : s.balance) b1 = std::max(b1, finite_range(layer, false).second);
  const double top = 80 + kPanelH + 70;
  Axis by{0.0, std::isfinite(b1 * 1.05) ? b1 * 1.05 : b1, false, top + kPanelH, top};
  frame(o, x, by, "expert load: max / mean tokens per expert", "max / mean");
  for (size_t i = 0; i < s.balance.size(); ++i) {
    const char* color = kColors[i % 8];
    polyline(o, x, by, s.step, s.balance[i], color);
    o << "<text x='" << x.px_hi - 70 << "' y='" << top + 16 + 15 * double(i) << "' font-size='12' fill='"
      << color << "'>layer " << i << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace moe::train
