// moe train through the library: RMSNorm gradient, AdamW, schedule, the loss
// falling, exact resume, checkpoint errors, the non-finite stop, metrics and
// the report (include/moe/train.h, src/train/).
#include "moe/train.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moe/safetensors.h"
#include "testing/temp_dir.h"
#include "testing/tensors.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/report.h"
#include "train/rmsnorm.h"

namespace moe {
namespace {

using testing::TempDir;

const char* kTiny =
    "num_experts: 4\nnum_experts_per_tok: 2\nemb_dim: 16\nmoe_mlp_dim: 32\ndtype: f32\nnum_layers: 2\n"
    "batch_tokens: 64\nlearning_rate: 0.01\nwarmup_steps: 3\nsteps: 10\n";

Config tiny(std::vector<std::string> overrides = {}) { return parse_config(kTiny, "tiny", overrides).config; }

// sum(y * w) for the RMSNorm of x with scale s, in double from the f32 forward.
double probe(const Tensor& x, const Tensor& s, const Tensor& w) {
  Tensor y = train::rmsnorm_forward(x, s).y;
  double acc = 0;
  for (int64_t i = 0; i < y.numel(); ++i) acc += double(y.get_f32(i)) * w.get_f32(i);
  return acc;
}

// Central difference of probe() in element i of t.
double numeric(Tensor& t, int64_t i, const std::function<double()>& f) {
  const float h = 1e-2f, keep = t.data<float>()[i];
  t.data<float>()[i] = keep + h;
  const double up = f();
  t.data<float>()[i] = keep - h;
  const double down = f();
  t.data<float>()[i] = keep;
  return (up - down) / (2.0 * h);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Tensor x = testing::uniform({3, 7}, 1, -2, 2), s = testing::uniform({7}, 2, 0.5, 1.5),
         w = testing::uniform({3, 7}, 3);
  auto fwd = train::rmsnorm_forward(x, s);
  auto g = train::rmsnorm_backward(x, s, fwd.inv_rms, w);
  auto f = [&] { return probe(x, s, w); };
  for (int64_t i = 0; i < x.numel(); ++i) EXPECT_NEAR(g.dx.get_f32(i), numeric(x, i, f), 2e-3) << "dx " << i;
  for (int64_t i = 0; i < s.numel(); ++i)
    EXPECT_NEAR(g.dscale.get_f32(i), numeric(s, i, f), 2e-3) << "dscale " << i;
  // The forward itself: y = x / rms * scale.
  double ss = 0;
  for (int d = 0; d < 7; ++d) ss += double(x.get_f32(d)) * x.get_f32(d);
  EXPECT_NEAR(fwd.y.get_f32(2), x.get_f32(2) / std::sqrt(ss / 7 + 1e-6) * s.get_f32(2), 1e-5);
}

TEST(AdamW, TwoStepsMatchAHandComputation) {
  train::AdamWHyper h{0.1, 0.9, 0.999, 1e-8, 0.1};
  float p[2] = {1.0f, 1.0f}, m[2] = {0, 0}, v[2] = {0, 0};
  const float g1[2] = {0.5f, 0.5f}, g2[2] = {-0.25f, -0.25f};
  train::adamw_update(p, g1, m, v, 1, 1, h, true);               // element 0: decayed
  train::adamw_update(p + 1, g1, m + 1, v + 1, 1, 1, h, false);  // element 1: not
  // Step 1: m = 0.05, v = 2.5e-4, m^ = 0.5, v^ = 0.25: update 0.5 / (0.5 + 1e-8).
  EXPECT_NEAR(p[0], 1.0 - 0.1 * (0.5 / (0.5 + 1e-8)) - 0.1 * 0.1 * 1.0, 1e-6);
  EXPECT_NEAR(p[1], 1.0 - 0.1 * (0.5 / (0.5 + 1e-8)), 1e-6);
  const double p1 = p[0];
  train::adamw_update(p, g2, m, v, 1, 2, h, true);
  const double m2 = 0.9 * 0.05 + 0.1 * -0.25, v2 = 0.999 * 2.5e-4 + 0.001 * 0.0625;
  const double upd = (m2 / (1 - 0.81)) / (std::sqrt(v2 / (1 - 0.999 * 0.999)) + 1e-8);
  EXPECT_NEAR(m[0], m2, 1e-7);
  EXPECT_NEAR(v[0], v2, 1e-6 * v2);
  EXPECT_NEAR(p[0], p1 - 0.1 * upd - 0.01 * p1, 1e-6);
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  Config c = tiny({"learning_rate=2", "warmup_steps=4", "steps=14", "min_lr_ratio=0.1"});
  EXPECT_DOUBLE_EQ(train::learning_rate_at(c, 0), 0.5);
  EXPECT_DOUBLE_EQ(train::learning_rate_at(c, 1), 1.0);
  EXPECT_DOUBLE_EQ(train::learning_rate_at(c, 3), 2.0);
  EXPECT_DOUBLE_EQ(train::learning_rate_at(c, 4), 2.0);                      // cosine starts at the peak
  EXPECT_NEAR(train::learning_rate_at(c, 9), 2 * (0.1 + 0.9 * 0.5), 1e-12);  // halfway
  EXPECT_NEAR(train::learning_rate_at(c, 14), 0.2, 1e-12);                   // the floor
  Config flat = tiny({"warmup_steps=0", "steps=1", "min_lr_ratio=1"});
  EXPECT_DOUBLE_EQ(train::learning_rate_at(flat, 0), flat.learning_rate);
}

TEST(Train, LossFallsOnATinyConfig) {
  TrainSummary s = run_training(tiny({"steps=30"}), {});
  EXPECT_EQ(s.first_step, 1);
  EXPECT_EQ(s.last_step, 30);
  EXPECT_LT(s.last_loss, 0.8 * s.first_loss) << s.first_loss << " -> " << s.last_loss;
  EXPECT_GT(s.gflops, 0);
  EXPECT_GE(s.load_balance, 1.0);
}

// Every tensor of two checkpoint files, compared bit for bit.
void expect_same_tensors(const std::string& a, const std::string& b) {
  SafetensorsFile fa = read_safetensors(a), fb = read_safetensors(b);
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  for (size_t i = 0; i < fa.tensors.size(); ++i) {
    EXPECT_EQ(fa.tensors[i].first, fb.tensors[i].first);
    EXPECT_TRUE(fa.tensors[i].second.bit_equal(fb.tensors[i].second)) << fa.tensors[i].first;
  }
  for (const char* k : {"format", "format_version", "step", "seed", "teacher_seed"})
    EXPECT_EQ(fa.metadata.at(k), fb.metadata.at(k)) << k;  // "config" differs: the paths
}

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Train, ResumeIsBitExact) {
  TempDir d;
  run_training(tiny({"checkpoint_dir=" + d.file("a"), "metrics_file=" + d.file("a.jsonl")}), {});
  Config b =
      tiny({"checkpoint_dir=" + d.file("b"), "checkpoint_period=2", "metrics_file=" + d.file("b.jsonl")});
  TrainOptions stop;
  stop.stop_at = 5;
  EXPECT_EQ(run_training(b, stop).last_step, 5);
  TrainOptions resume;
  resume.resume_dir = d.file("b");
  TrainSummary s = run_training(b, resume);
  EXPECT_EQ(s.first_step, 6);
  EXPECT_EQ(s.last_step, 10);
  expect_same_tensors(d.file("a/") + train::checkpoint_file_name(10),
                      d.file("b/") + train::checkpoint_file_name(10));
  auto la = metrics_lines(d.file("a.jsonl")), lb = metrics_lines(d.file("b.jsonl"));
  ASSERT_EQ(la.size(), 10u);
  ASSERT_EQ(lb.size(), 10u);
  for (size_t i = 0; i < la.size(); ++i) {
    EXPECT_EQ(lb[i]["step"], int64_t(i + 1));
    EXPECT_EQ(la[i]["loss"].get<double>(), lb[i]["loss"].get<double>()) << "step " << i + 1;
  }
  // keep_checkpoints=3: only the newest three remain, and `latest` names the last.
  std::vector<std::string> want{"ckpt-00000006.safetensors", "ckpt-00000008.safetensors",
                                "ckpt-00000010.safetensors", "latest"};
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(d.file("b"))) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, want);
}

