// The neon level (AdvSIMD, 4 f32 lanes, 32 q registers): f32 tiles of 5 x 16
// with FMA (FMLA); bf16 widened to f32 (WidenStep) on the same tiles.
#include "kernels/arm/kernel_headers.h"

#include "kernels/arm/target_neon.h"

#include "kernels/row_loops.h"
#include "kernels/arm/simd_neon.h"
#include "kernels/simd/gemm_impl.h"
#include "kernels/simd/rows_impl.h"

namespace moe::arm {
namespace {
using namespace simd;
// 5 x 4 vectors: 20 accumulators + 4 B vectors + the 5 broadcast rows of A, which GCC loads
// together (6 rows: 34 live vectors, two accumulators spilled per step in the disassembly)
// (B panel Kc * 64 bytes for f32, widened bf16 twice that: 256 / 512 KiB at Kc = 4096).
using LevelNeon = Level<Neon, TileShape<F32Step<Neon>, 5, 4>, TileShape<WidenStep<Neon>, 5, 4>>;
}  // namespace

const kernels::Table& table_neon() {
  static const kernels::Table t = simd::level_table<LevelNeon>(Isa::neon);
  return t;
}

}  // namespace moe::arm

#include "kernels/arm/target_end.h"
