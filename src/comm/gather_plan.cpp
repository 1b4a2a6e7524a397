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

namespace {
// Per dim, the [begin, begin + len) of the shard at `coords` (the whole dim where the spec does not
// shard it).
struct Box {
  std::vector<int64_t> begin, len;
};

Box shard_box(const MeshShape& shape, const MeshCoords& coords, const Tensor& full, const ShardSpec& spec) {
  if (int(spec.size()) > full.ndim())
    fail("[local_shard] spec has ", spec.size(), " dims, the tensor ", shape_str(full.shape()));
  Box b;
  for (int d = 0; d < full.ndim(); ++d) {
    b.begin.push_back(0);
    b.len.push_back(full.dim(d));
  }
  for (int d = 0; d < int(spec.size()); ++d) {
    int64_t n = 1, idx = 0;
    for (MeshAxis a : parse_mesh_axes(spec[size_t(d)])) {
      n *= shape.extent(a);
      idx = idx * shape.extent(a) + coords[a];
    }
    if (n == 1) continue;
    if (full.dim(d) % n != 0)
      fail("[local_shard] dim ", d, " of ", shape_str(full.shape()), " does not divide by ", n, " shards");
    b.len[size_t(d)] = full.dim(d) / n;
    b.begin[size_t(d)] = idx * b.len[size_t(d)];
  }
  return b;
}

Shape box_shape(const Box& b) { return Shape(b.len.begin(), b.len.end()); }

// Copies the box of `full` into `dst` (row-major, the box's shape) in one pass: one memcpy per run
// of the innermost cut dim and everything inside it.
void copy_box(const Tensor& full, const Box& b, void* dst) {
  const int nd = full.ndim();
  const size_t es = dtype_size(full.dtype());
  int cut = -1;  // the innermost dim the box does not cover whole
  for (int d = 0; d < nd; ++d)
    if (b.len[size_t(d)] != full.dim(d)) cut = d;
  size_t inner = 1;  // elements below `cut`
  for (int d = cut + 1; d < nd; ++d) inner *= size_t(full.dim(d));
  const auto* src = static_cast<const char*>(full.raw());
  auto* out = static_cast<char*>(dst);
  if (cut < 0) return void(std::memcpy(out, src, size_t(full.numel()) * es));
  const size_t run = size_t(b.len[size_t(cut)]) * inner * es;
  // Odometer over dims [0, cut): the box's index in each, and the run's source offset.
  std::vector<int64_t> idx(size_t(cut), 0);
  for (;;) {
    size_t off = 0;  // elements
    for (int d = 0; d <= cut; ++d) {
      int64_t i = d < cut ? b.begin[size_t(d)] + idx[size_t(d)] : b.begin[size_t(d)];
      off = off * size_t(full.dim(d)) + size_t(i);
    }
    std::memcpy(out, src + off * inner * es, run);
    out += run;
    int d = cut - 1;
    for (; d >= 0; --d) {
      if (++idx[size_t(d)] < b.len[size_t(d)]) break;
      idx[size_t(d)] = 0;
    }
    if (d < 0) return;
  }
}
}  // namespace

Tensor shard_at(const MeshShape& shape, const MeshCoords& coords, const Tensor& full, const ShardSpec& spec) {
  Box b = shard_box(shape, coords, full, spec);
  if (box_shape(b) == full.shape()) return full.clone();  // no dim is cut
  Tensor out = Tensor::empty(full.dtype(), box_shape(b));
  copy_box(full, b, out.raw());
  return out;
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
  // Every member's shard packed straight from the gradient, in member order (one copy of the
  // gradient; the shard of this rank is the collective's output, not copied out first).
  Tensor mine = Tensor::empty(DType::f32, box_shape(shard_box(mesh.shape(), mesh.coords(), full_grad, spec)));
  const size_t block = size_t(mine.numel());
  Tensor send_t = Tensor::empty(DType::f32, {int64_t(w) * int64_t(block)});
  float* send = send_t.data<float>();
  for (int t = 0; t < w; ++t)
    copy_box(full_grad, shard_box(mesh.shape(), mesh.member_coords(axes, t), full_grad, spec),
             send + size_t(t) * block);
  comm.reduce_scatter_sum(send, mine.data<float>(), block);
  return mine;
}

}  // namespace moe
