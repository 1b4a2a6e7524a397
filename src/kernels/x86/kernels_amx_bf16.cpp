// The amx_bf16 level: the avx512_bf16 level with its bf16 GEMMs (gmm, gmm_pair, gmm_dlhs,
// gmm_dlhs_add, gmm_drhs) on AMX tiles: TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a
// 32 x 16 tile of B (bf16 pairs along the reduction, the layout of avx512_bf16's packed panels)
// into a 16 x 16 f32 tile. f32 GEMMs and the row primitives are avx512_bf16's.
//
// Bits. Every output element is one chain over its reduction in tile steps of 32 elements (16
// pairs) in increasing order from +0, each step one TDPBF16PS; the last step of a reduction that
// is not a whole number of steps runs on zeros past its end (A and B both). A chain depends only on
// its row of A, its column of B and the length: never on the tile or row block a row lands in, the
// column block, the reduction slices (the f32 sums are stored and reloaded exactly between them) or
// the thread, so row independence, fused = split = expert parallelism hold here as at every level.
// The weight gradient's chains run over a group's rows from its first row. gmm_dlhs_sum runs two
// such chains per element (its two reduction segments, each from +0) and writes second + first. TDPBF16PS
// flushes bf16 denormal inputs and f32 denormal results to zero, as vdpbf16ps does; its sums of pairs round
// as the hardware rounds them, so this level's bits differ from avx512_bf16's (within the bound).
//
// Schedule. Tasks are (problem, block of kTaskPanels panels of 32 columns, 4 where the task's copy of
// A is kept or A is read in place, block of rows); a task
// walks the reduction in slices of about kSliceSteps steps (slice_steps): it packs the slice of each of its
// panels (16-24 KiB a panel, L1) and copies the slice of its rows of A tile-ready (per 32-row block and step,
// each tile's 16 rows of 64 bytes contiguous; L2), then for each panel runs every row block against
// it (C tiles reloaded from and stored to its 4 KiB block of the task's f32 sums), so B is read from L1 and A
// from L2. Tasks run a block of rows with each of its column blocks in turn; where the copy of the rows over
// the whole reduction fits in 1 MiB it is made once, before the first slice, and the thread's next
// tasks on the same rows read it again (each column block copied A anew: granite-1b's up.gmm at
// 1,024 columns copied its A four times).
// A block's sums go to the output (rounded to bf16, or f32, plus an addend) right after its last
// slice, while they are in L1.
// clang-format off: the order matters (every shared header before the target region opens).
#include "kernels/x86/kernel_headers.h"

#include "kernels/x86/target_amx_bf16.h"

#include "kernels/x86/simd_avx512_bf16.h"
#include "kernels/simd/gemm_impl.h"
// clang-format on

