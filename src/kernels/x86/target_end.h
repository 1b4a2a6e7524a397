// Closes a target region opened by target_avx2.h / target_avx512*.h.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
