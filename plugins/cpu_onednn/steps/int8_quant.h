// plugins/cpu_onednn/steps/int8_quant.h — (internal) the plugin's own f32 -> u8/s8 quantization for keel.QConv and
// keel.QGemm (kernels/int8.cc) whose X arrives in f32 (a QuantizeLinear fuse_qdq folded into its reader: MobileNetV2's
// expand convolutions after each residual Add, the first int8 layer after an fp32 prefix). oneDNN 2.6's quantizing
// reorder costs 5-7 us for a [1,64,14,14] tensor at 2 threads (mostly its fixed cost; 27 us with the transpose of a
// [1,24,56,56] plain tensor, as two reorders); these loops do the same arithmetic in one pass.
//
// y = saturate(round_half_even(x * inv_scale) + zero) into u8 or s8 (NaN -> zero: as oneDNN's reorder), the
// arithmetic of the oneDNN reorder they replace (x * (1 / x_scale); ops/reference's QuantizeLinear divides, so the
// last bit may round apart at a tie).
//
// AVX-512 (F, BW, VL, DQ) only: the callers check int8_own_kernels() first and keep oneDNN's reorders otherwise.
// Thread-safety: the functions are reentrant; `threads` is the OpenMP team to use (1: the calling thread only); below
// 2^20 elements they run on the calling thread alone (see kParallelMin in the .cc).
#pragma once

#include <cstdint>

namespace keel::onednn {

// Whether the plugin's own int8 loops run here: the CPU has AVX-512 F, BW, VL and DQ, and KEEL_ONEDNN_INT8_OWN is
// not "0" (read once).
bool int8_own_kernels();

struct QuantizeSpec {
  float inv_scale = 1;
  int32_t zero = 0;
  bool s8 = false;  // else u8
};

// n elements in the same layout.
void quantize_f32(const float* x, void* y, int64_t n, const QuantizeSpec& q, int threads);

// x: [N, C, S] (plain NCHW with S = H * W); y: [N, S, C] bytes (channels-last), any C (four channels are interleaved
// at a time; a 3-channel image is one partial group).
void quantize_f32_to_nhwc(const float* x, void* y, int64_t N, int64_t C, int64_t S, const QuantizeSpec& q, int threads);

// x: [N, ceil(C/16), S, 16] f32 (oneDNN's nChw16c, a partial last block padded); y: [N, S, C] bytes (channels-last),
// any C. A claimed chain's fp32 -> int8 boundary (chain/ops/int8.cc, Builder::qconv): the f32 convolutions' layout
// quantized straight into the int8 convolution's, in one pass.
void quantize_f32_blocked16_to_nhwc(const float* x, void* y, int64_t N, int64_t C, int64_t S, const QuantizeSpec& q,
                                    int threads);

// x: [N, ceil(C/16), S, 16] f32 (nChw16c, a partial last block padded); y: [N, S, C] f32 (channels-last), any C. A
// claimed chain's f32 residual Z from an fp32 convolution's layout into the one an int8 convolution adds it in, in
// place of oneDNN 2.6's reorder (MobileNetV2's [1,24,56,56]: 0.035 ms on one thread).
void blocked16_to_nhwc_f32(const float* x, float* y, int64_t N, int64_t C, int64_t S, int threads);

// The f32 output of an int8 convolution from the primitive's channels-last layout back to the graph's plain one:
// x: [N, S, C] f32; y: [N, C, S] f32 (any C and S), in 16x16 tiles transposed in registers. In place of oneDNN
// 2.6's reorder: MobileNetV2's last 1x1, [1,1280,7,7], 0.008 ms at 1 thread, 0.023-0.036 ms at 2 (half the values
// come from the other core's cache) against oneDNN's 0.038-0.040 ms.
void nhwc_to_nchw_f32(const float* x, float* y, int64_t N, int64_t C, int64_t S, int threads);

}  // namespace keel::onednn