namespace moe::x86 {

const kernels::Table& table_avx512_bf16();

namespace {
using namespace simd;
using V = Avx512Bf16;  // bf16 outputs rounded by VCVTNEPS2BF16

constexpr int64_t kStepWords = 16;              // words (bf16 pairs) of an A row per tile step
constexpr int64_t kStepBytes = 4 * kStepWords;  // one 64-byte tile row
constexpr int64_t kPanel = 32;                  // output columns per panel: two C tiles
constexpr int64_t kBlock = 32;                  // output rows per row block: two C tiles
constexpr int64_t kPanelRowBytes = 4 * kPanel;  // a packed B row: 32 words
constexpr int64_t kSliceSteps = 8;              // tile steps per reduction slice (256 elements) ...
constexpr int64_t kSliceMax = 12;               // ... up to 12 where that avoids a short last slice
constexpr int64_t kSliceWords = kSliceMax * kStepWords * kPanel;    // room for a panel's slice: 24 KiB
constexpr int64_t kTaskPanels = 8;                                  // panels per task (256 columns)
constexpr int64_t kTaskPanelsKept = 4;  // ... where the task's copy of A is kept or A read in place
constexpr int64_t kTaskRowsMax = 512, kTaskRowsMin = 64;
// A task's f32 sums: one contiguous 32 x 32 block (4 KiB, rows kSumsLd floats apart) per row block and
// panel, block (m, pi) at (m * np + pi) * kBlockSums. Its C tiles are reloaded and stored once per
// reduction slice; rows a task's width apart (1 KiB, as before) put a tile's 16 rows in 4 of L1's 64
// sets: in a micro-benchmark of the tile loop a step took 21 ns with C kept in the tiles, 33 ns with
// C reloaded every 8 steps from such rows, 30 from 4 KiB blocks; in the layer the steps of granite-1b
// and granite-3b ran 1-5% faster (docs/benchmarks.md, "The tile sums in blocks").
constexpr int64_t kSumsLd = kPanel;
constexpr int64_t kBlockSums = kBlock * kSumsLd;
constexpr int64_t kTaskSums = kTaskRowsMax / kBlock * kTaskPanels * kBlockSums;  // one segment's, per task
constexpr int64_t kACopyStepBytes = 2 * 16 * kStepBytes;  // a row block's copy of A per tile step: two tiles
constexpr int64_t kACopyStepWords = kACopyStepBytes / 4;
// A task's copy of A for its whole reduction (every block, step and segment) is kept for the next
// tasks of the thread's chunk with the same rows (the other column blocks) when it fits in this.
constexpr int64_t kKeptACopyWords = (int64_t(1) << 20) / 4;

// Palette 1, tiles 0-7 all 16 rows x 64 bytes: 0-3 the C tiles of a 32 x 32 block (rows 0-15 x
// columns 0-15, 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31), 4-5 A (rows 0-15, 16-31), 6-7 B
// (columns 0-15, 16-31).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The tile configuration for a scope; released at its end, so a thread holds no tile state
// between calls (the state is 8 KiB per thread in every context switch and signal frame).
class Tiles {
 public:
  Tiles() {
    TileConfig c;
    for (int t = 0; t < 8; ++t) c.colsb[t] = uint16_t(kStepBytes), c.rows[t] = 16;
    // The intrinsics' asm names only the first 8 bytes of the configuration (and the tile loads
    // no memory at all): a compiler barrier keeps every store before them in place.
    asm volatile("" ::: "memory");
    _tile_loadconfig(&c);
  }
  ~Tiles() { _tile_release(); }
  Tiles(const Tiles&) = delete;
  Tiles& operator=(const Tiles&) = delete;
};

// One GEMM of a call: out rows row0 + [0, rows) = A rows [0, rows) @ the weights of `id`.
// A: rows of `len` bf16 at a stride of `lda`; rows [lo, hi) (lo <= 0, hi >= rows, hi - lo >= 16) may be
// read, so a block of fewer than 32 rows loads its 16-row tiles from a window inside them. `padded`:
// every row holds whole tile steps (zeros past len); else the last step is copied zero-padded.
// `a2` (gmm_dlhs_sum): a second reduction segment, rows of A at a2 (laid out as a's) against the
// weights' segment 1: its chain runs from +0 apart from the first's, and the output is the two
// chains' f32 sum (second + first), rounded once.
// `t` (the weight gradient's lhs^T, made by the task's copy of A): A row d, reduction element j is
// t[j * ldt + d], for j < len and d < ldt (zeros elsewhere); `a` is not read.
// `gather` (a gathered lhs, grouped_gemm.h's Lhs): A's row i is at a + gather[i] * lda (t's row j at
// t + gather[j] * ldt), for every row that may be read; the problem's rows are a's (t's) rows through
// it, so the copy of A gathers them and the sorted rows are never written. Not with `padded` or `a2`.
struct Problem {
  const bf16* a;
  int64_t lda, rows, lo, hi, len;
  bool padded;
  int64_t row0, id;
  const bf16* a2 = nullptr;
  const bf16* t = nullptr;
  int64_t ldt = 0;
  const int32_t* gather = nullptr;
};

// Row i of a problem's A (segment 0's, through its gather) and row j of its lhs^T source t.
inline const bf16* a_row(const Problem& pr, int64_t i) {
  return pr.a + (pr.gather ? int64_t(pr.gather[i]) : i) * pr.lda;
}
inline const bf16* t_row(const Problem& pr, int64_t j) {
  return pr.t + (pr.gather ? int64_t(pr.gather[j]) : j) * pr.ldt;
}

struct Task {
  int64_t p, panel0, r0, r1;  // problem, first panel, rows [r0, r1) of the problem
  int64_t np;                 // panels (kTaskPanelsKept or kTaskPanels, fewer at the last columns)
};

// C tiles += `n` steps of A (tile 4's rows from a0, tile 5's from a1, rows `lda` bytes apart, the
// next step `a_step` bytes on) and B (rows of 32 words). The C tiles come from and go to `c` (rows `ldc`
// bytes apart), or start at zero when `zero`. kTwo: a block of more than 16 rows, both A tiles and all four C
// tiles; else tile 4 and C 0-1.
template <bool kTwo>
MOE_INLINE void run_block(const std::byte* a0, const std::byte* a1, ptrdiff_t lda, ptrdiff_t a_step,
                          int64_t n, const std::byte* b, std::byte* c, ptrdiff_t ldc, bool zero,
                          Prefetcher& pf) {
  asm volatile("" ::: "memory");  // the packed slices are stored before the tile loads read them
  std::byte* c2 = c + 16 * ldc;
  if (zero) {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kTwo) {
      _tile_zero(2);
      _tile_zero(3);
    }
  } else {
    _tile_loadd(0, c, ldc);
    _tile_loadd(1, c + 64, ldc);
    if constexpr (kTwo) {
      _tile_loadd(2, c2, ldc);
      _tile_loadd(3, c2 + 64, ldc);
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    const std::byte* bs = b + s * kStepWords * kPanelRowBytes;
    _tile_loadd(6, bs, kPanelRowBytes);
    _tile_loadd(7, bs + 64, kPanelRowBytes);
    _tile_loadd(4, a0 + s * a_step, lda);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwo) {
      _tile_loadd(5, a1 + s * a_step, lda);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    pf.ran(1);
  }
  _tile_stored(0, c, ldc);
  _tile_stored(1, c + 64, ldc);
  if constexpr (kTwo) {
    _tile_stored(2, c2, ldc);
    _tile_stored(3, c2 + 64, ldc);
  }
}

// A row block of a task: rows [r, r + mr) of the problem; its A tiles read rows w[0] + [0, 16) and
// (two) w[1] + [0, 16).
struct RowBlock {
  int64_t r, mr, w[2];
  bool two;
};

inline RowBlock row_block(const Problem& pr, int64_t r, int64_t r1) {
  RowBlock b{r, std::min(kBlock, r1 - r), {0, 0}, false};
  b.two = b.mr > 16;
  b.w[0] = b.two ? r : std::min(r, pr.hi - 16);
  b.w[1] = b.two ? r + b.mr - 16 : b.w[0];
  return b;
}

// `stream`: whole aligned vectors of an f32 output with non-temporal stores (simd::kStreamBytes).
void write_out(float* o, __m512 x, int64_t n, bool stream) {
  if (stream && n == V::L && (reinterpret_cast<uintptr_t>(o) & uintptr_t(V::kStreamAlign - 1)) == 0)
    return V::stream(o, x);
  V::store_n(o, x, n);
}
void write_out(bf16* o, __m512 x, int64_t n, bool) { V::store_bf16_n(o, x, n); }

// Writes a row block's f32 sums (tile t's row i at sums row 16t + i) to the output: the rows the
// block owns, columns [c, c + nc), plus the addend, rounded to Out.
// `first` (a second segment's block): the first segment's sums of the block, at sums' layout, added
// before the addend.
template <class Out>
void epilogue(const Problem& pr, const RowBlock& b, const float* sums, int64_t c, int64_t nc, Out* out,
              int64_t ldc, Addend add, bool stream, const float* first = nullptr) {
  for (int t = 0; t < (b.two ? 2 : 1); ++t)
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t row = b.w[t] + i;
      if (row < b.r + 16 * t || row >= b.r + b.mr) continue;
      const float* s = sums + (16 * t + i) * kSumsLd;
      const int64_t orow = pr.row0 + row;
      for (int64_t v = 0; v < kPanel && v < nc; v += V::L) {
        const int64_t n = std::min<int64_t>(V::L, nc - v);
        __m512 x = V::load(s + v);
        if (first) x = V::add(x, V::load(first + (16 * t + i) * kSumsLd + v));
        if (add.p) x = V::add(x, V::load_n(add.p + orow * add.ld + c + v, n));
        write_out(out + orow * ldc + c + v, x, n, stream);
      }
    }
}

// Tile steps of a reduction of `len` elements.
constexpr int64_t steps_of(int64_t len) { return (len + 2 * kStepWords - 1) / (2 * kStepWords); }

// A copy padded to whole steps (the weight gradient's lhs^T written out) is read in place unless its
// rows are a multiple of 2 KiB apart (the L2 sets, amx_gemm): copying it again cost granite-1b's
// weight gradient a second pass over lhs^T.
bool reads_a_in_place(const Problem& pr) { return pr.padded && (pr.lda * 2) % 2048 != 0; }
// Whether a task of `nb` row blocks keeps its copy of A over the whole reduction (every segment).
bool keeps_whole_copy(const Problem& pr, int64_t nb) {
  return !reads_a_in_place(pr) &&
         (pr.a2 ? 2 : 1) * nb * steps_of(pr.len) * kACopyStepWords <= kKeptACopyWords;
}

// Steps per slice of a reduction of S steps: about kSliceSteps, evened out so that no slice is much
// shorter than the others (each slice costs a pass of packing and of C tiles over every block and
// panel: a weight gradient over a group of 257-288 rows, 9 steps, ran a second slice of one step),
// and at most kSliceMax. The slices do not change the bits (the sums are stored exactly between
// them).
constexpr int64_t slice_steps(int64_t S) {
  const int64_t n =
      std::max<int64_t>({(S + kSliceMax - 1) / kSliceMax, (S + kSliceSteps / 2) / kSliceSteps, 1});
  return std::max<int64_t>((S + n - 1) / n, 1);
}
static_assert(slice_steps(9) == 9 && slice_steps(32) == 8 && slice_steps(16) == 8 && slice_steps(13) == 7 &&
              slice_steps(12) == 6 && slice_steps(257) <= kSliceMax && slice_steps(1) == 1);

// The tile-ready copy of A (amx_gemm's copy_a) for a problem with `t`: steps [s0, s1) of blocks
// [0, nb), block m's at dst0 + m * block_steps steps; a tile's row d, step st holds the pairs
// (t[j][d], t[j + 1][d]) for j = 32 st, 32 st + 2, ...: 16 reduction rows of t paired and 16 x 16
// words transposed.
void copy_transposed(const Problem& pr, const RowBlock* blocks, int64_t nb, int64_t s0, int64_t s1,
                     uint32_t* dst0, int64_t block_steps) {
  for (int64_t m = 0; m < nb; ++m)
    for (int k = 0; k < (blocks[m].two ? 2 : 1); ++k) {
      const int64_t d0 = blocks[m].w[k], nc = std::clamp<int64_t>(pr.ldt - d0, 0, V::L);
      uint32_t* dst = dst0 + m * block_steps * kACopyStepWords + 16 * k * kStepWords;
      for (int64_t st = s0; st < s1; ++st, dst += kACopyStepWords) {
        typename V::I v[V::L], unused;
        for (int w = 0; w < V::L; ++w) {
          const int64_t j = 2 * (st * kStepWords + w);
          if (j >= pr.len) {
            v[w] = V::zero_words();
            continue;
          }
          const auto* row = reinterpret_cast<const uint16_t*>(t_row(pr, j) + d0);
          const auto* next =
              j + 1 < pr.len ? reinterpret_cast<const uint16_t*>(t_row(pr, j + 1) + d0) : nullptr;
          V::pair_words(row, next, nc, v[w], unused);
        }
        V::transpose(v);
        for (int i = 0; i < V::L; ++i) V::store_words(dst + i * kStepWords, v[i]);
      }
    }
}

// Runs every problem: out (row stride ldc) columns [0, n_out). w.pack(problem, c0, nc, w0, w1, dst)
// packs words [w0, w1) of the problem's weight columns [c0, c0 + nc) as bf16 pairs into rows of 32
// words at dst (rows past the reduction and columns past nc zero, up to w1 - w0 rows);
// w.region(problem, c0, c1, w0, w1) names the bytes that packing reads. While a slice's tiles run,
// the bytes of the next slice (or of the next task's first) are prefetched a few lines per tile
// step (simd::Prefetcher, driven from run_block), so the weights' DRAM reads overlap the tiles.
// `stream`: the f32 output is written with non-temporal stores (it is larger than the caches).
// A second output (gmm_drhs_pair): output columns [at, n_out) go to out at column c - at, row stride
// ldc, with their own addend; columns [0, at) to amx_gemm's out. `at` is a whole number of panels.
template <class Out>
struct SecondOut {
  Out* out;
  int64_t ldc;
  Addend add;
  int64_t at;
};

template <class Out, class Weights>
void amx_gemm(const std::vector<Problem>& probs, int64_t n_out, Out* out, int64_t ldc, Addend add,
              const Weights& w, bool stream = false, const SecondOut<Out>* second = nullptr) {
  // A row block's sums of output columns [c, c + nc) (one panel) to whichever output holds them.
  auto emit = [&](const Problem& pr, const RowBlock& rb, const float* sums, int64_t c, int64_t nc,
                  const float* first) {
    if (second && c >= second->at)
      return epilogue(pr, rb, sums, c - second->at, nc, second->out, second->ldc, second->add, stream, first);
    epilogue(pr, rb, sums, c, nc, out, ldc, add, stream, first);
  };
  const int64_t panels = (n_out + kPanel - 1) / kPanel;
  int64_t total = 0;
  for (const Problem& p : probs) total += p.rows;
  const int64_t threads = int64_t(ThreadPool::compute().size());
  const int64_t limit =
      std::clamp<int64_t>((total / (4 * threads) + kBlock - 1) / kBlock * kBlock, kTaskRowsMin, kTaskRowsMax);
  std::vector<Task> tasks;
  for (int64_t p = 0; p < int64_t(probs.size()); ++p) {
    const int64_t rows = probs[size_t(p)].rows;
    if (rows == 0) continue;
    const int64_t n_blocks = (rows + limit - 1) / limit;
    const int64_t step = ((rows + n_blocks - 1) / n_blocks + kBlock - 1) / kBlock * kBlock;
    // A block of rows with each of its column blocks in turn: consecutive tasks share their rows of A.
    // Where A is not copied per task (kept, or read in place), narrower column blocks: more tasks to
    // share out, and half the panels' slices to hold (granite-1b's GEMMs 5-8% faster); where each
    // task copies its slices of A, a narrower block would copy them twice as often.
    const Problem& pr = probs[size_t(p)];
    const int64_t width = reads_a_in_place(pr) || keeps_whole_copy(pr, (step + kBlock - 1) / kBlock)
                              ? kTaskPanelsKept
                              : kTaskPanels;
    for (int64_t r = 0; r < rows; r += step)
      for (int64_t p0 = 0; p0 < panels; p0 += width)
        tasks.push_back({p, p0, r, std::min(rows, r + step), std::min(width, panels - p0)});
  }
  parallel_for(int64_t(tasks.size()), 1, [&](int64_t tb, int64_t te) {
    constexpr int64_t kBlocksMax = kTaskRowsMax / kBlock;
    uint32_t* bp = scratch(size_t(kTaskPanels * kSliceWords), 0);
    // The f32 sums of the task's rows and columns, then the slice's copy of A.
    constexpr int64_t kBlockCopyWords = kSliceMax * kACopyStepWords;
    // A second segment's sums follow the first's (gmm_dlhs_sum).
    const int64_t nsums = probs.empty() || probs[0].a2 == nullptr ? 1 : 2;
    uint32_t* buf =
        scratch(size_t(nsums * kTaskSums + std::max(kBlocksMax * kBlockCopyWords, kKeptACopyWords)), 1);
    float* const sums0 = reinterpret_cast<float*>(buf);
    uint32_t* acopy = buf + nsums * kTaskSums;
    Tiles tiles;
    Prefetcher pf;
    int64_t kept_p = -1, kept_r0 = -1;  // the task whose whole copy of A is in acopy (none yet)
    for (int64_t ti = tb; ti < te; ++ti) {
      const Task& t = tasks[size_t(ti)];
      const Problem& pr = probs[size_t(t.p)];
      const int64_t np = t.np, c0 = t.panel0 * kPanel;
      const int64_t P = (pr.len + 1) / 2, S = steps_of(pr.len), slice = slice_steps(S);
      const int64_t whole = pr.padded ? S : pr.len / (2 * kStepWords);  // steps inside every row
      const bool in_place = reads_a_in_place(pr);
      const int64_t nb = (t.r1 - t.r0 + kBlock - 1) / kBlock;
      RowBlock blocks[kBlocksMax];
      for (int64_t m = 0; m < nb; ++m) blocks[m] = row_block(pr, t.r0 + m * kBlock, t.r1);
      if (S == 0)  // an empty reduction: zero sums
        std::memset(sums0, 0, size_t(nb * np * kBlockSums * 4));
      const int seg_n = pr.a2 ? 2 : 1;
      // Copies rows of A tile-ready: per block and tile step a tile's 16 rows of 64 bytes, contiguous
      // (read in place, rows a multiple of 4 KiB apart shared a few L2 sets: seed-mixtral's up.gmm
      // ran 1.4-1.6x slower), the step past a row's end zero-padded. Steps [s0, s1) of segment `seg`
      // go to dst, block m's at dst + m * block_steps steps.
      auto copy_a = [&](int seg, int64_t s0, int64_t s1, uint32_t* dst0, int64_t block_steps) {
        if (pr.t) return copy_transposed(pr, blocks, nb, s0, s1, dst0, block_steps);
        for (int64_t m = 0; m < nb; ++m)
          for (int k = 0; k < (blocks[m].two ? 2 : 1); ++k)
            for (int64_t i = 0; i < 16; ++i) {
              const int64_t row = blocks[m].w[k] + i;
              const std::byte* src =
                  reinterpret_cast<const std::byte*>(seg == 0 ? a_row(pr, row) : pr.a2 + row * pr.lda);
              uint32_t* dst = dst0 + m * block_steps * kACopyStepWords + (16 * k + i) * kStepWords;
              for (int64_t st = s0; st < s1; ++st, dst += kACopyStepWords)
                V::store_words(dst, st < whole
                                        ? V::words(src + st * kStepBytes)
                                        : V::words_n(src + st * kStepBytes, pr.len * 2 - st * kStepBytes));
            }
      };
      // Whole: the copy covers every step of every segment (copied once for the task's rows, so the
      // rows' other column blocks read it again); else each slice is copied before its tiles run.
      const bool whole_copy = keeps_whole_copy(pr, nb);
      if (whole_copy && (kept_p != t.p || kept_r0 != t.r0)) {
        for (int seg = 0; seg < seg_n; ++seg) copy_a(seg, 0, S, acopy + seg * nb * S * kACopyStepWords, S);
        kept_p = t.p, kept_r0 = t.r0;
      } else if (!whole_copy) {
        kept_p = -1;
      }
      for (int seg = 0; seg < seg_n; ++seg)
        for (int64_t s0 = 0; s0 < S; s0 += slice) {
          const bf16* const A = seg == 0 ? pr.a : pr.a2;
          float* const sums = sums0 + seg * kTaskSums;
          const bool last = s0 + slice >= S && seg == seg_n - 1;
          const int64_t s1 = std::min(S, s0 + slice), w0 = s0 * kStepWords, w1 = std::min(P, s1 * kStepWords);
          const int64_t packed = w1 - w0, rows_all = (s1 - s0) * kStepWords;
          for (int64_t pi = 0; pi < np; ++pi) {
            uint32_t* dst = bp + pi * kSliceWords;
            w.pack(pr, c0 + pi * kPanel, std::min(kPanel, n_out - c0 - pi * kPanel), w0, w1, dst, seg);
            if (packed < rows_all)
              std::memset(dst + packed * kPanel, 0, size_t((rows_all - packed) * kPanel * 4));
          }
          Region next{};
          if (s1 < S) {
            next = w.region(pr, c0, c0 + np * kPanel, s1 * kStepWords, std::min(P, (s1 + slice) * kStepWords),
                            seg);
          } else if (seg + 1 < seg_n) {
            next = w.region(pr, c0, c0 + np * kPanel, 0, std::min(P, slice * kStepWords), seg + 1);
          } else if (ti + 1 < te) {
            const Task& nt = tasks[size_t(ti + 1)];
            const Problem& np_ = probs[size_t(nt.p)];
            next = w.region(np_, nt.panel0 * kPanel, std::min(n_out, (nt.panel0 + nt.np) * kPanel), 0,
                            std::min((np_.len + 1) / 2, slice_steps(steps_of(np_.len)) * kStepWords), 0);
          }
          pf.start(next, np * nb * (s1 - s0));
          if (!in_place && !whole_copy) copy_a(seg, s0, s1, acopy, kSliceMax);
          // Block m's copy of this slice: at step s0 of its whole copy, or at the slice's own.
          const uint32_t* const slice_a = whole_copy ? acopy + (seg * nb * S + s0) * kACopyStepWords : acopy;
          const int64_t block_words = (whole_copy ? S : kSliceMax) * kACopyStepWords;
          for (int64_t pi = 0; pi < np; ++pi) {
            const std::byte* b = reinterpret_cast<const std::byte*>(bp + pi * kSliceWords);
            for (int64_t m = 0; m < nb; ++m) {
              const RowBlock& rb = blocks[m];
              const std::byte* a0 = reinterpret_cast<const std::byte*>(slice_a + m * block_words);
              const std::byte* a1 = a0 + 16 * kStepBytes;
              ptrdiff_t lda = kStepBytes, a_step = kACopyStepBytes;
              if (in_place) {
                a0 = reinterpret_cast<const std::byte*>(A + rb.w[0] * pr.lda) + s0 * kStepBytes;
                a1 = reinterpret_cast<const std::byte*>(A + rb.w[1] * pr.lda) + s0 * kStepBytes;
                lda = pr.lda * 2, a_step = kStepBytes;
              }
              std::byte* c = reinterpret_cast<std::byte*>(sums + (m * np + pi) * kBlockSums);
              if (rb.two)
                run_block<true>(a0, a1, lda, a_step, s1 - s0, b, c, kSumsLd * 4, s0 == 0, pf);
              else
                run_block<false>(a0, a1, lda, a_step, s1 - s0, b, c, kSumsLd * 4, s0 == 0, pf);
              // After the last slice, the block's sums go out while they are still in L1.
              if (last)
                emit(pr, rb, reinterpret_cast<const float*>(c), c0 + pi * kPanel,
                     std::min(kPanel, n_out - c0 - pi * kPanel),
                     seg == 1 ? sums0 + (m * np + pi) * kBlockSums : nullptr);
            }
          }
        }
      if (S == 0)
        for (int64_t m = 0; m < nb; ++m)
          for (int64_t pi = 0; pi < np; ++pi) {
            const int64_t c = c0 + pi * kPanel;
            emit(pr, blocks[m], sums0 + (m * np + pi) * kBlockSums, c, std::min(kPanel, n_out - c), nullptr);
          }
    }
    if (stream) V::fence();  // the streamed rows are visible before the task reports done
  });
}

// The lhs rows of gmm, gmm_pair and the weight gradient: M rows of Kc bf16, row r at A + r * Kc, or
// at A + gather[r] * Kc (a gathered lhs).
struct Rows {
  const bf16* A;
  const int32_t* gather;
  int64_t M, Kc;
};
Rows rows_of(const Tensor& lhs) { return {lhs.data<bf16>(), nullptr, lhs.dim(0), lhs.dim(1)}; }
Rows rows_of(const Tensor& src, const Tensor& index) {
  return {src.data<bf16>(), index.data<int32_t>(), index.dim(0), src.dim(1)};
}

// gmm and gmm_dlhs shape: the groups [goff, goff + n_local) of a's M rows of len = a.Kc, one problem
// each (a gathered a: row r is A's row gather[r]). A tensor of fewer than 16 rows is read from a
// zero-padded copy of 16. A2 (gmm_dlhs_sum, not with a gathered a): the second segment's A, laid out
// as a's.
template <class Out, class Weights>
void grouped_rows(const Rows& a, Out* out, int64_t ldc, int64_t n_out, const GroupLayout& groups,
                  int64_t goff, int64_t n_local, Addend add, const Weights& w, const bf16* A2 = nullptr) {
  Words pad(Words::From::engine), pad2(Words::From::engine);
  const bf16* A = a.A;
  const int32_t* gather = a.gather;
  const int64_t M = a.M, len = a.Kc;
  int64_t readable = M;
  auto padded = [&](const bf16* from, const int32_t* ix, Words& buf) {
    bf16* p = reinterpret_cast<bf16*>(buf.get(size_t(std::max<int64_t>(words_of<bf16>(16 * len), 1))));
    std::memset(p, 0, size_t(16 * len) * sizeof(bf16));
    for (int64_t r = 0; r < M; ++r)
      std::memcpy(p + r * len, from + (ix ? int64_t(ix[r]) : r) * len, size_t(len) * sizeof(bf16));
    return p;
  };
  if (M < 16) {
    A = padded(A, gather, pad), readable = 16, gather = nullptr;
    if (A2) A2 = padded(A2, nullptr, pad2);
  }
  std::vector<Problem> probs;
  for (int64_t lg = 0; lg < n_local; ++lg) {
    const int64_t g0 = groups.offsets[size_t(goff + lg)], g1 = groups.offsets[size_t(goff + lg + 1)];
    probs.push_back({gather ? A : A + g0 * len, len, g1 - g0, -g0, readable - g0, len, false, g0, lg,
                     A2 ? A2 + g0 * len : nullptr, nullptr, 0, gather ? gather + g0 : nullptr});
  }
  amx_gemm(probs, n_out, out, ldc, add, w);
}

using RowPairs = RowWeights<V, Pack::pairs, 2, bf16>;
using TransposedPairs = TransposedWeights<V, Pack::pairs, 2, bf16>;

// The weights of problem `id` = local group `id` of a weight view (RowWeights, TransposedWeights or
// PairWeights of bf16 pairs).
template <class W>
struct GroupWeights {
  const W& w;
  void pack(const Problem& p, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int = 0) const {
    w.pack(p.id, c0, nc, w0, w1, dst, kPanel);
  }
  Region region(const Problem& p, int64_t c0, int64_t c1, int64_t w0, int64_t w1, int = 0) const {
    return w.region(p.id, c0, c1, w0, w1);
  }
};
// Two reduction segments' weights (gmm_dlhs_sum): segment 0 from `first`, 1 from `second`.
template <class W>
struct SegmentWeights {
  GroupWeights<W> first, second;
  void pack(const Problem& p, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int seg) const {
    (seg == 0 ? first : second).pack(p, c0, nc, w0, w1, dst);
  }
  Region region(const Problem& p, int64_t c0, int64_t c1, int64_t w0, int64_t w1, int seg) const {
    return (seg == 0 ? first : second).region(p, c0, c1, w0, w1);
  }
};
template <class W>
GroupWeights<W> packer(const W& w) {
  return {w};
}

template <class Out>
void gmm_out(const Rows& a, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& out) {
  const int64_t N = rhs.dim(2);
  const RowPairs w{rhs.data<bf16>(), a.Kc, N};
  grouped_rows(a, out.data<Out>(), N, N, g, goff, rhs.dim(0), Addend{}, packer(w));
}

// Both weights in one pass over A when N0 is a whole number of panels (every panel packs from one
// side); else the two GEMMs into the two column windows. The same bits either way.
template <class Out>
void gmm_pair_out(const Rows& a, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& g, int64_t goff,
                  Tensor& out) {
  const int64_t Kc = a.Kc, N0 = rhs0.dim(2), N1 = rhs1.dim(2), ld = N0 + N1, n = rhs0.dim(0);
  const RowPairs lo{rhs0.data<bf16>(), Kc, N0}, hi{rhs1.data<bf16>(), Kc, N1};
  Out* o = out.data<Out>();
  if (N0 % kPanel == 0) {
    const PairWeights<RowPairs> w{lo, hi, N0};
    return grouped_rows(a, o, ld, ld, g, goff, n, Addend{}, packer(w));
  }
  grouped_rows(a, o, ld, N0, g, goff, n, Addend{}, packer(lo));
  grouped_rows(a, o + N0, ld, N1, g, goff, n, Addend{}, packer(hi));
}

// The bf16 GEMMs by output dtype (f32 or bf16), for a plain or a gathered lhs.
void gmm_bf16(const Rows& a, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& out) {
  if (out.dtype() == DType::f32) return gmm_out<float>(a, rhs, g, goff, out);
  gmm_out<bf16>(a, rhs, g, goff, out);
}
void gmm_pair_bf16(const Rows& a, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& g, int64_t goff,
                   Tensor& out) {
  if (out.dtype() == DType::f32) return gmm_pair_out<float>(a, rhs0, rhs1, g, goff, out);
  gmm_pair_out<bf16>(a, rhs0, rhs1, g, goff, out);
}

template <class Out>
void dlhs_bf16(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& dlhs,
               const Tensor* addend) {
  const int64_t Kc = rhs.dim(1), N = rhs.dim(2);
  const TransposedPairs w{rhs.data<bf16>(), Kc, N};
  grouped_rows(rows_of(dout), dlhs.data<Out>(), Kc, Kc, g, goff, rhs.dim(0),
               addend ? Addend{addend->data<float>(), Kc} : Addend{}, packer(w));
}

// dlhs = round(p0 + p1), p_i = dout_i @ rhs_i^T: both chains in one pass over the output, the first's
// sums kept in the task's f32 sums while the second runs (the bits of gmm_dlhs into f32, then
// gmm_dlhs_add, without the f32 partial written and read back).
template <class Out>
void dlhs_sum_bf16(const Tensor& dout0, const Tensor& rhs0, const Tensor& dout1, const Tensor& rhs1,
                   const GroupLayout& g, int64_t goff, Tensor& dlhs) {
  const int64_t Kc = rhs0.dim(1), N = rhs0.dim(2);
  const TransposedPairs w0{rhs0.data<bf16>(), Kc, N}, w1{rhs1.data<bf16>(), Kc, N};
  grouped_rows(rows_of(dout0), dlhs.data<Out>(), Kc, Kc, g, goff, rhs0.dim(0), Addend{},
               SegmentWeights<TransposedPairs>{{w0}, {w1}}, dout1.data<bf16>());
}

// The weights of the weight gradient's problem `id` (local group id): dout's rows of the group,
// packed as pairs along the rows.
struct DoutRows {
  const bf16* D;
  int64_t N;
  const GroupLayout* groups;
  int64_t goff;
  const bf16* rows_of(const Problem& p) const { return D + groups->offsets[size_t(goff + p.id)] * N; }
  void pack(const Problem& p, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int = 0) const {
    pack_rows<V, Pack::pairs>(rows_of(p), N, 2 * w0, std::min(p.len, 2 * w1), c0, nc, dst, kPanel, kPanel);
  }
  Region region(const Problem& p, int64_t c0, int64_t c1, int64_t w0, int64_t w1, int = 0) const {
    return {reinterpret_cast<const std::byte*>(rows_of(p) + 2 * w0 * N + c0), ptrdiff_t(N * sizeof(bf16)),
            std::max<int64_t>(0, std::min(p.len, 2 * w1) - 2 * w0), (c1 - c0) * int64_t(sizeof(bf16))};
  }
};

// Two douts side by side (gmm_drhs_pair): columns [0, n0) of the first, then the second's; n0 is a
// whole number of panels, so a panel packs from one side.
struct DoutRowsPair {
  DoutRows lo, hi;
  int64_t n0;
  void pack(const Problem& p, int64_t c0, int64_t nc, int64_t w0, int64_t w1, uint32_t* dst, int = 0) const {
    if (c0 < n0) return lo.pack(p, c0, nc, w0, w1, dst);
    hi.pack(p, c0 - n0, nc, w0, w1, dst);
  }
  // A block of columns on both sides names its larger part: a prefetch is only a hint.
  Region region(const Problem& p, int64_t c0, int64_t c1, int64_t w0, int64_t w1, int = 0) const {
    if (c1 <= n0) return lo.region(p, c0, c1, w0, w1);
    if (c0 >= n0) return hi.region(p, c0 - n0, c1 - n0, w0, w1);
    return n0 - c0 >= c1 - n0 ? lo.region(p, c0, n0, w0, w1) : hi.region(p, 0, c1 - n0, w0, w1);
  }
};

// drhs[g] [Kc, N] = lhs[rows g]^T @ dout[rows g]: A is lhs^T of the group, copied as rows of bf16
// pairs along the group's rows (whole tile steps, zeros past its rows; at least 16 rows), and B
// dout's rows of the group packed as pairs: so each element is one chain over the group's rows
// from its first, in tile steps. The copy depends only on lhs and the groups, so the two weight
// gradients of one lhs (wi_0 and wi_1) share it (drhs_pair).
class LhsT {
 public:
  LhsT(const Rows& lhs, const GroupLayout& groups, int64_t goff, int64_t n_local)
      : buf_(Words::From::engine) {
    const int64_t Kc = lhs.Kc;
    const bf16* L = lhs.A;
    const int32_t* ix = lhs.gather;
    auto row = [&](int64_t r) { return L + (ix ? int64_t(ix[r]) : r) * Kc; };  // row r of the M rows
    const int64_t rows_t = std::max<int64_t>(Kc, 16);  // rows of a group's lhs^T copy
    // Where every task's whole copy of A fits the copy amx_gemm keeps for a task's other column
    // blocks (a group of at most 1,024 rows at 512 columns of lhs and more), the tasks transpose
    // their own rows of lhs^T into it: lhs^T is never written out and read back (16 MB each way for
    // granite-1b's wi gradient).
    const int64_t blocks_max = std::min(kTaskRowsMax, (rows_t + kBlock - 1) / kBlock * kBlock) / kBlock;
    for (int64_t lg = 0; lg < n_local; ++lg) {
      const int64_t g0 = groups.offsets[size_t(goff + lg)], R = groups.sizes[size_t(goff + lg)];
      probs_.push_back({nullptr, 0, R > 0 ? Kc : 0, 0, rows_t, R, false, lg * Kc, lg, nullptr,
                        ix ? L : L + g0 * Kc, Kc, ix ? ix + g0 : nullptr});
    }
    bool by_task = !detail::force_lhs_t_copy.load(std::memory_order_relaxed);
    for (const Problem& p : probs_) by_task = by_task && keeps_whole_copy(p, blocks_max);
    if (by_task) return;
    probs_.clear();
    std::vector<int64_t> at(size_t(n_local) + 1, 0);   // words of the copies before group lg
    for (int64_t lg = 0; lg < n_local; ++lg)
      at[size_t(lg) + 1] = at[size_t(lg)] + rows_t * steps_of(groups.sizes[size_t(goff + lg)]) * kStepWords;
    uint32_t* lt = buf_.get(size_t(std::max<int64_t>(at.back(), 1)));
    // Copies: (group, 32 columns of lhs: a 64-byte line of each row) per job; two rows' 32 columns
    // paired into words of 16 columns each (lo, hi), and 16 x 16 words transposed at a time.
    constexpr int64_t kCols = 2 * V::L;
    const int64_t cblocks = (rows_t + kCols - 1) / kCols;
    parallel_for(n_local * cblocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) {
        const int64_t lg = j / cblocks, c0 = j % cblocks * kCols;
        const int64_t g0 = groups.offsets[size_t(goff + lg)], R = groups.sizes[size_t(goff + lg)];
        const int64_t words = steps_of(R) * kStepWords, nc = std::max<int64_t>(0, std::min(kCols, Kc - c0));
        uint32_t* dst = lt + at[size_t(lg)];
        for (int64_t q0 = 0; q0 < words; q0 += V::L) {
          typename V::I lo[V::L], hi[V::L];
          for (int i = 0; i < V::L; ++i) {
            const int64_t k = 2 * (q0 + i);  // lhs rows k, k + 1 of the group
            if (k >= R) {
              lo[i] = hi[i] = V::zero_words();
              continue;
            }
            V::pair_words(u16(row(g0 + k) + c0), k + 1 < R ? u16(row(g0 + k + 1) + c0) : nullptr, nc, lo[i],
                          hi[i]);
          }
          V::transpose(lo);
          for (int64_t i = 0; i < std::min<int64_t>(V::L, rows_t - c0); ++i)
            V::store_words(dst + (c0 + i) * words + q0, lo[i]);
          if (rows_t - c0 <= V::L) continue;
          V::transpose(hi);
          for (int64_t i = 0; i < std::min<int64_t>(V::L, rows_t - c0 - V::L); ++i)
            V::store_words(dst + (c0 + V::L + i) * words + q0, hi[i]);
        }
      }
    });
    for (int64_t lg = 0; lg < n_local; ++lg) {
      const int64_t R = groups.sizes[size_t(goff + lg)];
      probs_.push_back({reinterpret_cast<const bf16*>(lt + at[size_t(lg)]), 2 * steps_of(R) * kStepWords,
                        R > 0 ? Kc : 0, 0, rows_t, R, true, lg * Kc, lg});
    }
  }

  // drhs from dout (`accumulate`, gmm_drhs_acc: drhs := drhs + the chain, the add in the epilogue,
  // drhs its addend, so the gradient is read and written once, with no scratch).
  void run(const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs, bool accumulate) const {
    const int64_t N = dout.dim(1);
    float* G = drhs.data<float>();
    zero_empty(groups, goff, drhs, accumulate);
    // An accumulated gradient's lines are read right before they are written: plain stores.
    amx_gemm(probs_, N, G, N, accumulate ? Addend{G, N} : Addend{},
             DoutRows{dout.data<bf16>(), N, &groups, goff}, streams(drhs, accumulate));
  }

  // Both weight gradients of gmm_drhs_pair in one pass over the tasks (each task's rows of lhs^T
  // copied once for both); the bits of run() for each. REQUIRES: dout0's columns a whole number of
  // panels.
  void run_pair(const Tensor& dout0, const Tensor& dout1, const GroupLayout& groups, int64_t goff,
                Tensor& drhs0, Tensor& drhs1, bool accumulate) const {
    const int64_t N0 = dout0.dim(1), N1 = dout1.dim(1);
    float *G0 = drhs0.data<float>(), *G1 = drhs1.data<float>();
    zero_empty(groups, goff, drhs0, accumulate);
    zero_empty(groups, goff, drhs1, accumulate);
    const SecondOut<float> second{G1, N1, accumulate ? Addend{G1, N1} : Addend{}, N0};
    amx_gemm(
        probs_, N0 + N1, G0, N0, accumulate ? Addend{G0, N0} : Addend{},
        DoutRowsPair{{dout0.data<bf16>(), N0, &groups, goff}, {dout1.data<bf16>(), N1, &groups, goff}, N0},
        streams(drhs0, accumulate) || streams(drhs1, accumulate), &second);
  }
  static bool pairs_in_one_pass(const Tensor& dout0) { return dout0.dim(1) % kPanel == 0; }

 private:
  static bool streams(const Tensor& drhs, bool accumulate) {
    return !accumulate && drhs.nbytes() >= kStreamBytes;
  }
  // An empty group's gradient: zeros (fresh), or left as it is (accumulating: + 0).
  void zero_empty(const GroupLayout& groups, int64_t goff, Tensor& drhs, bool accumulate) const {
    const int64_t Kc = drhs.dim(1), N = drhs.dim(2);
    for (const Problem& p : probs_) {
      if (p.rows > 0 || groups.sizes[size_t(goff + p.id)] > 0) continue;
      empty_gradient<V>(drhs.data<float>() + p.id * Kc * N, Kc * N, streams(drhs, accumulate), accumulate);
    }
  }

 public:
 private:
  Words buf_;
  std::vector<Problem> probs_;
};