TEST(Checkpoint, WholeTensorsNamedPerSpecWithMetadata) {
  TempDir d;
  run_training(tiny({"steps=1", "checkpoint_dir=" + d.path()}), {});
  SafetensorsFile f = read_safetensors(d.file(train::checkpoint_file_name(1)));
  for (const char* n : {"layers.0.router.kernel", "layers.1.experts.wi_0", "layers.1.experts.wo",
                        "layers.0.norm.scale", "opt.m.layers.0.router.kernel", "opt.v.layers.1.norm.scale"})
    EXPECT_NE(f.find(n), nullptr) << n;
  EXPECT_EQ(f.at("layers.1.experts.wi_1").shape(), (Shape{4, 16, 32}));
  EXPECT_EQ(f.tensors.size(), 3u * 2u * 5u);
  EXPECT_EQ(f.metadata.at("format"), train::kCheckpointFormat);
  EXPECT_EQ(f.metadata.at("step"), "1");
  EXPECT_EQ(nlohmann::json::parse(f.metadata.at("config"))["emb_dim"], "16");
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Checkpoint, MismatchedOrCorruptIsANamedError) {
  TempDir d;
  run_training(tiny({"steps=1", "checkpoint_dir=" + d.path()}), {});
  auto load = [&](const Config& c) { return [&, c] { train::load_checkpoint(d.path(), c); }; };
  std::string e = error_of(load(tiny({"emb_dim=32"})));
  EXPECT_NE(e.find("layers.0.router.kernel' has shape [16, 4], the config needs [32, 4]"), std::string::npos)
      << e;
  e = error_of(load(tiny({"num_layers=3"})));
  EXPECT_NE(e.find("missing tensor 'layers.2.router.kernel'"), std::string::npos) << e;
  e = error_of(load(tiny({"num_layers=1"})));
  EXPECT_NE(e.find("unexpected tensor 'layers.1."), std::string::npos) << e;
  e = error_of(load(tiny({"seed=5"})));
  EXPECT_NE(e.find("seed=0 but the config has seed=5"), std::string::npos) << e;
  e = error_of([&] { train::load_checkpoint(d.file("nowhere"), tiny()); });
  EXPECT_NE(e.find("no checkpoint"), std::string::npos) << e;
  const std::string file = d.file(train::checkpoint_file_name(1));
  testing::write_bytes(file, testing::read_bytes(file).substr(0, 100));
  e = error_of(load(tiny()));
  EXPECT_NE(e.find(file), std::string::npos) << e;
}

