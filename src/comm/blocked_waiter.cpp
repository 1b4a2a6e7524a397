// BlockedWaiter (include/moe/comm.h): the process-wide count of threads blocked on polled work.
// A file of its own: the side engine uses it, and the ThreadSanitizer build compiles the side
// engine without the communicators.
#include <atomic>

#include "moe/comm.h"

namespace moe {
namespace {
std::atomic<int> g_blocked_waiters{0};
}  // namespace

BlockedWaiter::BlockedWaiter() { g_blocked_waiters.fetch_add(1, std::memory_order_relaxed); }
BlockedWaiter::~BlockedWaiter() { g_blocked_waiters.fetch_sub(1, std::memory_order_relaxed); }
bool BlockedWaiter::any() { return g_blocked_waiters.load(std::memory_order_relaxed) > 0; }

}  // namespace moe
