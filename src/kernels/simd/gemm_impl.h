// The grouped GEMM of every SIMD level, x86 and Arm, written once over vector
// traits V (x86/simd_avx2.h, x86/simd_avx512.h, arm/simd_neon.h) and a
// reduction step: register tiles, operand packing, tails and the task
// schedule. Each level's translation unit (x86/ or arm/kernels_<level>.cpp)
// includes this inside its target region and instantiates it; everything here
// has internal linkage, so the copies never meet at link time.
//
// The unit of reduction is a "word" of 32 bits of A: one f32 (F32Step), or a
// bf16 pair (k, k+1) (WidenStep: widened to two f32 and multiplied with FMA;
// DpStep: one bf16 dot product, vdpbf16ps at avx512_bf16, BFDOT at neon_bf16). Every output element is ONE chain
// of word steps in increasing word order starting from +0 (WidenStep: k then
// k+1 inside a word), with the whole reduction length in one chain: no
// split-K, no blocks that depend on M or the thread count. Its bits depend
// only on its own row of A, its column of B and the length, never on the tile
// shape, the row position or the thread (SPEC row independence), so the
// split layout and expert parallelism stay bit-exact at every level.
//
// Packed B holds kB vector rows of NR = L * NV f32 (or word) columns per word:
// F32Step one row (the weight row, copied), WidenStep two rows (rows k and
// k+1 widened to f32, a zero row after an odd last one), DpStep one row of
// interleaved bf16 pairs. A level with kWidenAhead (avx2) runs bf16 as f32
// instead: A widened once per call, the weights widened as they are packed,
// and the f32 tile over both, one f32 word per element: WidenStep's products
// and chain order, so its bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/allocator.h"
#include "kernels/grouped_gemm_internal.h"
#include "moe/thread_pool.h"