TEST(Train, NonFiniteLossStopsAndKeepsTheLastGoodCheckpoint) {
  TempDir d;
  Config c =
      tiny({"learning_rate=1e30", "warmup_steps=0", "checkpoint_period=1", "checkpoint_dir=" + d.path()});
  std::string e;
  try {
    run_training(c, {});
  } catch (const NonFiniteError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("non-finite"), std::string::npos) << e;
  EXPECT_NE(e.find("at step 2"), std::string::npos) << e;
  EXPECT_NE(e.find("last good checkpoint: " + d.file(train::checkpoint_file_name(1))), std::string::npos)
      << e;
  EXPECT_EQ(testing::read_bytes(d.file("latest")), train::checkpoint_file_name(1) + "\n");
  EXPECT_EQ(train::load_checkpoint(d.path(), c).step, 1);  // loads: finite and whole
}

// After --resume, with no checkpoint written yet, the last good one is the one resumed from.
TEST(Train, NonFiniteAfterResumeNamesTheResumedCheckpoint) {
  TempDir d;
  TrainOptions until1;
  until1.stop_at = 1;
  run_training(tiny({"checkpoint_dir=" + d.path()}), until1);
  TrainOptions resume;
  resume.resume_dir = d.path();
  std::string e;
  try {
    run_training(tiny({"learning_rate=1e30", "warmup_steps=0"}), resume);
  } catch (const NonFiniteError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("non-finite"), std::string::npos) << e;
  EXPECT_NE(e.find("last good checkpoint: " + d.file(train::checkpoint_file_name(1))), std::string::npos)
      << e;
  EXPECT_EQ(testing::read_bytes(d.file("latest")), train::checkpoint_file_name(1) + "\n");
}

