// Fuzzes the checkpoint loader from the bytes of a checkpoint file: the
// safetensors reader, then state_from_checkpoint (metadata format, version,
// step and seeds; every parameter and moment by name, shape and dtype;
// nothing extra) for a one-layer training config.
#include "fuzz_common.h"
#include "moe/safetensors.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const moe::Config cfg = moe::fuzz::small_config("num_layers: 1\n");
  try {
    moe::SafetensorsFile f =
        moe::parse_safetensors(moe::fuzz::as_text(data, size), "fuzz/ckpt-00000001.safetensors");
    moe::train::TrainState st = moe::train::state_from_checkpoint(f, cfg);
  } catch (const moe::Error&) {
  }
  return 0;
}
