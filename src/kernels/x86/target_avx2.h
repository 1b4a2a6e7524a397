// Opens the AVX2 + FMA region of a kernel translation unit (closed by
// target_end.h). Include it AFTER every other header, so no shared inline
// function (std::vector, ...) is emitted with AVX2 code: the dispatch
// (kernels/dispatch.cpp) calls into this code only on a CPU that has it.
// No include guard: each .cpp includes it once.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
