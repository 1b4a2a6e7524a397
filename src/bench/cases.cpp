#include "bench/cases.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "core/counter_rng.h"

namespace moe::bench {
namespace {

Case bench_case(std::string name, std::string desc, int64_t T, int64_t D, int64_t F, int64_t E, int64_t K) {
  Case c;
  c.name = std::move(name);
  c.description = std::move(desc);
  c.T = T, c.D = D, c.F = F, c.E = E, c.K = K;
  c.seed = 1;
  return c;
}

// A MaxText combine test problem (MAXTEXT_NOTES §5.3: seed, T, K, G, E_d, skew),
// scaled down (T and E_d divided by 4; F = 16) so a fwd+bwd takes milliseconds.
Case test_problem(std::string name, uint64_t seed, int64_t T, int64_t K, int64_t E, int64_t D, double skew) {
  Case c = bench_case(std::move(name), "MaxText combine test problem (scaled down)", T, D, 16, E, K);
  c.routing = RoutingKind::forced;
  c.skew = skew;
  c.seed = seed;
  c.test_problem = true;
  return c;
}

// A published model's routed experts: D = hidden_size, F = the expert's intermediate size, E routed
// experts, top-K, from the model's config.json (docs/benchmarks.md lists the fields and what is left out).
Case model_case(std::string name, std::string desc, std::string source, int64_t T, int64_t D, int64_t F,
                int64_t E, int64_t K) {
  Case c = bench_case(std::move(name), std::move(desc), T, D, F, E, K);
  c.model = true;
  c.source = std::move(source);
  return c;
}

void add_model_cases(std::vector<Case>& v) {
  v.push_back(model_case("olmoe-1b-7b", "OLMoE-1B-7B experts (64, top-8)",
                         "allenai/OLMoE-1B-7B-0924 config.json: hidden_size 2048, intermediate_size 1024, "
                         "num_experts 64, num_experts_per_tok 8",
                         2048, 2048, 1024, 64, 8));
  v.push_back(
      model_case("qwen1.5-moe-a2.7b", "Qwen1.5-MoE-A2.7B routed experts (60, top-4; shared expert left out)",
                 "Qwen/Qwen1.5-MoE-A2.7B config.json: hidden_size 2048, moe_intermediate_size 1408, "
                 "num_experts 60, num_experts_per_tok 4 (shared_expert_intermediate_size 5632: left out)",
                 3840, 2048, 1408, 60, 4));
  v.push_back(
      model_case("deepseek-v2-lite", "DeepSeek-V2-Lite routed experts (64, top-6; 2 shared experts left out)",
                 "deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, moe_intermediate_size 1408, "
                 "n_routed_experts 64, num_experts_per_tok 6 (n_shared_experts 2: left out)",
                 2816, 2048, 1408, 64, 6));
  v.push_back(model_case("gpt-oss-20b",
                         "gpt-oss-20b experts (32, top-4; its clamped SwiGLU and biases: silu here)",
                         "openai/gpt-oss-20b config.json: hidden_size 2880, intermediate_size 2880, "
                         "num_local_experts 32, num_experts_per_tok 4",
                         2048, 2880, 2880, 32, 4));
  v.push_back(model_case(
      "granite-3b-a800m", "Granite-3.0-3B-A800M experts (40, top-8)",
      "ibm-granite/granite-3.0-3b-a800m-base config.json: hidden_size 1536, intermediate_size 512, "
      "num_local_experts 40, num_experts_per_tok 8",
      1280, 1536, 512, 40, 8));
  v.push_back(model_case(
      "granite-1b-a400m", "Granite-3.0-1B-A400M experts (32, top-8)",
      "ibm-granite/granite-3.0-1b-a400m-base config.json: hidden_size 1024, intermediate_size 512, "
      "num_local_experts 32, num_experts_per_tok 8",
      1024, 1024, 512, 32, 8));
  v.push_back(
      model_case("mixtral-8x7b", "Mixtral-8x7B experts (8, top-2), full size",
                 "mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, intermediate_size 14336, "
                 "num_local_experts 8, num_experts_per_tok 2",
                 1024, 4096, 14336, 8, 2));
}

std::vector<Case> make_cases() {
  std::vector<Case> v;
  v.push_back(bench_case("seed-mixtral", "the seeds' Mixtral-8x7B micro-bench layer (D 4096, mlp 1024)", 2048,
                         4096, 1024, 8, 2));
  v.push_back(
      bench_case("many-experts", "128 small experts, top-8 (Qwen3-MoE-like)", 2048, 1024, 512, 128, 8));
  Case gemma = bench_case("gemma-like", "Gemma4-26B-A4B expert shapes (gelu)", 2048, 2816, 704, 128, 8);
  gemma.activation = Activation::gelu;
  v.push_back(gemma);
  Case skewed =
      bench_case("skewed", "forced routing, p(g) ∝ exp(-g): a few experts take most rows, most are empty",
                 2048, 1024, 512, 64, 4);
  skewed.routing = RoutingKind::forced;
  skewed.skew = 1.0;
  v.push_back(skewed);
  add_model_cases(v);
  v.push_back(bench_case("tiny", "small and fast (smoke test of the harness)", 64, 64, 32, 8, 2));
  v.push_back(test_problem("base", 0, 64, 8, 16, 64, 0.0));
  v.push_back(test_problem("many_experts", 1, 64, 8, 128, 32, 0.0));
  v.push_back(test_problem("odd_groups", 2, 96, 8, 9, 96, 0.0));
  v.push_back(test_problem("skewed_long_ranges", 3, 64, 8, 32, 32, 1.0));
  Case k6 = test_problem("k6", 4, 128, 6, 12, 64, 0.3);
  k6.activation = Activation::gelu;
  v.push_back(k6);
  v.push_back(test_problem("k2", 5, 64, 2, 5, 32, 0.0));
  v.push_back(test_problem("tiny_ranges", 8, 64, 2, 128, 32, 0.0));
  Case cap = bench_case("capacity_dropping", "router routing with capacity_factor 0.75 (slots dropped)", 48,
                        32, 16, 8, 3);
  cap.capacity_factor = 0.75;
  cap.seed = 6;
  cap.test_problem = true;
  v.push_back(cap);
  return v;
}

// The streams of a case's inputs: stream_key(case seed, --seed, purpose).
constexpr uint64_t kXStream = 1, kDyStream = 2, kRoutingStream = 3;

}  // namespace

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = make_cases();
  return cases;
}

