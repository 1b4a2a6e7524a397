#include "comm/gather_plan.h"

#include <algorithm>
#include <cstring>

#include "moe/error.h"

namespace moe {

std::optional<GatherPlan> all_gather_plan(const ShardSpec& stored, const ShardSpec& needed, int ndim) {
  if (int(stored.size()) > ndim || int(needed.size()) > ndim)
    fail("[all_gather_plan] shard specs have ", stored.size(), " and ", needed.size(), " dims, the tensor has ",
         ndim);
  static const std::vector<std::string> kReplicated;
  GatherPlan plan;
  for (int d = 0; d < ndim; ++d) {
    const auto& s = size_t(d) < stored.size() ? stored[size_t(d)] : kReplicated;
    const auto& n = size_t(d) < needed.size() ? needed[size_t(d)] : kReplicated;
    if (s == n) continue;
    if (n.size() > s.size() || !std::equal(n.begin(), n.end(), s.begin())) return std::nullopt;
    plan.emplace_back(d, std::vector<std::string>(s.begin() + std::ptrdiff_t(n.size()), s.end()));
  }
  return plan;
}

namespace {
// A tensor seen as [outer, extent, inner] around one dimension.
struct DimView {
  int64_t outer = 1, extent = 1, inner = 1;  // inner in elements
};

DimView view_around(const Tensor& t, int dim, const char* op) {
  if (dim < 0 || dim >= t.ndim()) fail("[", op, "] dim ", dim, " out of range for shape ", shape_str(t.shape()));
  DimView v;
  for (int i = 0; i < dim; ++i) v.outer *= t.dim(i);
  v.extent = t.dim(dim);
  for (int i = dim + 1; i < t.ndim(); ++i) v.inner *= t.dim(i);
  return v;
}

Shape with_dim(Shape s, int dim, int64_t extent) {
  s[size_t(dim)] = extent;
  return s;
}

// Copies [outer, len, inner] rows [begin, begin+len) of dim out of `t`.
Tensor slice_dim(const Tensor& t, int dim, int64_t begin, int64_t len) {
  DimView v = view_around(t, dim, "slice_dim");
  Tensor out = Tensor::empty(t.dtype(), with_dim(t.shape(), dim, len));
  const size_t row = size_t(v.inner) * dtype_size(t.dtype());
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(dst + size_t(o * len) * row, src + size_t(o * v.extent + begin) * row, size_t(len) * row);
  return out;
}
}  // namespace

Tensor all_gather_dim(Communicator& comm, const Tensor& local, int dim) {
  // Reads and writes W * local.nbytes() bytes beyond the collective itself.
  DimView v = view_around(local, dim, "all_gather_dim");
  const int64_t w = comm.size();
  // Staging from the engine's allocator (resident pages), not a fresh mapping (see communicator.cpp).
  Tensor staging_t = Tensor::empty(local.dtype(), {w * local.numel()});
  auto* staging = static_cast<char*>(staging_t.raw());
  comm.all_gather(local.raw(), staging, local.nbytes());
  Tensor out = Tensor::empty(local.dtype(), with_dim(local.shape(), dim, v.extent * w));
  const size_t chunk = size_t(v.extent * v.inner) * dtype_size(local.dtype());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t o = 0; o < v.outer; ++o)
    for (int64_t r = 0; r < w; ++r)
      std::memcpy(dst + size_t(o * w + r) * chunk, staging + size_t(r * v.outer + o) * chunk, chunk);
  return out;
}

Tensor reduce_scatter_dim(Communicator& comm, const Tensor& full, int dim) {
  DimView v = view_around(full, dim, "reduce_scatter_dim");
  if (full.dtype() != DType::f32) fail("[reduce_scatter_dim] needs an f32 tensor, got ", dtype_name(full.dtype()));
  const int64_t w = comm.size();
  if (v.extent % w != 0)
    fail("[reduce_scatter_dim] dim ", dim, " of ", shape_str(full.shape()), " does not divide by ", w, " ranks");
  const int64_t blk = v.extent / w;
  const size_t chunk = size_t(blk * v.inner);  // floats of one (outer, rank) piece
  Tensor staging_t = Tensor::empty(DType::f32, {full.numel()});
  float* staging = staging_t.data<float>();
  const float* src = full.data<float>();
  for (int64_t r = 0; r < w; ++r)
    for (int64_t o = 0; o < v.outer; ++o)
      std::memcpy(staging + size_t(r * v.outer + o) * chunk, src + size_t(o * w + r) * chunk,
                  chunk * sizeof(float));
  Tensor out = Tensor::empty(DType::f32, with_dim(full.shape(), dim, blk));
  comm.reduce_scatter_sum(staging, out.data<float>(), size_t(v.outer) * chunk);
  return out;
}

Tensor gather_by_plan(const Mesh& mesh, const Tensor& shard, const GatherPlan& plan) {
  Tensor t = shard;
  for (const auto& [dim, axes] : plan) t = all_gather_dim(mesh.comm(axes), t, dim);
  return t;
}

Tensor reduce_scatter_by_plan(const Mesh& mesh, const Tensor& full_grad, const GatherPlan& plan) {
  Tensor t = full_grad;
  for (auto it = plan.rbegin(); it != plan.rend(); ++it) t = reduce_scatter_dim(mesh.comm(it->second), t, it->first);
  return t;
}

Tensor shard_at(const MeshShape& shape, const MeshCoords& coords, const Tensor& full, const ShardSpec& spec) {
  if (int(spec.size()) > full.ndim())
    fail("[local_shard] spec has ", spec.size(), " dims, the tensor ", shape_str(full.shape()));
  Tensor t = full;
  for (int d = 0; d < int(spec.size()); ++d) {
    int64_t n = 1, idx = 0;
    for (MeshAxis a : parse_mesh_axes(spec[size_t(d)])) {
      n *= shape.extent(a);
      idx = idx * shape.extent(a) + coords[a];
    }
    if (n == 1) continue;
    if (t.dim(d) % n != 0)
      fail("[local_shard] dim ", d, " of ", shape_str(full.shape()), " does not divide by ", n, " shards");
    const int64_t len = t.dim(d) / n;
    t = slice_dim(t, d, idx * len, len);
  }
  return t.raw() == full.raw() ? full.clone() : t;
}

Tensor local_shard(const Mesh& mesh, const Tensor& full, const ShardSpec& spec) {
  return shard_at(mesh.shape(), mesh.coords(), full, spec);
}

Tensor reduce_to_shard(const Mesh& mesh, const Tensor& full_grad, const ShardSpec& spec,
                       const std::vector<std::string>& sum_axes) {
  if (full_grad.dtype() != DType::f32) fail("[reduce_to_shard] needs an f32 gradient");
  // World order over the group: the axes in canonical (data, fsdp, expert) order.
  std::vector<MeshAxis> axes = parse_mesh_axes(sum_axes);
  std::sort(axes.begin(), axes.end());
  Communicator& comm = mesh.comm_of(axes);
  const int w = comm.size();
  Tensor mine = local_shard(mesh, full_grad, spec);
  const size_t block = size_t(mine.numel());
  Tensor send_t = Tensor::empty(DType::f32, {int64_t(w) * int64_t(block)});
  float* send = send_t.data<float>();
  for (int t = 0; t < w; ++t) {
    Tensor piece = shard_at(mesh.shape(), mesh.member_coords(axes, t), full_grad, spec);
    std::memcpy(send + size_t(t) * block, piece.data<float>(), block * sizeof(float));
  }
  comm.reduce_scatter_sum(send, mine.data<float>(), block);
  return mine;
}

}  // namespace moe
