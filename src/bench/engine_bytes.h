// A byte buffer from the engine's tensor allocator (core/allocator.h), for the
// probes and calibrations that time memory traffic and collectives: the step
// moves tensors, whose large blocks are huge pages, and a std::vector's
// large buffer (4 KiB pages where transparent huge pages are `madvise`)
// measures another machine: 4 ranks' MPI_Allgather of 16 MiB each ran at
// 2.3-3.2 GB/s per rank on 4 KiB pages and 5.6 GB/s on huge pages (2 cores,
// 2026-12-04; docs/distributed.md, "Huge pages in the calibration").
#pragma once

#include <cstddef>
#include <cstring>

#include "core/allocator.h"
#include "moe/error.h"

namespace moe::bench {

class EngineBytes {
 public:
  EngineBytes(size_t n, int fill) : n_(n), cap_((n + 63) / 64 * 64) {
    p_ = static_cast<char*>(alloc::acquire(cap_ == 0 ? 64 : cap_, 64));
    if (!p_) fail("a probe buffer of ", n, " bytes: out of memory");
    std::memset(p_, fill, n);
  }
  ~EngineBytes() { alloc::release(p_, cap_ == 0 ? 64 : cap_); }
  EngineBytes(const EngineBytes&) = delete;
  EngineBytes& operator=(const EngineBytes&) = delete;
  char* data() { return p_; }
  const char* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  size_t n_, cap_;
  char* p_ = nullptr;
};

}  // namespace moe::bench
