// AVX-512 grouped GEMM drivers: split each op into (group, panel, row range)
// tasks over the compute pool, pack the weight panel, run register tiles.
//
// Reduction order (SPEC row independence): every output element is one chain
// over its words in increasing order (gemm_tile.h), with the whole reduction
// length in one chain: no split-K, no K blocks that depend on M or threads.
// drhs words are row pairs counted from the group's first row.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "kernels/grouped_gemm_internal.h"
#include "moe/thread_pool.h"

namespace moe::avx512 {

bool supports(DType in) {
  static const bool base = [] {
    const char* force = std::getenv("MOE_GEMM_ISA");
    if (force && std::string_view(force) == "reference") return false;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }();
  static const bool bf = base && __builtin_cpu_supports("avx512bf16");
  return in == DType::f32 ? base : (in == DType::bf16 && bf);
}

}  // namespace moe::avx512

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_* in masked
// intrinsics) when they are inlined into pragma-targeted code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/avx512/gemm_tile.h"

namespace moe::avx512 {
namespace {

// A 64-byte aligned word buffer that only grows.
class Words {
 public:
  uint32_t* get(size_t words) {
    if (words > cap_) {
      cap_ = (words + 15) / 16 * 16;
      buf_.reset(static_cast<uint32_t*>(std::aligned_alloc(64, cap_ * 4)));
      MOE_ASSERT(buf_, "grouped gemm scratch allocation failed");
    }
    return buf_.get();
  }

