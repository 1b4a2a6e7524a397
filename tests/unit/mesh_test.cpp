// Mesh resolution (values, -1, errors) and coordinates.
#include <gtest/gtest.h>

#include "moe/mesh.h"

namespace moe {
namespace {

std::string error_of(int64_t d, int64_t f, int64_t e, int world, bool launched) {
  try {
    resolve_mesh_shape(d, f, e, world, launched);
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

TEST(MeshResolve, ValuesAndRest) {
  EXPECT_EQ(resolve_mesh_shape(1, 1, 1, 1, false), (MeshShape{1, 1, 1}));
  EXPECT_EQ(resolve_mesh_shape(2, 1, 2, 4, true), (MeshShape{2, 1, 2}));
  EXPECT_EQ(resolve_mesh_shape(-1, 2, 1, 8, true), (MeshShape{4, 2, 1}));
  EXPECT_EQ(resolve_mesh_shape(1, -1, 2, 8, true), (MeshShape{1, 4, 2}));
  EXPECT_EQ(resolve_mesh_shape(1, 1, -1, 1, false), (MeshShape{1, 1, 1}));
}

TEST(MeshResolve, ErrorsNameTheValuesAndWorldSize) {
  std::string m = error_of(2, 2, 1, 2, true);
  EXPECT_NE(m.find("data_parallelism=2, fsdp_parallelism=2, expert_parallelism=1"), std::string::npos) << m;
  EXPECT_NE(m.find("world size 2"), std::string::npos) << m;
  EXPECT_NE(error_of(-1, -1, 1, 4, true).find("at most one"), std::string::npos);
  EXPECT_NE(error_of(0, 1, 1, 1, false).find(">= 1"), std::string::npos);
  EXPECT_NE(error_of(-1, 3, 1, 4, true).find("does not divide"), std::string::npos);
}

TEST(MeshResolve, MultiRankConfigWithoutLauncherHintsAtMpirun) {
  std::string m = error_of(1, 1, 4, 1, false);
  EXPECT_NE(m.find("expert_parallelism=4"), std::string::npos) << m;
  EXPECT_NE(m.find("mpirun"), std::string::npos) << m;
}

TEST(MeshShape, RankMajorCoordinates) {
  MeshShape s{2, 3, 4};
  for (int r = 0; r < s.size(); ++r) {
    MeshCoords c = s.coords_of(r);
    EXPECT_EQ(r, (c.data * 3 + c.fsdp) * 4 + c.expert);
    EXPECT_EQ(s.rank_of(c), r);
  }
  MeshCoords c = s.coords_of(17);  // 17 = (1*3 + 1)*4 + 1
  EXPECT_EQ(c.data, 1);
  EXPECT_EQ(c.fsdp, 1);
  EXPECT_EQ(c.expert, 1);
}

TEST(Mesh, SingleProcessSubCommunicators) {
  auto world = make_single_process_comm();
  Mesh mesh(*world, MeshShape{});
  EXPECT_EQ(mesh.comm({"expert"}).size(), 1);
  EXPECT_EQ(mesh.comm(std::vector<std::string>{}).size(), 1);
  EXPECT_EQ(mesh.comm({"data", "fsdp", "expert"}).size(), 1);
  EXPECT_EQ(mesh.index({"fsdp", "expert"}), 0);
  EXPECT_THROW(mesh.comm({"tensor"}), Error);
  EXPECT_THROW(mesh.comm({"fsdp", "fsdp"}), Error);
  EXPECT_THROW(Mesh(*world, MeshShape{1, 2, 1}), Error);
  // Sub-communicators report into the world's counters.
  float x = 1, y = 0;
  mesh.comm({"expert"}).all_reduce_sum(&x, &y, 1);
  EXPECT_EQ(world->counters().get(CollKind::AR).count, 1);
}

}  // namespace
}  // namespace moe
