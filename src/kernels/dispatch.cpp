// The kernel tables by level: the reference table here, the x86 levels'
// from src/kernels/x86/ (x86-64 builds only), the Arm levels' from
// src/kernels/arm/ (AArch64 builds only).
#include "kernels/dispatch.h"

#include "kernels/grouped_gemm.h"
#include "kernels/row_loops.h"
#include "moe/error.h"

namespace moe {
#if defined(MOE_HAVE_X86_KERNELS)
namespace x86 {
const kernels::Table& table_avx2();
const kernels::Table& table_avx512();
const kernels::Table& table_avx512_bf16();
const kernels::Table& table_amx_bf16();
}  // namespace x86
#endif
#if defined(MOE_HAVE_ARM_KERNELS)
namespace arm {
const kernels::Table& table_neon();
const kernels::Table& table_neon_bf16();
}  // namespace arm
#endif

namespace kernels {
namespace {

const Table& reference_table() {
  static const Table t = [] {
    Table r = portable_table(Isa::reference);
    r.gmm = reference::gmm;
    r.gmm_dlhs = reference::gmm_dlhs;
    r.gmm_drhs = reference::gmm_drhs;
    r.gmm_pair = reference::gmm_pair;
    r.gmm_dlhs_add = reference::gmm_dlhs_add;
    return r;
  }();
  return t;
}

}  // namespace

const Table& table(Isa isa) {
  switch (isa) {
    case Isa::reference: return reference_table();
#if defined(MOE_HAVE_X86_KERNELS)
    case Isa::avx2: return x86::table_avx2();
    case Isa::avx512: return x86::table_avx512();
    case Isa::avx512_bf16: return x86::table_avx512_bf16();
    case Isa::amx_bf16:
      return x86::table_amx_bf16();
#endif
#if defined(MOE_HAVE_ARM_KERNELS)
    case Isa::neon: return arm::table_neon();
    case Isa::neon_bf16: return arm::table_neon_bf16();
#endif
    default: break;
  }
  MOE_ASSERT(false, "no kernel table for this level in this build");
  return reference_table();
}

}  // namespace kernels
}  // namespace moe
