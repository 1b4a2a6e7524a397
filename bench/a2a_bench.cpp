// a2a_bench: the expert all-to-all alone, flat (one MPI_Alltoallv) against
// hierarchical (src/comm/hier_a2a.h: within hosts, then between them), on
// the world communicator, for a range of message sizes. Run under mpirun with
// several ranks per host (or MOE_RANKS_PER_HOST=n on one machine).
//
// Usage: mpirun -np 4 a2a_bench [reps=20] [row_bytes=2048] [rows per rank pair ...]
// Every rank sends `rows` rows of row_bytes to every rank (itself included),
// so a rank sends P * rows * row_bytes bytes per all-to-all. The two are run
// alternately, each followed by a barrier; rank 0 prints the median ms of
// each and hier / flat, and checks once per size that the receive buffers
// are equal byte for byte.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/hier_a2a.h"
#include "moe/comm.h"
#include "timing.h"

namespace moe::bench {
namespace {

struct Sizes {
  int reps = 20;
  size_t row_bytes = 2048;  // one bf16 row of D = 1024
  std::vector<int64_t> rows = {1, 8, 64, 256, 1024};
};

Sizes parse(int argc, char** argv) {
  Sizes s;
  if (argc > 1) s.reps = std::atoi(argv[1]);
  if (argc > 2) s.row_bytes = size_t(std::atoll(argv[2]));
  if (argc > 3) s.rows.clear();
  for (int i = 3; i < argc; ++i) s.rows.push_back(std::atoll(argv[i]));
  if (s.reps < 1 || s.row_bytes < 1 || s.rows.empty()) fail("usage: a2a_bench [reps] [row_bytes] [rows per pair ...]");
  return s;
}

void run(Communicator& w, const Sizes& s) {
  const int P = w.size();
  HierAllToAll hier(w);
  if (w.rank() == 0)
    std::printf("a2a_bench: %d ranks on %s (%s), %d reps, row %zu B\n", P, hier.hosts().describe().c_str(),
                hier.usable() ? "two phases" : "hierarchical = flat here", s.reps, s.row_bytes);
  if (!hier.usable()) return;
  if (w.rank() == 0) std::printf("%10s %14s %10s %10s %8s\n", "rows/pair", "B sent/rank", "flat ms", "hier ms", "h/f");
  for (int64_t rows : s.rows) {
    CountMatrix c(P, P);
    for (auto& v : c.v) v = rows;
    const A2ALayout l = A2ALayout::uniform(P, rows);
    std::vector<std::byte> send(size_t(P * rows) * s.row_bytes), a(send.size()), b(send.size());
    for (size_t i = 0; i < send.size(); ++i) send[i] = std::byte((i * 131 + size_t(w.rank()) * 7) & 0xff);
    auto flat = [&] { w.all_to_allv(send.data(), a.data(), l, s.row_bytes), w.barrier(); };
    auto two = [&] { hier.all_to_allv(send.data(), b.data(), l, c, s.row_bytes), w.barrier(); };
    const auto [tf, th] = median_ms_interleaved(s.reps, flat, two);
    int same = a == b, all_same = 0;
    std::vector<int> all(static_cast<size_t>(P));
    w.all_gather(&same, all.data(), sizeof(int));
    for (int v : all) all_same += v;
    if (w.rank() == 0)
      std::printf("%10lld %14lld %10.3f %10.3f %8.2f%s\n", (long long)rows, (long long)(P * rows * int64_t(s.row_bytes)),
                  tf, th, th / tf, all_same == P ? "" : "  RECEIVE BUFFERS DIFFER");
    if (all_same != P) fail("receive buffers differ");
  }
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  try {
    auto w = moe::make_world_comm();
    moe::run_collectively(*w, [&] { moe::bench::run(*w, moe::bench::parse(argc, argv)); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "a2a_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
