// plugins/cpu_onednn/steps/dilated.h — (internal) layout steps of the plugin's own around convolutions, over
// nChw16c memory:
//   - space-to-batch and batch-to-space: a 3x3 convolution with dilation d and padding d (DeepLab's and FCN's
//     atrous layers) computes the same as a plain 3x3 convolution with padding 1 over the d*d images of every d-th
//     row and column (the "phases" of the input), which oneDNN runs as Winograd where it has no Winograd kernel for
//     the dilated one (conv_dilated_phases);
//   - the source of ResNet's merged strided bottleneck end (conv_residual_merged): the block's 3x3 output (nhwc
//     from oneDNN's brgemm kernel, or nChw16c) and every other row and column of the block's input side by side in
//     one nChw16c buffer, in one pass instead of two oneDNN reorders.
// See chain/ops/conv_variants.cc and docs/ONEDNN_PERFORMANCE.md.
#pragma once

#include <cstdint>

namespace keel::onednn {

// The shape both functions work on: an nChw16c image batch [n, 16*blocks, h, w] (f32, dense, channels padded to
// whole 16-channel blocks) and its phases, the nChw16c batch [n*d*d, 16*blocks, h/d, w/d] where image
// (b*d + r)*d + s holds pixels (d*i + r, d*j + s) of image b. h and w must be multiples of d.
struct PhaseShape {
  int64_t n = 1, blocks = 1, h = 0, w = 0, d = 1;
};

// image -> phases, and back. src and dst must not overlap. `team` > 1 splits the work over that many OpenMP
// threads (0 or 1: the calling thread only). Thread-safe for distinct dst.
void space_to_phases16(const float* src, float* dst, const PhaseShape& s, int team);
void phases_to_space16(const float* src, float* dst, const PhaseShape& s, int team);

// The source of a merged bottleneck end: nChw16c [1, ch + cx, h, w] whose first ch channels are `hsrc` ([1, ch, h,
// w]: nhwc when h_nhwc, else nChw16c) and whose next cx channels are x ([1, cx, xh, xw], nChw16c) at every
// stride-th row and column from (0, 0): (h - 1) * stride < xh and (w - 1) * stride < xw. ch and cx multiples of 16.
struct MergedSourceShape {
  int64_t ch = 16, cx = 16, h = 1, w = 1, xh = 1, xw = 1, stride = 1;
  bool h_nhwc = false;
};
// dst must overlap neither source; `team` as above (the output's rows are split). Thread-safe for distinct dst.
void merged_source16(const float* hsrc, const float* x, float* dst, const MergedSourceShape& s, int team);

}  // namespace keel::onednn
