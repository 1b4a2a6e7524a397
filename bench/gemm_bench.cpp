// gemm_bench: the expert FFN's grouped GEMMs (prefused up [D, 2F], down
// [F, D]; forward, dlhs, drhs) against oneDNN's dense matmul of the same FLOPs,
// measured in the same run on the compute pool's thread count.
//
// Usage: gemm_bench [reps=5] [case-name filter] [T: tokens instead of the case's]
// GEMM_BENCH_DTYPE=f32|bf16 runs the chosen cases in that dtype instead of their own.
// Each case ends with `up.pair`: the up projection of separate wi_0 / wi_1 as one gmm_pair against
// two gmm calls, and `up.dlhs.add`: its data gradient as gmm_dlhs + gmm_dlhs_add against two
// gmm_dlhs into f32 and an add pass; alternated (the speedup, and whether the outputs are the same
// bytes). GEMM_BENCH_OP=up.pair runs only these two comparisons; GEMM_BENCH_OP=act times the
// gated activation (silu) of the case's rows, forward and backward, alone.
// The dense baseline computes in the dtype our active kernel level computes in
// (src/bench/dense_baseline.h): a bf16 case has an f32 baseline below avx512_bf16.
// Each row: our median ms and GFLOP/s, the dense baseline's,
// fraction = dense ms / our ms (1.0 = as fast as a dense matmul), and the
// same fraction of the best times (min over the reps of each side).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/dense_matmul_onednn.h"
#include "kernels/activation.h"
#include "kernels/grouped_gemm.h"
#include "moe/error.h"
#include "moe/isa.h"
#include "moe/thread_pool.h"
#include "timing.h"

namespace moe::bench {
namespace {

struct FfnCase {
  const char* name;
  DType dtype;
  int64_t T, D, F, E, K;
  bool skewed = false;  // group sizes ∝ exp(-g) (the registry's skewed case) instead of uniform routing
};

const FfnCase kCases[] = {
    {"seed-mixtral bf16", DType::bf16, 2048, 4096, 1024, 8, 2},
    {"many-experts bf16", DType::bf16, 2048, 1024, 512, 128, 8},
    {"gemma-like bf16", DType::bf16, 2048, 2816, 704, 128, 8},
    {"seed-mixtral f32", DType::f32, 2048, 4096, 1024, 8, 2},
    {"skewed bf16", DType::bf16, 2048, 1024, 512, 64, 4, true},
    {"one-group bf16", DType::bf16, 8192, 1024, 512, 1, 1},
    // The public models' expert shapes (src/bench/cases.cpp) at few rows per expert (16-64; the
    // weight-bound regime): the registry's T until 2026-12-02. The registry now runs them at 256
    // rows per expert; `gemm_bench REPS CASE T` runs these shapes at any T.
    {"olmoe-1b-7b bf16", DType::bf16, 512, 2048, 1024, 64, 8},
    {"qwen1.5-moe-a2.7b bf16", DType::bf16, 512, 2048, 1408, 60, 4},
    {"deepseek-v2-lite bf16", DType::bf16, 512, 2048, 1408, 64, 6},
    {"gpt-oss-20b bf16", DType::bf16, 256, 2880, 2880, 32, 4},
    {"granite-3b-a800m bf16", DType::bf16, 1024, 1536, 512, 40, 8},
    {"granite-1b-a400m bf16", DType::bf16, 256, 1024, 512, 32, 8},
    {"mixtral-8x7b bf16", DType::bf16, 64, 4096, 14336, 8, 2},
};

// Each token picks K distinct experts uniformly (fixed seed): ragged groups around T*K/E.
GroupLayout route(const FfnCase& c) {
  std::mt19937 rng(1234);
  std::vector<int64_t> sizes(size_t(c.E), 0);
  if (c.skewed) {  // p(g) ∝ exp(-g), the remainder to expert 0
    const int64_t R = c.T * c.K;
    double z = 0;
    for (int64_t e = 0; e < c.E; ++e) z += std::exp(-double(e));
    int64_t used = 0;
    for (int64_t e = 1; e < c.E; ++e) used += sizes[size_t(e)] = int64_t(double(R) * std::exp(-double(e)) / z);
    sizes[0] = R - used;
    return GroupLayout::from_sizes(sizes);
  }
  std::vector<int64_t> experts(size_t(c.E));
  for (int64_t t = 0; t < c.T; ++t) {
    for (int64_t e = 0; e < c.E; ++e) experts[size_t(e)] = e;
    for (int64_t k = 0; k < c.K; ++k) {
      std::swap(experts[size_t(k)], experts[size_t(k + int64_t(rng() % uint32_t(c.E - k)))]);
      ++sizes[size_t(experts[size_t(k)])];
    }
  }
  return GroupLayout::from_sizes(sizes);
}

// Values in [-1, 1) from a xorshift stream (fast enough for 10^8 elements).
Tensor filled(DType t, Shape s, uint64_t seed) {
  Tensor x = Tensor::empty(t, std::move(s));
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < x.numel(); ++i) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    float v = float(int64_t(z >> 40) - (int64_t(1) << 23)) * 0x1p-23f;
    if (t == DType::bf16) x.data<bf16>()[i] = to_bf16(v);
    else x.data<float>()[i] = v;
  }
  return x;
}

