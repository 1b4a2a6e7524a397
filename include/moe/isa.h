// Kernel levels (instruction sets the fast kernels are built for) and the one
// dispatch: a table of kernels per level, chosen once from the CPU's features
// (or forced with MOE_GEMM_ISA), the same level on every MPI rank.
//
// Levels, lowest first: `reference` (the plain reference twins, any CPU),
// on x86-64 `avx2` (AVX2 + FMA; bf16 widened to f32 while packing), `avx512`
// (AVX-512 F/BW/VL/DQ; bf16 widened), `avx512_bf16` (AVX-512 plus the bf16
// dot product vdpbf16ps); on AArch64 `neon` (AdvSIMD FMA; bf16 widened) and
// `neon_bf16` (AdvSIMD plus the bf16 dot product BFDOT). A build has the
// levels of its architecture only. Results at one level are deterministic;
// levels may differ from each other in rounding (summation order, the bf16
// dot products' rounding and denormal flushing), never in the contracts (row
// independence, fused = split = EP).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moe {

// The numbers order the levels of one architecture (lowest first): the MPI agreement takes the
// lowest of all ranks, and ranks of one job run one build, so one architecture.
// amx_bf16 came later, so its number is past the Arm levels; it is the highest x86 level.
enum class Isa : int {
  reference = 0,
  avx2 = 1,
  avx512 = 2,
  avx512_bf16 = 3,
  neon = 4,
  neon_bf16 = 5,
  amx_bf16 = 6
};

// Names as in MOE_GEMM_ISA: "reference", "avx2", "avx512", "avx512_bf16", "amx_bf16", "neon",
// "neon_bf16".
const char* isa_name(Isa isa);
std::optional<Isa> isa_from_name(std::string_view name);
// "reference, avx2, ..." (for messages).
std::string isa_list(const std::vector<Isa>& levels);

// Every level, lowest first within an architecture (x86 levels, then Arm's).
std::vector<Isa> isa_all();
// The levels this CPU runs and this build has kernels for, lowest first (reference always).
std::vector<Isa> isa_available();
bool isa_supported(Isa isa);

// The level asked for: MOE_GEMM_ISA when set (moe::Error naming the variable and
// listing the available levels when it names no level or one this CPU lacks),
// else the highest available level.
Isa isa_requested();

// The level the kernels run at now. First call: isa_requested() (so an invalid
// MOE_GEMM_ISA throws here). Under MPI the world communicator sets it to the
// lowest level every rank supports.
Isa active_isa();
// Switches every kernel to `isa` (moe::Error listing the available ones when the
// CPU lacks it). Not for use while kernels run on other threads.
void set_active_isa(Isa isa);

// Sets a level for a scope and restores the previous one (tests, benchmarks).
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa) : prev_(active_isa()) { set_active_isa(isa); }
  ~ScopedIsa() { set_active_isa(prev_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  Isa prev_;
};

}  // namespace moe
