// plugins/cuda/cuda_dnn_kernels.h — (internal) the small CUDA kernels around the cuDNN and cuBLASLt calls
// (cuda_dnn_kernels.cu): the epilogue of the fused ops (per-channel bias + residual + activation) where the library
// cannot fuse it, BatchNormalization inference, and the explicit zero / -inf padding of asymmetric pads.
//
// Plain C++ with no Keel type in it: dtypes are keel_dtype_t values (F32, F16 or BF16, anything else returns
// cudaErrorInvalidValue). Each launches on the given stream of the current device and returns the launch's error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace keel::cuda {

// The activation of the keel-domain fused ops (attribute `activation`, ops/reference/fused.cc).
enum class FusedAct : int32_t { kNone, kRelu, kSigmoid, kTanh, kHardSwish, kLeakyRelu, kClip, kGelu };

// In place over n elements of y: y[i] = act(y[i] + bias[(i / inner) % channels] + z[i]), computed in f32. bias
// (same dtype as y, `channels` entries) and z (y's shape) may be null. act_a / act_b: LeakyRelu's alpha, Clip's
// min / max. NCHW conv outputs: inner = spatial size, channels = C; a matmul's last axis: inner = 1, channels = N.
cudaError_t launch_bias_act(int32_t dtype, void* y, const void* bias, const void* z, int64_t n, int64_t inner,
                            int64_t channels, FusedAct act, float act_a, float act_b, cudaStream_t s);

// BatchNormalization inference over x[N, C, inner...] (n elements): y = (x - mean[c]) * scale[c] /
// sqrt(var[c] + eps) + bias[c], computed in f32. x / y have `dtype`, the four parameter vectors `param_dtype`.
cudaError_t launch_batch_norm(int32_t dtype, int32_t param_dtype, const void* x, const void* scale, const void* bias,
                              const void* mean, const void* var, float eps, void* y, int64_t n, int64_t inner,
                              int64_t channels, cudaStream_t s);

// y[out_dims] = x[in_dims] placed at offset `before` (per dim), `fill` elsewhere (0, or -inf for max pooling).
// rank <= 8; row-major contiguous tensors.
constexpr int kPadMaxRank = 8;
cudaError_t launch_pad(int32_t dtype, const void* x, const int64_t* in_dims, void* y, const int64_t* out_dims,
                       const int64_t* before, int rank, float fill, cudaStream_t s);

}  // namespace keel::cuda
