// The case registry (src/bench/cases.h) and the bit-exactness of every kernel
// and layout variant on every small case: the same registry `moe bench` runs.
#include "bench/cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "moe/layer.h"
#include "testing/levels.h"

namespace moe {
namespace {

using bench::Case;

TEST(Cases, RegistryHasTheNamedShapes) {
  std::set<std::string> names;
  for (const Case& c : bench::all_cases()) EXPECT_TRUE(names.insert(c.name).second) << "duplicate " << c.name;
  const Case& m = bench::find_case("seed-mixtral");
  EXPECT_EQ((std::vector<int64_t>{m.T, m.D, m.F, m.E, m.K}), (std::vector<int64_t>{2048, 4096, 1024, 8, 2}));
  const Case& me = bench::find_case("many-experts");
  EXPECT_EQ((std::vector<int64_t>{me.T, me.D, me.F, me.E, me.K}),
            (std::vector<int64_t>{2048, 1024, 512, 128, 8}));
  const Case& g = bench::find_case("gemma-like");
  EXPECT_EQ((std::vector<int64_t>{g.T, g.D, g.F, g.E, g.K}), (std::vector<int64_t>{2048, 2816, 704, 128, 8}));
  EXPECT_EQ(g.activation, Activation::gelu);
  for (const char* n : {"skewed", "tiny", "base", "many_experts", "odd_groups", "skewed_long_ranges", "k6",
                        "k2", "tiny_ranges"})
    EXPECT_NO_THROW(bench::find_case(n)) << n;
  for (const Case& c : bench::bench_cases()) EXPECT_FALSE(c.test_problem) << c.name;
  for (const Case& c : bench::small_cases()) EXPECT_LE(c.rows() * c.D * c.F, 1 << 21) << c.name;
  try {
    bench::find_case("mixtral");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown case 'mixtral'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("seed-mixtral"), std::string::npos);
  }
}

// The published models' expert shapes (docs/benchmarks.md, "Real models"): the config.json numbers,
// a source for each, and none of them in the default bench or the unit-test set.
TEST(Cases, ModelCasesHaveThePublishedShapes) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> want{
      {"olmoe-1b-7b", {2048, 1024, 64, 8}},      {"qwen1.5-moe-a2.7b", {2048, 1408, 60, 4}},
      {"deepseek-v2-lite", {2048, 1408, 64, 6}}, {"gpt-oss-20b", {2880, 2880, 32, 4}},
      {"granite-3b-a800m", {1536, 512, 40, 8}},  {"granite-1b-a400m", {1024, 512, 32, 8}},
      {"mixtral-8x7b", {4096, 14336, 8, 2}}};
  std::vector<Case> models = bench::model_cases();
  ASSERT_EQ(models.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Case& c = models[i];
    EXPECT_EQ(c.name, want[i].first);
    EXPECT_EQ((std::vector<int64_t>{c.D, c.F, c.E, c.K}), want[i].second) << c.name;
    EXPECT_TRUE(c.model && !c.test_problem) << c.name;
    EXPECT_NE(c.source.find("config.json"), std::string::npos) << c.name;
    // T: the smallest multiple of 256 tokens that gives each expert 256 rows on average (a training
    // micro-batch of at most 4096 tokens for every one of these models).
    EXPECT_EQ(c.T % 256, 0) << c.name;
    EXPECT_GE(c.T * c.K, 256 * c.E) << c.name;
    EXPECT_LT((c.T - 256) * c.K, 256 * c.E) << c.name;
    EXPECT_LE(c.T, 4096) << c.name;
    EXPECT_EQ(c.activation, Activation::silu) << c.name;
  }
  for (const Case& c : bench::bench_cases()) EXPECT_FALSE(c.model) << c.name;
  for (const Case& c : bench::small_cases()) EXPECT_FALSE(c.model) << c.name;
  for (const auto& [name, shape] : want) EXPECT_EQ(bench::find_case(name).name, name);
}

