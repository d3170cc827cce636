// plugins/cpu_onednn/steps/dwsilu.h — (internal) a depthwise convolution with SiLU after it (and optionally before
// it, on its source), plus the per-channel mean of its output: EfficientNet's MBConv middle as one step of the
// chains' own.
//
// In EfficientNet-B0 each block ran: 1x1 expansion, a SiLU pass over its output, oneDNN's jit depthwise
// convolution, a second SiLU pass (fused with squeeze-excite's GlobalAveragePool). The two passes read and wrote the
// two largest tensors of the block once more each (the 112-px expansion: 4.8 MB), and at 1 thread they took 0.75 of
// 5.7 ms (steps' fastest runs), the depthwise convolutions another 0.75 ms. Here each thread takes whole 16-channel
// blocks, applies the source's SiLU row by row into a ring of k rows in its L1/L2 cache (with the zero padding
// around them), convolves from the ring, and applies the output's SiLU and sums the channel means in registers
// before storing: the source is read once and the output written once. See docs/ONEDNN_PERFORMANCE.md, "(sq2)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// Depthwise convolution over nChw16c f32 memory: c channels (a multiple of 16), a square k x k kernel, stride s and
// zero padding p on every side. oh / ow follow from them.
struct DwSiluShape {
  int64_t n = 1, c = 0, h = 0, w = 0;
  int64_t k = 3, s = 1, p = 1;
  int64_t oh = 0, ow = 0;
  bool in_silu = false;  // SiLU applied to the source before the convolution (the producer's trailing SiLU)
};

// "" when the step computes this shape, else what it does not take (k 3 or 5, s 1 or 2, p < k, c % 16 == 0, oh and
// ow as the geometry gives them and at least 1).
std::string dw_silu_check(const DwSiluShape& s);

// Floats of scratch one thread needs (its ring of k padded source rows and one zero row).
size_t dw_silu_scratch_floats(const DwSiluShape& s);

// Packs weights [c][1][k][k] (ONNX's depthwise OIHW) into the step's layout, [c/16][k*k][16]: c*k*k floats.
void dw_silu_pack_weights(const DwSiluShape& s, const float* w, float* packed);

// dst = SiLU(conv(in_silu ? SiLU(src) : src) + bias) for the (image, 16-channel block) pairs [begin, end) of the
// n*c/16, src nChw16c [n,c,h,w], dst nChw16c [n,c,oh,ow], bias [c]; when mean is not null, mean[img*c + ch] = the
// mean of dst over the image's pixels (nChw16c [n,c,1,1]). Uses scratch (dw_silu_scratch_floats(s) floats, no
// alignment needed). Thread-safe for disjoint ranges with their own scratch; AVX-512 when the CPU has it
// (steps/silu.h's has_avx512f) and `vector` is true, else scalar code (vector = false: for tests).
void dw_silu_blocks(const DwSiluShape& s, const float* src, const float* packed, const float* bias, float* dst,
                    float* mean, int64_t begin, int64_t end, float* scratch, bool vector = true);

// The whole of it over `team` OpenMP threads (contiguous ranges of blocks); scratch holds `team` times
// dw_silu_scratch_floats(s) floats (with a stride, floats from one thread's part to the next: team * stride).
void dw_silu_run(const DwSiluShape& s, const float* src, const float* packed, const float* bias, float* dst,
                 float* mean, float* scratch, int team, bool vector = true, size_t stride = 0);

// The same by straightforward loops over unpacked weights [c][1][k][k] in double precision (the reference the step
// is tested against).
void dw_silu_reference(const DwSiluShape& s, const float* src, const float* w, const float* bias, float* dst,
                       float* mean);

}  // namespace keel::onednn
