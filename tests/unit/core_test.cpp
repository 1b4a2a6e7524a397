#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <random>

#include "moe/tensor.h"
#include "moe/thread_pool.h"

namespace moe {

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0).
  EXPECT_EQ(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, to_bf16(1.0f).bits);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  EXPECT_EQ(to_f32(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(to_f32(to_bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(to_f32(to_bf16(INFINITY))));
  // The largest finite float rounds up to infinity in bf16.
  EXPECT_TRUE(std::isinf(to_f32(to_bf16(3.4028235e38f))));
}

TEST(DType, F16RoundTrip) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f, 0.333251953125f})
    EXPECT_EQ(to_f32(to_f16(v)), v) << v;
  EXPECT_TRUE(std::isinf(to_f32(to_f16(1e6f))));
}

TEST(Tensor, ShapeCloneReshapeSlice) {
  Tensor t(DType::f32, {3, 4});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % Tensor::kAlign, 0u);
  for (int i = 0; i < 12; ++i) t.data<float>()[i] = float(i);
  Tensor s = t.slice_rows(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 4}));
  EXPECT_EQ(s.data<float>()[0], 4.0f);
  Tensor c = t.clone();
  c.data<float>()[0] = 99;
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  EXPECT_THROW(t.reshaped({5, 2}), Error);
  Tensor b = t.to(DType::bf16).to(DType::f32);
  EXPECT_TRUE(b.bit_equal(t));
}

// Live bytes count padded (64-byte) allocations; shared views allocate nothing.
TEST(Tensor, MemoryStatsTrackLiveAndPeakBytes) {
  TensorMemoryStats base = reset_tensor_memory_peak();
  EXPECT_EQ(base.peak_bytes, base.current_bytes);
  {
    Tensor a(DType::f32, {10, 10});  // 400 bytes -> 448 padded
    Tensor view = a.slice_rows(2, 5).reshaped({30});
    EXPECT_EQ(tensor_memory_stats().current_bytes - base.current_bytes, 448);
    Tensor b = Tensor::empty(DType::bf16, {1});  // 2 bytes -> 64
    EXPECT_EQ(tensor_memory_stats().current_bytes - base.current_bytes, 512);
  }
  TensorMemoryStats after = tensor_memory_stats();
  EXPECT_EQ(after.current_bytes, base.current_bytes);
  EXPECT_EQ(after.peak_bytes - base.current_bytes, 512);
  EXPECT_EQ(reset_tensor_memory_peak().peak_bytes, base.current_bytes);
}

TEST(ThreadPool, CoversRangeOnceAndRethrows) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t) {
    if (b >= 50) throw Error("boom");
  }),
               Error);
  // The pool still works after an error, and nested loops run serially.
  std::atomic<int> total{0};
  pool.parallel_for(10, 1, [&](int64_t b, int64_t e) {
    pool.parallel_for(10, 1, [&](int64_t b2, int64_t e2) { total += int((e - b) * (e2 - b2)); });
  });
  EXPECT_EQ(total.load(), 100);
}

// The chunks shrink as the loop goes: each is max(grain, ceil(left / (2 * threads))) items, they
// cover [0, n) in order, and the last ones are small, so the thread that takes the last chunk
// holds the others up for little (a long GEMM's 1,280 tasks end with chunks of one task).
TEST(ThreadPool, ChunksShrinkAsTheLoopGoes) {
  std::vector<int64_t> b;
  ThreadPool::chunk_bounds(1280, 1, 2, b);
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b.front(), 0);
  EXPECT_EQ(b.back(), 1280);
  EXPECT_EQ(b[1], 320);        // a quarter of the loop first (2 threads)
  EXPECT_EQ(b[2] - b[1], 240);  // then a quarter of what is left
  for (size_t i = 1; i + 1 < b.size(); ++i) {
    const int64_t left = 1280 - b[i - 1];
    EXPECT_EQ(b[i] - b[i - 1], (left + 3) / 4) << "chunk " << i - 1;
    EXPECT_GE(b[i] - b[i - 1], b[i + 1] - b[i]) << "chunks never grow, chunk " << i - 1;
  }
  EXPECT_EQ(b[b.size() - 1] - b[b.size() - 2], 1);
  EXPECT_LT(b.size(), 40u);  // few grabs of the shared counter
  // At least `grain` items a chunk but the last; one chunk when n fits one; the same bounds every time.
  ThreadPool::chunk_bounds(100, 16, 4, b);
  for (size_t i = 1; i + 1 < b.size(); ++i) EXPECT_GE(b[i] - b[i - 1], 16);
  EXPECT_EQ(b.back(), 100);
  std::vector<int64_t> again;
  ThreadPool::chunk_bounds(100, 16, 4, again);
  EXPECT_EQ(b, again);
  ThreadPool::chunk_bounds(5, 8, 2, b);
  EXPECT_EQ(b, (std::vector<int64_t>{0, 5}));
  ThreadPool::chunk_bounds(0, 1, 2, b);
  EXPECT_EQ(b, (std::vector<int64_t>{0}));
}

// resize() replaces the workers between loops; loops before and after cover their range once,
// and new workers never rerun a loop that ran before they started.
TEST(ThreadPool, ResizeBetweenLoops) {
  ThreadPool pool(3);
  for (int n : {1, 4, 2, 4}) {
    pool.resize(n);
    EXPECT_EQ(pool.size(), n);
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<std::atomic<int>> hits(500);
      pool.parallel_for(500, 3, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    }
  }
}

// A view of memory the engine does not own: same address, the owner released with the last copy,
// not counted as engine memory.
TEST(Tensor, FromExternalSharesAndReleasesTheOwner) {
  std::vector<float> buf(7, 2.5f);
  bool released = false;
  const int64_t before = tensor_memory_stats().current_bytes;
  {
    std::shared_ptr<void> owner(static_cast<void*>(nullptr), [&](void*) { released = true; });
    Tensor t = Tensor::from_external(DType::f32, {7}, buf.data() + 0, std::move(owner));
    Tensor copy = t.reshaped({7, 1});
    EXPECT_EQ(t.raw(), buf.data());
    EXPECT_EQ(copy.get_f32(6), 2.5f);
    EXPECT_EQ(tensor_memory_stats().current_bytes, before);
    t = Tensor();
    EXPECT_FALSE(released);
  }
  EXPECT_TRUE(released);
}
}  // namespace moe

namespace moe {
// The vectorized f32 -> bf16 conversion of Tensor::to gives the bits of the
// scalar to_bf16 for every pattern: random bits, NaNs, infinities, denormals.
TEST(Tensor, BulkBf16ConversionMatchesScalar) {
  std::mt19937 rng(7);
  Tensor t = Tensor::empty(DType::f32, {1 << 18});
  auto* u = static_cast<uint32_t*>(t.raw());
  for (int64_t i = 0; i < t.numel(); ++i) u[i] = rng();
  const uint32_t special[] = {0x7f800001u, 0x7fffffffu, 0xff800000u, 0x7f800000u, 0x00000001u, 0x807fffffu, 0x3f808000u};
  std::copy(std::begin(special), std::end(special), u);
  Tensor b = t.to(DType::bf16);
  for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(b.data<bf16>()[i].bits, to_bf16(t.data<float>()[i]).bits) << i;
}
}  // namespace moe
