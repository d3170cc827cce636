// plugins/cpu_onednn/onednn_dilated.h — (internal) space-to-batch and batch-to-space of nChw16c memory: a 3x3
// convolution with dilation d and padding d (DeepLab's and FCN's atrous layers) computes the same as a plain 3x3
// convolution with padding 1 over the d*d images of every d-th row and column (the "phases" of the input), which
// oneDNN runs as Winograd where it has no Winograd kernel for the dilated one. See onednn_subgraph.cc
// (conv_dilated_phases) and PERFORMANCE.md.
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

}  // namespace keel::onednn
