// plugins/cpu_onednn/steps/int8_expand_dw.h — (internal) the int8 inverted-residual block as one step of the chains'
// own: a 1x1 keel.QConv (the expansion), the 3x3 depthwise keel.QConv that alone reads it and optionally the 1x1
// projection that alone reads that (with its residual Z), over channels-last bytes, the expanded tensor never leaving
// the core's cache. The int8 counterpart of steps/expand_dw.h (which explains why: a tensor written by one step and
// read by the next goes to L3 and, at 2 threads, half of it to the other core, about 3x dearer to read here).
//
// Each stage is a QConv's arithmetic (ops/reference/fused.cc): acc = sum of (x - x_zero) * w in s32; v = acc * scale[o]
// + bias[o] (+ Z), clamped to the activation's range, then either f32 or saturate(round_half_even(v / y_scale) +
// y_zero) as u8/s8 — with 1 / y_scale folded into scale, bias and the bounds (channel_epilogue, steps/int8_dw.h), as
// the own int8 depthwise kernel does, so its bytes are that kernel's. The 1x1 stages multiply 4 input channels per
// vpdpbusd (a register tile of up to 14 pixels x 32 channels, x's 4 bytes broadcast), the depthwise stage 3 columns
// per vpdpbusd (the 4 columns' 64 bytes permuted per channel by vpermb: steps/int8_dw.h's scheme).
//
// Per thread (the team splits output rows, image-major): for each output row, the expanded rows it reads are computed
// into a ring of 3 slots ([m/16][w+3][16] bytes, the zero point in the padding columns) unless already there, then
// the depthwise row (into dst, or into a row buffer [ow][m16] that the projection reads at once; under 14 pixels a
// row, the projection takes as many consecutive rows as fill a 14-pixel tile).
//
// Needs AVX-512 F, BW, VL, DQ, VNNI and VBMI (Int8Depthwise3x3::available()); check() says what else it declines.
// Thread-safety: an object is immutable after construction; run() may be called from several threads at once with
// distinct scratch and dst.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "steps/int8_dw.h"
#include "steps/int8_quant.h"

namespace keel::onednn {

struct Int8ExpandDwShape {
  int64_t n = 1, c = 0, m = 0, h = 0, w = 0;  // X: u8 channels-last [n, h, w, c]; the expansion: c -> m channels
  int64_t stride = 1;                         // the depthwise 3x3's (padding 1 on every side)
  int64_t proj = 0;       // the projection's output channels; 0: none, dst is the depthwise output [n, oh, ow, m]
  bool residual = false;  // the projection adds Z: f32 channels-last [n, oh, ow, proj] (stride 1, proj == c)
  int64_t oh() const { return (h - 1) / stride + 1; }
  int64_t ow() const { return (w - 1) / stride + 1; }
};

// One stage's constants, ONNX's layouts (copied by the constructor): w s8 [outs][ins] (the depthwise [m][3][3]);
// scale[o] = x_scale * w_scale[o]; bias [outs] f32 or null; q: its X's zero point and its output (DwQuant).
struct Int8Stage {
  const int8_t* w = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;
  DwQuant q;
};

class Int8ExpandDw {
 public:
  // "" when the step computes this: the CPU has the ISA, c a multiple of 4, X u8, the expansion's and (with a
  // projection) the depthwise's outputs u8, each stage's X zero point the previous stage's output zero point;
  // else what it declines.
  static std::string check(const Int8ExpandDwShape& s, const DwQuant& expand, const DwQuant& dw,
                           const DwQuant* project);

  // project: null without a projection (s.proj == 0). x_f32: X arrives as f32 channels-last and each row is quantized
  // so (quantize_f32's arithmetic, into u8) just before its expansion: MobileNetV2's residual stream, which otherwise
  // takes a step of its own (null: X is u8).
  Int8ExpandDw(const Int8ExpandDwShape& s, const Int8Stage& expand, const Int8Stage& dw, const Int8Stage* project,
               const QuantizeSpec* x_f32 = nullptr);

  const Int8ExpandDwShape& shape() const { return s_; }
  // Bytes of scratch one thread of the team needs (run() aligns each thread's part to 64 bytes itself).
  size_t scratch_bytes() const;

  // x: [n, h, w, c] u8 (f32 with x_f32); z: Z (s.residual) or null; dst: [n, oh, ow, proj or m] of the last stage's
  // output type. scratch: team * scratch_bytes() (with a stride: bytes from one thread's part to the next, team *
  // stride; Exec::scratch_stride). team <= 1: on the calling thread, else an OpenMP team of `team`.
  void run(const void* x, const float* z, void* dst, uint8_t* scratch, int team, size_t stride = 0) const;

 private:
  struct Epi {                  // a stage's per-channel epilogue, lanes rounded up to 16 (zeros past the real channels)
    std::vector<int32_t> comp;  // x_zero * sum of the channel's weights
    std::vector<float> scale, bias, lo, hi;
    float z_mul = 1;  // Z's factor (1 / y_scale for a quantized output)
    int32_t zero = 0;
    DwQuant::Out out = DwQuant::Out::kU8;
  };
  void rows(const void* x, const float* z, uint8_t* dst, uint8_t* scratch, int64_t r0, int64_t r1) const;
  void expand_row(const void* x, int64_t img, int64_t iy, uint8_t* slot, uint8_t* xrow) const;

  Int8ExpandDwShape s_;
  int64_t mp_ = 0, pp_ = 0, cols_ = 0;  // m and proj rounded up to 16; ring columns (w + 3)
  uint8_t x2_zero_ = 0;                 // the expansion's output zero point (the ring's padding)
  bool x_f32_ = false;
  QuantizeSpec xq_;                   // X's quantization (x_f32_)
  std::vector<int8_t> w1_, w2_, w3_;  // packed: 1x1s [group][ins/4][group width][4], depthwise [m16/16][3][64]
  Epi e1_, e2_, e3_;
};

}  // namespace keel::onednn
