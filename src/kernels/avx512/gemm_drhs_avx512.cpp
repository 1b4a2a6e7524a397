// AVX-512 weight gradient of the grouped GEMM:
// drhs[g][Kc, N] = lhs[rows g]^T @ dout[rows g]  (f32 out; zero for an empty group).
//
// Both operands are packed as row pairs counted from the group's first row
// (lhs^T as [P][KcW] words, dout as [panel][P][NR] words), so each element is
// one chain over the group's rows in order: it depends only on group g's rows
// (SPEC), never on M, other groups or threads. Two schedules, same bits:
//  - many small groups: one task per group (pack + all tiles on one thread;
//    one parallel_for for the whole call);
//  - few large groups: group after group, a group of many rows in blocks of
//    at most kBlockRows rows (even numbers, so the row pairs are those of the
//    whole group), packing and tiles both parallel; a block's tiles continue the
//    f32 sums the previous block stored (Tile's `accumulate`), so the chains
//    and their bits are those of one pass, while the packed operands of a
//    block stay in L2 (one pass over 8192 rows packed 32 MB and ran at 0.4
//    of dense).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/grouped_gemm_internal.h"
#include "moe/thread_pool.h"

#include "kernels/avx512/target_begin.h"

#include "kernels/avx512/gemm_driver.h"

namespace moe::avx512 {
namespace {

// One group's drhs: packing jobs (256 lhs columns, or one dout panel) and
// tiles (dout panel x block of 8 row tiles of Kc), each runnable by range.
template <class T>
struct DrhsGroup {
  using S = Shape<T>;
  static constexpr int NR = 16 * S::NV;
  static constexpr int64_t kChunk = 256, KB = 8 * S::MR;
  const T *L, *D;
  float* G;  // [Kc, N] of this group
  int64_t Kc, N, r0, r1;
  uint32_t *ap = nullptr, *bp = nullptr;
  bool stream = false;      // non-temporal output stores (the whole gradient is larger than the caches)
  bool accumulate = false;  // rows [r0, r1) continue the sums of the group's earlier rows, stored in G

  int64_t P() const { return words_of<T>(r1 - r0); }
  int64_t panels() const { return (N + NR - 1) / NR; }
  int64_t a_jobs() const { return sizeof(T) == 2 ? (Kc + kChunk - 1) / kChunk : 0; }
  int64_t pack_jobs() const { return a_jobs() + panels(); }
  int64_t kblocks() const { return (Kc + KB - 1) / KB; }
  int64_t tiles() const { return panels() * kblocks(); }
  size_t a_words() const { return sizeof(T) == 2 ? size_t(P() * round16(Kc)) : 0; }
  size_t b_words() const { return size_t(panels() * P() * NR); }

  void pack(int64_t j0, int64_t j1) const {
    for (int64_t j = j0; j < j1; ++j) {
      if (j < a_jobs()) {
        int64_t c0 = j * kChunk, nc = std::min(kChunk, Kc - c0);
        pack_row_pairs<T>(L, Kc, r0, r1, c0, nc, ap + c0, round16(Kc), round16(nc));
      } else {
        int64_t pi = j - a_jobs(), c0 = pi * NR;
        pack_row_pairs<T>(D, N, r0, r1, c0, std::min<int64_t>(NR, N - c0), bp + pi * P() * NR, NR, NR);
      }
    }
  }

  // Napkin: a tile block reads its dout panel (P*NR words, L2) and 8 row
  // tiles of lhs^T for 2*KB*NR*(r1-r0) flops.
  void run(int64_t t0, int64_t t1) const {
    AView a = sizeof(T) == 2 ? AView{reinterpret_cast<const std::byte*>(ap), 4, round16(Kc) * 4}
                             : AView{reinterpret_cast<const std::byte*>(L + r0 * Kc), 4, Kc * 4};
    for (int64_t t = t0; t < t1; ++t) {
      int64_t pi = t / kblocks(), k0 = t % kblocks() * KB, c0 = pi * NR;
      run_rows<typename S::Step, S::MR, S::NV>(a, k0, std::min(Kc, k0 + KB), bp + pi * P() * NR, P(), false,
                                               G + c0, N, std::min<int64_t>(NR, N - c0), nullptr, stream,
                                               accumulate);
    }
    if (stream) _mm_sfence();  // the streamed gradient rows are visible before the task reports done
  }
};

// Gradients at least this large are written with non-temporal stores: they
// do not fit the caches, so a normal store's read for ownership is wasted
// DRAM traffic (many-experts up.drhs: 512 MB of f32, 44.8 -> 43.1 ms).
constexpr size_t kStreamBytes = size_t(64) << 20;

template <class T>
DrhsGroup<T> group_of(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs,
                      int64_t lg) {
  int64_t Kc = lhs.dim(1), N = dout.dim(1);
  DrhsGroup<T> g{lhs.data<T>(), dout.data<T>(), drhs.data<float>() + lg * Kc * N, Kc, N,
                 groups.offsets[size_t(goff + lg)], groups.offsets[size_t(goff + lg + 1)]};
  g.stream = drhs.nbytes() >= kStreamBytes;
  return g;
}

// The gradient of an empty group is zero: n floats at p, with non-temporal
// stores for a large gradient (no read for ownership of lines never read).
void zero_gradient(float* p, int64_t n, bool stream) {
  if (!stream) return void(std::memset(p, 0, size_t(n) * sizeof(float)));
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(p + i) & 63) != 0; ++i) p[i] = 0.0f;
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(p + i, _mm512_setzero_ps());
  for (; i < n; ++i) p[i] = 0.0f;
  _mm_sfence();
}