namespace moe::simd {
namespace {

#define MOE_INLINE inline __attribute__((always_inline))
#define MOE_UNROLL _Pragma("GCC unroll 16")

// copy: f32 rows as they are; widen: bf16 rows widened to f32, in whole
// words (a zero row after an odd count); widen_rows: the same, row by row
// (no padding row: the widened weights of an f32 step); pairs: bf16 row pairs
// interleaved into words.
enum class Pack { copy, widen, widen_rows, pairs };

// A reduction step supplies, for part b < kB of a word of A, the vector that
// multiplies B's vector row b of that word (`operand`), and the multiply-add.
// The parts of a word run in order (b = 0, 1), so each element's chain stays
// k, k+1, k+2, ...
template <class V>
struct F32Step {
  using F = typename V::F;
  static constexpr int kPerWord = 1, kB = 1;
  static constexpr Pack kPack = Pack::copy;
  template <int b>
  MOE_INLINE static F operand(uint32_t w) {
    return V::bcast_word(w);
  }
  MOE_INLINE static F madd(F acc, F a, F b) { return V::fma(a, b, acc); }
};

// A bf16 pair per word, widened exactly to f32 (low half: a shift, high half:
// a mask), then two FMAs: element k with B row k, element k+1 with row k+1.
template <class V>
struct WidenStep {
  using F = typename V::F;
  static constexpr int kPerWord = 2, kB = 2;
  static constexpr Pack kPack = Pack::widen;
  template <int b>
  MOE_INLINE static F operand(uint32_t w) {
    return b == 0 ? V::low_bf16(V::bcast_word(w)) : V::high_bf16(V::bcast_word(w));
  }
  MOE_INLINE static F madd(F acc, F a, F b) { return V::fma(a, b, acc); }
};

// A tile shape: the reduction step and MR rows x NV vectors of columns.
template <class StepT, int kRows, int kVectors>
struct TileShape {
  using Step = StepT;
  static constexpr int MR = kRows, NV = kVectors;
};

// A level: its vector traits and the tile shape of each input type.
// kWidenAhead: the forward and data-gradient GEMMs of bf16 widen their A
// operand to f32 once per call and run the f32 tile against widened weights
// (the same products in the same order: the bits of Bf16Shape's WidenStep).
// kPrefetchBelowRows: a panel task of fewer rows than this prefetches the
// weights the next task packs (row_major_gemm); a longer one does not.
template <class Vec, class F32Shape, class Bf16Shape, bool WidenAhead = false,
          int64_t PrefetchBelowRows = std::numeric_limits<int64_t>::max()>
struct Level {
  using V = Vec;
  template <class T>
  using Shape = std::conditional_t<std::is_same_v<T, float>, F32Shape, Bf16Shape>;
  static constexpr bool kWidenAhead = WidenAhead;
  static constexpr int64_t kPrefetchBelowRows = PrefetchBelowRows;
};

// Whether inputs of type T run widened ahead at level Lv (bf16 at a kWidenAhead level).
template <class Lv, class T>
constexpr bool kWidened = std::is_same_v<T, bf16> && Lv::kWidenAhead;

MOE_INLINE uint32_t load_word(const std::byte* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}
MOE_INLINE uint32_t load_half_word(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// A 2D byte region of a weight matrix that a later task will pack.
struct Region {
  const std::byte* base = nullptr;
  ptrdiff_t stride = 0;
  int64_t rows = 0, bytes = 0;
};

// Prefetches a region into L2 while the tiles of the current task run, so the
// DRAM reads of the next task's weights overlap this task's tiles instead of
// stalling its packer. The lines are spread evenly over the task's word steps
// (a tile runs `steps_before_burst` steps, then reports them with `ran`): a
// burst of hundreds of prefetches fills the core's miss queue and stalls it,
// which serializes the reads with the tiles instead of overlapping them. The
// check sits between runs of steps, not in every step: a per-step check cost
// up to 40% of a tile's speed (a static guard read per step, 2026-12-02).
class Prefetcher {
 public:
  void start(const Region& r, int64_t word_steps) {
    reg_ = r;
    row_ = col_ = 0;
    const int64_t lines = r.rows * ((r.bytes + 63) / 64), n = std::max<int64_t>(word_steps, 1);
    every_ = lines > 0 ? std::max<int64_t>(n / lines, 1) : 0;
    burst_ = lines > 0 ? (lines + n - 1) / n : 0;
    countdown_ = every_;
  }
  // Word steps to run before the next burst of prefetches (at most `left`).
  MOE_INLINE int64_t steps_before_burst(int64_t left) const { return every_ == 0 ? left : std::min(left, countdown_); }
  // `n` word steps ran: issue the burst when its turn has come.
  MOE_INLINE void ran(int64_t n) {
    if (every_ == 0 || (countdown_ -= n) > 0) return;
    countdown_ = every_;
    burst();
  }

 private:
  void burst() {
    for (int64_t n = 0; n < burst_ && row_ < reg_.rows; ++n) {
      __builtin_prefetch(reg_.base + row_ * reg_.stride + col_, 0, 2);
      col_ += 64;
      if (col_ >= reg_.bytes) col_ = 0, ++row_;
    }
    if (row_ >= reg_.rows) every_ = 0;
  }

 private:
  Region reg_;
  int64_t row_ = 0, col_ = 0, every_ = 0, burst_ = 0, countdown_ = 0;
};

// An f32 addend of a GEMM's output (gmm_dlhs_add): out[i, c] = round(add[i, c] + the chain),
// one f32 addition after the whole chain, then the output's rounding: the bits of the chain written
// to f32, added to the addend and rounded (the separate layout's data gradient, p0 + p1).
// `p` null: no addend.
struct Addend {
  const float* p = nullptr;
  int64_t ld = 0;
  Addend at(int64_t r, int64_t c) const { return p ? Addend{p + r * ld + c, ld} : Addend{}; }
};

// A tile of MR rows x NR = L*NV columns. A word (row i, step p) lives at
// a + off[i] + p * a_step (bytes); B is packed [P][kB][NR]. `half_last`: the
// last word of A holds only its low bf16 (odd reduction length); the bytes
// past the row may be another row or unmapped memory, so they are never read.
// The accumulators are locals of fully unrolled loops, so they live in registers.
template <class V, class Step, int MR, int NV>
struct Tile {
  using F = typename V::F;
  static constexpr int L = V::L, NR = L * NV, kB = Step::kB;
  using Acc = F[MR][NV];

  // One word: part by part (the parts of a word are elements k, k+1 of a
  // widened bf16 pair), B's vector row for the part, then every row of A.
  // Part by part keeps the live registers to MR * NV accumulators + NV B
  // vectors + one operand (AVX2: 12 + 2 + 1 of 16). `kHalf`: the word holds
  // only its low bf16 (the last word of an odd row): only part 0 runs for a
  // widened pair; a dot-product step runs its one part on the zero-extended half.
  template <bool kHalf>
  MOE_INLINE static void step(Acc& acc, const std::byte* ap, const ptrdiff_t* off, const float* bp) {
    part<0, kHalf>(acc, ap, off, bp);
    if constexpr (kB == 2) {
      // Reload A's words for part 1 rather than keeping MR widened operands live
      // from part 0 (the compiler would merge the loads and spill accumulators).
      asm volatile("" ::: "memory");
      if (!kHalf) part<1, kHalf>(acc, ap, off, bp);
    }
  }

  template <int b, bool kHalf>
  MOE_INLINE static void part(Acc& acc, const std::byte* ap, const ptrdiff_t* off, const float* bp) {
    F bv[NV];
    MOE_UNROLL for (int v = 0; v < NV; ++v) bv[v] = V::load(bp + (b * NV + v) * L);
    MOE_UNROLL for (int i = 0; i < MR; ++i) {
      const F a = Step::template operand<b>(kHalf ? load_half_word(ap + off[i]) : load_word(ap + off[i]));
      MOE_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = Step::madd(acc[i][v], a, bv[v]);
    }
  }

  // out[i, c] = sum over the words of A[i] * B[c], rows [0, mr), columns
  // [0, nc) (row stride ldc). `init` (row stride ldi): continue the chains of
  // an earlier call over the preceding words, whose f32 partial sums it holds
  // (it may be `out` itself when out is f32): the partial sums reload exactly,
  // so blocking the reduction this way gives the bits of one call.
  template <class Out>
  static void run(const std::byte* a, const ptrdiff_t* row_off, ptrdiff_t a_step, const float* b, int64_t P,
                  bool half_last, Out* out, int64_t ldc, int mr, int64_t nc, bool stream = false,
                  const float* init = nullptr, int64_t ldi = 0, Prefetcher* pf = nullptr, Addend add = {}) {
    ptrdiff_t off[MR];
    MOE_UNROLL for (int i = 0; i < MR; ++i) off[i] = row_off[i];
    Acc acc;
    MOE_UNROLL for (int i = 0; i < MR; ++i)
      MOE_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
    if (init)
      MOE_UNROLL for (int i = 0; i < MR; ++i)
        MOE_UNROLL for (int v = 0; v < NV; ++v) {
          const int64_t left = nc - L * v;
          if (i < mr && left > 0) acc[i][v] = V::load_n(init + i * ldi + L * v, left);
        }
    // The addend's lines, read after the chain: asked for now, so they arrive while it runs.
    if (add.p)
      for (int i = 0; i < mr; ++i)
        for (int64_t c = 0; c < nc; c += 64 / int64_t(sizeof(float)))
          __builtin_prefetch(add.p + i * add.ld + c, 0, 3);
    const int64_t full = half_last ? P - 1 : P, per = int64_t(kB) * NR;
    // Runs of word steps with nothing else in the loop, a burst of prefetches between runs.
    for (int64_t p = 0; p < full;) {
      const int64_t n = pf ? pf->steps_before_burst(full - p) : full - p;
      for (int64_t e = p + n; p < e; ++p) step<false>(acc, a + p * a_step, off, b + p * per);
      if (pf) pf->ran(n);
    }
    if (half_last) step<true>(acc, a + full * a_step, off, b + full * per);
    if (add.p) MOE_UNROLL for (int i = 0; i < MR; ++i) MOE_UNROLL for (int v = 0; v < NV; ++v) {
        const int64_t left = nc - L * v;
        if (i < mr && left > 0) acc[i][v] = V::add(acc[i][v], V::load_n(add.p + i * add.ld + L * v, left));
      }
    store(acc, out, ldc, mr, nc, stream);
  }

  template <class Out>
  MOE_INLINE static void store(const Acc& acc, Out* out, int64_t ldc, int mr, int64_t nc, bool stream) {
    if constexpr (std::is_same_v<Out, float>) {
      // Non-temporal stores (no read for ownership) for outputs written once and not read
      // soon, such as large weight gradients: full tiles on aligned rows only.
      if (stream && mr == MR && nc == NR &&
          ((uintptr_t(out) | uintptr_t(ldc * 4)) & uintptr_t(V::kStreamAlign - 1)) == 0) {
        MOE_UNROLL for (int i = 0; i < MR; ++i)
          MOE_UNROLL for (int v = 0; v < NV; ++v) V::stream(out + i * ldc + L * v, acc[i][v]);
        return;
      }
    }
    if (mr == MR && nc == NR) {
      MOE_UNROLL for (int i = 0; i < MR; ++i)
        MOE_UNROLL for (int v = 0; v < NV; ++v) store_vec(out + i * ldc + L * v, acc[i][v], L);
      return;
    }
    MOE_UNROLL for (int i = 0; i < MR; ++i)
      MOE_UNROLL for (int v = 0; v < NV; ++v) {
        const int64_t left = nc - L * v;
        if (i < mr && left > 0) store_vec(out + i * ldc + L * v, acc[i][v], left);
      }
  }

  MOE_INLINE static void store_vec(float* p, F x, int64_t n) { V::store_n(p, x, n); }
  MOE_INLINE static void store_vec(bf16* p, F x, int64_t n) { V::store_bf16_n(p, x, n); }
};

// ---- Packing ---------------------------------------------------------------
// Packers write dst[q * ldd + j] for j in [0, W) (W a multiple of L; columns
// j >= nc and rows past the input are zero).

// Rows this far ahead (in output rows) are prefetched: weight panels of many
// experts come from DRAM, and a packer waiting on one row at a time runs at
// latency speed.
constexpr int64_t kAhead = 8;

template <class T>
void prefetch_rows(const T* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t nc) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* p = reinterpret_cast<const char*>(src + r * ld + c0);
    for (int64_t off = 0; off < nc * int64_t(sizeof(T)); off += 64) __builtin_prefetch(p + off, 0, 3);
  }
}

inline const uint16_t* u16(const bf16* p) { return reinterpret_cast<const uint16_t*>(p); }

// Output rows of pack_rows for `n` input rows.
template <Pack K>
constexpr int64_t packed_rows(int64_t n) {
  return K == Pack::copy || K == Pack::widen_rows ? n : K == Pack::widen ? n + n % 2 : (n + 1) / 2;
}

// Columns [c0, c0 + nc) of rows [r0, r1) of src (row stride ld):
//  copy  (f32):  dst row q = src row r0 + q;
//  widen (bf16): dst row q = src row r0 + q widened to f32 (a zero row after an odd count);
//  pairs (bf16): dst row q = words (src[r0 + 2q][c], src[r0 + 2q + 1][c]) (high half zero past r1).
template <class V, Pack K, class T>
void pack_rows(const T* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t nc, uint32_t* dst,
               int64_t ldd, int64_t W) {
  using I = typename V::I;
  constexpr int64_t per = K == Pack::pairs ? 2 : 1;
  const int64_t rows = packed_rows<K>(r1 - r0);
  for (int64_t q = 0; q < rows; ++q) {
    const int64_t r = r0 + per * q;
    prefetch_rows(src, ld, r0 + per * (q + kAhead), std::min(r1, r0 + per * (q + kAhead + 1)), c0, nc);
    const T* a = src + r * ld + c0;
    if constexpr (K == Pack::pairs && requires(const uint16_t* p, I& x) { V::pair_words(p, p, 0, x, x); }) {
      if (W % (2 * V::L) == 0) {  // two rows' 2L columns interleaved by a permute (AVX-512)
        for (int64_t j = 0; j < W; j += 2 * V::L) {
          I lo = V::zero_words(), hi = lo;
          if (nc - j > 0 && r < r1)
            V::pair_words(u16(a + j), r + 1 < r1 ? u16(a + ld + j) : nullptr, nc - j, lo, hi);
          V::store_words(dst + q * ldd + j, lo);
          V::store_words(dst + q * ldd + j + V::L, hi);
        }
        continue;
      }
    }
    for (int64_t j = 0; j < W; j += V::L) {
      const int64_t n = nc - j;
      I w = V::zero_words();
      if (n > 0 && r < r1) {
        if constexpr (K == Pack::copy) {
          w = V::words_n(a + j, n * 4);
        } else if constexpr (K == Pack::widen || K == Pack::widen_rows) {
          w = V::shl16(V::u16_n(u16(a + j), n));
        } else {
          w = V::u16_n(u16(a + j), n);
          if (r + 1 < r1) w = V::or_(w, V::shl16(V::u16_n(u16(a + ld + j), n)));
        }
      }
      V::store_words(dst + q * ldd + j, w);
    }
  }
}

// B^T read in place: dst row q, column j = step q of row c0 + j of src (rows of
// `len` elements, row stride ld). copy / pairs: step q is 32-bit word q of the
// row (an odd bf16 row's last word is half, its high half zero); widen:
// element q widened to f32 (a zero row after an odd count). L x L transposes.
template <class V, Pack K, class T>
void pack_transposed(const T* src, int64_t ld, int64_t len, int64_t c0, int64_t nc, uint32_t* dst, int64_t ldd,
                     int64_t W) {
  using I = typename V::I;
  constexpr int L = V::L;
  constexpr bool kWiden = K == Pack::widen || K == Pack::widen_rows;
  const int64_t rows = kWiden ? packed_rows<K>(len) : (len * int64_t(sizeof(T)) + 3) / 4;
  const int64_t row_bytes = len * int64_t(sizeof(T));
  for (int64_t j = 0; j < W; j += L) {
    for (int64_t q = 0; q < rows; q += L) {
      I r[L];
      for (int i = 0; i < L; ++i) {
        r[i] = V::zero_words();
        if (j + i >= nc) continue;
        const T* row = src + (c0 + j + i) * ld;
        if constexpr (kWiden)
          r[i] = V::shl16(V::u16_n(u16(row) + q, len - q));
        else
          r[i] = V::words_n(reinterpret_cast<const std::byte*>(row) + 4 * q, row_bytes - 4 * q);
      }
      V::transpose(r);
      for (int64_t c = 0; c < std::min<int64_t>(L, rows - q); ++c) V::store_words(dst + (q + c) * ldd + j, r[c]);
    }
  }
}

// ---- Drivers -----------------------------------------------------------------

// A 64-byte aligned word buffer that only grows. A buffer of one call (the
// weight gradient's few large groups) comes from the engine's allocator
// (core/allocator.h): given back at the call's end, it is a cached block that
// the next call takes again with its pages resident. From the C library, such
// a buffer (9 MB at seed-mixtral) was a fresh mapping faulted in every call:
// that call ran 1.28x (avx2) to 1.55x (avx512_bf16) slower (2026-12-02). The
// compute threads' own buffers (`scratch`) live as long as their threads and
// come from the C library, outside the engine's accounting of tensors.
class Words {
 public:
  enum class From { c_library, engine };
  explicit Words(From from = From::c_library) : from_(from) {}
  Words(const Words&) = delete;
  Words& operator=(const Words&) = delete;
  ~Words() { reset(); }
  uint32_t* get(size_t words) {
    if (words > cap_) {
      reset();
      const size_t cap = (words + 15) / 16 * 16;
      buf_ = static_cast<uint32_t*>(from_ == From::engine ? alloc::acquire(cap * 4, 64)
                                                          : std::aligned_alloc(64, cap * 4));
      MOE_ASSERT(buf_, "grouped gemm scratch allocation failed");
      cap_ = cap;
    }
    return buf_;
  }

