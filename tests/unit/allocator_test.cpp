// The tensor allocator (src/core/allocator.h): size classes, reuse, the cache's
// bounds under shapes that keep changing, huge-page alignment, the C library
// path, and concurrent use. Also built into the ThreadSanitizer run
// (scripts/tsan.sh) and, like every test, the ASan build (scripts/sanitize.sh),
// where a cached block must be poisoned.
#include "core/allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "moe/tensor.h"

#include "testing/asan.h"
#ifdef MOE_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace moe {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

// Sets a cap for one test and empties the cache before and after, so the
// process-wide pool's other users (earlier tests) do not count.
class CapScope {
 public:
  explicit CapScope(size_t cap) {
    alloc::release_cached();
    old_ = alloc::set_cap_for_testing(cap);
  }
  ~CapScope() {
    alloc::set_cap_for_testing(old_);
    alloc::release_cached();
  }

 private:
  size_t old_;
};

TEST(Allocator, SizeClassesRoundUpByAtMostASixteenth) {
  size_t prev = 0;
  for (size_t n = alloc::kLargeBytes; n < 64 * kMiB; n += 4096 * 37) {
    size_t c = alloc::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(double(c), double(n) * (1.0 + 1.0 / 16)) << n;
    EXPECT_GE(c, prev) << "classes must grow with the request";
    prev = c;
  }
  // A token count that drifts between 1536 and 2560 rows of 2048 bf16 lands on a handful of classes.
  std::vector<size_t> classes;
  for (size_t T = 1536; T <= 2560; ++T) {
    size_t c = alloc::size_class(T * 2048 * 2);
    if (classes.empty() || classes.back() != c) classes.push_back(c);
  }
  EXPECT_LE(classes.size(), 14u);             // 0.74 of a power of two at 16 classes per power
  EXPECT_EQ(alloc::size_class(1000), 1000u);  // small requests are not large-path classes
}

// The bytes a request takes (its class, with the allocator's ASan redzone; whole huge pages from
// kHugeBytes on).
size_t block_bytes(size_t n) {
#ifdef MOE_TEST_ASAN
  n += 4096;
#endif
  const size_t c = alloc::size_class(n);
  return c >= alloc::kHugeBytes ? (c + alloc::kHugePage - 1) / alloc::kHugePage * alloc::kHugePage : c;
}

TEST(Allocator, AFreedBlockServesTheNextRequestOfItsClassOrIsSplit) {
  CapScope cap(256 * kMiB);
  const alloc::Stats s0 = alloc::stats();
  auto* a = static_cast<char*>(alloc::acquire(3 * kMiB, 64));
  ASSERT_NE(a, nullptr);
  std::memset(a, 1, 3 * kMiB);
  EXPECT_EQ(alloc::stats().live_bytes, s0.live_bytes + block_bytes(3 * kMiB));
  alloc::release(a, 3 * kMiB);
  EXPECT_EQ(alloc::stats().cached_blocks, s0.cached_blocks + 1);
  void* b = alloc::acquire(3 * kMiB - 4096, 64);  // same class
  EXPECT_EQ(b, a);
  alloc::release(b, 3 * kMiB - 4096);
  // Smaller requests are carved out of the cached block, one after the other.
  void* c = alloc::acquire(kMiB, 64);
  void* d = alloc::acquire(kMiB, 64);
  EXPECT_EQ(c, a);
  EXPECT_EQ(d, a + block_bytes(kMiB));
  alloc::release(c, kMiB);
  alloc::release(d, kMiB);
  // Released, the pieces merge again: the whole block serves its class.
  EXPECT_EQ(alloc::stats().cached_blocks, s0.cached_blocks + 1);
  void* e = alloc::acquire(3 * kMiB, 64);
  EXPECT_EQ(e, a);
  alloc::release(e, 3 * kMiB);
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.misses - s0.misses, 1u);
  EXPECT_EQ(s1.hits - s0.hits, 4u);
  EXPECT_EQ(s1.live_bytes, s0.live_bytes);
}

