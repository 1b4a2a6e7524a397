// Element types of tensors, and exact conversions between them.
//
// bf16 rounding is round-to-nearest-even; NaN stays NaN (quiet), infinities
// stay infinite. f16 is only read from files (converted to f32 on load). f64
// is the compute dtype of the reference-only double path (gradcheck, docs/python.md);
// it comes last so the other values keep their numbers.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

namespace moe {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, f64 };

// Storage types for the two 16-bit float formats: plain bit containers, so
// arithmetic on them is a compile error rather than a silent integer op.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

size_t dtype_size(DType t);
// Engine spelling used in configs and messages: "f32", "bf16", "f16", "i32", "i64", "f64".
const char* dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);
// safetensors spelling: "F32", "BF16", "F16", "I32", "I64", "F64".
const char* dtype_safetensors_name(DType t);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
bool is_float(DType t);

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round-to-nearest-even f32 -> bf16. Branch-free (a select), so loops over
// rows vectorize; a NaN stays a quiet NaN.
inline bf16 to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x40u;
  return bf16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}
inline float to_f32(bf16 h) { return bits_to_f32(uint32_t(h.bits) << 16); }
// Round a float to the nearest bf16 value, kept in f32.
inline float round_bf16(float f) { return to_f32(to_bf16(f)); }

float to_f32(f16 h);
f16 to_f16(float f);

// Compile-time mapping from C++ element type to DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};

// Load/store helpers so templated kernels read any float type as f32.
inline float load_f32(float v) { return v; }
inline float load_f32(bf16 v) { return to_f32(v); }
template <class T>
inline T store_as(float v);
template <>
inline float store_as<float>(float v) {
  return v;
}
template <>
inline bf16 store_as<bf16>(float v) {
  return to_bf16(v);
}

// The accumulator of a stored element type: f32 for f32 and bf16 (the fast
// and reference kernels), f64 for f64 (the reference-only double path).
template <class T>
struct acc_of {
  using type = float;
};
template <>
struct acc_of<double> {
  using type = double;
};
template <class T>
using acc_t = typename acc_of<T>::type;

// load_as<Acc>(v): v widened to the accumulator type (load_f32 for Acc = float).
template <class Acc, class T>
inline Acc load_as(T v) {
  return load_f32(v);
}
template <>
inline double load_as<double, double>(double v) {
  return v;
}
// store_acc<Out>(acc): an accumulator rounded once to the output type (store_as for float).
template <class Out>
inline Out store_acc(float v) {
  return store_as<Out>(v);
}
template <class Out>
inline Out store_acc(double v) {
  static_assert(std::is_same_v<Out, double>, "an f64 accumulator is stored as f64 only");
  return v;
}

}  // namespace moe