 private:
  struct Free {
    void operator()(uint32_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint32_t, Free> buf_;
  size_t cap_ = 0;
};

// The calling thread's panel buffer.
uint32_t* scratch(size_t words) {
  thread_local Words buf;
  return buf.get(words);
}

int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// A operand of a tile: word (row r, step p) at base + r * row_bytes + p * step_bytes.
struct AView {
  const std::byte* base;
  ptrdiff_t row_bytes, step_bytes;
};

// out rows [r0, r1) x columns [0, nc) = A rows [r0, r1) @ packed B (P words).
// A partial last tile repeats its last row (computed, not stored), so every
// row runs the same instruction chain whatever its position.
template <class Step, int MR, int NV, class Out>
void run_rows(const AView& a, int64_t r0, int64_t r1, const uint32_t* b, int64_t P, bool half_last, Out* out,
              int64_t ldc, int64_t nc) {
  for (int64_t r = r0; r < r1; r += MR) {
    int mr = int(std::min<int64_t>(MR, r1 - r));
    ptrdiff_t off[MR];
    for (int i = 0; i < MR; ++i) off[i] = (r + std::min(i, mr - 1)) * a.row_bytes;
    Tile<Step, MR, NV>::run(a.base, off, a.step_bytes, b, P, half_last, out + r * ldc, ldc, mr, nc);
  }
}

// Packed weight bytes per task: several panels when Kc is small, so the
// packer reads long contiguous runs of each weight row (DRAM-friendly: the
// weights of many experts do not fit in cache) and the block stays in L2.
constexpr int64_t kPackBytes = 384 << 10;

// Shared shape of gmm and gmm_dlhs: out[r, c] = sum_w A[r, w] * B_g[w, c],
// A read in place (row stride lda elements, `len` reduction elements), B_g
// packed per (group, column panel) by pack(lg, c0, nc, dst). Tasks are
// (local group, block of panels), group-major so both threads share a group's A.
template <class Step, int MR, int NV, class T, class Out, class Pack>
void row_major_gemm(const T* A, int64_t lda, int64_t len, Out* out, int64_t ldc, int64_t n_out,
                    const GroupLayout& groups, int64_t goff, int64_t n_local, const Pack& pack) {
  constexpr int64_t NR = 16 * NV;
  int64_t panels = (n_out + NR - 1) / NR, P = words_of<T>(len);
  int64_t per_task = std::clamp<int64_t>(kPackBytes / (P * NR * 4), 1, panels);
  int64_t blocks = (panels + per_task - 1) / per_task;
  bool half = Step::kPerWord == 2 && len % 2 == 1;
  AView a{reinterpret_cast<const std::byte*>(A), ptrdiff_t(lda * sizeof(T)), 4};
  parallel_for(n_local * blocks, 1, [&](int64_t b, int64_t e) {
    uint32_t* bp = scratch(size_t(per_task * P * NR));
    for (int64_t t = b; t < e; ++t) {
      int64_t lg = t / blocks, p0 = t % blocks * per_task, p1 = std::min(panels, p0 + per_task);
      int64_t r0 = groups.offsets[size_t(goff + lg)], r1 = groups.offsets[size_t(goff + lg + 1)];
      if (r0 == r1) continue;
      for (int64_t pi = p0; pi < p1; ++pi) pack(lg, pi * NR, std::min(NR, n_out - pi * NR), bp + (pi - p0) * P * NR);
      for (int64_t pi = p0; pi < p1; ++pi)
        run_rows<Step, MR, NV>(a, r0, r1, bp + (pi - p0) * P * NR, P, half, out + pi * NR, ldc,
                               std::min(NR, n_out - pi * NR));
    }
  });
}

// Tile shapes: bf16 6x64 (24 accumulators, B panel Kc*128 bytes: 512 KiB at
// Kc = 4096, fits L2); f32 12x32 (24 accumulators, same panel bytes).
template <class T>
struct Shape;
template <>
struct Shape<bf16> {
  using Step = Bf16Step;
  static constexpr int MR = 6, NV = 4;
};
template <>
struct Shape<float> {
  using Step = F32Step;
  static constexpr int MR = 12, NV = 2;
};

// out[M, N] = lhs[M, Kc] @ rhs[g]  (rhs [n_local, Kc, N])
template <class T, class Out>
void gmm_typed(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  using S = Shape<T>;
  int64_t Kc = lhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  const T* W = rhs.data<T>();
  auto pack = [&](int64_t lg, int64_t c0, int64_t nc, uint32_t* dst) {
    pack_row_pairs<T>(W + lg * Kc * N, N, 0, Kc, c0, nc, dst, 16 * S::NV, 16 * S::NV);
  };
  row_major_gemm<typename S::Step, S::MR, S::NV>(lhs.data<T>(), Kc, Kc, out.data<Out>(), N, N, groups, goff,
                                                 n_local, pack);
}

// dlhs[M, Kc] = dout[M, N] @ rhs[g]^T  (rhs [n_local, Kc, N] read transposed in place, panel by panel)
template <class T, class Out>
void dlhs_typed(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& dlhs) {
  using S = Shape<T>;
  int64_t Kc = rhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  const T* W = rhs.data<T>();
  auto pack = [&](int64_t lg, int64_t c0, int64_t nc, uint32_t* dst) {
    pack_transposed<T>(W + lg * Kc * N, N, N, c0, nc, dst, 16 * S::NV, 16 * S::NV);
  };
  row_major_gemm<typename S::Step, S::MR, S::NV>(dout.data<T>(), N, N, dlhs.data<Out>(), Kc, Kc, groups, goff,
                                                 n_local, pack);
}

// Packs both drhs operands of one group (rows [r0, r1)) as row pairs from r0:
// A = lhs^T as [P][KcW] words (bf16 only; f32 lhs is read in place) and dout
// as [panel][P][NR] words. One job per 256 lhs columns or per dout panel.
template <class T, int NR>
void pack_drhs_group(const T* L, const T* D, int64_t Kc, int64_t N, int64_t r0, int64_t r1, uint32_t* ap,
                     uint32_t* bp) {
  constexpr int64_t kChunk = 256;
  int64_t P = words_of<T>(r1 - r0), KcW = round16(Kc), panels = (N + NR - 1) / NR;
  int64_t a_jobs = sizeof(T) == 2 ? (Kc + kChunk - 1) / kChunk : 0;
  parallel_for(a_jobs + panels, 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      if (j < a_jobs) {
        int64_t c0 = j * kChunk, nc = std::min(kChunk, Kc - c0);
        pack_row_pairs<T>(L, Kc, r0, r1, c0, nc, ap + c0, KcW, round16(nc));
      } else {
        int64_t c0 = (j - a_jobs) * NR;
        pack_row_pairs<T>(D, N, r0, r1, c0, std::min<int64_t>(NR, N - c0), bp + (j - a_jobs) * P * NR, NR, NR);
      }
    }
  });
}

// drhs[g][Kc, N] = lhs[rows g]^T @ dout[rows g]: groups one after another, each
// packed once, then tiles over (dout panel, block of 8 row tiles of Kc).
// Napkin (seed-mixtral up): per group packs 4 MiB + 2 MiB for 4.3 GFLOP.
template <class T>
void drhs_typed(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs) {
  using S = Shape<T>;
  constexpr int NR = 16 * S::NV;
  constexpr int64_t KB = 8 * S::MR;
  int64_t Kc = lhs.dim(1), N = dout.dim(1), n_local = drhs.dim(0), panels = (N + NR - 1) / NR;
  int64_t kblocks = (Kc + KB - 1) / KB;
  Words apack, bpack;
  for (int64_t lg = 0; lg < n_local; ++lg) {
    float* G = drhs.data<float>() + lg * Kc * N;
    int64_t r0 = groups.offsets[size_t(goff + lg)], r1 = groups.offsets[size_t(goff + lg + 1)];
    if (r0 == r1) {
      std::memset(G, 0, size_t(Kc * N) * sizeof(float));
      continue;
    }
    int64_t P = words_of<T>(r1 - r0);
    uint32_t* ap = apack.get(sizeof(T) == 2 ? size_t(P * round16(Kc)) : 0);
    uint32_t* bp = bpack.get(size_t(panels * P * NR));
    pack_drhs_group<T, NR>(lhs.data<T>(), dout.data<T>(), Kc, N, r0, r1, ap, bp);
    AView a = sizeof(T) == 2 ? AView{reinterpret_cast<const std::byte*>(ap), 4, round16(Kc) * 4}
                             : AView{reinterpret_cast<const std::byte*>(lhs.data<T>() + r0 * Kc), 4, Kc * 4};
    parallel_for(panels * kblocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t pi = t / kblocks, k0 = t % kblocks * KB, c0 = pi * NR;
        run_rows<typename S::Step, S::MR, S::NV>(a, k0, std::min(Kc, k0 + KB), bp + pi * P * NR, P, false, G + c0,
                                                 N, std::min<int64_t>(NR, N - c0));
      }
    });
  }
}

}  // namespace

void gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs) {
  if (lhs.dtype() == DType::f32) return drhs_typed<float>(lhs, dout, groups, goff, drhs);
  drhs_typed<bf16>(lhs, dout, groups, goff, drhs);
}

void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  if (lhs.dtype() == DType::f32) return gmm_typed<float, float>(lhs, rhs, groups, goff, out);
  if (out.dtype() == DType::f32) return gmm_typed<bf16, float>(lhs, rhs, groups, goff, out);
  gmm_typed<bf16, bf16>(lhs, rhs, groups, goff, out);
}

void gmm_dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& dlhs) {
  if (dout.dtype() == DType::f32) return dlhs_typed<float, float>(dout, rhs, groups, goff, dlhs);
  if (dlhs.dtype() == DType::f32) return dlhs_typed<bf16, float>(dout, rhs, groups, goff, dlhs);
  dlhs_typed<bf16, bf16>(dout, rhs, groups, goff, dlhs);
}

}  // namespace moe::avx512

#pragma GCC pop_options
