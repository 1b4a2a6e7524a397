// Small helpers shared by the subcommands.
#pragma once

#include <string>
#include <vector>

#include "moe/comm.h"
#include "moe/config.h"
#include "moe/layer.h"
#include "moe/safetensors.h"

namespace moe::cli {

// The process's world communicator (MPI under mpirun, else single process),
// made on first use. Command bodies that use it run inside
// moe::run_collectively(world(), ...) (moe/comm.h): under mpirun an exception
// of any type on any rank ends the whole job, "moe: fatal on rank R: <message>";
// on one rank it reaches main, which prints it and exits 1.
Communicator& world();
// The world if world() made it already, else null (makes nothing).
Communicator* world_if_made();
// True when the run must use the distributed layer: several ranks, or any
// parallelism key other than 1.
bool distributed(const Config& cfg);

// Loads the config file with `key=value` overrides (throws moe::Error listing every problem),
// and applies its collective_timeout_s to the watchdog (include/moe/watchdog.h).
Config load(const std::string& path, const std::vector<std::string>& overrides);
// dtype=f64 is the library's and the Python layer's checking path (docs/python.md, Dtypes): the
// commands (files, checkpoints, training, checks) compute in f32 or bf16. A ConfigError naming the key.
void refuse_f64(const Config& cfg, const std::string& origin);

// Layer weights from a safetensors file, checked against the config.
LayerWeights load_weights(const Config& cfg, const SafetensorsFile& file, const std::string& prefix = "");

// (name, tensor) list of a layer's weights, names prefixed.
std::vector<std::pair<std::string, Tensor>> named(const Config& cfg, const LayerWeights& w,
                                                   const std::string& prefix);

// Fails (moe::Error naming the option) when `path`'s directory does not exist,
// so a command that writes its results at the end finds out before it runs.
void check_output_dir(const std::string& path, const char* option);

// Frobenius norm, for summaries.
double norm(const Tensor& t);

}  // namespace moe::cli
