#include "check/compare.h"

#include <cmath>
#include <cstdio>
#include <limits>

namespace moe::check {
namespace {

// Why kGradRelBound = 1e-5 holds for a regrouped sum: an element of a weight
// gradient is a sum of n products (n <= T*K routed rows, 128 for the built-in
// T=64, K=2), accumulated in f32. The single process adds them in one
// sequence; the distributed layer adds per-rank partial sums, then the
// partials in rank order. Both orders are within (n-1) * 2^-24 * sum|terms|
// of the exact sum, so they differ by at most 2 * 127 * 6e-8 * sum|terms|
// ~= 1.5e-5 * sum|terms|, and in practice (random signs) by ~sqrt(n) * 2^-24
// * sum|terms| ~= 1e-6. Measured worst over the variants: see docs/check.md.
// A wrong reduction (a missing or doubled rank, a stale shard) gives errors
// of order 1: the bound separates the two by five orders of magnitude.

bool must_be_exact(const VariantSpec& v, const std::string& name) {
  if (name == "y" || name == "grad.x") return true;
  if (name == "grad.router.kernel") return v.ranks() == 1;
  return v.data == 1 && v.fsdp == 1;
}

std::string requirement(const VariantSpec& v) {
  std::string r = "loss, y, grad.x exact";
  r += v.ranks() == 1 ? "; router exact" : "; router <= 1e-5";
  r += v.data == 1 && v.fsdp == 1 ? "; experts exact" : "; experts <= 1e-5";
  if (v.rule == CounterpartRule::everything) r += "; == " + v.counterpart + " (all)";
  if (v.rule == CounterpartRule::activations) r += "; == " + v.counterpart + " (loss, y, grad.x)";
  return r;
}

void add_miss(VariantReport& r, const std::string& what) { r.note += (r.note.empty() ? "" : "; ") + what; }

std::string fmt_err(double e) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3e", e);
  return b;
}

void check_counterpart(const VariantSpec& v, const StepTensors& got, const StepTensors& cp,
                       VariantReport& r) {
  if (got.loss != cp.loss) add_miss(r, "loss != " + v.counterpart);
  for (size_t i = 0; i < got.tensors.size(); ++i) {
    const auto& [name, t] = got.tensors[i];
    const bool needed = v.rule == CounterpartRule::everything || name == "y" || name == "grad.x";
    if (needed && !t.bit_equal(cp.tensors[i].second))
      add_miss(
          r, name + " != " + v.counterpart + " (rel err " + fmt_err(rel_err(t, cp.tensors[i].second)) + ")");
  }
}

}  // namespace

double rel_err(const Tensor& a, const Tensor& b) {
  double diff = 0, mag = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, std::abs(double(a.get_f32(i)) - double(b.get_f32(i))));
    mag = std::max(mag, std::abs(double(b.get_f32(i))));
  }
  if (diff == 0) return 0;
  return mag == 0 ? std::numeric_limits<double>::infinity() : diff / mag;
}

VariantReport compare(const VariantSpec& v, const StepTensors& got, const StepTensors& ref,
                      const StepTensors* counterpart) {
  VariantReport r;
  r.name = v.name, r.ranks = v.ranks(), r.requirement = requirement(v);
  r.loss = got.loss, r.counts = got.counts;
  r.loss_bit_exact = got.loss == ref.loss;
  if (!r.loss_bit_exact) add_miss(r, "loss not bit-exact");
  MOE_ASSERT(got.tensors.size() == ref.tensors.size(), "check: result lists differ");
  for (size_t i = 0; i < got.tensors.size(); ++i) {
    const auto& [name, t] = got.tensors[i];
    const Tensor& want = ref.tensors[i].second;
    if (t.shape() != want.shape())
      fail("check ", v.name, ": ", name, " has shape ", shape_str(t.shape()), ", the single process ",
           shape_str(want.shape()));
    const bool exact = t.bit_equal(want);
    const double e = rel_err(t, want);
    r.worst_rel_err = std::max(r.worst_rel_err, e);
    if (name != "y") r.grads_total++, r.grads_bit_exact += exact;
    if (must_be_exact(v, name) && !exact) add_miss(r, name + " not bit-exact (rel err " + fmt_err(e) + ")");
    if (!must_be_exact(v, name) && !(e <= kGradRelBound))
      add_miss(r, name + " rel err " + fmt_err(e) + " > 1e-5");
  }
  if (counterpart)
    check_counterpart(v, got, *counterpart, r);
  else if (!v.counterpart.empty())
    r.requirement += " (" + v.counterpart + " not run: not compared)";
  r.pass = r.note.empty();
  return r;
}

VariantReport skipped(const VariantSpec& v, int grads_total, const std::string& reason) {
  VariantReport r;
  r.name = v.name, r.ranks = v.ranks(), r.requirement = requirement(v);
  r.skipped = true;
  r.note = reason;
  r.grads_total = grads_total;
  return r;
}

}  // namespace moe::check
