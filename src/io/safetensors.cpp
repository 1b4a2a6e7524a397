// safetensors: lookups and writing. Reading is in safetensors_read.cpp.
#include "moe/safetensors.h"

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "io/atomic_file.h"

namespace moe {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O copies raw bytes: it needs a little-endian host");

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

const Tensor& SafetensorsFile::at(std::string_view name) const {
  if (const Tensor* t = find(name)) return *t;
  constexpr size_t kMaxListed = 20;
  std::string has;
  for (size_t i = 0; i < tensors.size() && i < kMaxListed; ++i) has += (i ? ", " : "") + tensors[i].first;
  if (tensors.size() > kMaxListed) has += ", ... (" + std::to_string(tensors.size() - kMaxListed) + " more)";
  fail(path, ": no tensor named '", name, "' (has: ", has, ")");
}

namespace {

using Named = std::vector<std::pair<std::string, Tensor>>;

void check_writable(const std::string& path, const Named& tensors) {
  std::set<std::string_view> seen;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail(path, ": '__metadata__' is reserved and cannot name a tensor");
    if (!seen.insert(name).second) fail(path, ": tensor name '", name, "' given twice");
    if (t.nbytes() != 0 && t.raw() == nullptr) fail(path, ": tensor '", name, "' has no storage");
    if (shape_numel(t.shape()) != t.numel()) fail(path, ": tensor '", name, "' is not initialized");
  }
}

// The JSON header, tensors in the given order, padded with spaces so that
// 8 + header size is a multiple of 8.
std::string build_header(const Named& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const uint64_t end = offset + t.nbytes();
    header[name] = {
        {"dtype", dtype_safetensors_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void write_safetensors(const std::string& path, const Named& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_writable(path, tensors);
  const std::string header = build_header(tensors, metadata);
  write_file_atomic(path, [&](std::FILE* f) {
    const uint64_t size = header.size();  // little-endian host: native bytes are the file bytes
    std::fwrite(&size, 1, sizeof size, f);
    std::fwrite(header.data(), 1, header.size(), f);
    for (const auto& [name, t] : tensors)
      if (t.nbytes()) std::fwrite(t.raw(), 1, t.nbytes(), f);
  });
}

}  // namespace moe
