#include "bench/harness.h"

#include <fstream>
#include <map>
#include <sstream>

#include "bench/dense_baseline.h"
#include "bench/kernel_bandwidth.h"
#include "bench/timing.h"
#include "moe/isa.h"
#include "moe/layer.h"
#include "route/routing.h"

namespace moe::bench {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// What a variant's check compares: y and grad.x (topk_idx feeds the kernel timing).
struct StepOutputs {
  Tensor y, dx, topk_idx;
};

StepOutputs run_step(const Config& cfg, const LayerWeights& w, const CaseInputs& in) {
  LayerOutputs out;
  auto fwd = layer_forward(cfg, w, in.x, in.forced(), out);
  LayerGrads g = layer_backward(cfg, *fwd, in.dy);
  return {out.y, g.dx, out.topk_idx};
}

// "" when bit-identical, else what differs.
std::string compare(const StepOutputs& base, const StepOutputs& got) {
  std::string diff;
  if (!got.y.bit_equal(base.y)) diff += "y differs";
  if (!got.dx.bit_equal(base.dx)) diff += diff.empty() ? "grad.x differs" : ", grad.x differs";
  return diff;
}

struct PassTimes {
  std::vector<double> fwd_ms, fwd_bwd_ms;
  std::vector<double> dense_ms;  // the dense baseline, one run beside each timed step
  int64_t fwd_peak = 0, fwd_bwd_peak = 0;  // bytes above what was live before the pass
};

// Each timed step is paired with one run of the dense baseline, the dense run first in even
// pairs and second in odd ones, so a slow phase of the machine (or the order) favours neither.
PassTimes time_variant(const Config& cfg, const LayerWeights& w, const CaseInputs& in, DenseRunner& dense,
                       int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) run_step(cfg, w, in);
  PassTimes p;
  for (int i = 0; i < iters; ++i) {
    if (i % 2 == 0) p.dense_ms.push_back(dense.run_ms()), dense.settle();
    TensorMemoryStats before = reset_tensor_memory_peak();
    double t0 = now_ms();
    LayerOutputs out;
    auto fwd = layer_forward(cfg, w, in.x, in.forced(), out);
    double t1 = now_ms();
    p.fwd_peak = std::max(p.fwd_peak, tensor_memory_stats().peak_bytes - before.current_bytes);
    // The timed step frees what its backward has used (BackwardOptions::release_saved): same bits.
    LayerGrads g = layer_backward(cfg, *fwd, in.dy, {}, BackwardOptions{.release_saved = true});
    double t2 = now_ms();
    p.fwd_bwd_peak = std::max(p.fwd_bwd_peak, tensor_memory_stats().peak_bytes - before.current_bytes);
    p.fwd_ms.push_back(t1 - t0);
    p.fwd_bwd_ms.push_back(t2 - t0);
    if (i % 2 == 1) p.dense_ms.push_back(dense.run_ms()), dense.settle();
  }
  return p;
}

// Per-case state shared by its variants.
struct CaseRun {
  const Case& c;
  const BenchOptions& opts;
  CaseInputs in;
  DenseRunner dense;
  double dense_reference_ms = 0;  // slow_phase's reference (harness.h)
  KernelBandwidth bw{};
  bool bw_measured = false;
  std::map<std::string, StepOutputs> baselines{};
};

// Bytes of what a step reads that was live before it: the weights and the case's inputs.
int64_t step_input_bytes(const Config& cfg, const LayerWeights& w, const CaseInputs& in) {
  int64_t b = int64_t(in.x.nbytes() + in.dy.nbytes() + in.topk_idx.nbytes());
  w.for_each(cfg, [&](const std::string&, const Tensor& t) { b += int64_t(t.nbytes()); });
  return b;
}

