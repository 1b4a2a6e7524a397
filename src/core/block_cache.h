// Large tensor blocks are reused instead of returned to the OS: a training or
// benchmark step allocates the same sizes every iteration, and fresh pages
// cost a page fault per 4 KiB on first touch (for a seed-mixtral step about
// 200k faults, a third of the step). Blocks >= kMinCachedBytes go to an
// exact-size free list, up to a cap (MOE_ALLOC_CACHE_MIB, default 8192).
//
// Thread safety: both functions may be called from any thread.
#pragma once

#include <cstddef>

namespace moe::block_cache {

inline constexpr size_t kMinCachedBytes = size_t(1) << 20;

// `bytes` is a multiple of `align`. Returns nullptr when out of memory.
void* acquire(size_t bytes, size_t align);
void release(void* p, size_t bytes);

}  // namespace moe::block_cache
