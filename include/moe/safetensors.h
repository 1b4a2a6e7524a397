// safetensors files (the Hugging Face format), read and written whole.
//
// Layout: u64 little-endian header size N, N bytes of JSON header, then the
// data buffer. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end)} (offsets relative to the data buffer) and may
// hold "__metadata__": a string -> string map. docs/formats.md lists exactly
// what is written and what reading validates.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moe/tensor.h"

namespace moe {

struct SafetensorsFile {
  std::string path;
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file (offset) order
  std::map<std::string, std::string> metadata;          // "__metadata__"

  // nullptr if there is no tensor `name`.
  const Tensor* find(std::string_view name) const;
  // Throws moe::Error "<path>: no tensor named 'x' (has: a, b, ...)" if absent.
  const Tensor& at(std::string_view name) const;
};

// Reads and fully validates `path`; every tensor is copied into its own
// 64-byte aligned storage. Throws moe::Error naming the file (and the tensor,
// where there is one) on any malformed or unsupported content.
SafetensorsFile read_safetensors(const std::string& path);
// The same from the file's bytes in memory; `name` stands for the path in
// messages and in the result's `path`.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name);

// Writes the tensors, in the given order and contiguously, after a header
// padded with spaces so the data starts at an 8-byte aligned file offset.
// Atomic: `path` holds the old content or the whole new file, never a part.
// REQUIRES: names unique and not "__metadata__".
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moe