// Tensors of 64 KiB to 1 MiB (a small T per rank, token chunks) are the engine's too: a step's
// mid-size tensors, freed and asked for again, take the same resident pages (glibc gave such blocks
// mappings of their own, or trimmed them off its heap, and they faulted in again every step).
TEST(Allocator, MidSizeTensorsReuseTheirPagesStepAfterStep) {
  CapScope cap(256 * kMiB);
  const std::vector<int64_t> rows = {128, 200, 512, 64, 333};  // bf16 rows of 1024: 128 KiB to 1 MiB
  auto step = [&] {
    std::vector<Tensor> live;
    for (int64_t r : rows) {
      live.push_back(Tensor::empty(DType::bf16, {r, 1024}));
      std::memset(live.back().raw(), 1, live.back().nbytes());
    }
  };
  step();  // the first step's blocks are fresh
  const alloc::Stats s0 = alloc::stats();
  for (int i = 0; i < 20; ++i) step();
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.hits - s0.hits, 20 * rows.size()) << "every mid-size request of a later step is a hit";
  EXPECT_EQ(s1.misses - s0.misses, 0u);
  EXPECT_EQ(s1.partial - s0.partial, 0u);
  EXPECT_EQ(s1.fresh_bytes - s0.fresh_bytes, 0u) << "no page faulted in again";
  EXPECT_EQ(alloc::size_class(64 << 10), size_t(64) << 10);  // the smallest class is the block itself
  EXPECT_EQ(alloc::size_class((64 << 10) + 1), size_t(68) << 10);  // then 4 KiB steps
  EXPECT_EQ(alloc::size_class((64 << 10) - 1), (size_t(64) << 10) - 1);  // below: the C library's
}

TEST(Allocator, ARequestNoCachedBlockHoldsGrowsOneInPlace) {
  CapScope cap(256 * kMiB);
  const alloc::Stats s0 = alloc::stats();
  auto* a = static_cast<unsigned char*>(alloc::acquire(4 * kMiB, 64));
  ASSERT_NE(a, nullptr);
  std::memset(a, 9, 4 * kMiB);
  alloc::release(a, 4 * kMiB);
  // The free space after the cached block joins it: its pages are used, only the rest is fresh.
  auto* b = static_cast<unsigned char*>(alloc::acquire(6 * kMiB, 64));
  ASSERT_EQ(b, a);
  EXPECT_EQ(b[0], 9);  // the resident pages come along, untouched
  EXPECT_EQ(b[4 * kMiB - 1], 9);
  std::memset(b, 1, 6 * kMiB);
  alloc::release(b, 6 * kMiB);
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.partial - s0.partial, 1u);
  EXPECT_EQ(s1.misses - s0.misses, 1u);
  EXPECT_LE(s1.fresh_bytes - s0.fresh_bytes, 6 * kMiB + kMiB) << "4 MiB fresh, then only the 2 MiB added";
  EXPECT_EQ(s1.live_bytes, s0.live_bytes);
}

// Giving the cache back drops the pages but keeps the address range: the same
// request lands at the same place again, on fresh pages.
TEST(Allocator, GivingTheCacheBackKeepsTheArenaAndItsPlaces) {
  CapScope cap(256 * kMiB);
  auto* a = static_cast<unsigned char*>(alloc::acquire(8 * kMiB, 64));
  ASSERT_NE(a, nullptr);
  ASSERT_GT(alloc::stats().arena_bytes, 0u);  // reserved by the first large request
  std::memset(a, 5, 8 * kMiB);
  alloc::release(a, 8 * kMiB);
  const alloc::Stats s0 = alloc::stats();
  EXPECT_GE(s0.cached_bytes, 8 * kMiB);
  EXPECT_EQ(alloc::release_cached(), s0.cached_bytes);
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.cached_bytes, 0u);
  EXPECT_EQ(s1.cached_blocks, 0u);
  EXPECT_GT(s1.evictions, s0.evictions);
  auto* b = static_cast<unsigned char*>(alloc::acquire(8 * kMiB, 64));
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc::stats().misses, s1.misses + 1);  // nothing resident: fresh pages
  EXPECT_EQ(b[0], 0);  // given back: the kernel's zero pages, not the old bytes
  alloc::release(b, 8 * kMiB);
}

