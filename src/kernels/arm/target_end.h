// Closes a target region opened by target_neon.h / target_neon_bf16.h.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
