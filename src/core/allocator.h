// The tensor allocator (docs/architecture.md §7). Small blocks (< kLargeBytes)
// come from the C library's aligned_alloc. Large blocks are the engine's own:
//  - mapped with mmap (so they never mix with another allocator's memory: a
//    tensor handed to torch through DLPack may be released on any thread, by
//    whatever allocator the interpreter runs, and still comes back here);
//  - rounded up to size classes (16 per power of two, >= 64 KiB steps), so
//    shapes that change a little map to the same few sizes;
//  - blocks of >= kHugeBytes are 2 MiB aligned and madvise(MADV_HUGEPAGE)d:
//    one fault per 2 MiB instead of per 4 KiB when THP is `madvise`;
//  - freed blocks stay in a cache and serve the next request of the same or a
//    somewhat smaller size (best fit, at most kMaxReuseRatio times the class);
//    a request no cached block holds grows the largest smaller one (at least
//    half its size) with mremap, keeping its pages, before mapping afresh;
//  - the cache is bounded: at most the cap (MOE_ALLOC_CACHE_MIB, default a
//    quarter of physical memory), and on a miss at most what keeps live + cached
//    within kFootprintSlack of the high-water mark of live bytes; the least
//    recently freed blocks are unmapped first. A miss when the machine's
//    available memory (MemAvailable) is short unmaps the whole cache first.
// MOE_ALLOC_CACHE_MIB is a whole number of MiB (anything else fails the first
// large allocation with an error naming it); 0 turns the large path off: every
// block comes from the C library's allocator (a preloaded tcmalloc or jemalloc
// then serves it).
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace moe::alloc {

inline constexpr size_t kLargeBytes = size_t(1) << 20;
inline constexpr size_t kHugeBytes = size_t(16) << 20;
inline constexpr size_t kHugePage = size_t(2) << 20;
inline constexpr double kMaxReuseRatio = 2.0;
inline constexpr double kFootprintSlack = 0.125;

// `bytes` is a multiple of `align` (<= 4096). Returns nullptr when out of memory.
void* acquire(size_t bytes, size_t align);
// `bytes` as passed to acquire.
void release(void* p, size_t bytes);

struct Stats {
  size_t cap_bytes = 0;     // bound on cached_bytes (0: the large path is off)
  size_t live_bytes = 0;    // mapped bytes of large blocks in use
  size_t live_peak = 0;     // high-water mark of live_bytes
  size_t cached_bytes = 0;  // mapped bytes of large blocks kept for reuse
  size_t cached_blocks = 0;
  uint64_t hits = 0;       // large requests served from the cache
  uint64_t grown = 0;      // large requests served by growing a smaller cached block (mremap)
  uint64_t misses = 0;     // large requests that mapped a fresh block
  uint64_t evictions = 0;  // cached blocks unmapped (cap, footprint, memory pressure, release_cached)
};
Stats stats();

// Unmaps every cached block; returns the bytes given back.
size_t release_cached();

// Tests: replaces the cap (bytes; 0 turns the large path off for blocks
// acquired from now on) and resets live_peak to live_bytes. Returns the old cap.
size_t set_cap_for_testing(size_t cap_bytes);

// The size class of a large request (exposed for the tests).
size_t size_class(size_t bytes);

}  // namespace moe::alloc