BenchResult make_row(const CaseRun& run, const Variant& v, bool with_bwd, const std::vector<double>& ms,
                     const std::vector<double>& dense_ms, int64_t peak_bytes) {
  const Case& c = run.c;
  BenchResult r;
  r.case_name = c.name, r.variant = v.name, r.dtype = dtype_name(run.opts.dtype);
  r.pass = with_bwd ? "fwd+bwd" : "fwd";
  r.T = c.T, r.D = c.D, r.F = c.F, r.E = c.E, r.K = c.K;
  r.iters = int(ms.size());
  r.flops = with_bwd ? forward_backward_flops(c) : forward_flops(c);
  Timing t = summarize(ms);
  r.median_ms = t.median_ms, r.min_ms = t.min_ms, r.max_ms = t.max_ms;
  r.gflops = r.flops / std::max(t.median_ms, 1e-6) / 1e6;
  r.dense_gflops = run.dense.gflops(summarize(dense_ms).median_ms);
  r.dense = run.dense.baseline();
  r.fraction_of_dense = r.dense_gflops > 0 ? r.gflops / r.dense_gflops : 0;
  r.peak_rss_mib = peak_rss_mib();
  r.peak_alloc_mib = double(peak_bytes) / kMiB;
  const bool fused = v.kernels == KernelChoice::fused;
  r.permute_gbps = fused ? run.bw.permute_fused_gbps : run.bw.permute_reference_gbps;
  r.combine_gbps = fused ? run.bw.combine_fused_gbps : run.bw.combine_reference_gbps;
  r.memcpy_gbps = run.bw.memcpy_gbps;
  r.permute_fraction_of_memcpy = r.memcpy_gbps > 0 ? r.permute_gbps / r.memcpy_gbps : 0;
  r.combine_fraction_of_memcpy = r.memcpy_gbps > 0 ? r.combine_gbps / r.memcpy_gbps : 0;
  return r;
}

void measure_bandwidth(CaseRun& run, const Tensor& topk_idx) {
  const Case& c = run.c;
  Routing rt = compute_routing(topk_idx.data<int32_t>(), c.T, c.K, c.E,
                               expert_capacity(c.T, c.K, c.E, c.capacity_factor));
  run.bw = measure_kernel_bandwidth(c, run.opts.dtype, run.in.x.to(run.opts.dtype), rt,
                                    std::max(run.opts.iters, 3));
  run.bw_measured = true;
}

