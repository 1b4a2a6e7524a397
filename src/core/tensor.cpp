#include "moe/tensor.h"

#include "core/allocator.h"
#include "kernels/dispatch.h"
#include "moe/thread_pool.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

namespace moe {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (d < 0) fail("shape ", shape_str(s), " has a negative dimension");
  // The product of the non-zero dimensions must fit, even when a zero makes the count 0.
  bool zero = false;
  for (int64_t d : s) {
    zero = zero || d == 0;
    if (d != 0 && __builtin_mul_overflow(n, d, &n))
      fail("shape ", shape_str(s), " has too many elements: the count overflows 64 bits");
  }
  return zero ? 0 : n;
}

namespace {
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};

void count_alloc(int64_t bytes) {
  int64_t now = g_live_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (now > peak && !g_peak_bytes.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

std::shared_ptr<std::byte> allocate(size_t bytes) {
  size_t padded = (bytes + Tensor::kAlign - 1) / Tensor::kAlign * Tensor::kAlign;
  if (padded == 0) padded = Tensor::kAlign;
  void* p = alloc::acquire(padded, Tensor::kAlign);
  if (!p) fail("out of memory allocating ", bytes, " bytes");
  count_alloc(int64_t(padded));
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [padded](std::byte* q) {
    g_live_bytes.fetch_sub(int64_t(padded), std::memory_order_relaxed);
    alloc::release(q, padded);
  });
}
}  // namespace

TensorMemoryStats tensor_memory_stats() {
  return {g_live_bytes.load(std::memory_order_relaxed), g_peak_bytes.load(std::memory_order_relaxed)};
}

TensorMemoryStats reset_tensor_memory_peak() {
  g_peak_bytes.store(g_live_bytes.load(std::memory_order_relaxed), std::memory_order_relaxed);
  return tensor_memory_stats();
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  if (t.numel_ > (INT64_MAX - int64_t(Tensor::kAlign)) / int64_t(dtype_size(dtype)))
    fail("shape ", shape_str(shape), " of ", dtype_name(dtype),
         " is too large: its byte size overflows 63 bits");
  t.shape_ = std::move(shape);
  t.storage_ = allocate(t.nbytes());
  return t;
}

Tensor Tensor::from_external(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner) {
  Tensor t;
  t.dtype_ = dtype;
  t.numel_ = shape_numel(shape);
  t.shape_ = std::move(shape);
  MOE_ASSERT(data != nullptr || t.numel_ == 0, "Tensor::from_external: null data");
  MOE_ASSERT(reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0,
             "Tensor::from_external: data not aligned to its element size");
  // The aliasing constructor: shares owner's control block, points at data.
  t.storage_ = std::shared_ptr<std::byte>(std::move(owner), static_cast<std::byte*>(data));
  return t;
}

Tensor::Tensor(DType dtype, Shape shape) {
  *this = empty(dtype, std::move(shape));
  std::memset(raw(), 0, nbytes());
}

Tensor Tensor::scalar_f32(float v) {
  Tensor t = empty(DType::f32, {});
  t.data<float>()[0] = v;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

float Tensor::get_f32(int64_t i) const {
  MOE_ASSERT(i >= 0 && i < numel_, "Tensor::get_f32 index out of range");
  switch (dtype_) {
    case DType::f32: return data<float>()[i];
    case DType::bf16: return to_f32(data<bf16>()[i]);
    case DType::f16: return to_f32(data<f16>()[i]);
    case DType::i32: return float(data<int32_t>()[i]);
    case DType::i64: return float(data<int64_t>()[i]);
    case DType::f64: return float(data<double>()[i]);
  }
  return 0;
}

double Tensor::get_f64(int64_t i) const {
  MOE_ASSERT(i >= 0 && i < numel_, "Tensor::get_f64 index out of range");
  switch (dtype_) {
    case DType::f64: return data<double>()[i];
    case DType::i64: return double(data<int64_t>()[i]);
    default: return double(get_f32(i));
  }
}

namespace {
// f32 <-> bf16, the conversions of every step (weights to the compute dtype):
// the active kernel level's row casts (kernels/dispatch.h), split over the compute pool.
bool convert_fast(const Tensor& in, Tensor& out) {
  const int64_t n = in.numel();
  if (in.dtype() == DType::f32 && out.dtype() == DType::bf16) {
    const float* s = in.data<float>();
    bf16* d = out.data<bf16>();
    const auto cast = kernels::table().f32_to_bf16;
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { cast(s + b, d + b, e - b); });
    return true;
  }
  if (in.dtype() == DType::bf16 && out.dtype() == DType::f32) {
    const bf16* s = in.data<bf16>();
    float* d = out.data<float>();
    const auto cast = kernels::table().bf16_to_f32;
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) { cast(s + b, d + b, e - b); });
    return true;
  }
  return false;
}
}  // namespace

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(dtype, shape_);
  if (convert_fast(*this, out)) return out;
  const int64_t n = numel_;
  if (is_float(dtype_) && is_float(dtype)) {
    // f64 on either side: exact widening to f64, or f64 rounded to f32 first (as torch does).
    if (dtype == DType::f64) {
      for (int64_t i = 0; i < n; ++i) out.data<double>()[i] = get_f64(i);
      return out;
    }
    for (int64_t i = 0; i < n; ++i) {
      float v = get_f32(i);
      switch (dtype) {
        case DType::f32: out.data<float>()[i] = v; break;
        case DType::bf16: out.data<bf16>()[i] = to_bf16(v); break;
        case DType::f16: out.data<f16>()[i] = to_f16(v); break;
        default: break;
      }
    }
    return out;
  }
  if (dtype_ == DType::i64 && dtype == DType::i32) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v = data<int64_t>()[i];
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        fail("cannot convert i64 value ", v, " to i32");
      out.data<int32_t>()[i] = int32_t(v);
    }
    return out;
  }
  if (dtype_ == DType::i32 && dtype == DType::i64) {
    for (int64_t i = 0; i < n; ++i) out.data<int64_t>()[i] = data<int32_t>()[i];
    return out;
  }
  fail("cannot convert a ", dtype_name(dtype_), " tensor to ", dtype_name(dtype));
}

Tensor Tensor::reshaped(Shape shape) const {
  if (shape_numel(shape) != numel_)
    fail("cannot reshape ", shape_str(shape_), " to ", shape_str(shape), ": element counts differ");
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MOE_ASSERT(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "slice_rows out of range");
  Tensor t = *this;
  int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  size_t off = size_t(begin * row) * dtype_size(dtype_);
  t.storage_ = std::shared_ptr<std::byte>(storage_, storage_.get() + off);
  return t;
}

bool Tensor::bit_equal(const Tensor& o) const {
  return dtype_ == o.dtype_ && shape_ == o.shape_ && (nbytes() == 0 || std::memcmp(raw(), o.raw(), nbytes()) == 0);
}

void expect_shape(const Tensor& t, const Shape& shape, const std::string& what) {
  if (t.shape() != shape)
    fail(what, ": expected shape ", shape_str(shape), ", got ", shape_str(t.shape()));
}

}  // namespace moe
