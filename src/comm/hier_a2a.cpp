#include "comm/hier_a2a.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "core/allocator.h"
#include "moe/error.h"

namespace moe {
namespace {

// A staging buffer from the engine's caching allocator (src/core/allocator.h),
// not a fresh std::vector: MPI moving freshly mmap'd pages was ~20x slower
// (an 8 MiB-per-rank all_to_allv over 4 ranks on one machine, timed by a
// throwaway program: 952 ms with new buffers each call against 47 ms with
// reused ones; docs/distributed.md).
class Staging {
 public:
  explicit Staging(size_t bytes) : n_((std::max<size_t>(bytes, 1) + 63) / 64 * 64) {
    p_ = alloc::acquire(n_, 64);
    if (!p_) fail("[hierarchical all_to_allv] out of memory for a staging buffer of ", n_, " bytes");
  }
  ~Staging() { alloc::release(p_, n_); }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(p_); }

 private:
  size_t n_;
  void* p_;
};

// Copies n elements (eb bytes each) from src[src_at] to dst[dst_at].
void copy_elems(std::byte* dst, int64_t dst_at, const std::byte* src, int64_t src_at, int64_t n, size_t eb) {
  if (n > 0) std::memcpy(dst + size_t(dst_at) * eb, src + size_t(src_at) * eb, size_t(n) * eb);
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// Blocks packed in rank order on both sides.
A2ALayout packed(const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  return A2ALayout{send, exclusive_cumsum(send), recv, exclusive_cumsum(recv)};
}

// Every rank's (host leader, local index), then hosts numbered by leader.
HostMap gather_host_map(Communicator& comm, Communicator& intra) {
  int leader = comm.rank();  // the host's lowest rank: intra rank 0 (intra is ordered by rank)
  intra.broadcast(&leader, sizeof leader, 0);
  const int P = comm.size();
  const int mine[2] = {leader, intra.rank()};
  std::vector<int> all(size_t(2 * P));
  comm.gatherv(mine, sizeof mine, all.data(), std::vector<size_t>(size_t(P), sizeof mine), 0);
  comm.broadcast(all.data(), all.size() * sizeof(int), 0);
  std::vector<int> leaders;
  for (int r = 0; r < P; ++r) leaders.push_back(all[size_t(2 * r)]);
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  HostMap m;
  m.members.resize(leaders.size());
  for (int r = 0; r < P; ++r) {
    const int h = int(std::lower_bound(leaders.begin(), leaders.end(), all[size_t(2 * r)]) - leaders.begin());
    const int l = all[size_t(2 * r + 1)];
    m.host.push_back(h);
    m.local.push_back(l);
    auto& mem = m.members[size_t(h)];
    if (int(mem.size()) <= l) mem.resize(size_t(l) + 1, -1);
    MOE_ASSERT(mem[size_t(l)] == -1, "gather_host_map: two ranks with one local index");
    mem[size_t(l)] = r;
  }
  for (const auto& mem : m.members)
    for (int r : mem) MOE_ASSERT(r >= 0, "gather_host_map: a host's local indices have a gap");
  return m;
}

void check_counts(const A2ALayout& mine, const CountMatrix& c, int P, int me) {
  if (c.rows != P || c.cols != P)
    fail("[hierarchical all_to_allv] count matrix is [", c.rows, ", ", c.cols, "], expected [", P, ", ", P, "]");
  for (int j = 0; j < P; ++j) {
    if (mine.send_counts[size_t(j)] != c.at(me, j))
      fail("[hierarchical all_to_allv] send count to rank ", j, " is ", mine.send_counts[size_t(j)],
           ", the count matrix says ", c.at(me, j));
    if (mine.recv_counts[size_t(j)] != c.at(j, me))
      fail("[hierarchical all_to_allv] receive count from rank ", j, " is ", mine.recv_counts[size_t(j)],
           ", the count matrix says ", c.at(j, me));
  }
}

// Where host h's block lands in the receive buffer when its ranks' segments
// lie back to back there in local order (so phase 2 writes them in place);
// -1 otherwise. Segments of zero elements are not written and do not count.
int64_t direct_offset(const A2ALayout& mine, const std::vector<int>& ranks) {
  int64_t start = -1, next = 0;
  for (int s : ranks) {
    const int64_t n = mine.recv_counts[size_t(s)], at = mine.recv_offsets[size_t(s)];
    if (n == 0) continue;
    if (start < 0) start = at;
    else if (at != next) return -1;
    next = at + n;
  }
  return start < 0 ? 0 : start;
}

}  // namespace

int HostMap::ranks_per_host() const {
  if (members.empty()) return 0;
  for (const auto& m : members)
    if (m.size() != members[0].size()) return 0;
  return int(members[0].size());
}

std::string HostMap::describe() const {
  std::ostringstream os;
  const int L = ranks_per_host();
  os << hosts() << (hosts() == 1 ? " host" : " hosts");
  if (L > 0) {
    os << " x " << L << (L == 1 ? " rank" : " ranks");
  } else {
    os << " with ";
    for (size_t h = 0; h < members.size(); ++h) os << (h ? ", " : "") << members[h].size();
    os << " ranks";
  }
  return os.str();
}

HierAllToAll::HierAllToAll(Communicator& comm) : comm_(comm) {
  intra_ = comm.split_by_host(comm.rank());
  intra_->set_polite_waits_from(0);  // one host: MPI's shared memory, moved by the ranks' own polls
  map_ = gather_host_map(comm, *intra_);
  const int me = comm.rank();
  if (map_.hosts() > 1 && map_.ranks_per_host() > 1)  // the same answer on every rank
    lane_ = comm.split(map_.local[size_t(me)], map_.host[size_t(me)]);
  else
    intra_.reset();
}

HierAllToAll::~HierAllToAll() = default;

void HierAllToAll::all_to_allv(const void* send, void* recv, const A2ALayout& mine, const CountMatrix& c,
                               size_t eb) const {
  MOE_ASSERT(usable(), "HierAllToAll::all_to_allv: one host or one rank per host (use the flat all-to-all)");
  const int P = comm_.size(), me = comm_.rank(), H = map_.hosts(), L = map_.ranks_per_host();
  if (mine.send_counts.size() != size_t(P) || mine.recv_counts.size() != size_t(P) ||
      mine.send_offsets.size() != size_t(P) || mine.recv_offsets.size() != size_t(P))
    fail("[hierarchical all_to_allv] layout needs ", P, " entries per vector (one per rank)");
  check_counts(mine, c, P, me);
  const int hm = map_.host[size_t(me)], lm = map_.local[size_t(me)];
  const auto& M = map_.members;
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);

