#include "core/allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <set>
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
  // Half of physical memory: a quarter made a step that frees more than that at once (mixtral-8x7b's
  // fwd+bwd frees ~8 GiB on a 24 GiB machine) give its pages back and fault them in again every step
  // (docs/architecture.md §7). The footprint bound and the MemAvailable check still apply below it.
  if (!s || !*s) return physical_bytes() / 2;
  char* end = nullptr;
  unsigned long long mib = std::strtoull(s, &end, 10);
  if (*end != '\0' || s[0] == '-' || mib > (SIZE_MAX >> 20))
    fail("MOE_ALLOC_CACHE_MIB=", s,
         ": expected a whole number of MiB >= 0 (0: no cache, the C library's allocator)");
  return size_t(mib) << 20;
}

// The bytes a block of class `cls` takes: whole pages, or whole huge pages.
size_t mapped_size(size_t cls) {
  return cls >= kHugeBytes ? round_up(cls, kHugePage) : round_up(cls, page_size());
}

// Where a block of `bytes` may start: huge blocks on a huge page.
size_t placement_align(size_t bytes) { return bytes >= kHugeBytes ? kHugePage : page_size(); }

// A block outside the arena (no arena, or the arena full): its own mapping.
void* map_own(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// The arena's size: physical memory (live tensors beyond it would not fit
// anyway; more goes to own mappings), smaller under TSan, whose shadow of a
// reservation is not free.
size_t arena_target() {
#if defined(__SANITIZE_THREAD__)
  return std::min(physical_bytes(), size_t(4) << 30);
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
  return std::min(physical_bytes(), size_t(4) << 30);
#endif
#endif
  return physical_bytes();
}

struct LiveBlock {
  size_t len;
  bool in_arena;
};

// A placement for a request: where, and how many of its bytes are resident.
struct Choice {
  uintptr_t at = 0;
  size_t covered = 0;
  bool ok = false;
};

struct Pool {
  std::mutex mu;
  size_t cap = cap_from_env();                      // GUARDED_BY(mu)
  uintptr_t base = 0, end = 0;                      // GUARDED_BY(mu) the arena, once reserved
  bool reserve_tried = false;                       // GUARDED_BY(mu)
  std::map<uintptr_t, size_t> free_spans;           // GUARDED_BY(mu) start -> length, coalesced
  std::set<std::pair<size_t, uintptr_t>> by_size;   // GUARDED_BY(mu) (length, start) of free_spans
  std::map<uintptr_t, size_t> resident;             // GUARDED_BY(mu) resident parts of free spans, coalesced
  std::unordered_map<uintptr_t, LiveBlock> live;    // GUARDED_BY(mu)
  Stats s{};                                        // GUARDED_BY(mu)
  AvailableProbe available = nullptr;               // GUARDED_BY(mu) the test hook; nullptr: /proc/meminfo
  // The footprint bound's window: the live peaks of the last kWindowEpochs
  // closed epochs (a ring, 0 where none closed yet), and the current epoch's
  // peak and request count.
  std::array<size_t, kWindowEpochs> epoch_peaks{};  // GUARDED_BY(mu)
  size_t epoch_next = 0;                            // GUARDED_BY(mu) the ring's oldest entry
  size_t epoch_peak = 0;                            // GUARDED_BY(mu)
  size_t epoch_requests = 0;                        // GUARDED_BY(mu)

  // Reserves the arena on first use: halves the size until the kernel agrees
  // (strict overcommit counts a reservation), down to 1 GiB, else none.
  void reserve() {
    reserve_tried = true;
    for (size_t n = round_up(arena_target(), kHugePage); n >= (size_t(1) << 30); n /= 2) {
      n = round_up(n, kHugePage);
      void* raw = mmap(nullptr, n + kHugePage, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (raw == MAP_FAILED) continue;
      // Cut the ends off so the arena is 2 MiB aligned.
      const uintptr_t r = reinterpret_cast<uintptr_t>(raw);
      const uintptr_t a = round_up(r, kHugePage);
      if (a > r) munmap(raw, a - r);
      if (r + kHugePage > a) munmap(reinterpret_cast<void*>(a + n), r + kHugePage - a);
#ifdef MADV_HUGEPAGE
      madvise(reinterpret_cast<void*>(a), n, MADV_HUGEPAGE);  // advice only: without THP it still works
#endif
      base = a, end = a + n;
      s.arena_bytes = n;
      add_free(a, n);
      return;
    }
  }

  void add_free(uintptr_t a, size_t n) {
    auto next = free_spans.lower_bound(a);
    if (next != free_spans.end() && a + n == next->first) {
      n += next->second;
      by_size.erase({next->second, next->first});
      next = free_spans.erase(next);
    }
    if (next != free_spans.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == a) {
        by_size.erase({prev->second, prev->first});
        a = prev->first, n += prev->second;
        free_spans.erase(prev);
      }
    }
    free_spans.emplace(a, n);
    by_size.emplace(n, a);
  }
  // REQUIRES: [a, a + n) lies inside one free span.
  void take_free(uintptr_t a, size_t n) {
    auto it = std::prev(free_spans.upper_bound(a));
    const uintptr_t s0 = it->first, e0 = it->first + it->second;
    MOE_ASSERT(s0 <= a && a + n <= e0, "allocator: a placement outside its free span");
    by_size.erase({it->second, s0});
    free_spans.erase(it);
    if (a > s0) free_spans.emplace(s0, a - s0), by_size.emplace(a - s0, s0);
    if (e0 > a + n) free_spans.emplace(a + n, e0 - a - n), by_size.emplace(e0 - a - n, a + n);
  }

  void add_resident(uintptr_t a, size_t n) {
    auto next = resident.lower_bound(a);
    if (next != resident.end() && a + n == next->first) {
      n += next->second;
      next = resident.erase(next);
      --s.cached_blocks;
    }
    if (next != resident.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == a) {
        a = prev->first, n += prev->second;
        resident.erase(prev);
        --s.cached_blocks;
      }
    }
    resident.emplace(a, n);
    ++s.cached_blocks;
  }
  // Resident bytes in [a, a + n).
  size_t covered(uintptr_t a, size_t n) const {
    size_t c = 0;
    auto it = resident.upper_bound(a);
    if (it != resident.begin()) --it;
    for (; it != resident.end() && it->first < a + n; ++it) {
      const uintptr_t lo = std::max(a, it->first), hi = std::min(a + n, it->first + it->second);
      if (hi > lo) c += hi - lo;
    }
    return c;
  }
  // Removes [a, a + n) from the resident extents (it is being handed out);
  // returns the resident bytes it covered.
  size_t take_resident(uintptr_t a, size_t n) {
    size_t c = 0;
    auto it = resident.upper_bound(a);
    if (it != resident.begin()) --it;
    while (it != resident.end() && it->first < a + n) {
      const uintptr_t s0 = it->first, e0 = it->first + it->second;
      if (e0 <= a) {
        ++it;
        continue;
      }
      c += std::min(a + n, e0) - std::max(a, s0);
      it = resident.erase(it);
      --s.cached_blocks;
      if (s0 < a) resident.emplace(s0, a - s0), ++s.cached_blocks;
      if (e0 > a + n) {
        resident.emplace(a + n, e0 - a - n);
        ++s.cached_blocks;
        break;
      }
    }
    s.cached_bytes -= c;
    return c;
  }

  // Gives back resident free pages from the top of the arena down (it stays
  // compact at its bottom, where placement looks first; cut on a huge page
  // where it can be), until at most `keep_at_most_cached` bytes stay. Returns
  // the bytes given back.
  size_t evict_highest_while(size_t keep_at_most_cached) {
    size_t freed = 0;
    while (s.cached_bytes > keep_at_most_cached && !resident.empty()) {
      auto top = std::prev(resident.end());
      const uintptr_t s0 = top->first, e0 = s0 + top->second;
      const size_t need = s.cached_bytes - keep_at_most_cached;
      uintptr_t cut = need >= e0 - s0 ? s0 : (e0 - need) / kHugePage * kHugePage;
      if (cut < s0) cut = s0;
      unpoison(reinterpret_cast<void*>(cut), e0 - cut);
      madvise(reinterpret_cast<void*>(cut), e0 - cut, MADV_DONTNEED);
      poison(reinterpret_cast<void*>(cut), e0 - cut);
      ++s.evictions;
      s.evicted_bytes += e0 - cut;
      s.cached_bytes -= e0 - cut;
      freed += e0 - cut;
      if (cut == s0) {
        resident.erase(top);
        --s.cached_blocks;
      } else {
        top->second = cut - s0;
      }
    }
    return freed;
  }

  void consider(Choice& best, uintptr_t span, size_t span_len, uintptr_t at, size_t want) const {
    if (at < span || at + want > span + span_len) return;
    const size_t c = covered(at, want);
    if (!best.ok || c > best.covered || (c == best.covered && at < best.at)) best = Choice{at, c, true};
  }
  // The placement for `want` bytes: the one covering the most resident bytes,
  // then the lowest (address-ordered first fit keeps the arena compact).
  // Candidates: each resident extent's start and end, and the lowest free span
  // that holds the request.
  Choice choose(size_t want) const {
    const size_t al = placement_align(want);
    Choice best;
    for (const auto& [r, len] : resident) {
      auto sp = std::prev(free_spans.upper_bound(r));
      if (sp->second < want) continue;
      consider(best, sp->first, sp->second, round_up(r, al), want);
      if (r + len >= want) consider(best, sp->first, sp->second, (r + len - want) / al * al, want);
    }
    for (const auto& [span, span_len] : free_spans) {
      const uintptr_t at = round_up(span, al);
      if (at + want > span + span_len) continue;
      consider(best, span, span_len, at, want);
      break;
    }
    return best;
  }

  void note_live(uintptr_t p, size_t bytes, bool in_arena) {
    live.emplace(p, LiveBlock{bytes, in_arena});
    s.live_bytes += bytes;
    if (s.live_bytes > s.live_peak) s.live_peak = s.live_bytes;
    if (s.live_bytes > epoch_peak) epoch_peak = s.live_bytes;
    if (s.live_bytes > s.window_peak) s.window_peak = s.live_bytes;
  }

  static size_t footprint_bound(size_t hw) { return hw + size_t(double(hw) * kFootprintSlack); }

  // Counts a large request. The one after an epoch's kEpochRequests closes
  // that epoch and is the first of the next. The window's peak may fall then
  // (the oldest epoch leaves it): the cache is trimmed to the bound it gives.
  // Between closes the window's peak only grows.
  void count_request() {
    if (++epoch_requests <= kEpochRequests) return;
    epoch_peaks[epoch_next] = epoch_peak;
    epoch_next = (epoch_next + 1) % kWindowEpochs;
    epoch_peak = s.live_bytes;
    epoch_requests = 1;
    s.window_peak = std::max(epoch_peak, *std::max_element(epoch_peaks.begin(), epoch_peaks.end()));
    const size_t bound = footprint_bound(s.window_peak);
    evict_highest_while(bound > s.live_bytes ? bound - s.live_bytes : 0);
  }
  void reset_window() {
    epoch_peaks.fill(0);
    epoch_next = 0;
    epoch_peak = s.live_bytes;
    epoch_requests = 0;
    s.window_peak = s.live_bytes;
  }

  // Before handing out `fresh` bytes that are not resident: keep live +
  // cached + the new block within the slack of the recent live high-water
  // mark (shapes that drift must not grow the footprint), and give the cache
  // back when the machine is short of memory.
  void bound_footprint(size_t want, size_t fresh) {
    const size_t hw = std::max(s.window_peak, s.live_bytes + want);
    evict_highest_while(footprint_bound(hw) - (s.live_bytes + want));
    if (s.cached_bytes > 0) {
      const size_t reserve = std::max(physical_bytes() / 32, size_t(256) << 20);
      const size_t avail = available ? available() : available_bytes();
      if (avail != SIZE_MAX && avail < fresh + reserve) evict_highest_while(0);
    }
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
  if (!pl.reserve_tried) pl.reserve();
  pl.count_request();
  const Choice c = pl.choose(want);
  if (c.ok) {
    const size_t fresh = want - c.covered;
    pl.take_free(c.at, want);
    pl.take_resident(c.at, want);
    if (fresh == 0) {
      ++pl.s.hits;
    } else {
      pl.bound_footprint(want, fresh);
      ++(c.covered ? pl.s.partial : pl.s.misses);
      pl.s.fresh_bytes += fresh;
    }
    pl.note_live(c.at, want, true);
    return hand_out(reinterpret_cast<void*>(c.at), bytes, want);
  }
  // No arena, or no free span holds the request: a mapping of its own.
  pl.bound_footprint(want, want);
  void* p = map_own(want);
  if (!p && pl.s.cached_bytes > 0) {
    pl.evict_highest_while(0);
    p = map_own(want);
  }
  if (!p) return nullptr;
  ++pl.s.misses;
  ++pl.s.own_mappings;
  pl.s.fresh_bytes += want;
  pl.note_live(reinterpret_cast<uintptr_t>(p), want, false);
  return hand_out(p, bytes, want);
}

}  // namespace

