// The CPU's identity and instruction-set features, read once (cpuid on
// x86-64; the kernel's hardware capabilities, getauxval(AT_HWCAP, AT_HWCAP2),
// and the SVE vector length, prctl(PR_SVE_GET_VL), on AArch64 Linux). Used by the kernel dispatch
// (kernels/dispatch.cpp) and `moe info`.
#pragma once

#include <string>
#include <vector>

namespace moe {

struct CpuFeatures {
  std::string arch;    // "x86_64", "aarch64", ...
  std::string vendor;  // cpuid vendor string ("AuthenticAMD", "GenuineIntel"), else empty
  std::string model;   // brand string, else empty
  int logical_cpus = 0;
  // x86-64 features the kernels use.
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512_bf16 = false;
  // AMX tiles with the bf16 tile multiply (TDPBF16PS), the OS saving the tile state (XCR0 bits 17-18)
  // and, on Linux, the kernel granting this process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM,
  // asked once here): set only when the tiles can run.
  bool amx_bf16 = false;
  // AArch64 features (HWCAP names): AdvSIMD, half-precision arithmetic, BFDOT/BFMMLA, the int8
  // matrix multiply, SVE and SVE2, and the SVE vector length this thread runs with (0: no SVE).
  bool asimd = false, fphp = false, bf16 = false, i8mm = false, sve = false, sve2 = false;
  int sve_vector_bits = 0;
  // The flags above that are set, by name ("avx2", "fma", "avx512f", ..., "asimd", "bf16", ...).
  std::vector<std::string> names() const;
};

const CpuFeatures& cpu_features();

}  // namespace moe