 private:
  void reset() {
    if (buf_) from_ == From::engine ? alloc::release(buf_, cap_ * 4) : std::free(buf_);
    buf_ = nullptr, cap_ = 0;
  }
  From from_;
  uint32_t* buf_ = nullptr;
  size_t cap_ = 0;
};

// The calling thread's packing buffers (two slots).
inline uint32_t* scratch(size_t words, int slot = 0) {
  thread_local Words buf[2];
  return buf[slot].get(words);
}

// Words per row of a packed operand: ceil(n / elements per word).
template <class T>
constexpr int64_t words_of(int64_t n) {
  return (n * int64_t(sizeof(T)) + 3) / 4;
}

// A operand of a tile: word (row r, step p) at base + r * row_bytes + p * step_bytes.
struct AView {
  const std::byte* base;
  ptrdiff_t row_bytes, step_bytes;
};

// A tile of exactly `mr` (< MR) rows: the remainder of a row block. Each
// row's accumulators run the same chain of instructions in any tile height
// (one madd per word part, in word order), so the bits do not depend on the
// tile a row lands in; a full-height tile would compute MR - mr rows for
// nothing (a block of 20 rows at MR 6: 4 of 24 rows wasted).
template <class V, class Step, int MR, int NV, int H = MR - 1, class Out>
MOE_INLINE void run_short_tile(int mr, const std::byte* a, const ptrdiff_t* off, ptrdiff_t a_step,
                               const float* b, int64_t P, bool half_last, Out* out, int64_t ldc, int64_t nc,
                               bool stream, const float* init, int64_t ldi, Prefetcher* pf, Addend add) {
  if constexpr (H >= 1) {
    if (mr == H) {
      Tile<V, Step, H, NV>::run(a, off, a_step, b, P, half_last, out, ldc, H, nc, stream, init, ldi, pf, add);
      return;
    }
    run_short_tile<V, Step, MR, NV, H - 1>(mr, a, off, a_step, b, P, half_last, out, ldc, nc, stream, init,
                                           ldi, pf, add);
  }
}

// out rows [r0, r1) x columns [0, nc) = A rows [r0, r1) @ packed B (P words):
// tiles of MR rows, then one tile of the remaining rows.
template <class V, class Step, int MR, int NV, class Out>
void run_rows(const AView& a, int64_t r0, int64_t r1, const uint32_t* b, int64_t P, bool half_last, Out* out,
              int64_t ldc, int64_t nc, Prefetcher* pf, bool stream = false, const float* init = nullptr,
              int64_t ldi = 0, Addend add = {}) {
  const float* bf = reinterpret_cast<const float*>(b);
  for (int64_t r = r0; r < r1; r += MR) {
    const int mr = int(std::min<int64_t>(MR, r1 - r));
    ptrdiff_t off[MR];
    for (int i = 0; i < mr; ++i) off[i] = (r + i) * a.row_bytes;  // a tile of mr rows reads mr offsets
    const float* tile_init = init ? init + r * ldi : nullptr;
    if (mr == MR)
      Tile<V, Step, MR, NV>::run(a.base, off, a.step_bytes, bf, P, half_last, out + r * ldc, ldc, mr, nc,
                                 stream, tile_init, ldi, pf, add.at(r, 0));
    else
      run_short_tile<V, Step, MR, NV>(mr, a.base, off, a.step_bytes, bf, P, half_last, out + r * ldc, ldc, nc,
                                      stream, tile_init, ldi, pf, add.at(r, 0));
  }
}

// Packed weight bytes per task: several panels when the reduction is short,
// so the packer reads long contiguous runs of each weight row (the weights of
// many experts do not fit in cache) and the block stays in L2.
constexpr int64_t kPackBytes = 256 << 10;

// A group holding more than 1/kSplit of the call's rows per thread is split
// into row blocks (balanced, whole row tiles, at least kTaskRows rows), so a
// skewed call (one expert with most rows) still spreads over the threads.
constexpr int64_t kTaskRows = 252, kSplit = 4;

// Shared shape of gmm and gmm_dlhs: out[r, c] = sum_w A[r, w] * B_g[w, c],
// A read in place (row stride lda elements, `len` reduction elements), B_g
// packed per (group, column panel) by w.pack(lg, c0, nc, dst); w.region(lg,
// c0, c1) names the weight bytes that packing columns [c0, c1) reads. Tasks
// are (local group, block of panels, block of rows), in that order, so
// consecutive tasks of a thread share their packed panels. Rows are
// independent, so the split does not change bits.
// ---- Few rows per group: weight slabs ----------------------------------------
// At 16-64 rows per group (the public models' experts at small batches) a
// panel of the whole reduction is packed for a few row tiles only: the packer
// reads each weight row 128 bytes at a time, rows tens of kB apart (a DRAM page
// per line, no hardware prefetch), and a long reduction's panel outgrows L2.
// Here a task (group, block of kSlabRunBytes-wide columns, block of at most
// `rows_max` rows, a group's blocks balanced) walks the reduction in blocks of words: it packs a slab of
// every panel of its columns (long contiguous runs of each weight row), runs
// its row tiles over the slab, and keeps the f32 partial sums of its rows in a
// scratch block between reduction blocks (Tile's `init`): each element stays
// one chain in word order, so the bits are those of the panel path.
// kSlabRunBytes 256 against 1024 (a slab of 2 panels, 4x the words, at avx512_bf16): 0.76-1.13 of
// the time per op, median 0.93, over 19 in-process A/Bs at three levels (docs/benchmarks.md,
// "Where the time goes now", 2026-12-02).
//
// ---- Long reductions: weight slabs at any rows per group --------------------
// A panel of a long reduction (mixtral-8x7b's down.gmm reduces 14,336
// elements, up.dlhs 28,672: 0.9-3.6 MiB packed) does not fit L2 next to the
// A rows of its tile, so every row tile streams it from L3. Past
// kLongPanelBytes a tile of at most kLongSlabTileRows rows takes the slab
// schedule at any rows per group, with row blocks of up to kLongSlabRows (a
// whole group at the registry's 256 rows per expert), so each slab is packed
// once for many tiles. A 12-row tile reads half the panel bytes per FMA and
// keeps panels. Measured in one process against the panel schedule
// (docs/benchmarks.md, "Long reductions"): mixtral-8x7b's down.gmm 1.11x and
// up.dlhs 1.10-1.14x faster at avx2 (6 rows; bf16 and f32), up.dlhs 1.08x at
// avx512_bf16's bf16 tile (6 rows); the 12-row tiles of avx512 0.96-1.11,
// within that level's noise. 96-row blocks gained about half as much, whole
// groups (528 rows) the same as 264.
constexpr int64_t kSlabRows = 96;          // average rows per non-empty group at or below which slabs are used
constexpr int64_t kSlabRunBytes = 256;     // bytes of a weight row packed per run (gmm's row-major weights)
constexpr int64_t kSlabBytes = 128 << 10;  // packed bytes per slab (with the partial sums and the next slab: L2)
constexpr int64_t kLongPanelBytes = 2 * kPackBytes;  // a panel larger than this takes slabs at any rows per group
constexpr int64_t kLongSlabRows = 264;               // rows per slab task there (a group in balanced blocks)
constexpr int kLongSlabTileRows = 6;                 // tiles of at most this many rows take them

template <class V, class S, class T, class Out, class Weights>
void slab_gemm(const T* A, int64_t lda, int64_t len, Out* out, int64_t ldc, int64_t n_out,
               const GroupLayout& groups, int64_t goff, int64_t n_local, const Weights& w, int64_t rows_max,
               Addend add) {
  using Step = typename S::Step;
  constexpr int MR = S::MR, NV = S::NV;
  constexpr int64_t NR = int64_t(V::L) * NV, kB = Step::kB;
  const int64_t row_cap = (rows_max + MR - 1) / MR * MR;
  const int64_t panels = (n_out + NR - 1) / NR, P = words_of<T>(len);
  const int64_t npan = std::clamp<int64_t>(kSlabRunBytes / (NR * Weights::kBytes), 1, panels);
  const int64_t kbw = std::clamp<int64_t>(kSlabBytes / (npan * kB * NR * 4), 1, P);
  const int64_t kblocks = (P + kbw - 1) / kbw, cblocks = (panels + npan - 1) / npan, ldp = npan * NR;
  const bool half = Step::kPerWord == 2 && len % 2 == 1;
  struct Task {
    int64_t lg, c0, c1, r0, r1;
  };
  std::vector<Task> tasks;
  for (int64_t lg = 0; lg < n_local; ++lg) {
    const int64_t g0 = groups.offsets[size_t(goff + lg)], g1 = groups.offsets[size_t(goff + lg + 1)];
    for (int64_t cb = 0; cb < cblocks && g0 < g1; ++cb)
      for (int64_t n_blocks = (g1 - g0 + row_cap - 1) / row_cap,
                   step = ((g1 - g0 + n_blocks - 1) / n_blocks + MR - 1) / MR * MR, r = g0;
           r < g1; r += step)
        tasks.push_back({lg, cb * ldp, std::min(n_out, (cb + 1) * ldp), r, std::min(g1, r + step)});
  }
  parallel_for(int64_t(tasks.size()), 1, [&](int64_t b, int64_t e) {
    uint32_t* bp = scratch(size_t(npan * kbw * kB * NR), 0);
    float* part = reinterpret_cast<float*>(scratch(size_t(row_cap * ldp), 1));
    Prefetcher pf;
    for (int64_t t = b; t < e; ++t) {
      const Task& k = tasks[size_t(t)];
      const int64_t np = (k.c1 - k.c0 + NR - 1) / NR;
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t w0 = kb * kbw, w1 = std::min(P, w0 + kbw), nw = w1 - w0, slab_words = nw * kB * NR;
        for (int64_t pi = 0; pi < np; ++pi)
          w.pack(k.lg, k.c0 + pi * NR, std::min(NR, k.c1 - k.c0 - pi * NR), w0, w1, bp + pi * slab_words, NR);
        // Prefetch the next slab: this task's next reduction block, or the next task's first.
        Region next{};
        if (kb + 1 < kblocks) {
          next = w.region(k.lg, k.c0, k.c1, w1, std::min(P, w1 + kbw));
        } else if (t + 1 < e) {
          const Task& n = tasks[size_t(t + 1)];
          next = w.region(n.lg, n.c0, n.c1, 0, std::min(P, kbw));
        }
        pf.start(next, (k.r1 - k.r0 + MR - 1) / MR * np * nw);
        const bool last = kb + 1 == kblocks;
        const AView a{reinterpret_cast<const std::byte*>(A + k.r0 * lda) + w0 * 4, ptrdiff_t(lda * sizeof(T)), 4};
        for (int64_t pi = 0; pi < np; ++pi) {
          const int64_t nc = std::min(NR, k.c1 - k.c0 - pi * NR);
          const uint32_t* slab = bp + pi * slab_words;
          float* sums = part + pi * NR;
          const float* init = kb > 0 ? sums : nullptr;
          if (last)
            run_rows<V, Step, MR, NV>(a, 0, k.r1 - k.r0, slab, nw, half, out + k.r0 * ldc + k.c0 + pi * NR,
                                      ldc, nc, &pf, false, init, ldp, add.at(k.r0, k.c0 + pi * NR));
          else
            run_rows<V, Step, MR, NV>(a, 0, k.r1 - k.r0, slab, nw, false, sums, ldp, nc, &pf, false, init, ldp);
        }
      }
    }
  });
}

