// The side engine's contract (include/moe/side_engine.h). Also run under
// ThreadSanitizer by scripts/tsan.sh.
#include "moe/side_engine.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "moe/comm.h"
#include "moe/error.h"

namespace moe {
namespace {

using namespace std::chrono_literals;

TEST(SideEngine, OneThreadRunsTasksInSubmissionOrder) {
  SideEngine engine(1);
  std::vector<int> order;  // written only by the one worker; read after sync()
  std::vector<Event> events;
  for (int i = 0; i < 50; ++i)
    events.push_back(engine.submit("task" + std::to_string(i), [&order, i] { order.push_back(i); }));
  events.back().wait();
  for (const Event& e : events) EXPECT_TRUE(e.ready());
  engine.sync();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[size_t(i)], i);
  EXPECT_EQ(events[3].name(), "task3");
}

TEST(SideEngine, TwoThreadsOverlapAndLaterTasksWaitForAFreeWorker) {
  SideEngine engine(2);
  std::atomic<bool> release_a{false}, release_b{false}, b_started{false};
  auto spin = [](std::atomic<bool>& flag) {
    while (!flag.load()) std::this_thread::sleep_for(1ms);
  };
  Event a = engine.submit("a", [&] { spin(release_a); });
  Event b = engine.submit("b", [&] {
    b_started = true;
    spin(release_b);
  });
  Event c = engine.submit("c", [] {});
  while (!b_started.load()) std::this_thread::sleep_for(1ms);  // b runs while a blocks
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(c.ready()) << "c must wait for a free worker";
  release_a = true;
  c.wait();  // a's worker picks c; b still blocks
  EXPECT_FALSE(b.ready());
  release_b = true;
  engine.sync();
  EXPECT_TRUE(a.ready() && b.ready());
}

TEST(SideEngine, ManyConcurrentTasksFromManySubmitters) {
  SideEngine engine(3);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> submitters;
  for (int s = 0; s < 4; ++s)
    submitters.emplace_back([&, s] {
      std::vector<Event> mine;
      for (int i = 1; i <= 250; ++i) mine.push_back(engine.submit("add", [&sum, i] { sum += i; }));
      for (const Event& e : mine) e.wait();
    });
  for (auto& t : submitters) t.join();
  engine.sync();
  EXPECT_EQ(sum.load(), 4 * 250 * 251 / 2);
}

// A thread blocked in Event::wait marks itself (BlockedWaiter), so the worker's polite waits poll
// without sleeping while it waits; the mark is gone once the wait returns.
TEST(SideEngine, BlockedWaitMarksTheProcess) {
  EXPECT_FALSE(BlockedWaiter::any());
  {
    const BlockedWaiter a;
    EXPECT_TRUE(BlockedWaiter::any());
    {
      const BlockedWaiter b;
      EXPECT_TRUE(BlockedWaiter::any());
    }
    EXPECT_TRUE(BlockedWaiter::any());
  }
  EXPECT_FALSE(BlockedWaiter::any());
  SideEngine e(1);
  std::atomic<bool> saw{false};
  Event ev = e.submit("sees the waiter", [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!BlockedWaiter::any() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    saw = BlockedWaiter::any();
  });
  ev.wait();  // the task returns only once it has seen this wait's mark (or after 10 s)
  EXPECT_TRUE(saw.load());
  EXPECT_FALSE(BlockedWaiter::any());
}

TEST(SideEngine, WaitRethrowsTheTaskErrorOnTheCaller) {
  SideEngine engine(2);
  // (A submit after "bad" failed unobserved would rethrow its error: submit "good" first.)
  Event good = engine.submit("good", [] {});
  Event bad = engine.submit("bad", [] { throw Error("[all_to_all] peer 3 sent 7 rows, expected 8"); });
  try {
    bad.wait();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[all_to_all] peer 3 sent 7 rows, expected 8");
  }
  EXPECT_THROW(bad.wait(), Error);  // every wait rethrows
  good.wait();
  EXPECT_NO_THROW(engine.sync());  // already reported through the event
  EXPECT_NO_THROW(engine.submit("after", [] {}).wait());
}

TEST(SideEngine, UnwaitedErrorSurfacesAtTheNextSyncOnce) {
  SideEngine engine(1);
  std::atomic<bool> go{false};
  engine.submit("first", [&] {  // fails only once both are queued (else the 2nd submit rethrows)
    while (!go.load()) std::this_thread::sleep_for(1ms);
    throw Error("first failure");
  });
  engine.submit("second", [] { throw Error("second failure"); });
  go = true;
  try {
    engine.sync();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "first failure");
  }
  EXPECT_NO_THROW(engine.sync());  // reported once, then cleared
}

