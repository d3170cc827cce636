// plugins/cpu_onednn/steps/int8_stem.h — (internal) the plugin's own int8 convolution over few input channels (a
// network's first layer, on the image), with the max pooling after it fused, for keel.QConv in a claimed chain
// (chain/ops/int8.cc, Builder::qconv_stem).
//
// Why: oneDNN 2.6's int8 convolutions multiply groups of 4 input channels (vpdpbusd), so a 1-channel image wastes 3/4
// of every product: SimpleCNN's 3x3, 1 -> 32 channels, took 8.2-9.4 ms at batch 1000 on one thread (0.43 GMAC, 23%
// of the host's int8 peak) and then wrote 21.6 MB of bytes for the pooling to read. Here the 4 bytes of one vpdpbusd
// are 4 neighbouring columns of one kernel row of one channel (a 3x3 kernel: 3 products per 16 output channels and
// pixel), and the pooling happens on the s32 sums before the output is written: 4.7 ms for those 1000 images
// pooled 2x2 (the model 5.4 ms against 15.5-17.5 in fp32), ResNet-18's RGB 7x7 / 2 stem with its 3x3 / 2 pooling
// 0.81-0.85 ms against 1.13-1.17 for oneDNN's convolution, reorder and pooling (1 thread). A 2x2 stride-2 pooling
// without padding (SimpleCNN's) takes each window's maximum in registers, the two conv rows' input rows copied once:
// those 1000 images 3.7 -> 2.1 ms (the f32 model's in-register step, steps/convpool.h, 2.7 ms).
//
// Semantics: keel.QConv (ops/reference/fused.cc) then MaxPool:
//   acc[m] = sum over c, ky, kx of (X[n, c, oy*SH - PT + ky, ox*SW - PL + kx] - x_zero) * W[m, c, ky, kx] (padding as
//   x_zero: nothing), v = clamp(acc * scale[m] + bias[m], lo, hi), stored as f32 or saturate(round_half_even(v /
//   y_scale) + y_zero) (the epilogue of steps/int8_dw.h: 1 / y_scale folded into scale, bias and bounds), then, with
//   pooling, the maximum over each pooling window's conv pixels inside the conv output. Every scale[m] must be
//   positive: then the epilogue is monotone and the pooling takes the maximum of the s32 sums (one epilogue per
//   pooled pixel), which equals the maximum of the epilogue's values.
// Layouts: X plain [N, C, H, W] bytes (u8 or s8); Y channels-last [N, OH', OW', M] (OH', OW': the pooled size with
// pooling, else the conv's), u8 / s8 / f32.
// Limits (check() says which fails): C <= 4, KW <= 8, M <= 64 (any count: the last 16 lanes masked), no dilation or
// groups; pooling 2-D max without dilation, every window holding at least one conv pixel.
//
// Needs AVX-512 F, BW, VL, DQ and VNNI (available()). Thread-safety: immutable after construction; run() may be
// called from several threads at once (per-thread buffers are thread_local).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "steps/int8_dw.h"

namespace keel::onednn {

struct StemShape {
  int64_t N = 1, C = 1, H = 1, W = 1, M = 16;  // input [N, C, H, W], M output channels
  int64_t KH = 1, KW = 1, SH = 1, SW = 1, PT = 0, PL = 0;
  int64_t OH = 1, OW = 1;  // the convolution's output
  bool pool = false;       // a max pooling after it
  int64_t PKH = 1, PKW = 1, PSH = 1, PSW = 1, PPT = 0, PPL = 0;
  int64_t PH = 1, PW = 1;  // the pooled output
};

class Int8StemConv {
 public:
  // Whether this CPU runs the kernel (AVX-512 F, BW, VL, DQ, VNNI; KEEL_ONEDNN_INT8_OWN=0 turns it off).
  static bool available();
  // "" when the shape is within the limits above, else what is not.
  static std::string check(const StemShape& s);

  // w: [M, C, KH, KW] s8 (copied); scale[m] = x_scale * w_scale[m] > 0; bias: [M] f32 or null (copied). `q` as the
  // depthwise kernel's (x signedness and zero point, output type, y scale and zero point, activation bounds).
  Int8StemConv(const StemShape& s, const DwQuant& q, const int8_t* w, const float* scale, const float* bias);

  // x: [N, C, H, W] bytes; y: [N, OH', OW', M]. `threads`: the OpenMP team size.
  void run(const void* x, void* y, int threads) const;

 private:
  StemShape s_;
  DwQuant q_;
  int64_t groups_ = 0;         // C * KH * ceil(KW / 4): vpdpbusd operands per pixel and 16 channels
  int64_t row_len_ = 0;        // bytes of one padded input row in the per-thread buffer
  bool pool2_ = false;         // a 2x2 stride-2 pooling without padding: pooled in registers (work_pool2)
  std::vector<int64_t> off_;   // [groups]: the operand's place in the copied rows: (c * KH + ky) * row_len + 4 q, with
                               // pool2_ (c * (KH + SH) + ky) * row_len + 4 q (a pooled row's two conv rows' input)
  std::vector<int8_t> w_;      // [groups][M / 16][64]: per group, 4 weights (columns 4q..4q+3, 0 past KW) per channel
  std::vector<int32_t> comp_;  // [M]: (x_zero, as u8) * sum of the channel's weights
  std::vector<float> scale_, bias_, lo_, hi_;  // [M]: the epilogue, divided by y_scale for quantized outputs
};

}  // namespace keel::onednn
