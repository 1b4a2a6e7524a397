// Expert-parallel index math (SPEC.md §3, MAXTEXT_NOTES §2.1): pure
// functions of the count matrices, no communication.
//
// A[i][j] = rows EP shard i sends to EP shard j (the all-gathered per-shard
// counts, [EP, EP]). Row counts are in rows; MPI element = one row of D.
#pragma once

#include <cstdint>
#include <vector>

#include "moe/comm.h"

namespace moe {

// A small row-major integer matrix ([rows, cols]).
struct CountMatrix {
  int rows = 0, cols = 0;
  std::vector<int64_t> v;

  CountMatrix() = default;
  CountMatrix(int r, int c) : rows(r), cols(c), v(size_t(r) * size_t(c), 0) {}
  static CountMatrix from_rows(const std::vector<std::vector<int64_t>>& rows);
  int64_t& at(int i, int j) { return v[size_t(i) * size_t(cols) + size_t(j)]; }
  int64_t at(int i, int j) const { return v[size_t(i) * size_t(cols) + size_t(j)]; }
  std::vector<int64_t> row(int i) const;
  std::vector<int64_t> col(int j) const;
  CountMatrix transposed() const;
};

std::vector<int64_t> exclusive_cumsum(const std::vector<int64_t>& x);

// Receive-buffer rows of the dispatch: factor > 0 -> int(R * factor) (may
// drop rows); else int(R * min(EP, E / K)) (worst case, dropless).
int64_t ragged_buffer_rows(int64_t routed_rows, int64_t ep, int64_t num_experts, int64_t top_k, double factor);

// ragged_all_to_all parameters of sender s (MaxText convention: output
// offsets are positions in the RECEIVER's buffer).
struct RaggedA2AParams {
  std::vector<int64_t> input_offsets, send_sizes, output_offsets, recv_sizes;
};

// Dispatch with counts A: input_offsets = excl_cumsum(A[s,:]), send = A[s,:],
// output_offsets[j] = sum_{i<s} A[i][j], recv = A[:,s].
RaggedA2AParams dispatch_params(const CountMatrix& a, int s);
// Per receiver column j: Â[i][j] = min(cumsum_i A[.,j], cap) - min(cumsum_{i-1}, cap)
// (lower sender index wins).
CountMatrix truncate_counts(const CountMatrix& a, int64_t cap);
// Capped dispatch: input offsets from A, send / output / recv from Â.
RaggedA2AParams dispatch_params_capped(const CountMatrix& a, const CountMatrix& a_hat, int s);
// Combine (reverse) with Aᵀ: input_offsets = excl_cumsum(A[:,s]), send = A[:,s],
// output_offsets[j] = sum_{i<s} A[j][i], recv = A[s,:].
RaggedA2AParams combine_params(const CountMatrix& a, int s);
// Capped combine: input / send / recv from Âᵀ, output offsets from Aᵀ (rows go
// back to their original slots; slots of dropped rows are not written).
RaggedA2AParams combine_params_capped(const CountMatrix& a, const CountMatrix& a_hat, int s);
// Batch not sharded by EP: v[j] = rows shard j is responsible for; input
// offsets 0, send v[s] to all, output offsets excl_cumsum(v)[s], recv v.
RaggedA2AParams unsharded_batch_params(const std::vector<int64_t>& v, int s);

// MPI_Alltoallv layout of rank s from the parameters of every sender:
// send from params(s); recv counts/offsets from column s of the others.
A2ALayout dispatch_layout(const CountMatrix& a, const CountMatrix& a_hat, int s);
A2ALayout combine_layout(const CountMatrix& a, const CountMatrix& a_hat, int s);

// Sorting the received buffer by local expert.
struct LocalPermute {
  std::vector<int64_t> sorted_indices;     // [buffer_rows] gather indices into the buffer
  std::vector<int32_t> sorted_local_ids;   // [buffer_rows] local expert of each sorted row; E_l = padding
  std::vector<int64_t> local_group_sizes;  // [E_l]
};
// Buffer = [source 0 chunk sorted by local expert | source 1 chunk | ...];
// gg = all-gathered group sizes [sources, E]; shard s owns experts
// [s*E_l, (s+1)*E_l). Counts are clamped (flattened cumsum) to buffer_rows;
// rows past the valid ones get id E_l and sort last (MaxText repeats the last
// id instead; a sentinel keeps the valid rows a prefix).
LocalPermute local_permute(const CountMatrix& gg, int s, int64_t experts_per_shard, int64_t buffer_rows);
// Batch not sharded by EP: every shard holds all rows, sorted by global
// expert (`global_ids`, one per row); this shard's rows come first (stable),
// the others get id E_l and are not counted in local_group_sizes.
LocalPermute local_permute_offset(const std::vector<int32_t>& global_ids, int s, int64_t experts_per_shard);

}  // namespace moe
