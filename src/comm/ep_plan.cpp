#include "comm/ep_plan.h"

#include <algorithm>

#include "moe/error.h"

namespace moe {

CountMatrix CountMatrix::from_rows(const std::vector<std::vector<int64_t>>& rows) {
  CountMatrix m(int(rows.size()), rows.empty() ? 0 : int(rows[0].size()));
  for (int i = 0; i < m.rows; ++i) {
    if (int(rows[size_t(i)].size()) != m.cols) fail("[CountMatrix] row ", i, " has a different length");
    for (int j = 0; j < m.cols; ++j) m.at(i, j) = rows[size_t(i)][size_t(j)];
  }
  return m;
}

std::vector<int64_t> CountMatrix::row(int i) const {
  return std::vector<int64_t>(v.begin() + std::ptrdiff_t(i) * cols, v.begin() + std::ptrdiff_t(i + 1) * cols);
}

std::vector<int64_t> CountMatrix::col(int j) const {
  std::vector<int64_t> c(static_cast<size_t>(rows));
  for (int i = 0; i < rows; ++i) c[size_t(i)] = at(i, j);
  return c;
}

CountMatrix CountMatrix::transposed() const {
  CountMatrix t(cols, rows);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) t.at(j, i) = at(i, j);
  return t;
}

std::vector<int64_t> exclusive_cumsum(const std::vector<int64_t>& x) {
  std::vector<int64_t> out(x.size());
  int64_t acc = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = acc;
    acc += x[i];
  }
  return out;
}

int64_t ragged_buffer_rows(int64_t routed_rows, int64_t ep, int64_t num_experts, int64_t top_k, double factor) {
  if (factor > 0) return int64_t(double(routed_rows) * factor);
  MOE_ASSERT(top_k > 0 && ep > 0, "ragged_buffer_rows: K and EP must be positive");
  double worst = std::min(double(ep), double(num_experts) / double(top_k));
  return int64_t(double(routed_rows) * worst);
}

namespace {
void check_square(const CountMatrix& a, int s, const char* op) {
  if (a.rows != a.cols) fail("[", op, "] count matrix must be square [EP, EP], got [", a.rows, ", ", a.cols, "]");
  if (s < 0 || s >= a.rows) fail("[", op, "] shard ", s, " out of range for EP=", a.rows);
}

// sum_{i<s} m[i][j] for every column j.
std::vector<int64_t> rows_above(const CountMatrix& m, int s) {
  std::vector<int64_t> out(size_t(m.cols), 0);
  for (int i = 0; i < s; ++i)
    for (int j = 0; j < m.cols; ++j) out[size_t(j)] += m.at(i, j);
  return out;
}
}  // namespace

RaggedA2AParams dispatch_params_capped(const CountMatrix& a, const CountMatrix& a_hat, int s) {
  check_square(a, s, "dispatch_params");
  MOE_ASSERT(a_hat.rows == a.rows && a_hat.cols == a.cols, "dispatch_params: A and Â differ in shape");
  return RaggedA2AParams{exclusive_cumsum(a.row(s)), a_hat.row(s), rows_above(a_hat, s), a_hat.col(s)};
}

RaggedA2AParams dispatch_params(const CountMatrix& a, int s) { return dispatch_params_capped(a, a, s); }

CountMatrix truncate_counts(const CountMatrix& a, int64_t cap) {
  CountMatrix t(a.rows, a.cols);
  for (int j = 0; j < a.cols; ++j) {
    int64_t cum = 0;
    for (int i = 0; i < a.rows; ++i) {
      t.at(i, j) = std::min(cum + a.at(i, j), cap) - std::min(cum, cap);
      cum += a.at(i, j);
    }
  }
  return t;
}

RaggedA2AParams combine_params_capped(const CountMatrix& a, const CountMatrix& a_hat, int s) {
  check_square(a, s, "combine_params");
  MOE_ASSERT(a_hat.rows == a.rows && a_hat.cols == a.cols, "combine_params: A and Â differ in shape");
  return RaggedA2AParams{exclusive_cumsum(a_hat.col(s)), a_hat.col(s), rows_above(a.transposed(), s),
                         a_hat.row(s)};
}

