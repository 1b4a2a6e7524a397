// Resolving a config: YAML file, then `key=value` overrides, then the rules
// (config_rules.cpp). Every problem is collected and reported at once.
#include "moe/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/config_keys.h"

namespace moe {
namespace {

using config_detail::find_key;
using config_detail::key_table;
using config_detail::KeyDef;

// The text a key resolved to, before typing. `not_scalar` names what was
// found instead of a scalar ("a mapping", "a list"), empty when a scalar.
struct RawValue {
  std::string text;
  std::string not_scalar;
  std::string source;  // "file" | "override"
};

// Levenshtein distance of a and b, or `limit` when it is at least `limit` (a row's minimum never
// decreases, so the rows stop there).
size_t edit_distance(const std::string& a, const std::string& b, size_t limit) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    std::swap(prev, cur);
    if (*std::min_element(prev.begin(), prev.end()) >= limit) return limit;
  }
  return std::min(prev[b.size()], limit);
}

std::string unknown_key_message(const std::string& key) {
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;  // farther than this: no suggestion
  for (const auto& k : key_table()) {
    // The length difference bounds the distance from below: a key far longer than every name (a
    // stray line of text) costs no quadratic comparisons.
    const size_t n = std::strlen(k.name);
    const size_t gap = key.size() > n ? key.size() - n : n - key.size();
    if (gap >= best_d) continue;
    size_t d = edit_distance(key, k.name, best_d);
    if (d < best_d) best_d = d, best = k.name;
  }
  if (best.empty()) return "unknown config key '" + key + "' (see `moe validate --help` for every key)";
  return "unknown config key '" + key + "' (did you mean '" + best + "'?)";
}

// What a YAML node holds, for messages: "" for a scalar or null.
std::string non_scalar_kind(const YAML::Node& n) {
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  return "";
}

// Scalar text of a YAML value node; null reads as "".
RawValue raw_from_node(const YAML::Node& n, const char* source) {
  RawValue v{"", non_scalar_kind(n), source};
  if (n.IsScalar()) v.text = n.Scalar();
  return v;
}

// The file's keys (in file order) into `raw`. Structural problems (not a
// mapping, YAML syntax) are fatal: nothing else can be read.
void read_yaml(const std::string& text, const std::string& origin, std::map<std::string, RawValue>& raw,
               std::vector<std::string>& problems) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(origin,
                      {"YAML syntax error at line " + std::to_string(e.mark.line + 1) + ": " + e.msg});
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw ConfigError(origin, {"expected a mapping of `key: value` lines at the top level"});
  for (const auto& kv : root) {
    if (!kv.first.IsScalar()) {
      problems.push_back("config keys must be plain names (found " + non_scalar_kind(kv.first) + ")");
      continue;
    }
    const std::string key = kv.first.Scalar();
    if (raw.count(key)) problems.push_back(key + ": set more than once in " + origin);
    raw[key] = raw_from_node(kv.second, "file");
  }
}

// One `key=value` token into `raw` (value read as a YAML scalar; `key=` is "").
void read_override(const std::string& token, std::map<std::string, RawValue>& raw,
                   std::vector<std::string>& problems) {
  size_t eq = token.find('=');
  if (eq == std::string::npos || eq == 0) {
    problems.push_back("override '" + token + "' is not of the form key=value");
    return;
  }
  const std::string key = token.substr(0, eq), value = token.substr(eq + 1);
  try {
    raw[key] = raw_from_node(YAML::Load(value), "override");
  } catch (const YAML::Exception& e) {
    raw[key] = RawValue{value, "", "override"};  // not valid YAML: keep the literal text
  }
}

// Types every resolved value into `c`; records sources; returns the keys with bad values.
std::set<std::string> apply_raw(const std::map<std::string, RawValue>& raw, Config& c,
                                std::map<std::string, std::string>& sources,
                                std::vector<std::string>& problems) {
  std::set<std::string> bad;
  for (const auto& [key, v] : raw) {
    const KeyDef* k = find_key(key);
    if (!k) {
      problems.push_back(unknown_key_message(key));
      continue;
    }
    std::string expected = v.not_scalar.empty() ? config_detail::assign_value(c, *k, v.text) : "";
    if (!v.not_scalar.empty())
      problems.push_back(key + ": expected a single value, got " + v.not_scalar);
    else if (!expected.empty())
      problems.push_back(key + ": bad value '" + v.text + "' (expected " + expected + ")");
    else
      sources[key] = v.source;
    if (!v.not_scalar.empty() || !expected.empty()) bad.insert(key);
  }
  return bad;
}

// True if `text` contains `word` not as part of a longer identifier.
bool mentions(const std::string& text, const std::string& word) {
  auto ident = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    bool left = at == 0 || !ident(text[at - 1]);
    bool right = at + word.size() == text.size() || !ident(text[at + word.size()]);
    if (left && right) return true;
  }
  return false;
}

std::string header(const std::string& origin, size_t n) {
  return "invalid config " + origin + " (" + std::to_string(n) + (n == 1 ? " problem)" : " problems)");
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += "\n  " + l;
  return s;
}

}  // namespace

ConfigError::ConfigError(const std::string& origin, std::vector<std::string> problems)
    : Error(header(origin, problems.size()) + join_lines(problems)), problems_(std::move(problems)) {}

LoadedConfig parse_config(const std::string& yaml_text, const std::string& origin,
                          const std::vector<std::string>& overrides) {
  std::map<std::string, RawValue> raw;
  std::vector<std::string> problems;
  read_yaml(yaml_text, origin, raw, problems);
  for (const auto& token : overrides) read_override(token, raw, problems);
  LoadedConfig out;
  std::map<std::string, std::string> sources;
  std::set<std::string> bad = apply_raw(raw, out.config, sources, problems);
  for (auto& p : config_problems(out.config)) {
    // A rule about a key whose value did not parse would only repeat that problem.
    bool repeats = std::any_of(bad.begin(), bad.end(), [&](const std::string& k) { return mentions(p, k); });
    if (!repeats) problems.push_back(std::move(p));
  }
  if (!problems.empty()) throw ConfigError(origin, std::move(problems));
  for (const auto& k : key_table()) {
    auto it = sources.find(k.name);
    out.table.push_back(
        {k.name, config_detail::format_value(out.config, k), it == sources.end() ? "default" : it->second});
  }
  return out;
}

LoadedConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in || !std::filesystem::is_regular_file(path)) fail("cannot read config file '", path, "'");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> names;
    for (const auto& k : key_table()) names.push_back(k.name);
    return names;
  }();
  return keys;
}

std::string config_value(const Config& c, const std::string& key) {
  const KeyDef* k = find_key(key);
  MOE_ASSERT(k != nullptr, "config_value: unknown key " + key);
  return config_detail::format_value(c, *k);
}

}  // namespace moe
