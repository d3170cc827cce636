// keel/core/base/device_spec.h — one device named by type and index: "cuda:1", "cpu:0", "cuda" (= index 0).
//
// The one parser of device specs: sessions (SessionOptions::devices), eager tensors (to("cuda:1")), the C API and
// the `keel` command line all go through it, so every place that chooses a device accepts and rejects the same
// strings with the same messages. Plain values; thread-safe as values are.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/registry.h"
#include "core/base/status.h"

namespace keel {

struct DeviceSpec {
  std::string type;             // "cpu", "cuda", ...: lowercase letters, digits, '_' (starts with a letter)
  int32_t index = 0;            // which device of that type
  bool explicit_index = false;  // the spec said ":N" ("cuda:0"), not just the type ("cuda")

  // "TYPE" or "TYPE:INDEX" (surrounding blanks ignored). INVALID_ARGUMENT naming the spec for an empty type, an
  // index that is not a non-negative decimal number ("cuda:x", "cuda:-1", "cuda:"), or a type with other
  // characters. Says nothing about whether the device exists: see resolve().
  static StatusOr<DeviceSpec> parse(std::string_view spec);
  // Parses and checks against the devices registered in `reg`: NOT_FOUND for an unknown type (naming the types
  // there are), OUT_OF_RANGE for an index past the devices of that type (naming how many there are).
  static StatusOr<DeviceSpec> resolve(const Registry& reg, std::string_view spec);
  // Checks an already parsed spec against `reg` (the errors of resolve()).
  Status check(const Registry& reg) const;

  std::string to_string() const { return type + ":" + std::to_string(index); }  // always "TYPE:INDEX"
  bool operator==(const DeviceSpec& o) const { return type == o.type && index == o.index; }
  bool operator!=(const DeviceSpec& o) const { return !(*this == o); }
};

}  // namespace keel
