// Shapes whose element count or byte size overflows 64 bits are a named
// moe::Error in every reader (issue 11): Tensor itself, the safetensors
// reader (from a file and from bytes), the checkpoint loader and weights_from.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <initializer_list>

#include "moe/config.h"
#include "moe/layer.h"
#include "moe/safetensors.h"
#include "moe/tensor.h"
#include "testing/errors.h"
#include "testing/temp_dir.h"
#include "train/checkpoint.h"

namespace moe {
namespace {

using testing::TempDir;

using moe::testing::error_of;

void expect_contains(const std::string& msg, std::initializer_list<std::string> pieces) {
  for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// A safetensors file with one tensor `name` of `dtype` and `shape` (JSON text)
// spanning [0, 0) of an empty data buffer.
std::string one_tensor_file(const std::string& name, const std::string& dtype, const std::string& shape) {
  const std::string header = "{\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape +
                             ", \"data_offsets\": [0, 0]}}";
  std::string size(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(size.data(), &n, 8);
  return size + header;
}

TEST(ShapeOverflow, ElementCountOverflowIsAnError) {
  expect_contains(error_of([] {
                    shape_numel({INT64_MAX, 2});
                  }),
                  {"[9223372036854775807, 2]", "overflows 64 bits"});
  // A zero dimension does not excuse the others: their product must still fit.
  expect_contains(error_of([] { shape_numel({0, INT64_MAX, 2}); }), {"overflows 64 bits"});
  EXPECT_EQ(shape_numel({0, INT64_MAX}), 0);
  EXPECT_EQ(shape_numel({3, 0, 5}), 0);
  EXPECT_EQ(shape_numel({int64_t(1) << 31, int64_t(1) << 31}), int64_t(1) << 62);
}

TEST(ShapeOverflow, TensorByteSizeOverflowIsAnError) {
  expect_contains(error_of([] { Tensor::empty(DType::f32, {int64_t(1) << 62}); }),
                  {"[4611686018427387904]", "f32", "byte size overflows"});
  expect_contains(error_of([] {
                    Tensor t(DType::i64, {int64_t(1) << 31, int64_t(1) << 31});
                  }),
                  {"byte size overflows"});
}

TEST(ShapeOverflow, SafetensorsReaderNamesFileAndTensor) {
  TempDir d;
  const std::string path = d.file("w.safetensors");
  // The element count overflows (2^64), the byte size (2^63 for BF16), a zero-size tensor's other dims.
  for (const auto& [dtype, shape] : std::initializer_list<std::pair<const char*, const char*>>{
           {"F32", "[4294967296, 4294967296]"},
           {"BF16", "[4611686018427387904]"},
           {"I64", "[0, 4294967296, 4294967296]"},
           {"F16", "[9223372036854775807, 9223372036854775807]"}}) {
    const std::string bytes = one_tensor_file("big", dtype, shape);
    testing::write_bytes(path, bytes);
    expect_contains(error_of([&] { read_safetensors(path); }),
                    {path, "tensor 'big'", std::string("shape ") + shape, "overflows 63 bits"});
    expect_contains(error_of([&] { parse_safetensors(bytes, "mem.safetensors"); }),
                    {"mem.safetensors", "tensor 'big'", "overflows 63 bits"});
  }
}

TEST(ShapeOverflow, CheckpointLoaderNamesTheFile) {
  TempDir d;
  const Config cfg =
      parse_config("num_experts: 2\nnum_experts_per_tok: 1\nemb_dim: 4\nmoe_mlp_dim: 2\nnum_layers: 1\n", "t",
                   {})
          .config;
  const std::string file = d.file(train::checkpoint_file_name(3));
  testing::write_bytes(file, one_tensor_file("layers.0.norm.scale", "F32", "[4294967296, 4294967296]"));
  testing::write_bytes(d.file("latest"), train::checkpoint_file_name(3) + "\n");
  expect_contains(error_of([&] { train::load_checkpoint(d.path(), cfg); }),
                  {file, "tensor 'layers.0.norm.scale'", "overflows 63 bits"});
}

TEST(ShapeOverflow, WeightsFromRejectsAConfigWhoseShapesOverflow) {
  Config cfg;  // built in code: parse_config would reject these sizes
  cfg.num_experts = 4;
  cfg.num_experts_per_tok = 1;
  cfg.emb_dim = int64_t(1) << 40;
  cfg.moe_mlp_dim = int64_t(1) << 30;
  auto none = [](const std::string&) -> const Tensor* { return nullptr; };
  expect_contains(error_of([&] { weights_from(cfg, none, "layers.0.", "w.safetensors"); }),
                  {"w.safetensors", "weight 'layers.0.experts.wi_0'", "too large"});
  cfg.moe_mlp_dim = INT64_MAX;
  expect_contains(error_of([&] { weights_from(cfg, none, "", "w.safetensors"); }),
                  {"moe_mlp_dim=9223372036854775807", "overflows 64 bits"});
}

}  // namespace
}  // namespace moe
