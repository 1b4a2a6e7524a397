// Opens the region of the neon level's translation unit (closed by
// target_end.h). AdvSIMD (with FMA) is part of every AArch64 CPU, so the
// region adds no feature; it exists so the Arm levels have the x86 levels'
// layout (x86/target_avx2.h has the rules). No include guard.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("neon"))), apply_to = function)
#else
#pragma GCC push_options
#endif
