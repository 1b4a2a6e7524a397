#include "io/mixtral.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "io/convert.h"
#include "moe/safetensors.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kMaxExamples = 5;
constexpr int64_t kMissing = -1;

// ---- transposes that move elements without touching their bits ----

template <class T>
void transpose_as(const T* src, int64_t rows, int64_t cols, int64_t src_ld, T* dst, int64_t dst_ld) {
  constexpr int64_t kBlock = 32;  // tiles keep both sides' lines in cache
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock)
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      const int64_t r1 = std::min(rows, r0 + kBlock), c1 = std::min(cols, c0 + kBlock);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * dst_ld + r] = src[r * src_ld + c];
    }
}

// dst[c * dst_ld + r] = src[r * src_ld + c] for r < rows, c < cols; the
// elements are `esize`-byte words copied unchanged (any dtype, bit-exact).
void transpose(const void* src, int64_t rows, int64_t cols, int64_t src_ld, void* dst, int64_t dst_ld,
               size_t esize) {
  switch (esize) {
    case 2:
      return transpose_as(static_cast<const uint16_t*>(src), rows, cols, src_ld, static_cast<uint16_t*>(dst),
                          dst_ld);
    case 4:
      return transpose_as(static_cast<const uint32_t*>(src), rows, cols, src_ld, static_cast<uint32_t*>(dst),
                          dst_ld);
    default:
      MOE_ASSERT(esize == 8, "transpose: element size");
      return transpose_as(static_cast<const uint64_t*>(src), rows, cols, src_ld, static_cast<uint64_t*>(dst),
                          dst_ld);
  }
}

char* bytes_at(Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw()) + size_t(elements) * dtype_size(t.dtype());
}

// ---- the input: one file, or an index and its shards ----

struct Source {
  std::string origin;  // IN as resolved (the index or the file)
  std::vector<SafetensorsReader> readers;
  struct Tensor_ {
    std::string name;
    size_t reader;
    const SafetensorsEntry* entry;
  };
  std::vector<Tensor_> tensors;  // input order (the index's weight_map is sorted by name)
  std::vector<std::string> files;
  size_t unlisted = 0;

  const std::string& file_of(size_t t) const { return readers[tensors[t].reader].path(); }
  std::string where(size_t t) const { return file_of(t) + ": tensor '" + tensors[t].name + "'"; }
  const SafetensorsEntry& entry(size_t t) const { return *tensors[t].entry; }
  Tensor read(size_t t) const { return readers[tensors[t].reader].read(tensors[t].name); }
};

Source open_single(const std::string& path) {
  Source s;
  s.origin = path;
  s.readers.emplace_back(path);
  s.files.push_back(path);
  for (const SafetensorsEntry& e : s.readers[0].entries()) s.tensors.push_back({e.name, 0, &e});
  return s;
}

Source open_index(const std::string& path) {
  Source s;
  s.origin = path;
  s.files.push_back(path);
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open: ", std::strerror(errno));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail(path, ": not a safetensors index (invalid JSON): ", e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail(path,
         ": not a safetensors index: expected a JSON object with \"weight_map\": {tensor name: shard file}");
  const fs::path dir = fs::path(path).parent_path();
  std::map<std::string, size_t> shard_of;  // shard file name -> reader
  const json& map = j["weight_map"];
  for (const auto& [name, v] : map.items()) {
    if (!v.is_string())
      fail(path, ": weight_map entry '", name, "' must be a shard file name, got ", v.dump());
    const std::string shard = v.get<std::string>();
    const std::string full = (dir / shard).string();
    auto it = shard_of.find(shard);
    if (it == shard_of.end()) {
      std::error_code ec;
      if (!fs::exists(full, ec))
        fail(path, ": shard '", shard, "' (listed for tensor '", name, "') is missing: ", full,
             " does not exist");
      it = shard_of.emplace(shard, s.readers.size()).first;
      s.readers.emplace_back(full);
      s.files.push_back(full);
    }
    const SafetensorsEntry* e = s.readers[it->second].find(name);
    if (!e)
      fail(path, ": tensor '", name, "' is listed in weight_map under shard '", shard, "' but ", full,
           " has no tensor by that name");
    s.tensors.push_back({name, it->second, e});
  }
  for (const SafetensorsReader& r : s.readers)
    for (const SafetensorsEntry& e : r.entries())
      if (!map.contains(e.name)) ++s.unlisted;
  return s;
}

