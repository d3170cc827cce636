// plugins/cuda/cuda_device_util.cuh — launch geometry and f32/f16/bf16 load/store helpers shared by the plugin's own
// kernels (cuda_kernels.cu) and the cuDNN/cuBLASLt epilogue kernels (cuda_dnn_kernels.cu). Device code only; every
// value is computed in float. Include inside namespace keel::cuda's anonymous namespace of a .cu file.
#pragma once

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough for a few waves of an H200's 132 SMs, at least one.
inline int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b > 132 * 32) b = 132 * 32;
  return static_cast<int>(b < 1 ? 1 : b);
}

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }
