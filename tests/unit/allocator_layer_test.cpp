// The allocator under the layer (src/core/allocator.h): after a layer's
// weights, steps and gradients are gone, the live bytes are back to where they
// were, the cache holds only what its bounds allow, and giving the cache back
// returns the process's memory to the baseline.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "bench/cases.h"
#include "bench/real_use.h"
#include "core/allocator.h"
#include "moe/layer.h"

#include "testing/asan.h"

namespace moe {
namespace {

using bench::rss_mib;

// wi_0, wi_1, wo: E x 256 x 512 f32 = E / 2 MiB each (8 MiB at E = 16), plus their gradients; T
// changes every step.
void run_layer(const std::vector<int64_t>& tokens, const alloc::Stats& a0, int64_t E = 16) {
  bench::Case c = bench::find_case("tiny");
  c.T = 512, c.D = 256, c.F = 512, c.E = E, c.K = 4;
  Config cfg = bench::case_config(c, DType::f32);
  LayerWeights w = init_weights(cfg, 3);
  for (int64_t T : tokens) {
    c.T = T;
    bench::CaseInputs in = bench::case_inputs(c, 1);
    LayerOutputs out;
    auto fwd = layer_forward(cfg, w, in.x, nullptr, out);
    LayerGrads g = layer_backward(cfg, *fwd, in.dy);
    EXPECT_GT(alloc::stats().live_bytes, a0.live_bytes);
  }
}

TEST(AllocatorLayer, MemoryReturnsToTheBaselineAfterALayerIsDestroyed) {
  // Once, so that the compute pool's threads and the GEMM packers' per-thread scratch (which only
  // grows) exist before the baseline.
  run_layer({640}, alloc::stats());
  alloc::release_cached();
  const alloc::Stats a0 = alloc::stats();
  const TensorMemoryStats t0 = tensor_memory_stats();
  const double rss0 = rss_mib();
  run_layer({512, 384, 640, 448, 576}, a0);
  // The layer is gone; its blocks are cached, so RSS still holds them.
  const double rss_busy = rss_mib();
  const alloc::Stats a1 = alloc::stats();
  EXPECT_EQ(tensor_memory_stats().current_bytes, t0.current_bytes);
  EXPECT_EQ(a1.live_bytes, a0.live_bytes);
  EXPECT_GT(a1.hits, a0.hits) << "the steps reuse blocks";
  EXPECT_LE(a1.cached_bytes, a1.cap_bytes);
  EXPECT_GT(a1.cached_bytes, 0u);
  EXPECT_EQ(alloc::release_cached(), a1.cached_bytes);
  EXPECT_EQ(alloc::stats().cached_bytes, 0u);
  // The layer touched tens of MiB; with the cache given back, RSS is within a few MiB of the start.
  EXPECT_GT(rss_busy, rss0 + 24);
#ifdef MOE_TEST_ASAN
  // ASan keeps freed heap memory in its quarantine (the blocks under 1 MiB go to malloc), so RSS
  // does not come back there; the live and cached byte counts above are the check in that build.
  std::printf("RSS check not made under ASan (quarantine): start %.1f MiB, busy %.1f, now %.1f\n", rss0, rss_busy,
              rss_mib());
#else
  EXPECT_LT(rss_mib(), rss0 + 8) << "RSS at start " << rss0 << " MiB, busy " << rss_busy << " MiB";
#endif
}

// Changing T: once a step at the largest T has run, steps at other T (smaller,
// or as large again) are served from the cache's resident pages: no fresh
// pages beyond a small remainder, and the footprint stays within the bound.
TEST(AllocatorLayer, StepsUpToTheLargestTReuseResidentPages) {
  alloc::release_cached();
  run_layer({640}, alloc::stats());  // the largest T: its blocks are cached
  const alloc::Stats a0 = alloc::stats();
  run_layer({512, 384, 600, 448, 576, 400, 640, 480, 520, 416, 608, 392}, a0);
  const alloc::Stats a1 = alloc::stats();
  const uint64_t fresh = a1.fresh_bytes - a0.fresh_bytes;
  const uint64_t hits = a1.hits - a0.hits, others = a1.partial - a0.partial + a1.misses - a0.misses;
  std::printf("12 steps: %llu hits, %llu partial or missed, %.1f MiB fresh, %.1f MiB cached, live peak %.1f MiB\n",
              (unsigned long long)hits, (unsigned long long)others, double(fresh) / (1 << 20),
              double(a1.cached_bytes) / (1 << 20), double(a1.live_peak) / (1 << 20));
  EXPECT_GT(hits, 20 * others);
  EXPECT_LE(fresh, a1.live_peak / 8) << "pages faulted in again instead of reused";
  EXPECT_EQ(a1.live_bytes, a0.live_bytes);
  EXPECT_LE(a1.live_bytes + a1.cached_bytes,
            a1.live_peak + size_t(double(a1.live_peak) * alloc::kFootprintSlack));
}

// T drawn from 384..640 (the 1536..2560 at a quarter) for more steps than the footprint
// bound's window holds (about 14 large requests a step): the window's peak keeps up with the
// largest T, so the steps stay hits with no fresh pages beyond a small remainder.
TEST(AllocatorLayer, ChangingTOverSeveralWindowsStaysHits) {
#ifdef MOE_TEST_ASAN
  // Hundreds of layer steps take minutes there (150 s and 209 s measured); the window under ASan is
  // checked at the allocator's level (Allocator.TheFootprintBoundFollowsTheRecentPeak).
  GTEST_SKIP() << "spans two windows of layer steps: too slow under ASan";
#endif
  alloc::release_cached();
  run_layer({640}, alloc::stats());
  const alloc::Stats a0 = alloc::stats();
  std::mt19937 rng(16);
  std::vector<int64_t> tokens;
  for (int i = 0; i < 180; ++i) tokens.push_back(384 + int64_t(rng() % 257));
  run_layer(tokens, a0);
  const alloc::Stats a1 = alloc::stats();
  const uint64_t fresh = a1.fresh_bytes - a0.fresh_bytes;
  const uint64_t hits = a1.hits - a0.hits, others = a1.partial - a0.partial + a1.misses - a0.misses;
  std::printf(
      "180 steps: %llu requests (window %zu), %llu partial or missed, %.1f MiB fresh, "
      "%.1f MiB evicted, window peak %.1f MiB\n",
      (unsigned long long)(hits + others), (alloc::kWindowEpochs + 1) * alloc::kEpochRequests,
      (unsigned long long)others, double(fresh) / (1 << 20),
      double(a1.evicted_bytes - a0.evicted_bytes) / (1 << 20), double(a1.window_peak) / (1 << 20));
  EXPECT_GT(hits + others, 2 * (alloc::kWindowEpochs + 1) * alloc::kEpochRequests)
      << "the run spans two windows";
  EXPECT_GT(hits, 20 * others);
  EXPECT_LE(fresh, a1.live_peak / 8) << "pages faulted in again instead of reused";
  EXPECT_EQ(a1.live_bytes, a0.live_bytes);
}

// A large layer (E = 64: 96 MiB of weights, as much of gradients), then many steps of a small one
// (E = 16): once the large steps have left the footprint bound's window, live + cached fall within
// the bound of the small layer run alone, and so does RSS.
TEST(AllocatorLayer, ASmallLayerAfterALargeOneGivesTheLargePagesBack) {
#ifdef MOE_TEST_ASAN
  // Hundreds of layer steps take minutes there (150 s and 209 s measured); the window under ASan is
  // checked at the allocator's level (Allocator.TheFootprintBoundFollowsTheRecentPeak).
  GTEST_SKIP() << "spans two windows of layer steps: too slow under ASan";
#endif
  const std::vector<int64_t> small_steps = {512, 448, 576, 512};
  run_layer({512}, alloc::stats());  // the compute pool and scratch exist before the baselines
  // The small layer alone: its live peak, and RSS with its cache.
  alloc::release_cached();
  alloc::set_cap_for_testing(alloc::stats().cap_bytes);  // restarts the live peak and the window
  const double rss0 = rss_mib();
  const alloc::Stats a0 = alloc::stats();
  run_layer(small_steps, a0);
  const size_t small_peak = alloc::stats().window_peak;
  const double small_busy = rss_mib() - rss0;
  // The large layer, then the small one for enough steps to span the window twice.
  run_layer({512, 640}, a0, 64);
  const alloc::Stats a1 = alloc::stats();
  const double rss_large = rss_mib();
  ASSERT_GT(a1.window_peak, 2 * small_peak);
  std::vector<int64_t> many;
  while (many.size() < 2 * (alloc::kWindowEpochs + 1) * alloc::kEpochRequests / 10) many.push_back(512);
  run_layer(many, a0);
  const alloc::Stats a2 = alloc::stats();
  const size_t small_bound = small_peak + size_t(double(small_peak) * alloc::kFootprintSlack);
  std::printf("small peak %.1f MiB (RSS +%.1f), large peak %.1f MiB (RSS %.1f); after %zu small steps: "
              "window peak %.1f MiB, live + cached %.1f MiB, RSS %.1f MiB (start %.1f)\n",
              double(small_peak) / (1 << 20), small_busy, double(a1.window_peak) / (1 << 20), rss_large,
              many.size(), double(a2.window_peak) / (1 << 20),
              double(a2.live_bytes + a2.cached_bytes) / (1 << 20), rss_mib(), rss0);
  EXPECT_GT(a2.hits + a2.partial + a2.misses - a1.hits - a1.partial - a1.misses,
            2 * (alloc::kWindowEpochs + 1) * alloc::kEpochRequests) << "the small steps span two windows";
  EXPECT_EQ(a2.live_bytes, a0.live_bytes);
  EXPECT_LE(a2.window_peak, small_peak);
  EXPECT_LE(a2.live_bytes + a2.cached_bytes, small_bound);
  EXPECT_GT(a2.evicted_bytes - a1.evicted_bytes, a1.window_peak / 2);
  // RSS: the small layer's cache (at most its bound) and a few MiB of small blocks above the start;
  // the large layer held hundreds of MiB more.
  EXPECT_LT(rss_mib(), rss0 + double(small_bound) / (1 << 20) + 16)
      << "RSS at start " << rss0 << " MiB, with the large layer " << rss_large << " MiB";
}

}  // namespace
}  // namespace moe