// Check run, then warm-up and timed runs; emits the variant's two rows.
void run_variant(CaseRun& run, const Variant& v, std::vector<BenchResult>& rows,
                 const std::function<void(const BenchResult&)>& on_result) {
  Config cfg = variant_config(run.c, run.opts.dtype, v);
  if (run.opts.weight_dtype) cfg.weight_dtype = *run.opts.weight_dtype;
  LayerWeights w = init_weights(cfg, run.c.seed);
  StepOutputs s = run_step(cfg, w, run.in);
  if (!run.bw_measured) measure_bandwidth(run, s.topk_idx);
  std::string check = "ref", detail;
  if (v.baseline.empty()) {
    run.baselines[v.name] = s;
  } else {
    detail = compare(run.baselines.at(v.baseline), s);
    check = detail.empty() ? "PASS" : "FAIL";
  }
  if (!v.timed) return;
  PassTimes p = time_variant(cfg, w, run.in, run.dense, run.opts.warmup, run.opts.iters);
  const double first_dense_ms = summarize(p.dense_ms).median_ms;
  int retimed = 0;
  for (; retimed < kRetimes && slow_phase(p.dense_ms, run.dense_reference_ms); ++retimed) {
    PassTimes again = time_variant(cfg, w, run.in, run.dense, run.opts.warmup, run.opts.iters);
    if (summarize(again.dense_ms).median_ms < summarize(p.dense_ms).median_ms) p = std::move(again);
  }
  const bool still_slow = slow_phase(p.dense_ms, run.dense_reference_ms);
  const double kept_dense_ms = summarize(p.dense_ms).median_ms;
  std::string note;
  if (retimed > 0 || still_slow) {
    std::ostringstream os;
    os.precision(2);
    os << std::fixed << run.c.name << " " << v.name << ": its paired dense runs ran at "
       << run.dense_reference_ms / first_dense_ms
       << " of the case's reference rate (a slow phase of the machine); timed " << retimed << " more time"
       << (retimed == 1 ? "" : "s") << ", the attempt with the fastest dense runs kept ("
       << run.dense_reference_ms / kept_dense_ms << " of the reference)"
       << (still_slow ? ", still slow: its fraction_of_dense overstates the layer" : "");
    note = os.str();
  }
  run.dense_reference_ms = std::min(run.dense_reference_ms, kept_dense_ms);
  const int64_t inputs = step_input_bytes(cfg, w, run.in);
  for (bool with_bwd : {false, true}) {
    BenchResult r = make_row(run, v, with_bwd, with_bwd ? p.fwd_bwd_ms : p.fwd_ms, p.dense_ms,
                             with_bwd ? p.fwd_bwd_peak : p.fwd_peak);
    r.step_peak_mib = double(inputs + (with_bwd ? p.fwd_bwd_peak : p.fwd_peak)) / kMiB;
    if (with_bwd) {
      r.minimum = step_minimum(cfg, run.c.T, run.in.x.dtype(), w.router.dtype());
      r.peak_over_minimum = r.step_peak_mib / double(r.minimum.total() / kMiB);
    }
    r.check = check;
    r.check_detail = detail.empty() ? "" : detail + " vs " + v.baseline;
    r.retimed = retimed, r.dense_slow_phase = still_slow;
    if (!with_bwd) r.note = note;  // once per variant
    if (on_result) on_result(r);
    rows.push_back(std::move(r));
  }
}

}  // namespace

std::vector<BenchResult> run_bench(const BenchOptions& opts,
                                   const std::function<void(const BenchResult&)>& on_result) {
  if (opts.iters < 1) fail("--iters must be at least 1, got ", opts.iters);
  if (opts.warmup < 0) fail("--warmup must be at least 0, got ", opts.warmup);
  if (opts.dtype != DType::bf16 && opts.dtype != DType::f32)
    fail("--dtype must be bf16 or f32, got ", dtype_name(opts.dtype));
  (void)active_isa();  // a bad MOE_GEMM_ISA fails before anything runs
  std::vector<Case> cases;
  for (const auto& name : opts.cases) cases.push_back(find_case(name));
  if (opts.cases.empty()) cases = bench_cases();
  for (Case& c : cases) c = with_shape_overrides(c, opts.overrides, "moe bench");
  std::vector<BenchResult> rows;
  for (const Case& c : cases) {
    // The expert GEMMs of one forward as one dense GEMM: [R, D] x [D, 3F] (6*R*D*F FLOPs), kept
    // for the case and timed beside each of its timed steps.
    CaseRun run{c, opts, case_inputs(c, opts.seed), DenseRunner(c.rows(), c.D, 3 * c.F, opts.dtype)};
    std::vector<double> start;
    for (int i = 0; i < 3; ++i) start.push_back(run.dense.run_ms()), run.dense.settle();
    run.dense_reference_ms = summarize(start).median_ms;
    for (const Variant& v : case_variants(c)) run_variant(run, v, rows, on_result);
  }
  return rows;
}

bool slow_phase(const std::vector<double>& dense_ms, double reference_ms) {
  return !dense_ms.empty() && reference_ms > 0 && summarize(dense_ms).median_ms > kSlowPhase * reference_ms;
}

bool all_checks_passed(const std::vector<BenchResult>& results) {
  for (const auto& r : results)
    if (r.check == "FAIL") return false;
  return true;
}

double peak_rss_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream is(line.substr(6));
    double kib = 0;
    is >> kib;
    return kib / 1024.0;
  }
  return 0;
}

}  // namespace moe::bench