Source open_source(const std::string& in) {
  std::error_code ec;
  if (fs::is_directory(in, ec)) {
    const fs::path index = fs::path(in) / "model.safetensors.index.json",
                   single = fs::path(in) / "model.safetensors";
    if (fs::exists(index, ec)) return open_index(index.string());
    if (fs::exists(single, ec)) return open_single(single.string());
    fail(in, ": directory has neither model.safetensors.index.json nor model.safetensors");
  }
  if (in.ends_with(".json")) return open_index(in);
  return open_single(in);
}

// ---- names ----

// A decimal id at the front of s (no sign, no leading zero, at most 9
// digits) followed by '.'; consumes both.
std::optional<int64_t> take_id(std::string_view& s) {
  size_t n = 0;
  while (n < s.size() && n < 10 && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0 || n > 9 || n >= s.size() || s[n] != '.' || (n > 1 && s[0] == '0')) return std::nullopt;
  int64_t v = 0;
  for (size_t k = 0; k < n; ++k) v = v * 10 + (s[k] - '0');
  s.remove_prefix(n + 1);
  return v;
}

bool take(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

std::string block_prefix(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".block_sparse_moe.";
}

const char* const kProj[3] = {"w1", "w2", "w3"};
const char* const kRole[3] = {"gate proj [F, D]", "down proj [D, F]", "up proj [F, D]"};

struct MixtralBlock {
  int64_t gate = kMissing;                            // tensor index
  std::map<int64_t, std::array<int64_t, 3>> experts;  // j -> w1, w2, w3 tensor indices
};

// Groups the tensors of `src` into MoE blocks by layer; counts the rest.
std::map<int64_t, MixtralBlock> find_blocks(const Source& src, MixtralConvertReport& rep) {
  std::map<int64_t, MixtralBlock> blocks;
  for (size_t t = 0; t < src.tensors.size(); ++t) {
    std::string_view s = src.tensors[t].name;
    std::optional<int64_t> layer;
    if (!take(s, "model.layers.") || !(layer = take_id(s)) || !take(s, "block_sparse_moe.")) {
      if (rep.left_out_examples.size() < kMaxExamples) rep.left_out_examples.push_back(src.tensors[t].name);
      ++rep.left_out;
      continue;
    }
    MixtralBlock& b = blocks[*layer];
    if (s == "gate.weight") {
      b.gate = int64_t(t);
      continue;
    }
    std::optional<int64_t> j;
    bool known = false;
    if (take(s, "experts.") && (j = take_id(s)))
      for (int w = 0; w < 3 && !known; ++w)
        if (s == std::string(kProj[w]) + ".weight") {
          auto it = b.experts.try_emplace(*j, std::array<int64_t, 3>{kMissing, kMissing, kMissing}).first;
          it->second[size_t(w)] = int64_t(t);
          known = true;
        }
    if (known) continue;
    fail(src.where(t), ": is inside layer ", *layer, "'s MoE block but is none of gate.weight, ",
         "experts.{j}.w1.weight, experts.{j}.w2.weight, experts.{j}.w3.weight");
  }
  return blocks;
}

// Checks one block (ids, presence, shapes, dtypes); returns its dimensions.
MixtralLayer check_block(const Source& src, int64_t layer, const MixtralBlock& b) {
  const std::string P = block_prefix(layer);
  const std::string in_layer = src.origin + ": layer " + std::to_string(layer);
  if (b.gate == kMissing)
    fail(in_layer, ": missing ", P, "gate.weight (the router [E, D]; the block has ", b.experts.size(),
         " experts)");
  const SafetensorsEntry& g = src.entry(size_t(b.gate));
  if (g.shape.size() != 2)
    fail(src.where(size_t(b.gate)), ": shape ", shape_str(g.shape), ", expected [E, D]");
  if (!is_float(g.dtype))
    fail(src.where(size_t(b.gate)), ": dtype ", dtype_safetensors_name(g.dtype),
         " is not a float type (F32, BF16, F16)");
  MixtralLayer info{layer, g.shape[0], g.shape[1], 0, g.dtype};
  int64_t next = 0;
  for (const auto& [j, tensors] : b.experts) {
    if (j != next)
      fail(in_layer, ": expert ids are not contiguous: expert ", next, " is missing but expert ", j,
           " exists (", P, "experts.", j, ".*)");
    ++next;
  }
  if (next < info.E)
    fail(in_layer, ": missing expert ", next, ": ", P, "gate.weight ", shape_str(g.shape),
         " has E = ", info.E, " rows but only ", next, " expert", next == 1 ? "" : "s", " (", P,
         "experts.{j}.*) exist");
  if (next > info.E)
    fail(in_layer, ": ", next, " experts (", P, "experts.0 .. ", next - 1, ") but ", P, "gate.weight ",
         shape_str(g.shape), " has E = ", info.E, " rows");
  for (const auto& [j, tensors] : b.experts)
    for (int w = 0; w < 3; ++w)
      if (tensors[size_t(w)] == kMissing)
        fail(in_layer, ": expert ", j, " is missing ", P, "experts.", j, ".", kProj[w], ".weight (", kRole[w],
             ")");
  const SafetensorsEntry& w1 = src.entry(size_t(b.experts.at(0)[0]));
  if (w1.shape.size() == 2) info.F = w1.shape[0];
  for (const auto& [j, tensors] : b.experts)
    for (int w = 0; w < 3; ++w) {
      const size_t t = size_t(tensors[size_t(w)]);
      const SafetensorsEntry& e = src.entry(t);
      const Shape want = w == 1 ? Shape{info.D, info.F} : Shape{info.F, info.D};
      if (e.shape != want)
        fail(src.where(t), ": shape ", shape_str(e.shape), ", expected ", shape_str(want), " (", kRole[w],
             "; D = ", info.D, " from gate.weight ", shape_str(g.shape), ", F = ", info.F,
             " from experts.0.w1", ")");
      if (e.dtype != info.dtype)
        fail(src.where(t), ": dtype ", dtype_safetensors_name(e.dtype), " differs from ", P, "gate.weight's ",
             dtype_safetensors_name(info.dtype), ": the tensors of a layer must share one dtype");
    }
  return info;
}

// ---- an output under construction: header entries and their producers ----

struct Plan {
  std::vector<SafetensorsEntry> layout;
  std::vector<std::function<Tensor()>> make;
  void add(std::string name, DType dt, Shape shape, std::function<Tensor()> f) {
    layout.push_back({std::move(name), dt, std::move(shape)});
    make.push_back(std::move(f));
  }
  void write(const std::string& out, const std::map<std::string, std::string>& metadata) const {
    write_safetensors_streamed(out, layout, metadata, [&](size_t i) { return make[i](); });
  }
};

void plan_from_block(Plan& plan, const Source& src, const MixtralBlock& b, const MixtralLayer& L,
                     const std::string& prefix, MixtralWi wi) {
  const int64_t E = L.E, D = L.D, F = L.F;
  const DType dt = L.dtype;
  const size_t es = dtype_size(dt);
  const Source* s = &src;
  const MixtralBlock* blk = &b;
  plan.add(prefix + "router.kernel", dt, {D, E}, [=] {
    Tensor g = s->read(size_t(blk->gate)), out = Tensor::empty(dt, {D, E});
    transpose(g.raw(), E, D, D, out.raw(), E, es);
    return out;
  });
  // [E, D, F] from the transposes of w (w1 or w3) of every expert.
  auto stacked_in = [=](int w) {
    return [=] {
      Tensor out = Tensor::empty(dt, {E, D, F});
      for (int64_t j = 0; j < E; ++j) {
        Tensor t = s->read(size_t(blk->experts.at(j)[size_t(w)]));
        transpose(t.raw(), F, D, D, bytes_at(out, j * D * F), F, es);
      }
      return out;
    };
  };
  if (wi == MixtralWi::separate) {
    plan.add(prefix + "experts.wi_0", dt, {E, D, F}, stacked_in(0));
    plan.add(prefix + "experts.wi_1", dt, {E, D, F}, stacked_in(2));
  } else {
    const bool split = wi == MixtralWi::split;
    const Shape shape = split ? Shape{2, E, D / 2, 2 * F} : Shape{E, D, 2 * F};
    plan.add(prefix + "experts.wi", dt, shape, [=] {
      Tensor out = Tensor::empty(dt, {E, D, 2 * F});
      for (int64_t j = 0; j < E; ++j)
        for (int w : {0, 2}) {  // w1 -> columns [0, F), w3 -> [F, 2F)
          Tensor t = s->read(size_t(blk->experts.at(j)[size_t(w)]));
          transpose(t.raw(), F, D, D, bytes_at(out, j * D * 2 * F + (w == 0 ? 0 : F)), 2 * F, es);
        }
      return split ? out.reshaped(shape) : out;  // the split layout is the same bytes
    });
  }
  plan.add(prefix + "experts.wo", dt, {E, F, D}, [=] {
    Tensor out = Tensor::empty(dt, {E, F, D});
    for (int64_t j = 0; j < E; ++j) {
      Tensor t = s->read(size_t(blk->experts.at(j)[1]));
      transpose(t.raw(), D, F, F, bytes_at(out, j * F * D), D, es);
    }
    return out;
  });
}

// ---- engine names (for --to mixtral) ----

enum EngineSlot { kRouter, kWi0, kWi1, kWi, kWo, kSlots };
const char* const kEngineNames[kSlots] = {"router.kernel", "experts.wi_0", "experts.wi_1", "experts.wi",
                                          "experts.wo"};

struct EngineBlock {
  std::array<int64_t, kSlots> t{kMissing, kMissing, kMissing, kMissing, kMissing};
};

}  // namespace

