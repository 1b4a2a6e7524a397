// The offload model (include/moe/offload.h) and the target check
// (include/moe/topology.h), mirroring the seed's sparsecore_test: target
// parsing, the capability table, the per-collective gate with the transpose
// rule, warn-and-drop, and validation against a described target.
#include "moe/offload.h"

#include <gtest/gtest.h>

#include "moe/error.h"
#include "moe/topology.h"

namespace moe {
namespace {

using C = Collective;
using T = OffloadTarget;

// Synthetic rows, like the seed's chip table entries.
Capability full() {
  return {"full", true, {C::all_gather, C::reduce_scatter, C::all_reduce, C::all_to_all}, ""};
}
Capability no_all_gather() { return {"no-ag", true, {C::reduce_scatter, C::all_reduce, C::all_to_all}, ""}; }
Capability only_rs() { return {"only-rs", true, {C::reduce_scatter}, ""}; }
Capability only_ag() { return {"only-ag", true, {C::all_gather}, ""}; }
Capability none() { return {"none", false, {}, "no side engine here"}; }

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Offload, NamesAndTransposes) {
  EXPECT_STREQ(collective_name(C::reduce_scatter), "reduce_scatter");
  EXPECT_STREQ(target_name(T::ep_collectives), "ep_collectives");
  EXPECT_EQ(transpose_of(C::all_gather), C::reduce_scatter);
  EXPECT_EQ(transpose_of(C::reduce_scatter), C::all_gather);
  EXPECT_EQ(transpose_of(C::all_to_all), C::all_to_all);
  EXPECT_EQ(transpose_of(C::all_reduce), C::all_reduce);
}

TEST(Offload, EmptyAndBlankTargetsResolveToNothing) {
  for (const char* s : {"", " ", " , ,", ","}) {
    ResolvedOffload r = resolve_offload(s, none(), true, 0);  // no side engine needed for nothing
    EXPECT_TRUE(r.live.empty()) << s;
    EXPECT_TRUE(r.warnings.empty()) << s;
    EXPECT_FALSE(r.offload(T::ep_collectives, C::all_to_all));
  }
}

TEST(Offload, AllExpandsAndSpacesAreIgnored) {
  ResolvedOffload r = resolve_offload(" all ", full(), true);
  EXPECT_EQ(r.live, (std::set<T>{T::fsdp_all_gather, T::ep_collectives, T::ragged_sort}));
  EXPECT_TRUE(r.warnings.empty());
  r = resolve_offload(" ragged_sort, ep_collectives ,", full(), true);
  EXPECT_EQ(r.live, (std::set<T>{T::ep_collectives, T::ragged_sort}));
  EXPECT_TRUE(r.offload(T::ep_collectives, C::all_gather));
  EXPECT_FALSE(r.offload(T::fsdp_all_gather, C::all_gather)) << "not requested";
  EXPECT_FALSE(r.offload(T::ep_collectives, C::all_reduce)) << "ep_collectives moves no all_reduce";
}

TEST(Offload, UnknownTargetIsAnErrorNamingIt) {
  std::string msg = error_of([] { resolve_offload("fsdp_all_gather,tensor_core", full(), true); });
  EXPECT_NE(msg.find("'tensor_core'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("valid targets: fsdp_all_gather, ep_collectives, ragged_sort, all"), std::string::npos);
}

TEST(Offload, NoSideEngineRejectsEveryTarget) {
  for (const char* s : {"all", "ragged_sort", "fsdp_all_gather", "ep_collectives"}) {
    std::string msg = error_of([&] { resolve_offload(s, none(), true); });
    EXPECT_NE(msg.find("needs a side engine, but backend none has none"), std::string::npos) << msg;
    msg = error_of([&] { resolve_offload(s, full(), false, 0); });
    EXPECT_NE(msg.find("needs a side engine, but side_engine_threads is 0"), std::string::npos) << msg;
  }
}

TEST(Offload, NoAllGatherKeepsEpAndSortDropsFsdpWithOneWarning) {
  ResolvedOffload r = resolve_offload("all", no_all_gather(), true);
  EXPECT_EQ(r.live, (std::set<T>{T::ep_collectives, T::ragged_sort}));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("fsdp_all_gather dropped on backend no-ag"), std::string::npos)
      << r.warnings[0];
  EXPECT_NE(r.warnings[0].find("all_gather cannot run on the side engine"), std::string::npos)
      << r.warnings[0];
  // Per-collective gate inside ep_collectives: all-to-alls move, the
  // all-gathers and (by the transpose rule) reduce-scatters stay.
  EXPECT_TRUE(r.offload(T::ep_collectives, C::all_to_all));
  EXPECT_FALSE(r.offload(T::ep_collectives, C::all_gather));
  EXPECT_FALSE(r.offload(T::ep_collectives, C::reduce_scatter));
  EXPECT_FALSE(r.offload(T::fsdp_all_gather, C::all_gather));
  EXPECT_TRUE(r.is_live(T::ragged_sort));
}

TEST(Offload, ReduceScatterWithoutAllGatherDependsOnTraining) {
  // Training: the reduce-scatter's backward is an all-gather, so neither moves.
  ResolvedOffload r = resolve_offload("ep_collectives,fsdp_all_gather", only_rs(), true);
  EXPECT_FALSE(can_offload(only_rs(), C::reduce_scatter, true));
  EXPECT_FALSE(can_offload(only_rs(), C::all_gather, true));
  EXPECT_TRUE(r.side.empty());
  EXPECT_TRUE(r.live.empty()) << "ep_collectives needs all_to_all, fsdp_all_gather needs all_gather";
  EXPECT_EQ(r.warnings.size(), 2u);
  // Forward only: no backward, so the reduce-scatter alone may move; the
  // all-gather still cannot (it is not in the table at all).
  EXPECT_TRUE(can_offload(only_rs(), C::reduce_scatter, false));
  EXPECT_FALSE(can_offload(only_rs(), C::all_gather, false));
  r = resolve_offload("fsdp_all_gather", only_rs(), false);
  EXPECT_TRUE(r.live.empty());
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.side, (std::set<C>{C::reduce_scatter}));
}

TEST(Offload, AllGatherWithoutReduceScatterIsForwardOnly) {
  ResolvedOffload r = resolve_offload("fsdp_all_gather", only_ag(), true);
  EXPECT_TRUE(r.live.empty());
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("transpose reduce_scatter (run in the backward when training) cannot"),
            std::string::npos)
      << r.warnings[0];
  r = resolve_offload("fsdp_all_gather", only_ag(), false);
  EXPECT_EQ(r.live, std::set<T>{T::fsdp_all_gather});
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_TRUE(r.offload(T::fsdp_all_gather, C::all_gather));
  EXPECT_FALSE(r.offload(T::fsdp_all_gather, C::reduce_scatter));
}