// `moe bench --case NAME T=64`: the shape overrides, and what they refuse.
TEST(Cases, ShapeOverrides) {
  const Case& m = bench::find_case("mixtral-8x7b");
  Case c = bench::with_shape_overrides(m, {"T=64"}, "moe bench");
  EXPECT_EQ(c.T, 64);
  EXPECT_EQ((std::vector<int64_t>{c.D, c.F, c.E, c.K, int64_t(c.seed)}),
            (std::vector<int64_t>{m.D, m.F, m.E, m.K, int64_t(m.seed)}));
  c = bench::with_shape_overrides(m, {"D=64", "F=32", "E=4", "K=3"}, "moe bench");
  EXPECT_EQ((std::vector<int64_t>{c.T, c.D, c.F, c.E, c.K}), (std::vector<int64_t>{m.T, 64, 32, 4, 3}));
  auto message = [&](const std::vector<std::string>& o) {
    try {
      bench::with_shape_overrides(m, o, "moe bench");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message({"X=3"}).find("moe bench: override 'X=3' is not one of T=, D=, F=, E=, K="),
            std::string::npos);
  EXPECT_NE(message({"T"}).find("override 'T' is not one of"), std::string::npos);
  EXPECT_NE(message({"T="}).find("override 'T=' needs a positive integer"), std::string::npos);
  EXPECT_NE(message({"T=0"}).find("override 'T=0' needs a positive integer"), std::string::npos);
  EXPECT_NE(message({"T=12x"}).find("override 'T=12x' needs a positive integer"), std::string::npos);
  EXPECT_NE(message({"K=9"}).find("K=9 is more than E=8"), std::string::npos);
}

TEST(Cases, FlopAndByteCounts) {
  const Case& m = bench::find_case("seed-mixtral");
  const double fwd = 6.0 * 4096 * 4096 * 1024 + 2.0 * 2048 * 4096 * 8;
  EXPECT_EQ(bench::forward_flops(m), fwd);
  EXPECT_EQ(bench::forward_backward_flops(m), 3 * fwd);
  EXPECT_EQ(bench::permute_bytes(m, DType::bf16), 2.0 * 4096 * 4096 * 2);
  EXPECT_EQ(bench::combine_bytes(m, DType::f32), 4096.0 * 4096 * 4 + 4096 * 4 + 2048.0 * 4096 * 4);
}

// K distinct experts per token, the same bits for the same seed.
TEST(Cases, ForcedRoutingIsDistinctAndDeterministic) {
  for (const Case& c : bench::small_cases()) {
    if (c.routing != bench::RoutingKind::forced) continue;
    bench::CaseInputs a = bench::case_inputs(c, 7), b = bench::case_inputs(c, 7),
                      d = bench::case_inputs(c, 8);
    ASSERT_EQ(a.topk_idx.shape(), (Shape{c.T, c.K})) << c.name;
    EXPECT_TRUE(a.topk_idx.bit_equal(b.topk_idx) && a.x.bit_equal(b.x) && a.dy.bit_equal(b.dy)) << c.name;
    EXPECT_FALSE(a.x.bit_equal(d.x)) << c.name;
    const int32_t* p = a.topk_idx.data<int32_t>();
    for (int64_t t = 0; t < c.T; ++t) {
      std::set<int32_t> s(p + t * c.K, p + (t + 1) * c.K);
      ASSERT_EQ(int64_t(s.size()), c.K) << c.name << " token " << t;
      ASSERT_TRUE(*s.begin() >= 0 && *s.rbegin() < c.E) << c.name;
    }
  }
}

// `skewed`: most rows on a few experts, some experts empty.
TEST(Cases, SkewedRoutingConcentratesRows) {
  const Case& c = bench::find_case("skewed");
  Tensor idx = bench::skewed_routing(c.T, c.K, c.E, c.skew, 0);
  std::vector<int64_t> count(size_t(c.E), 0);
  for (int64_t i = 0; i < c.rows(); ++i) ++count[size_t(idx.data<int32_t>()[i])];
  std::sort(count.rbegin(), count.rend());
  int64_t top = 0;
  for (int64_t e = 0; e < c.E / 8; ++e) top += count[size_t(e)];
  EXPECT_GE(double(top), 0.8 * double(c.rows()));  // the busiest 1/8 of experts take >= 80% of rows
  EXPECT_GE(std::count(count.begin(), count.end(), 0), c.E / 2);  // at least half the experts empty
}

struct StepResult {
  LayerOutputs out;
  LayerGrads grads;
};

StepResult run_variant(const Case& c, DType dt, const bench::Variant& v, const bench::CaseInputs& in) {
  Config cfg = bench::variant_config(c, dt, v);
  LayerWeights w = init_weights(cfg, c.seed);
  StepResult r;
  auto fwd = layer_forward(cfg, w, in.x, in.forced(), r.out);
  r.grads = layer_backward(cfg, *fwd, in.dy);
  return r;
}

// Every output and gradient bit for bit; weight gradients compared in the
// baseline's shape (the split layout's wi gradient is a reshape).
void expect_bit_equal(const Config& cfg, const StepResult& a, const StepResult& b, const std::string& what) {
  EXPECT_TRUE(a.out.y.bit_equal(b.out.y)) << what << " y";
  EXPECT_TRUE(a.out.topk_idx.bit_equal(b.out.topk_idx)) << what << " topk_idx";
  EXPECT_TRUE(a.out.group_sizes.bit_equal(b.out.group_sizes)) << what << " group_sizes";
  EXPECT_TRUE(a.grads.dx.bit_equal(b.grads.dx)) << what << " grad.x";
  std::vector<Tensor> tb;
  b.grads.weights.for_each(cfg, [&](const std::string&, const Tensor& t) { tb.push_back(t); });
  size_t i = 0;
  a.grads.weights.for_each(cfg, [&](const std::string& name, const Tensor& t) {
    EXPECT_TRUE(t.bit_equal(tb[i].reshaped(t.shape()))) << what << " grad." << name;
    ++i;
  });
}

// Each small case and dtype at every kernel level: the bit-exact contracts hold within each level.
class SmallCase : public testing::LevelTest<std::tuple<Case, DType, Isa>> {};

// SPEC.md §4 and §5: fused kernels and the split layout give the same bits
// as their baselines (reference kernels; the prefused layout).
TEST_P(SmallCase, VariantsMatchTheirBaselinesBitExact) {
  const auto& [c, dt, level] = GetParam();
  bench::CaseInputs in = bench::case_inputs(c, 0);
  std::vector<std::pair<bench::Variant, StepResult>> done;
  for (const bench::Variant& v : bench::case_variants(c)) {
    StepResult r = run_variant(c, dt, v, in);
    for (const auto& [base, br] : done)
      if (base.name == v.baseline)
        expect_bit_equal(bench::variant_config(c, dt, base), br, r,
                         c.name + " " + v.name + " vs " + base.name);
    done.emplace_back(v, std::move(r));
  }
  EXPECT_EQ(done.size(), c.split_capable() ? 4u : 2u);
  if (c.capacity_factor > 0) {
    EXPECT_GT(done[0].second.out.dropped, 0) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, SmallCase,
                         ::testing::Combine(::testing::ValuesIn(bench::small_cases()),
                                            ::testing::Values(DType::bf16, DType::f32),
                                            ::testing::ValuesIn(testing::all_levels())),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param).name + "_" +
                                           dtype_name(std::get<1>(info.param)) + "_" +
                                           isa_name(std::get<2>(info.param));
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace moe