size_t size_class(size_t bytes) {
  if (bytes < kLargeBytes) return bytes;
  // 16 classes per power of two: 4 KiB apart at kLargeBytes, 64 KiB apart from 1 MiB on.
  const size_t top = size_t(1) << (63 - __builtin_clzll(bytes));
  return round_up(bytes, top / 16);
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
    auto it = pl.live.find(reinterpret_cast<uintptr_t>(p));
    if (it != pl.live.end()) {
      const LiveBlock b = it->second;
      pl.live.erase(it);
      pl.s.live_bytes -= b.len;
      if (!b.in_arena) {
        unpoison(p, b.len);
        munmap(p, b.len);
        return;
      }
      // Its pages stay resident; beyond the cap the highest are given back.
      poison(p, b.len);
      const uintptr_t a = reinterpret_cast<uintptr_t>(p);
      pl.add_free(a, b.len);
      pl.add_resident(a, b.len);
      pl.s.cached_bytes += b.len;
      pl.evict_highest_while(pl.cap);
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
  return pl.evict_highest_while(0);
}

AvailableProbe set_available_probe_for_testing(AvailableProbe probe) {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lk(pl.mu);
  AvailableProbe old = pl.available;
  pl.available = probe;
  return old;
}

size_t set_cap_for_testing(size_t cap_bytes) {
  Pool& pl = pool();
  std::lock_guard<std::mutex> lk(pl.mu);
  size_t old = pl.cap;
  pl.cap = cap_bytes;
  pl.evict_highest_while(cap_bytes);
  pl.s.live_peak = pl.s.live_bytes;
  pl.reset_window();
  return old;
}

}  // namespace moe::alloc
