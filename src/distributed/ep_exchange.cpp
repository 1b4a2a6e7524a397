#include "distributed/ep_exchange.h"

#include <cstring>

#include "moe/thread_pool.h"

namespace moe {
namespace {

// Copies row src_rows[i] of src to row i of dst, for i < n (row bytes `rb`).
void gather_rows(const std::byte* src, std::byte* dst, const int64_t* src_rows, int64_t n, size_t rb) {
  parallel_for(n, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(dst + size_t(i) * rb, src + size_t(src_rows[i]) * rb, rb);
  });
}

CountMatrix all_gather_sizes(Communicator& comm, const GroupLayout& groups) {
  const int ep = comm.size();
  CountMatrix gg(ep, int(groups.num_groups()));
  comm.all_gather(groups.sizes.data(), gg.v.data(), groups.sizes.size() * sizeof(int64_t));
  return gg;
}

// Per (sender, local expert) rows after the cap: the sender-major flattened
// counts clamped to the buffer, as local_permute does.
std::vector<int64_t> rows_per_sender(const CountMatrix& gg, int s, int64_t El, int64_t buffer_rows) {
  std::vector<int64_t> out;
  int64_t used = 0;
  for (int i = 0; i < gg.rows; ++i)
    for (int64_t g = 0; g < El; ++g) {
      int64_t n = std::min(gg.at(i, int(s * El + g)), buffer_rows - used);
      out.push_back(n);
      used += n;
    }
  return out;
}

}  // namespace

EpComm ep_comm(const Mesh& m, bool hierarchical) {
  const HierAllToAll* h = hierarchical ? m.expert_hier() : nullptr;
  MOE_ASSERT(!hierarchical || (h && h->usable()), "ep_comm: no hierarchical all-to-all on this mesh");
  return EpComm{m.comm({"expert"}), h};
}

bool use_hierarchical_a2a(const Config& cfg, const Mesh& mesh) {
  const HierAllToAll* h = mesh.expert_hier();
  if (cfg.ep_all_to_all == EpAllToAll::flat || cfg.use_ring_of_experts || !h) return false;
  const HostMap& hosts = h->hosts();
  if (cfg.ep_all_to_all == EpAllToAll::hierarchical && hosts.hosts() > 1 && hosts.ranks_per_host() == 0)
    fail("ep_all_to_all=hierarchical: the expert group's ", mesh.shape().expert, " ranks sit on ", hosts.describe(),
         "; the hierarchical all-to-all needs the same number of ranks on every host (use ep_all_to_all=flat, or ",
         "auto, which is flat here)");
  return h->usable();
}

EpExchange plan_exchange(Communicator& comm, const GroupLayout& groups, int64_t E, int64_t routed_rows,
                         double factor) {
  EpExchange ex;
  ex.ep = comm.size();
  ex.rank = comm.rank();
  ex.experts_per_rank = E / ex.ep;
  ex.sent_rows = groups.total();
  if (ex.identity()) {
    ex.buffer_rows = routed_rows;
    ex.local_groups = groups;
    ex.rows_from = groups.sizes;
    return ex;
  }
  const int64_t El = ex.experts_per_rank;
  ex.gg = all_gather_sizes(comm, groups);
  ex.counts = CountMatrix(ex.ep, ex.ep);
  for (int i = 0; i < ex.ep; ++i)
    for (int64_t e = 0; e < E; ++e) ex.counts.at(i, int(e / El)) += ex.gg.at(i, int(e));
  int64_t received = 0;
  for (int i = 0; i < ex.ep; ++i) received += ex.counts.at(i, ex.rank);
  // Dropless: exactly the rows that arrive (known after the count exchange).
  ex.buffer_rows = factor > 0 ? int64_t(double(routed_rows) * factor) : received;
  ex.capped = factor > 0 ? truncate_counts(ex.counts, ex.buffer_rows) : ex.counts;
  for (int j = 0; j < ex.ep; ++j) ex.dropped += ex.counts.at(ex.rank, j) - ex.capped.at(ex.rank, j);
  ex.dispatch = dispatch_layout(ex.counts, ex.capped, ex.rank);
  ex.combine = combine_layout(ex.counts, ex.capped, ex.rank);
  ex.local = local_permute(ex.gg, ex.rank, El, ex.buffer_rows);
  ex.local_groups = GroupLayout::from_sizes(ex.local.local_group_sizes);
  ex.rows_from = rows_per_sender(ex.gg, ex.rank, El, ex.buffer_rows);
  return ex;
}

Tensor ep_send(const EpComm& ep, const EpExchange& ex, const Tensor& xs) {
  Tensor buf(xs.dtype(), {ex.buffer_rows, xs.dim(1)});
  const size_t rb = size_t(xs.dim(1)) * dtype_size(xs.dtype());
  if (ep.hier) ep.hier->all_to_allv(xs.raw(), buf.raw(), ex.dispatch, ex.capped, rb);
  else ep.comm.all_to_allv(xs.raw(), buf.raw(), ex.dispatch, rb);
  return buf;
}

Tensor ep_sort_local(const EpExchange& ex, const Tensor& buf) {
  const size_t rb = size_t(buf.dim(1)) * dtype_size(buf.dtype());
  Tensor xl(buf.dtype(), {ex.buffer_rows, buf.dim(1)});
  gather_rows(static_cast<const std::byte*>(buf.raw()), static_cast<std::byte*>(xl.raw()),
              ex.local.sorted_indices.data(), ex.local_groups.total(), rb);
  return xl;
}

Tensor ep_unsort_local(const EpExchange& ex, const Tensor& yl) {
  const size_t rb = size_t(yl.dim(1)) * dtype_size(yl.dtype());
  Tensor buf(yl.dtype(), {ex.buffer_rows, yl.dim(1)});
  auto* dst = static_cast<std::byte*>(buf.raw());
  const auto* src = static_cast<const std::byte*>(yl.raw());
  parallel_for(ex.local_groups.total(), 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      std::memcpy(dst + size_t(ex.local.sorted_indices[size_t(r)]) * rb, src + size_t(r) * rb, rb);
  });
  return buf;
}

Tensor ep_send_back(const EpComm& ep, const EpExchange& ex, const Tensor& buf, int64_t routed_rows) {
  Tensor out(buf.dtype(), {routed_rows, buf.dim(1)});
  const size_t rb = size_t(buf.dim(1)) * dtype_size(buf.dtype());
  // The reverse exchange: rank j sends rank i what i sent j (after the cap).
  if (ep.hier) ep.hier->all_to_allv(buf.raw(), out.raw(), ex.combine, ex.capped.transposed(), rb);
  else ep.comm.all_to_allv(buf.raw(), out.raw(), ex.combine, rb);
  return out;
}

Tensor ep_dispatch(const EpComm& ep, const EpExchange& ex, const Tensor& xs) {
  return ex.identity() ? xs : ep_sort_local(ex, ep_send(ep, ex, xs));
}

Tensor ep_return(const EpComm& ep, const EpExchange& ex, const Tensor& yl, int64_t routed_rows) {
  return ex.identity() ? yl : ep_send_back(ep, ex, ep_unsort_local(ex, yl), routed_rows);
}

}  // namespace moe
