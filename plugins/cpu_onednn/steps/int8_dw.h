// plugins/cpu_onednn/steps/int8_dw.h — (internal) the plugin's own int8 depthwise 3x3 convolution over
// channels-last bytes, for keel.QConv (kernels/int8.cc) where oneDNN 2.6's int8 depthwise kernels (jit_uni_x8s8s32x_dw,
// brdgmm_dw) are no faster than its f32 one and hardly use a second thread at 14x14 / 7x7.
//
// Y[n, oh, ow, c] = epilogue(sum over kh, kw < 3 of (X[n, oh*sh - pt + kh, ow*sw - pl + kw, c] - x_zero) * W[c, kh,
// kw]) with padding contributing nothing (as x_zero), and epilogue(acc) = clamp(acc * scale[c] + bias[c], lo, hi), then
// either stored as f32 or quantized: saturate(round_half_even(v / y_scale) + y_zero) into u8/s8 — the arithmetic of
// ops/reference/fused.cc's QConv (v * (1 / y_scale) instead of the division: the last bit of v may differ).
//
// How: per work item (an image, a band of output rows, 16 channels) the input rows the band reads are copied into a
// per-thread buffer, 16 bytes per column, padding as the zero point (s8 X offset to u8 by 128, its zero point with
// it). Per output pixel and kernel row, the 64 bytes of its 4 columns are permuted into [x0, x1, x2, x3] per channel
// (vpermb) and one vpdpbusd adds x0 w0 + x1 w1 + x2 w2 (+ x3 * 0) into the s32 accumulator: 3 instructions per 16
// outputs for the 9 taps. The zero point leaves as x_zero * sum(w) per channel; the epilogue runs in f32 with 1 /
// y_scale folded into the channel's scale, bias and activation bounds. Items are split evenly over the OpenMP team
// (omp_get_max_threads at run), so both threads get work even at 7x7. Needs AVX-512 F, BW, VL, DQ, VNNI and VBMI:
// `available()` checks the CPU; without them QConv keeps oneDNN's kernel.
//
// Thread-safety: an object is immutable after construction; run() may be called from several threads at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace keel::onednn {

struct DwShape {
  int64_t N = 1, C = 0, H = 0, W = 0;                        // input, channels-last bytes
  int64_t OH = 0, OW = 0;                                    // output (same channels)
  int64_t stride_h = 1, stride_w = 1, pad_t = 0, pad_l = 0;  // the bottom / right padding follows from OH / OW
};

struct DwQuant {
  bool x_signed = false;  // X s8 (else u8)
  int32_t x_zero = 0;
  enum class Out { kU8, kS8, kF32 } out = Out::kU8;
  float y_inv_scale = 1;  // 1 / y_scale (quantized outputs)
  int32_t y_zero = 0;
  float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();  // activation
};

// One output channel's epilogue constants, as the own int8 steps (this one, steps/int8_stem.h) apply them:
// clamp(acc * scale + bias, lo, hi), with 1 / y_scale folded into all four for a quantized output and both bounds
// kept inside the representable range (also for an activation range outside it). `scale` = x_scale * w_scale[c].
struct ChannelEpilogue {
  float scale, bias, lo, hi;
};
inline ChannelEpilogue channel_epilogue(const DwQuant& q, float scale, float bias) {
  const bool f32 = q.out == DwQuant::Out::kF32;
  const float inv = f32 ? 1.f : q.y_inv_scale;
  ChannelEpilogue e{scale * inv, bias * inv, q.lo * inv, q.hi * inv};
  if (!f32) {
    const float qmin = q.out == DwQuant::Out::kS8 ? -128.f : 0.f, qmax = q.out == DwQuant::Out::kS8 ? 127.f : 255.f;
    const float rlo = qmin - static_cast<float>(q.y_zero), rhi = qmax - static_cast<float>(q.y_zero);
    e.lo = std::clamp(e.lo, rlo, rhi);
    e.hi = std::clamp(e.hi, rlo, rhi);
  }
  return e;
}
// X's zero point in the u8 domain the steps multiply in (s8 values are offset by 128).
inline int32_t x_zero_as_u8(const DwQuant& q) { return q.x_zero + (q.x_signed ? 128 : 0); }

class Int8Depthwise3x3 {
 public:
  // Whether this CPU runs the kernel (AVX-512 F, BW, VL, DQ, VNNI, VBMI; KEEL_ONEDNN_INT8_OWN=0 turns it off).
  static bool available();

  // w: [C, 1, 3, 3] s8 (copied); scale[c] = x_scale * w_scale[c]; bias: [C] f32 or null (copied).
  Int8Depthwise3x3(const DwShape& s, const DwQuant& q, const int8_t* w, const float* scale, const float* bias);

  // x: the input bytes [N, H, W, C]; y: [N, OH, OW, C] (u8/s8/f32 as q.out). `threads`: the OpenMP team size.
  void run(const void* x, void* y, int threads) const;

  // The work of items [begin, end) (an item: one image, band of rows, 16 channels); run() splits them.
  void work(const void* x, void* y, int64_t begin, int64_t end) const;

 private:
  DwShape s_;
  DwQuant q_;
  int64_t cb_ = 0;                             // 16-channel blocks
  int64_t band_ = 1;                           // output rows per item
  int64_t bands_ = 1;                          // per image
  int64_t cols_ = 0;                           // input columns a row of outputs reads, padding included
  std::vector<int8_t> w_;                      // [cb][3][64]: per kernel row, [w0, w1, w2, 0] per channel
  std::vector<int32_t> comp_;                  // [cb * 16]: (x_zero, as u8) * sum of the channel's weights
  std::vector<float> scale_, bias_, lo_, hi_;  // [cb * 16]: epilogue, divided by y_scale for quantized outputs
};

}  // namespace keel::onednn