void drhs_bf16(const Rows& lhs, const Tensor& dout, const GroupLayout& groups, int64_t goff, Tensor& drhs,
               bool accumulate) {
  LhsT(lhs, groups, goff, drhs.dim(0)).run(dout, groups, goff, drhs, accumulate);
}

void drhs_pair_bf16(const Rows& lhs, const Tensor& dout0, const Tensor& dout1, const GroupLayout& g,
                    int64_t goff, Tensor& out0, Tensor& out1, bool accumulate) {
  const LhsT lt(lhs, g, goff, out0.dim(0));
  if (LhsT::pairs_in_one_pass(dout0)) return lt.run_pair(dout0, dout1, g, goff, out0, out1, accumulate);
  lt.run(dout0, g, goff, out0, accumulate);
  lt.run(dout1, g, goff, out1, accumulate);
}

const kernels::Table& base() { return table_avx512_bf16(); }

// f32 inputs, and a bf16 lhs with f32 weights or dout (the router's GEMMs), are avx512_bf16's.
void gmm(const Tensor& lhs, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& out) {
  if (lhs.dtype() == DType::f32 || rhs.dtype() == DType::f32) return base().gmm(lhs, rhs, g, goff, out);
  gmm_bf16(rows_of(lhs), rhs, g, goff, out);
}
void gmm_pair(const Tensor& lhs, const Tensor& rhs0, const Tensor& rhs1, const GroupLayout& g, int64_t goff,
              Tensor& out) {
  if (lhs.dtype() == DType::f32) return base().gmm_pair(lhs, rhs0, rhs1, g, goff, out);
  gmm_pair_bf16(rows_of(lhs), rhs0, rhs1, g, goff, out);
}
void dlhs(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t goff, Tensor& out) {
  if (dout.dtype() == DType::f32) return base().gmm_dlhs(dout, rhs, g, goff, out);
  if (out.dtype() == DType::f32) return dlhs_bf16<float>(dout, rhs, g, goff, out, nullptr);
  dlhs_bf16<bf16>(dout, rhs, g, goff, out, nullptr);
}
void dlhs_add(const Tensor& dout, const Tensor& rhs, const GroupLayout& g, int64_t goff, const Tensor& addend,
              Tensor& out) {
  if (dout.dtype() == DType::f32) return base().gmm_dlhs_add(dout, rhs, g, goff, addend, out);
  if (out.dtype() == DType::f32) return dlhs_bf16<float>(dout, rhs, g, goff, out, &addend);
  dlhs_bf16<bf16>(dout, rhs, g, goff, out, &addend);
}
void drhs(const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t goff, Tensor& out) {
  if (lhs.dtype() == DType::f32 || dout.dtype() == DType::f32)
    return base().gmm_drhs(lhs, dout, g, goff, out);
  drhs_bf16(rows_of(lhs), dout, g, goff, out, false);
}
void dlhs_sum(const Tensor& dout0, const Tensor& rhs0, const Tensor& dout1, const Tensor& rhs1,
              const GroupLayout& g, int64_t goff, Tensor& out) {
  if (dout0.dtype() == DType::f32 || rhs0.dim(2) != rhs1.dim(2))
    return kernels::dlhs_sum_by_calls(base(), dout0, rhs0, dout1, rhs1, g, goff, out);
  if (out.dtype() == DType::f32) return dlhs_sum_bf16<float>(dout0, rhs0, dout1, rhs1, g, goff, out);
  dlhs_sum_bf16<bf16>(dout0, rhs0, dout1, rhs1, g, goff, out);
}
void drhs_pair(const Tensor& lhs, const Tensor& dout0, const Tensor& dout1, const GroupLayout& g,
               int64_t goff, Tensor& out0, Tensor& out1, bool accumulate) {
  if (lhs.dtype() == DType::f32)
    return kernels::drhs_pair_by_calls(base(), lhs, dout0, dout1, g, goff, out0, out1, accumulate);
  drhs_pair_bf16(rows_of(lhs), dout0, dout1, g, goff, out0, out1, accumulate);
}
void drhs_acc(const Tensor& lhs, const Tensor& dout, const GroupLayout& g, int64_t goff, Tensor& acc) {
  if (lhs.dtype() == DType::f32) return base().gmm_drhs_acc(lhs, dout, g, goff, acc);
  drhs_bf16(rows_of(lhs), dout, g, goff, acc, true);
}

