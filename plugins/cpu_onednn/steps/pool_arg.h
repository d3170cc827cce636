// plugins/cpu_onednn/steps/pool_arg.h — (internal) max pooling that records where each window's maximum is, and the
// gradient's scatter by those positions: keel.FusedConvMaxPool's pooling of the convolution output it just made
// (kernels/conv.cc) and keel.FusedConvMaxPoolGrad's making of the convolution's output gradient (kernels/train.cc),
// both in the layout the convolution primitives use, so that neither goes through the plain layout.
//
// Layouts by channel block b: b = 1 is plain NCHW; b = 8 / 16 are oneDNN's nChw8c / nChw16c ([n][ceil(c / b)][h][w][b],
// the channels past c padding). Windows: kh x kw at strides sh x sw, no padding, the oh x ow that fit.
#pragma once

#include <cstdint>
#include <vector>

namespace keel::onednn {

struct PoolArgShape {
  int64_t n = 1, c = 1, h = 1, w = 1;      // the pooled tensor (the convolution output)
  int64_t kh = 1, kw = 1, sh = 1, sw = 1;  // window and strides; kh * kw <= 256
  int64_t oh = 1, ow = 1;                  // pooled size
  int64_t block = 1;                       // 1, 8 or 16
  int64_t blocks() const { return (c + block - 1) / block; }
};

// The window and strides of keel.FusedConvMaxPool's attributes pool_kernel_shape and pool_strides (default: the
// window) into s.kh, s.kw, s.sh, s.sw; false where they are not two positive entries each or the window has more than
// 256 positions (a uint8 window position).
bool read_pool_window(const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides, PoolArgShape* s);

// dst = max over each window of src, arg = the window position (i * kw + j) of its first maximum; src, dst and arg in
// s.block's layout (padding channels pooled like the others). `arg` may be null. Runs on the calling OpenMP team.
void pool_arg_forward(const PoolArgShape& s, const float* src, float* dst, uint8_t* arg);
// The same on the calling thread alone (a caller that is one task of its own parallel loop).
void pool_arg_forward_here(const PoolArgShape& s, const float* src, float* dst, uint8_t* arg);

// dst = max over each window of src, nChw16c (s.block 16; AVX-512 F: the caller checks steps/silu.h's has_avx512f),
// no positions, over `team` OpenMP threads split by output rows (each thread every channel block of its rows), where
// pool_arg_forward splits by channel blocks: a chain's pooling after convolutions that split their work by rows
// reads, on each core, mostly what that core wrote (SqueezeNet's 55x55 pooling at 2 threads:
// docs/ONEDNN_PERFORMANCE.md,
// "(mpr)"). NaN as oneDNN's max pooling (vmaxps: a NaN in the window may or may not win). Thread-safe for distinct dst.
void pool_max16_rows(const PoolArgShape& s, const float* src, float* dst, int team);

// dx = the gradient of that pooling: each window's g (times p > 0 when relu; p is the pooled output) added at arg's
// position, zeros elsewhere; g, p and arg in the pooled layout, dx in the source's (both by s.block). p is read only
// when relu. Runs on the calling OpenMP team.
void pool_arg_backward(const PoolArgShape& s, const float* g, const float* p, const uint8_t* arg, bool relu, float* dx);

}  // namespace keel::onednn