template <class V, class S, class T, class Out, class Weights>
void row_major_gemm(const T* A, int64_t lda, int64_t len, Out* out, int64_t ldc, int64_t n_out,
                    const GroupLayout& groups, int64_t goff, int64_t n_local, const Weights& w,
                    int64_t prefetch_below_rows, Addend add = {}) {
  using Step = typename S::Step;
  constexpr int MR = S::MR, NV = S::NV;
  constexpr int64_t NR = int64_t(V::L) * NV;
  if (!detail::force_panel_schedule.load(std::memory_order_relaxed)) {
    // Weight slabs: few rows per group and a panel larger than a task's packing budget, or a long reduction.
    int64_t nonempty = 0;
    for (int64_t lg = 0; lg < n_local; ++lg) nonempty += groups.sizes[size_t(goff + lg)] > 0;
    const int64_t rows = groups.offsets[size_t(goff + n_local)] - groups.offsets[size_t(goff)];
    const int64_t panel_bytes = words_of<T>(len) * Step::kB * NR * 4;
    if (nonempty > 0 && rows <= kSlabRows * nonempty && panel_bytes > kPackBytes)
      return slab_gemm<V, S>(A, lda, len, out, ldc, n_out, groups, goff, n_local, w, kSlabRows, add);
    if (nonempty > 0 && MR <= kLongSlabTileRows && panel_bytes > kLongPanelBytes)
      return slab_gemm<V, S>(A, lda, len, out, ldc, n_out, groups, goff, n_local, w, kLongSlabRows, add);
  }
  const int64_t panels = (n_out + NR - 1) / NR, P = words_of<T>(len), panel_words = P * Step::kB * NR;
  const int64_t per_task = std::clamp<int64_t>(kPackBytes / (panel_words * 4), 1, panels);
  const int64_t blocks = (panels + per_task - 1) / per_task;
  const bool half = Step::kPerWord == 2 && len % 2 == 1;
  const AView a{reinterpret_cast<const std::byte*>(A), ptrdiff_t(lda * sizeof(T)), 4};
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
    uint32_t* bp = scratch(size_t(per_task * panel_words));
    Prefetcher pf;
    int64_t packed_lg = -1, packed_p0 = -1;  // the panels now in bp
    for (int64_t t = b; t < e; ++t) {
      const Task& k = tasks[size_t(t)];
      const int64_t p1 = std::min(panels, k.p0 + per_task);
      if (k.lg != packed_lg || k.p0 != packed_p0) {
        for (int64_t pi = k.p0; pi < p1; ++pi)
          w.pack(k.lg, pi * NR, std::min(NR, n_out - pi * NR), 0, P, bp + (pi - k.p0) * panel_words, NR);
        packed_lg = k.lg, packed_p0 = k.p0;
      }
      // Prefetch the weights the next task of this range packs, if it packs any
      // and this task is short enough for its level (Level::kPrefetchBelowRows).
      const Task* next = t + 1 < e ? &tasks[size_t(t + 1)] : nullptr;
      const bool repacks = next && (next->lg != k.lg || next->p0 != k.p0);
      const bool prefetch = repacks && k.r1 - k.r0 < prefetch_below_rows;
      pf.start(prefetch ? w.region(next->lg, next->p0 * NR, std::min(n_out, (next->p0 + per_task) * NR), 0, P)
                      : Region{},
               (k.r1 - k.r0 + MR - 1) / MR * (p1 - k.p0) * P);
      for (int64_t pi = k.p0; pi < p1; ++pi)
        run_rows<V, Step, MR, NV>(a, k.r0, k.r1, bp + (pi - k.p0) * panel_words, P, half, out + pi * NR, ldc,
                                  std::min(NR, n_out - pi * NR), &pf, false, nullptr, 0, add.at(0, pi * NR));
    }
  });
}

