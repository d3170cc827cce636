// plugins/cpu_onednn/steps/wino4.h — (internal) a 3x3 stride-1 convolution as Winograd F(4x4, 3x3) (or, for few
// tiles, F(2x2, 3x3): Wino4Shape::f2) over nChw16c memory: the chains' own step.
//
// oneDNN 2.6 offers two fp32 Winograd kernels here: F(2x2,3x3) (16 products per 4 outputs) and F(4x4,3x3)
// (`jit_wino_4x3`, 36 per 16), but the latter writes its output past the cache with streaming stores, so the layer
// after it waits for memory and the chain gives it up where it would pay (docs/ONEDNN_PERFORMANCE.md, "(sqz2)").
// This step computes F(4,3) with ordinary stores: per block of tiles, the input transform B^T d B into a buffer
// [36 positions][tiles][channels] that stays in the core's L2, 36 matrix products per 32 output channels against
// the weights transformed once at plan time (G g G^T, [position][input channel][32 outputs]), and the output
// transform A^T m A with the bias, an optional residual sum and Relu, written into the destination as the next layer
// reads it. Where it pays and where it does not: chain/ops/conv.cc and docs/ONEDNN_PERFORMANCE.md, "(w4)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel::onednn {

// The geometry: source nChw16c [n, c, h, w], weights [m, c, 3, 3], destination nChw16c [n, m, h, w] (stride 1,
// padding 1 on every side, no dilation), c and m multiples of 16; bias [m], then (when `sum`) the value dst held
// before (a residual placed there), then Relu when `relu`.
//
// `streamed`: the weights are packed plain (9 floats per input / output channel pair instead of 36) and transformed
// at every run, a chunk of input channels at a time into a buffer that stays in L2, just before the products read
// them. For images of few tiles (ResNet's 14x14) whose transformed weights do not stay in cache between runs: reading
// 4x the plain weights from memory cost more than transforming them (docs/ONEDNN_PERFORMANCE.md, "(w4s)") until
// position_major (below) read them at the products' pace; the chain takes this only with its option
// wino_few_tiles off.
//
// `position_major`: the weights transformed at plan time, but the tiles taken as with streamed weights, all in one
// block where the transformed input fits, the products position by position over every tile of the block (each
// position's weights read once per block, the next position's prefetched into L2 a line every few k during them),
// instead of register tile by register tile over all 36 positions. For few tiles and transformed weights too large
// to stay in cache, which then come from memory once per run at the rate the products take them: ResNet's 14x14 3x3s
// (docs/ONEDNN_PERFORMANCE.md, "(w2)").
//
// `f2`: F(2x2, 3x3) instead, 16 products per 2x2 output tile (4 per output against F(4,3)'s 2.25): for images of
// fewer than 16 F(4,3) tiles (ResNet's 7x7: 4 of F(4,3), 16 of F(2,3)), whose F(4,3) weights would serve too few
// tiles for the bytes they take (4x the plain ones; F(2,3)'s 16/9).
struct Wino4Shape {
  int64_t n = 1, c = 16, m = 16, h = 0, w = 0;
  bool sum = false, relu = false, streamed = false, position_major = false, f2 = false;
  int64_t tile() const { return f2 ? 2 : 4; }  // output rows and columns per tile
  int64_t tiles_h() const { return (h + tile() - 1) / tile(); }
  int64_t tiles_w() const { return (w + tile() - 1) / tile(); }
  int64_t tiles() const { return n * tiles_h() * tiles_w(); }
};

// "" when the step computes this shape on this CPU (AVX-512), else what it does not take.
std::string wino4_check(const Wino4Shape& s);

// Transforms ONNX weights [m][c][3][3] (OIHW) into the step's layout: wino4_packed_floats(s) floats at `packed`
// (36 * c * m: 4x the weights, computed in double precision; f2: 16 * c * m; streamed: 9 * c * m, the taps regrouped,
// transformed in f32 at run time).
size_t wino4_packed_floats(const Wino4Shape& s);
void wino4_pack_weights(const Wino4Shape& s, const float* w, float* packed);

// Floats of scratch one thread of the team needs (wino4_run takes `team` times this).
size_t wino4_scratch_floats(const Wino4Shape& s);

// The whole convolution over `team` OpenMP threads (team <= 1: on the calling thread), each on its own contiguous
// range of tiles, or, where the transformed weights pass 1 MiB, of output channels. Reads src, packed weights and
// bias [m]; writes every element of dst (reading it first when s.sum). scratch: team * wino4_scratch_floats(s)
// floats, thread t using the t-th part; best memory that no value shares, so that each part was last written by its
// own thread (the chain passes the run's scratchpad region). stride: floats from one thread's part to the next (0:
// wino4_scratch_floats(s); see Exec::scratch_stride). Thread-safe for distinct scratch and dst.
void wino4_run(const Wino4Shape& s, const float* src, const float* packed, const float* bias, float* dst,
               float* scratch, int team, size_t stride = 0);

// The same by direct summation in double precision over ONNX weights [m][c][3][3] (the reference the step is tested
// against), into nChw16c dst (read first when s.sum).
void wino4_reference(const Wino4Shape& s, const float* src, const float* w, const float* bias, float* dst);

}  // namespace keel::onednn
