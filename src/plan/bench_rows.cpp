#include "plan/bench_rows.h"

#include "bench/cases.h"
#include "moe/error.h"
#include "moe/layer.h"
#include "route/router.h"

namespace moe::plan {

std::vector<std::vector<int64_t>> bench_expert_rows(const Config& cfg, int ranks, int expert, int64_t T,
                                                    int chunks, uint64_t seed) {
  const int64_t E = cfg.num_experts, K = cfg.num_experts_per_tok;
  MOE_ASSERT(ranks >= 1 && expert >= 1 && ranks % expert == 0 && E % expert == 0 && chunks >= 1,
             "bench_expert_rows: bad mesh");
  const int64_t El = E / expert;
  const LayerWeights w = init_weights(cfg, seed);
  const Tensor kernel = w.router.to(DType::f32);
  bench::Case c;
  c.name = "dist", c.T = T, c.D = cfg.emb_dim, c.F = cfg.moe_mlp_dim, c.E = E, c.K = K, c.seed = seed;
  // sent[g][c][e]: rows of rank g's chunk c routed to the experts of expert index e.
  std::vector<std::vector<std::vector<int64_t>>> sent(
      size_t(ranks),
      std::vector<std::vector<int64_t>>(size_t(chunks), std::vector<int64_t>(size_t(expert), 0)));
  for (int g = 0; g < ranks; ++g) {
    const bench::CaseInputs in = bench::case_inputs(c, uint64_t(g) + 1);
    const RouterOutput ro = router_forward(cfg, in.x, kernel, nullptr);
    const int32_t* idx = ro.topk_idx.data<int32_t>();
    for (int ch = 0; ch < chunks; ++ch)
      for (int64_t t = T * ch / chunks; t < T * (ch + 1) / chunks; ++t)
        for (int64_t k = 0; k < K; ++k) ++sent[size_t(g)][size_t(ch)][size_t(idx[t * K + k] / El)];
  }
  std::vector<std::vector<int64_t>> rows(size_t(ranks), std::vector<int64_t>(size_t(chunks), 0));
  for (int r = 0; r < ranks; ++r) {
    const int group = r / expert, e = r % expert;
    for (int g = group * expert; g < (group + 1) * expert; ++g)
      for (int ch = 0; ch < chunks; ++ch)
        rows[size_t(r)][size_t(ch)] += sent[size_t(g)][size_t(ch)][size_t(e)];
  }
  return rows;
}

}  // namespace moe::plan
