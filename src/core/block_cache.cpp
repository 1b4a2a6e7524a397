#include "core/block_cache.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace moe::block_cache {
namespace {

struct Cache {
  std::mutex mu;
  std::multimap<size_t, void*> free_blocks;  // GUARDED_BY(mu)
  size_t cached_bytes = 0;                   // GUARDED_BY(mu)
  size_t cap_bytes = [] {
    const char* s = std::getenv("MOE_ALLOC_CACHE_MIB");
    return size_t(s ? std::strtoull(s, nullptr, 10) : 8192) << 20;
  }();
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: blocks may be released during static destruction
  return *c;
}

}  // namespace

void* acquire(size_t bytes, size_t align) {
  if (bytes >= kMinCachedBytes) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lk(c.mu);
    auto it = c.free_blocks.find(bytes);
    if (it != c.free_blocks.end()) {
      void* p = it->second;
      c.free_blocks.erase(it);
      c.cached_bytes -= bytes;
      return p;
    }
  }
  return std::aligned_alloc(align, bytes);
}

void release(void* p, size_t bytes) {
  if (bytes >= kMinCachedBytes) {
    Cache& c = cache();
    std::lock_guard<std::mutex> lk(c.mu);
    if (c.cached_bytes + bytes <= c.cap_bytes) {
      c.free_blocks.emplace(bytes, p);
      c.cached_bytes += bytes;
      return;
    }
  }
  std::free(p);
}

}  // namespace moe::block_cache