// gmm's B: rhs[g] [Kc, N] row-major, packed by K; a word holds kPer weight rows.
template <class V, Pack K, int64_t kPer, class T>
struct RowWeights {
  static constexpr int64_t kBytes = sizeof(T);  // bytes of a weight element
  const T* W;
  int64_t Kc, N;
  RowWeights from_group(int64_t g) const { return {W + g * Kc * N, Kc, N}; }  // groups g.. as 0..
  // Words [w0, w1) of columns [c0, c0 + nc): weight rows [w0 * kPer, w1 * kPer).
  void pack(int64_t lg, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int64_t NR) const {
    pack_rows<V, K>(W + lg * Kc * N, N, w0 * kPer, std::min(Kc, w1 * kPer), c0, nc, dst, NR, NR);
  }
  Region region(int64_t lg, int64_t c0, int64_t c1, int64_t w0, int64_t w1) const {
    return {reinterpret_cast<const std::byte*>(W + (lg * Kc + w0 * kPer) * N + c0), ptrdiff_t(N * sizeof(T)),
            std::min(Kc, w1 * kPer) - w0 * kPer, int64_t((c1 - c0) * sizeof(T))};
  }
};

// dlhs's B: rhs[g] [Kc, N] read transposed in place, panel by panel; a word holds kPer weight columns.
template <class V, Pack K, int64_t kPer, class T>
struct TransposedWeights {
  static constexpr int64_t kBytes = sizeof(T);
  const T* W;
  int64_t Kc, N;
  TransposedWeights from_group(int64_t g) const { return {W + g * Kc * N, Kc, N}; }  // groups g.. as 0..
  // Words [w0, w1) of output columns [c0, c0 + nc): weight rows c0.., columns [w0 * kPer, w1 * kPer).
  void pack(int64_t lg, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int64_t NR) const {
    pack_transposed<V, K>(W + lg * Kc * N + w0 * kPer, N, std::min(N, w1 * kPer) - w0 * kPer, c0, nc, dst, NR, NR);
  }
  Region region(int64_t lg, int64_t c0, int64_t c1, int64_t w0, int64_t w1) const {
    return {reinterpret_cast<const std::byte*>(W + (lg * Kc + c0) * N + w0 * kPer), ptrdiff_t(N * sizeof(T)),
            c1 - c0, int64_t((std::min(N, w1 * kPer) - w0 * kPer) * sizeof(T))};
  }
};

// gmm_pair's B: two weight views side by side, columns [0, n0) of the product from `lo` and
// [n0, n0 + hi's N) from `hi`. n0 is a whole number of the tile's panels, so every panel (and a
// slab's run of panels, whose columns start at panel boundaries) packs from one side only.
template <class W>
struct PairWeights {
  static constexpr int64_t kBytes = W::kBytes;
  W lo, hi;
  int64_t n0;
  PairWeights from_group(int64_t g) const { return {lo.from_group(g), hi.from_group(g), n0}; }
  void pack(int64_t lg, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int64_t NR) const {
    if (c0 < n0) return lo.pack(lg, c0, nc, w0, w1, dst, NR);
    hi.pack(lg, c0 - n0, nc, w0, w1, dst, NR);
  }
  // A block of columns on both sides names its larger part: a prefetch is only a hint.
  Region region(int64_t lg, int64_t c0, int64_t c1, int64_t w0, int64_t w1) const {
    if (c1 <= n0) return lo.region(lg, c0, c1, w0, w1);
    if (c0 >= n0) return hi.region(lg, c0 - n0, c1 - n0, w0, w1);
    return n0 - c0 >= c1 - n0 ? lo.region(lg, c0, n0, w0, w1) : hi.region(lg, 0, c1 - n0, w0, w1);
  }
};

// Bytes of A's copy per chunk of whole groups (a group larger than this is a
// chunk of its own): the copy's memory stays bounded whatever the call's rows.
constexpr int64_t kACopyChunkBytes = int64_t(32) << 20;

// ---- A's row stride and the L1's sets ----------------------------------------
// A tile reads one word of each of its MR rows per step, and each row's line
// must stay in L1 for the 16 steps that read it. L1 set indices repeat every
// 4 KiB on these cores (Zen 4: 32 KiB, 8 ways; Zen 5: 48 KiB, 12 ways), so
// rows whose stride is a multiple of 4 KiB all map to one set: a 12-row tile
// (the f32 and widening tiles at avx512 and avx512_bf16) keeps 12 lines in
// one set while the B panel streams through the others' ways. Reading A from
// a copy whose stride is one line off the multiple spreads the rows over 12
// sets. Measured in one process, the copy included (docs/benchmarks.md, "A's
// row stride and the L1 sets"): mixtral-8x7b's forward and data-gradient
// GEMMs 1.05-1.15x faster with 12-row tiles, olmoe's 1.01-1.05x; 6-row tiles
// (avx2's f32, avx512_bf16's bf16 dot products) at a 4 KiB stride and 12-row
// tiles at a 2 KiB one (6 rows a set) 0.97-1.01x: no copy there.
constexpr int64_t kSetSpanBytes = 4096;
constexpr int64_t kRowsPerSetLimit = 6;  // A is copied when more of a tile's rows than this share a set

// Rows of a tile of `mr` rows at this byte stride that share one L1 set.
constexpr int64_t rows_per_set(int64_t stride_bytes, int64_t mr) {
  int64_t g = 1;  // gcd(stride, 4096): the largest power of two dividing the stride, up to 4096
  while (g < kSetSpanBytes && stride_bytes % (g * 2) == 0) g *= 2;
  return std::max<int64_t>(1, mr * g / kSetSpanBytes);
}

// Row stride (elements of E) of the copy of rows of `n` elements: whole 64-byte
// lines and one line more, so a stride that was a multiple of 4 KiB no longer is.
template <class E>
constexpr int64_t copy_stride(int64_t n) {
  constexpr int64_t line = 64 / int64_t(sizeof(E));
  return (n + line - 1) / line * line + line;
}

// Calls fn(g0, g1, first_row, rows) for chunks of whole local groups [g0, g1)
// whose rows hold at most kACopyChunkBytes at `row_bytes` a row (or one group).
template <class Fn>
void for_copy_chunks(const GroupLayout& groups, int64_t goff, int64_t n_local, int64_t row_bytes, const Fn& fn) {
  for (int64_t g0 = 0; g0 < n_local;) {
    int64_t g1 = g0 + 1;
    const int64_t first = groups.offsets[size_t(goff + g0)];
    while (g1 < n_local && (groups.offsets[size_t(goff + g1 + 1)] - first) * row_bytes <= kACopyChunkBytes) ++g1;
    fn(g0, g1, first, groups.offsets[size_t(goff + g1)] - first);
    g0 = g1;
  }
}

// Group sizes [g0, g1) of the call's local groups as a layout of their own.
inline GroupLayout local_layout(const GroupLayout& groups, int64_t goff, int64_t g0, int64_t g1) {
  return GroupLayout::from_sizes(
      std::vector<int64_t>(groups.sizes.begin() + goff + g0, groups.sizes.begin() + goff + g1));
}

