// The device mesh over MPI ranks (SPEC.md §3): named axes data, fsdp, expert,
// and per-tensor shard specs.
//
// Rank order is rank-major over (data, fsdp, expert), expert fastest:
//   rank = ((d * fsdp) + f) * expert + e
// so the tokens' "all ranks" group in this order is the world itself.
// A sub-communicator over an ordered list of axes (major first) ranks its
// members by their coordinates along those axes, in that order: over
// {"fsdp", "expert"} the member at (f, e) has rank f * expert + e; over
// {"expert", "fsdp"} it has rank e * fsdp + f. That is the order in which a
// tiled all-gather concatenates shards, and the order of the deterministic sums.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moe/comm.h"

namespace moe {

class HierAllToAll;  // src/comm/hier_a2a.h

enum class MeshAxis : int { data = 0, fsdp = 1, expert = 2 };
inline constexpr int kNumMeshAxes = 3;
const char* mesh_axis_name(MeshAxis a);  // "data" | "fsdp" | "expert"
std::optional<MeshAxis> mesh_axis_from_name(std::string_view name);

// Per tensor dimension, the mesh axes it is sharded over, major first
// ({} = replicated). Missing trailing dimensions are replicated.
using ShardSpec = std::vector<std::vector<std::string>>;

struct MeshCoords {
  int data = 0, fsdp = 0, expert = 0;
  int operator[](MeshAxis a) const { return a == MeshAxis::data ? data : a == MeshAxis::fsdp ? fsdp : expert; }
};

struct MeshShape {
  int data = 1, fsdp = 1, expert = 1;
  int size() const { return data * fsdp * expert; }
  int extent(MeshAxis a) const { return a == MeshAxis::data ? data : a == MeshAxis::fsdp ? fsdp : expert; }
  int rank_of(const MeshCoords& c) const { return (c.data * fsdp + c.fsdp) * expert + c.expert; }
  MeshCoords coords_of(int rank) const;
  bool operator==(const MeshShape&) const = default;
};

// Resolves the three parallelism config values against the world size
// without any communication (call it before the first collective). One value
// may be -1 (the rest); the product must equal world_size. Errors name the
// three keys with their values and the world size; a single process that was
// not started by a launcher gets the hint to use mpirun.
MeshShape resolve_mesh_shape(int64_t data, int64_t fsdp, int64_t expert, int world_size, bool launched);
// Same, with `launched` = launched_by_mpi().
MeshShape resolve_mesh_shape(int64_t data, int64_t fsdp, int64_t expert, int world_size);

// The mesh over a world communicator. Thread safety: const methods may be
// called from any thread; each sub-communicator follows Communicator's rules.
class Mesh {
 public:
  // Collective over `world` (which must outlive the mesh): creates one
  // sub-communicator per ordered list of distinct axes (16 splits, including
  // the empty list = this rank alone), and the expert axis's host map (a host
  // split, a broadcast, a gatherv; uncounted). Where the ranks span hosts and
  // a machine has more of them than cores, the groups across hosts wait
  // politely for large transfers (Communicator::set_polite_waits_from; a
  // gatherv, a broadcast and host splits over the world and each group,
  // uncounted).
  // world.size() must equal shape.size().
  Mesh(Communicator& world, MeshShape shape);
  ~Mesh();

  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return coords_; }
  int coord(MeshAxis a) const { return coords_[a]; }
  Communicator& world() const { return world_; }

  // The group of ranks that differ only along `axes` (major first). An
  // unknown or repeated axis name is an error naming it.
  Communicator& comm(const std::vector<std::string>& axes) const;
  Communicator& comm_of(const std::vector<MeshAxis>& axes) const;
  // Coordinates of member `index` of this rank's group along `axes`.
  MeshCoords member_coords(const std::vector<MeshAxis>& axes, int index) const;
  // Product of the axes' extents / this rank's index among them (major first).
  int extent(const std::vector<std::string>& axes) const;
  int index(const std::vector<std::string>& axes) const;
  // The expert axis's hosts and hierarchical all-to-all (built with the mesh
  // when the axis has more than one rank; null otherwise). See
  // docs/distributed.md, "Hierarchical all-to-all".
  const HierAllToAll* expert_hier() const { return expert_hier_.get(); }

 private:
  Communicator& world_;
  MeshShape shape_;
  MeshCoords coords_;
  std::vector<std::unique_ptr<Communicator>> subs_;  // indexed by axes_key()
  std::unique_ptr<HierAllToAll> expert_hier_;
};

// Parses axis names (error naming an unknown or repeated one).
std::vector<MeshAxis> parse_mesh_axes(const std::vector<std::string>& names);

}  // namespace moe
