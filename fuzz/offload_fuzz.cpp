// Fuzzes the offload-target parser (the moe_offload_targets value):
// parse_offload_targets, then resolve_offload against every builtin backend's
// capability row, for inference and training, with 0 and 1 side-engine
// threads, and the printed plan of every resolution that succeeds.
#include <string>

#include "fuzz_common.h"
#include "moe/offload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> backends = moe::builtin_backends();
  const std::string spec(moe::fuzz::as_text(data, size));
  try {
    (void)moe::parse_offload_targets(spec);
  } catch (const moe::Error&) {
    return 0;
  }
  for (const std::string& b : backends) {
    const moe::Capability& cap = moe::builtin_capability(b);
    for (bool training : {false, true}) {
      for (int64_t threads : {0, 1}) {
        try {
          moe::ResolvedOffload r = moe::resolve_offload(spec, cap, training, threads);
          (void)moe::format_offload_plan(r, cap);
        } catch (const moe::Error&) {
        }
      }
    }
  }
  return 0;
}
