// Function multiversioning for the few plain loops that run on every step
// (bf16 casts, the permute/combine row primitives): GCC builds an AVX-512,
// an AVX2 and a baseline copy and picks one at load time (an ifunc).
// Sanitizer builds turn it off: an ifunc resolver runs before the sanitizer
// runtime is initialized.
#pragma once

#if defined(MOE_NO_TARGET_CLONES)
#define MOE_TARGET_CLONES
#else
#define MOE_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