std::vector<Case> bench_cases() {
  std::vector<Case> v;
  for (const Case& c : all_cases())
    if (!c.test_problem && !c.model) v.push_back(c);
  return v;
}

std::vector<Case> model_cases() {
  std::vector<Case> v;
  for (const Case& c : all_cases())
    if (c.model) v.push_back(c);
  return v;
}

std::vector<Case> small_cases() {
  std::vector<Case> v;
  for (const Case& c : all_cases())
    if (c.test_problem || c.name == "tiny") v.push_back(c);
  return v;
}

const Case& find_case(std::string_view name) {
  std::string known;
  for (const Case& c : all_cases()) {
    if (c.name == name) return c;
    known += (known.empty() ? "" : ", ") + c.name;
  }
  fail("unknown case '", name, "' (known cases: ", known, ")");
}

Case with_shape_overrides(Case c, const std::vector<std::string>& overrides, std::string_view who) {
  for (const std::string& kv : overrides) {
    auto eq = kv.find('=');
    std::string key = kv.substr(0, eq);
    int64_t* field = key == "T"   ? &c.T
                     : key == "D" ? &c.D
                     : key == "F" ? &c.F
                     : key == "E" ? &c.E
                     : key == "K" ? &c.K
                                  : nullptr;
    if (eq == std::string::npos || !field)
      fail(who, ": override '", kv, "' is not one of T=, D=, F=, E=, K= with a positive integer");
    char* end = nullptr;
    long long v = std::strtoll(kv.c_str() + eq + 1, &end, 10);
    if (eq + 1 == kv.size() || *end != '\0' || v <= 0) fail(who, ": override '", kv, "' needs a positive integer");
    *field = v;
  }
  if (c.K > c.E) fail(who, ": K=", c.K, " is more than E=", c.E);
  return c;
}

