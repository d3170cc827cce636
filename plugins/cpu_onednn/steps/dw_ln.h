// plugins/cpu_onednn/steps/dw_ln.h — (internal) a depthwise k x k convolution (stride 1, "same" padding) over
// channels-last memory with a LayerNormalization over the channels of each output pixel after it: ConvNeXt's
// block.0 (7x7 depthwise), block.1 (the permute to NHWC) and block.2 (LayerNorm) as one step of the chains' own.
//
// oneDNN ran them as two steps: its brdgmm depthwise kernel at about 46% of the FMA peak (ConvNeXt-Tiny's
// 96-channel 56x56 7x7: 0.30 ms at 1 thread) writing the block's 1.2 MB tensor, and simple_layer_normalization
// reading it back and writing the normalized copy (0.09 ms). Here each thread takes a range of output rows and keeps
// a ring of k source rows in its L1/L2 cache, each copied once between zero columns of padding and stored by
// 16-channel blocks (a block's pixels of one row contiguous: what one block's taps read is a few KiB, not every
// channel of the window); the taps are packed by block too. For each block in turn, strips of up to 16 output
// pixels (the row split into near-equal strips) keep their sums in registers over the k x k taps: per kernel row its
// k taps sit in registers and each of the P + k - 1 source vectors is loaded once and added into every output it
// reaches; then the row's pixels are normalized while it is still in cache. The tensor is written once, normalized. See
// docs/ONEDNN_PERFORMANCE.md, "(dwln)".
//
// Needs AVX-512 F (dw_ln_check says so). Thread-safety: stateless; concurrent calls with distinct dst and scratch
// are safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// Source and destination channels-last [n, h, w, c], c a multiple of 16; weights [c][1][k][k], k odd (3, 5 or 7),
// padding k / 2 on every side; LayerNormalization over c with scale and shift [c] and epsilon `eps`.
struct DwLnShape {
  int64_t n = 1, c = 16, h = 1, w = 1, k = 7;
  float eps = 1e-5f;
};

// "" when the step computes this shape on this CPU, else what it does not take.
std::string dw_ln_check(const DwLnShape& s);

// Floats of the packed constants: the taps [c/16][k*k][16], then the convolution's bias, the scale and the shift [c]
// each.
size_t dw_ln_packed_floats(const DwLnShape& s);
// Packs ONNX's depthwise weights [c][1][k][k], bias [c] (null: zeros), scale [c] and shift [c] (null: zeros).
void dw_ln_pack(const DwLnShape& s, const float* w, const float* bias, const float* scale, const float* shift,
                float* packed);

// Floats of scratch one thread needs (its ring of k padded source rows).
size_t dw_ln_scratch_floats(const DwLnShape& s);

// dst = LayerNorm(depthwise(src) + bias) over `team` OpenMP threads (team <= 1: the calling thread), each on its own
// range of output rows with its part of scratch (team * dw_ln_scratch_floats(s) floats; with a stride, floats from
// one thread's part to the next, team * stride: see Exec::scratch_stride).
void dw_ln_run(const DwLnShape& s, const float* src, const float* packed, float* dst, float* scratch, int team,
               size_t stride = 0);

// The same in double precision over ONNX's layouts (the reference the step is tested against): src and dst
// channels-last, w [c][1][k][k].
void dw_ln_reference(const DwLnShape& s, const float* src, const float* w, const float* bias, const float* scale,
                     const float* shift, float* dst);

}  // namespace keel::onednn
