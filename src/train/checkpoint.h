// Training checkpoints (docs/formats.md "checkpoints"): one safetensors file
// per saved step, `ckpt-<step, 8 digits>.safetensors`, holding whole tensors
// only (no layout-specific shards): `layers.{i}.*` parameters, `opt.m.<name>`
// and `opt.v.<name>` moments, all f32; metadata: format, format_version, step,
// seed, teacher_seed, config (the resolved config as a JSON object of printed
// values). A `latest` file names the newest checkpoint; both are written
// atomically, the file first, so `latest` never names a partial file.
#pragma once

#include <string>

#include "moe/config.h"
#include "moe/safetensors.h"
#include "train/train_state.h"

namespace moe::train {

inline constexpr const char* kCheckpointFormat = "moe-engine train checkpoint";
inline constexpr const char* kCheckpointVersion = "1";

// "ckpt-00000042.safetensors"
std::string checkpoint_file_name(int64_t step);

// Creates `dir` if needed and removes the temporary files a killed writer
// left there ("ckpt-*.safetensors.tmp.*", "latest.tmp.*"); returns how many.
// Called when a run starts, so a bad checkpoint_dir (an existing file, a
// path under a file) fails before the first step, naming the directory.
int prepare_checkpoint_dir(const std::string& dir);

// Writes the checkpoint of `st` into `dir` (created if needed), points
// `latest` at it and deletes all but the newest cfg.keep_checkpoints
// checkpoints and any stale temporary file. Returns the file's path.
// REQUIRES: every tensor of st finite (the caller checks: a non-finite
// checkpoint is never written).
std::string save_checkpoint(const std::string& dir, const Config& cfg, const TrainState& st);

// Reads the checkpoint `latest` names in `dir` and checks it against `cfg`:
// format and version, every tensor name, shape and dtype, nothing extra, and
// the same seed and teacher_seed. Every failure is a moe::Error naming the
// directory or file and the tensor or key.
TrainState load_checkpoint(const std::string& dir, const Config& cfg);
// The checks and state of load_checkpoint for a checkpoint file already read
// (read_safetensors, or parse_safetensors from bytes); errors name f.path.
TrainState state_from_checkpoint(const SafetensorsFile& f, const Config& cfg);

// The resolved config as JSON text: {"key": "printed value", ...}.
std::string config_json(const Config& cfg);

}  // namespace moe::train
