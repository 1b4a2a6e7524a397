#include "core/cpu_features.h"

#include <cstring>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

namespace moe {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// The OS saves the AVX (ymm) and AVX-512 (opmask, zmm) state: XCR0 bits 1-2 and 5-7.
bool os_saves(unsigned mask) {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (eax & mask) == mask;
}

// Linux hands out the AMX tile data state (XFEATURE 18, 8 KiB per thread) only to a process that
// asks for it (arch_prctl ARCH_REQ_XCOMP_PERM, kernel 5.16 on); without it the first tile
// instruction faults. The permission is the process's, for every thread, and asking again is
// harmless. It fails where the kernel is older or the threads' alternate signal stacks are too
// small for the larger signal frame; the tile level is then not offered.
bool os_grants_tile_data() {
#if defined(__x86_64__) && defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

void detect_x86(CpuFeatures& f) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return;
  const unsigned max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4), std::memcpy(vendor + 4, &d, 4), std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  __get_cpuid(1, &a, &b, &c, &d);
  const bool osxsave = c & (1u << 27);
  const bool ymm = osxsave && os_saves(0x6), zmm = osxsave && os_saves(0xe6);
  f.fma = ymm && (c & (1u << 12));
  f.f16c = ymm && (c & (1u << 29));
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = ymm && (b & (1u << 5));
    f.avx512f = zmm && (b & (1u << 16));
    f.avx512dq = zmm && (b & (1u << 17));
    f.avx512bw = zmm && (b & (1u << 30));
    f.avx512vl = zmm && (b & (1u << 31));
    const unsigned sub_leaves = a;
    const bool amx_tile = d & (1u << 24), amx_bf16 = d & (1u << 22);
    f.amx_bf16 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && amx_tile && amx_bf16 && osxsave &&
                 os_saves(0x60000) && os_grants_tile_data();
    if (sub_leaves >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx512_bf16 = zmm && (a & (1u << 5));
    }
  }
  unsigned ext = __get_cpuid_max(0x80000000u, nullptr);
  if (ext >= 0x80000004u) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002u + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i, &a, 4), std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4), std::memcpy(brand + 16 * i + 12, &d, 4);
    }
    std::string s = brand;
    while (!s.empty() && s.back() == ' ') s.pop_back();
    while (!s.empty() && s.front() == ' ') s.erase(s.begin());
    f.model = s;
  }
}
#endif

#if defined(__aarch64__) && defined(__linux__)
// Bits of AT_HWCAP and AT_HWCAP2 (the Linux arm64 ABI, asm/hwcap.h; spelled out so older headers build).
constexpr unsigned long kHwcapAsimd = 1ul << 1, kHwcapFphp = 1ul << 9, kHwcapSve = 1ul << 22;
constexpr unsigned long kHwcap2Sve2 = 1ul << 1, kHwcap2I8mm = 1ul << 13, kHwcap2Bf16 = 1ul << 14;
constexpr int kPrSveGetVl = 51;          // PR_SVE_GET_VL
constexpr int kPrSveVlLenMask = 0xffff;  // PR_SVE_VL_LEN_MASK: the vector length in bytes

void detect_arm(CpuFeatures& f) {
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f.asimd = hw & kHwcapAsimd;
  f.fphp = hw & kHwcapFphp;
  f.sve = hw & kHwcapSve;
  f.sve2 = hw2 & kHwcap2Sve2;
  f.i8mm = hw2 & kHwcap2I8mm;
  f.bf16 = hw2 & kHwcap2Bf16;
  if (f.sve) {
    const int vl = prctl(kPrSveGetVl, 0, 0, 0, 0);
    if (vl > 0) f.sve_vector_bits = 8 * (vl & kPrSveVlLenMask);
  }
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  f.arch = "x86_64";
#elif defined(__aarch64__)
  f.arch = "aarch64";
#elif defined(__i386__)
  f.arch = "i386";
#else
  f.arch = "unknown";
#endif
#if defined(__x86_64__) || defined(__i386__)
  detect_x86(f);
#endif
#if defined(__aarch64__) && defined(__linux__)
  detect_arm(f);
#endif
  f.logical_cpus = int(std::thread::hardware_concurrency());
  return f;
}

}  // namespace

std::vector<std::string> CpuFeatures::names() const {
  std::vector<std::string> out;
  const std::pair<bool, const char*> all[] = {
      {avx2, "avx2"},         {fma, "fma"},           {f16c, "f16c"},         {avx512f, "avx512f"},
      {avx512bw, "avx512bw"}, {avx512vl, "avx512vl"}, {avx512dq, "avx512dq"}, {avx512_bf16, "avx512_bf16"},
      {amx_bf16, "amx_bf16"}, {asimd, "asimd"},       {fphp, "fphp"},         {bf16, "bf16"},
      {i8mm, "i8mm"},         {sve, "sve"},           {sve2, "sve2"}};
  for (auto [on, name] : all)
    if (on) out.emplace_back(name);
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace moe
