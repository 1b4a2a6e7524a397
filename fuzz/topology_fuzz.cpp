// Fuzzes the `--topology` parser (moe validate --topology SPEC), then checks
// a small config against every topology it accepts (check_target: backend,
// mesh size, offload targets), for inference and for training.
#include <string>

#include "fuzz_common.h"
#include "moe/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const moe::Config cfg = moe::fuzz::small_config("moe_offload_targets: all\n");
  try {
    moe::Topology t = moe::parse_topology(std::string(moe::fuzz::as_text(data, size)));
    (void)t.describe();
    for (bool training : {false, true}) (void)moe::check_target(cfg, t, training);
  } catch (const moe::Error&) {
  }
  return 0;
}
