#include "train/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "moe/safetensors.h"

namespace moe::train {
namespace fs = std::filesystem;
namespace {

// (name, param, m, v) rows of a state, in parameter order.
struct Row {
  std::string name;
  Tensor* p;
  Tensor* m;
  Tensor* v;
};

std::vector<Row> rows(const Config& cfg, TrainState& st) {
  auto p = parameters(cfg, st.params), m = parameters(cfg, st.m), v = parameters(cfg, st.v);
  std::vector<Row> out;
  for (size_t i = 0; i < p.size(); ++i) out.push_back({p[i].name, p[i].tensor, m[i].tensor, v[i].tensor});
  return out;
}

// Checkpoint files in `dir`, oldest first (the zero-padded step sorts by name).
std::vector<fs::path> list_checkpoints(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("ckpt-", 0) == 0 && n.size() > 17 && n.ends_with(".safetensors")) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Whether the temporary file `name` ("<file>.tmp.<pid>.<n>", io/atomic_file.cpp)
// belongs to another process of this host that is still running: a second
// trainer writing into the same directory must not lose its file mid-write.
bool written_by_live_process(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos) return false;
  const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
  if (pid <= 0 || pid == long(::getpid())) return false;
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

// Temporary files of write_file_atomic left in `dir` by a process killed
// mid-write: "ckpt-*.safetensors.tmp.*" and "latest.tmp.*" (not those of a
// live process). Never a checkpoint: list_checkpoints and `latest` only name
// finished files.
std::vector<fs::path> stale_temporaries(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (((n.rfind("ckpt-", 0) == 0 && n.find(".safetensors.tmp.") != std::string::npos) ||
         n.rfind("latest.tmp.", 0) == 0) &&
        !written_by_live_process(n))
      out.push_back(e.path());
  }
  return out;
}

int remove_stale_temporaries(const std::string& dir) {
  int n = 0;
  for (const fs::path& p : stale_temporaries(dir)) n += fs::remove(p) ? 1 : 0;
  return n;
}

std::string meta(const SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata.find(key);
  if (it == f.metadata.end()) fail(f.path, ": not a training checkpoint (no metadata '", key, "')");
  return it->second;
}

void check_meta(const SafetensorsFile& f, const Config& cfg) {
  if (meta(f, "format") != kCheckpointFormat)
    fail(f.path, ": not a training checkpoint (format '", meta(f, "format"), "')");
  if (meta(f, "format_version") != kCheckpointVersion)
    fail(f.path, ": checkpoint format_version ", meta(f, "format_version"),
         " is not supported (this build reads ", kCheckpointVersion, ")");
  for (const char* key : {"seed", "teacher_seed"}) {
    const std::string want = config_value(cfg, key);
    if (meta(f, key) != want)
      fail(f.path, ": checkpoint has ", key, "=", meta(f, key), " but the config has ", key, "=", want,
           " (resume with the run's seeds, or start a new run)");
  }
}

// The tensor `name` of f as a private copy, checked against `shape` and f32.
Tensor take(const SafetensorsFile& f, const std::string& name, const Shape& shape) {
  const Tensor* t = f.find(name);
  if (!t)
    fail(f.path, ": missing tensor '", name, "' (expected ", shape_str(shape),
         " f32; does the config match the checkpoint?)");
  if (t->shape() != shape)
    fail(f.path, ": tensor '", name, "' has shape ", shape_str(t->shape()), ", the config needs ",
         shape_str(shape));
  if (t->dtype() != DType::f32)
    fail(f.path, ": tensor '", name, "' has dtype ", dtype_name(t->dtype()), ", expected f32");
  return t->clone();
}

int64_t parse_step(const SafetensorsFile& f) {
  const std::string s = meta(f, "step");
  try {
    size_t used = 0;
    long long v = std::stoll(s, &used);
    if (used == s.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  fail(f.path, ": bad checkpoint metadata step '", s, "'");
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt-%08lld.safetensors", (long long)step);
  return buf;
}

std::string config_json(const Config& cfg) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& k : config_keys()) j[k] = config_value(cfg, k);
  return j.dump();
}

namespace {

std::string save(const std::string& dir, const Config& cfg, const TrainState& st_in) {
  TrainState st = st_in;  // shallow: parameters() hands out mutable views; nothing is written
  std::vector<std::pair<std::string, Tensor>> ts;
  auto rs = rows(cfg, st);
  for (const Row& r : rs) ts.emplace_back(r.name, *r.p);
  for (const Row& r : rs) ts.emplace_back("opt.m." + r.name, *r.m);
  for (const Row& r : rs) ts.emplace_back("opt.v." + r.name, *r.v);
  const std::map<std::string, std::string> md{{"format", kCheckpointFormat},
                                              {"format_version", kCheckpointVersion},
                                              {"step", std::to_string(st.step)},
                                              {"seed", config_value(cfg, "seed")},
                                              {"teacher_seed", config_value(cfg, "teacher_seed")},
                                              {"config", config_json(cfg)}};
  ensure_directory(dir, "checkpoint_dir");
  const std::string name = checkpoint_file_name(st.step), path = (fs::path(dir) / name).string();
  write_safetensors(path, ts, md);
  write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");
  auto all = list_checkpoints(dir);
  for (size_t i = 0; i + size_t(cfg.keep_checkpoints) < all.size(); ++i)
    if (all[i].filename() != name) fs::remove(all[i]);
  remove_stale_temporaries(dir);
  return path;
}

TrainState load(const std::string& dir, const Config& cfg) {
  const fs::path latest = fs::path(dir) / "latest";
  std::ifstream in(latest);
  if (!in) fail("--resume ", dir, ": no checkpoint (cannot read ", latest.string(), ")");
  std::string name;
  std::getline(in, name);
  if (name.empty() || name.find('/') != std::string::npos)
    fail(latest.string(), ": does not name a checkpoint file (got '", name, "')");
  return state_from_checkpoint(read_safetensors((fs::path(dir) / name).string()), cfg);
}

}  // namespace

int prepare_checkpoint_dir(const std::string& dir) {
  ensure_directory(dir, "checkpoint_dir");
  return with_context("checkpoint_dir " + dir, [&] { return remove_stale_temporaries(dir); });
}

std::string save_checkpoint(const std::string& dir, const Config& cfg, const TrainState& st) {
  return with_context("checkpoint_dir " + dir, [&] { return save(dir, cfg, st); });
}

TrainState state_from_checkpoint(const SafetensorsFile& f, const Config& cfg) {
  return with_context(f.path, [&] {
    check_meta(f, cfg);
    TrainState st = fresh_state(cfg);
    st.step = parse_step(f);
    size_t expected = 0;
    auto shapes = parameter_shapes(cfg);
    auto rs = rows(cfg, st);
    for (size_t i = 0; i < rs.size(); ++i) {
      *rs[i].p = take(f, rs[i].name, shapes[i].second);
      *rs[i].m = take(f, "opt.m." + rs[i].name, shapes[i].second);
      *rs[i].v = take(f, "opt.v." + rs[i].name, shapes[i].second);
      expected += 3;
    }
    if (f.tensors.size() != expected) {
      for (const auto& entry : f.tensors) {
        const std::string& n = entry.first;  // (clang 14 cannot capture a structured binding)
        bool known = std::any_of(rs.begin(), rs.end(), [&](const Row& r) {
          return n == r.name || n == "opt.m." + r.name || n == "opt.v." + r.name;
        });
        if (!known)
          fail(f.path, ": unexpected tensor '", n, "' (the config has num_layers=", cfg.num_layers, ")");
      }
    }
    return st;
  });
}

TrainState load_checkpoint(const std::string& dir, const Config& cfg) {
  return with_context("--resume " + dir, [&] { return load(dir, cfg); });
}

}  // namespace moe::train
