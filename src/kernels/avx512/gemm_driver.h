// Shared pieces of the AVX-512 grouped GEMM drivers (gmm / dlhs in
// grouped_gemm_avx512.cpp, drhs in gemm_drhs_avx512.cpp): scratch buffers,
// the A view, weight prefetching and the row loop over register tiles.
// Included only after the AVX-512 target pragma.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "kernels/avx512/gemm_tile.h"
#include "moe/error.h"

namespace moe::avx512 {

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

// The calling thread's packing buffers (two slots).
inline uint32_t* scratch(size_t words, int slot = 0) {
  thread_local Words buf[2];
  return buf[slot].get(words);
}

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// A operand of a tile: word (row r, step p) at base + r * row_bytes + p * step_bytes.
struct AView {
  const std::byte* base;
  ptrdiff_t row_bytes, step_bytes;
};

// A 2D byte region of a weight matrix that a later task will pack.
struct Region {
  const std::byte* base = nullptr;
  ptrdiff_t stride = 0;
  int64_t rows = 0, bytes = 0;
};

// Prefetches a region into L2 a slice per call, so the DRAM reads of the next
// task's weights overlap this task's tiles instead of stalling its packer.
class Prefetcher {
 public:
  void start(const Region& r, int64_t calls) {
    reg_ = r;
    row_ = col_ = 0;
    int64_t lines = r.rows * ((r.bytes + 63) / 64);
    per_call_ = (lines + std::max<int64_t>(calls, 1) - 1) / std::max<int64_t>(calls, 1);
  }
  void advance() {
    for (int64_t n = 0; n < per_call_ && row_ < reg_.rows; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(reg_.base + row_ * reg_.stride + col_), _MM_HINT_T1);
      col_ += 64;
      if (col_ >= reg_.bytes) col_ = 0, ++row_;
    }
  }

 private:
  Region reg_;
  int64_t row_ = 0, col_ = 0, per_call_ = 0;
};

// out rows [r0, r1) x columns [0, nc) = A rows [r0, r1) @ packed B (P words).
// A partial last tile repeats its last row (computed, not stored), so every
// row runs the same instruction chain whatever its position.
template <class Step, int MR, int NV, class Out>
void run_rows(const AView& a, int64_t r0, int64_t r1, const uint32_t* b, int64_t P, bool half_last, Out* out,
              int64_t ldc, int64_t nc, Prefetcher* pf, bool stream = false, bool accumulate = false) {
  for (int64_t r = r0; r < r1; r += MR) {
    int mr = int(std::min<int64_t>(MR, r1 - r));
    ptrdiff_t off[MR];
    for (int i = 0; i < MR; ++i) off[i] = (r + std::min(i, mr - 1)) * a.row_bytes;
    Tile<Step, MR, NV>::run(a.base, off, a.step_bytes, b, P, half_last, out + r * ldc, ldc, mr, nc, stream, accumulate);
    if (pf) pf->advance();
  }
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

}  // namespace moe::avx512
