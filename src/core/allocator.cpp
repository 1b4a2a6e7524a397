#include "core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>

#include "moe/error.h"

#if defined(__SANITIZE_ADDRESS__)
#define MOE_ALLOC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_ALLOC_ASAN 1
#endif
#endif
#ifdef MOE_ALLOC_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace moe::alloc {
namespace {

// Under ASan a cached block is poisoned: a tensor used after its release faults
// there as it would in freed heap memory.
void poison(void* p, size_t n) {
#ifdef MOE_ALLOC_ASAN
  ASAN_POISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}
void unpoison(void* p, size_t n) {
#ifdef MOE_ALLOC_ASAN
  ASAN_UNPOISON_MEMORY_REGION(p, n);
#else
  (void)p, (void)n;
#endif
}

// Under ASan every large block gets at least this much poisoned tail, so an
// overrun past a tensor's end is reported as it would be on the heap.
#ifdef MOE_ALLOC_ASAN
constexpr size_t kRedzone = 4096;
#else
constexpr size_t kRedzone = 0;
#endif

// The block handed out: `bytes` usable, the rest of its mapping poisoned (ASan).
void* hand_out(void* p, size_t bytes, size_t mapped) {
  unpoison(p, bytes);
  poison(static_cast<char*>(p) + bytes, mapped - bytes);
  return p;
}

size_t round_up(size_t n, size_t g) { return (n + g - 1) / g * g; }

size_t page_size() {
  static const size_t p = size_t(sysconf(_SC_PAGESIZE));
  return p;
}

size_t physical_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  return pages > 0 ? size_t(pages) * page_size() : size_t(8) << 30;
}

// MemAvailable from /proc/meminfo in bytes; SIZE_MAX where unknown.
size_t available_bytes() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return SIZE_MAX;
  char line[256];
  size_t kib = SIZE_MAX;
  while (std::fgets(line, sizeof line, f)) {
    unsigned long long v = 0;
    if (std::sscanf(line, "MemAvailable: %llu kB", &v) == 1) {
      kib = size_t(v);
      break;
    }
  }
  std::fclose(f);
  return kib == SIZE_MAX ? SIZE_MAX : kib << 10;
}

size_t cap_from_env() {
  const char* s = std::getenv("MOE_ALLOC_CACHE_MIB");
  if (!s || !*s) return physical_bytes() / 4;
  char* end = nullptr;
  unsigned long long mib = std::strtoull(s, &end, 10);
  if (*end != '\0' || s[0] == '-' || mib > (SIZE_MAX >> 20))
    fail("MOE_ALLOC_CACHE_MIB=", s,
         ": expected a whole number of MiB >= 0 (0: no cache, the C library's allocator)");
  return size_t(mib) << 20;
}

// The bytes a block of class `cls` maps: whole pages, or whole huge pages.
size_t mapped_size(size_t cls) {
  return cls >= kHugeBytes ? round_up(cls, kHugePage) : round_up(cls, page_size());
}

