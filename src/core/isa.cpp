// The kernel level: which levels exist, which this CPU and build run, the one
// asked for (MOE_GEMM_ISA) and the active one (include/moe/isa.h).
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/cpu_features.h"
#include "moe/error.h"
#include "moe/isa.h"

namespace moe {
namespace {

constexpr const char* kNames[] = {"reference", "avx2",      "avx512",  "avx512_bf16",
                                  "neon",      "neon_bf16", "amx_bf16"};

// Whether this build has the x86 kernel tables (src/kernels/x86/, x86-64 only).
constexpr bool kX86Kernels =
#if defined(MOE_HAVE_X86_KERNELS)
    true;
#else
    false;
#endif
// Whether this build has the Arm kernel tables (src/kernels/arm/, AArch64 only).
constexpr bool kArmKernels =
#if defined(MOE_HAVE_ARM_KERNELS)
    true;
#else
    false;
#endif

}  // namespace

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.avx2 && f.fma;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  switch (isa) {
    case Isa::reference: return true;
    case Isa::avx2: return kX86Kernels && avx2;
    case Isa::avx512: return kX86Kernels && avx512;
    case Isa::avx512_bf16: return kX86Kernels && avx512 && f.avx512_bf16;
    case Isa::amx_bf16:
      return kX86Kernels && avx512 && f.avx512_bf16 && f.amx_bf16;
    case Isa::neon: return kArmKernels && f.asimd;
    case Isa::neon_bf16: return kArmKernels && f.asimd && f.bf16;
  }
  return false;
}

namespace {

std::atomic<int> g_active{-1};
std::mutex g_init;

}  // namespace

const char* isa_name(Isa isa) { return kNames[int(isa)]; }

std::optional<Isa> isa_from_name(std::string_view name) {
  for (Isa i : isa_all())
    if (name == isa_name(i)) return i;
  return std::nullopt;
}

std::string isa_list(const std::vector<Isa>& levels) {
  std::string s;
  for (Isa i : levels) s += (s.empty() ? "" : ", ") + std::string(isa_name(i));
  return s;
}

std::vector<Isa> isa_all() {
  return {Isa::reference, Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx_bf16, Isa::neon, Isa::neon_bf16};
}

std::vector<Isa> isa_available() {
  std::vector<Isa> out;
  for (Isa i : isa_all())
    if (isa_supported(i)) out.push_back(i);
  return out;
}

Isa isa_requested() {
  const char* env = std::getenv("MOE_GEMM_ISA");
  if (!env || !*env) return isa_available().back();
  std::optional<Isa> isa = isa_from_name(env);
  if (!isa)
    fail("MOE_GEMM_ISA=", env, " names no kernel level; the levels are ", isa_list(isa_all()),
         ", and this CPU runs ", isa_list(isa_available()));
  if (!isa_supported(*isa))
    fail("MOE_GEMM_ISA=", env, ": this CPU (or build) has no ", env, " kernels; it runs ", isa_list(isa_available()));
  return *isa;
}

Isa active_isa() {
  int a = g_active.load(std::memory_order_acquire);
  if (a >= 0) return Isa(a);
  std::lock_guard<std::mutex> lock(g_init);
  a = g_active.load(std::memory_order_relaxed);
  if (a < 0) {
    a = int(isa_requested());
    g_active.store(a, std::memory_order_release);
  }
  return Isa(a);
}

void set_active_isa(Isa isa) {
  if (!isa_supported(isa))
    fail("kernel level ", isa_name(isa), " is not available on this CPU (or build); it runs ",
         isa_list(isa_available()));
  g_active.store(int(isa), std::memory_order_release);
}

}  // namespace moe
