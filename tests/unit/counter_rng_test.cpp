// The counter-based generator (src/core/counter_rng.h): values pinned where
// they are a file format (`moe init` weights), tensors the same bits as the
// scalar draws whatever the pool's size, and the distributions it claims.
#include "core/counter_rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "moe/layer.h"

namespace moe {
namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

Config layer_config(int64_t E, int64_t K, int64_t D, int64_t F) {
  Config cfg;
  cfg.num_experts = E, cfg.num_experts_per_tok = K, cfg.emb_dim = D, cfg.moe_mlp_dim = F;
  return cfg;
}

// Bits read from files written by `moe init` before the generators were
// merged: weights files people have must stay reproducible.
TEST(CounterRng, InitWeightsArePinned) {
  Config cfg = layer_config(6, 2, 16, 8);
  LayerWeights w = init_weights(cfg, 3);
  EXPECT_EQ(bits_of(w.router.data<float>()[0]), 0xbee082e7u);
  EXPECT_EQ(bits_of(w.router.data<float>()[95]), 0xbda38c9fu);
  EXPECT_EQ(bits_of(w.wo.data<float>()[767]), 0xbe802390u);

  // Large enough to be drawn in parallel chunks.
  cfg = layer_config(16, 4, 256, 512);
  w = init_weights(cfg, 12345678901234ull);
  EXPECT_EQ(bits_of(w.wi_1.data<float>()[1000003]), 0x3cd61328u);
  EXPECT_EQ(bits_of(w.wi_1.data<float>()[2097151]), 0xbc56e8bau);
}

// A tensor is the scalar draws at its indices, so a slice [first, first + n)
// is the same bits as those elements of the whole (a rank's token slice).
TEST(CounterRng, FillIsTheScalarDraws) {
  const uint64_t key = stream_key(11, 22, 33);
  const int64_t n = 100003;  // many pool chunks and a ragged last one
  Tensor whole = normal_tensor({n}, key, 0.5f);
  for (int64_t j = 0; j < n; ++j)
    ASSERT_EQ(bits_of(whole.data<float>()[j]), bits_of(0.5f * counter_normal(key, uint64_t(j)))) << j;
  Tensor part = Tensor::empty(DType::f32, {3, 1000});
  fill_normal(part, key, 0.5f, 5000);
  for (int64_t j = 0; j < part.numel(); ++j)
    ASSERT_EQ(bits_of(part.data<float>()[j]), bits_of(whole.data<float>()[5000 + j])) << j;
}

TEST(CounterRng, Distributions) {
  const int64_t n = 200000;
  Tensor t = normal_tensor({n}, named_key(1, "x"));
  double sum = 0, sq = 0, u_sum = 0, u_min = 1;
  for (int64_t j = 0; j < n; ++j) {
    const double v = t.data<float>()[j], u = counter_uniform(7, uint64_t(j));
    sum += v, sq += v * v, u_sum += u;
    u_min = std::min(u_min, u);
    ASSERT_TRUE(u > 0.0 && u <= 1.0) << u;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);  // standard errors: 0.0022 (mean), 0.0032 (variance)
  EXPECT_NEAR(sq / n, 1.0, 0.02);
  EXPECT_NEAR(u_sum / n, 0.5, 0.003);  // standard error 0.00065
  EXPECT_LT(u_min, 1e-4);
  EXPECT_EQ(unit_open_low(0), 0x1.0p-53);
  EXPECT_EQ(unit_open_low(~0ull), 1.0);
  EXPECT_EQ(unit_open_high(0), 0.0);
  EXPECT_LT(unit_open_high(~0ull), 1.0);
}

// Different keys, indices and names give different streams.
TEST(CounterRng, KeysSeparateStreams) {
  EXPECT_NE(counter_bits(1, 0), counter_bits(2, 0));
  EXPECT_NE(counter_bits(1, 0), counter_bits(1, 1));
  EXPECT_NE(stream_key(1, 2, 3), stream_key(1, 3, 2));
  EXPECT_NE(named_key(0, "x"), named_key(0, "dy"));
  EXPECT_NE(named_key(0, "x"), named_key(1, "x"));
}

}  // namespace
}  // namespace moe
