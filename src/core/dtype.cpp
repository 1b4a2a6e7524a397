#include "moe/dtype.h"

#include <cmath>

#include "moe/error.h"

namespace moe {
namespace {
struct DTypeInfo {
  DType t;
  size_t size;
  const char* name;
  const char* st_name;
};
constexpr DTypeInfo kInfo[] = {
    {DType::f32, 4, "f32", "F32"}, {DType::bf16, 2, "bf16", "BF16"}, {DType::f16, 2, "f16", "F16"},
    {DType::i32, 4, "i32", "I32"}, {DType::i64, 8, "i64", "I64"}, {DType::f64, 8, "f64", "F64"},
};
const DTypeInfo& info(DType t) { return kInfo[size_t(t)]; }
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
const char* dtype_name(DType t) { return info(t).name; }
const char* dtype_safetensors_name(DType t) { return info(t).st_name; }
bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (name == i.name) return i.t;
  return std::nullopt;
}
std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (const auto& i : kInfo)
    if (name == i.st_name && i.t != DType::f64) return i.t;  // f64 is a compute dtype only, never in files
  return std::nullopt;
}

float to_f32(f16 h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {                                                        // zero / subnormal
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

f16 to_f16(float f) {
  // Round-to-nearest-even through the generic path: exact for our uses (tests, files).
  uint32_t u = f32_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  float a = std::fabs(f);
  if (std::isnan(f)) return f16{uint16_t(sign | 0x7e00u)};
  if (a >= 65520.0f) return f16{uint16_t(sign | 0x7c00u)};
  if (a < 6.103515625e-05f) {  // subnormal range: quantum 2^-24
    auto q = uint16_t(std::nearbyint(a * 16777216.0f));
    return f16{uint16_t(sign | q)};
  }
  int e;
  float m = std::frexp(a, &e);                       // a = m * 2^e, m in [0.5, 1)
  auto man = uint32_t(std::nearbyint(m * 2048.0f));  // 11 significant bits
  if (man == 2048) {
    man = 1024;
    ++e;
  }
  uint32_t exp = uint32_t(e - 1 + 15);
  if (exp >= 31) return f16{uint16_t(sign | 0x7c00u)};
  return f16{uint16_t(sign | (exp << 10) | (man & 0x3ffu))};
}

}  // namespace moe