// Packed bytes of a group small enough to run as one task (fits L2 with room).
constexpr int64_t kSmallGroupBytes = 1024 << 10;
// At most this many rows per block of a large group. Each further block
// re-reads and re-writes the group's f32 gradient, so blocks are only for
// groups whose packed dout panel would outgrow L2 (P * NR * 4 bytes: 256 KiB
// at 2048 rows); a group of 8192 rows ran at 0.40 of dense in one pass and
// 0.67 to 0.74 in blocks of 2048 to 512 rows.
constexpr int64_t kBlockRows = 2048;

// Equal blocks of at most kBlockRows rows, each an even number of rows but the last.
int64_t block_rows(int64_t rows) {
  const int64_t n = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t per = (rows + n - 1) / n;
  return per + per % 2;
}

template <class T>
void drhs_typed(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs) {
  int64_t n_local = drhs.dim(0), largest = 0;
  for (int64_t lg = 0; lg < n_local; ++lg) largest = std::max(largest, groups.sizes[size_t(goff + lg)]);
  int64_t small_bytes = largest * (lhs.dim(1) + dout.dim(1)) * 2;
  if (n_local >= 4 * ThreadPool::compute().size() && small_bytes <= kSmallGroupBytes) {
    parallel_for(n_local, 1, [&](int64_t b, int64_t e) {
      for (int64_t lg = b; lg < e; ++lg) {
        DrhsGroup<T> g = group_of<T>(lhs, dout, groups, goff, drhs, lg);
        if (g.r0 == g.r1) {
          zero_gradient(g.G, g.Kc * g.N, g.stream);
          continue;
        }
        g.ap = scratch(g.a_words(), 0), g.bp = scratch(g.b_words(), 1);
        g.pack(0, g.pack_jobs());
        g.run(0, g.tiles());
      }
    });
    return;
  }
  // Empty groups first, all at once over the pool (skewed routing leaves most experts empty,
  // and their zero gradients are most of the bytes written).
  parallel_for(n_local, 1, [&](int64_t b, int64_t e) {
    for (int64_t lg = b; lg < e; ++lg) {
      const DrhsGroup<T> g = group_of<T>(lhs, dout, groups, goff, drhs, lg);
      if (g.r0 == g.r1) zero_gradient(g.G, g.Kc * g.N, g.stream);
    }
  });
  Words apack, bpack;
  for (int64_t lg = 0; lg < n_local; ++lg) {
    const DrhsGroup<T> whole = group_of<T>(lhs, dout, groups, goff, drhs, lg);
    if (whole.r0 == whole.r1) continue;
    const int64_t step = block_rows(whole.r1 - whole.r0);
    for (int64_t b0 = whole.r0; b0 < whole.r1; b0 += step) {
      DrhsGroup<T> g = whole;
      g.r0 = b0, g.r1 = std::min(whole.r1, b0 + step);
      g.accumulate = b0 > whole.r0;
      g.stream = whole.stream && g.r1 == whole.r1;  // only the last block's stores are final
      g.ap = apack.get(g.a_words()), g.bp = bpack.get(g.b_words());
      parallel_for(g.pack_jobs(), 1, [&](int64_t b, int64_t e) { g.pack(b, e); });
      parallel_for(g.tiles(), 1, [&](int64_t b, int64_t e) { g.run(b, e); });
    }
  }
}

}  // namespace

void gmm_drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs) {
  if (lhs.dtype() == DType::f32) return drhs_typed<float>(lhs, dout, groups, goff, drhs);
  drhs_typed<bf16>(lhs, dout, groups, goff, drhs);
}

}  // namespace moe::avx512

#include "kernels/avx512/target_end.h"
