// Output of `moe check`: the table rank 0 prints, and the JSON of SPEC.md §7.
#pragma once

#include <string>
#include <vector>

#include "check/compare.h"

namespace moe::check {

// "variant  ranks  loss  grads  worst rel err  AR  AG  A2A  RS  SO  verdict"
std::string format_table_header();
// One row; a failed or skipped variant gets a second line with its note.
std::string format_table_row(const VariantReport& r);

// {"variants": [{"name", "ranks", "loss_bit_exact", "grads_bit_exact",
// "grads_total", "worst_rel_err", "collectives": {"AR", "AG", "A2A", "RS",
// "SO"}, "requirement", "verdict", "skipped", "note", "loss"}]}. Skipped
// variants keep every field (false / 0) with "skipped": true.
std::string reports_json(const std::vector<VariantReport>& reports);

}  // namespace moe::check