// A bf16 GEMM of a kWidenAhead level: A (rows of groups [goff, goff + n_local),
// `len` elements a row) widened to f32, a chunk of whole groups at a time,
// then the f32 tile against the weights packed widened row by row (`wide`
// builds that weight view). Each product and each addition is the one
// WidenStep makes, in the same order, so the bits are the same; the tile loses
// WidenStep's shift or mask per operand. The widened copy comes from the
// engine's allocator: a cached block the next call takes again with its pages
// resident.
template <class Lv, class Out, class Weights>
void widened_gemm(const bf16* A, int64_t lda, int64_t len, Out* out, int64_t ldc, int64_t n_out,
                  const GroupLayout& groups, int64_t goff, int64_t n_local, const Weights& wide, Addend add) {
  using V = typename Lv::V;
  using S = typename Lv::template Shape<float>;
  // Widened rows, zero-padded to whole vectors, and one line more where a tile's rows would share L1
  // sets (rows_per_set: avx512's 12-row tile at a multiple of 4 KiB; avx2's 6 rows are in place).
  const int64_t whole = (len + V::L - 1) / V::L * V::L;
  const int64_t ldw = rows_per_set(whole * 4, S::MR) > kRowsPerSetLimit ? whole + 64 / 4 : whole;
  Words buf(Words::From::engine);
  for_copy_chunks(groups, goff, n_local, ldw * 4, [&](int64_t g0, int64_t g1, int64_t first, int64_t rows) {
    uint32_t* aw = buf.get(size_t(std::max<int64_t>(rows * ldw, 1)));
    parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
      pack_rows<V, Pack::widen_rows>(A + first * lda, lda, r0, r1, 0, len, aw + r0 * ldw, ldw, ldw);
    });
    row_major_gemm<V, S>(reinterpret_cast<const float*>(aw), ldw, len, out + first * ldc, ldc, n_out,
                         local_layout(groups, goff, g0, g1), 0, g1 - g0, wide.from_group(g0),
                         Lv::kPrefetchBelowRows, add.at(first, 0));
  });
}

// A GEMM with A read from a copy whose row stride keeps a tile's rows in
// different L1 sets (copy_stride): the same words in the same order, so the
// bits of the GEMM on A in place. The copy comes from the engine's allocator.
template <class Lv, class T, class Out, class Weights, class S = typename Lv::template Shape<T>>
void copied_gemm(const T* A, int64_t lda, int64_t len, Out* out, int64_t ldc, int64_t n_out,
                 const GroupLayout& groups, int64_t goff, int64_t n_local, const Weights& w, Addend add) {
  using V = typename Lv::V;
  const int64_t ldcopy = copy_stride<T>(len);
  Words buf(Words::From::engine);
  const int64_t copy_words = words_of<T>(ldcopy);
  for_copy_chunks(groups, goff, n_local, copy_words * 4, [&](int64_t g0, int64_t g1, int64_t first, int64_t rows) {
    T* ac = reinterpret_cast<T*>(buf.get(size_t(std::max<int64_t>(rows * copy_words, 1))));
    parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::memcpy(ac + r * ldcopy, A + (first + r) * lda, size_t(len) * sizeof(T));
    });
    row_major_gemm<V, S>(ac, ldcopy, len, out + first * ldc, ldc, n_out, local_layout(groups, goff, g0, g1),
                         0, g1 - g0, w.from_group(g0), Lv::kPrefetchBelowRows, add.at(first, 0));
  });
}

// Panel width (columns) of the tile a level's GEMM of T runs.
template <class Lv, class T>
constexpr int64_t panel_columns() {
  using S = typename Lv::template Shape<std::conditional_t<kWidened<Lv, T>, float, T>>;
  return int64_t(Lv::V::L) * S::NV;
}

// A GEMM against each group's weights (out columns [0, n_out), row stride ldc), viewed by
// `weights` (RowWeights, TransposedWeights or PairWeights of them, from weights_view): A
// [rows, len] read in place, from a copy off the sets' stride (copied_gemm), or widened ahead at a
// kWidenAhead level. `add` (row stride of its own): an f32 addend of the output (Addend).
template <class Lv, class T, class Out, class Weights>
void weights_gemm(const T* A, int64_t len, Out* out, int64_t ldc, int64_t n_out, const GroupLayout& groups,
                  int64_t goff, int64_t n_local, const Weights& weights, Addend add = {}) {
  using V = typename Lv::V;
  if constexpr (kWidened<Lv, T>) {
    widened_gemm<Lv>(A, len, len, out, ldc, n_out, groups, goff, n_local, weights, add);
  } else {
    using S = typename Lv::template Shape<T>;
    if (rows_per_set(len * int64_t(sizeof(T)), S::MR) > kRowsPerSetLimit)
      return copied_gemm<Lv>(A, len, len, out, ldc, n_out, groups, goff, n_local, weights, add);
    row_major_gemm<V, S>(A, len, len, out, ldc, n_out, groups, goff, n_local, weights, Lv::kPrefetchBelowRows,
                         add);
  }
}

// The weight view `Weights` (RowWeights or TransposedWeights) of rhs [n_local, Kc, N] for Lv's GEMM
// of T: packed widened row by row for bf16 at a kWidenAhead level (the f32 tile), else as its step.
template <class Lv, class T, template <class, Pack, int64_t, class> class Weights>
auto weights_view(const T* rhs, int64_t Kc, int64_t N) {
  using V = typename Lv::V;
  if constexpr (kWidened<Lv, T>) {
    return Weights<V, Pack::widen_rows, 1, T>{rhs, Kc, N};
  } else {
    using Step = typename Lv::template Shape<T>::Step;
    return Weights<V, Step::kPack, Step::kPerWord, T>{rhs, Kc, N};
  }
}

// out[M, N] = lhs[M, Kc] @ rhs[g]  (rhs [n_local, Kc, N])
template <class Lv, class T, class Out>
void gmm_typed(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  const int64_t Kc = lhs.dim(1), N = rhs.dim(2);
  weights_gemm<Lv>(lhs.data<T>(), Kc, out.data<Out>(), N, N, groups, goff, rhs.dim(0),
                   weights_view<Lv, T, RowWeights>(rhs.data<T>(), Kc, N));
}

// out[M, N] (f32) = lhs[M, Kc] (bf16) @ rhs[g] (f32): the router's logits on the layer's bf16 x,
// bit for bit the f32 GEMM of the lhs widened (widening is exact), without the widened copy: the
// level's f32 tile with WidenStep (each word of A widened in the tile, its two elements against
// weight rows k and k + 1 in turn: F32Step's FMAs in F32Step's order), the weights packed as f32
// rows; at a kWidenAhead level the rows are widened once per call and the f32 tile runs as for f32.
template <class Lv>
void gmm_mixed(const Tensor& lhs, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& out) {
  using V = typename Lv::V;
  const int64_t Kc = lhs.dim(1), N = rhs.dim(2), n_local = rhs.dim(0);
  const bf16* A = lhs.data<bf16>();
  const float* W = rhs.data<float>();
  float* O = out.data<float>();
  if constexpr (Lv::kWidenAhead) {
    widened_gemm<Lv>(A, Kc, Kc, O, N, N, groups, goff, n_local, RowWeights<V, Pack::copy, 1, float>{W, Kc, N},
                     {});
  } else {
    using F32 = typename Lv::template Shape<float>;
    using S = TileShape<WidenStep<V>, F32::MR, F32::NV>;
    // Rows k and k + 1 of a word are consecutive weight rows: f32 rows copied are WidenStep's
    // layout (an odd Kc's last word runs its first element only, so no zero row is needed).
    const RowWeights<V, Pack::copy, 2, float> w{W, Kc, N};
    if (rows_per_set(Kc * int64_t(sizeof(bf16)), S::MR) > kRowsPerSetLimit)
      return copied_gemm<Lv, bf16, float, decltype(w), S>(A, Kc, Kc, O, N, N, groups, goff, n_local, w, {});
    row_major_gemm<V, S>(A, Kc, Kc, O, N, N, groups, goff, n_local, w, Lv::kPrefetchBelowRows);
  }
}