  // Phase 1 (host): to local rank l' the rows for ranks (h'', l'), by h''.
  std::vector<int64_t> s1(size_t(L), 0), r1(size_t(L), 0);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      s1[size_t(l)] += c.at(me, M[size_t(h)][size_t(l)]);
      r1[size_t(l)] += c.at(M[size_t(hm)][size_t(l)], M[size_t(h)][size_t(lm)]);
    }
  const A2ALayout l1 = packed(s1, r1);
  auto b1 = std::make_unique<Staging>(size_t(total(s1)) * eb);
  auto b2 = std::make_unique<Staging>(size_t(total(r1)) * eb);
  int64_t pos = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const int d = M[size_t(h)][size_t(l)];
      copy_elems(b1->data(), pos, in, mine.send_offsets[size_t(d)], c.at(me, d), eb);
      pos += c.at(me, d);
    }
  intra_->all_to_allv(b1->data(), b2->data(), l1, eb);
  b1.reset();

  // Phase 2 (lane): to host h'' (rank (h'', lm)) the rows of every local
  // source l for it, by l: one message per host pair and lane.
  std::vector<int64_t> at(size_t(L) * size_t(H));  // start in b2 of (source l, host h'')
  for (int l = 0; l < L; ++l) {
    int64_t cur = l1.recv_offsets[size_t(l)];
    for (int h = 0; h < H; ++h) {
      at[size_t(l) * size_t(H) + size_t(h)] = cur;
      cur += c.at(M[size_t(hm)][size_t(l)], M[size_t(h)][size_t(lm)]);
    }
  }
  std::vector<int64_t> s2(size_t(H), 0), r2(size_t(H), 0);
  Staging b3(size_t(total(r1)) * eb);
  pos = 0;
  for (int h = 0; h < H; ++h)
    for (int l = 0; l < L; ++l) {
      const int64_t n = c.at(M[size_t(hm)][size_t(l)], M[size_t(h)][size_t(lm)]);
      copy_elems(b3.data(), pos, b2->data(), at[size_t(l) * size_t(H) + size_t(h)], n, eb);
      pos += n;
      s2[size_t(h)] += n;
      r2[size_t(h)] += c.at(M[size_t(h)][size_t(l)], me);
    }
  b2.reset();
  A2ALayout l2 = packed(s2, r2);
  bool direct = true;
  for (int h = 0; h < H && direct; ++h) {
    const int64_t off = direct_offset(mine, M[size_t(h)]);
    direct = off >= 0;
    if (direct) l2.recv_offsets[size_t(h)] = off;
  }
  if (direct) return lane_->all_to_allv(b3.data(), recv, l2, eb);
  l2.recv_offsets = exclusive_cumsum(r2);
  Staging b4(size_t(total(r2)) * eb);
  lane_->all_to_allv(b3.data(), b4.data(), l2, eb);
  pos = 0;
  for (int h = 0; h < H; ++h)
    for (int l = 0; l < L; ++l) {
      const int s = M[size_t(h)][size_t(l)];
      copy_elems(out, mine.recv_offsets[size_t(s)], b4.data(), pos, c.at(s, me), eb);
      pos += c.at(s, me);
    }
}

}  // namespace moe
