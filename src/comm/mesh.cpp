#include "moe/mesh.h"

#include <sstream>

#include "comm/hier_a2a.h"
#include "comm/machines.h"

#include "moe/error.h"

namespace moe {

const char* mesh_axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::data: return "data";
    case MeshAxis::fsdp: return "fsdp";
    case MeshAxis::expert: return "expert";
  }
  MOE_ASSERT(false, "mesh_axis_name: unknown axis");
  return "";
}

std::optional<MeshAxis> mesh_axis_from_name(std::string_view name) {
  for (int i = 0; i < kNumMeshAxes; ++i)
    if (name == mesh_axis_name(MeshAxis(i))) return MeshAxis(i);
  return std::nullopt;
}

MeshCoords MeshShape::coords_of(int rank) const {
  MOE_ASSERT(rank >= 0 && rank < size(), "MeshShape::coords_of: rank out of range");
  return MeshCoords{rank / (fsdp * expert), (rank / expert) % fsdp, rank % expert};
}

namespace {
std::string values_str(int64_t d, int64_t f, int64_t e) {
  std::ostringstream os;
  os << "data_parallelism=" << d << ", fsdp_parallelism=" << f << ", expert_parallelism=" << e;
  return os.str();
}

[[noreturn]] void size_mismatch(int64_t d, int64_t f, int64_t e, int world, bool launched, const char* why) {
  std::ostringstream os;
  os << values_str(d, f, e) << ": " << why << " the world size " << world;
  if (world == 1 && !launched)
    os << " (this process was not started by mpirun: run it as `mpirun -np N moe ...` with N the product of "
          "the three values)";
  fail(os.str());
}
}  // namespace

MeshShape resolve_mesh_shape(int64_t d, int64_t f, int64_t e, int world, bool launched) {
  int64_t vals[3] = {d, f, e};
  int rest_at = -1;
  int64_t known = 1;
  for (int i = 0; i < 3; ++i) {
    if (vals[i] == -1) {
      if (rest_at >= 0) fail(values_str(d, f, e), ": at most one of them may be -1 (the rest)");
      rest_at = i;
    } else if (vals[i] < 1) {
      fail(values_str(d, f, e), ": each must be >= 1, or -1 for the rest of the world size");
    } else if (__builtin_mul_overflow(known, vals[i], &known)) {
      // Far past any world size (an int): the checks below report the mismatch (was a signed
      // overflow under config_fuzz: fuzz/config/corpus/crash-parallelism_product_overflow).
      known = INT64_MAX;
    }
  }
  if (rest_at >= 0) {
    if (known > world || world % known != 0)
      size_mismatch(d, f, e, world, launched, "the product of the values other than -1 does not divide");
    vals[rest_at] = world / known;
  } else if (known != world) {
    size_mismatch(d, f, e, world, launched, "the product does not equal");
  }
  return MeshShape{int(vals[0]), int(vals[1]), int(vals[2])};
}

MeshShape resolve_mesh_shape(int64_t d, int64_t f, int64_t e, int world) {
  return resolve_mesh_shape(d, f, e, world, launched_by_mpi());
}

std::vector<MeshAxis> parse_mesh_axes(const std::vector<std::string>& names) {
  std::vector<MeshAxis> out;
  for (const auto& n : names) {
    auto a = mesh_axis_from_name(n);
    if (!a) fail("unknown mesh axis '", n, "' (valid: data, fsdp, expert)");
    for (MeshAxis b : out)
      if (b == *a) fail("mesh axis '", n, "' appears twice in one list");
    out.push_back(*a);
  }
  return out;
}

namespace {
// Slot of an ordered list of distinct axes: base-4 digits (axis + 1).
size_t axes_key(const std::vector<MeshAxis>& axes) {
  size_t k = 0;
  for (MeshAxis a : axes) k = k * 4 + size_t(int(a) + 1);
  return k;
}

// Every ordered list of distinct axes, in a fixed order (all ranks agree).
void enumerate_axis_lists(std::vector<MeshAxis>& cur, std::vector<std::vector<MeshAxis>>& out) {
  out.push_back(cur);
  for (int i = 0; i < kNumMeshAxes; ++i) {
    bool used = false;
    for (MeshAxis a : cur) used = used || a == MeshAxis(i);
    if (used) continue;
    cur.push_back(MeshAxis(i));
    enumerate_axis_lists(cur, out);
    cur.pop_back();
  }
}

int index_along(const MeshShape& s, const MeshCoords& c, const std::vector<MeshAxis>& axes) {
  int idx = 0;
  for (MeshAxis a : axes) idx = idx * s.extent(a) + c[a];
  return idx;
}
}  // namespace

Mesh::Mesh(Communicator& world, MeshShape shape) : world_(world), shape_(shape) {
  if (world.size() != shape.size())
    fail("mesh data=", shape.data, " fsdp=", shape.fsdp, " expert=", shape.expert, " needs ", shape.size(),
         " ranks, the communicator has ", world.size());
  coords_ = shape.coords_of(world.rank());
  std::vector<MeshAxis> cur;
  std::vector<std::vector<MeshAxis>> lists;
  enumerate_axis_lists(cur, lists);
  subs_.resize(64);
  for (const auto& axes : lists) {
    MeshCoords rest = coords_;  // the coordinates off `axes` name the group
    for (MeshAxis a : axes) (a == MeshAxis::data ? rest.data : a == MeshAxis::fsdp ? rest.fsdp : rest.expert) = 0;
    subs_[axes_key(axes)] = world.split(shape_.rank_of(rest), index_along(shape_, coords_, axes));
  }
  // Groups across hosts, where a machine runs more ranks than cores, wait politely for large
  // transfers (the hierarchical all-to-all's lanes inherit it from the expert group, its host
  // groups do not).
  if (const size_t from = shared_core_polite_bytes(world); from > 0)
    for (const auto& axes : lists) {
      Communicator& c = *subs_[axes_key(axes)];
      if (spans_hosts(c)) c.set_polite_waits_from(from);
    }
  if (shape_.expert > 1) expert_hier_ = std::make_unique<HierAllToAll>(comm_of({MeshAxis::expert}));
}

Mesh::~Mesh() = default;

Communicator& Mesh::comm_of(const std::vector<MeshAxis>& axes) const {
  size_t k = axes_key(axes);
  MOE_ASSERT(k < subs_.size() && subs_[k], "Mesh::comm: missing sub-communicator");
  return *subs_[k];
}

Communicator& Mesh::comm(const std::vector<std::string>& axes) const { return comm_of(parse_mesh_axes(axes)); }

MeshCoords Mesh::member_coords(const std::vector<MeshAxis>& axes, int index) const {
  MeshCoords c = coords_;
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
    const int n = shape_.extent(*it);
    (*it == MeshAxis::data ? c.data : *it == MeshAxis::fsdp ? c.fsdp : c.expert) = index % n;
    index /= n;
  }
  return c;
}

int Mesh::extent(const std::vector<std::string>& axes) const {
  int n = 1;
  for (MeshAxis a : parse_mesh_axes(axes)) n *= shape_.extent(a);
  return n;
}

int Mesh::index(const std::vector<std::string>& axes) const {
  return index_along(shape_, coords_, parse_mesh_axes(axes));
}

}  // namespace moe
