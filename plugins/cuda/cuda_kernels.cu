// plugins/cuda/cuda_kernels.cu — the CUDA plugin's own kernels (element-wise, broadcast, Where, Softmax, strided
// copy, Cast, reductions, ArgMax/ArgMin, LayerNormalization, Gather, Pad, Resize). One translation unit on purpose:
// nvcc is the slow part of the build, and sm_90 only.
//
// Arithmetic is in float for F32, F16 and BF16 (loads widen, stores round to nearest even). Grid-stride loops;
// the op switch is uniform across the grid, so it costs a branch, not divergence.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "cuda_kernels.h"

namespace keel::cuda {
namespace {

// keel_dtype_t values (keel/plugin.h), repeated so this file needs only the CUDA headers.
enum : int32_t { F32 = 1, U8 = 2, I8 = 3, I16 = 5, I32 = 6, I64 = 7, BOOL = 9, F16 = 10, F64 = 11, BF16 = 16 };

#include "cuda_device_util.cuh"  // kThreads, blocks_for, ld/st

__device__ __forceinline__ float unary_op(Unary op, float x, float a, float b, float g) {
  switch (op) {
    case Unary::kRelu: return x > 0.f ? x : 0.f;
    case Unary::kSigmoid: return 1.f / (1.f + expf(-x));
    case Unary::kTanh: return tanhf(x);
    case Unary::kExp: return expf(x);
    case Unary::kLog: return logf(x);
    case Unary::kNeg: return -x;
    case Unary::kAbs: return fabsf(x);
    case Unary::kSqrt: return sqrtf(x);
    case Unary::kReciprocal: return 1.f / x;
    case Unary::kErf: return erff(x);
    case Unary::kLeakyRelu: return x >= 0.f ? x : a * x;
    case Unary::kElu: return x >= 0.f ? x : a * (expf(x) - 1.f);
    case Unary::kHardSigmoid: return fmaxf(0.f, fminf(1.f, a * x + b));
    case Unary::kSoftplus: return x > 20.f ? x : log1pf(expf(x));
    case Unary::kSoftsign: return x / (1.f + fabsf(x));
    case Unary::kSin: return sinf(x);
    case Unary::kCos: return cosf(x);
    case Unary::kFloor: return floorf(x);
    case Unary::kCeil: return ceilf(x);
    case Unary::kHardSwish: return x * fmaxf(0.f, fminf(1.f, x / 6.f + 0.5f));
    case Unary::kSelu: return x > 0.f ? g * x : g * (a * expf(x) - a);
    case Unary::kGeluErf: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case Unary::kGeluTanh: return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case Unary::kClip: return x < a ? a : (x > b ? b : x);  // NaN stays NaN
  }
  return x;
}

__device__ __forceinline__ float binary_op(Binary op, float x, float y) {
  switch (op) {
    case Binary::kAdd: return x + y;
    case Binary::kSub: return x - y;
    case Binary::kMul: return x * y;
    case Binary::kDiv: return x / y;
    case Binary::kPow: return powf(x, y);
    case Binary::kMax: return fmaxf(x, y);
    case Binary::kMin: return fminf(x, y);
  }
  return x;
}

// Offset of output element i into operand k of a Strided view.
__device__ __forceinline__ int64_t offset_of(const Strided& s, int64_t i, int k) {
  int64_t off = 0;
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t dim = s.dims[d];
    const int64_t q = i / dim;
    off += (i - q * dim) * s.strides[d][k];
    i = q;
  }
  return off;
}

template <class T>
__global__ void unary_kernel(Unary op, const T* x, T* y, int64_t n, float a, float b, float g) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st(y, i, unary_op(op, ld(x, i), a, b, g));
}

template <class T>
__global__ void binary_same_kernel(Binary op, const T* a, const T* b, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st(y, i, binary_op(op, ld(a, i), ld(b, i)));
}

template <class T>
__global__ void binary_bcast_kernel(Binary op, const T* a, const T* b, T* y, int64_t n, Strided s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    st(y, i, binary_op(op, ld(a, offset_of(s, i, 0)), ld(b, offset_of(s, i, 1))));
}

template <class E>
__global__ void where_kernel(const uint8_t* c, const E* x, const E* yv, E* out, int64_t n, Strided s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = c[offset_of(s, i, 0)] ? x[offset_of(s, i, 1)] : yv[offset_of(s, i, 2)];
}

template <class E>
__global__ void strided_copy_kernel(const E* in, E* out, int64_t n, Strided s) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = in[offset_of(s, i, 0)];
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Block-wide reduction (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* smem) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : (kMax ? -INFINITY : 0.f);
  v = kMax ? warp_max(v) : warp_sum(v);
  return v;
}

