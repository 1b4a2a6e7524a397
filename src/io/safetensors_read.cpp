// safetensors reading: read and validate the header, then read each tensor
// (pread) into aligned storage, all of them or one at a time. Every error names the file, and the
// tensor where there is one.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "moe/safetensors.h"

namespace moe {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // real headers are kilobytes

// A file opened read-only, closed on destruction, or bytes in memory that the
// caller keeps alive. File bytes are read with pread, so nothing but what is
// asked for is held in memory.
class ReadFile {
 public:
  explicit ReadFile(std::string_view bytes) : mem_(bytes), size_(bytes.size()) {}
  explicit ReadFile(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(path, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      fail(path, ": cannot read: ", std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(path, ": not a regular file");
    }
    size_ = uint64_t(st.st_size);
  }
  ~ReadFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  ReadFile(const ReadFile&) = delete;
  ReadFile& operator=(const ReadFile&) = delete;
  uint64_t size() const { return size_; }

  // Reads exactly n bytes at `offset`; `what` names them in errors.
  void read(uint64_t offset, void* dst, uint64_t n, const std::string& what) const {
    if (fd_ < 0) {
      if (offset > size_ || n > size_ - offset)
        fail(what, ": bytes [", offset, ", ", offset + n, ") are past the end (", size_, " bytes)");
      if (n) std::memcpy(dst, mem_.data() + offset, size_t(n));
      return;
    }
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const size_t chunk = size_t(std::min<uint64_t>(n, uint64_t(1) << 30));
      const ssize_t got = ::pread(fd_, p, chunk, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail(what, ": cannot read: ", std::strerror(errno));
      if (got == 0) fail(what, ": the file ended at byte ", offset, " (it shrank while being read?)");
      p += got, offset += uint64_t(got), n -= uint64_t(got);
    }
  }

 private:
  int fd_ = -1;
  std::string_view mem_;
  uint64_t size_ = 0;
};

// One header entry, before its bytes are copied.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // [begin, end) in the data buffer
};

// A JSON value for a message, cut short if long.
std::string brief(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string where_of(const std::string& path, const std::string& key) {
  return key == "__metadata__" ? path + ": __metadata__" : path + ": tensor '" + key + "'";
}

// Reads the size prefix and the header text; returns the header and the
// data buffer's size (it starts at file offset 8 + header size).
std::pair<std::string, uint64_t> read_header_text(const std::string& path, const ReadFile& f) {
  if (f.size() < 8) fail(path, ": file is ", f.size(), " bytes, too short for the 8-byte header size");
  uint64_t n;
  f.read(0, &n, 8, path);  // little-endian host (static_assert in safetensors.cpp)
  if (n > kMaxHeaderBytes)
    fail(path, ": header size ", n, " is absurd (limit ", kMaxHeaderBytes,
         " bytes): not a safetensors file?");
  if (n > f.size() - 8)
    fail(path, ": header size ", n, " runs past the end of the file (", f.size(), " bytes): truncated?");
  std::string text(size_t(n), '\0');
  f.read(8, text.data(), n, path);
  return {std::move(text), f.size() - 8 - n};
}

// Parses the header JSON, rejecting duplicate keys in any object (nlohmann
// would silently keep the last one).
json parse_header(const std::string& path, std::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key;  // the tensor whose entry is being parsed
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) open_objects.emplace_back();
    if (event == json::parse_event_t::object_end) open_objects.pop_back();
    if (event != json::parse_event_t::key) return true;
    const auto& key = parsed.get_ref<const std::string&>();
    if (depth == 1) top_key = key;
    if (open_objects.back().insert(key).second) return true;
    if (depth == 1) fail(path, ": duplicate tensor name '", key, "' in the header");
    fail(where_of(path, top_key), ": duplicate key '", key, "'");
  };
  try {
    return json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 1e400
    fail(path, ": header is not valid JSON: ", e.what());
  }
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& j) {
  if (!j.is_object()) fail(path, ": __metadata__ must be an object of strings, got ", brief(j));
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) fail(path, ": __metadata__ value of '", k, "' must be a string, got ", brief(v));
    out[k] = v.get<std::string>();
  }
  return out;
}