TEST(Allocator, LargeBlocksAreHugePageAligned) {
  CapScope cap(256 * kMiB);
  void* p = alloc::acquire(alloc::kHugeBytes + 64, 64);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alloc::kHugePage, 0u);
  std::memset(p, 7, alloc::kHugeBytes + 64);
  alloc::release(p, alloc::kHugeBytes + 64);
}

// A long run of drifting shapes: the cache stays within its cap, the footprint
// within the slack of the live high-water mark, most requests are hits, and the
// pages faulted in stay bounded (blocks are reused, not remapped).
TEST(Allocator, ChangingShapesStayWithinTheBoundAndReuseBlocks) {
  const size_t cap = 96 * kMiB;  // a step's 5 blocks are 35-60 MiB
  CapScope scope(cap);
  const alloc::Stats s0 = alloc::stats();
  std::mt19937_64 rng(5);
  size_t max_footprint = 0;
  for (int step = 0; step < 400; ++step) {
    // A "step": T in [1536, 2560], five tensors whose sizes scale with T, some kept across the step.
    const size_t T = 1536 + rng() % 1025;
    const size_t sizes[5] = {T * 1024 * 2, T * 512 * 4, T * 2048 * 2, T * 1024 * 4, T * 8 * 512 * 2};
    std::vector<std::pair<void*, size_t>> live;
    for (size_t n : sizes) {
      void* p = alloc::acquire(n, 64);
      ASSERT_NE(p, nullptr);
      static_cast<char*>(p)[0] = 1, static_cast<char*>(p)[n - 1] = 2;
      live.emplace_back(p, n);
      const alloc::Stats s = alloc::stats();
      ASSERT_LE(s.cached_bytes, cap);
      max_footprint = std::max(max_footprint, s.live_bytes + s.cached_bytes);
      if (live.size() == 3) {  // a temporary freed mid-step
        alloc::release(live[1].first, live[1].second);
        live.erase(live.begin() + 1);
      }
    }
    for (auto& [p, n] : live) alloc::release(p, n);
    ASSERT_LE(alloc::stats().cached_bytes, cap);
  }
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.live_bytes, s0.live_bytes);
  const uint64_t hits = s1.hits - s0.hits, partial = s1.partial - s0.partial, misses = s1.misses - s0.misses;
  EXPECT_EQ(hits + partial + misses, 400u * 5);
  EXPECT_GT(hits, 9 * (partial + misses)) << "hits " << hits << " partial " << partial << " misses " << misses;
  // Pages are reused, not faulted in again step after step: all the fresh bytes of 400 steps are
  // a few times one step's worth.
  EXPECT_LE(s1.fresh_bytes - s0.fresh_bytes, 4 * s1.live_peak) << "fresh " << (s1.fresh_bytes - s0.fresh_bytes) << " evicted " << (s1.evicted_bytes - s0.evicted_bytes) << " in " << (s1.evictions - s0.evictions) << " partial " << partial << " misses " << misses << " max footprint " << max_footprint;
  // The footprint (live + cached) stays within the slack of the live high-water mark.
  EXPECT_LE(max_footprint, s1.live_peak + size_t(double(s1.live_peak) * alloc::kFootprintSlack));
}

// One "step" of `n` blocks of `bytes`, all live at once, then released.
void step_of(int n, size_t bytes) {
  std::vector<void*> blocks;
  for (int i = 0; i < n; ++i) {
    blocks.push_back(alloc::acquire(bytes, 64));
    ASSERT_NE(blocks.back(), nullptr);
    static_cast<char*>(blocks.back())[bytes - 1] = 1;
  }
  for (void* p : blocks) alloc::release(p, bytes);
}

