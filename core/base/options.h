// keel/core/base/options.h — a flat map of typed options: a plugin's manifest [options], a pass's options in a
// pipeline. Behind the opaque keel_options_t of the plugin ABI. Immutable once built; reads are thread-safe.
#pragma once

#include <keel/plugin.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

struct keel_options_s {
  using Value = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;
  std::map<std::string, Value> values;
};

namespace keel {
using Options = keel_options_s;
// The C table that reads an Options object (keel_options_api_t).
const keel_options_api_t* options_api();
}  // namespace keel
