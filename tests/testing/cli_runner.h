// Runs the real `moe` binary (MOE_BINARY) and captures exit code, stdout, stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace moe::testing {

struct RunResult {
  int exit_code;
  std::string out, err;
};

inline std::string slurp_text(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// `args` are shell words (quoted where needed); `scratch` is a directory for the captured streams.
inline RunResult run_moe(const std::string& args, const std::string& scratch, const std::string& env = "") {
  std::string out = scratch + "/stdout", err = scratch + "/stderr";
  std::string cmd = env + " " + std::string(MOE_BINARY) + " " + args + " >" + out + " 2>" + err;
  int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp_text(out), slurp_text(err)};
}

}  // namespace moe::testing
