// Fuzzes the config parser: the input up to its first NUL byte is the YAML
// text, each line after it a `key=value` override. A config that parses is
// printed back (every key's value, the resolved table) and checked against
// two targets (one process; 8 ranks with MPI_THREAD_MULTIPLE), as
// `moe validate [--topology]` does.
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "moe/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in = moe::fuzz::as_text(data, size);
  const size_t nul = in.find('\0');
  const std::string yaml(in.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = in.substr(nul + 1);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  try {
    moe::LoadedConfig c = moe::parse_config(yaml, "fuzz.yaml", overrides);
    for (const std::string& key : moe::config_keys()) (void)moe::config_value(c.config, key);
    (void)moe::format_config_table(c.table);
    for (const char* spec : {"ranks=1", "ranks=8,mpi_thread=multiple"})
      for (bool training : {false, true})
        (void)moe::check_target(c.config, moe::parse_topology(spec), training);
  } catch (const moe::Error&) {
  }
  return 0;
}