RaggedA2AParams combine_params(const CountMatrix& a, int s) { return combine_params_capped(a, a, s); }

RaggedA2AParams unsharded_batch_params(const std::vector<int64_t>& v, int s) {
  if (s < 0 || size_t(s) >= v.size()) fail("[unsharded_batch_params] shard ", s, " out of range");
  const size_t n = v.size();
  return RaggedA2AParams{std::vector<int64_t>(n, 0), std::vector<int64_t>(n, v[size_t(s)]),
                         std::vector<int64_t>(n, exclusive_cumsum(v)[size_t(s)]), v};
}

A2ALayout dispatch_layout(const CountMatrix& a, const CountMatrix& a_hat, int s) {
  RaggedA2AParams p = dispatch_params_capped(a, a_hat, s);
  // Sender i writes into our buffer at sum_{k<i} Â[k][s].
  return A2ALayout{p.send_sizes, p.input_offsets, p.recv_sizes, exclusive_cumsum(a_hat.col(s))};
}

A2ALayout combine_layout(const CountMatrix& a, const CountMatrix& a_hat, int s) {
  RaggedA2AParams p = combine_params_capped(a, a_hat, s);
  // Expert shard i writes our rows back at sum_{k<i} A[s][k] (original slots).
  return A2ALayout{p.send_sizes, p.input_offsets, p.recv_sizes, exclusive_cumsum(a.row(s))};
}

namespace {
// Stable counting sort of ids in [0, num_ids] (num_ids = padding, sorts last).
LocalPermute sort_local_ids(const std::vector<int32_t>& ids, int64_t num_ids) {
  std::vector<int64_t> count(size_t(num_ids) + 1, 0);
  for (int32_t id : ids) count[size_t(id)]++;
  std::vector<int64_t> next = exclusive_cumsum(count);
  LocalPermute p;
  p.local_group_sizes.assign(count.begin(), count.end() - 1);
  p.sorted_indices.resize(ids.size());
  p.sorted_local_ids.resize(ids.size());
  for (size_t r = 0; r < ids.size(); ++r) {
    const int64_t pos = next[size_t(ids[r])]++;
    p.sorted_indices[size_t(pos)] = int64_t(r);
    p.sorted_local_ids[size_t(pos)] = ids[r];
  }
  return p;
}
}  // namespace

LocalPermute local_permute(const CountMatrix& gg, int s, int64_t experts_per_shard, int64_t buffer_rows) {
  const int64_t el = experts_per_shard;
  if (el <= 0 || int64_t(s + 1) * el > gg.cols)
    fail("[local_permute] shard ", s, " with ", el, " experts each does not fit ", gg.cols, " experts");
  std::vector<int32_t> ids;
  ids.reserve(size_t(buffer_rows));
  int64_t cum = 0;
  for (int i = 0; i < gg.rows; ++i)
    for (int64_t l = 0; l < el; ++l) {
      const int64_t c = gg.at(i, int(s * el + l));
      const int64_t kept = std::min(cum + c, buffer_rows) - std::min(cum, buffer_rows);
      ids.insert(ids.end(), size_t(kept), int32_t(l));
      cum += c;
    }
  ids.resize(size_t(buffer_rows), int32_t(el));
  return sort_local_ids(ids, el);
}

LocalPermute local_permute_offset(const std::vector<int32_t>& global_ids, int s, int64_t experts_per_shard) {
  const int64_t el = experts_per_shard;
  if (el <= 0) fail("[local_permute_offset] experts_per_shard must be positive, got ", el);
  std::vector<int32_t> ids(global_ids.size());
  for (size_t r = 0; r < ids.size(); ++r)
    ids[r] = global_ids[r] / el == s ? int32_t(global_ids[r] % el) : int32_t(el);
  return sort_local_ids(ids, el);
}

}  // namespace moe
