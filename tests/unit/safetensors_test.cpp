#include "moe/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <initializer_list>

#include "testing/temp_dir.h"

namespace moe {
namespace {

using moe::testing::read_bytes;
using moe::testing::TempDir;
using moe::testing::write_bytes;
using Named = std::vector<std::pair<std::string, Tensor>>;

// A tensor whose bytes are a fixed function of `seed` (any bit pattern,
// NaNs included: round trips must be bit-exact).
Tensor patterned(DType dtype, Shape shape, uint32_t seed) {
  Tensor t = Tensor::empty(dtype, std::move(shape));
  auto* p = static_cast<uint8_t*>(t.raw());
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = uint8_t(x >> 24);
  }
  return t;
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &v, 8);
  return s;
}

// A file from raw parts: size prefix, header text, data bytes.
std::string file_bytes(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}

// The message of the moe::Error that reading `path` throws.
std::string read_error(const std::string& path) {
  try {
    read_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "reading " << path << " did not fail";
  return "";
}

void expect_contains(const std::string& msg, std::initializer_list<std::string> pieces) {
  for (const auto& p : pieces) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes a file from header text and data, reads it, returns the error.
  std::string corrupt_error(const std::string& header, const std::string& data = "") {
    write_bytes(path, file_bytes(header, data));
    return read_error(path);
  }
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
};

TEST_F(SafetensorsTest, RoundTripEveryDtypeBitExact) {
  Named in;
  uint32_t seed = 0;
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64})
    in.emplace_back(std::string("t.") + dtype_name(d), patterned(d, {3, 5}, ++seed));
  in.emplace_back("layers.0.experts.wi", patterned(DType::bf16, {2, 3, 4, 2}, ++seed));
  write_safetensors(path, in);
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.path, path);
  ASSERT_EQ(f.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(f.tensors[i].first, in[i].first);  // file order is the given order
    EXPECT_TRUE(f.tensors[i].second.bit_equal(in[i].second)) << in[i].first;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(f.tensors[i].second.raw()) % Tensor::kAlign, 0u);
  }
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(dir.list(), std::vector<std::string>{"t.safetensors"});
}

TEST_F(SafetensorsTest, MetadataZeroSizeAndScalars) {
  Named in = {{"empty", Tensor(DType::f32, {0, 4})},
              {"scalar", Tensor::scalar_f32(2.5f)},
              {"empty_too", Tensor(DType::i64, {3, 0})},
              {"ints", patterned(DType::i32, {2}, 7)}};
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "caf\xc3\xa9 \"quoted\""}};
  write_safetensors(path, in, meta);
  SafetensorsFile f = read_safetensors(path);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), 4u);
  EXPECT_EQ(f.at("empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(f.at("empty_too").shape(), (Shape{3, 0}));
  EXPECT_EQ(f.at("scalar").shape(), Shape{});
  EXPECT_EQ(f.at("scalar").data<float>()[0], 2.5f);
  EXPECT_TRUE(f.at("ints").bit_equal(in[3].second));
}

TEST_F(SafetensorsTest, DataStartsAtEightByteAlignedOffset) {
  for (size_t len = 1; len <= 16; ++len) {
    write_safetensors(path, {{std::string(len, 'n'), Tensor::scalar_f32(1.0f)}});
    const std::string bytes = read_bytes(path);
    uint64_t n;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << len;
    EXPECT_EQ(bytes.size(), 8 + n + 4) << len;
    const std::string header = bytes.substr(8, n);
    EXPECT_EQ(header.back() == ' ' || header.back() == '}', true);
    EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos);
  }
}

TEST_F(SafetensorsTest, WritesExactLayout) {
  Tensor a = Tensor::empty(DType::f32, {2});
  a.data<float>()[0] = 1.0f;
  a.data<float>()[1] = -2.0f;
  Tensor b = Tensor::empty(DType::i32, {});
  b.data<int32_t>()[0] = 7;
  write_safetensors(path, {{"b", b}, {"a", a}}, {{"k", "v"}});
  const std::string header = R"({"__metadata__":{"k":"v"},)"
                             R"("b":{"dtype":"I32","shape":[],"data_offsets":[0,4]},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  ASSERT_EQ(header.size(), 132u);  // 8 + 132 + 4 spaces = 144, a multiple of 8
  const std::string data(
      "\x07\0\0\0"
      "\0\0\x80\x3f"
      "\0\0\0\xc0",
      12);
  EXPECT_EQ(read_bytes(path), file_bytes(header + "    ", data));
}

