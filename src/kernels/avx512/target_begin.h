// Everything between target_begin.h and target_end.h is compiled for
// AVX-512 (F, BW, VL, DQ, BF16) and FMA. Include it AFTER every other header,
// so no shared inline function is emitted with AVX-512 code; the dispatcher
// (src/kernels/grouped_gemm.cpp) only calls into this code on a CPU that has
// these features. (No include guard: each .cpp includes it once.)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* in masked
// intrinsics) when they are inlined into pragma-targeted code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
