// Tensors across the Python boundary, zero-copy both ways, by DLPack (docs/python.md).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "moe/tensor.h"

namespace moe::python {

// A view of `obj`'s memory: obj has __dlpack__ (torch.Tensor, numpy.ndarray) or is a "dltensor"
// capsule. REQUIRES (else moe::Error naming `what`): CPU memory, row-major contiguous (strides of
// size-1 dimensions are ignored), dtype float32, bfloat16, float64 or int32. The producer's memory stays
// alive as long as the returned tensor (or any copy of it). Memory not aligned to its element
// size is the one case that is copied. GIL: held by the caller.
Tensor from_dlpack(pybind11::handle obj, const std::string& what);

// A "dltensor" capsule sharing t's storage; whoever consumes it (torch.utils.dlpack.from_dlpack,
// numpy.from_dlpack) keeps the storage alive until it releases it.
pybind11::capsule to_dlpack(const Tensor& t);

}  // namespace moe::python
