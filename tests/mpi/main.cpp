// main() of moe_mpi_tests. Every rank runs every test; only rank 0 prints
// gtest's report, other ranks print their own failures prefixed with the
// rank. The exit status is non-zero on every rank if any rank failed.
//
// `moe_mpi_tests --die-mid-collective` is the rank-death scenario: rank 1
// exits with status 3 while the others wait in an all-reduce; mpirun must end
// the job (CTest runs it under `timeout 60` and requires a non-zero, non-timeout status).
// `moe_mpi_tests --abort` : the last rank calls Communicator::abort while the
// others wait in a barrier; the job must end with the message printed.
// `moe_mpi_tests --throw-mid-collective` : inside run_collectively, rank 1
// throws a std::out_of_range (not a moe::Error) while the others wait in an
// all-reduce; the job must end with "fatal on rank 1: <what>", not hang.
// `moe_mpi_tests --stop-before-collective` : rank 1 stops itself (SIGSTOP)
// while the others enter an all-reduce; the collective watchdog of rank 0
// (MOE_COLLECTIVE_TIMEOUT_S) must end the job naming the op
// (tests/mpi/watchdog_np2.sh). `--kill-mid-collective` : rank 1 is killed by
// SIGKILL while the others wait in an all-reduce. Both print every rank's pid
// ("[rank R] pid P") so the script can check that every process is gone.
// Under -np 4 (tests/mpi/watchdog_np4.sh) the last rank is the one signalled
// (rank 1 under -np 2), and two more: `--slow-peer S` : the last rank computes
// (outside MPI) for S seconds while the others wait in an all-reduce, then
// joins it (the liveness probe must find it alive: exit 0);
// `--throw-mid-collective-last` : the last rank throws.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "mpi_env.h"

namespace moe::testing {
namespace {
std::unique_ptr<Communicator> g_world;

// Prints failures of a non-root rank (the default printer is removed there).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

int die_mid_collective() {
  Communicator& w = world();
  if (w.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "[rank 1] exiting with status 3 mid-collective\n");
    std::_Exit(3);
  }
  float x = 1, y = 0;
  w.all_reduce_sum(&x, &y, 1);  // never completes: rank 1 is gone
  std::fprintf(stderr, "[rank %d] all_reduce returned after a rank died\n", w.rank());
  return 0;
}
int abort_from_last_rank() {
  Communicator& w = world();
  if (w.rank() == w.size() - 1) w.abort("deliberate abort from the test");
  w.barrier();  // never completes
  std::fprintf(stderr, "[rank %d] barrier returned after an abort\n", w.rank());
  return 0;
}
int throw_mid_collective(bool last) {
  Communicator& w = world();
  std::fprintf(stderr, "[rank %d] pid %d\n", w.rank(), int(::getpid()));
  run_collectively(w, [&] {
    if (w.rank() == (last ? w.size() - 1 : 1)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const double now_s =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::fprintf(stderr, "[rank %d] raising std::out_of_range at %.3f\n", w.rank(), now_s);
      throw std::out_of_range("deliberate std::out_of_range from the test");
    }
    float x = 1, y = 0;
    w.all_reduce_sum(&x, &y, 1);  // never completes: rank 1 threw
  });
  std::fprintf(stderr, "[rank %d] returned from run_collectively after a rank threw\n", w.rank());
  return 0;
}
double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The last rank takes itself out with `sig` (SIGSTOP or SIGKILL) while the
// others wait in an all-reduce.
int signal_mid_collective(int sig) {
  Communicator& w = world();
  const int victim = w.size() - 1;
  std::fprintf(stderr, "[rank %d] pid %d\n", w.rank(), int(::getpid()));
  w.barrier();  // every pid is printed before the victim goes
  if (w.rank() == victim) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::fprintf(stderr, "[rank %d] raising %s at %.3f\n", victim, sig == SIGSTOP ? "SIGSTOP" : "SIGKILL",
                 wall_now());
    std::raise(sig);
  }
  float x = 1, y = 0;
  w.all_reduce_sum(&x, &y, 1);  // waits until the watchdog or mpirun ends the job
  std::fprintf(stderr, "[rank %d] all_reduce returned after rank %d was signalled\n", w.rank(), victim);
  return 0;
}

// The last rank computes outside MPI for `seconds` (a spin, as a long FFN or a
// checkpoint write would hold it) while the others wait in an all-reduce.
int slow_peer(double seconds) {
  Communicator& w = world();
  std::fprintf(stderr, "[rank %d] pid %d\n", w.rank(), int(::getpid()));
  w.barrier();
  if (w.rank() == w.size() - 1) {
    std::fprintf(stderr, "[rank %d] computing for %g s from %.3f\n", w.rank(), seconds, wall_now());
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    volatile double sink = 0;
    while (std::chrono::steady_clock::now() < until)
      for (int i = 0; i < 100000; ++i) sink = sink + 1e-9 * i;
  }
  float x = 1, y = 0;
  w.all_reduce_sum(&x, &y, 1);
  if (y != float(w.size())) {
    std::fprintf(stderr, "[rank %d] all_reduce gave %g, expected %d\n", w.rank(), double(y), w.size());
    return 1;
  }
  std::fprintf(stderr, "[rank %d] all_reduce completed after the slow peer\n", w.rank());
  return 0;
}
}  // namespace

Communicator& world() { return *g_world; }

float seeded_float(int rank, int64_t index, uint32_t salt) {
  uint64_t z = (uint64_t(uint32_t(rank)) << 40) ^ uint64_t(index) * 0x9E3779B97F4A7C15ull ^ salt;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float unit = float(z >> 40) / float(1 << 24) - 0.5f;  // [-0.5, 0.5)
  return std::ldexp(unit, int((z >> 8) % 24) - 12);           // magnitudes 2^-13 .. 2^10
}

}  // namespace moe::testing

int main(int argc, char** argv) {
  using namespace moe::testing;
  g_world = moe::make_world_comm();
  if (argc > 1 && std::strcmp(argv[1], "--die-mid-collective") == 0) return die_mid_collective();
  if (argc > 1 && std::strcmp(argv[1], "--abort") == 0) return abort_from_last_rank();
  if (argc > 1 && std::strcmp(argv[1], "--throw-mid-collective") == 0) return throw_mid_collective(false);
  if (argc > 1 && std::strcmp(argv[1], "--throw-mid-collective-last") == 0) return throw_mid_collective(true);
  if (argc > 2 && std::strcmp(argv[1], "--slow-peer") == 0) return slow_peer(std::atof(argv[2]));
  if (argc > 1 && std::strcmp(argv[1], "--stop-before-collective") == 0)
    return signal_mid_collective(SIGSTOP);
  if (argc > 1 && std::strcmp(argv[1], "--kill-mid-collective") == 0) return signal_mid_collective(SIGKILL);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = world().rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  float any = 0, mine = float(failed);
  world().all_reduce_sum(&mine, &any, 1);
  if (rank == 0 && any > 0 && !failed) std::fprintf(stderr, "moe_mpi_tests: a test failed on another rank\n");
  g_world.reset();
  return any > 0 ? 1 : 0;
}
