// The avx512_bf16 level: the avx512 level with bf16 inputs multiplied by the
// bf16 dot product vdpbf16ps (a bf16 pair per 32-bit word, DpStep) on 6 x 64
// tiles (24 accumulators + 4 B vectors of the 32 zmm registers; B panel
// Kc * 128 bytes: 512 KiB at Kc = 4096, fits L2). vdpbf16ps flushes bf16
// denormal inputs and results to zero, so this level may differ from the
// others there (within the documented bound).
#include "kernels/x86/kernel_headers.h"

#include "kernels/x86/target_avx512_bf16.h"

#include "kernels/row_loops.h"
#include "kernels/x86/simd_avx512_bf16.h"
#include "kernels/simd/gemm_impl.h"
#include "kernels/simd/rows_impl.h"
#include "kernels/simd/act_impl.h"

namespace moe::x86 {
namespace {
using namespace simd;

// A word of A is a bf16 pair (k, k+1); B is packed as interleaved pairs.
struct DpStep {
  using F = __m512;
  static constexpr int kPerWord = 2, kB = 1;
  static constexpr Pack kPack = Pack::pairs;
  // The last word of an odd row arrives zero-extended: its high half is zero, and so is B's.
  template <int b>
  MOE_INLINE static F operand(uint32_t w) {
    return _mm512_castsi512_ps(_mm512_set1_epi32(int(w)));
  }
  MOE_INLINE static F madd(F acc, F a, F b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(a), (__m512bh)_mm512_castps_si512(b));
  }
};

// f32 as at avx512; bf16 pairs on 6 x 4 vectors.
// Avx512Bf16: bf16 outputs rounded by VCVTNEPS2BF16 (simd_avx512_bf16.h).
using LevelAvx512Bf16 = Level<Avx512Bf16, TileShape<F32Step<Avx512Bf16>, 12, 2>, TileShape<DpStep, 6, 4>>;
}  // namespace

const kernels::Table& table_avx512_bf16() {
  static const kernels::Table t = simd::with_act_rows<Avx512Bf16>(simd::level_table<LevelAvx512Bf16>(Isa::avx512_bf16));
  return t;
}

}  // namespace moe::x86

#include "kernels/x86/target_end.h"
