// Opens the AVX2 + FMA region of a kernel translation unit (closed by
// target_end.h). Include it AFTER every other header, so no shared inline
// function (std::vector, ...) is emitted with AVX2 code: the dispatch
// (kernels/dispatch.cpp) calls into this code only on a CPU that has it.
// No include guard: each .cpp includes it once.
#if defined(__clang__)
// clang has no GCC target pragma: the same region as an attribute on every function in it.
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
