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
      "\\(collective_timeout_s\\); the ranks that did not arrive are not known here \\(no liveness probe");
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

TEST(Watchdog, LivenessMustBeNonNegative) {
  const double saved = collective_liveness();
  EXPECT_THROW(set_collective_liveness(-1), Error);
  set_collective_liveness(7);
  EXPECT_EQ(liveness_answer_bound(), 3.5);
  set_collective_liveness(100);
  EXPECT_EQ(liveness_answer_bound(), 5.0);
  set_collective_liveness(0.5);
  EXPECT_EQ(liveness_answer_bound(), 2.0);
  set_collective_liveness(saved);
}

TEST(Watchdog, StateTextNamesTheOldestWait) {
  TimeoutGuard g;
  set_collective_timeout(100);
  EXPECT_NE(watchdog_state_text().find("in no collective or side-engine wait for"), std::string::npos);
  WatchedWait w("all_gather", "4 B per rank", CollectiveSite{7, 3});
  EXPECT_NE(watchdog_state_text().find("waiting in all_gather (4 B per rank) for 0.0 s"), std::string::npos)
      << watchdog_state_text();
}

// A stand-in for the MPI runtime's probe: rank 3 silent, rank 2 alive but elsewhere.
LivenessReport fake_probe(const CollectiveSite& site, double) {
  LivenessReport r;
  r.probed = true;
  r.answered = 2;
  r.silent = {3};
  r.absent = {"rank 2 had not issued it (" + std::to_string(site.seq - 1) + " of " +
              std::to_string(site.seq) + " collectives on its communicator): busy"};
  return r;
}
LivenessReport alive_probe(const CollectiveSite&, double) {
  LivenessReport r;
  r.probed = true;
  r.answered = 3;
  return r;
}

TEST(WatchdogDeathTest, ASilentPeerEndsTheWaitAtTheLivenessInterval) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(100);
        set_collective_liveness(0.3);
        set_liveness_probe(&fake_probe);
        WatchedWait outer("all_reduce_sum", "4 B per rank");
        WatchedWait w("all_gather", "4 B per rank", CollectiveSite{7, 5});
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(1),
      "fatal on rank 0: all_reduce_sum \\(4 B per rank\\) has waited 0.[3-9] s \\(collective_liveness_s "
      "0.3\\); rank 3 "
      "did not answer a liveness probe within 2 s \\(stopped, or dead\\); rank 2 had not issued it \\(4 of 5 "
      "collectives on its communicator\\): busy; ending every rank");
}

// Across hosts: ranks 2 and 3 of host b silent, rank 5 of host c silent.
LivenessReport hosts_probe(const CollectiveSite&, double) {
  LivenessReport r;
  r.probed = true;
  r.answered = 3;
  r.silent = {2, 3, 5};
  return r;
}

TEST(WatchdogDeathTest, ASilentRankIsNamedWithItsHostAndTheRanksItHolds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_rank_hosts({"a", "a", "b", "b", "c", "c"});
        set_collective_timeout(100);
        set_collective_liveness(0.3);
        set_liveness_probe(&hosts_probe);
        WatchedWait w("all_gather", "4 B per rank", CollectiveSite{7, 5});
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(1),
      "all_gather \\(4 B per rank\\) has waited 0.[3-9] s \\(collective_liveness_s 0.3\\); "
      "ranks 2, 3 on host b and rank 5 on host c did not answer a liveness probe within 2 s "
      "\\(stopped, dead, or cut off\\); host b holds ranks 2, 3; host c holds ranks 4, 5; ending every rank");
}

TEST(Watchdog, RankTextNamesTheHostOnlyWhenTheRanksSpanHosts) {
  set_rank_hosts({"a", "b"});
  EXPECT_EQ(rank_text(1), "rank 1 on host b");
  EXPECT_EQ(rank_text(7), "rank 7");
  set_rank_hosts({"a", "a"});
  EXPECT_EQ(rank_text(1), "rank 1");
  set_rank_hosts({});
  EXPECT_EQ(rank_text(0), "rank 0");
}

TEST(WatchdogDeathTest, LivePeersWaitForTheTimeoutWhichNamesWhoWasMissing) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_collective_timeout(1.5);
        set_collective_liveness(0.2);  // probed ~7 times, all alive
        set_liveness_probe(&alive_probe);
        WatchedWait outer("all_reduce_sum", "4 B per rank");
        WatchedWait w("all_gather", "4 B per rank", CollectiveSite{7, 5});
        std::this_thread::sleep_for(1.2s);
        set_collective_liveness(0);       // no more early probes: only the timeout's,
        set_liveness_probe(&fake_probe);  // which finds rank 3 silent and rank 2 missing
        std::this_thread::sleep_for(10s);
      },
      ::testing::ExitedWithCode(1),
      "fatal on rank 0: all_reduce_sum \\(4 B per rank\\) did not complete within 1.5 s "
      "\\(collective_timeout_s\\); "
      "rank 3 did not answer");
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