struct Op {
  std::string name;
  int64_t m, k, n;  // the dense matmul with the same FLOPs
  std::function<void()> run;
};

// Medians, their fraction, and the fraction of the best (fastest) times: on a
// shared VM the medians carry its slow phases; the best times are each
// kernel's rate when the machine gave it its cores.
void print_row(const std::string& name, double flops, const std::vector<double>& ours,
               const std::vector<double>& dense) {
  const double ms = median(ours), dense_ms = median(dense);
  const double best = *std::min_element(ours.begin(), ours.end());
  const double dense_best = *std::min_element(dense.begin(), dense.end());
  std::printf("  %-12s %9.2f ms %7.0f GFLOP/s | dense %9.2f ms %7.0f GFLOP/s | %.3f | best %.3f\n", name.c_str(),
              ms, flops / (ms * 1e6), dense_ms, flops / (dense_ms * 1e6), dense_ms / ms, dense_best / best);
}

// The up projection of separate weights (wi_0, wi_1 [E, D, F]): gmm_pair into h [R, 2F] against
// gmm into h0 and h1 [R, F], alternated; the row reports the speedup and compares the bytes.
void bench_pair(const FfnCase& c, const GroupLayout& g, const Tensor& xs, int reps) {
  const int64_t R = c.T * c.K, D = c.D, F = c.F, E = c.E;
  const DType t = c.dtype;
  Tensor w0 = filled(t, {E, D, F}, 7), w1 = filled(t, {E, D, F}, 8);
  Tensor h = Tensor::empty(t, {R, 2 * F}), h0 = Tensor::empty(t, {R, F}), h1 = Tensor::empty(t, {R, F});
  auto [pair, two] = times_ms_interleaved(
      reps, [&] { gmm_pair(xs, w0, w1, g, 0, h); }, [&] { gmm(xs, w0, g, 0, h0), gmm(xs, w1, g, 0, h1); });
  const size_t row = size_t(F) * dtype_size(t);
  bool same = true;
  for (int64_t r = 0; r < R && same; ++r) {
    const auto* p = static_cast<const std::byte*>(h.raw()) + size_t(r) * 2 * row;
    same = std::memcmp(p, static_cast<const std::byte*>(h0.raw()) + size_t(r) * row, row) == 0 &&
           std::memcmp(p + row, static_cast<const std::byte*>(h1.raw()) + size_t(r) * row, row) == 0;
  }
  const double ms = median(pair), two_ms = median(two), flops = 4.0 * double(R) * double(D) * double(F);
  std::printf("  %-12s %9.2f ms %7.0f GFLOP/s | two gmm %9.2f ms %7.0f GFLOP/s | %.3fx | %s\n", "up.pair", ms,
              flops / (ms * 1e6), two_ms, flops / (two_ms * 1e6), two_ms / ms,
              same ? "same bytes" : "OUTPUTS DIFFER");
  // The data gradient of the same weights: dxs = round(p0 + p1), p_i = dh_i @ wi_i^T in f32, as
  // gmm_dlhs + gmm_dlhs_add (p1 added in the tiles) against two gmm_dlhs into f32 and an add pass.
  Tensor dh0 = filled(t, {R, F}, 9), dh1 = filled(t, {R, F}, 10);
  Tensor p0 = Tensor::empty(DType::f32, {R, D}), p1 = Tensor::empty(DType::f32, {R, D});
  Tensor dx_new = Tensor::empty(t, {R, D}), dx_old = Tensor::empty(t, {R, D});
  auto add_pass = [&] {
    parallel_for(R * D, 4096, [&](int64_t b, int64_t e) {
      const float* a = p0.data<float>();
      const float* c = p1.data<float>();
      for (int64_t i = b; i < e; ++i) {
        if (t == DType::bf16)
          dx_old.data<bf16>()[i] = to_bf16(a[i] + c[i]);
        else
          dx_old.data<float>()[i] = a[i] + c[i];
      }
    });
  };
  auto [fused_ms, split_ms] = times_ms_interleaved(
      reps, [&] { gmm_dlhs(dh0, w0, g, 0, p0), gmm_dlhs_add(dh1, w1, g, 0, p0, dx_new); },
      [&] { gmm_dlhs(dh0, w0, g, 0, p0), gmm_dlhs(dh1, w1, g, 0, p1), add_pass(); });
  same = std::memcmp(dx_new.raw(), dx_old.raw(), dx_new.nbytes()) == 0;
  const double f = median(fused_ms), o = median(split_ms);
  std::printf("  %-12s %9.2f ms %7.0f GFLOP/s | dlhs x2 + add %6.2f ms %7.0f GFLOP/s | %.3fx | %s\n",
              "up.dlhs.add", f, flops / (f * 1e6), o, flops / (o * 1e6), o / f,
              same ? "same bytes" : "OUTPUTS DIFFER");
}

