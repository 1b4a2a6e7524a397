// Tensor: a dtype, a row-major shape and 64-byte aligned shared storage.
//
// Copies are shallow (they share storage); clone() copies the bytes. Kernels
// take raw pointers and sizes (STYLE.md: op vs kernel); ops check shapes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/dtype.h"
#include "moe/error.h"

namespace moe {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  static constexpr size_t kAlign = 64;

  Tensor() = default;
  // Zero-filled tensor.
  Tensor(DType dtype, Shape shape);
  // Uninitialized storage (for outputs every element of which is written).
  static Tensor empty(DType dtype, Shape shape);
  // A scalar f32 tensor (shape []).
  static Tensor scalar_f32(float v);
  // A view of memory the engine does not own (another library's tensor, zero-copy): `data`
  // holds shape_numel(shape) elements of `dtype`, row-major, at least element-aligned; `owner`
  // keeps it alive until the last copy of the tensor goes. Not counted by tensor_memory_stats.
  // It need not be 64-byte aligned: kernels load unaligned, and their non-temporal stores
  // check the alignment of the engine's own outputs. Writes through the tensor (none in
  // layer_forward/layer_backward, which only read their inputs) reach the owner's memory.
  static Tensor from_external(DType dtype, Shape shape, void* data, std::shared_ptr<void> owner);

  bool defined() const { return storage_ != nullptr || numel_ == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return int(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(size_t(i < 0 ? i + ndim() : i)); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return size_t(numel_) * dtype_size(dtype_); }

  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  template <class T>
  T* data() {
    MOE_ASSERT(dtype_of<T>::value == dtype_, "Tensor::data<T>: element type does not match dtype");
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    MOE_ASSERT(dtype_of<T>::value == dtype_, "Tensor::data<T>: element type does not match dtype");
    return static_cast<const T*>(raw());
  }

  // Deep copy.
  Tensor clone() const;
  // Converted copy (float types round-to-nearest-even; ints convert exactly
  // or fail for out-of-range values). Same dtype returns *this (shared).
  Tensor to(DType dtype) const;
  // Same storage, new shape with the same element count.
  Tensor reshaped(Shape shape) const;
  // Rows [begin, end) of dim 0, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;

  // Element i as f32 (float dtypes) — for tests and small reductions.
  float get_f32(int64_t i) const;
  // Element i of a float or integer tensor as f64 (exact for every dtype but i64 beyond 2^53).
  double get_f64(int64_t i) const;
  // Bitwise equality of dtype, shape and bytes.
  bool bit_equal(const Tensor& o) const;

 private:
  DType dtype_ = DType::f32;
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<std::byte> storage_;
};

// Live tensor storage, process-wide: every Tensor allocation adds its padded
// size to `current` when made and subtracts it when its last owner releases
// it; `peak` is the largest `current` since the last reset. Two relaxed
// atomics per allocation (cheap next to the allocation itself). Used by
// `moe bench` to report a step's own peak memory (peak RSS is process-wide
// and never goes down). Thread safety: any thread may allocate; the numbers
// are exact whenever no allocation is in flight.
struct TensorMemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};
TensorMemoryStats tensor_memory_stats();
// peak := current. Returns the new stats.
TensorMemoryStats reset_tensor_memory_peak();

// Throws moe::Error "<what>: expected shape [..] <dtype>, got [..]" when the
// tensor does not match.
void expect_shape(const Tensor& t, const Shape& shape, const std::string& what);

}  // namespace moe
