// Printing configs and the key list: the resolved table (rank 0 prints it)
// and the --help key list, both grouped by section in key-table order.
#include <algorithm>
#include <sstream>

#include "config/config_keys.h"
#include "moe/config.h"

namespace moe {
namespace {

using config_detail::key_table;

std::string group_of(const std::string& key) {
  const auto* k = config_detail::find_key(key);
  return k ? config_detail::group_name(k->group) : "other";
}

std::string shown(const std::string& value) { return value.empty() ? "\"\"" : value; }

std::string pad(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string type_column(const ConfigKeyInfo& k) {
  if (k.type != "enum") return k.type;
  std::string s;
  for (const auto& a : k.allowed) s += (s.empty() ? "" : "|") + a;
  return s;
}

}  // namespace

std::vector<ConfigKeyInfo> config_key_infos() {
  const Config defaults;
  std::vector<ConfigKeyInfo> out;
  for (const auto& k : key_table())
    out.push_back({k.name, config_detail::type_name(k), config_detail::format_value(defaults, k), k.allowed,
                   k.help, config_detail::group_name(k.group), k.required});
  return out;
}

std::string format_config_table(const std::vector<ConfigEntry>& table) {
  size_t kw = 3, vw = 5;
  for (const auto& e : table) kw = std::max(kw, e.key.size()), vw = std::max(vw, shown(e.value).size());
  std::ostringstream os;
  os << "  " << pad("key", kw) << "  " << pad("value", vw) << "  source\n";
  std::vector<std::string> groups;  // in order of first appearance
  for (const auto& e : table)
    if (std::find(groups.begin(), groups.end(), group_of(e.key)) == groups.end())
      groups.push_back(group_of(e.key));
  for (const auto& g : groups) {
    os << g << ":\n";
    for (const auto& e : table)
      if (group_of(e.key) == g)
        os << "  " << pad(e.key, kw) << "  " << pad(shown(e.value), vw) << "  " << e.source << "\n";
  }
  return os.str();
}

std::string format_config_help() {
  auto infos = config_key_infos();
  size_t kw = 0, tw = 0, dw = 0;
  for (const auto& k : infos) {
    kw = std::max(kw, k.name.size());
    tw = std::max(tw, type_column(k).size());
    dw = std::max(dw, k.required ? size_t(10) : shown(k.default_value).size());
  }
  std::ostringstream os;
  std::string group;
  for (const auto& k : infos) {
    if (k.group != group)
      os << (group.empty() ? "" : "\n") << (group = k.group) << " keys (name, type, default):\n";
    os << "  " << pad(k.name, kw) << "  " << pad(type_column(k), tw) << "  "
       << pad(k.required ? "(required)" : shown(k.default_value), dw) << "  " << k.help << "\n";
  }
  return os.str();
}

}  // namespace moe
