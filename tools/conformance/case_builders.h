// keel/tools/conformance/case_builders.h — (internal to the conformance kit) short builders of the cases' attributes
// and inputs, shared by the case table (device_cts.cc) and the random chains (random_chains.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tools/conformance/device_cts.h"

namespace keel::cts {

inline Attribute I(int64_t v) { return Attribute::of_int(v); }
inline Attribute F(float v) { return Attribute::of_float(v); }
inline Attribute S(const std::string& v) { return Attribute::of_string(v); }
inline Attribute Is(std::vector<int64_t> v) { return Attribute::of_ints(std::move(v)); }

// An input uniformly random in [lo, hi] (an initializer when `constant`).
inline InputSpec in(const std::string& name, Shape shape, bool constant = false, float lo = -1.f, float hi = 1.f) {
  InputSpec s;
  s.name = name;
  s.shape = std::move(shape);
  s.constant = constant;
  s.lo = lo;
  s.hi = hi;
  return s;
}

}  // namespace keel::cts
