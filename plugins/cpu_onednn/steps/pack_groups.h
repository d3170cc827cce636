// plugins/cpu_onednn/steps/pack_groups.h — (internal) the weight layout of the own steps' 1x1 register tiles
// (steps/expand_dw.cc over f32 and bf16, steps/int8_expand_dw.cc over int8): output channels rounded up to 16, in
// groups of 32 (the last one 16 wide for an odd number of 16-channel blocks), each group [ins / K][group width][K] with
// K input channels interleaved per output: 1 for f32 FMAs, 2 for bf16 pairs (vdpbf16ps), 4 for int8 quads
// (vpdpbusd), so that one vector load is K input channels of 16 outputs. Plain integer code; header-only.
#pragma once

#include <algorithm>
#include <cstdint>

namespace keel::onednn {

// 32-channel groups of `padded` (a multiple of 16) output channels, and the width of group g (32, or 16 for the last).
inline int64_t groups_of(int64_t padded) { return (padded + 31) / 32; }
inline int64_t group_width(int64_t padded, int64_t g) { return std::min<int64_t>(32, padded - 32 * g); }

// w [outs][ins] into `to` (its group g at to + 32 * ins_padded * g; ins_padded a multiple of K, >= ins), each value
// through convert(). Positions past outs or ins are left as they are: the caller zero-fills `to` first.
template <int K, class To, class From, class Convert>
void pack_groups(const From* w, int64_t outs, int64_t ins, int64_t ins_padded, To* to, Convert convert) {
  const int64_t padded = (outs + 15) / 16 * 16;
  for (int64_t o = 0; o < outs; ++o) {
    const int64_t g = o / 32, wg = group_width(padded, g), lane = o % 32;
    To* U = to + 32 * ins_padded * g;  // groups before g are all 32 wide
    for (int64_t k = 0; k < ins; ++k) U[((k / K) * wg + lane) * K + k % K] = convert(w[o * ins + k]);
  }
}

}  // namespace keel::onednn
