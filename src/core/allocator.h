// The tensor allocator (docs/architecture.md §7). Small blocks (< kLargeBytes,
// 64 KiB) come from the C library's aligned_alloc. Large blocks are the engine's
// own (from 64 KiB: glibc serves blocks of 128 KiB and more with a mapping of
// their own and trims its heaps' free tops, so a step's mid-size tensors faulted
// their pages in again every step):
//  - carved out of one arena: a range of address space reserved once with mmap
//    (MAP_NORESERVE, so only the pages touched count), 2 MiB aligned and
//    madvise(MADV_HUGEPAGE)d. The arena never mixes with another allocator's
//    memory: a tensor handed to torch through DLPack may be released on any
//    thread, by whatever allocator the interpreter runs, and still comes back;
//  - rounded up to size classes (16 per power of two: 4 KiB steps at 64 KiB,
//    64 KiB steps from 1 MiB), so shapes that change a little map to the same
//    few sizes; blocks of >= kHugeBytes start on a 2 MiB boundary (one fault
//    per huge page);
//  - a request is carved out of a free span (block splitting) and a released
//    block merges with its free neighbours (coalescing), so a step whose T grew
//    takes the previous step's pages, and a smaller T takes part of them;
//  - freed pages stay resident (the cache). The placement chosen for a request
//    is the one that covers the most resident free bytes (then the tightest
//    fit), so pages that are already faulted in are used before fresh ones;
//  - the cache is bounded: at most the cap (MOE_ALLOC_CACHE_MIB, default a
//    quarter of physical memory), and at most what keeps live + cached within
//    kFootprintSlack of the recent high-water mark of live bytes: the highest
//    live bytes over the last kWindowEpochs closed epochs of kEpochRequests
//    large requests each and the current one. The bound is applied whenever a
//    request needs fresh pages and whenever an epoch closes (the window's peak
//    can only fall then), so a process that moves to smaller shapes gives the
//    larger ones' pages back within a window of requests. Resident free pages
//    are given back with madvise(DONTNEED), from the top of the arena down
//    (placement looks low first, so the arena stays compact at its bottom);
//    their address range stays reserved. A request that needs fresh pages
//    when the machine's available memory (MemAvailable) is short gives the
//    whole cache back first.
//  - Where the arena cannot be reserved or is full, a block is its own mapping,
//    unmapped when released (not cached).
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

inline constexpr size_t kLargeBytes = size_t(64) << 10;
inline constexpr size_t kHugeBytes = size_t(16) << 20;
inline constexpr size_t kHugePage = size_t(2) << 20;
inline constexpr double kFootprintSlack = 0.25;
// The footprint bound's window: kWindowEpochs epochs of kEpochRequests large
// requests (docs/architecture.md §7 for why these sizes).
inline constexpr size_t kEpochRequests = 64;
inline constexpr size_t kWindowEpochs = 16;

// `bytes` is a multiple of `align` (<= 4096). Returns nullptr when out of memory.
void* acquire(size_t bytes, size_t align);
// `bytes` as passed to acquire.
void release(void* p, size_t bytes);

struct Stats {
  size_t cap_bytes = 0;      // bound on cached_bytes (0: the large path is off)
  size_t arena_bytes = 0;    // address space reserved for large blocks (0: none)
  size_t live_bytes = 0;     // bytes of large blocks in use (their size classes)
  size_t live_peak = 0;      // high-water mark of live_bytes (the process's, or since set_cap_for_testing)
  size_t window_peak = 0;    // ... over the footprint bound's window of recent requests
  size_t cached_bytes = 0;   // resident bytes of free arena spans, kept for reuse
  size_t cached_blocks = 0;  // resident free extents (after coalescing)
  uint64_t hits = 0;         // large requests served wholly from resident free pages
  uint64_t partial = 0;      // ... partly from resident pages, partly from fresh ones
  uint64_t misses = 0;       // ... wholly from fresh pages (or a mapping of their own)
  uint64_t evictions = 0;    // madvise(DONTNEED) calls giving cached pages back
  uint64_t fresh_bytes = 0;  // bytes handed out that were not resident (faulted in on first touch)
  uint64_t evicted_bytes = 0;  // bytes given back by those calls
  uint64_t own_mappings = 0;   // blocks mapped on their own (no arena, or the arena full)
};
Stats stats();

// Gives every cached page back; returns the bytes given back.
size_t release_cached();

// Tests: replaces the cap (bytes; 0 turns the large path off for blocks
// acquired from now on) and resets live_peak and the window to live_bytes.
// Returns the old cap.
size_t set_cap_for_testing(size_t cap_bytes);

// Test hook: replaces the probe of the machine's available memory that the
// pressure path reads (by default MemAvailable from /proc/meminfo, in bytes;
// SIZE_MAX where unknown). nullptr restores the default. Returns the previous
// probe (nullptr for the default). The probe is called with the allocator's
// lock held: it must not allocate through this allocator.
using AvailableProbe = size_t (*)();
AvailableProbe set_available_probe_for_testing(AvailableProbe probe);

// The size class of a large request (exposed for the tests).
size_t size_class(size_t bytes);

}  // namespace moe::alloc
