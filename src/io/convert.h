// `moe convert`: the prefused expert weight `experts.wi` [E, D, 2F] <-> the
// split layout [2, E, D/2, 2F] (SPEC.md §5). The two are the same row-major
// bytes (slice h of the split tensor, read as [E/2, D, 2F], holds experts
// [h*E/2, (h+1)*E/2)), so converting only rewrites shapes: bit-exact both ways.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "moe/safetensors.h"

namespace moe {

enum class WiLayout { fused, split };

// "fused" | "split"; the value of the metadata key kWiLayoutKey.
const char* wi_layout_name(WiLayout layout);
// Metadata key recording the layout of every wi tensor in a converted file.
inline constexpr const char* kWiLayoutKey = "moe.wi_layout";

// True for `experts.wi` and any name ending in `.experts.wi` (a stacked layer
// `layers.3.experts.wi`, an optimizer moment `opt.m.layers.0.experts.wi`).
bool is_wi_tensor_name(std::string_view name);

// Converts every wi tensor of `in` to `to` (the tensors share storage with
// `in`); other tensors and the metadata are kept, and kWiLayoutKey is set.
// Throws moe::Error naming in.path and the tensor when a wi tensor has the
// wrong rank for the direction (already converted), an odd E or D (to split),
// or when there is no wi tensor at all.
// `converted` (optional) receives the names converted, in file order.
SafetensorsFile convert_wi_layout(const SafetensorsFile& in, WiLayout to,
                                  std::vector<std::string>* converted = nullptr);

// Reads `in_path`, converts, writes `out_path` atomically (it may equal
// in_path). Returns the names converted.
std::vector<std::string> convert_wi_file(const std::string& in_path, const std::string& out_path,
                                         WiLayout to);

}  // namespace moe
