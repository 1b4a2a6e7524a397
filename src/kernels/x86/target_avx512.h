// Opens the AVX-512 (F, BW, VL, DQ) + FMA region of a kernel translation unit
// (closed by target_end.h); see target_avx2.h for the rules.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* in masked
// intrinsics) when they are inlined into pragma-targeted code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
