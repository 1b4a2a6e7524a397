// Closes a target region opened by target_avx2.h / target_avx512*.h.
#pragma GCC pop_options
