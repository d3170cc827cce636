// plugins/cpu_onednn/steps/int8_pool.h — (internal) the plugin's own max pooling of u8 / s8 bytes, for a claimed
// chain's pooling between int8 steps (chain/ops/pool.cc, channels-last; fuse_qdq moves a QuantizeLinear over a MaxPool
// so that the convolution before it writes bytes) and for the u8/s8 MaxPool node kernel (kernels/int8.cc, plain).
// oneDNN 2.6's int8 pooling (jit_int) took 0.006 ms for SimpleCNN's [1, 32, 26, 26] 2x2 pooling at 1 thread, three
// times its f32 pooling of the same shape, and 5.7-5.9 ms at batch 1000 (21.6 MB read); these loops take every window's
// C bytes as whole vectors: 0.001 ms and 3.9-4.3 ms in the model (2.3-2.5 ms on a warm input alone: the rest is memory;
// the f32 pooling of that model takes 6.4-8.8 ms).
//
// Semantics: ONNX MaxPool over [N, H, W, C] bytes (2-D, any window, stride, dilation and padding; padding is not a
// value: a window's maximum is over its pixels inside the image; a window with none gives the type's lowest value).
//
// AVX-512 (F, BW, VL, DQ) only: callers check int8_own_kernels() first (steps/int8_quant.h).
// Thread-safety: reentrant; `threads` is the OpenMP team to use (1: the calling thread only).
#pragma once

#include <cstdint>

namespace keel::onednn {

struct BytePoolShape {
  int64_t n = 1, h = 1, w = 1, c = 1;  // input [n, h, w, c]
  int64_t oh = 1, ow = 1;              // output [n, oh, ow, c]
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pt = 0, pl = 0;  // padding before the first row / column
  bool s8 = false;         // else u8
};

void max_pool_nhwc_bytes(const BytePoolShape& s, const void* x, void* y, int threads);

// 2x2 windows, stride 2, no padding or dilation, over planes [planes, H, W] of bytes in the plain layout (the node
// kernel's case: kernels/int8.cc): y [planes, H / 2, W / 2]. 64 input columns of two rows at a time: the rows' maximum,
// then each column pair's as 16-bit lanes narrowed back to bytes.
void max_pool2x2_plain_bytes(const void* x, void* y, int64_t planes, int64_t H, int64_t W, bool s8, int threads);

}  // namespace keel::onednn
