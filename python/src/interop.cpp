#include "interop.h"

#include <cstring>
#include <memory>
#include <vector>

#include "dlpack_abi.h"

namespace py = pybind11;

namespace moe::python {
namespace {

constexpr const char* kCapsule = "dltensor";
constexpr const char* kUsedCapsule = "used_dltensor";

std::string dl_dtype_name(const DLDataType& t) {
  const char* code = t.code == kDLInt ? "int" : t.code == kDLUInt ? "uint" : t.code == kDLFloat ? "float"
                     : t.code == kDLBfloat ? "bfloat" : "code";
  std::string s = code + std::to_string(t.bits);
  if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
  return s;
}

DType dtype_of(const DLDataType& t, const std::string& what) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLFloat && t.bits == 64) return DType::f64;
  }
  fail(what, ": dtype ", dl_dtype_name(t),
       " is not supported (expected float32, bfloat16, float64 or int32)");
}

DLDataType dl_dtype_of(DType t) {
  switch (t) {
    case DType::f32: return {kDLFloat, 32, 1};
    case DType::bf16: return {kDLBfloat, 16, 1};
    case DType::f16: return {kDLFloat, 16, 1};
    case DType::i32: return {kDLInt, 32, 1};
    case DType::i64: return {kDLInt, 64, 1};
    case DType::f64: return {kDLFloat, 64, 1};
  }
  MOE_ASSERT(false, "dl_dtype_of: unknown dtype");
  return {};
}

// Row-major contiguous, ignoring the strides of size-1 dimensions (torch reports any value there).
// An empty tensor (a zero dimension) has no element to misplace, whatever its strides.
bool is_row_major(const DLTensor& t) {
  if (!t.strides) return true;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return true;
  int64_t expect = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

// Releases a consumed DLManagedTensor: its deleter may touch Python objects (numpy's does), and
// the last copy of a tensor may go on any thread, so it runs holding the GIL.
void release_managed(DLManagedTensor* m) {
  if (!m->deleter) return;
  if (!Py_IsInitialized()) return;  // at exit: leave it to the process
  PyGILState_STATE g = PyGILState_Ensure();
  m->deleter(m);
  PyGILState_Release(g);
}

py::object capsule_of(py::handle obj, const std::string& what) {
  if (PyCapsule_CheckExact(obj.ptr())) return py::reinterpret_borrow<py::object>(obj);
  if (!py::hasattr(obj, "__dlpack__"))
    fail(what, ": expected a tensor with __dlpack__ (torch.Tensor, numpy.ndarray), got ",
         std::string(py::str(py::type::of(obj).attr("__name__"))));
  return obj.attr("__dlpack__")();
}
}  // namespace

Tensor from_dlpack(py::handle obj, const std::string& what) {
  py::object cap = capsule_of(obj, what);
  if (!PyCapsule_IsValid(cap.ptr(), kCapsule)) fail(what, ": not an unconsumed DLPack capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), kCapsule));
  const DLTensor& t = m->dl_tensor;
  // Checks before taking ownership: on an error the capsule still frees the producer's tensor.
  if (t.device.device_type != kDLCPU)
    fail(what, ": expected a CPU tensor, got DLPack device type ", t.device.device_type);
  const DType dt = dtype_of(t.dtype, what);
  if (!is_row_major(t)) fail(what, ": expected a contiguous row-major tensor (call .contiguous() first)");
  Shape shape(t.shape, t.shape + t.ndim);
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  if (PyCapsule_SetName(cap.ptr(), kUsedCapsule) != 0) throw py::error_already_set();
  std::shared_ptr<void> owner(m, [](void* p) { release_managed(static_cast<DLManagedTensor*>(p)); });
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dt) != 0) {  // misaligned: the one copy
    Tensor c = Tensor::empty(dt, shape);
    std::memcpy(c.raw(), data, c.nbytes());
    return c;
  }
  return Tensor::from_external(dt, std::move(shape), data, std::move(owner));
}

namespace {
struct Export {
  Tensor tensor;  // shares the engine's storage
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* m) { delete static_cast<Export*>(m->manager_ctx); }

void capsule_destructor(PyObject* cap) {
  // Consumed capsules are renamed "used_dltensor": their consumer owns the tensor then.
  if (!PyCapsule_IsValid(cap, kCapsule)) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, kCapsule));
  m->deleter(m);
}
}  // namespace

py::capsule to_dlpack(const Tensor& t) {
  auto* e = new Export;
  e->tensor = t;
  e->shape = t.shape();
  e->strides.assign(e->shape.size(), 1);
  for (int i = int(e->shape.size()) - 2; i >= 0; --i) e->strides[size_t(i)] = e->strides[size_t(i) + 1] * e->shape[size_t(i) + 1];
  DLTensor& d = e->managed.dl_tensor;
  d.data = const_cast<void*>(e->tensor.raw());
  d.device = {kDLCPU, 0};
  d.ndim = int32_t(e->shape.size());
  d.dtype = dl_dtype_of(t.dtype());
  d.shape = e->shape.data();
  d.strides = e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = &delete_export;
  return py::capsule(&e->managed, kCapsule, &capsule_destructor);
}

}  // namespace moe::python