// A gathered lhs (bf16; grouped_gemm.h's Lhs): the copies of A read its rows through the index.
void gmm_gather(const Tensor& src, const Tensor& index, const Tensor& rhs, const GroupLayout& g, int64_t goff,
                Tensor& out) {
  gmm_bf16(rows_of(src, index), rhs, g, goff, out);
}
void gmm_pair_gather(const Tensor& src, const Tensor& index, const Tensor& rhs0, const Tensor& rhs1,
                     const GroupLayout& g, int64_t goff, Tensor& out) {
  gmm_pair_bf16(rows_of(src, index), rhs0, rhs1, g, goff, out);
}
void drhs_gather(const Tensor& src, const Tensor& index, const Tensor& dout, const GroupLayout& g,
                 int64_t goff, Tensor& drhs, bool accumulate) {
  drhs_bf16(rows_of(src, index), dout, g, goff, drhs, accumulate);
}
void drhs_pair_gather(const Tensor& src, const Tensor& index, const Tensor& dout0, const Tensor& dout1,
                      const GroupLayout& g, int64_t goff, Tensor& out0, Tensor& out1, bool accumulate) {
  drhs_pair_bf16(rows_of(src, index), dout0, dout1, g, goff, out0, out1, accumulate);
}
const kernels::GatherTable kGather{gmm_gather, gmm_pair_gather, drhs_gather, drhs_pair_gather};

}  // namespace

const kernels::Table& table_amx_bf16() {
  static const kernels::Table t = [] {
    kernels::Table r = base();
    r.isa = Isa::amx_bf16;
    r.gmm = gmm, r.gmm_pair = gmm_pair, r.gmm_dlhs = dlhs, r.gmm_dlhs_add = dlhs_add, r.gmm_drhs = drhs;
    r.gmm_drhs_acc = drhs_acc, r.gmm_drhs_pair = drhs_pair, r.gmm_dlhs_sum = dlhs_sum;
    r.gather = &kGather;
    return r;
  }();
  return t;
}

}  // namespace moe::x86

#include "kernels/x86/target_end.h"
