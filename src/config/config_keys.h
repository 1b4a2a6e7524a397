// The key table: the one list of config keys that drives parsing, the
// resolved table, config_keys(), --help and docs/config.md. Defaults are the
// member initializers of moe::Config (include/moe/config.h); the table reads
// them from a default-constructed Config, so they are written down once.
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "moe/config.h"

namespace moe::config_detail {

enum class Group { layer, parallelism, offload, train };

// The Config member a key is bound to; the alternative held is the key's type.
using Field =
    std::variant<int64_t Config::*, double Config::*, bool Config::*, std::string Config::*, DType Config::*,
                 ScoreFunc Config::*, Activation Config::*, KernelChoice Config::*, EpAllToAll Config::*>;

struct KeyDef {
  KeyDef(const char* name, Field field, Group group, const char* help, std::vector<std::string> allowed = {},
         bool required = false)
      : name(name), field(field), group(group), help(help), allowed(std::move(allowed)), required(required) {}

  const char* name;
  Field field;
  Group group;
  const char* help;
  std::vector<std::string> allowed;  // enum keys: every accepted spelling
  bool required;                     // must be set (and > 0)
};

// Every key, grouped by section in documentation order.
const std::vector<KeyDef>& key_table();
// nullptr when `name` is not a key.
const KeyDef* find_key(std::string_view name);

const char* group_name(Group g);
// "int", "float", "bool", "string" or "enum".
const char* type_name(const KeyDef& k);

// Parses scalar text into k's field of `c`. Returns "" on success, otherwise
// what was expected ("an integer", "one of bf16|f32"); `c` is then unchanged.
std::string assign_value(Config& c, const KeyDef& k, const std::string& text);
// The printed value of k's field of `c` (round-trips through assign_value).
std::string format_value(const Config& c, const KeyDef& k);

}  // namespace moe::config_detail