// out[M, N0 + N1] = [lhs @ rhs0[g] | lhs @ rhs1[g]]: one GEMM over both weights (PairWeights), A
// read or widened once, when N0 is a whole number of panels; else the two GEMMs into the two column
// windows. The same bits either way (each column's chain is gmm's).
template <class Lv, class T, class Out>
void gmm_pair_typed(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& groups,
                    int64_t goff, Tensor& out) {
  const int64_t Kc = lhs.dim(1), N0 = rhs0.dim(2), N1 = rhs1.dim(2), ld = N0 + N1, n_local = rhs0.dim(0);
  const auto lo = weights_view<Lv, T, RowWeights>(rhs0.data<T>(), Kc, N0);
  const auto hi = weights_view<Lv, T, RowWeights>(rhs1.data<T>(), Kc, N1);
  Out* o = out.data<Out>();
  if (N0 % panel_columns<Lv, T>() == 0)
    return weights_gemm<Lv>(lhs.data<T>(), Kc, o, ld, ld, groups, goff, n_local,
                            PairWeights<std::decay_t<decltype(lo)>>{lo, hi, N0});
  weights_gemm<Lv>(lhs.data<T>(), Kc, o, ld, N0, groups, goff, n_local, lo);
  weights_gemm<Lv>(lhs.data<T>(), Kc, o + N0, ld, N1, groups, goff, n_local, hi);
}

// dlhs[M, Kc] = dout[M, N] @ rhs[g]^T  (rhs [n_local, Kc, N] read transposed in place, panel by panel)
// With `addend` (f32 [M, Kc]): dlhs = round(addend + dout @ rhs[g]^T) (gmm_dlhs_add).
template <class Lv, class T, class Out>
void dlhs_typed(const Tensor& dout, const Tensor& rhs, const GroupLayout& groups, int64_t goff, Tensor& dlhs,
                const Tensor* addend = nullptr) {
  const int64_t Kc = rhs.dim(1), N = rhs.dim(2);
  weights_gemm<Lv>(dout.data<T>(), N, dlhs.data<Out>(), Kc, Kc, groups, goff, rhs.dim(0),
                   weights_view<Lv, T, TransposedWeights>(rhs.data<T>(), Kc, N),
                   addend ? Addend{addend->data<float>(), Kc} : Addend{});
}

// ---- Weight gradient -----------------------------------------------------------
// drhs[g][Kc, N] = lhs[rows g]^T @ dout[rows g]  (f32 out; zero for an empty group).
//
// Words run over the group's rows, counted from its first row: lhs^T is packed
// per block of output rows (f32: one row per word; bf16: row pairs) and dout
// as Step::kPack rows, so each element is one chain over the group's rows in
// order: it depends only on group g's rows, never on M, other groups or
// threads. Two schedules, same bits:
//  - many small groups: one task per group (pack + all tiles on one thread);
//  - few large groups: group after group, a group of many rows in blocks of at
//    most kBlockRows rows (even counts, so the row pairs are those of the whole
//    group), packing and tiles both parallel; a block's tiles continue the f32
//    sums the previous block stored (Tile's `accumulate`), so the chains and
//    their bits are those of one pass, while a block's packed operands stay in L2.
//
// kWide (bf16 at a kWidenAhead level): both operands are packed widened to f32
// row by row and the f32 tile runs over them: one f32 word per row, the
// products and the order of WidenStep's chain, so the same bits.
// TD: dout's type. A bf16 lhs with an f32 dout (the router's kernel gradient on the layer's bf16
// x) packs lhs^T widened row by row and dout as it is, and runs the f32 tile: the bits of the f32
// GEMM of the lhs widened (widening is exact).
template <class Lv, class T, bool kWide = kWidened<Lv, T>, class TD = T>
struct DrhsGroup {
  using V = typename Lv::V;
  static constexpr bool kF32Tile = kWide || std::is_same_v<TD, float>;
  using S = typename Lv::template Shape<std::conditional_t<kF32Tile, float, T>>;
  using Step = typename S::Step;
  static constexpr int64_t NR = int64_t(V::L) * S::NV, KB = 8 * S::MR;
  // lhs^T is packed per block of KB output rows (lhs columns): f32 copied,
  // bf16 as row pairs (a widening step widens its words as it reads them) or widened.
  static constexpr Pack kAPack = std::is_same_v<T, float> ? Pack::copy
                                 : kF32Tile               ? Pack::widen_rows
                                                          : Pack::pairs;
  static constexpr Pack kBPack = std::is_same_v<TD, float> ? Pack::copy
                                 : kWide                   ? Pack::widen_rows
                                                           : Step::kPack;
  const T* Lm;
  const TD* D;
  float* G;  // [Kc, N] of this group
  int64_t Kc, N, r0, r1;
  uint32_t *ap = nullptr, *bp = nullptr;
  bool stream = false;      // non-temporal output stores (the whole gradient is larger than the caches)
  bool accumulate = false;  // rows [r0, r1) continue the sums of the group's earlier rows, stored in G
  bool add_to_g = false;    // G := G + the sums (gmm_drhs_acc: G is the epilogue's addend)

  int64_t P() const { return kF32Tile ? r1 - r0 : words_of<T>(r1 - r0); }
  int64_t panel_words() const { return P() * Step::kB * NR; }
  int64_t panels() const { return (N + NR - 1) / NR; }
  int64_t kblocks() const { return (Kc + KB - 1) / KB; }
  int64_t a_jobs() const { return kblocks(); }
  int64_t pack_jobs() const { return a_jobs() + panels(); }
  size_t a_words() const { return size_t(kblocks() * P() * KB); }
  size_t b_words() const { return size_t(panels() * panel_words()); }

  void pack(int64_t j0, int64_t j1) const {
    for (int64_t j = j0; j < j1; ++j) {
      if (j < a_jobs()) {
        const int64_t c0 = j * KB;
        pack_rows<V, kAPack>(Lm, Kc, r0, r1, c0, std::min(KB, Kc - c0), ap + j * P() * KB, KB, KB);
      } else {
        const int64_t pi = j - a_jobs(), c0 = pi * NR;
        pack_rows<V, kBPack>(D, N, r0, r1, c0, std::min<int64_t>(NR, N - c0), bp + pi * panel_words(), NR, NR);
      }
    }
  }

  // Tiles run in blocks of dout panels of at most kPanelBlockBytes: for each
  // lhs^T block, every panel of the block, so an lhs^T block is read once per
  // panel block (not once per panel) while the panel block stays in L2.
  // Napkin: a tile block reads its dout panel (P * kB * NR words) and its lhs^T
  // block (P * KB words, contiguous: the rows of a step are 4 bytes apart, the
  // steps KB * 4 bytes) for 2 * KB * NR * (r1 - r0) flops.
  static constexpr int64_t kPanelBlockBytes = 512 << 10;
  int64_t panels_per_block() const {
    return std::clamp<int64_t>(kPanelBlockBytes / (panel_words() * 4), 1, panels());
  }
  int64_t tiles() const {
    const int64_t pb = panels_per_block();
    return (panels() + pb - 1) / pb * kblocks() * pb;
  }
  void run(int64_t t0, int64_t t1) const {
    const int64_t pb = panels_per_block();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t block = t / (kblocks() * pb), kb = t / pb % kblocks(), pi = block * pb + t % pb;
      if (pi >= panels()) continue;  // the last panel block may be short
      const int64_t k0 = kb * KB, c0 = pi * NR;
      const AView a{reinterpret_cast<const std::byte*>(ap + kb * P() * KB), 4, KB * 4};
      run_rows<V, Step, S::MR, S::NV>(a, 0, std::min(KB, Kc - k0), bp + pi * panel_words(), P(), false,
                                      G + k0 * N + c0, N, std::min<int64_t>(NR, N - c0), nullptr, stream,
                                      accumulate ? G + k0 * N + c0 : nullptr, N,
                                      add_to_g ? Addend{G + k0 * N + c0, N} : Addend{});
    }
    if (stream) V::fence();  // the streamed gradient rows are visible before the task reports done
  }
};

// Gradients at least this large are written with non-temporal stores: they
// do not fit the caches, so a normal store's read for ownership is wasted
// DRAM traffic (many-experts up.drhs: 512 MB of f32).
constexpr size_t kStreamBytes = size_t(64) << 20;

template <class Lv, class T, bool kWide, class TD>
DrhsGroup<Lv, T, kWide, TD> group_of(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups,
                                     int64_t goff, Tensor& drhs, int64_t lg) {
  const int64_t Kc = lhs.dim(1), N = dout.dim(1);
  DrhsGroup<Lv, T, kWide, TD> g{lhs.data<T>(),
                                dout.data<TD>(),
                                drhs.data<float>() + lg * Kc * N,
                                Kc,
                                N,
                                groups.offsets[size_t(goff + lg)],
                                groups.offsets[size_t(goff + lg + 1)]};
  g.stream = Lv::V::kStreamAlign == 64 && drhs.nbytes() >= kStreamBytes;
  return g;
}

