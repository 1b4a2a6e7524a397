// The avx2 level (AVX2 + FMA, 8 f32 lanes, 16 registers): f32 tiles of 6 x 16
// with FMA; bf16 widened to f32 (WidenStep) on the same tiles.
#include "kernels/x86/kernel_headers.h"

#include "kernels/x86/target_avx2.h"

#include "kernels/row_loops.h"
#include "kernels/x86/simd_avx2.h"
#include "kernels/x86/gemm_impl.h"
#include "kernels/x86/rows_impl.h"

namespace moe::x86 {
namespace {
// 6 x 2 vectors: 12 accumulators of the 16 ymm registers.
struct ShapeF32 {
  using Step = F32Step<Avx2>;
  static constexpr int MR = 6, NV = 2;
};
// Widened bf16: 5 x 2 vectors (10 accumulators + 2 B vectors + the operand and
// the high-half mask; 6 rows spill accumulators).
struct ShapeWiden {
  using Step = WidenStep<Avx2>;
  static constexpr int MR = 5, NV = 2;
};
struct LevelAvx2 {
  using V = Avx2;
  template <class T>
  using Shape = std::conditional_t<std::is_same_v<T, float>, ShapeF32, ShapeWiden>;
};
}  // namespace

const kernels::Table& table_avx2() {
  static const kernels::Table t = level_table<LevelAvx2>(Isa::avx2);
  return t;
}

}  // namespace moe::x86

#include "kernels/x86/target_end.h"
