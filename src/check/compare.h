// The equivalence requirements of `moe check` (docs/check.md) and the
// comparison of one variant's step with the single-process layer.
//
// Bit-exact always: loss, y, grad.x (every kernel is row-independent and the
// aux statistics are summed exactly). Bit-exact when one rank holds every row
// of a sum: grad.router.kernel on one rank; expert weight gradients when
// data = fsdp = 1 (each expert's rows live on its one owner). Elsewhere the
// gradient is a rank-order sum of per-rank partials, which regroups the
// single process's f32 sum: bounded by kGradRelBound (argued in compare.cpp).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "check/problem.h"
#include "check/variants.h"

namespace moe::check {

// Worst relative error allowed for a regrouped gradient sum (compare.cpp).
inline constexpr double kGradRelBound = 1e-5;

struct VariantReport {
  std::string name;
  int ranks = 1;
  bool skipped = false;
  bool pass = false;
  std::string requirement;  // one line: what this variant must meet
  std::string note;         // skip reason, or the misses of a failed variant
  bool loss_bit_exact = false;
  int grads_bit_exact = 0, grads_total = 0;  // grad.x + the weights' gradients
  double worst_rel_err = 0;                  // over y and every gradient
  double loss = 0;
  std::array<int64_t, kNumCollKinds> counts{};

  const char* verdict() const { return skipped ? "SKIP" : pass ? "PASS" : "FAIL"; }
};

// max |a - b| / max |b| (0 when equal; infinite when b is all zero and a is not).
double rel_err(const Tensor& a, const Tensor& b);

// Compares `got` with the single-process `ref` and, when given, with the
// counterpart's results under v.rule.
VariantReport compare(const VariantSpec& v, const StepTensors& got, const StepTensors& ref,
                      const StepTensors* counterpart);

// A skipped variant with its reason.
VariantReport skipped(const VariantSpec& v, int grads_total, const std::string& reason);

}  // namespace moe::check