TEST(Offload, BuiltinTable) {
  EXPECT_EQ(builtin_backends(), (std::vector<std::string>{"mpi-funneled", "mpi-multiple", "mpi-serialized",
                                                          "mpi-single", "single-process"}));
  ResolvedOffload r = resolve_offload("all", builtin_capability("mpi-multiple"), true);
  EXPECT_EQ(r.live.size(), 3u);
  EXPECT_TRUE(r.offload(T::fsdp_all_gather, C::reduce_scatter));
  r = resolve_offload("all", builtin_capability("single-process"), true);
  EXPECT_EQ(r.live.size(), 3u);
  r = resolve_offload("all", builtin_capability("mpi-serialized"), true);  // the seed's v5p row
  EXPECT_EQ(r.live, (std::set<T>{T::ep_collectives, T::ragged_sort}));
  EXPECT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.side, std::set<C>{C::all_to_all});
  for (const char* b : {"mpi-funneled", "mpi-single"})
    EXPECT_NE(error_of([&] { resolve_offload("ragged_sort", builtin_capability(b), true); }), "") << b;
  std::string msg = error_of([] { builtin_capability("mpi-turbo"); });
  EXPECT_NE(msg.find("unknown backend 'mpi-turbo' (known backends: mpi-funneled"), std::string::npos) << msg;
}

