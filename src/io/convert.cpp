#include "io/convert.h"

namespace moe {
namespace {

// [E, D, 2F] -> [2, E, D/2, 2F]
Shape split_shape(const SafetensorsFile& f, const std::string& name, const Shape& s) {
  if (s.size() == 4)
    fail(f.path, ": tensor '", name, "' has shape ", shape_str(s),
         ", which is already the split layout [2, E, D/2, 2F] (nothing to do for --to split)");
  if (s.size() != 3)
    fail(f.path, ": tensor '", name, "' has shape ", shape_str(s),
         ", expected the prefused layout [E, D, 2F]");
  if (s[0] % 2 != 0)
    fail(f.path, ": tensor '", name, "' has an odd number of experts E = ", s[0], " (shape ", shape_str(s),
         "); the split layout needs an even E");
  if (s[1] % 2 != 0)
    fail(f.path, ": tensor '", name, "' has an odd emb_dim D = ", s[1], " (shape ", shape_str(s),
         "); the split layout needs an even D");
  return {2, s[0], s[1] / 2, s[2]};
}

// [2, E, D/2, 2F] -> [E, D, 2F]
Shape fused_shape(const SafetensorsFile& f, const std::string& name, const Shape& s) {
  if (s.size() == 3)
    fail(f.path, ": tensor '", name, "' has shape ", shape_str(s),
         ", which is already the prefused layout [E, D, 2F] (nothing to do for --to fused)");
  if (s.size() != 4 || s[0] != 2)
    fail(f.path, ": tensor '", name, "' has shape ", shape_str(s),
         ", expected the split layout [2, E, D/2, 2F]");
  return {s[1], 2 * s[2], s[3]};
}

}  // namespace

const char* wi_layout_name(WiLayout layout) { return layout == WiLayout::split ? "split" : "fused"; }

bool is_wi_tensor_name(std::string_view name) {
  constexpr std::string_view kSuffix = ".experts.wi";
  return name == "experts.wi" || (name.size() > kSuffix.size() && name.ends_with(kSuffix));
}

SafetensorsFile convert_wi_layout(const SafetensorsFile& in, WiLayout to,
                                  std::vector<std::string>* converted) {
  SafetensorsFile out;
  out.path = in.path;
  out.metadata = in.metadata;
  out.metadata[kWiLayoutKey] = wi_layout_name(to);
  std::vector<std::string> names;
  for (const auto& [name, t] : in.tensors) {
    if (!is_wi_tensor_name(name)) {
      out.tensors.emplace_back(name, t);
      continue;
    }
    Shape s = to == WiLayout::split ? split_shape(in, name, t.shape()) : fused_shape(in, name, t.shape());
    out.tensors.emplace_back(name, t.reshaped(std::move(s)));  // same bytes, new shape
    names.push_back(name);
  }
  if (names.empty())
    fail(in.path, ": nothing to convert: no tensor named 'experts.wi' or '*.experts.wi' (", in.tensors.size(),
         " tensors; separate wi_0/wi_1 weights have no split layout)");
  if (converted) *converted = std::move(names);
  return out;
}

std::vector<std::string> convert_wi_file(const std::string& in_path, const std::string& out_path,
                                         WiLayout to) {
  SafetensorsFile in = read_safetensors(in_path);
  std::vector<std::string> names;
  SafetensorsFile out = convert_wi_layout(in, to, &names);
  write_safetensors(out_path, out.tensors, out.metadata);
  return names;
}

}  // namespace moe
