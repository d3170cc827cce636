// plugins/cpu_onednn/steps/convpool.h — (internal) a convolution over few input channels (a network's first
// layer, reading the plain image) fused with the ReLU and the max pooling after it: the chains' own step.
//
// SqueezeNet 1.1's first layer (3->64 channels, 3x3 stride 2 over 224x224) wrote 3.1 MB that its MaxPool (3x3
// stride 2, ceil) read back: at 2 threads oneDNN's jit convolution took 0.21-0.27 ms and the pooling 0.09-0.11 ms,
// where 1 thread took 0.24 and 0.06 (both bound by that traffic, not by arithmetic). Here each thread computes the
// convolution rows its pooled rows need into a ring of a few rows (in its L2 cache) and pools them straight away:
// only the pooled output goes to memory. See docs/ONEDNN_PERFORMANCE.md, "(sqz)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// The geometry of Conv (+ Relu) + MaxPool over a batch. The convolution's end pads are implied by oh and ow, the
// pooling's by ph and pw (ceil_mode included): windows are clipped to the convolution output, as max pooling
// ignores padding.
struct ConvPoolShape {
  int64_t n = 1, c = 0, h = 0, w = 0;                            // source: plain NCHW f32
  int64_t m = 0;                                                 // convolution output channels: a multiple of 16
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, pt = 0, pl = 0;        // convolution kernel, strides, pads before
  int64_t oh = 0, ow = 0;                                        // convolution output
  bool relu = false;                                             // max(x, 0) after the bias
  int64_t pkh = 1, pkw = 1, psh = 1, psw = 1, ppt = 0, ppl = 0;  // pooling kernel, strides, pads before
  int64_t ph = 0, pw = 0;                                        // pooled output: nChw16c [n, m, ph, pw]
};

// "" when the fused step computes this shape, else what it does not take (every pooling window must overlap the
// convolution output: pads smaller than the kernel, no window entirely in the padding; at most 16 kernel rows).
std::string conv_pool_check(const ConvPoolShape& s);

// True when the pooling is 2x2 with stride 2 and no padding, windows tiling the convolution output (floor mode): the
// step then pools each pair of convolution rows in registers as the lower row is computed (no ring, no pooling
// pass), and is faster than oneDNN's convolution and pooling apart at every batch and thread count measured.
bool conv_pool_2x2(const ConvPoolShape& s);

// Floats of scratch one thread needs (its ring of convolution rows and one row of partial maxima).
size_t conv_pool_scratch_floats(const ConvPoolShape& s);

// Packs weights [m][c][kh][kw] (OIHW) into the step's layout: groups of four 16-channel blocks (the last one of
// m/16 % 4 blocks, if any), each [c][kh][kw][blocks in the group][16], so that one tap's weights for the group are
// contiguous: conv_pool_packed_floats(s) floats at `packed`.
size_t conv_pool_packed_floats(const ConvPoolShape& s);
void conv_pool_pack_weights(const ConvPoolShape& s, const float* w, float* packed);

// Computes the pooled rows [begin, end) of the n * ph (image, pooled row) pairs, all channels, into dst (nChw16c
// [n, m, ph, pw]). Reads src (plain [n, c, h, w]), packed weights and bias [m]; uses scratch
// (conv_pool_scratch_floats(s) floats, no alignment needed). With `arg` (u8, laid out as dst), each pooled value's
// window position (i * pkw + j of its window's first maximum, NaN never taken: steps/pool_arg.h's convention, for
// keel.FusedConvMaxPool's gradient) goes there too. Thread-safe for disjoint ranges with their own scratch; AVX-512
// when the CPU has it (steps/silu.h's has_avx512f), else scalar code.
void conv_pool_rows(const ConvPoolShape& s, const float* src, const float* packed, const float* bias, float* dst,
                    int64_t begin, int64_t end, float* scratch, uint8_t* arg = nullptr);

// The whole of it over `team` OpenMP threads (contiguous ranges of pooled rows); scratch holds `team` times
// conv_pool_scratch_floats(s) floats (with a stride, floats from one thread's part to the next: team * stride).
void conv_pool_run(const ConvPoolShape& s, const float* src, const float* packed, const float* bias, float* dst,
                   float* scratch, int team, uint8_t* arg = nullptr, size_t stride = 0);

// Test hook: true makes conv_pool_rows take its scalar code (the path of CPUs without AVX-512) from now on;
// false (the default) restores the dispatch by CPU. Thread-safe; meant for tests, not for concurrent runs.
void conv_pool_force_scalar(bool on);

// The same by straightforward loops over unpacked weights [m][c][kh][kw] (the reference the step is tested
// against).
void conv_pool_reference(const ConvPoolShape& s, const float* src, const float* w, const float* bias, float* dst,
                         uint8_t* arg = nullptr);

}  // namespace keel::onednn