TEST_F(SafetensorsTest, ReadsHandBuiltFile) {
  // Other writers order keys differently and pad with whitespace.
  const std::string header =
      "{ \"y\": {\"shape\": [2, 1], \"data_offsets\": [2, 6], \"dtype\": \"BF16\"},\n"
      "  \"x\": {\"data_offsets\": [0, 2], \"dtype\": \"F16\", \"shape\": [1]},\n"
      "  \"__metadata__\": {\"a\": \"b\"} }  ";
  write_bytes(path, file_bytes(header, std::string("\x00\x3c\x80\x3f\x00\xc0", 6)));
  SafetensorsFile f = read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].first, "x");  // offset order, not header order
  EXPECT_EQ(f.at("x").get_f32(0), 1.0f);
  EXPECT_EQ(f.at("y").shape(), (Shape{2, 1}));
  EXPECT_EQ(f.at("y").get_f32(0), 1.0f);
  EXPECT_EQ(f.at("y").get_f32(1), -2.0f);
  EXPECT_EQ(f.metadata.at("a"), "b");
}

TEST_F(SafetensorsTest, FindAndAt) {
  write_safetensors(path, {{"router.kernel", Tensor(DType::f32, {2, 2})}, {"x", Tensor(DType::f32, {1})}});
  SafetensorsFile f = read_safetensors(path);
  EXPECT_NE(f.find("x"), nullptr);
  EXPECT_EQ(f.find("y"), nullptr);
  std::string msg;
  try {
    f.at("y");
  } catch (const Error& e) {
    msg = e.what();
  }
  expect_contains(msg, {path, "no tensor named 'y'", "(has: router.kernel, x)"});
}

// --- corrupt and unsupported files: each error names the file and the tensor

// A header entry, for hand-built corrupt files.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape + ", \"data_offsets\": [" +
         std::to_string(begin) + ", " + std::to_string(end) + "]}";
}

TEST_F(SafetensorsTest, MissingFile) {
  expect_contains(read_error(dir.file("absent.safetensors")),
                  {dir.file("absent.safetensors"), "No such file or directory"});
  expect_contains(read_error(dir.path()), {dir.path(), "not a regular file"});
}

TEST_F(SafetensorsTest, TruncatedFiles) {
  write_safetensors(path, {{"a", patterned(DType::f32, {4}, 1)}, {"b", patterned(DType::i64, {3}, 2)}});
  const std::string whole = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, whole.data(), 8);
  for (size_t cut :
       {size_t(0), size_t(5), size_t(8), size_t(30), size_t(8 + n), size_t(8 + n + 3), whole.size() - 1}) {
    SCOPED_TRACE(cut);
    write_bytes(path, whole.substr(0, cut));
    const std::string msg = read_error(path);
    expect_contains(msg, {path});
    if (cut < 8)
      expect_contains(msg, {"too short"});
    else if (cut < 8 + n)
      expect_contains(msg, {"past the end of the file"});
    else
      expect_contains(msg, {"past the end of the data buffer"});
  }
  write_bytes(path, whole.substr(0, whole.size() - 1));
  expect_contains(read_error(path), {"tensor 'b'"});
}

TEST_F(SafetensorsTest, HugeHeaderSize) {
  write_bytes(path, u64_le(uint64_t(1) << 60) + "{}");
  expect_contains(read_error(path), {path, "header size 1152921504606846976", "absurd"});
}

TEST_F(SafetensorsTest, BadJson) {
  expect_contains(corrupt_error("{\"a\": {\"dtype\": "), {path, "not valid JSON", "parse error"});
  expect_contains(corrupt_error("[1, 2]"), {path, "must be a JSON object"});
  expect_contains(corrupt_error("{\"a\": \"\xff\"}"), {path, "not valid JSON"});  // not UTF-8
}

// Found by fuzzing: nlohmann-json throws out_of_range (not parse_error) for a
// number that overflows a double; it must leave as a moe::Error naming the file.
TEST_F(SafetensorsTest, NumberOverflowIsANamedError) {
  const std::string d4(4, '\0');
  expect_contains(corrupt_error(R"({"w": {"dtype": "F32", "shape": [1e400], "data_offsets": [0, 4]}})", d4),
                  {path, "not valid JSON", "1e400"});
  expect_contains(corrupt_error(R"({"__metadata__": {"k": -1e400}})"), {path, "not valid JSON"});
  expect_contains(
      corrupt_error(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 99999999999999999999]}})",
                    d4),
      {path, "tensor 'w'", "data_offsets end"});
}

TEST_F(SafetensorsTest, DuplicateNames) {
  std::string h = "{" + entry("a", "F32", "[1]", 0, 4) + ", " + entry("a", "F32", "[1]", 4, 8) + "}";
  expect_contains(corrupt_error(h, std::string(8, '\0')), {path, "duplicate tensor name 'a'"});
  h = "{\"a\": {\"dtype\": \"F32\", \"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}";
  expect_contains(corrupt_error(h, std::string(4, '\0')), {path, "tensor 'a'", "duplicate key 'dtype'"});
  h = "{\"__metadata__\": {\"k\": \"1\", \"k\": \"2\"}}";
  expect_contains(corrupt_error(h), {path, "__metadata__", "duplicate key 'k'"});
}