// The footprint bound follows the live peak of a recent window of requests:
// after a large phase, a small phase keeps the large pages while the large
// phase is in the window (a large step that comes back is all hits), and
// gives them back once it has left the window (live + cached within the bound
// of the small phase alone); a large step afterwards still works, on fresh
// pages.
TEST(Allocator, TheFootprintBoundFollowsTheRecentPeak) {
  CapScope scope(1024 * kMiB);
  const size_t large = 32 * kMiB, small = 2 * kMiB;
  constexpr int kLargeN = 5, kSmallN = 4;
  const size_t window = (alloc::kWindowEpochs + 1) * alloc::kEpochRequests;  // requests, at most
  for (int i = 0; i < 3; ++i) step_of(kLargeN, large);
  const alloc::Stats s0 = alloc::stats();
  const size_t large_peak = kLargeN * block_bytes(large), small_peak = kSmallN * block_bytes(small);
  ASSERT_EQ(s0.window_peak, large_peak);
  ASSERT_GE(s0.cached_bytes, large_peak);
  // Small steps for less than half a window, then the large step again: it is still cached.
  const int within = int(window / 2 / kSmallN);
  for (int i = 0; i < within; ++i) step_of(kSmallN, small);
  EXPECT_GE(alloc::stats().cached_bytes, large_peak);
  step_of(kLargeN, large);
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.hits - s0.hits, uint64_t(within * kSmallN + kLargeN));
  EXPECT_EQ(s1.fresh_bytes, s0.fresh_bytes);
  EXPECT_EQ(s1.evictions, s0.evictions);
  // Two windows of small steps: the large pages are given back (at the latest a window and an epoch
  // after the large step; the footprint is checked in the last half window).
  const int beyond = int(2 * window / kSmallN);
  size_t max_footprint_late = 0;
  for (int i = 0; i < beyond; ++i) {
    step_of(kSmallN, small);
    const alloc::Stats s = alloc::stats();
    if (i >= beyond * 3 / 4) max_footprint_late = std::max(max_footprint_late, s.live_bytes + s.cached_bytes);
  }
  const alloc::Stats s2 = alloc::stats();
  const size_t small_bound = small_peak + size_t(double(small_peak) * alloc::kFootprintSlack);
  EXPECT_EQ(s2.window_peak, small_peak);
  EXPECT_EQ(s2.live_peak, large_peak) << "the all-time peak is kept for the reports";
  EXPECT_LE(s2.live_bytes + s2.cached_bytes, small_bound);
  EXPECT_LE(max_footprint_late, small_bound);
  EXPECT_GT(s2.cached_bytes, 0u) << "the small phase's own pages stay";
  EXPECT_GE(s2.evicted_bytes - s1.evicted_bytes, large_peak - small_bound);
  // The small phase ran on resident pages throughout: its steps are hits.
  EXPECT_EQ(s2.hits - s1.hits, uint64_t(beyond * kSmallN));
  EXPECT_EQ(s2.fresh_bytes, s1.fresh_bytes);
  // The large shapes come back: fresh pages, and a new window peak.
  step_of(kLargeN, large);
  const alloc::Stats s3 = alloc::stats();
  EXPECT_GT(s3.fresh_bytes, s2.fresh_bytes);
  EXPECT_EQ(s3.window_peak, large_peak);
}

// The pressure path reads the machine's available memory through this probe
// (alloc::set_available_probe_for_testing) while a test runs.
std::atomic<size_t> fake_available_bytes{SIZE_MAX};
std::atomic<int> fake_probes{0};
size_t fake_available() {
  ++fake_probes;
  return fake_available_bytes.load();
}

class AvailableScope {
 public:
  AvailableScope() { old_ = alloc::set_available_probe_for_testing(fake_available); }
  ~AvailableScope() { alloc::set_available_probe_for_testing(old_); }

 private:
  alloc::AvailableProbe old_;
};

