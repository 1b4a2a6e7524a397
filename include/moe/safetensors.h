// safetensors files (the Hugging Face format), read and written whole.
//
// Layout: u64 little-endian header size N, N bytes of JSON header, then the
// data buffer. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end)} (offsets relative to the data buffer) and may
// hold "__metadata__": a string -> string map. docs/formats.md lists exactly
// what is written and what reading validates.
#pragma once

#include <functional>
#include <map>
#include <memory>
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

// One tensor of a header: what a SafetensorsReader lists and what a streamed
// write is told before any data.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
};

// A safetensors file opened for reading tensor by tensor. The constructor
// reads and validates the header (every check of read_safetensors, which is
// built on this class); tensor bytes are read (pread) only when asked for, so
// a reader of a large file holds only what it has read. Copies share the open
// file. Errors name the file and the tensor.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  // A reader over a whole file's bytes in memory (the caller keeps them alive
  // as long as the reader); `name` stands for the path in messages.
  static SafetensorsReader from_bytes(std::string_view bytes, const std::string& name);

  const std::string& path() const;
  const std::vector<SafetensorsEntry>& entries() const;  // in file (offset) order
  const std::map<std::string, std::string>& metadata() const;
  // nullptr if there is no tensor `name`.
  const SafetensorsEntry* find(std::string_view name) const;
  // The whole tensor, in its own 64-byte aligned storage.
  Tensor read(std::string_view name) const;
  // Rows [begin, begin + count) of dimension 0: shape {count, rest of the shape}.
  Tensor read_rows(std::string_view name, int64_t begin, int64_t count) const;
  // Bytes [offset, offset + n) of the tensor's data into dst.
  void read_bytes(std::string_view name, uint64_t offset, uint64_t n, void* dst) const;

 private:
  struct Impl;
  explicit SafetensorsReader(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
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

// The same file as write_safetensors, with the tensors made one at a time:
// the header comes from `layout`, then produce(i) is called for i = 0, 1, ...
// and its tensor written and dropped, so only one tensor is held at once.
// Atomic as above. A produced tensor whose dtype or shape differs from
// layout[i] is an error naming `path` and the tensor (nothing is written);
// exceptions from produce propagate (nothing is written).
void write_safetensors_streamed(const std::string& path, const std::vector<SafetensorsEntry>& layout,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<Tensor(size_t)>& produce);

}  // namespace moe
