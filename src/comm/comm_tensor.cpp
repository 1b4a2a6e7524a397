#include "moe/comm_tensor.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace moe {
namespace {
// dtype, ndim, dims... as int64 (fits in kMaxDims + 2 entries).
constexpr int kMaxDims = 8;
using Header = std::array<int64_t, kMaxDims + 2>;

Header header_of(const Tensor& t) {
  if (t.ndim() > kMaxDims) fail("[comm_tensor] tensors of more than ", kMaxDims, " dims are not supported");
  Header h{};
  h[0] = int64_t(t.dtype());
  h[1] = t.ndim();
  for (int i = 0; i < t.ndim(); ++i) h[size_t(i) + 2] = t.dim(i);
  return h;
}

Shape shape_of(const Header& h) { return Shape(h.begin() + 2, h.begin() + 2 + h[1]); }

Header broadcast_header(Communicator& comm, const Tensor& t, int root) {
  Header h = comm.rank() == root ? header_of(t) : Header{};
  comm.broadcast(h.data(), sizeof(h), root);
  return h;
}

// Bytes of one dim-0 row (the product of the trailing dims).
size_t row_bytes(DType dtype, const Shape& shape) {
  return size_t(shape_numel(Shape(shape.begin() + 1, shape.end()))) * dtype_size(dtype);
}
}  // namespace

Tensor broadcast_tensor(Communicator& comm, const Tensor& t, int root) {
  Header h = broadcast_header(comm, t, root);
  Tensor out = comm.rank() == root ? t : Tensor::empty(DType(h[0]), shape_of(h));
  comm.broadcast(out.raw(), out.nbytes(), root);
  return out;
}

Tensor scatter_rows(Communicator& comm, const Tensor& full, int root) {
  Header h = broadcast_header(comm, full, root);
  if (h[1] < 1) fail("[scatter_rows] needs a tensor of at least one dim");
  Shape shape = shape_of(h);
  const int w = comm.size();
  const int64_t n = shape[0];
  const size_t row = row_bytes(DType(h[0]), shape);
  std::vector<size_t> bytes(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) bytes[size_t(r)] = size_t(row_begin(n, r + 1, w) - row_begin(n, r, w)) * row;
  shape[0] = row_begin(n, comm.rank() + 1, w) - row_begin(n, comm.rank(), w);
  Tensor out = Tensor::empty(DType(h[0]), shape);
  comm.scatterv(comm.rank() == root ? full.raw() : nullptr, bytes, out.raw(), out.nbytes(), root);
  return out;
}

Tensor gather_rows(Communicator& comm, const Tensor& local, int root) {
  if (local.ndim() < 1) fail("[gather_rows] needs a tensor of at least one dim");
  const int w = comm.size();
  Header mine = header_of(local);
  std::vector<Header> all(static_cast<size_t>(w));
  comm.gatherv(mine.data(), sizeof(Header), all.data(), std::vector<size_t>(size_t(w), sizeof(Header)), root);
  std::vector<size_t> bytes(static_cast<size_t>(w));
  Tensor out;
  if (comm.rank() == root) {
    Shape shape = local.shape();
    shape[0] = 0;
    for (int r = 0; r < w; ++r) {
      Header h = all[size_t(r)];
      const int64_t rows = h[2];
      h[2] = local.dim(0);
      // The other ranks are already inside the next gatherv: a mismatch takes the job down.
      if (h != mine)
        comm.abort("[gather_rows] rank " + std::to_string(r) + " holds a tensor whose dtype or trailing dims "
                   "differ from the root's " + shape_str(local.shape()));
      shape[0] += rows;
      bytes[size_t(r)] = size_t(rows) * row_bytes(local.dtype(), local.shape());
    }
    out = Tensor::empty(local.dtype(), shape);
  }
  comm.gatherv(local.raw(), local.nbytes(), out.raw(), bytes, root);
  return out;
}

}  // namespace moe
