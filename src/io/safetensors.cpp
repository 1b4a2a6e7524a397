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

using Layout = std::vector<SafetensorsEntry>;

void check_layout(const std::string& path, const Layout& layout) {
  std::set<std::string_view> seen;
  for (const SafetensorsEntry& e : layout) {
    if (e.name == "__metadata__") fail(path, ": '__metadata__' is reserved and cannot name a tensor");
    if (!seen.insert(e.name).second) fail(path, ": tensor name '", e.name, "' given twice");
  }
}

void check_tensor(const std::string& path, const std::string& name, const Tensor& t) {
  if (t.nbytes() != 0 && t.raw() == nullptr) fail(path, ": tensor '", name, "' has no storage");
  if (shape_numel(t.shape()) != t.numel()) fail(path, ": tensor '", name, "' is not initialized");
}

// The JSON header, tensors in the given order, padded with spaces so that
// 8 + header size is a multiple of 8.
std::string build_header(const Layout& layout, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : layout) {
    const uint64_t end = offset + uint64_t(shape_numel(e.shape)) * dtype_size(e.dtype);
    header[e.name] = {
        {"dtype", dtype_safetensors_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void write_safetensors_streamed(const std::string& path, const Layout& layout,
                                const std::map<std::string, std::string>& metadata,
                                const std::function<Tensor(size_t)>& produce) {
  check_layout(path, layout);
  const std::string header = build_header(layout, metadata);
  write_file_atomic(path, [&](std::FILE* f) {
    const uint64_t size = header.size();  // little-endian host: native bytes are the file bytes
    std::fwrite(&size, 1, sizeof size, f);
    std::fwrite(header.data(), 1, header.size(), f);
    for (size_t i = 0; i < layout.size(); ++i) {
      const SafetensorsEntry& e = layout[i];
      const Tensor t = produce(i);
      check_tensor(path, e.name, t);
      if (t.dtype() != e.dtype || t.shape() != e.shape)
        fail(path, ": tensor '", e.name, "' was announced as ", dtype_safetensors_name(e.dtype), " ",
             shape_str(e.shape), " but is ", dtype_safetensors_name(t.dtype()), " ", shape_str(t.shape()));
      if (t.nbytes()) std::fwrite(t.raw(), 1, t.nbytes(), f);
    }
  });
}

void write_safetensors(const std::string& path, const Named& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Layout layout;
  for (const auto& [name, t] : tensors) {
    check_tensor(path, name, t);
    layout.push_back({name, t.dtype(), t.shape()});
  }
  check_layout(path, layout);
  write_safetensors_streamed(path, layout, metadata, [&](size_t i) { return tensors[i].second; });
}

}  // namespace moe
