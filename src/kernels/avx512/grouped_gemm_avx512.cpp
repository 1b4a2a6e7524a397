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
#include <utility>
#include <vector>

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

#include "kernels/avx512/target_begin.h"

#include "kernels/avx512/gemm_driver.h"

namespace moe::avx512 {
namespace {

// Packed weight bytes per task: several panels when Kc is small, so the
// packer reads long contiguous runs of each weight row (DRAM-friendly: the
// weights of many experts do not fit in cache) and the block stays in L2.
constexpr int64_t kPackBytes = 256 << 10;

// A group holding more than 1/kSplit of the call's rows per thread is split
// into row blocks (balanced, whole row tiles, at least kTaskRows rows), so a
// skewed call (one expert with most rows) still spreads over the threads.
// Only such groups: every row block repacks its weight panels unless the
// same thread packed them for the previous block.
constexpr int64_t kTaskRows = 252, kSplit = 4;

// Shared shape of gmm and gmm_dlhs: out[r, c] = sum_w A[r, w] * B_g[w, c],
// A read in place (row stride lda elements, `len` reduction elements), B_g
// packed per (group, column panel) by w.pack(lg, c0, nc, dst); w.region(lg,
// c0, c1) names the weight bytes that packing columns [c0, c1) reads. Tasks
// are (local group, block of panels, block of rows), in that order, so
// consecutive tasks of a thread share their packed panels, and both threads
// share a group's A. Rows are independent, so the split does not change bits.
template <class Step, int MR, int NV, class T, class Out, class Weights>
void row_major_gemm(const T* A, int64_t lda, int64_t len, Out* out, int64_t ldc, int64_t n_out,
                    const GroupLayout& groups, int64_t goff, int64_t n_local, const Weights& w) {
  constexpr int64_t NR = 16 * NV;
  int64_t panels = (n_out + NR - 1) / NR, P = words_of<T>(len);
  int64_t per_task = std::clamp<int64_t>(kPackBytes / (P * NR * 4), 1, panels);
  int64_t blocks = (panels + per_task - 1) / per_task;
  bool half = Step::kPerWord == 2 && len % 2 == 1;
  AView a{reinterpret_cast<const std::byte*>(A), ptrdiff_t(lda * sizeof(T)), 4};
  struct Task {
    int64_t lg, p0, r0, r1;
  };
  const int64_t first = groups.offsets[size_t(goff)], total = groups.offsets[size_t(goff + n_local)] - first;
  const int64_t split_above = std::max(kTaskRows, total / (kSplit * ThreadPool::compute().size()));
  std::vector<Task> tasks;
  for (int64_t lg = 0; lg < n_local; ++lg) {
    const int64_t g0 = groups.offsets[size_t(goff + lg)], g1 = groups.offsets[size_t(goff + lg + 1)];
    if (g0 == g1) continue;
    const int64_t n_blocks = g1 - g0 > split_above ? (g1 - g0 + split_above - 1) / split_above : 1;
    const int64_t step = ((g1 - g0 + n_blocks - 1) / n_blocks + MR - 1) / MR * MR;
    for (int64_t pb = 0; pb < blocks; ++pb)
      for (int64_t r = g0; r < g1; r += step) tasks.push_back({lg, pb * per_task, r, std::min(g1, r + step)});
  }
  parallel_for(int64_t(tasks.size()), 1, [&](int64_t b, int64_t e) {
    uint32_t* bp = scratch(size_t(per_task * P * NR));
    Prefetcher pf;
    int64_t packed_lg = -1, packed_p0 = -1;  // the panels now in bp
    for (int64_t t = b; t < e; ++t) {
      const Task& k = tasks[size_t(t)];
      const int64_t p1 = std::min(panels, k.p0 + per_task);
      if (k.lg != packed_lg || k.p0 != packed_p0) {
        for (int64_t pi = k.p0; pi < p1; ++pi)
          w.pack(k.lg, pi * NR, std::min(NR, n_out - pi * NR), bp + (pi - k.p0) * P * NR);
        packed_lg = k.lg, packed_p0 = k.p0;
      }
      // Prefetch the weights the next task of this range packs, if it packs any.
      const Task* next = t + 1 < e ? &tasks[size_t(t + 1)] : nullptr;
      const bool repack = next && (next->lg != k.lg || next->p0 != k.p0);
      pf.start(repack ? w.region(next->lg, next->p0 * NR, std::min(n_out, (next->p0 + per_task) * NR)) : Region{},
               (k.r1 - k.r0 + MR - 1) / MR * (p1 - k.p0));
      for (int64_t pi = k.p0; pi < p1; ++pi)
        run_rows<Step, MR, NV>(a, k.r0, k.r1, bp + (pi - k.p0) * P * NR, P, half, out + pi * NR, ldc,
                               std::min(NR, n_out - pi * NR), &pf);
    }
  });
}

// out[M, N] = lhs[M, Kc] @ rhs[g]  (rhs [n_local, Kc, N])
template <class T, class Out>
void gmm_typed(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  using S = Shape<T>;
  int64_t Kc = lhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  struct {
    const T* W;
    int64_t Kc, N;
    void pack(int64_t lg, int64_t c0, int64_t nc, uint32_t* dst) const {
      pack_row_pairs<T>(W + lg * Kc * N, N, 0, Kc, c0, nc, dst, 16 * S::NV, 16 * S::NV);
    }
    Region region(int64_t lg, int64_t c0, int64_t c1) const {
      return {reinterpret_cast<const std::byte*>(W + lg * Kc * N + c0), ptrdiff_t(N * sizeof(T)), Kc,
              int64_t((c1 - c0) * sizeof(T))};
    }
  } w{rhs.data<T>(), Kc, N};
  row_major_gemm<typename S::Step, S::MR, S::NV>(lhs.data<T>(), Kc, Kc, out.data<Out>(), N, N, groups, goff,
                                                 n_local, w);
}

// dlhs[M, Kc] = dout[M, N] @ rhs[g]^T  (rhs [n_local, Kc, N] read transposed in place, panel by panel)
template <class T, class Out>
void dlhs_typed(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& dlhs) {
  using S = Shape<T>;
  int64_t Kc = rhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  struct {
    const T* W;
    int64_t Kc, N;
    void pack(int64_t lg, int64_t c0, int64_t nc, uint32_t* dst) const {
      pack_transposed<T>(W + lg * Kc * N, N, N, c0, nc, dst, 16 * S::NV, 16 * S::NV);
    }
    Region region(int64_t lg, int64_t c0, int64_t c1) const {
      return {reinterpret_cast<const std::byte*>(W + (lg * Kc + c0) * N), ptrdiff_t(N * sizeof(T)), c1 - c0,
              int64_t(N * sizeof(T))};
    }
  } w{rhs.data<T>(), Kc, N};
  row_major_gemm<typename S::Step, S::MR, S::NV>(dout.data<T>(), N, N, dlhs.data<Out>(), Kc, Kc, groups, goff,
                                                 n_local, w);
}

}  // namespace

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

#include "kernels/avx512/target_end.h"