TEST(SideEngine, UnwaitedErrorSurfacesAtTheNextSubmit) {
  SideEngine engine(1);
  std::atomic<bool> go{false};
  engine.submit("bad", [&] {
    while (!go.load()) std::this_thread::sleep_for(1ms);
    throw Error("boom");
  });
  Event probe = engine.submit("probe", [] {});  // queued before "bad" failed
  go = true;
  probe.wait();  // one thread, FIFO: "bad" has finished
  std::atomic<bool> ran{false};
  try {
    engine.submit("next", [&] { ran = true; });
    FAIL() << "expected the unreported error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
  engine.sync();
  EXPECT_FALSE(ran.load()) << "a submit that rethrows does not queue its task";
  EXPECT_NO_THROW(engine.submit("later", [] {}).wait());
}

TEST(SideEngine, DestructorDrainsPendingTasks) {
  std::atomic<int> ran{0};
  std::vector<Event> events;
  {
    SideEngine engine(1);
    events.push_back(engine.submit("slow", [&] {
      std::this_thread::sleep_for(20ms);
      ++ran;
    }));
    for (int i = 0; i < 20; ++i) events.push_back(engine.submit("pending", [&] { ++ran; }));
    engine.submit("fails", [] { throw Error("dropped at shutdown"); });
  }
  EXPECT_EQ(ran.load(), 21);
  for (const Event& e : events) EXPECT_TRUE(e.ready());  // events outlive the engine
}

TEST(SideEngine, EventsWaitedFromOtherThreads) {
  SideEngine engine(1);
  std::atomic<bool> release{false};
  Event gate = engine.submit("gate", [&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i)
    waiters.emplace_back([gate, &woke] {
      gate.wait();
      ++woke;
    });
  std::this_thread::sleep_for(5ms);
  EXPECT_FALSE(gate.ready());
  EXPECT_EQ(woke.load(), 0);
  release = true;
  for (auto& t : waiters) t.join();
  EXPECT_EQ(woke.load(), 3);
  EXPECT_TRUE(gate.ready());
}

TEST(SideEngine, TasksMaySubmitFollowUps) {
  SideEngine engine(2);
  std::atomic<int> done{0};
  engine.submit("parent", [&] { engine.submit("child", [&] { ++done; }); }).wait();
  engine.sync();
  EXPECT_EQ(done.load(), 1);
}

TEST(SideEngine, ZeroThreadEngineRejectsSubmit) {
  SideEngine engine(0);
  EXPECT_EQ(engine.threads(), 0);
  try {
    engine.submit("ragged_sort", [] {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'ragged_sort'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("side_engine_threads is 0"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(engine.sync());
}

TEST(SideEngine, DefaultEventIsReady) {
  Event e;
  EXPECT_TRUE(e.ready());
  EXPECT_NO_THROW(e.wait());
  EXPECT_EQ(e.name(), "");
}

// Real-time workers: granted (root / CAP_SYS_NICE) they run SCHED_FIFO;
// refused they keep the normal policy. Either way tasks run as before.
TEST(SideEngine, RealtimeWorkersRunTasksUnderTheGrantedPolicy) {
  SideEngine rt(1, /*realtime=*/true);
  int policy = -1;
  rt.submit("policy", [&] {
      sched_param sp{};
      pthread_getschedparam(pthread_self(), &policy, &sp);
    }).wait();
  EXPECT_EQ(policy == SCHED_FIFO, rt.realtime());
  SideEngine normal(1);
  EXPECT_FALSE(normal.realtime());
  normal.submit("policy", [&] {
      sched_param sp{};
      pthread_getschedparam(pthread_self(), &policy, &sp);
    }).wait();
  EXPECT_EQ(policy, SCHED_OTHER);
}

}  // namespace
}  // namespace moe
