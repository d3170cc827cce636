// plugins/cpu_onednn/steps/grouped.h — (internal) a 3x3 convolution in groups of 4 channels (ResNeXt's 32x4d
// layer1) over nChw16c memory: the chains' own step.
//
// oneDNN 2.6 runs such a convolution in a layout blocked by 4 (reorders from and to nChw16c around it), or, as the
// chain did before, merged into groups of 16 with block-diagonal weights (4x the multiply-adds: ResNeXt-50's
// 128-channel 3x3s at 56x56 in 0.57 ms at 1 thread, at the FMA peak). Here each 16-channel block holds four whole
// groups, one per 128-bit lane: per kernel tap and input channel i of a group, one in-lane permute spreads lane i of
// every group over its four lanes and one FMA applies the 16 output channels' weights for it (4 permutes and 4 FMAs
// per tap and pixel instead of 16 FMAs). See docs/ONEDNN_PERFORMANCE.md, "(r50f)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// The geometry: source nChw16c [n, 16*blocks, h, w], destination nChw16c [n, 16*blocks, oh, ow], 3x3 kernel,
// stride `stride` (1 or 2), padding 1 on every side (so oh = (h - 1) / stride + 1, ow likewise), groups of 4
// channels (as many outputs as inputs), bias, then Relu when `relu`.
struct Grouped4Shape {
  int64_t n = 1, blocks = 1, h = 0, w = 0, stride = 1;
  bool relu = false;
  int64_t oh() const { return (h - 1) / stride + 1; }
  int64_t ow() const { return (w - 1) / stride + 1; }
};

// "" when the step computes this shape, else what it does not take.
std::string grouped4_check(const Grouped4Shape& s);

// Packs ONNX weights [16*blocks][4][3][3] (OIHW, 4 input channels per group) into the step's layout
// [blocks][3][3][4][16]: grouped4_packed_floats(s) floats at `packed`. Lane j of entry (b, kh, kw, i) is the weight
// of output channel 16b + j for input channel i of its group.
size_t grouped4_packed_floats(const Grouped4Shape& s);
void grouped4_pack_weights(const Grouped4Shape& s, const float* w, float* packed);

// Computes the output rows [begin, end) of the n * oh * blocks (image, row, block) triples into dst. Reads src,
// packed weights and bias [16*blocks]. Thread-safe for disjoint ranges; AVX-512 when the CPU has it
// (steps/silu.h's has_avx512f), else scalar code (also taken after grouped4_force_scalar(true)).
void grouped4_rows(const Grouped4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
                   int64_t begin, int64_t end);

// The whole of it over `team` OpenMP threads (contiguous ranges of rows).
void grouped4_run(const Grouped4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
                  int team);

// Test hook: true makes grouped4_rows take its scalar code from now on; false restores the dispatch by CPU.
void grouped4_force_scalar(bool on);

// The same by straightforward loops over ONNX weights [16*blocks][4][3][3] (the reference the step is tested
// against).
void grouped4_reference(const Grouped4Shape& s, const float* src, const float* w, const float* bias, float* dst);

}  // namespace keel::onednn
