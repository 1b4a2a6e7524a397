// The requirements of `moe check` in-process: a one-ulp change is caught
// where bit-exactness is promised and tolerated where the stated bound
// applies; counterparts are compared; rel_err's definition.
#include <gtest/gtest.h>

#include <cmath>

#include "check/compare.h"
#include "check/problem.h"
#include "check/variants.h"

namespace moe::check {
namespace {

VariantSpec variant(const std::string& name) { return select_variants({name}).back(); }

StepTensors reference() {
  Config c;
  c.num_experts = 4, c.num_experts_per_tok = 2, c.emb_dim = 8, c.moe_mlp_dim = 4;
  c.router_z_loss_weight = 0.001;
  return reference_step(c, make_problem(c, 16, 3));
}

// A deep copy of `s` with element 0 of tensor `name` moved by one f32 ulp.
StepTensors nudged(const StepTensors& s, const std::string& name) {
  StepTensors out = s;
  for (auto& [n, t] : out.tensors) {
    t = t.clone();
    if (n == name) t.data<float>()[0] = std::nextafter(t.data<float>()[0], 1e30f);
  }
  return out;
}

TEST(CheckCompare, IdenticalResultsPass) {
  StepTensors ref = reference();
  VariantReport r = compare(variant("ep2"), ref, ref, nullptr);
  EXPECT_TRUE(r.pass) << r.note;
  EXPECT_TRUE(r.loss_bit_exact);
  EXPECT_EQ(r.grads_bit_exact, 5);
  EXPECT_EQ(r.grads_total, 5);
  EXPECT_EQ(r.worst_rel_err, 0.0);
}

TEST(CheckCompare, OneUlpFailsWherePromisedExact) {
  StepTensors ref = reference();
  VariantReport ep = compare(variant("ep2"), nudged(ref, "grad.experts.wo"), ref, nullptr);
  EXPECT_FALSE(ep.pass);
  EXPECT_NE(ep.note.find("grad.experts.wo not bit-exact"), std::string::npos) << ep.note;
  EXPECT_FALSE(compare(variant("fsdp2"), nudged(ref, "grad.x"), ref, nullptr).pass);
  EXPECT_FALSE(compare(variant("single"), nudged(ref, "grad.router.kernel"), ref, nullptr).pass);
}

TEST(CheckCompare, OneUlpPassesWithinTheBound) {
  StepTensors ref = reference();
  VariantReport r = compare(variant("fsdp2"), nudged(ref, "grad.experts.wo"), ref, nullptr);
  EXPECT_TRUE(r.pass) << r.note;
  EXPECT_EQ(r.grads_bit_exact, 4);
  EXPECT_GT(r.worst_rel_err, 0.0);
  EXPECT_LE(r.worst_rel_err, kGradRelBound);
  EXPECT_TRUE(compare(variant("ep2"), nudged(ref, "grad.router.kernel"), ref, nullptr).pass);
}

TEST(CheckCompare, CounterpartsMustMatchBitForBit) {
  StepTensors ref = reference();
  StepTensors router_off = nudged(ref, "grad.router.kernel");
  // Chunks must equal their 1-chunk counterpart in everything, even where the
  // single-process comparison only asks for a bound.
  VariantReport chunks = compare(variant("ep2_chunks4"), ref, ref, &router_off);
  EXPECT_FALSE(chunks.pass);
  EXPECT_NE(chunks.note.find("!= ep2"), std::string::npos) << chunks.note;
  // Reference kernels must equal fused ones in loss, y and grad.x only.
  EXPECT_TRUE(compare(variant("ep2_reference_kernels"), ref, ref, &router_off).pass);
  StepTensors dx_off = nudged(ref, "grad.x");
  EXPECT_FALSE(compare(variant("ep2_reference_kernels"), ref, ref, &dx_off).pass);
}

TEST(CheckCompare, RelErrIsMaxDiffOverMaxMagnitude) {
  Tensor a(DType::f32, {2}), b(DType::f32, {2});
  b.data<float>()[0] = 4, b.data<float>()[1] = -8;
  a.data<float>()[0] = 5, a.data<float>()[1] = -8;
  EXPECT_DOUBLE_EQ(rel_err(a, b), 1.0 / 8.0);
  EXPECT_EQ(rel_err(b, b), 0.0);
  EXPECT_TRUE(std::isinf(rel_err(a, Tensor(DType::f32, {2}))));
}

TEST(CheckVariants, SelectionAddsCounterpartsAndNamesUnknowns) {
  auto v = select_variants({"fsdp2_ep2_explicit"});
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].name, "fsdp2_ep2");
  EXPECT_EQ(v[1].name, "fsdp2_ep2_explicit");
  EXPECT_THROW(select_variants({"nope"}), Error);
  for (const VariantSpec& s : all_variants())
    if (!s.counterpart.empty()) {
      EXPECT_EQ(select_variants({s.name}).size(), 2u) << s.name;
    }
}

}  // namespace
}  // namespace moe::check
