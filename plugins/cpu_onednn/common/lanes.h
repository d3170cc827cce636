// plugins/cpu_onednn/common/lanes.h — (internal) the mask of a 16-lane vector's first n lanes, as the plugin's own
// AVX-512 loops mask a row's (or a channel block's) last, partial step. Plain integer arithmetic: callable from any
// code, with or without an AVX-512 target.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace keel::onednn {

// Lanes [0, n) set: all 16 from n >= 16, none from n <= 0.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

}  // namespace keel::onednn
