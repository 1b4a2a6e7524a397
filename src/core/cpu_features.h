// The CPU's identity and instruction-set features, read once (cpuid on
// x86-64; the compiler's view elsewhere). Used by the kernel dispatch
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
  // The flags above that are set, by name ("avx2", "fma", "avx512f", ...).
  std::vector<std::string> names() const;
};

const CpuFeatures& cpu_features();

}  // namespace moe
