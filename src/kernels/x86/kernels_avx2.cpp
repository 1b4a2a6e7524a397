// The avx2 level (AVX2 + FMA, 8 f32 lanes, 16 registers): f32 tiles of 6 x 16
// with FMA; bf16 widened to f32 ahead (A once per call, the weights as they are
// packed) and run on the f32 tile (kWidenAhead).
#include "kernels/x86/kernel_headers.h"

#include "kernels/x86/target_avx2.h"

#include "kernels/row_loops.h"
#include "kernels/x86/simd_avx2.h"
#include "kernels/simd/gemm_impl.h"
#include "kernels/simd/rows_impl.h"
#include "kernels/simd/act_impl.h"

namespace moe::x86 {
namespace {
using namespace simd;
// f32: 6 x 2 vectors (12 accumulators of the 16 ymm registers). bf16 widens ahead to use it: the
// in-tile widening (WidenStep, 5 x 2: 10 accumulators + 2 B vectors + the operand and the
// high-half mask) took 0.95-1.23x the time per op, 1.05 by the median (docs/benchmarks.md,
// 2026-12-03). The bf16 shape stays for the level's template; no call reaches it.
// Every panel task prefetches the weights the next task packs, as at the other levels. From
// 2026-12-03 to 2026-12-05 tasks of 128 rows or more did not (1.05-1.15x faster forward GEMMs
// without it at 256 rows per expert on the slower VM of then); on the faster Zen 5 VM since, the
// forward FFN at 256 rows per expert ran 1.5-4% faster with it in all five cases measured
// (docs/benchmarks.md, "Prefetching the next task at avx2, again").
using LevelAvx2 = Level<Avx2, TileShape<F32Step<Avx2>, 6, 2>, TileShape<WidenStep<Avx2>, 5, 2>, true>;
}  // namespace

const kernels::Table& table_avx2() {
  static const kernels::Table t = simd::with_act_rows<Avx2>(simd::level_table<LevelAvx2>(Isa::avx2));
  return t;
}

}  // namespace moe::x86

#include "kernels/x86/target_end.h"
