// `moe check` through the binary, single process: the JSON of SPEC.md §7
// (every variant listed, the one-rank variant run and bit-exact, the
// multi-rank ones skipped with a hint), the variant filter, a named error.
// The multi-rank runs are CTest entries under mpirun (check_np2, check_np4).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "testing/cli_runner.h"
#include "testing/temp_dir.h"

namespace moe {
namespace {

void expect_schema(const nlohmann::json& v) {
  for (const char* key : {"name", "requirement", "verdict", "note"})
    ASSERT_TRUE(v.contains(key) && v.at(key).is_string()) << key << "\n" << v.dump();
  for (const char* key : {"ranks", "grads_bit_exact", "grads_total"})
    ASSERT_TRUE(v.contains(key) && v.at(key).is_number_integer()) << key << "\n" << v.dump();
  for (const char* key : {"loss_bit_exact", "skipped"})
    ASSERT_TRUE(v.contains(key) && v.at(key).is_boolean()) << key << "\n" << v.dump();
  ASSERT_TRUE(v.contains("worst_rel_err") && v.at("worst_rel_err").is_number()) << v.dump();
  const auto& c = v.at("collectives");
  for (const char* key : {"AR", "AG", "A2A", "RS", "SO"})
    ASSERT_TRUE(c.contains(key) && c.at(key).is_number_integer()) << key << "\n" << v.dump();
}

TEST(CliCheck, SingleProcessWritesTheContractedJson) {
  testing::TempDir dir;
  auto r = testing::run_moe("check --json " + dir.file("c.json"), dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("mpirun"), std::string::npos) << r.out;
  nlohmann::json doc = nlohmann::json::parse(testing::slurp_text(dir.file("c.json")));
  const auto& rows = doc.at("variants");
  ASSERT_GE(rows.size(), 17u);
  for (const auto& v : rows) {
    expect_schema(v);
    const bool one_rank = v.at("ranks") == 1;
    EXPECT_EQ(v.at("skipped").get<bool>(), !one_rank) << v.dump();
    EXPECT_EQ(v.at("verdict"), one_rank ? "PASS" : "SKIP") << v.dump();
  }
  const auto& single = rows.at(0);
  EXPECT_EQ(single.at("name"), "single");
  EXPECT_TRUE(single.at("loss_bit_exact").get<bool>());
  EXPECT_EQ(single.at("grads_total"), 5);  // grad.x, router.kernel, wi_0, wi_1, wo
  EXPECT_EQ(single.at("grads_bit_exact"), 5);
  EXPECT_EQ(single.at("worst_rel_err").get<double>(), 0.0);
  EXPECT_GT(single.at("collectives").at("AG").get<int>(), 0);  // the aux statistics
  EXPECT_EQ(rows.at(1).at("note").get<std::string>().find("needs 2 ranks"), 0u) << rows.at(1).dump();
}

TEST(CliCheck, PrefusedLayoutHasFourGradients) {
  testing::TempDir dir;
  auto r = testing::run_moe(
      "check --variant single --json " + dir.file("c.json") + " prefuse_moe_weights=true", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  nlohmann::json doc = nlohmann::json::parse(testing::slurp_text(dir.file("c.json")));
  ASSERT_EQ(doc.at("variants").size(), 1u);
  EXPECT_EQ(doc.at("variants").at(0).at("grads_total"), 4);  // grad.x, router.kernel, wi, wo
  EXPECT_EQ(doc.at("variants").at(0).at("grads_bit_exact"), 4);
}

TEST(CliCheck, UnknownVariantIsANamedError) {
  testing::TempDir dir;
  auto r = testing::run_moe("check --variant ep3", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("unknown variant 'ep3'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fsdp2_ep2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace moe