void* map_block(size_t bytes) {
  if (bytes < kHugeBytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  // Over-map by a huge page and cut the ends off so the block is 2 MiB aligned.
  size_t over = bytes + kHugePage;
  void* raw = mmap(nullptr, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = round_up(base, kHugePage);
  if (aligned > base) munmap(raw, aligned - base);
  size_t tail = base + over - (aligned + bytes);
  if (tail) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the block still works
#endif
  return p;
}

struct CachedBlock {
  void* p;
  size_t bytes;
  std::multimap<size_t, uint64_t>::iterator by_size;
};

struct Pool {
  std::mutex mu;
  size_t cap = cap_from_env();               // GUARDED_BY(mu)
  std::unordered_map<void*, size_t> live;    // GUARDED_BY(mu) block -> mapped bytes
  std::multimap<size_t, uint64_t> by_size;   // GUARDED_BY(mu) mapped bytes -> stamp
  std::map<uint64_t, CachedBlock> by_stamp;  // GUARDED_BY(mu) oldest release first
  uint64_t next_stamp = 0;                   // GUARDED_BY(mu)
  Stats s{};                                 // GUARDED_BY(mu)

  void evict(std::map<uint64_t, CachedBlock>::iterator it) {
    CachedBlock b = it->second;
    by_size.erase(b.by_size);
    by_stamp.erase(it);
    s.cached_bytes -= b.bytes;
    --s.cached_blocks;
    ++s.evictions;
    unpoison(b.p, b.bytes);
    munmap(b.p, b.bytes);
  }
  size_t evict_oldest_while(size_t keep_at_most_cached) {
    size_t freed = 0;
    while (s.cached_bytes > keep_at_most_cached && !by_stamp.empty()) {
      freed += by_stamp.begin()->second.bytes;
      evict(by_stamp.begin());
    }
    return freed;
  }
  void note_live(void* p, size_t bytes) {
    live.emplace(p, bytes);
    s.live_bytes += bytes;
    if (s.live_bytes > s.live_peak) s.live_peak = s.live_bytes;
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: blocks may be released during static destruction
  return *p;
}

// Sets `ours` false when the large path is off (the caller takes the C library's).
void* acquire_large(Pool& pl, size_t bytes, bool& ours) {
  const size_t want = mapped_size(size_class(bytes + kRedzone));
  std::lock_guard<std::mutex> lk(pl.mu);
  ours = pl.cap != 0;
  if (!ours) return nullptr;
  // Best fit: the smallest cached block that holds the class, if not too large.
  auto it = pl.by_size.lower_bound(want);
  if (it != pl.by_size.end() && double(it->first) <= kMaxReuseRatio * double(want)) {
    auto st = pl.by_stamp.find(it->second);
    CachedBlock b = st->second;
    pl.by_size.erase(it);
    pl.by_stamp.erase(st);
    pl.s.cached_bytes -= b.bytes;
    --pl.s.cached_blocks;
    ++pl.s.hits;
    pl.note_live(b.p, b.bytes);
    return hand_out(b.p, bytes, b.bytes);
  }
  // No cached block fits. The largest cached block smaller than the class, if
  // at least half of it, is grown in place or moved by mremap: its pages stay
  // (no fresh faults for them), only the difference is new. Under T that
  // drifts upwards this is the previous step's block of the same tensor.
  void* grown = nullptr;
  if (it != pl.by_size.begin()) {
    auto below = std::prev(it);
    if (2 * below->first >= want) {
      auto st = pl.by_stamp.find(below->second);
      CachedBlock b = st->second;
      pl.by_size.erase(below);
      pl.by_stamp.erase(st);
      pl.s.cached_bytes -= b.bytes;
      --pl.s.cached_blocks;
      unpoison(b.p, b.bytes);
      void* q = mremap(b.p, b.bytes, want, MREMAP_MAYMOVE);
      if (q == MAP_FAILED) {
        munmap(b.p, b.bytes);
        ++pl.s.evictions;
      } else {
        grown = q;
#ifdef MADV_HUGEPAGE
        if (want >= kHugeBytes) madvise(q, want, MADV_HUGEPAGE);
#endif
      }
    }
  }
  // Keep live + cached + the new block within the slack of the live
  // high-water mark (shapes that drift must not grow the footprint forever),
  // and give the cache back when the machine is short of memory.
  const size_t hw = std::max(pl.s.live_peak, pl.s.live_bytes + want);
  const size_t footprint = hw + size_t(double(hw) * kFootprintSlack);
  const size_t room = footprint - (pl.s.live_bytes + want);
  pl.evict_oldest_while(room);
  if (pl.s.cached_bytes > 0) {
    const size_t reserve = std::max(physical_bytes() / 32, size_t(256) << 20);
    const size_t avail = available_bytes();
    if (avail != SIZE_MAX && avail < want + reserve) pl.evict_oldest_while(0);
  }
  if (grown) {
    ++pl.s.grown;
    pl.note_live(grown, want);
    return hand_out(grown, bytes, want);
  }
  void* p = map_block(want);
  if (!p && pl.s.cached_bytes > 0) {
    pl.evict_oldest_while(0);
    p = map_block(want);
  }
  if (!p) return nullptr;
  ++pl.s.misses;
  pl.note_live(p, want);
  return hand_out(p, bytes, want);
}

}  // namespace

size_t size_class(size_t bytes) {
  if (bytes < kLargeBytes) return bytes;
  // 16 classes per power of two, at least 64 KiB apart.
  size_t top = size_t(1) << (63 - __builtin_clzll(bytes));
  return round_up(bytes, std::max(top / 16, size_t(64) << 10));
}

void* acquire(size_t bytes, size_t align) {
  if (bytes >= kLargeBytes && align <= page_size()) {
    bool ours = false;
    void* p = acquire_large(pool(), bytes, ours);
    if (ours) return p;  // nullptr: mapping failed even with an empty cache
  }
  return std::aligned_alloc(align, bytes);
}

void release(void* p, size_t bytes) {
  if (!p) return;
  if (bytes >= kLargeBytes) {
    Pool& pl = pool();
    std::lock_guard<std::mutex> lk(pl.mu);
    auto it = pl.live.find(p);
    if (it != pl.live.end()) {
      const size_t mapped = it->second;
      pl.live.erase(it);
      pl.s.live_bytes -= mapped;
      if (mapped > pl.cap) {
        munmap(p, mapped);
        ++pl.s.evictions;
        return;
      }
      pl.evict_oldest_while(pl.cap - mapped);
      const uint64_t stamp = pl.next_stamp++;
      auto bs = pl.by_size.emplace(mapped, stamp);
      pl.by_stamp.emplace(stamp, CachedBlock{p, mapped, bs});
      pl.s.cached_bytes += mapped;
      ++pl.s.cached_blocks;
      poison(p, mapped);
      return;
    }
  }
  std::free(p);
}

Stats stats() {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lk(pl.mu);
  Stats s = pl.s;
  s.cap_bytes = pl.cap;
  return s;
}

size_t release_cached() {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lk(pl.mu);
  return pl.evict_oldest_while(0);
}

size_t set_cap_for_testing(size_t cap_bytes) {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lk(pl.mu);
  size_t old = pl.cap;
  pl.cap = cap_bytes;
  pl.evict_oldest_while(cap_bytes);
  pl.s.live_peak = pl.s.live_bytes;
  return old;
}

}  // namespace moe::alloc