// A request that needs fresh pages while MemAvailable is short gives the whole
// cache back first (its own resident pages are used, not given back); with
// memory to spare the same kind of request keeps the cache. Allocation goes on
// working afterwards, on fresh (zeroed) pages.
TEST(Allocator, ShortAvailableMemoryGivesTheCacheBack) {
  CapScope scope(512 * kMiB);
  AvailableScope probe;
  fake_available_bytes = size_t(1) << 50;  // plenty
  // A live peak of 128 MiB, its pages given back: the footprint bound leaves room for the cache below.
  void* big = alloc::acquire(128 * kMiB, 64);
  ASSERT_NE(big, nullptr);
  std::memset(big, 1, 128 * kMiB);
  alloc::release(big, 128 * kMiB);
  alloc::release_cached();
  // a, b, c side by side; a and c released: two resident extents, b live between them.
  auto* a = static_cast<unsigned char*>(alloc::acquire(16 * kMiB, 64));
  auto* b = static_cast<unsigned char*>(alloc::acquire(16 * kMiB, 64));
  auto* c = static_cast<unsigned char*>(alloc::acquire(16 * kMiB, 64));
  ASSERT_TRUE(a && b && c);
  ASSERT_LT(a, b);
  ASSERT_LT(b, c);
  for (unsigned char* p : {a, b, c}) std::memset(p, 7, 16 * kMiB);
  alloc::release(a, 16 * kMiB);
  alloc::release(c, 16 * kMiB);
  ASSERT_EQ(alloc::stats().cached_bytes, 2 * block_bytes(16 * kMiB));
  // Memory to spare: 40 MiB take c's pages and 24 fresh ones; a's stay cached.
  const alloc::Stats s0 = alloc::stats();
  fake_probes = 0;
  void* d = alloc::acquire(40 * kMiB, 64);
  ASSERT_EQ(d, c);
  const alloc::Stats s1 = alloc::stats();
  EXPECT_GT(fake_probes.load(), 0) << "a request with fresh pages must look at the available memory";
  EXPECT_EQ(s1.partial - s0.partial, 1u);
  EXPECT_EQ(s1.cached_bytes, block_bytes(16 * kMiB));
  EXPECT_EQ(s1.evictions, s0.evictions);
  std::memset(d, 2, 40 * kMiB);
  alloc::release(d, 40 * kMiB);
  // Memory short: 64 MiB take d's resident pages and fresh ones, and the rest of the cache (a's) goes.
  fake_available_bytes = 0;
  auto* e = static_cast<unsigned char*>(alloc::acquire(64 * kMiB, 64));
  ASSERT_EQ(e, c);
  const alloc::Stats s2 = alloc::stats();
  EXPECT_EQ(s2.cached_bytes, 0u);
  EXPECT_EQ(s2.cached_blocks, 0u);
  EXPECT_GT(s2.evictions, s1.evictions);
  EXPECT_EQ(s2.evicted_bytes - s1.evicted_bytes, block_bytes(16 * kMiB));
  EXPECT_EQ(e[0], 2) << "the request's own resident pages are used, not given back";
  std::memset(e, 3, 64 * kMiB);
  EXPECT_EQ(e[64 * kMiB - 1], 3);
  // Still short, nothing cached: the next request takes a's place on fresh pages and works.
  auto* f = static_cast<unsigned char*>(alloc::acquire(16 * kMiB, 64));
  ASSERT_EQ(f, a);
  EXPECT_EQ(f[0], 0) << "given back: the kernel's zero pages, not the old bytes";
  std::memset(f, 4, 16 * kMiB);
  EXPECT_EQ(f[16 * kMiB - 1], 4);
  EXPECT_EQ(b[0], 7);  // the live block between them is untouched
  EXPECT_EQ(alloc::stats().misses, s2.misses + 1);
  alloc::release(f, 16 * kMiB);
  alloc::release(e, 64 * kMiB);
  alloc::release(b, 16 * kMiB);
  fake_available_bytes = SIZE_MAX;
}

TEST(Allocator, TheCacheNeverHoldsMoreThanItsCap) {
  const size_t cap = 8 * kMiB;
  CapScope scope(cap);
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(alloc::acquire(3 * kMiB, 64));
  for (void* p : blocks) alloc::release(p, 3 * kMiB);
  EXPECT_LE(alloc::stats().cached_bytes, cap);
  EXPECT_GT(alloc::stats().cached_bytes, 0u);  // what the cap allows stays (cut on 2 MiB)
  void* big = alloc::acquire(16 * kMiB, 64);    // bigger than the cap: given back at once
  alloc::release(big, 16 * kMiB);
  const size_t cached = alloc::stats().cached_bytes;
  EXPECT_LE(cached, cap);
  EXPECT_EQ(alloc::release_cached(), cached);
  EXPECT_EQ(alloc::stats().cached_bytes, 0u);
}

