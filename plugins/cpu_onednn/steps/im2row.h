// plugins/cpu_onednn/steps/im2row.h — (internal) a convolution's windows as the rows of a product: for each output
// pixel, the values its kernel reads, one row X [pixel][k] that steps/skinny_gemm.h multiplies with the weights.
//
// Why: a convolution over few output pixels (ResNet-50's layer4.0 at batch 1: 7x7) with large weights (9.4-12.6 MB)
// is a product of 49 rows with weights that come from memory at every run; oneDNN's kernels ran those at 67-76% of
// the FMA peak (the stride-2 3x3 on brgconv, the merged 1x1 bottleneck end on jit_1x1), the few-row step at 80-90%
// (docs/ONEDNN_PERFORMANCE.md, "(skc)"). Gathering the windows costs one pass over a small source.
//
// A row is the concatenation of up to two parts, each a window over its own source: a part of `c` channels and a
// kh x kw kernel contributes kh * kw * c values, tap by tap (row-major over the kernel), each tap's c channels in
// order; a tap outside its source contributes zeros. Two parts: a bottleneck's end and its strided projection summed
// (chain/ops/conv_variants.cc, conv_residual_merged): [h's channels][x's channels at every stride-th pixel].
//
// Needs nothing beyond the C++ standard (plain copies). Thread-safety: stateless; concurrent calls with distinct
// outputs are safe.
#pragma once

#include <cstdint>
#include <string>

namespace keel::onednn {

// One part of a row: a window over a source [1, c, h, w] in nhwc or (blocked16) nChw16c memory.
struct Im2RowPart {
  int64_t c = 16, h = 1, w = 1;
  bool blocked16 = false;            // nChw16c (c a multiple of 16), else nhwc
  int64_t kh = 1, kw = 1;            // kernel
  int64_t stride = 1, dilation = 1;  // the same along both axes
  int64_t pad_top = 0, pad_left = 0;
  int64_t floats() const { return kh * kw * c; }
};

struct Im2RowShape {
  int64_t oh = 1, ow = 1;  // output pixels: X has oh * ow rows
  int parts = 1;           // 1 or 2
  Im2RowPart part[2];
  int64_t row_floats() const { return part[0].floats() + (parts > 1 ? part[1].floats() : 0); }
};

// "" when the step takes this shape, else what it does not take.
std::string im2row_check(const Im2RowShape& s);

// X [oh * ow][row_floats()] from the parts' sources (src[p] for part p), the rows split over `team` OpenMP threads
// (team <= 1: the calling thread). x must overlap no source.
void im2row_run(const Im2RowShape& s, const float* const* src, float* x, int team);

}  // namespace keel::onednn
