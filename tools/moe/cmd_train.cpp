// moe train [CONFIG] [key=value ...] [--resume DIR] [--until STEP] [--progress MODE]
// The main job (SPEC.md §7): trains the MoE stack on the teacher-student task
// (include/moe/train.h, docs/training.md). Without CONFIG the embedded default
// config is used; overrides apply on top of either. Under mpirun with any
// parallelism the distributed layer trains (docs/training.md "Distributed
// training"): rank 0 prints and writes files, an error on any rank aborts all.
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "moe/config.h"
#include "moe/memory_estimate.h"
#include "moe/train.h"
#include "moe/watchdog.h"
#include "progress.h"

namespace moe::cli {
namespace {

struct TrainArgs {
  std::vector<std::string> words;  // [CONFIG] then key=value overrides
  std::string resume;
  int64_t until = -1;
  bool until_given = false;
  std::string progress = "auto";
};

LoadedConfig resolve(const std::vector<std::string>& words) {
  const bool has_file = !words.empty() && words[0].find('=') == std::string::npos;
  std::vector<std::string> overrides(words.begin() + (has_file ? 1 : 0), words.end());
  LoadedConfig lc = has_file ? load_config(words[0], overrides)
                             : parse_config(default_train_config(), "<embedded default>", overrides);
  refuse_f64(lc.config, has_file ? words[0] : "<embedded default>");
  return lc;
}

void print_summary(const TrainSummary& s) {
  const int64_t n = s.last_step - s.first_step + 1;
  std::printf("\nsummary (%lld steps, %lld..%lld, %.2f s)\n", (long long)n, (long long)s.first_step,
              (long long)s.last_step, s.seconds);
  std::printf("  loss            first %.6e  last %.6e  last/first %.4f\n", s.first_loss, s.last_loss,
              s.first_loss > 0 ? s.last_loss / s.first_loss : 0.0);
  std::printf(
      "  throughput      %.0f tokens/s  %.3f GFLOP/s on %d rank(s)  fraction of dense GEMM peak: %s\n",
      s.tokens_per_s, s.gflops, s.ranks,
      s.fraction_of_dense < 0 ? "n/a" : std::to_string(s.fraction_of_dense).c_str());
  if (s.dense_gflops > 0)
    std::printf(
        "  dense baseline  %.3f GFLOP/s per rank ([R_l, D] x [D, 3F], measured after the steps): %s\n",
        s.dense_gflops, s.dense_baseline.c_str());
  const double total = s.ms_data + s.ms_teacher + s.ms_norm + s.ms_moe_forward + s.ms_moe_backward +
                       s.ms_optimizer + s.ms_other;
  auto pct = [&](double v) { return total > 0 ? 100.0 * v / total : 0.0; };
  std::printf(
      "  time split      moe fwd %.1f%%  moe bwd %.1f%%  teacher %.1f%%  norm %.1f%%  optimizer %.1f%%  data "
      "%.1f%%  other %.1f%%\n",
      pct(s.ms_moe_forward), pct(s.ms_moe_backward), pct(s.ms_teacher), pct(s.ms_norm), pct(s.ms_optimizer),
      pct(s.ms_data), pct(s.ms_other));
  std::printf(
      "  by work         gemm %.1f%%  permute/combine %.1f%%  router %.1f%%  exposed comm %.1f%%  other "
      "%.1f%%\n",
      pct(s.ms_gemm), pct(s.ms_permute_combine), pct(s.ms_router), pct(s.ms_exposed_comm), pct(s.ms_rest));
  std::printf("  expert load     max/mean tokens per expert %.3f (averaged over steps and layers)\n",
              s.load_balance);
  if (s.step_minimum_mib > 0)
    std::printf("  step memory     peak %.1f MiB, analytic minimum %.1f MiB (%.2fx): %s\n", s.step_peak_mib,
                s.step_minimum_mib, s.step_peak_mib / s.step_minimum_mib, s.step_minimum_terms.c_str());
  if (!s.last_checkpoint.empty()) std::printf("  checkpoint      %s\n", s.last_checkpoint.c_str());
}

void train(const LoadedConfig& loaded, const TrainArgs& a, bool root, Communicator* comm) {
  if (root) std::fputs(format_config_table(loaded.table).c_str(), stdout);
  Progress progress(root ? parse_progress_mode(a.progress) : ProgressMode::none, loaded.config.log_period);
  TrainOptions opt;
  opt.resume_dir = a.resume;
  opt.stop_at = a.until;
  opt.comm = comm;
  opt.on_step = [&](const StepMetrics& m) { progress.update(m); };
  opt.log = [&](const std::string& line) {
    progress.finish();
    std::printf("%s\n", line.c_str());
  };
  try {
    TrainSummary s = run_training(loaded.config, opt);
    progress.finish();
    if (root && s.last_step >= s.first_step) print_summary(s);
  } catch (...) {
    progress.finish();
    std::fflush(stdout);
    throw;
  }
}

// Under mpirun any error (config, checkpoint, divergence) on any rank takes
// the whole job down with its message: never a hang.
void run_train(const TrainArgs& a) {
  Communicator& w = world();
  run_collectively(w, [&] {
    if (a.until_given && a.until < 1) fail("--until ", a.until, ": expected a step >= 1");
    parse_progress_mode(a.progress);  // a bad --progress is an error before any work
    LoadedConfig loaded = resolve(a.words);
    apply_collective_timeout(loaded.config.collective_timeout_s);
    apply_collective_liveness(loaded.config.collective_liveness_s);
    // Resources before work: the whole stack's step (every layer's activations, the training state).
    std::vector<std::string> too_big =
        memory_problems(loaded.config, w.size(), /*train_stack=*/true, physical_memory_bytes());
    if (!too_big.empty())
      throw ConfigError(
          a.words.empty() || a.words[0].find('=') != std::string::npos ? "<embedded default>" : a.words[0],
          too_big);
    const bool dist = distributed(loaded.config);
    train(loaded, a, w.rank() == 0, dist ? &w : nullptr);
  });
}

}  // namespace

void add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand(
      "train",
      "The main job: train a stack of MoE blocks on a teacher-student task (docs/training.md).\n"
      "Without CONFIG the embedded default config runs; key=value overrides apply either way.");
  c->add_option("CONFIG_AND_OVERRIDES", a->words, "[CONFIG.yaml] then key=value overrides");
  c->add_option("--resume", a->resume, "Continue from the latest checkpoint in DIR (bit-exact)");
  CLI::Option* until = c->add_option(
      "--until", a->until,
      "Stop after this step (>= 1; checkpointing it) without changing the schedule, which `steps` defines");
  c->add_option("--progress", a->progress,
                 "Per-step output: bar (redrawn in place), lines (one every log_period steps), none, or auto "
                 "(default: the bar on an interactive terminal; lines under mpirun/srun, a batch system, a "
                 "pipe or a file)");
  c->footer("Show the embedded default config: moe train --print-default-config");
  c->add_flag_callback(
      "--print-default-config",
      [] {
        std::fputs(default_train_config(), stdout);
        throw CLI::Success();
      },
      "Print the embedded default config and exit");
  c->callback([a, until] {
    a->until_given = until->count() > 0;
    run_train(*a);
  });
}

}  // namespace moe::cli
