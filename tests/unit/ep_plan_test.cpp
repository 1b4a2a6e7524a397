// Expert-parallel index math against MAXTEXT_NOTES §2.1.
#include <gtest/gtest.h>

#include <numeric>

#include "comm/ep_plan.h"

namespace moe {
namespace {

using V = std::vector<int64_t>;

TEST(EpPlan, RaggedBufferRows) {
  EXPECT_EQ(ragged_buffer_rows(32768, 4, 256, 8, 1.0), 32768);
  EXPECT_EQ(ragged_buffer_rows(32768, 4, 256, 8, 2.0), 65536);
  EXPECT_EQ(ragged_buffer_rows(32768, 4, 256, 8, -1.0), 131072);
  EXPECT_EQ(ragged_buffer_rows(32768, 128, 256, 8, -1.0), 1048576);
}

const CountMatrix kA = CountMatrix::from_rows({{1, 2, 0, 3}, {4, 0, 1, 2}, {0, 3, 2, 1}, {2, 1, 4, 0}});

TEST(EpPlan, DispatchParamsShardedBatch) {
  const std::vector<V> in_off = {{0, 1, 3, 3}, {0, 4, 4, 5}, {0, 0, 3, 5}, {0, 2, 3, 7}};
  const std::vector<V> out_off = {{0, 0, 0, 0}, {1, 2, 0, 3}, {5, 2, 1, 5}, {5, 5, 3, 6}};
  const std::vector<V> recv = {{1, 4, 0, 2}, {2, 0, 3, 1}, {0, 1, 2, 4}, {3, 2, 1, 0}};
  for (int s = 0; s < 4; ++s) {
    RaggedA2AParams p = dispatch_params(kA, s);
    EXPECT_EQ(p.input_offsets, in_off[size_t(s)]) << s;
    EXPECT_EQ(p.send_sizes, kA.row(s)) << s;
    EXPECT_EQ(p.output_offsets, out_off[size_t(s)]) << s;
    EXPECT_EQ(p.recv_sizes, recv[size_t(s)]) << s;
  }
}

TEST(EpPlan, UnshardedBatchParams) {
  const V v = {6, 7, 6, 7};
  const V offsets = {0, 6, 13, 19};
  for (int s = 0; s < 4; ++s) {
    RaggedA2AParams p = unsharded_batch_params(v, s);
    EXPECT_EQ(p.input_offsets, V(4, 0));
    EXPECT_EQ(p.send_sizes, V(4, v[size_t(s)]));
    EXPECT_EQ(p.output_offsets, V(4, offsets[size_t(s)]));
    EXPECT_EQ(p.recv_sizes, v);
  }
}

TEST(EpPlan, CombineIsDispatchOfTranspose) {
  for (int s = 0; s < 4; ++s) {
    RaggedA2AParams c = combine_params(kA, s), d = dispatch_params(kA.transposed(), s);
    EXPECT_EQ(c.input_offsets, d.input_offsets);
    EXPECT_EQ(c.send_sizes, d.send_sizes);
    EXPECT_EQ(c.output_offsets, d.output_offsets);
    EXPECT_EQ(c.recv_sizes, d.recv_sizes);
  }
}

TEST(EpPlan, TruncationLowerSenderWins) {
  // Column sums 7, 6, 7, 6; cap 5.
  CountMatrix t = truncate_counts(kA, 5);
  EXPECT_EQ(t.col(0), (V{1, 4, 0, 0}));
  EXPECT_EQ(t.col(1), (V{2, 0, 3, 0}));
  EXPECT_EQ(t.col(2), (V{0, 1, 2, 2}));
  EXPECT_EQ(t.col(3), (V{3, 2, 0, 0}));
  EXPECT_TRUE(truncate_counts(kA, 100).v == kA.v);
  RaggedA2AParams d = dispatch_params_capped(kA, t, 2);
  EXPECT_EQ(d.input_offsets, (V{0, 0, 3, 5}));  // untruncated A
  EXPECT_EQ(d.send_sizes, (V{0, 3, 2, 0}));
  EXPECT_EQ(d.output_offsets, (V{5, 2, 1, 5}));
  RaggedA2AParams c = combine_params_capped(kA, t, 2);
  EXPECT_EQ(c.input_offsets, (V{0, 0, 1, 3}));  // packed Â column
  EXPECT_EQ(c.send_sizes, (V{0, 1, 2, 2}));
  EXPECT_EQ(c.output_offsets, (V{3, 4, 3, 3}));  // sum_{i<2} A[j][i]
  EXPECT_EQ(c.recv_sizes, (V{0, 3, 2, 0}));
}

// The MPI layouts agree with the MaxText-convention parameters of every sender.
TEST(EpPlan, MpiLayoutsMatchSenderParams) {
  const CountMatrix t = truncate_counts(kA, 5);
  for (const CountMatrix* hat : {&kA, &t})
    for (int s = 0; s < 4; ++s) {
      A2ALayout d = dispatch_layout(kA, *hat, s), c = combine_layout(kA, *hat, s);
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(d.recv_offsets[size_t(i)], dispatch_params_capped(kA, *hat, i).output_offsets[size_t(s)]);
        EXPECT_EQ(c.recv_offsets[size_t(i)], combine_params_capped(kA, *hat, i).output_offsets[size_t(s)]);
        EXPECT_EQ(d.recv_counts[size_t(i)], dispatch_params_capped(kA, *hat, i).send_sizes[size_t(s)]);
        EXPECT_EQ(c.recv_counts[size_t(i)], combine_params_capped(kA, *hat, i).send_sizes[size_t(s)]);
      }
    }
}

TEST(EpPlan, LocalPermuteNoOffset) {
  // E=8, EP=4, global group sizes arange(8), one source: shard s holds the
  // rows of experts 2s, 2s+1 already in order.
  CountMatrix gg(1, 8);
  for (int e = 0; e < 8; ++e) gg.at(0, e) = e;
  for (int s = 0; s < 4; ++s) {
    const int64_t total = 4 * s + 1;
    LocalPermute p = local_permute(gg, s, 2, total);
    V arange(static_cast<size_t>(total));
    std::iota(arange.begin(), arange.end(), 0);
    EXPECT_EQ(p.sorted_indices, arange);
    EXPECT_EQ(p.local_group_sizes, (V{2 * s, 2 * s + 1}));
    std::vector<int32_t> ids(size_t(2 * s), 0);
    ids.insert(ids.end(), size_t(2 * s + 1), 1);
    EXPECT_EQ(p.sorted_local_ids, ids);
  }
}

TEST(EpPlan, LocalPermuteOffset) {
  for (V counts : {V{0, 1, 2, 3, 4, 5, 6, 7}, V{0, 0, 1, 1, 2, 0, 2, 2}}) {
    std::vector<int32_t> assignment;  // rows sorted by global expert
    for (int e = 0; e < 8; ++e) assignment.insert(assignment.end(), size_t(counts[size_t(e)]), e);
    for (int s = 0; s < 4; ++s) {
      LocalPermute p = local_permute_offset(assignment, s, 2);
      const int64_t begin = std::accumulate(counts.begin(), counts.begin() + 2 * s, int64_t(0));
      const int64_t n = counts[size_t(2 * s)] + counts[size_t(2 * s + 1)];
      EXPECT_EQ(p.local_group_sizes, (V{counts[size_t(2 * s)], counts[size_t(2 * s + 1)]}));
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_EQ(p.sorted_indices[size_t(r)], begin + r);
        EXPECT_EQ(p.sorted_local_ids[size_t(r)], assignment[size_t(begin + r)] % 2);
      }
      for (size_t r = size_t(n); r < assignment.size(); ++r) EXPECT_EQ(p.sorted_local_ids[r], 2);
    }
  }
}

TEST(EpPlan, LocalPermuteTwoSourcesCappedKeepsValidPrefix) {
  // Two sources, E_l = 2 (shard 0 of E=4): source 0 sends [0, 2] (local
  // experts 0, 1), source 1 sends [1, 0]; cap 2 keeps source 0's two rows.
  CountMatrix gg = CountMatrix::from_rows({{0, 2, 9, 9}, {1, 0, 9, 9}});
  LocalPermute full = local_permute(gg, 0, 2, 5);
  EXPECT_EQ(full.sorted_indices, (V{2, 0, 1, 3, 4}));
  EXPECT_EQ(full.sorted_local_ids, (std::vector<int32_t>{0, 1, 1, 2, 2}));
  EXPECT_EQ(full.local_group_sizes, (V{1, 2}));
  LocalPermute capped = local_permute(gg, 0, 2, 2);
  EXPECT_EQ(capped.local_group_sizes, (V{0, 2}));
  EXPECT_EQ(capped.sorted_indices, (V{0, 1}));
}

}  // namespace
}  // namespace moe
