// moe info [--json]: what to paste into a bug report. The engine version, how
// this binary was built (compiler, build type, C++ flags, MPI and oneDNN), the
// CPU and its features, the kernel levels available and the one chosen
// (include/moe/isa.h), the environment variables the engine reads, and the
// compute pool's thread count. Under mpirun the world communicator is made
// first, so the level shown is the one every rank agreed on; rank 0 prints.
// The text is formatted from the JSON, so the two never disagree.
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "core/cpu_features.h"
#include "moe/isa.h"
#include "moe/thread_pool.h"
#ifdef MOE_HAVE_MPI
#include <mpi.h>
#endif
#ifdef MOE_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

// Set by CMakeLists.txt (project() VERSION, the compiler, build type and flags).
#ifndef MOE_VERSION
#define MOE_VERSION "unknown"
#endif
#ifndef MOE_COMPILER
#define MOE_COMPILER "unknown"
#endif
#ifndef MOE_BUILD_TYPE
#define MOE_BUILD_TYPE "unknown"
#endif
#ifndef MOE_CXX_FLAGS
#define MOE_CXX_FLAGS ""
#endif

namespace moe::cli {
namespace {

using Json = nlohmann::ordered_json;

// The environment variables the engine reads (docs: README "Environment").
constexpr const char* kEnvVars[] = {"MOE_GEMM_ISA",          "MOE_NUM_THREADS",          "ONEDNN_MAX_CPU_ISA",
                                    "MOE_ALLOC_CACHE_MIB",   "MOE_POLL_US",              "MOE_SIDE_ENGINE_RT",
                                    "MOE_POLITE_FROM_BYTES", "MOE_COLLECTIVE_TIMEOUT_S", "MOE_COLLECTIVE_LIVENESS_S",
                                    "MOE_RANKS_PER_HOST"};

// {"compiled_in", "library": MPI_Get_library_version (callable before MPI_Init)}.
Json mpi_json() {
#ifdef MOE_HAVE_MPI
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, size_t(len));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return {{"compiled_in", true}, {"library", s}};
#else
  return {{"compiled_in", false}};
#endif
}

// {"compiled_in", "version": "2.6.3"}.
Json onednn_json() {
#ifdef MOE_HAVE_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  return {{"compiled_in", true},
          {"version",
           std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch)}};
#else
  return {{"compiled_in", false}};
#endif
}

Json build_json() {
#ifdef MOE_HAVE_X86_KERNELS
  const bool x86_kernels = true;
#else
  const bool x86_kernels = false;
#endif
#ifdef MOE_HAVE_ARM_KERNELS
  const bool arm_kernels = true;
#else
  const bool arm_kernels = false;
#endif
  return {{"compiler", MOE_COMPILER},   {"build_type", MOE_BUILD_TYPE},
          {"cxx_flags", MOE_CXX_FLAGS}, {"x86_kernels", x86_kernels},
          {"arm_kernels", arm_kernels}, {"mpi", mpi_json()},
          {"onednn", onednn_json()}};
}

Json cpu_json() {
  const CpuFeatures& f = cpu_features();
  return {{"arch", f.arch},
          {"vendor", f.vendor},
          {"model", f.model},
          {"logical_cpus", f.logical_cpus},
          {"features", f.names()},
          {"sve_vector_bits", f.sve_vector_bits}};
}

Json env_json() {
  Json env = Json::object();
  for (const char* name : kEnvVars)
    if (const char* v = std::getenv(name)) env[name] = v;
  return env;
}

Json info_json(const Communicator& w) {
  Json j;
  j["version"] = MOE_VERSION;
  j["build"] = build_json();
  j["cpu"] = cpu_json();
  j["isa"] = isa_name(active_isa());
  j["isa_available"] = Json::array();
  for (Isa i : isa_available()) j["isa_available"].push_back(isa_name(i));
  j["env"] = env_json();
  j["threads"] = ThreadPool::compute().size();
  j["ranks"] = w.size();
  return j;
}

// The library's version string, or `none` when it is not compiled in.
std::string version_or(const Json& lib, const char* key, const char* none) {
  return lib["compiled_in"].get<bool>() ? lib[key].get<std::string>() : none;
}

std::string joined(const Json& list, const char* sep) {
  std::string s;
  for (const auto& v : list) s += (s.empty() ? "" : sep) + v.get<std::string>();
  return s;
}

void print_text(const Json& j) {
  const Json &b = j["build"], &c = j["cpu"];
  std::printf("moe %s\n", j["version"].get<std::string>().c_str());
  std::printf("build     %s, %s, flags: %s%s\n", b["compiler"].get<std::string>().c_str(),
              b["build_type"].get<std::string>().c_str(), b["cxx_flags"].get<std::string>().c_str(),
              b["x86_kernels"].get<bool>()   ? " (x86 kernels)"
              : b["arm_kernels"].get<bool>() ? " (Arm kernels)"
                                             : " (no SIMD kernels: reference only)");
  std::printf("mpi       %s\n", version_or(b["mpi"], "library", "not compiled in").c_str());
  std::printf("onednn    %s\n",
              version_or(b["onednn"], "version", "not compiled in (dense baseline: grouped GEMM)").c_str());
  std::printf("cpu       %s, %s, %s, %d logical CPUs\n", c["arch"].get<std::string>().c_str(),
              c["vendor"].get<std::string>().c_str(), c["model"].get<std::string>().c_str(),
              c["logical_cpus"].get<int>());
  const int sve_bits = c["sve_vector_bits"].get<int>();
  std::printf("features  %s%s\n", joined(c["features"], " ").c_str(),
              sve_bits ? (" (SVE vector length " + std::to_string(sve_bits) + " bits)").c_str() : "");
  std::printf("kernels   %s (available: %s)\n", j["isa"].get<std::string>().c_str(),
              joined(j["isa_available"], ", ").c_str());
  std::printf("threads   %d (compute pool)\n", j["threads"].get<int>());
  std::printf("ranks     %d\n", j["ranks"].get<int>());
  std::string env;
  for (const auto& [k, v] : j["env"].items())
    env += (env.empty() ? "" : " ") + k + "=" + v.get<std::string>();
  std::printf("env       %s\n", env.empty() ? "(none of the engine's variables set)" : env.c_str());
}

void run_info(bool json) {
  Communicator& w = world();  // under mpirun: every rank agrees on the kernel level here
  run_collectively(w, [&] {
    Json j = info_json(w);
    if (w.rank() != 0) return;
    if (json)
      std::printf("%s\n", j.dump(2).c_str());
    else
      print_text(j);
  });
}

}  // namespace

void add_info(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* c = app.add_subcommand(
      "info",
      "What to paste into a bug report: version, build (compiler, flags, MPI, oneDNN), CPU and features,\n"
      "the kernel levels available and the one chosen (MOE_GEMM_ISA), compute threads, ranks.");
  c->add_flag("--json", *json, "Print one JSON object instead of text");
  c->callback([json] { run_info(*json); });
}

}  // namespace moe::cli