// The FFN's gated activation (silu) over the case's rows, h [R, 2F] -> a [R, F] and the backward
// da -> dh: medians of the reps after one untimed run, with the rows' bytes per ns.
void bench_act(const FfnCase& c, int reps) {
  const int64_t R = c.T * c.K, F = c.F;
  const DType t = c.dtype;
  Tensor h = filled(t, {R, 2 * F}, 11), da = filled(t, {R, F}, 12);
  Tensor a = Tensor::empty(t, {R, F}), dh = Tensor::empty(t, {R, 2 * F});
  auto fwd = [&] { gated_act_forward(Activation::silu, {h, 0, 2 * F}, {h, F, 2 * F}, R, F, a); };
  auto bwd = [&] {
    gated_act_backward(Activation::silu, {h, 0, 2 * F}, {h, F, 2 * F}, da, R, F, {dh, 0, 2 * F},
                       {dh, F, 2 * F});
  };
  fwd(), bwd();
  std::vector<double> f(size_t(std::max(reps, 1))), b(f.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = time_ms(fwd), b[i] = time_ms(bwd);
  const double es = double(dtype_size(t)), elems = double(R) * double(F);
  std::printf("  %-12s %9.3f ms %6.1f GB/s | backward %9.3f ms %6.1f GB/s (median of %zu; %s, R=%ld F=%ld)\n",
              "act.silu", median(f), 4 * elems * es / (median(f) * 1e6), median(b),
              7 * elems * es / (median(b) * 1e6), f.size(), isa_name(active_isa()), long(R), long(F));
}

void bench_case(const FfnCase& c, int reps) {
  GroupLayout g = route(c);
  int64_t R = c.T * c.K, D = c.D, F = c.F, E = c.E;
  DType t = c.dtype;
  Tensor xs = filled(t, {R, D}, 1), wi = filled(t, {E, D, 2 * F}, 2), wo = filled(t, {E, F, D}, 3);
  Tensor a = filled(t, {R, F}, 4), dys = filled(t, {R, D}, 5), dh = filled(t, {R, 2 * F}, 6);
  Tensor h = Tensor::empty(t, {R, 2 * F}), ys = Tensor::empty(t, {R, D}), da = Tensor::empty(t, {R, F});
  Tensor dxs = Tensor::empty(t, {R, D}), dwi = Tensor::empty(DType::f32, {E, D, 2 * F});
  Tensor dwo = Tensor::empty(DType::f32, {E, F, D});
  std::vector<Op> ops = {
      {"up.gmm", R, D, 2 * F, [&] { gmm(xs, wi, g, 0, h); }},
      {"down.gmm", R, F, D, [&] { gmm(a, wo, g, 0, ys); }},
      {"down.dlhs", R, D, F, [&] { gmm_dlhs(dys, wo, g, 0, da); }},
      {"down.drhs", F, R, D, [&] { gmm_drhs(a, dys, g, 0, dwo); }},
      {"up.dlhs", R, 2 * F, D, [&] { gmm_dlhs(dh, wi, g, 0, dxs); }},
      {"up.drhs", D, R, 2 * F, [&] { gmm_drhs(xs, dh, g, 0, dwi); }},
  };
  std::printf("%s: T=%ld D=%ld F=%ld E=%ld K=%ld R=%ld, rows/group %ld..%ld, %d threads, median of %d\n", c.name,
              long(c.T), long(D), long(F), long(E), long(c.K), long(R), long(*std::min_element(g.sizes.begin(), g.sizes.end())),
              long(*std::max_element(g.sizes.begin(), g.sizes.end())), ThreadPool::compute().size(), reps);
  std::vector<DenseMatmul> dense;
  DenseBaseline chosen;  // the dtype rule of dense_baseline.h (f32 when our level widens bf16)
  for (const Op& op : ops) dense.push_back(dense_matmul_for(op.m, op.k, op.n, t, chosen));
  std::printf("  kernel level %s; dense baseline: %s (%s)\n", isa_name(active_isa()),
              dense_baseline_name(chosen).c_str(), chosen.why.c_str());
  double fwd_flops = 0, all_flops = 0;
  const char* only = std::getenv("GEMM_BENCH_OP");
  if (only && std::strcmp(only, "up.pair") == 0) return bench_pair(c, g, xs, reps);
  if (only && std::strcmp(only, "act") == 0) return bench_act(c, reps);
  if (only) {  // one op alone (for a profiler): ours only, many reps
    for (const Op& op : ops)
      if (op.name == only) {
        op.run();
        std::vector<double> ms(size_t(std::max(reps, 1)));
        for (double& m : ms) m = time_ms([&] { op.run(); });
        std::sort(ms.begin(), ms.end());
        const double med = ms[ms.size() / 2];
        std::printf("  %-12s %9.2f ms %7.0f GFLOP/s (median of %d; min %.2f, max %.2f ms)\n", op.name.c_str(), med,
                    2.0 * double(op.m) * double(op.k) * double(op.n) / (med * 1e6), reps, ms.front(), ms.back());
      }
    return;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    auto [ours, base] = times_ms_interleaved(reps, ops[i].run, [&] { dense[i].run(); });
    print_row(ops[i].name, dense[i].flops(), ours, base);
    all_flops += dense[i].flops();
    if (i < 2) fwd_flops += dense[i].flops();
  }
  auto [fwd, fwd_base] = times_ms_interleaved(
      reps, [&] { ops[0].run(), ops[1].run(); }, [&] { dense[0].run(), dense[1].run(); });
  print_row("ffn.fwd", fwd_flops, fwd, fwd_base);
  auto [all, all_base] = times_ms_interleaved(
      reps,
      [&] {
        for (const Op& op : ops) op.run();
      },
      [&] {
        for (DenseMatmul& d : dense) d.run();
      });
  print_row("ffn.fwd+bwd", all_flops, all, all_base);
  bench_pair(c, g, xs, reps);
}

}  // namespace
}  // namespace moe::bench

int main(int argc, char** argv) {
  int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const char* filter = argc > 2 ? argv[2] : "";
  const int64_t tokens = argc > 3 ? std::atoll(argv[3]) : 0;
  moe::bench::dense_set_threads(moe::ThreadPool::compute().size());
  try {
    for (auto c : moe::bench::kCases) {
      if (tokens > 0) c.T = tokens;
      if (const char* dt = std::getenv("GEMM_BENCH_DTYPE"))
        c.dtype = std::strcmp(dt, "f32") == 0 ? moe::DType::f32 : moe::DType::bf16;
      if (std::strstr(c.name, filter)) moe::bench::bench_case(c, reps);
    }
  } catch (const moe::Error& e) {  // a bad MOE_GEMM_ISA, no oneDNN matmul at all
    std::fprintf(stderr, "gemm_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