// One block per row.
template <class T>
__global__ void softmax_kernel(const T* x, T* y, int64_t cols, bool log_out) {
  __shared__ float smem[32];
  const T* xr = x + blockIdx.x * cols;
  T* yr = y + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, ld(xr, j));
  m = block_reduce<true>(m, smem);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += expf(ld(xr, j) - m);
  sum = block_reduce<false>(sum, smem);
  if (log_out) {
    const float ls = logf(sum);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) st(yr, j, ld(xr, j) - m - ls);
  } else {
    const float inv = 1.f / sum;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) st(yr, j, expf(ld(xr, j) - m) * inv);
  }
}

// Cast: widen to double or int64, then narrow. Integer<->integer goes through int64 (exact); the rest via double.
__device__ __forceinline__ bool is_int(int32_t t) {
  return t == U8 || t == I8 || t == I16 || t == I32 || t == I64 || t == BOOL;
}
__device__ __forceinline__ double load_d(const void* p, int32_t t, int64_t i) {
  switch (t) {
    case F32: return static_cast<const float*>(p)[i];
    case F16: return __half2float(static_cast<const __half*>(p)[i]);
    case BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case F64: return static_cast<const double*>(p)[i];
    case U8:
    case BOOL: return static_cast<const uint8_t*>(p)[i];
    case I8: return static_cast<const int8_t*>(p)[i];
    case I16: return static_cast<const int16_t*>(p)[i];
    case I32: return static_cast<const int32_t*>(p)[i];
    case I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0.0;
}
__device__ __forceinline__ int64_t load_i(const void* p, int32_t t, int64_t i) {
  switch (t) {
    case U8:
    case BOOL: return static_cast<const uint8_t*>(p)[i];
    case I8: return static_cast<const int8_t*>(p)[i];
    case I16: return static_cast<const int16_t*>(p)[i];
    case I32: return static_cast<const int32_t*>(p)[i];
    case I64: return static_cast<const int64_t*>(p)[i];
  }
  return 0;
}
__device__ __forceinline__ void store_i(void* p, int32_t t, int64_t i, int64_t v) {
  switch (t) {
    case U8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case BOOL: static_cast<uint8_t*>(p)[i] = v != 0; break;
    case I8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v); break;
    case I16: static_cast<int16_t*>(p)[i] = static_cast<int16_t>(v); break;
    case I32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case I64: static_cast<int64_t*>(p)[i] = v; break;
  }
}
__device__ __forceinline__ void store_d(void* p, int32_t t, int64_t i, double v) {
  switch (t) {
    case F32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case F16: static_cast<__half*>(p)[i] = __double2half(v); break;
    case BF16: static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v); break;
    case F64: static_cast<double*>(p)[i] = v; break;
    case BOOL: static_cast<uint8_t*>(p)[i] = v != 0.0; break;
    default: store_i(p, t, i, static_cast<int64_t>(v)); break;  // truncation toward zero, as C (and ONNX) do
  }
}
__global__ void cast_kernel(int32_t st_, const void* x, int32_t dt, void* y, int64_t n) {
  const bool ints = is_int(st_) && is_int(dt);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (ints) store_i(y, dt, i, load_i(x, st_, i));
    else store_d(y, dt, i, load_d(x, st_, i));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions. Every loop over outputs strides by the grid (any count fits the grid limits); the per-block loop
// bound depends on blockIdx only, so the __syncthreads inside block_reduce are reached by the whole block.
// ---------------------------------------------------------------------------------------------------------------

enum class Comb : int32_t { kAdd, kMax, kMin, kMul };

__device__ __forceinline__ float comb(Comb c, float a, float b) {
  switch (c) {
    case Comb::kAdd: return a + b;
    case Comb::kMax: return (a != a || a > b) ? a : b;  // NaN propagates
    case Comb::kMin: return (a != a || a < b) ? a : b;
    case Comb::kMul: return a * b;
  }
  return a;
}
__device__ __forceinline__ float comb_identity(Comb c) {
  switch (c) {
    case Comb::kMax: return -INFINITY;
    case Comb::kMin: return INFINITY;
    case Comb::kMul: return 1.f;
    default: return 0.f;
  }
}
__device__ __forceinline__ float warp_comb(Comb c, float v) {
  for (int o = 16; o > 0; o >>= 1) v = comb(c, v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide reduction with any combiner (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_comb(Comb c, float v, float* smem) {
  v = warp_comb(c, v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // smem may still be read by the previous call
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : comb_identity(c);
  return warp_comb(c, v);
}

__device__ __forceinline__ Comb comb_of(Reduce op) {
  switch (op) {
    case Reduce::kMax: return Comb::kMax;
    case Reduce::kMin: return Comb::kMin;
    case Reduce::kProd: return Comb::kMul;
    default: return Comb::kAdd;
  }
}
// The per-element term (shift: the row maximum for LogSumExp).
__device__ __forceinline__ float red_map(Reduce op, float x, float shift) {
  switch (op) {
    case Reduce::kSumSquare:
    case Reduce::kL2: return x * x;
    case Reduce::kL1: return fabsf(x);
    case Reduce::kLogSumExp: return expf(x - shift);
    default: return x;
  }
}
__device__ __forceinline__ float red_final(Reduce op, float acc, int64_t n, float shift) {
  switch (op) {
    case Reduce::kMean: return acc / static_cast<float>(n);
    case Reduce::kL2: return sqrtf(acc);
    case Reduce::kLogSum: return logf(acc);
    case Reduce::kLogSumExp: return logf(acc) + shift;
    default: return acc;
  }
}
// A finite shift for LogSumExp (an all -inf or +inf row keeps its value through log(exp(...)) without NaN).
__device__ __forceinline__ float lse_shift(float m) { return isfinite(m) ? m : 0.f; }

// One block per output (large reductions).
template <class T>
__global__ void reduce_block_kernel(Reduce op, const T* x, T* y, int64_t n_out, Strided out, int64_t n_red,
                                    Strided red) {
  __shared__ float smem[32];
  const Comb c = comb_of(op);
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* base = x + offset_of(out, o, 0);
    float shift = 0.f;
    if (op == Reduce::kLogSumExp) {
      float m = -INFINITY;
      for (int64_t j = threadIdx.x; j < n_red; j += blockDim.x) m = fmaxf(m, ld(base, offset_of(red, j, 0)));
      shift = lse_shift(block_comb(Comb::kMax, m, smem));
    }
    float acc = comb_identity(c);
    for (int64_t j = threadIdx.x; j < n_red; j += blockDim.x)
      acc = comb(c, acc, red_map(op, ld(base, offset_of(red, j, 0)), shift));
    acc = block_comb(c, acc, smem);
    if (threadIdx.x == 0) st(y, o, red_final(op, acc, n_red, shift));
  }
}

// A few long reductions split across blocks (reduce_parts): block b reduces slice b % parts of output b / parts into
// part[b] (combined, not finalised); reduce_parts_kernel then combines each output's parts and finalises it. One block
// per output would leave all but a few multiprocessors idle: a sum of 1.2 M elements (the scaler's check of a
// LeNet-like gradient) took 2.3 ms on one block of an H200.
template <class T>
__global__ void reduce_partial_kernel(Reduce op, const T* x, float* part, Strided out, int64_t n_red, Strided red,
                                      int64_t parts) {
  __shared__ float smem[32];
  const Comb c = comb_of(op);
  const int64_t o = blockIdx.x / parts, p = blockIdx.x % parts;
  const int64_t chunk = (n_red + parts - 1) / parts;
  const int64_t begin = p * chunk, end = begin + chunk < n_red ? begin + chunk : n_red;
  const T* base = x + offset_of(out, o, 0);
  float acc = comb_identity(c);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
    acc = comb(c, acc, red_map(op, ld(base, offset_of(red, j, 0)), 0.f));
  acc = block_comb(c, acc, smem);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
template <class T>
__global__ void reduce_parts_kernel(Reduce op, const float* part, T* y, int64_t n_red, int64_t parts) {
  __shared__ float smem[32];
  const Comb c = comb_of(op);
  const int64_t o = blockIdx.x;
  float acc = comb_identity(c);
  for (int64_t p = threadIdx.x; p < parts; p += blockDim.x) acc = comb(c, acc, part[o * parts + p]);
  acc = block_comb(c, acc, smem);
  if (threadIdx.x == 0) st(y, o, red_final(op, acc, n_red, 0.f));
}

// One thread per output (small reductions, or reductions over outer axes where neighbouring outputs are
// neighbours in memory).
template <class T>
__global__ void reduce_thread_kernel(Reduce op, const T* x, T* y, int64_t n_out, Strided out, int64_t n_red,
                                     Strided red) {
  const Comb c = comb_of(op);
  for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < n_out; o += (int64_t)gridDim.x * blockDim.x) {
    const T* base = x + offset_of(out, o, 0);
    float shift = 0.f;
    if (op == Reduce::kLogSumExp) {
      float m = -INFINITY;
      for (int64_t j = 0; j < n_red; ++j) m = fmaxf(m, ld(base, offset_of(red, j, 0)));
      shift = lse_shift(m);
    }
    float acc = comb_identity(c);
    for (int64_t j = 0; j < n_red; ++j) acc = comb(c, acc, red_map(op, ld(base, offset_of(red, j, 0)), shift));
    st(y, o, red_final(op, acc, n_red, shift));
  }
}

// ArgMax / ArgMin: (value, index) pairs; index -1 = no element yet. NaN counts as the extreme (as numpy does).
__device__ __forceinline__ void arg_comb(bool is_max, bool last, float& v, int64_t& i, float v2, int64_t i2) {
  if (i2 < 0) return;
  bool take;
  if (i < 0) take = true;
  else if (v != v) take = v2 != v2 && (last ? i2 > i : i2 < i);
  else if (v2 != v2) take = true;
  else if (v2 == v) take = last ? i2 > i : i2 < i;
  else take = is_max ? v2 > v : v2 < v;
  if (take) v = v2, i = i2;
}
template <class T>
__global__ void arg_reduce_kernel(bool is_max, bool last, const T* x, int64_t* y, int64_t n_out, Strided out,
                                  int64_t n_red, int64_t red_stride) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* base = x + offset_of(out, o, 0);
    float v = 0.f;
    int64_t idx = -1;
    for (int64_t j = threadIdx.x; j < n_red; j += blockDim.x)
      arg_comb(is_max, last, v, idx, ld(base, j * red_stride), j);
    for (int s = 16; s > 0; s >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, v, s);
      const int64_t i2 = __shfl_xor_sync(0xffffffffu, idx, s);
      arg_comb(is_max, last, v, idx, v2, i2);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = idx;
    __syncthreads();
    if (warp == 0) {
      v = lane < warps ? sv[lane] : 0.f;
      idx = lane < warps ? si[lane] : -1;
      for (int s = 16; s > 0; s >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, s);
        const int64_t i2 = __shfl_xor_sync(0xffffffffu, idx, s);
        arg_comb(is_max, last, v, idx, v2, i2);
      }
      if (lane == 0) y[o] = idx;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// LayerNormalization: one block per row; mean, then the variance around it (two passes: no cancellation).
// ---------------------------------------------------------------------------------------------------------------

__device__ __forceinline__ void st_any(void* p, int32_t dt, int64_t i, float v) {
  switch (dt) {
    case F16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v; break;
  }
}

template <class T>
__global__ void layer_norm_kernel(const T* x, const T* scale, const T* bias, T* y, int64_t rows, int64_t cols,
                                  float eps, int32_t stat_dt, void* mean_out, void* inv_out) {
  __shared__ float smem[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += ld(xr, j);
    const float mean = block_comb(Comb::kAdd, s, smem) / static_cast<float>(cols);
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      const float d = ld(xr, j) - mean;
      q += d * d;
    }
    const float var = block_comb(Comb::kAdd, q, smem) / static_cast<float>(cols);
    const float inv = rsqrtf(var + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
      float v = (ld(xr, j) - mean) * inv * ld(scale, j);
      if (bias) v += ld(bias, j);
      st(yr, j, v);
    }
    if (threadIdx.x == 0) {
      if (mean_out) st_any(mean_out, stat_dt, r, mean);
      if (inv_out) st_any(inv_out, stat_dt, r, inv);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Gather, Pad, Resize
// ---------------------------------------------------------------------------------------------------------------

template <class E, class I>
__global__ void gather_kernel(const E* data, const I* idx, E* out, int64_t n, int64_t axis_len, int64_t inner,
                              int64_t n_idx, int32_t* bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t k = i % inner;
    const int64_t t = i / inner;
    const int64_t j = t % n_idx;
    const int64_t outer = t / n_idx;
    int64_t v = static_cast<int64_t>(idx[j]);
    if (v < 0) v += axis_len;
    if (v < 0 || v >= axis_len) {
      if (bad) *bad = 1;
      out[i] = E(0);
      continue;
    }
    out[i] = data[(outer * axis_len + v) * inner + k];
  }
}

template <class E>
__global__ void pad_kernel(const E* in, E* out, int64_t n, PadDesc p, int32_t mode, E value) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t rest = i, off = 0, stride = 1;
    bool outside = false;
    for (int d = p.ndim - 1; d >= 0; --d) {
      const int64_t od = p.out_dims[d], id = p.in_dims[d];
      const int64_t q = rest / od;
      int64_t c = rest - q * od - p.begin[d];
      rest = q;
      if (c < 0 || c >= id) {
        if (mode == 0) {
          outside = true;
        } else if (mode == 2 || id == 1) {
          c = c < 0 ? 0 : id - 1;
        } else {  // reflect (about the edge elements), repeated for pads wider than the dimension
          const int64_t m = 2 * (id - 1);
          c %= m;
          if (c < 0) c += m;
          if (c >= id) c = m - c;
        }
      }
      off += c * stride;
      stride *= id;
    }
    out[i] = outside ? value : in[off];
  }
}

__device__ __forceinline__ double resize_coord(int32_t coord, int64_t o, double scale, int64_t in_len) {
  const double x = static_cast<double>(o);
  const double out_w = scale * static_cast<double>(in_len);
  switch (coord) {
    case 1: return out_w == 1.0 ? -0.5 : (x + 0.5) / scale - 0.5;
    case 2: return out_w == 1.0 ? 0.0 : x * static_cast<double>(in_len - 1) / (out_w - 1.0);
    case 3: return x / scale;
    default: return (x + 0.5) / scale - 0.5;
  }
}
__device__ __forceinline__ int64_t clamp_i(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }
// The input taps of output index o along one dimension: i0 (weight 1 - r) and i1 (weight r).
__device__ __forceinline__ void resize_taps(const ResizeDesc& d, bool h, int64_t o, int64_t& i0, int64_t& i1,
                                            float& r) {
  const int64_t in_len = h ? d.in_h : d.in_w;
  const double scale = h ? d.scale_h : d.scale_w;
  double x = resize_coord(d.coord, o, scale, in_len);
  x = fmin(fmax(x, -8.0), static_cast<double>(in_len) + 8.0);
  if (x != x) x = 0;
  if (!d.linear) {
    const double f = floor(x);
    int64_t i;
    switch (d.nearest) {
      case 1: i = x == f + 0.5 ? static_cast<int64_t>(f + 1) : static_cast<int64_t>(round(x)); break;
      case 2: i = static_cast<int64_t>(f); break;
      case 3: i = static_cast<int64_t>(ceil(x)); break;
      case 4: i = scale < 1.0 ? static_cast<int64_t>(ceil(x)) : static_cast<int64_t>(f); break;
      default: i = x == f + 0.5 ? static_cast<int64_t>(f) : static_cast<int64_t>(round(x)); break;
    }
    i0 = i1 = clamp_i(i, in_len);
    r = 0.f;
    return;
  }
  const double xc = fmin(fmax(x, 0.0), static_cast<double>(in_len - 1));
  const int64_t b = static_cast<int64_t>(floor(xc));
  r = static_cast<float>(xc - static_cast<double>(b));
  i0 = clamp_i(b, in_len);
  i1 = clamp_i(b + 1, in_len);
}
template <class T>
__global__ void resize_kernel(const T* x, T* y, int64_t n, ResizeDesc d) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t ow = i % d.out_w;
    const int64_t t = i / d.out_w;
    const int64_t oh = t % d.out_h;
    const int64_t b = t / d.out_h;
    int64_t h0, h1, w0, w1;
    float rh, rw;
    resize_taps(d, true, oh, h0, h1, rh);
    resize_taps(d, false, ow, w0, w1, rw);
    const T* p = x + b * d.in_h * d.in_w;
    float v;
    if (!d.linear) {
      v = ld(p, h0 * d.in_w + w0);
    } else {
      const float top = ld(p, h0 * d.in_w + w0) * (1.f - rw) + (rw != 0.f ? ld(p, h0 * d.in_w + w1) * rw : 0.f);
      float bottom = 0.f;
      if (rh != 0.f) bottom = ld(p, h1 * d.in_w + w0) * (1.f - rw) + (rw != 0.f ? ld(p, h1 * d.in_w + w1) * rw : 0.f);
      v = top * (1.f - rh) + bottom * rh;
    }
    st(y, i, v);
  }
}

template <template <class> class Launch, class... Args>
cudaError_t by_float_dtype(int32_t dtype, Args&&... args) {
  switch (dtype) {
    case F32: return Launch<float>::run(args...);
    case F16: return Launch<__half>::run(args...);
    case BF16: return Launch<__nv_bfloat16>::run(args...);
  }
  return cudaErrorInvalidValue;
}

template <class T>
struct UnaryL {
  static cudaError_t run(Unary op, const void* x, void* y, int64_t n, float a, float b, float g, cudaStream_t s) {
    unary_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(x), static_cast<T*>(y), n, a, b, g);
    return cudaGetLastError();
  }
};
template <class T>
struct BinaryL {
  static cudaError_t run(Binary op, const void* a, const void* b, void* y, int64_t n, const Strided& st, bool same,
                         cudaStream_t s) {
    if (same)
      binary_same_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(a), static_cast<const T*>(b),
                                                               static_cast<T*>(y), n);
    else
      binary_bcast_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(a), static_cast<const T*>(b),
                                                                static_cast<T*>(y), n, st);
    return cudaGetLastError();
  }
};
template <class T>
struct SoftmaxL {
  static cudaError_t run(const void* x, void* y, int64_t rows, int64_t cols, bool log, cudaStream_t s) {
    int threads = 32;
    while (threads < 1024 && threads < cols) threads <<= 1;
    if (threads > 512) threads = 512;
    for (int64_t r0 = 0; r0 < rows; r0 += 65535LL * 1024) {  // grid.x limit is 2^31-1; keep chunks modest
      const int64_t r = rows - r0 < 65535LL * 1024 ? rows - r0 : 65535LL * 1024;
      softmax_kernel<T><<<static_cast<unsigned>(r), threads, 0, s>>>(static_cast<const T*>(x) + r0 * cols,
                                                                     static_cast<T*>(y) + r0 * cols, cols, log);
    }
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t launch_unary(Unary op, int32_t dtype, const void* x, void* y, int64_t n, float a, float b, float g,
                         cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return by_float_dtype<UnaryL>(dtype, op, x, y, n, a, b, g, s);
}

cudaError_t launch_binary(Binary op, int32_t dtype, const void* a, const void* b, void* y, int64_t n, const Strided& st,
                          bool same_shape, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return by_float_dtype<BinaryL>(dtype, op, a, b, y, n, st, same_shape, s);
}

cudaError_t launch_softmax(int32_t dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log,
                           cudaStream_t s) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  return by_float_dtype<SoftmaxL>(dtype, x, y, rows, cols, log, s);
}

cudaError_t launch_where(int32_t elem_size, const uint8_t* c, const void* x, const void* yv, void* out, int64_t n,
                         const Strided& st, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const int b = blocks_for(n);
  switch (elem_size) {
    case 1:
      where_kernel<uint8_t><<<b, kThreads, 0, s>>>(c, (const uint8_t*)x, (const uint8_t*)yv, (uint8_t*)out, n, st);
      break;
    case 2:
      where_kernel<uint16_t><<<b, kThreads, 0, s>>>(c, (const uint16_t*)x, (const uint16_t*)yv, (uint16_t*)out, n, st);
      break;
    case 4:
      where_kernel<uint32_t><<<b, kThreads, 0, s>>>(c, (const uint32_t*)x, (const uint32_t*)yv, (uint32_t*)out, n, st);
      break;
    case 8:
      where_kernel<uint64_t><<<b, kThreads, 0, s>>>(c, (const uint64_t*)x, (const uint64_t*)yv, (uint64_t*)out, n, st);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_strided_copy(int32_t elem_size, const void* in, void* out, int64_t n, const Strided& st,
                                cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const int b = blocks_for(n);
  switch (elem_size) {
    case 1: strided_copy_kernel<uint8_t><<<b, kThreads, 0, s>>>((const uint8_t*)in, (uint8_t*)out, n, st); break;
    case 2: strided_copy_kernel<uint16_t><<<b, kThreads, 0, s>>>((const uint16_t*)in, (uint16_t*)out, n, st); break;
    case 4: strided_copy_kernel<uint32_t><<<b, kThreads, 0, s>>>((const uint32_t*)in, (uint32_t*)out, n, st); break;
    case 8: strided_copy_kernel<uint64_t><<<b, kThreads, 0, s>>>((const uint64_t*)in, (uint64_t*)out, n, st); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

bool cast_supported(int32_t t) {
  switch (t) {
    case F32:
    case F16:
    case BF16:
    case F64:
    case U8:
    case I8:
    case I16:
    case I32:
    case I64:
    case BOOL: return true;
  }
  return false;
}

cudaError_t launch_cast(int32_t src, const void* x, int32_t dst, void* y, int64_t n, cudaStream_t s) {
  if (!cast_supported(src) || !cast_supported(dst)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, x, dst, y, n);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------------------------

namespace {
// Threads for a block that cooperates on n elements: a power of two in [32, cap].
int coop_threads(int64_t n, int cap) {
  int t = 32;
  while (t < cap && t < n) t <<= 1;
  return t;
}
// Blocks for a one-block-per-item kernel: every item, up to a few waves (the kernels stride by the grid).
unsigned item_blocks(int64_t items) {
  const int64_t cap = 132 * 64;
  return static_cast<unsigned>(items < 1 ? 1 : (items > cap ? cap : items));
}
// Blocks each of n_out reductions of n_red elements is split across (1: not split; see reduce_partial_kernel).
int64_t reduce_parts(Reduce op, int64_t n_out, int64_t n_red) {
  // Fewer outputs than multiprocessors, each long: about two blocks per multiprocessor (132 on an H100 / H200), at
  // least 2,048 elements a block. Log-sum-exp needs each reduction's maximum first: never split.
  if (op == Reduce::kLogSumExp || n_out <= 0 || n_out >= 132 || n_red < 8192) return 1;
  const int64_t want = (264 + n_out - 1) / n_out, most = n_red / 2048;
  return want < most ? want : most;
}

template <class T>
struct ReduceL {
  static cudaError_t run(Reduce op, const void* x, void* y, int64_t n_out, const Strided& out, int64_t n_red,
                         const Strided& red, float* scratch, cudaStream_t s) {
    // Split across blocks when there are few long reductions (and scratch for their parts); per-thread when each
    // reduction is short, or when the reduced axes are not the innermost (then neighbouring threads read
    // neighbouring elements); per-block otherwise.
    const int64_t parts = reduce_parts(op, n_out, n_red);
    if (parts > 1 && scratch != nullptr) {
      reduce_partial_kernel<T><<<static_cast<unsigned>(n_out * parts), 256, 0, s>>>(op, static_cast<const T*>(x),
                                                                                    scratch, out, n_red, red, parts);
      reduce_parts_kernel<T><<<static_cast<unsigned>(n_out), coop_threads(parts, 256), 0, s>>>(
          op, scratch, static_cast<T*>(y), n_red, parts);
      return cudaGetLastError();
    }
    const bool inner_contiguous = red.ndim > 0 && red.strides[red.ndim - 1][0] == 1;
    if (n_red <= 16 || (!inner_contiguous && n_out >= 2048))
      reduce_thread_kernel<T><<<blocks_for(n_out), kThreads, 0, s>>>(op, static_cast<const T*>(x), static_cast<T*>(y),
                                                                     n_out, out, n_red, red);
    else
      reduce_block_kernel<T><<<item_blocks(n_out), coop_threads(n_red, 256), 0, s>>>(
          op, static_cast<const T*>(x), static_cast<T*>(y), n_out, out, n_red, red);
    return cudaGetLastError();
  }
};
template <class T>
struct ArgL {
  static cudaError_t run(bool is_max, bool last, const void* x, int64_t* y, int64_t n_out, const Strided& out,
                         int64_t n_red, int64_t red_stride, cudaStream_t s) {
    arg_reduce_kernel<T><<<item_blocks(n_out), coop_threads(n_red, 256), 0, s>>>(is_max, last, static_cast<const T*>(x),
                                                                                 y, n_out, out, n_red, red_stride);
    return cudaGetLastError();
  }
};
template <class T>
struct LayerNormL {
  static cudaError_t run(const void* x, const void* scale, const void* bias, void* y, int64_t rows, int64_t cols,
                         float eps, int32_t stat_dt, void* mean, void* inv, cudaStream_t s) {
    layer_norm_kernel<T><<<item_blocks(rows), coop_threads(cols, 512), 0, s>>>(
        static_cast<const T*>(x), static_cast<const T*>(scale), static_cast<const T*>(bias), static_cast<T*>(y), rows,
        cols, eps, stat_dt, mean, inv);
    return cudaGetLastError();
  }
};
template <class T>
struct ResizeL {
  static cudaError_t run(const void* x, void* y, const ResizeDesc& d, cudaStream_t s) {
    const int64_t n = d.outer * d.out_h * d.out_w;
    resize_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n, d);
    return cudaGetLastError();
  }
};

template <class E>
cudaError_t gather_as(const void* data, int32_t index_dtype, const void* indices, void* out, int64_t n,
                      int64_t axis_len, int64_t inner, int64_t n_idx, int32_t* bad, cudaStream_t s) {
  if (index_dtype == I64)
    gather_kernel<E, int64_t><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const E*>(data),
                                                                 static_cast<const int64_t*>(indices),
                                                                 static_cast<E*>(out), n, axis_len, inner, n_idx, bad);
  else if (index_dtype == I32)
    gather_kernel<E, int32_t><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const E*>(data),
                                                                 static_cast<const int32_t*>(indices),
                                                                 static_cast<E*>(out), n, axis_len, inner, n_idx, bad);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

template <class E>
cudaError_t pad_as(const void* in, void* out, int64_t n, const PadDesc& p, int32_t mode, E value, cudaStream_t s) {
  pad_kernel<E><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const E*>(in), static_cast<E*>(out), n, p, mode, value);
  return cudaGetLastError();
}
}  // namespace

size_t reduce_scratch_bytes(Reduce op, int64_t n_out, int64_t n_red) {
  const int64_t parts = reduce_parts(op, n_out, n_red);
  return parts > 1 ? static_cast<size_t>(n_out * parts) * sizeof(float) : 0;
}

cudaError_t launch_reduce(Reduce op, int32_t dtype, const void* x, void* y, int64_t n_out, const Strided& out,
                          int64_t n_red, const Strided& red, float* scratch, cudaStream_t s) {
  if (n_out == 0) return cudaSuccess;
  return by_float_dtype<ReduceL>(dtype, op, x, y, n_out, out, n_red, red, scratch, s);
}

cudaError_t launch_arg_reduce(bool is_max, bool select_last, int32_t dtype, const void* x, int64_t* y, int64_t n_out,
                              const Strided& out, int64_t n_red, int64_t red_stride, cudaStream_t s) {
  if (n_out == 0) return cudaSuccess;
  if (n_red < 1) return cudaErrorInvalidValue;
  return by_float_dtype<ArgL>(dtype, is_max, select_last, x, y, n_out, out, n_red, red_stride, s);
}

cudaError_t launch_layer_norm(int32_t dtype, const void* x, const void* scale, const void* bias, void* y, int64_t rows,
                              int64_t cols, float epsilon, int32_t stat_dtype, void* mean, void* inv_std,
                              cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  if (cols == 0) return cudaErrorInvalidValue;
  if (stat_dtype != F32 && stat_dtype != F16 && stat_dtype != BF16) return cudaErrorInvalidValue;
  return by_float_dtype<LayerNormL>(dtype, x, scale, bias, y, rows, cols, epsilon, stat_dtype, mean, inv_std, s);
}

cudaError_t launch_gather(int32_t elem_size, const void* data, int32_t index_dtype, const void* indices, void* out,
                          int64_t outer, int64_t axis_len, int64_t inner, int64_t n_idx, int32_t* bad, cudaStream_t s) {
  const int64_t n = outer * n_idx * inner;
  if (n == 0) return cudaSuccess;
  switch (elem_size) {
    case 1: return gather_as<uint8_t>(data, index_dtype, indices, out, n, axis_len, inner, n_idx, bad, s);
    case 2: return gather_as<uint16_t>(data, index_dtype, indices, out, n, axis_len, inner, n_idx, bad, s);
    case 4: return gather_as<uint32_t>(data, index_dtype, indices, out, n, axis_len, inner, n_idx, bad, s);
    case 8: return gather_as<uint64_t>(data, index_dtype, indices, out, n, axis_len, inner, n_idx, bad, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_pad(int32_t dtype, int32_t elem_size, const void* in, void* out, int64_t n, const PadDesc& p,
                       int32_t mode, double value, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (mode < 0 || mode > 2) return cudaErrorInvalidValue;
  switch (dtype) {  // the constant in the element's own encoding
    case F32: return pad_as<float>(in, out, n, p, mode, static_cast<float>(value), s);
    case F64: return pad_as<double>(in, out, n, p, mode, value, s);
    case F16: {
      const __half h = __double2half(value);
      uint16_t bits;
      std::memcpy(&bits, &h, sizeof bits);
      return pad_as<uint16_t>(in, out, n, p, mode, bits, s);
    }
    case BF16: {
      const __nv_bfloat16 h = __double2bfloat16(value);
      uint16_t bits;
      std::memcpy(&bits, &h, sizeof bits);
      return pad_as<uint16_t>(in, out, n, p, mode, bits, s);
    }
    case I64: return pad_as<int64_t>(in, out, n, p, mode, static_cast<int64_t>(value), s);
    case I32: return pad_as<int32_t>(in, out, n, p, mode, static_cast<int32_t>(value), s);
    case I16: return pad_as<int16_t>(in, out, n, p, mode, static_cast<int16_t>(value), s);
    case I8: return pad_as<int8_t>(in, out, n, p, mode, static_cast<int8_t>(value), s);
    case U8: return pad_as<uint8_t>(in, out, n, p, mode, static_cast<uint8_t>(value), s);
    case BOOL: return pad_as<uint8_t>(in, out, n, p, mode, static_cast<uint8_t>(value != 0.0), s);
  }
  (void)elem_size;
  return cudaErrorInvalidValue;
}

cudaError_t launch_resize(int32_t dtype, const void* x, void* y, const ResizeDesc& d, cudaStream_t s) {
  if (d.outer * d.out_h * d.out_w == 0) return cudaSuccess;
  if (d.in_h <= 0 || d.in_w <= 0) return cudaErrorInvalidValue;
  return by_float_dtype<ResizeL>(dtype, x, y, d, s);
}

}  // namespace keel::cuda
