// The collective watchdog (include/moe/watchdog.h) in one process: a watched
// wait past the timeout ends the process with the op's name; the MPI
// scenarios (a stopped rank, a killed rank) are CTest entries under mpirun.
#include "moe/watchdog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "moe/error.h"
#include "moe/side_engine.h"

namespace moe {
namespace {

using namespace std::chrono_literals;

// Restores the process's timeout after a test that changes it.
class TimeoutGuard {
 public:
  TimeoutGuard() : saved_(collective_timeout()) {}
  ~TimeoutGuard() { set_collective_timeout(saved_); }

 private:
  double saved_;
};

TEST(Watchdog, TimeoutMustBeNonNegative) {
  TimeoutGuard g;
  EXPECT_THROW(set_collective_timeout(-1), Error);
  set_collective_timeout(0);
  EXPECT_EQ(collective_timeout(), 0.0);
}

TEST(Watchdog, WaitWithinTheTimeoutPasses) {
  TimeoutGuard g;
  set_collective_timeout(2);
  WatchedWait w("all_gather", "4 B per rank");
  std::this_thread::sleep_for(50ms);
}

TEST(Watchdog, OffMeansNoLimit) {
  TimeoutGuard g;
  set_collective_timeout(0);
  WatchedWait w("all_gather", "");
  std::this_thread::sleep_for(300ms);
}

TEST(WatchdogDeathTest, ExpiredCollectiveEndsTheProcessNamingTheOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(0.2);
        WatchedWait w("all_to_allv", "64 B out, 64 B in");
        std::this_thread::sleep_for(5s);
      },
      ::testing::ExitedWithCode(1),
      "fatal on rank 0: all_to_allv \\(64 B out, 64 B in\\) did not complete within 0.2 s "
      "\\(collective_timeout_s\\); the ranks that did not arrive are not known here");
}

TEST(WatchdogDeathTest, TheMessageNamesTheStepOpAndChunk) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(0.2);
        WatchContext outer("forward");
        WatchContext context("A2A:dispatch[1]");
        WatchedWait w("all_to_allv", "64 B out, 32 B in");
        std::this_thread::sleep_for(5s);
      },
      ::testing::ExitedWithCode(1),
      "all_to_allv \\(64 B out, 32 B in; in A2A:dispatch\\[1\\]\\) did not complete");
}

TEST(WatchdogDeathTest, ContextEndsWithItsScope) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(0.2);
        { WatchContext context("A2A:return[0]"); }
        WatchedWait w("barrier", "");
        std::this_thread::sleep_for(5s);
      },
      ::testing::ExitedWithCode(1), "fatal on rank 0: barrier did not complete");
}

TEST(WatchdogDeathTest, SideEngineWaitHasTheSameTimeout) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(0.2);
        SideEngine engine(1);
        engine.submit("ep_dispatch", [] { std::this_thread::sleep_for(5s); }).wait();
      },
      ::testing::ExitedWithCode(1),
      "fatal on rank 0: side-engine event wait \\(event 'ep_dispatch'\\) did not complete within 0.2 s");
}

}  // namespace
}  // namespace moe