MixtralConvertReport convert_from_mixtral(const std::string& in, const std::string& out, MixtralWi wi,
                                          int64_t layer) {
  MixtralConvertReport rep;
  const Source src = open_source(in);
  rep.files = src.files;
  rep.unlisted = src.unlisted;
  std::map<int64_t, MixtralBlock> blocks = find_blocks(src, rep);
  rep.blocks_found = blocks.size();
  if (blocks.empty())
    fail(src.origin,
         ": no Mixtral MoE block found: no tensor named model.layers.{i}.block_sparse_moe.* among its ",
         src.tensors.size(), " tensors");
  for (const auto& [i, b] : blocks) rep.layers.push_back(check_block(src, i, b));
  const MixtralLayer& first = rep.layers.front();
  for (const MixtralLayer& L : rep.layers)
    if (L.E != first.E || L.D != first.D || L.F != first.F)
      fail(src.origin, ": layer ", L.index, " has E = ", L.E, ", D = ", L.D, ", F = ", L.F, " but layer ",
           first.index, " has E = ", first.E, ", D = ", first.D, ", F = ", first.F,
           ": the layers of one engine file share one shape");
  if (layer >= 0) {
    auto it = std::find_if(rep.layers.begin(), rep.layers.end(),
                           [&](const MixtralLayer& L) { return L.index == layer; });
    if (it == rep.layers.end())
      fail(src.origin, ": --layer ", layer, ": there is no ", block_prefix(layer), "* (layers ",
           rep.layers.front().index, " .. ", rep.layers.back().index, " have MoE blocks)");
    const MixtralLayer keep = *it;
    rep.layers = {keep};  // the other layers were checked but are not written
  }
  if (wi == MixtralWi::split && (first.E % 2 != 0 || first.D % 2 != 0))
    fail(src.origin,
         ": --split needs an even E and D (the layout [2, E, D/2, 2F]); the blocks have E = ", first.E,
         ", D = ", first.D);
  Plan plan;
  for (const MixtralLayer& L : rep.layers)
    plan_from_block(plan, src, blocks.at(L.index), L,
                    layer >= 0 ? "" : "layers." + std::to_string(L.index) + ".", wi);
  std::map<std::string, std::string> metadata{{"moe.converted_from", "mixtral"}};
  if (wi != MixtralWi::separate)
    metadata[kWiLayoutKey] = wi_layout_name(wi == MixtralWi::split ? WiLayout::split : WiLayout::fused);
  plan.write(out, metadata);
  rep.tensors_written = plan.layout.size();
  return rep;
}

