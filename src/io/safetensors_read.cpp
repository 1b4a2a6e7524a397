// safetensors reading: map the file, parse and validate the header, copy
// each tensor into aligned storage. Every error names the file, and the
// tensor where there is one.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "moe/safetensors.h"

namespace moe {
namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // real headers are kilobytes

// A whole file mapped read-only; unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
    try {
      map(fd, path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);  // the mapping stays valid
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void map(int fd, const std::string& path) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail(path, ": cannot read: ", std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail(path, ": not a regular file");
    size_ = size_t(st.st_size);
    if (size_ == 0) return;
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) fail(path, ": cannot read: ", std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  }

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
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

// Splits the file into header text and data buffer, checking the size prefix.
std::pair<std::string_view, std::string_view> split_file(const std::string& path, std::string_view f) {
  if (f.size() < 8) fail(path, ": file is ", f.size(), " bytes, too short for the 8-byte header size");
  uint64_t n;
  std::memcpy(&n, f.data(), 8);  // little-endian host (static_assert in safetensors.cpp)
  if (n > kMaxHeaderBytes)
    fail(path, ": header size ", n, " is absurd (limit ", kMaxHeaderBytes,
         " bytes): not a safetensors file?");
  if (n > f.size() - 8)
    fail(path, ": header size ", n, " runs past the end of the file (", f.size(), " bytes): truncated?");
  return {f.substr(8, n), f.substr(8 + n)};
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

SafetensorsFile parse_file(const std::string& path, std::string_view bytes) {
  auto [header_text, buffer] = split_file(path, bytes);
  const json header = parse_header(path, header_text);
  if (!header.is_object()) fail(path, ": header must be a JSON object, got ", brief(header));
  SafetensorsFile out;
  out.path = path;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__")
      out.metadata = parse_metadata(path, value);
    else
      entries.push_back(parse_entry(path, name, value));
  }
  for (const Entry& e : entries) check_entry_range(path, e, buffer.size());
  check_tiling(path, entries, buffer.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.dtype, e.shape);
    if (t.nbytes()) std::memcpy(t.raw(), buffer.data() + e.begin, t.nbytes());
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  return with_context(path, [&] {
    MappedFile file(path);
    return parse_file(path, std::string_view(reinterpret_cast<const char*>(file.data()), file.size()));
  });
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& name) {
  return with_context(name, [&] { return parse_file(name, bytes); });
}

}  // namespace moe