uint64_t get_uint(const json& v, const std::string& where, const char* field) {
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
  if (v.is_number_integer()) fail(where, ": ", field, " must not be negative, got ", brief(v));
  fail(where, ": ", field, " must be a non-negative integer, got ", brief(v));
}

const json& get_field(const json& entry, const std::string& where, const char* key) {
  auto it = entry.find(key);
  if (it == entry.end()) fail(where, ": missing \"", key, "\"");
  return *it;
}

DType parse_dtype(const json& v, const std::string& where) {
  if (!v.is_string()) fail(where, ": \"dtype\" must be a string, got ", brief(v));
  auto name = v.get<std::string>();
  if (auto t = dtype_from_safetensors_name(name)) return *t;
  fail(where, ": unsupported dtype '", name, "' (supported: F32, BF16, F16, I32, I64)");
}

Shape parse_shape(const json& v, const std::string& where) {
  if (!v.is_array()) fail(where, ": \"shape\" must be an array of integers, got ", brief(v));
  Shape shape;
  for (const auto& d : v) {
    uint64_t n = get_uint(d, where, "a shape dimension");
    if (n > uint64_t(INT64_MAX)) fail(where, ": shape dimension ", n, " is too large");
    shape.push_back(int64_t(n));
  }
  return shape;
}

Entry parse_entry(const std::string& path, const std::string& name, const json& j) {
  const std::string where = where_of(path, name);
  if (!j.is_object()) fail(where, ": expected {\"dtype\", \"shape\", \"data_offsets\"}, got ", brief(j));
  for (const auto& [key, value] : j.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets") fail(where, ": unknown key '", key, "'");
  Entry e{name, parse_dtype(get_field(j, where, "dtype"), where),
          parse_shape(get_field(j, where, "shape"), where), 0, 0};
  const json& offsets = get_field(j, where, "data_offsets");
  if (!offsets.is_array() || offsets.size() != 2)
    fail(where, ": \"data_offsets\" must be [begin, end], got ", brief(offsets));
  e.begin = get_uint(offsets[0], where, "data_offsets begin");
  e.end = get_uint(offsets[1], where, "data_offsets end");
  return e;
}

// Bytes that shape x dtype needs. The product of the non-zero dimensions
// must fit in 63 bits even for a zero-size tensor (Shape math is int64, and
// every dtype is at least 2 bytes, so the element count fits as well).
uint64_t needed_bytes(const Entry& e, const std::string& where) {
  uint64_t bytes = dtype_size(e.dtype);
  for (int64_t d : e.shape)
    if (d != 0 && (__builtin_mul_overflow(bytes, uint64_t(d), &bytes) || bytes > uint64_t(INT64_MAX)))
      fail(where, ": shape ", shape_str(e.shape), " of ", dtype_safetensors_name(e.dtype),
           " is too large: its byte size overflows 63 bits");
  const bool zero_size = std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end();
  return zero_size ? 0 : bytes;
}

void check_entry_range(const std::string& path, const Entry& e, uint64_t buffer_size) {
  const std::string where = where_of(path, e.name);
  const std::string range = "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) fail(where, ": ", range, " has begin > end");
  if (e.end > buffer_size)
    fail(where, ": ", range, " run past the end of the data buffer (", buffer_size,
         " bytes): truncated file?");
  const uint64_t need = needed_bytes(e, where);
  if (e.end - e.begin != need)
    fail(where, ": shape ", shape_str(e.shape), " of ", dtype_safetensors_name(e.dtype), " needs ", need,
         " bytes but data_offsets span ", e.end - e.begin);
}

// Sorts entries into file order and checks that their ranges tile the data
// buffer exactly: in order, no overlaps, no holes, nothing left over.
void check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t buffer_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      fail(where_of(path, e.name), ": bytes [", e.begin, ", ", e.end, ") overlap tensor '", prev->name, "'");
    if (e.begin > covered)
      fail(where_of(path, e.name), ": data buffer bytes [", covered, ", ", e.begin,
           ") before this tensor belong to no tensor");
    covered = e.end;
    prev = &e;
  }
  if (covered != buffer_size)
    fail(path, ": data buffer bytes [", covered, ", ", buffer_size, ") at the end belong to no tensor");
}

}  // namespace