// The gradient of an empty group is zero: n floats at p, with non-temporal
// stores for a large gradient (no read for ownership of lines never read).
template <class V>
void zero_gradient(float* p, int64_t n, bool stream) {
  if (!stream) return void(std::memset(p, 0, size_t(n) * sizeof(float)));
  int64_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(p + i) & uintptr_t(V::kStreamAlign - 1)) != 0; ++i) p[i] = 0.0f;
  for (; i + V::L <= n; i += V::L) V::stream(p + i, V::zero());
  for (; i < n; ++i) p[i] = 0.0f;
  V::fence();
}

// Groups up to this many bytes of lhs and dout rows (counted at 2 bytes an
// element, whatever the dtype) run as one task each when there are enough of
// them to balance the threads: no barrier per group, and one thread's packing
// overlaps another's tiles. Each compute thread keeps its packing scratch
// (up to twice these bytes where bf16 is widened to f32) for the next call. 4 MiB against 1 MiB (the public models at 256 rows per expert, whose
// groups hold 1.2-3.3 MB; best of 14 per op, 2026-12-02): down.drhs 1.28x
// granite-3b, 1.14x qwen, 1.11x gpt-oss, 1.09x deepseek at avx512_bf16, 1.18x
// granite-3b at avx2; up.drhs 0.98-1.17x.
constexpr int64_t kSmallGroupBytes = 4096 << 10;
// At most this many rows per block of a large group: each further block
// re-reads and re-writes the group's f32 gradient, so blocks are only for
// groups whose packed dout panel would outgrow L2.
constexpr int64_t kBlockRows = 2048;

// Equal blocks of at most kBlockRows rows, each an even number of rows but the last.
inline int64_t block_rows(int64_t rows) {
  const int64_t n = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t per = (rows + n - 1) / n;
  return per + per % 2;
}

// An empty group's gradient: zeros, or (add) G + 0 (as adding zeros: -0 becomes +0).
template <class V>
void empty_gradient(float* G, int64_t n, bool stream, bool add) {
  if (!add) return zero_gradient<V>(G, n, stream);
  for (int64_t i = 0; i < n; ++i) G[i] = G[i] + 0.0f;
}

// `add` (gmm_drhs_acc): drhs := drhs + the gradient, the add in the tiles' store; a group of
// several row blocks (whose partial sums are stored in its output between blocks) goes through a
// scratch of one group and an add instead.
template <class Lv, class T, bool kWide = kWidened<Lv, T>, class TD = T>
void drhs_typed(const Tensor& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs,
                bool add = false) {
  using V = typename Lv::V;
  const int64_t n_local = drhs.dim(0);
  int64_t largest = 0;
  for (int64_t lg = 0; lg < n_local; ++lg) largest = std::max(largest, groups.sizes[size_t(goff + lg)]);
  const int64_t small_bytes = largest * (lhs.dim(1) + dout.dim(1)) * 2;
  if (n_local >= 4 * ThreadPool::compute().size() && small_bytes <= kSmallGroupBytes) {
    parallel_for(n_local, 1, [&](int64_t b, int64_t e) {
      for (int64_t lg = b; lg < e; ++lg) {
        DrhsGroup<Lv, T, kWide, TD> g = group_of<Lv, T, kWide, TD>(lhs, dout, groups, goff, drhs, lg);
        if (add) g.stream = false, g.add_to_g = true;  // each line is read right before it is written
        if (g.r0 == g.r1) {
          empty_gradient<V>(g.G, g.Kc * g.N, g.stream, add);
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
      const DrhsGroup<Lv, T, kWide, TD> g = group_of<Lv, T, kWide, TD>(lhs, dout, groups, goff, drhs, lg);
      if (g.r0 == g.r1) empty_gradient<V>(g.G, g.Kc * g.N, g.stream && !add, add);
    }
  });
  Words apack(Words::From::engine), bpack(Words::From::engine);
  for (int64_t lg = 0; lg < n_local; ++lg) {
    DrhsGroup<Lv, T, kWide, TD> whole = group_of<Lv, T, kWide, TD>(lhs, dout, groups, goff, drhs, lg);
    if (whole.r0 == whole.r1) continue;
    const int64_t step = block_rows(whole.r1 - whole.r0);
    if (add && step < whole.r1 - whole.r0) {  // several blocks: this group alone into a scratch, then added
      Tensor one = drhs.slice_rows(lg, lg + 1);
      kernels::drhs_acc_by_chunks([](const Tensor& l, const Tensor& d, const GroupLayout& g, int64_t o,
                                     Tensor& out) { drhs_typed<Lv, T, kWide, TD>(l, d, g, o, out); },
                                  lhs, dout, groups, goff + lg, one);
      continue;
    }
    if (add) whole.stream = false, whole.add_to_g = true;
    for (int64_t b0 = whole.r0; b0 < whole.r1; b0 += step) {
      DrhsGroup<Lv, T, kWide, TD> g = whole;
      g.r0 = b0, g.r1 = std::min(whole.r1, b0 + step);
      g.accumulate = b0 > whole.r0;
      g.stream = whole.stream && g.r1 == whole.r1;  // only the last block's stores are final
      g.ap = apack.get(g.a_words()), g.bp = bpack.get(g.b_words());
      parallel_for(g.pack_jobs(), 1, [&](int64_t b, int64_t e) { g.pack(b, e); });
      parallel_for(g.tiles(), 1, [&](int64_t b, int64_t e) { g.run(b, e); });
    }
  }
}

// The level's entry points (arguments already checked by kernels/grouped_gemm.cpp).
template <class Lv>
struct Gemm {
  static void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& out) {
    if (lhs.dtype() == DType::f32) return gmm_typed<Lv, float, float>(lhs, rhs, g, goff, out);
    if (rhs.dtype() == DType::f32) return gmm_mixed<Lv>(lhs, rhs, g, goff, out);
    if (out.dtype() == DType::f32) return gmm_typed<Lv, bf16, float>(lhs, rhs, g, goff, out);
    gmm_typed<Lv, bf16, bf16>(lhs, rhs, g, goff, out);
  }
  static void gmm_pair(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& g,
                       int64_t goff, Tensor& out) {
    if (lhs.dtype() == DType::f32) return gmm_pair_typed<Lv, float, float>(lhs, rhs0, rhs1, g, goff, out);
    if (out.dtype() == DType::f32) return gmm_pair_typed<Lv, bf16, float>(lhs, rhs0, rhs1, g, goff, out);
    gmm_pair_typed<Lv, bf16, bf16>(lhs, rhs0, rhs1, g, goff, out);
  }
  static void dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& dlhs) {
    if (dout.dtype() == DType::f32) return dlhs_typed<Lv, float, float>(dout, rhs, g, goff, dlhs);
    if (dlhs.dtype() == DType::f32) return dlhs_typed<Lv, bf16, float>(dout, rhs, g, goff, dlhs);
    dlhs_typed<Lv, bf16, bf16>(dout, rhs, g, goff, dlhs);
  }
  static void dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t goff,
                       const Tensor& addend, Tensor& dlhs) {
    if (dout.dtype() == DType::f32) return dlhs_typed<Lv, float, float>(dout, rhs, g, goff, dlhs, &addend);
    if (dlhs.dtype() == DType::f32) return dlhs_typed<Lv, bf16, float>(dout, rhs, g, goff, dlhs, &addend);
    dlhs_typed<Lv, bf16, bf16>(dout, rhs, g, goff, dlhs, &addend);
  }
  static void drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t goff, Tensor& drhs) {
    if (lhs.dtype() == DType::f32) return drhs_typed<Lv, float>(lhs, dout, g, goff, drhs);
    if (dout.dtype() == DType::f32)
      return drhs_typed<Lv, bf16, kWidened<Lv, bf16>, float>(lhs, dout, g, goff, drhs);
    drhs_typed<Lv, bf16>(lhs, dout, g, goff, drhs);
  }
  static void drhs_acc(const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t goff,
                       Tensor& acc) {
    if (lhs.dtype() == DType::f32) return drhs_typed<Lv, float>(lhs, dout, g, goff, acc, true);
    drhs_typed<Lv, bf16>(lhs, dout, g, goff, acc, true);
  }
};

}  // namespace
}  // namespace moe::simd