TEST(Offload, PlanText) {
  ResolvedOffload r = resolve_offload("all", builtin_capability("mpi-serialized"), true);
  std::string plan = format_offload_plan(r, builtin_capability("mpi-serialized"));
  EXPECT_NE(plan.find("backend mpi-serialized, training"), std::string::npos) << plan;
  EXPECT_NE(plan.find("ep_collectives: all_to_all -> side all_gather -> compute reduce_scatter -> compute"),
            std::string::npos)
      << plan;
  EXPECT_NE(plan.find("ragged_sort: routing index math -> side"), std::string::npos) << plan;
  EXPECT_NE(plan.find("warning: moe_offload_targets: fsdp_all_gather dropped"), std::string::npos) << plan;
  plan = format_offload_plan(resolve_offload("", full(), true), full());
  EXPECT_NE(plan.find("no live targets"), std::string::npos) << plan;
}

TEST(Topology, ParseAndDefaults) {
  Topology t = parse_topology("ranks=8, cores=4,mpi_thread=multiple");
  EXPECT_EQ(t.ranks, 8);
  EXPECT_EQ(t.cores, 4);
  EXPECT_EQ(t.backend, "mpi-multiple");
  EXPECT_EQ(parse_topology("").backend, "single-process");
  EXPECT_EQ(parse_topology("ranks=1,mpi_thread=funneled").backend, "mpi-funneled");
  EXPECT_EQ(parse_topology("ranks=2,backend=mpi-serialized").backend, "mpi-serialized");
  EXPECT_EQ(t.describe(), "ranks=8, cores=4, mpi_thread=multiple, backend=mpi-multiple");
  for (const char* bad :
       {"ranks=0", "ranks=x", "cores=-2", "mpi_thread=parallel", "gpus=2", "ranks", "ranks=4", "backend=tpu"})
    EXPECT_NE(error_of([&] { parse_topology(bad); }).find("--topology"), std::string::npos) << bad;
  // Ranks and cores are ints to MPI and the mesh: 2^32 + 1 ranks once checked the mesh of 1 rank.
  for (const char* big : {"ranks=4294967297,mpi_thread=multiple", "cores=2147483648"})
    EXPECT_NE(error_of([&] { parse_topology(big); }).find("must be an integer in [1, 2147483647]"),
              std::string::npos)
        << big;
  EXPECT_EQ(parse_topology("ranks=2147483647,mpi_thread=single").ranks, 2147483647);
}

TEST(Topology, MeshProduct) {
  Config c;
  EXPECT_TRUE(mesh_problems(c, 1).empty());
  ASSERT_EQ(mesh_problems(c, 8).size(), 1u);
  EXPECT_NE(mesh_problems(c, 8)[0].find("the product does not equal the world size 8"), std::string::npos);
  c.expert_parallelism = 4;
  c.data_parallelism = -1;
  EXPECT_TRUE(mesh_problems(c, 8).empty());
  EXPECT_EQ(mesh_problems(c, 6).size(), 1u);
  c.data_parallelism = 2;
  EXPECT_TRUE(mesh_problems(c, 8).empty());
}

TEST(Topology, CheckTargetCollectsProblemsAndWarnings) {
  Config c;
  c.moe_offload_targets = "all";
  TargetCheck chk = check_target(c, parse_topology("ranks=1,cores=2,mpi_thread=serialized"), true);
  EXPECT_TRUE(chk.problems.empty());
  EXPECT_EQ(chk.offload.live.size(), 2u);
  EXPECT_EQ(chk.warnings.size(), 1u);
  chk = check_target(c, parse_topology("ranks=2,mpi_thread=funneled"), true);
  ASSERT_EQ(chk.problems.size(), 2u);  // mesh size, no side engine
  EXPECT_NE(chk.problems[1].find("backend mpi-funneled has none"), std::string::npos) << chk.problems[1];
  chk = check_target(c, parse_topology("ranks=1,cores=1"), true);
  EXPECT_TRUE(chk.problems.empty());
  ASSERT_EQ(chk.warnings.size(), 1u);
  EXPECT_NE(chk.warnings[0].find("side_engine_threads=1 takes all 1 cores"), std::string::npos);
  chk = check_target(Config{}, this_machine(), true);
  EXPECT_TRUE(chk.problems.empty());
  EXPECT_TRUE(chk.warnings.empty());
  EXPECT_EQ(chk.topology.backend, "single-process");
}

}  // namespace
}  // namespace moe