// Temporary files a killed writer left ("ckpt-*.safetensors.tmp.*", "latest.tmp.*") go when a run starts
// and at every keep-rotation; other files stay.
TEST(Checkpoint, StaleTemporaryFilesAreRemoved) {
  TempDir d;
  auto leave_temporaries = [&] {
    // pid 2147483000: above any pid_max, so no live process wrote these.
    testing::write_bytes(d.file("ckpt-00000002.safetensors.tmp.2147483000.0"), "partial");
    testing::write_bytes(d.file("latest.tmp.2147483000.1"), "ckpt-0000");
  };
  testing::write_bytes(d.file("notes.txt"), "mine");
  leave_temporaries();
  EXPECT_EQ(train::prepare_checkpoint_dir(d.path()), 2);
  EXPECT_EQ(d.list(), (std::vector<std::string>{"notes.txt"}));
  leave_temporaries();
  run_training(tiny({"steps=1", "checkpoint_dir=" + d.path()}), {});  // at start, then after its checkpoint
  EXPECT_EQ(d.list(), (std::vector<std::string>{"ckpt-00000001.safetensors", "latest", "notes.txt"}));
  leave_temporaries();
  Config c = tiny();
  train::save_checkpoint(d.path(), c, train::load_checkpoint(d.path(), c));  // the rotation
  EXPECT_EQ(d.list(), (std::vector<std::string>{"ckpt-00000001.safetensors", "latest", "notes.txt"}));
}

// A temporary file of a live process (another trainer writing into the same directory) is
// not stale: removing it would make that process's rename fail mid-checkpoint.
TEST(Checkpoint, TemporaryFileOfALiveProcessIsKept) {
  TempDir d;
  const std::string live = "ckpt-00000002.safetensors.tmp." + std::to_string(::getppid()) + ".0";
  testing::write_bytes(d.file(live), "partial");
  EXPECT_EQ(train::prepare_checkpoint_dir(d.path()), 0);
  EXPECT_EQ(d.list(), (std::vector<std::string>{live}));
}

TEST(Metrics, EveryLineHasTheRequiredFields) {
  TempDir d;
  run_training(tiny({"steps=3", "metrics_file=" + d.file("m.jsonl")}), {});
  auto lines = metrics_lines(d.file("m.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  for (const char* k : {"step", "loss", "mse", "lb", "z", "lr", "grad_norm", "step_ms", "tokens",
                        "tokens_per_s", "dropped", "collective_bytes", "load"})
    EXPECT_TRUE(lines[2].contains(k)) << k;
  EXPECT_EQ(lines[2]["step"], 3);
  EXPECT_EQ(lines[2]["collective_bytes"], 0);
  ASSERT_EQ(lines[2]["load"].size(), 2u);
  EXPECT_DOUBLE_EQ(lines[2]["load"][0]["mean"].get<double>(), 64.0 * 2 / 4);
  EXPECT_NEAR(lines[0]["loss"].get<double>(),
              lines[0]["mse"].get<double>() + lines[0]["lb"].get<double>() + lines[0]["z"].get<double>(),
              1e-12);
}

TEST(Report, DrawsOnePointPerStepAndNamesBadLines) {
  TempDir d;
  run_training(tiny({"steps=4", "metrics_file=" + d.file("m.jsonl")}), {});
  train::MetricsSeries s = train::read_metrics(d.file("m.jsonl"));
  std::string svg = train::render_report_svg(s, "t <&>");
  EXPECT_EQ(svg.find("<?xml"), 0u);
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("t &lt;&amp;&gt;"), std::string::npos);
  size_t at = svg.find("<polyline");
  ASSERT_NE(at, std::string::npos);
  std::string pts = svg.substr(svg.find("points='", at) + 8);
  pts = pts.substr(0, pts.find('\''));
  EXPECT_EQ(std::count(pts.begin(), pts.end(), ','), 4);  // loss: one x,y pair per step
  size_t polylines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++polylines;
  EXPECT_EQ(polylines, 3u);  // loss + one per layer
  std::string e = error_of([&] { train::read_metrics(d.file("missing.jsonl")); });
  EXPECT_NE(e.find("missing.jsonl: cannot open"), std::string::npos) << e;
  std::ofstream(d.file("bad.jsonl")) << "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": \n";
  e = error_of([&] { train::read_metrics(d.file("bad.jsonl")); });
  EXPECT_NE(e.find("bad.jsonl:2: not a JSON object"), std::string::npos) << e;
  std::ofstream(d.file("noloss.jsonl")) << "{\"step\": 1}\n";
  e = error_of([&] { train::read_metrics(d.file("noloss.jsonl")); });
  EXPECT_NE(e.find("noloss.jsonl:1: missing field 'loss'"), std::string::npos) << e;
}

}  // namespace
}  // namespace moe
