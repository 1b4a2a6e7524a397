// The hierarchical all-to-all (src/comm/hier_a2a.h) against the flat
// all_to_allv on random ragged layouts: the receive buffers must be equal
// byte for byte, untouched positions included. Hosts come from
// MOE_RANKS_PER_HOST (set alike on every rank for each case): 2 hosts x 2
// ranks, hosts interleaved in the communicator's order, one host, one rank
// per host, unequal hosts.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "comm/hier_a2a.h"
#include "moe/mesh.h"
#include "mpi_env.h"

namespace moe::testing {
namespace {

// MOE_RANKS_PER_HOST for the scope (empty: unset).
struct HostsEnv : ScopedEnv {
  explicit HostsEnv(const std::string& v) : ScopedEnv("MOE_RANKS_PER_HOST", v) {}
};

// A random ragged exchange, the same on every rank: counts [P, P] in
// [0, max_count] (some rows or columns all zero), blocks with random gaps
// on both sides.
struct Exchange {
  CountMatrix counts;
  A2ALayout mine;
  int64_t send_elems = 0, recv_elems = 0;
};

Exchange random_exchange(int P, int me, uint32_t seed, int max_count) {
  std::mt19937 rng(seed);
  Exchange x;
  x.counts = CountMatrix(P, P);
  const int zero_row = int(rng() % uint32_t(P + 1)) - 1;  // -1: none
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j) x.counts.at(i, j) = i == zero_row ? 0 : int64_t(rng() % uint32_t(max_count + 1));
  std::vector<std::vector<int64_t>> gaps(size_t(P), std::vector<int64_t>(size_t(2 * P)));
  for (auto& g : gaps)
    for (auto& v : g) v = (rng() % 3 == 0) ? int64_t(rng() % 3) : 0;  // mostly packed
  const auto& mg = gaps[size_t(me)];
  for (int j = 0; j < P; ++j) {
    x.send_elems += mg[size_t(j)];
    x.mine.send_offsets.push_back(x.send_elems);
    x.mine.send_counts.push_back(x.counts.at(me, j));
    x.send_elems += x.counts.at(me, j);
  }
  for (int i = 0; i < P; ++i) {
    x.recv_elems += mg[size_t(P + i)];
    x.mine.recv_offsets.push_back(x.recv_elems);
    x.mine.recv_counts.push_back(x.counts.at(i, me));
    x.recv_elems += x.counts.at(i, me);
  }
  return x;
}

// Element bytes: (src, dst, k) tags, padded to an odd size so offsets in
// bytes are checked too.
constexpr size_t kElem = 13;

std::vector<std::byte> tagged_send(const Exchange& x, int me) {
  std::vector<std::byte> buf(size_t(x.send_elems) * kElem, std::byte{0xEE});
  for (size_t j = 0; j < x.mine.send_counts.size(); ++j)
    for (int64_t k = 0; k < x.mine.send_counts[j]; ++k) {
      const int32_t tag[3] = {me, int32_t(j), int32_t(k)};
      std::memcpy(buf.data() + size_t(x.mine.send_offsets[j] + k) * kElem, tag, sizeof tag);
    }
  return buf;
}

// Runs `trials` random exchanges flat and hierarchical; returns the number of
// trials whose receive buffers differ on this rank.
int compare_trials(Communicator& comm, const HierAllToAll& hier, int trials, uint32_t seed0, int max_count) {
  int bad = 0;
  for (int t = 0; t < trials; ++t) {
    const Exchange x = random_exchange(comm.size(), comm.rank(), seed0 + uint32_t(t), max_count);
    const std::vector<std::byte> send = tagged_send(x, comm.rank());
    std::vector<std::byte> flat(size_t(x.recv_elems) * kElem + 1, std::byte{0x5A}), two = flat;
    comm.all_to_allv(send.data(), flat.data(), x.mine, kElem);
    const CollStat before = comm.counters().get(CollKind::A2A);
    hier.all_to_allv(send.data(), two.data(), x.mine, x.counts, kElem);
    EXPECT_EQ(comm.counters().get(CollKind::A2A).count - before.count, 2) << "one A2A per phase";
    bad += flat != two;
  }
  return bad;
}

TEST(HierA2A, TwoHostsTimesTwoRanksByteExact) {
  Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks (2 hosts x 2)";
  HostsEnv env("2");
  HierAllToAll hier(w);
  ASSERT_TRUE(hier.usable());
  EXPECT_EQ(hier.hosts().describe(), "2 hosts x 2 ranks");
  EXPECT_EQ(hier.hosts().host[size_t(w.rank())], w.rank() / 2);
  EXPECT_EQ(compare_trials(w, hier, 40, 100, 5), 0);
  EXPECT_EQ(compare_trials(w, hier, 5, 900, 0), 0);     // every count zero
  EXPECT_EQ(compare_trials(w, hier, 5, 700, 300), 0);   // larger messages
}

// Hosts interleaved in the communicator's rank order: comm ranks {0, 2} on
// one host, {1, 3} on the other (the receive side takes the staging path).
TEST(HierA2A, InterleavedHostsByteExact) {
  Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  HostsEnv env("2");
  const int key = (w.rank() % 2) * 2 + w.rank() / 2;  // world 0,1,2,3 -> comm 0,2,1,3
  std::unique_ptr<Communicator> c = w.split(0, key);
  HierAllToAll hier(*c);
  ASSERT_TRUE(hier.usable());
  EXPECT_EQ(hier.hosts().members[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(hier.hosts().members[1], (std::vector<int>{1, 3}));
  EXPECT_EQ(compare_trials(*c, hier, 30, 300, 4), 0);
}

// One host, one rank per host, unequal hosts: the two phases would not
// differ from the flat exchange (or cannot run): not usable, on every rank.
TEST(HierA2A, DegenerateHostLayouts) {
  Communicator& w = world();
  const int P = w.size();
  struct Case {
    std::string env, want;
  };
  std::vector<Case> cases = {{std::to_string(P), "1 host x " + std::to_string(P) + " ranks"},
                             {"1", std::to_string(P) + " hosts x 1 rank"}};
  if (P == 4) cases.push_back({"3", "2 hosts with 3, 1 ranks"});
  for (const Case& k : cases) {
    HostsEnv env(k.env);
    HierAllToAll hier(w);
    EXPECT_FALSE(hier.usable()) << "MOE_RANKS_PER_HOST='" << k.env << "'";
    EXPECT_EQ(hier.hosts().describe(), k.want) << "MOE_RANKS_PER_HOST='" << k.env << "'";
  }
}

// Without the override the hosts are MPI's (the shared-memory split): on one
// machine one host, not usable; on the cluster harness (tests/cluster/) its
// real hosts, usable where they hold equal numbers of several ranks each.
TEST(HierA2A, HostsFromMpiWithoutTheOverride) {
  Communicator& w = world();
  const int P = w.size();
  HostsEnv env("");
  std::unique_ptr<Communicator> mine = w.split_by_host(w.rank());
  const int local = mine->size();
  int hosts = 0;  // ranks that are the first of their host
  {
    const uint8_t first = mine->rank() == 0 ? 1 : 0;
    std::vector<uint8_t> all(static_cast<size_t>(P));
    w.all_gather(&first, all.data(), 1);
    for (uint8_t f : all) hosts += f;
  }
  HierAllToAll hier(w);
  if (hosts == 1) {
    EXPECT_FALSE(hier.usable());
    EXPECT_EQ(hier.hosts().describe(), "1 host x " + std::to_string(P) + " ranks");
  } else if (hosts * local == P && local > 1) {
    EXPECT_TRUE(hier.usable());
    EXPECT_EQ(hier.hosts().describe(), std::to_string(hosts) + " hosts x " + std::to_string(local) + " ranks");
  } else if (local == 1 && hosts == P) {
    EXPECT_FALSE(hier.usable());
    EXPECT_EQ(hier.hosts().describe(), std::to_string(P) + " hosts x 1 rank");
  }
}

TEST(HierA2A, CountMatrixMustMatchTheLayout) {
  Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  HostsEnv env("2");
  HierAllToAll hier(w);
  Exchange x = random_exchange(4, w.rank(), 5, 3);
  x.counts.at(w.rank(), 0) += 1;  // the same mistake on every rank: every rank throws before sending
  std::vector<std::byte> send(size_t(x.send_elems + 1) * kElem), recv(size_t(x.recv_elems + 4) * kElem);
  EXPECT_THROW(hier.all_to_allv(send.data(), recv.data(), x.mine, x.counts, kElem), Error);
}

TEST(HierA2A, BadOverrideIsAnErrorNamingTheVariable) {
  HostsEnv env("two");
  try {
    ranks_per_host_override();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MOE_RANKS_PER_HOST"), std::string::npos) << e.what();
  }
}

// The mesh builds the expert axis's hierarchy: ep4 spans both hosts of a
// 2 x 2 layout; in fsdp2 x ep2 each expert group lives on one host.
TEST(HierA2A, MeshExpertAxis) {
  Communicator& w = world();
  if (w.size() != 4) GTEST_SKIP() << "needs 4 ranks";
  HostsEnv env("2");
  Mesh ep4(w, MeshShape{1, 1, 4});
  ASSERT_NE(ep4.expert_hier(), nullptr);
  EXPECT_TRUE(ep4.expert_hier()->usable());
  Mesh fsdp_ep(w, MeshShape{1, 2, 2});
  ASSERT_NE(fsdp_ep.expert_hier(), nullptr);
  EXPECT_FALSE(fsdp_ep.expert_hier()->usable());
  EXPECT_EQ(fsdp_ep.expert_hier()->hosts().describe(), "1 host x 2 ranks");
}

}  // namespace
}  // namespace moe::testing
