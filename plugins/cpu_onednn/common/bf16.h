// plugins/cpu_onednn/common/bf16.h — (internal) scalar bf16 <-> f32 conversions for the plugin's kernels and steps.
// Plain integer code, no dependencies: callable from anywhere in the plugin, steps/ included.
#pragma once

#include <cstdint>
#include <cstring>

namespace keel::onednn {

// A bf16 value's bits widened to f32 (exact).
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// f32 rounded to the nearest bf16, ties to even; a NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace keel::onednn
