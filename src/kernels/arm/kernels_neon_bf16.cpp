// The neon_bf16 level: the neon level with bf16 inputs multiplied by the bf16
// dot product BFDOT (FEAT_BF16; a bf16 pair per 32-bit word, DpStep, f32
// accumulate) on 5 x 16 tiles (20 accumulators + 4 B vectors + 5 broadcast
// words of A of the 32 registers). Without FEAT_EBF16 (or with FPCR.EBF = 0) BFDOT
// rounds its two internal additions to odd and flushes bf16 denormal inputs
// and results to zero, so this level differs from the others in the last
// bits (the measured difference and the tests' bound: docs/architecture.md).
// BFMMLA (a 2 x 4 by 4 x 2 block per instruction) is not used: its output
// layout is 2 x 2 per register, not the one-row vectors every level's tile
// and store share.
#include "kernels/arm/kernel_headers.h"

#include "kernels/arm/target_neon_bf16.h"

#include "kernels/row_loops.h"
#include "kernels/arm/simd_neon.h"
#include "kernels/simd/gemm_impl.h"
#include "kernels/simd/rows_impl.h"

namespace moe::arm {
namespace {
using namespace simd;

// A word of A is a bf16 pair (k, k+1), broadcast to every lane; B is packed as
// interleaved pairs. Lane j: acc + (a_k * b_kj + a_k+1 * b_k+1,j).
struct DpStep {
  using F = float32x4_t;
  static constexpr int kPerWord = 2, kB = 1;
  static constexpr Pack kPack = Pack::pairs;
  // The last word of an odd row arrives zero-extended: its high half is zero, and so is B's.
  template <int b>
  MOE_INLINE static F operand(uint32_t w) {
    return vreinterpretq_f32_u32(vdupq_n_u32(w));
  }
  MOE_INLINE static F madd(F acc, F a, F b) {
    return vbfdotq_f32(acc, vreinterpretq_bf16_f32(a), vreinterpretq_bf16_f32(b));
  }
};

// f32 as at neon; bf16 pairs on 5 x 4 vectors (kernels_neon.cpp: why not 6).
using LevelNeonBf16 = Level<Neon, TileShape<F32Step<Neon>, 5, 4>, TileShape<DpStep, 5, 4>>;
}  // namespace

const kernels::Table& table_neon_bf16() {
  static const kernels::Table t = simd::level_table<LevelNeonBf16>(Isa::neon_bf16);
  return t;
}

}  // namespace moe::arm

#include "kernels/arm/target_end.h"
