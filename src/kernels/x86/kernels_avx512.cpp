// The avx512 level (AVX-512 F/BW/VL/DQ, 16 f32 lanes, 32 registers): f32
// tiles of 12 x 32 with FMA; bf16 widened to f32 (WidenStep) on the same tiles.
#include "kernels/x86/kernel_headers.h"

#include "kernels/x86/target_avx512.h"

#include "kernels/row_loops.h"
#include "kernels/x86/simd_avx512.h"
#include "kernels/simd/gemm_impl.h"
#include "kernels/simd/rows_impl.h"
#include "kernels/simd/act_impl.h"

namespace moe::x86 {
namespace {
using namespace simd;
// 12 x 2 vectors: 24 accumulators of the 32 zmm registers (B panel Kc * 128 bytes for f32:
// 512 KiB at Kc = 4096, fits L2), for f32 and widened bf16 alike.
// bf16 widened ahead (kWidenAhead, as at avx2): A widened to f32 once per call, the weights packed
// widened, the f32 12 x 2 tile. The CPUs that run this level are Intel's AVX-512 cores without BF16
// (Skylake-SP to Ice Lake; AMD's AVX-512 cores all have it); on an Intel core with two 512-bit FMA
// units the in-tile widening's shift or mask per operand shared the FMAs' two ports: the layer's
// step 1.12-1.19x faster widened ahead (docs/benchmarks.md, 2026-12-07), bits unchanged.
using LevelAvx512 = Level<Avx512, TileShape<F32Step<Avx512>, 12, 2>, TileShape<WidenStep<Avx512>, 12, 2>,
                          /*WidenAhead=*/true>;
}  // namespace

const kernels::Table& table_avx512() {
  static const kernels::Table t = simd::with_act_rows<Avx512>(simd::level_table<LevelAvx512>(Isa::avx512));
  return t;
}

}  // namespace moe::x86

#include "kernels/x86/target_end.h"
