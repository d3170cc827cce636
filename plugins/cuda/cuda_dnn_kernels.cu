// plugins/cuda/cuda_dnn_kernels.cu — the small kernels around cuDNN / cuBLASLt (cuda_dnn_kernels.h): fused-op
// epilogue, BatchNormalization inference, explicit padding.
//
// Arithmetic in float for F32, F16 and BF16 (loads widen, stores round to nearest even); grid-stride loops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda_dnn_kernels.h"

namespace keel::cuda {
namespace {

// keel_dtype_t values (keel/plugin.h), repeated so this file needs only the CUDA headers.
enum : int32_t { F32 = 1, F16 = 10, BF16 = 16 };

#include "cuda_device_util.cuh"  // kThreads, blocks_for, ld/st

__device__ __forceinline__ float activate(FusedAct act, float x, float a, float b) {
  switch (act) {
    case FusedAct::kNone: return x;
    case FusedAct::kRelu: return x > 0.f ? x : 0.f;
    case FusedAct::kSigmoid: return 1.f / (1.f + expf(-x));
    case FusedAct::kTanh: return tanhf(x);
    case FusedAct::kHardSwish: return x * fmaxf(0.f, fminf(1.f, x / 6.f + 0.5f));
    case FusedAct::kLeakyRelu: return x >= 0.f ? x : a * x;
    case FusedAct::kClip: return fminf(fmaxf(x, a), b);
    case FusedAct::kGelu: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  }
  return x;
}

template <class T>
__global__ void bias_act_kernel(T* y, const T* bias, const T* z, int64_t n, int64_t inner, int64_t channels,
                                FusedAct act, float a, float b) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v = ld(y, i);
    if (bias) v += ld(bias, (i / inner) % channels);
    if (z) v += ld(z, i);
    st(y, i, activate(act, v, a, b));
  }
}

template <class T, class P>
__global__ void batch_norm_kernel(const T* x, const P* scale, const P* bias, const P* mean, const P* var, float eps,
                                  T* y, int64_t n, int64_t inner, int64_t channels) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = (i / inner) % channels;
    const float inv = rsqrtf(ld(var, c) + eps);
    st(y, i, (ld(x, i) - ld(mean, c)) * inv * ld(scale, c) + ld(bias, c));
  }
}

struct PadGeom {
  int32_t rank;
  int64_t in[kPadMaxRank], out[kPadMaxRank], before[kPadMaxRank];
};

template <class T>
__global__ void pad_kernel(const T* x, T* y, int64_t n, PadGeom g, float fill) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i, src = 0, scale = 1;
    bool inside = true;
    for (int d = g.rank - 1; d >= 0; --d) {
      const int64_t o = rem % g.out[d];
      rem /= g.out[d];
      const int64_t id = o - g.before[d];
      if (id < 0 || id >= g.in[d]) inside = false;
      src += id * scale;
      scale *= g.in[d];
    }
    st(y, i, inside ? ld(x, src) : fill);
  }
}

template <class F>
cudaError_t by_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case F32: return f(static_cast<float*>(nullptr));
    case F16: return f(static_cast<__half*>(nullptr));
    case BF16: return f(static_cast<__nv_bfloat16*>(nullptr));
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_bias_act(int32_t dtype, void* y, const void* bias, const void* z, int64_t n, int64_t inner,
                            int64_t channels, FusedAct act, float act_a, float act_b, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (inner <= 0 || channels <= 0) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bias_act_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<T*>(y), static_cast<const T*>(bias),
                                                          static_cast<const T*>(z), n, inner, channels, act, act_a,
                                                          act_b);
    return cudaGetLastError();
  });
}

cudaError_t launch_batch_norm(int32_t dtype, int32_t param_dtype, const void* x, const void* scale, const void* bias,
                              const void* mean, const void* var, float eps, void* y, int64_t n, int64_t inner,
                              int64_t channels, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (inner <= 0 || channels <= 0) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* xtag) {
    using T = std::remove_pointer_t<decltype(xtag)>;
    return by_dtype(param_dtype, [&](auto* ptag) {
      using P = std::remove_pointer_t<decltype(ptag)>;
      batch_norm_kernel<T, P><<<blocks_for(n), kThreads, 0, s>>>(
          static_cast<const T*>(x), static_cast<const P*>(scale), static_cast<const P*>(bias),
          static_cast<const P*>(mean), static_cast<const P*>(var), eps, static_cast<T*>(y), n, inner, channels);
      return cudaGetLastError();
    });
  });
}

cudaError_t launch_pad(int32_t dtype, const void* x, const int64_t* in_dims, void* y, const int64_t* out_dims,
                       const int64_t* before, int rank, float fill, cudaStream_t s) {
  if (rank < 1 || rank > kPadMaxRank) return cudaErrorInvalidValue;
  PadGeom g;
  g.rank = rank;
  int64_t n = 1;
  for (int d = 0; d < rank; ++d) {
    g.in[d] = in_dims[d];
    g.out[d] = out_dims[d];
    g.before[d] = before[d];
    n *= out_dims[d];
  }
  if (n <= 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    pad_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, g, fill);
    return cudaGetLastError();
  });
}

}  // namespace keel::cuda