struct SafetensorsReader::Impl {
  std::string path;
  std::unique_ptr<ReadFile> file;
  uint64_t data_start = 0;                            // file offset of the data buffer
  std::vector<SafetensorsEntry> entries;              // file order
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) of each entry in the data buffer
  std::map<std::string, size_t, std::less<>> index;   // name -> entry
  std::map<std::string, std::string> metadata;

  Impl(const std::string& p, std::unique_ptr<ReadFile> f) : path(p), file(std::move(f)) {
    auto [header_text, buffer_size] = read_header_text(path, *file);
    data_start = 8 + header_text.size();
    const json header = parse_header(path, header_text);
    if (!header.is_object()) fail(path, ": header must be a JSON object, got ", brief(header));
    std::vector<Entry> parsed;
    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__")
        metadata = parse_metadata(path, value);
      else
        parsed.push_back(parse_entry(path, name, value));
    }
    for (const Entry& e : parsed) check_entry_range(path, e, buffer_size);
    check_tiling(path, parsed, buffer_size);
    for (Entry& e : parsed) {
      index.emplace(e.name, entries.size());
      entries.push_back({std::move(e.name), e.dtype, std::move(e.shape)});
      ranges.emplace_back(e.begin, e.end);
    }
  }

  size_t at(std::string_view name) const {
    auto it = index.find(name);
    if (it == index.end()) fail(path, ": no tensor named '", name, "'");
    return it->second;
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path)
    : impl_(with_context(path, [&] { return std::make_shared<const Impl>(path, std::make_unique<ReadFile>(path)); })) {}

SafetensorsReader::SafetensorsReader(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

SafetensorsReader SafetensorsReader::from_bytes(std::string_view bytes, const std::string& name) {
  return SafetensorsReader(
      with_context(name, [&] { return std::make_shared<const Impl>(name, std::make_unique<ReadFile>(bytes)); }));
}

const std::string& SafetensorsReader::path() const { return impl_->path; }
const std::vector<SafetensorsEntry>& SafetensorsReader::entries() const { return impl_->entries; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return impl_->metadata; }

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->entries[it->second];
}

Tensor SafetensorsReader::read(std::string_view name) const {
  const SafetensorsEntry& e = impl_->entries[impl_->at(name)];
  return read_rows(name, 0, e.shape.empty() ? 1 : e.shape[0]);
}

void SafetensorsReader::read_bytes(std::string_view name, uint64_t offset, uint64_t n, void* dst) const {
  const size_t i = impl_->at(name);
  const auto [begin, end] = impl_->ranges[i];
  const std::string where = impl_->path + ": tensor '" + impl_->entries[i].name + "'";
  if (offset > end - begin || n > end - begin - offset)
    fail(where, ": bytes [", offset, ", ", offset + n, ") are outside its ", end - begin, " bytes");
  if (n) impl_->file->read(impl_->data_start + begin + offset, dst, n, where);
}

Tensor SafetensorsReader::read_rows(std::string_view name, int64_t begin, int64_t count) const {
  const SafetensorsEntry* e = find(name);
  if (!e) impl_->at(name);  // throws "no tensor named"
  const std::string where = impl_->path + ": tensor '" + e->name + "'";
  const int64_t rows = e->shape.empty() ? 1 : e->shape[0];  // a scalar is one row
  if (begin < 0 || count < 0 || begin > rows || count > rows - begin)
    fail(where, ": rows [", begin, ", ", begin + count, ") are outside its shape ", shape_str(e->shape));
  Shape shape = e->shape;
  if (!shape.empty()) shape[0] = count;
  return with_context(where, [&] {
    Tensor t = Tensor::empty(e->dtype, shape);
    const uint64_t row_bytes = count ? uint64_t(t.nbytes()) / uint64_t(count) : 0;
    read_bytes(name, uint64_t(begin) * row_bytes, t.nbytes(), t.raw());
    return t;
  });
}

namespace {

SafetensorsFile read_all(const SafetensorsReader& reader) {
  SafetensorsFile out;
  out.path = reader.path();
  out.metadata = reader.metadata();
  for (const SafetensorsEntry& e : reader.entries()) out.tensors.emplace_back(e.name, reader.read(e.name));
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) { return read_all(SafetensorsReader(path)); }

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name) {
  return read_all(SafetensorsReader::from_bytes(bytes, name));
}

}  // namespace moe
