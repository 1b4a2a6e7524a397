// The case registry (STYLE.md rule 9): one list of named layer problems that
// drives the kernel/layer tests (tests/unit/cases_test.cpp) and `moe bench`,
// with the FLOP and byte counts the benchmark reports. docs/benchmarks.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "moe/config.h"
#include "moe/tensor.h"

namespace moe::bench {

// How a case routes its tokens.
//  - router: the layer's own router picks top-k (random weights and inputs
//    give a near-uniform spread).
//  - forced: topk_idx is drawn up front, K DISTINCT experts per token with
//    p(g) ∝ exp(-skew * g) (skew 0: uniform; large: most tokens on a few
//    low experts, high experts empty), like MaxText's combine test problems.
enum class RoutingKind { router, forced };

struct Case {
  std::string name;
  std::string description;
  int64_t T = 0, D = 0, F = 0, E = 0, K = 0;
  Activation activation = Activation::silu;
  RoutingKind routing = RoutingKind::router;
  double skew = 0.0;              // forced routing only
  double capacity_factor = -1.0;  // -1: dropless
  uint64_t seed = 0;              // weights, inputs and forced routing derive from it
  bool test_problem = false;      // small MaxText-style problem: tests only, not in the default bench
  // The expert shapes of a published model (docs/benchmarks.md, "Real models"): `source` names the
  // config the numbers come from. Not in the default bench (heavy on 2 cores): `--case NAME`.
  bool model = false;
  std::string source;

  // Even E and even D: the split layout applies (SPEC.md §5).
  bool split_capable() const { return E % 2 == 0 && D % 2 == 0; }
  int64_t rows() const { return T * K; }  // R (routed rows; dropless)
};

// Every case, bench cases first.
const std::vector<Case>& all_cases();
// Cases `moe bench` runs by default: every case that is neither a test problem nor a model.
std::vector<Case> bench_cases();
// The published models' expert shapes (model == true), in registry order.
std::vector<Case> model_cases();
// Cases small enough for unit tests: `tiny` and the test problems.
std::vector<Case> small_cases();
// Throws moe::Error naming `name` and listing the known cases.
const Case& find_case(std::string_view name);
// `c` with its shape changed by KEY=VALUE overrides (T=, D=, F=, E=, K=; positive integers), as
// `moe bench [--scenario ...] --case NAME T=64` takes them. Throws moe::Error naming the override
// (prefixed by `who`) for an unknown key, a bad value, or K > E.
Case with_shape_overrides(Case c, const std::vector<std::string>& overrides, std::string_view who);

// The layer config of a case: E, K, D, F, activation, capacity from the case,
// `dtype` for activations, f32 stored weights, separate wi_0/wi_1, fused kernels.
Config case_config(const Case& c, DType dtype);

// One way to run a case: permute/combine kernels and expert weight layout.
// A variant must match its `baseline` bit for bit (y, grad.x, and in the
// tests every weight gradient): fused kernels add in the reference's order
// (SPEC.md §4) and the split layout is a reshape (SPEC.md §5).
struct Variant {
  std::string name;  // "reference", "fused", "prefused-reference", "split"
  KernelChoice kernels = KernelChoice::fused;
  bool prefused = false;  // one wi [E, D, 2F]
  bool split = false;     // wi stored [2, E, D/2, 2F], two chained grouped GEMMs
  std::string baseline;   // variant it must match; "" for a baseline itself
  bool timed = true;      // false: only the baseline of another variant's check
};
// reference, fused; for split-capable cases also prefused-reference (untimed)
// and split. Baselines come before the variants checked against them.
std::vector<Variant> case_variants(const Case& c);
// case_config with the variant's kernels and layout.
Config variant_config(const Case& c, DType dtype, const Variant& v);

struct CaseInputs {
  Tensor x;         // [T, D] f32, N(0, 1)
  Tensor dy;        // [T, D] f32, N(0, 1)
  Tensor topk_idx;  // [T, K] i32 for forced routing; undefined for router routing
  const Tensor* forced() const { return topk_idx.numel() > 0 ? &topk_idx : nullptr; }
};
// Deterministic in (case, seed): the same bytes on every run, machine and
// thread count (drawn by src/core/counter_rng.h).
CaseInputs case_inputs(const Case& c, uint64_t seed);

// [T, K] i32: K distinct experts per token with p(g) ∝ exp(-skew * g)
// (Gumbel top-k: sampling without replacement), in the sampled order. The
// noise of (t, g) is counter_uniform(key, t * E + g) (src/core/counter_rng.h).
Tensor skewed_routing(int64_t T, int64_t K, int64_t E, double skew, uint64_t key);

// Useful FLOPs of one forward: 6·R·D·F (three [R, D]x[D, F]-sized GEMMs) +
// 2·T·D·E (router). Forward + backward = 3x forward.
double forward_flops(const Case& c);
double forward_backward_flops(const Case& c);

// Bytes moved by the permute forward: reads R rows and writes R rows of D
// elements (the useful traffic; the reference kernel moves about 2x that).
double permute_bytes(const Case& c, DType dtype);
// Bytes moved by the combine forward: reads R rows of D and T*K f32 weights,
// writes T rows of D.
double combine_bytes(const Case& c, DType dtype);

}  // namespace moe::bench