MixtralConvertReport convert_to_mixtral(const std::string& in, const std::string& out) {
  MixtralConvertReport rep;
  const Source src = open_single(in);
  rep.files = src.files;
  std::map<int64_t, EngineBlock> blocks;  // kMissing: unprefixed names (one layer, written as layer 0)
  for (size_t t = 0; t < src.tensors.size(); ++t) {
    std::string_view s = src.tensors[t].name;
    int64_t layer = kMissing;
    if (take(s, "layers.")) {
      std::optional<int64_t> id = take_id(s);
      layer = id ? *id : -2;
    }
    int slot = kSlots;
    for (int k = 0; k < kSlots && layer != -2; ++k)
      if (s == kEngineNames[k]) slot = k;
    if (slot == kSlots) {
      if (rep.left_out_examples.size() < kMaxExamples) rep.left_out_examples.push_back(src.tensors[t].name);
      ++rep.left_out;
      continue;
    }
    blocks[layer].t[size_t(slot)] = int64_t(t);
  }
  if (blocks.empty())
    fail(in, ": no MoE layer weights found: no tensor named router.kernel, experts.wi_0, experts.wi_1, ",
         "experts.wi or experts.wo (bare or under layers.{i}.) among its ", src.tensors.size(), " tensors");
  if (blocks.contains(kMissing) && blocks.size() > 1)
    fail(in, ": has both unprefixed layer weights (router.kernel, experts.*) and layers.{i}.* ones: ",
         "which layer is which is ambiguous");
  Plan plan;
  for (const auto& block : blocks) {
    const auto& i = block.first;  // not structured bindings: clang 14 cannot capture those
    const auto& b = block.second;
    const int64_t index = i == kMissing ? 0 : i;
    const std::string eng = i == kMissing ? "" : "layers." + std::to_string(i) + ".";
    const std::string in_layer = in + (i == kMissing ? std::string() : ": layer " + std::to_string(i));
    auto need = [&](int k) {
      if (b.t[size_t(k)] == kMissing) fail(in_layer, ": missing '", eng, kEngineNames[k], "'");
      return size_t(b.t[size_t(k)]);
    };
    const bool fused = b.t[kWi] != kMissing;
    if (fused && (b.t[kWi0] != kMissing || b.t[kWi1] != kMissing))
      fail(in_layer, ": has both '", eng, "experts.wi' and '", eng, "experts.wi_0'/'wi_1': one layout only");
    const SafetensorsEntry& r = src.entry(need(kRouter));
    if (r.shape.size() != 2)
      fail(src.where(need(kRouter)), ": shape ", shape_str(r.shape), ", expected [D, E]");
    MixtralLayer L{index, r.shape[1], r.shape[0], 0, r.dtype};
    if (!is_float(L.dtype))
      fail(src.where(need(kRouter)), ": dtype ", dtype_safetensors_name(L.dtype),
           " is not a float type (F32, BF16, F16)");
    const SafetensorsEntry& wo = src.entry(need(kWo));
    if (wo.shape.size() == 3) L.F = wo.shape[1];
    auto check = [&](size_t t, const std::vector<Shape>& wants) {
      const SafetensorsEntry& e = src.entry(t);
      if (std::find(wants.begin(), wants.end(), e.shape) == wants.end())
        fail(src.where(t), ": shape ", shape_str(e.shape), ", expected ", shape_str(wants[0]),
             wants.size() > 1 ? " or " + shape_str(wants[1]) : std::string(), " (E = ", L.E, ", D = ", L.D,
             " from router.kernel, F = ", L.F, " from experts.wo)");
      if (e.dtype != L.dtype)
        fail(src.where(t), ": dtype ", dtype_safetensors_name(e.dtype), " differs from '", eng,
             "router.kernel''s ", dtype_safetensors_name(L.dtype),
             ": the tensors of a layer must share one dtype");
    };
    const int64_t E = L.E, D = L.D, F = L.F;
    check(need(kWo), {{E, F, D}});
    if (fused)
      check(need(kWi), {{E, D, 2 * F}, {2, E, D / 2, 2 * F}});
    else
      check(need(kWi0), {{E, D, F}}), check(need(kWi1), {{E, D, F}});
    rep.layers.push_back(L);

    // Producers. One expert's slices are read once and kept while its w1, w2, w3 are made.
    const DType dt = L.dtype;
    const size_t es = dtype_size(dt);
    const SafetensorsReader& reader = src.readers[0];
    struct Cache {
      int64_t expert = kMissing;
      std::map<int, Tensor> slices;  // engine slot -> expert j's slice
    };
    auto cache = std::make_shared<Cache>();
    auto slice = [&reader, &src, cache, b, D, F, dt](int k, int64_t j) {
      if (cache->expert != j) cache->slices.clear(), cache->expert = j;
      auto it = cache->slices.find(k);
      if (it != cache->slices.end()) return it->second;
      const int64_t cols = k == kWi ? 2 * F : k == kWo ? D : F, rows = k == kWo ? F : D;
      Tensor t = Tensor::empty(dt, {rows, cols});
      reader.read_bytes(src.tensors[size_t(b.t[size_t(k)])].name, uint64_t(j) * t.nbytes(), t.nbytes(),
                        t.raw());
      return cache->slices[k] = t;
    };
    const std::string P = block_prefix(index);
    for (int64_t j = 0; j < E; ++j) {
      const std::string ex = P + "experts." + std::to_string(j) + ".";
      for (int w = 0; w < 3; ++w) {
        const Shape shape = w == 1 ? Shape{D, F} : Shape{F, D};
        plan.add(ex + kProj[w] + ".weight", dt, shape, [=] {
          Tensor o = Tensor::empty(dt, shape);
          if (w == 1) {
            Tensor t = slice(kWo, j);  // [F, D]
            transpose(t.raw(), F, D, D, o.raw(), F, es);
          } else if (fused) {
            Tensor t = slice(kWi, j);  // [D, 2F]: w1 in columns [0, F), w3 in [F, 2F)
            transpose(bytes_at(t, w == 0 ? 0 : F), D, F, 2 * F, o.raw(), D, es);
          } else {
            Tensor t = slice(w == 0 ? kWi0 : kWi1, j);  // [D, F]
            transpose(t.raw(), D, F, F, o.raw(), D, es);
          }
          return o;
        });
      }
    }
    const size_t router = need(kRouter);
    plan.add(P + "gate.weight", dt, {E, D}, [&src, router, E, D, dt, es] {
      Tensor t = src.read(router), o = Tensor::empty(dt, {E, D});
      transpose(t.raw(), D, E, E, o.raw(), D, es);
      return o;
    });
  }
  plan.write(out, {{"format", "pt"}});
  rep.tensors_written = plan.layout.size();
  return rep;
}

}  // namespace moe
