// `moe convert --from mixtral` / `--to mixtral`: the sparse MoE blocks of a
// PyTorch (Hugging Face) Mixtral checkpoint <-> the engine's weight names
// (docs/formats.md, "Mixtral checkpoints").
//
// Per layer i, with P = "model.layers.{i}.block_sparse_moe.":
//   P gate.weight [E, D]             -> layers.{i}.router.kernel [D, E]   (transpose)
//   P experts.{j}.w1.weight [F, D]   -> layers.{i}.experts.wi_0[j] [D, F] (gate proj, transpose)
//   P experts.{j}.w3.weight [F, D]   -> layers.{i}.experts.wi_1[j] [D, F] (up proj, transpose)
//   P experts.{j}.w2.weight [D, F]   -> layers.{i}.experts.wo[j] [F, D]   (down proj, transpose)
// or, prefused, experts.wi [E, D, 2F] = [wi_0 | wi_1] along the last axis (its
// split layout [2, E, D/2, 2F] is the same bytes). Every transpose moves
// elements without touching their bits: the dtype (F32, BF16, F16) is kept
// and a round trip is bit-exact.
//
// Memory: only headers are read up front (all of them, so every check runs
// before any data is read); tensors are then read (pread) one expert at a time
// and each output tensor is written and dropped before the next is made, so
// the peak is one output tensor plus one expert tensor, whatever the
// checkpoint's size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe/dtype.h"

namespace moe {

// How the output of --from mixtral holds the up projections.
enum class MixtralWi {
  separate,  // experts.wi_0, experts.wi_1 [E, D, F] (prefuse_moe_weights=false)
  prefused,  // experts.wi [E, D, 2F] (prefuse_moe_weights=true)
  split,     // experts.wi [2, E, D/2, 2F] (also moe_split_expert_weight_layout=true)
};

struct MixtralLayer {
  int64_t index = 0;  // i of model.layers.{i}
  int64_t E = 0, D = 0, F = 0;
  DType dtype = DType::f32;
};

struct MixtralConvertReport {
  std::vector<MixtralLayer> layers;  // converted, ascending index
  size_t blocks_found = 0;           // MoE blocks in the input (all checked, even with --layer)
  std::vector<std::string> files;    // the files read (an index, then its shards)
  size_t tensors_written = 0;
  size_t left_out = 0;                         // input tensors that are not MoE-block tensors
  std::vector<std::string> left_out_examples;  // the first few of them, in input order
  size_t unlisted = 0;                         // tensors in a shard but not in the index (ignored)
};

// Reads a Mixtral checkpoint and writes the engine's tensors to `out`
// (atomically). `in`: a .safetensors file; a directory holding
// model.safetensors.index.json (and its shards) or model.safetensors; or an
// index .json itself. `layer` >= 0 converts only model.layers.{layer} and
// writes it without the "layers.{i}." prefix (a one-layer weights file for
// `moe step`). Throws moe::Error naming the file, layer and tensor on: a file
// that is not safetensors, a bad index, a shard listed but missing, a tensor
// of the index absent from its shard, no MoE block, a missing router or
// expert tensor, non-contiguous expert ids, shapes that disagree between
// experts or layers, dtypes that differ within a layer or are not float, an
// unknown name inside a block, and (split) an odd E or D.
MixtralConvertReport convert_from_mixtral(const std::string& in, const std::string& out, MixtralWi wi,
                                          int64_t layer = -1);

// The reverse: an engine weights file (layers.{i}.* names, or unprefixed names
// of one layer, written as layer 0; wi_0/wi_1 or prefused or split wi) to one
// Mixtral safetensors file with metadata {"format": "pt"}: per layer the
// experts in order (w1, w2, w3 each), then gate.weight. Tensors that are not
// the layer weights (norm.scale, optimizer moments, ...) are left out and
// counted. Errors as above.
MixtralConvertReport convert_to_mixtral(const std::string& in, const std::string& out);

}  // namespace moe
