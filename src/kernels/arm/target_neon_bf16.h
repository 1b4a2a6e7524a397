// Opens the Armv8.2-A AdvSIMD + BF16 region (FEAT_BF16: BFDOT, BFMMLA; GCC
// wants the architecture with the feature, or the intrinsics do not inline) of the
// neon_bf16 level's translation unit (closed by target_end.h). Include it
// AFTER every other header (x86/target_avx2.h has the rules): the dispatch
// calls into it only on a CPU with HWCAP2_BF16. No include guard.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+bf16")
#endif