TEST_F(SafetensorsTest, BadEntries) {
  const std::string d4(4, '\0');
  auto err = [&](const std::string& body) { return corrupt_error("{\"w\": " + body + "}", d4); };
  expect_contains(err("[]"), {path, "tensor 'w'", "expected {"});
  expect_contains(err(R"({"shape": [1], "data_offsets": [0, 4]})"), {"tensor 'w'", "missing \"dtype\""});
  expect_contains(err(R"({"dtype": "F32", "data_offsets": [0, 4]})"), {"tensor 'w'", "missing \"shape\""});
  expect_contains(err(R"({"dtype": "F32", "shape": [1]})"), {"tensor 'w'", "missing \"data_offsets\""});
  expect_contains(err(R"({"dtype": 1, "shape": [1], "data_offsets": [0, 4]})"),
                  {"\"dtype\" must be a string"});
  expect_contains(err(R"({"dtype": "F32", "shape": 1, "data_offsets": [0, 4]})"),
                  {"\"shape\" must be an array"});
  expect_contains(err(R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})"),
                  {"tensor 'w'", "negative"});
  expect_contains(err(R"({"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]})"),
                  {"non-negative integer"});
  expect_contains(err(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]})"), {"[begin, end]"});
  expect_contains(err(R"({"dtype": "F32", "shape": [1], "data_offsets": ["0", 4]})"), {"data_offsets begin"});
  expect_contains(err(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1})"),
                  {"unknown key 'x'"});
  expect_contains(err(R"({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]})"),
                  {"tensor 'w'", "begin > end"});
  expect_contains(corrupt_error(R"({"__metadata__": {"k": 1}})"),
                  {path, "__metadata__", "'k' must be a string"});
  expect_contains(corrupt_error(R"({"__metadata__": []})"), {path, "__metadata__ must be an object"});
}

TEST_F(SafetensorsTest, UnsupportedDtypes) {
  for (const char* dtype : {"F64", "U8", "BOOL", "f32"}) {
    expect_contains(corrupt_error("{" + entry("w", dtype, "[1]", 0, 4) + "}", std::string(4, '\0')),
                    {path, "tensor 'w'", std::string("unsupported dtype '") + dtype + "'"});
  }
}

TEST_F(SafetensorsTest, RangeLengthMismatch) {
  expect_contains(corrupt_error("{" + entry("w", "F32", "[3]", 0, 8) + "}", std::string(8, '\0')),
                  {path, "tensor 'w'", "shape [3] of F32 needs 12 bytes but data_offsets span 8"});
  expect_contains(
      corrupt_error("{" + entry("w", "BF16", "[4294967296, 4294967296]", 0, 8) + "}", std::string(8, '\0')),
      {path, "tensor 'w'", "too large"});
}

TEST_F(SafetensorsTest, OffsetsPastTheEnd) {
  expect_contains(corrupt_error("{" + entry("w", "F32", "[2]", 0, 8) + "}", std::string(4, '\0')),
                  {path, "tensor 'w'", "past the end of the data buffer (4 bytes)"});
}

TEST_F(SafetensorsTest, OverlapHoleAndTrailingBytes) {
  const std::string a = entry("a", "F32", "[2]", 0, 8);
  expect_contains(
      corrupt_error("{" + a + ", " + entry("b", "F32", "[2]", 4, 12) + "}", std::string(12, '\0')),
      {path, "tensor 'b'", "overlap tensor 'a'"});
  expect_contains(
      corrupt_error("{" + a + ", " + entry("b", "F32", "[2]", 12, 20) + "}", std::string(20, '\0')),
      {path, "tensor 'b'", "[8, 12)", "belong to no tensor"});
  expect_contains(corrupt_error("{" + entry("b", "F32", "[2]", 4, 12) + "}", std::string(12, '\0')),
                  {path, "tensor 'b'", "[0, 4)", "belong to no tensor"});
  expect_contains(corrupt_error("{" + a + "}", std::string(12, '\0')), {path, "[8, 12) at the end"});
}

TEST_F(SafetensorsTest, WriteRejectsBadNamesAndKeepsOldFile) {
  write_bytes(path, "old");
  const Tensor t = Tensor::scalar_f32(1);
  std::string msg;
  try {
    write_safetensors(path, {{"a", t}, {"a", t}});
  } catch (const Error& e) {
    msg = e.what();
  }
  expect_contains(msg, {path, "'a' given twice"});
  EXPECT_THROW(write_safetensors(path, {{"__metadata__", t}}), Error);
  EXPECT_EQ(read_bytes(path), "old");
  EXPECT_EQ(dir.list(), std::vector<std::string>{"t.safetensors"});
}

}  // namespace
}  // namespace moe