Config case_config(const Case& c, DType dtype) {
  Config cfg;
  cfg.num_experts = c.E;
  cfg.num_experts_per_tok = c.K;
  cfg.emb_dim = c.D;
  cfg.moe_mlp_dim = c.F;
  cfg.mlp_activation = c.activation;
  cfg.capacity_factor = c.capacity_factor;
  cfg.dtype = dtype;
  // Weights stored in the compute dtype: the layer step, without the per-step
  // cast of f32 master weights (`moe bench --weight-dtype f32` measures that too).
  cfg.weight_dtype = dtype;
  return cfg;
}

std::vector<Variant> case_variants(const Case& c) {
  using KC = KernelChoice;
  std::vector<Variant> v{{"reference", KC::reference, false, false, "", true},
                         {"fused", KC::fused, false, false, "reference", true}};
  if (c.split_capable()) {
    v.push_back({"prefused-reference", KC::reference, true, false, "", false});
    v.push_back({"split", KC::fused, true, true, "prefused-reference", true});
  }
  return v;
}

Config variant_config(const Case& c, DType dtype, const Variant& v) {
  Config cfg = case_config(c, dtype);
  cfg.moe_permute_kernel = cfg.moe_combine_kernel = v.kernels;
  cfg.prefuse_moe_weights = v.prefused;
  cfg.moe_split_expert_weight_layout = v.split;
  return cfg;
}

CaseInputs case_inputs(const Case& c, uint64_t seed) {
  CaseInputs in;
  in.x = normal_tensor({c.T, c.D}, stream_key(c.seed, seed, kXStream));
  in.dy = normal_tensor({c.T, c.D}, stream_key(c.seed, seed, kDyStream));
  if (c.routing == RoutingKind::forced)
    in.topk_idx = skewed_routing(c.T, c.K, c.E, c.skew, stream_key(c.seed, seed, kRoutingStream));
  return in;
}

// [T, K] i32
Tensor skewed_routing(int64_t T, int64_t K, int64_t E, double skew, uint64_t key) {
  MOE_ASSERT(K >= 1 && K <= E, "skewed_routing needs 1 <= K <= E");
  Tensor idx = Tensor::empty(DType::i32, {T, K});
  std::vector<double> score(static_cast<size_t>(E));
  std::vector<int32_t> ids(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    // log p(g) + Gumbel noise; the K largest scores are a sample without replacement from p.
    for (int64_t g = 0; g < E; ++g)
      score[size_t(g)] = -skew * double(g) - std::log(-std::log(counter_uniform(key, uint64_t(t * E + g))));
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + K, ids.end(),
                      [&](int32_t a, int32_t b) { return score[size_t(a)] > score[size_t(b)]; });
    std::copy_n(ids.begin(), K, idx.data<int32_t>() + t * K);
  }
  return idx;
}

double forward_flops(const Case& c) {
  return 6.0 * double(c.rows()) * double(c.D) * double(c.F) + 2.0 * double(c.T) * double(c.D) * double(c.E);
}

double forward_backward_flops(const Case& c) { return 3.0 * forward_flops(c); }

double permute_bytes(const Case& c, DType dtype) {
  return 2.0 * double(c.rows()) * double(c.D) * double(dtype_size(dtype));
}

double combine_bytes(const Case& c, DType dtype) {
  double s = double(dtype_size(dtype));
  return double(c.rows()) * double(c.D) * s + double(c.rows()) * 4.0 + double(c.T) * double(c.D) * s;
}

}  // namespace moe::bench