// MOE_ALLOC_CACHE_MIB=0: every block is the C library's; a block acquired
// before the switch still returns to the pool it came from.
TEST(Allocator, CapZeroUsesTheCLibraryAndEarlierBlocksStillReturnHome) {
  size_t old = alloc::set_cap_for_testing(64 * kMiB);
  const size_t live_before = alloc::stats().live_bytes;
  void* ours = alloc::acquire(2 * kMiB, 64);
  const alloc::Stats s0 = alloc::stats();
  alloc::set_cap_for_testing(0);
  void* theirs = alloc::acquire(2 * kMiB, 64);
  ASSERT_NE(theirs, nullptr);
  EXPECT_EQ(alloc::stats().live_bytes, s0.live_bytes);  // not counted as ours
  std::memset(theirs, 3, 2 * kMiB);
  alloc::release(theirs, 2 * kMiB);
  alloc::release(ours, 2 * kMiB);
  EXPECT_EQ(alloc::stats().live_bytes, live_before);
  alloc::set_cap_for_testing(old);
  alloc::release_cached();
}

TEST(Allocator, TensorAccountingIsUnchanged) {
  const TensorMemoryStats before = tensor_memory_stats();
  {
    Tensor t = Tensor::empty(DType::f32, {1024, 1024});  // 4 MiB: the large path
    Tensor u = Tensor::empty(DType::f32, {10});          // small path
    EXPECT_EQ(tensor_memory_stats().current_bytes, before.current_bytes + 4 * int64_t(kMiB) + 64);
  }
  EXPECT_EQ(tensor_memory_stats().current_bytes, before.current_bytes);
}

#ifdef MOE_TEST_ASAN
TEST(Allocator, CachedBlocksArePoisonedUnderAsan) {
  CapScope cap(64 * kMiB);
  char* p = static_cast<char*>(alloc::acquire(2 * kMiB, 64));
  EXPECT_FALSE(__asan_address_is_poisoned(p + 100));
  EXPECT_FALSE(__asan_address_is_poisoned(p + 2 * kMiB - 1));
  EXPECT_TRUE(__asan_address_is_poisoned(p + 2 * kMiB)) << "an overrun past the block must be reported";
  alloc::release(p, 2 * kMiB);
  EXPECT_TRUE(__asan_address_is_poisoned(p + 100));
  char* q = static_cast<char*>(alloc::acquire(2 * kMiB, 64));
  ASSERT_EQ(q, p);
  EXPECT_FALSE(__asan_address_is_poisoned(q + 100));
  alloc::release(q, 2 * kMiB);
}
#endif

// Several threads acquire, fill, check and release blocks, and hand some to
// another thread to release (as a tensor released by torch on any thread).
TEST(Allocator, ConcurrentThreadsAcquireAndReleaseSafely) {
  CapScope cap(64 * kMiB);
  const alloc::Stats s0 = alloc::stats();
  constexpr int kThreads = 4, kIters = 300;
  std::mutex mu;
  std::deque<std::pair<void*, size_t>> handoff;
  std::atomic<int> bad{0};
  auto worker = [&](int id) {
    std::mt19937 rng(id);
    for (int i = 0; i < kIters; ++i) {
      const size_t n = kMiB + (rng() % 8) * 256 * 1024 + (rng() % 2 ? 0 : 4096);
      auto* p = static_cast<unsigned char*>(alloc::acquire(n, 64));
      if (!p) {
        ++bad;
        continue;
      }
      std::memset(p, id + 1, 4096);
      p[n - 1] = static_cast<unsigned char>(id + 1);
      std::this_thread::yield();
      if (p[0] != id + 1 || p[4095] != id + 1 || p[n - 1] != id + 1) ++bad;
      std::pair<void*, size_t> other{nullptr, 0};
      {
        std::lock_guard<std::mutex> lk(mu);
        handoff.emplace_back(p, n);
        if (handoff.size() > 3) other = handoff.front(), handoff.pop_front();
      }
      if (other.first) alloc::release(other.first, other.second);
      (void)alloc::stats();
    }
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  for (auto& [p, n] : handoff) alloc::release(p, n);
  EXPECT_EQ(bad.load(), 0);
  const alloc::Stats s1 = alloc::stats();
  EXPECT_EQ(s1.live_bytes, s0.live_bytes);
  EXPECT_LE(s1.cached_bytes, 64 * kMiB);
  EXPECT_EQ(s1.hits + s1.partial + s1.misses - s0.hits - s0.partial - s0.misses, uint64_t(kThreads) * kIters);
}

}  // namespace
}  // namespace moe
