// plugins/cuda/cuda_kernels.cu — the CUDA plugin's own kernels (element-wise, broadcast, Where, Softmax, strided
// copy, Cast). One translation unit on purpose: nvcc is the slow part of the build, and sm_90 only.
//
// Arithmetic is in float for F32, F16 and BF16 (loads widen, stores round to nearest even). Grid-stride loops;
// the op switch is uniform across the grid, so it costs a branch, not divergence.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_kernels.h"

namespace keel::cuda {
namespace {

// keel_dtype_t values (keel/plugin.h), repeated so this file needs only the CUDA headers.
enum : int32_t { F32 = 1, U8 = 2, I8 = 3, I16 = 5, I32 = 6, I64 = 7, BOOL = 9, F16 = 10, F64 = 11, BF16 = 16 };

constexpr int kThreads = 256;

inline int blocks_for(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b > 132 * 32) b = 132 * 32;  // grid-stride beyond a few waves of an H200's 132 SMs
  return static_cast<int>(b < 1 ? 1 : b);
}

__device__ __forceinline__ float ld(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float ld(const __half* p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st(__half* p, int64_t i, float v) { p[i] = __float2half_rn(v); }
__device__ __forceinline__ void st(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

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
__device__ __forceinline__ bool is_int(int32_t t) { return t == U8 || t == I8 || t == I16 || t == I32 || t == I64 || t == BOOL; }
__device__ __forceinline__ double load_d(const void* p, int32_t t, int64_t i) {
  switch (t) {
    case F32: return static_cast<const float*>(p)[i];
    case F16: return __half2float(static_cast<const __half*>(p)[i]);
    case BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case F64: return static_cast<const double*>(p)[i];
    case U8: case BOOL: return static_cast<const uint8_t*>(p)[i];
    case I8: return static_cast<const int8_t*>(p)[i];
    case I16: return static_cast<const int16_t*>(p)[i];
    case I32: return static_cast<const int32_t*>(p)[i];
    case I64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
  return 0.0;
}
__device__ __forceinline__ int64_t load_i(const void* p, int32_t t, int64_t i) {
  switch (t) {
    case U8: case BOOL: return static_cast<const uint8_t*>(p)[i];
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
      binary_bcast_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(a),
                                                                static_cast<const T*>(b), static_cast<T*>(y), n, st);
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

cudaError_t launch_binary(Binary op, int32_t dtype, const void* a, const void* b, void* y, int64_t n,
                          const Strided& st, bool same_shape, cudaStream_t s) {
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
    case 1: where_kernel<uint8_t><<<b, kThreads, 0, s>>>(c, (const uint8_t*)x, (const uint8_t*)yv, (uint8_t*)out, n, st); break;
    case 2: where_kernel<uint16_t><<<b, kThreads, 0, s>>>(c, (const uint16_t*)x, (const uint16_t*)yv, (uint16_t*)out, n, st); break;
    case 4: where_kernel<uint32_t><<<b, kThreads, 0, s>>>(c, (const uint32_t*)x, (const uint32_t*)yv, (uint32_t*)out, n, st); break;
    case 8: where_kernel<uint64_t><<<b, kThreads, 0, s>>>(c, (const uint64_t*)x, (const uint64_t*)yv, (uint64_t*)out, n, st); break;
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
    case F32: case F16: case BF16: case F64: case U8: case I8: case I16: case I32: case I64: case BOOL: return true;
  }
  return false;
}

cudaError_t launch_cast(int32_t src, const void* x, int32_t dst, void* y, int64_t n, cudaStream_t s) {
  if (!cast_supported(src) || !cast_supported(dst)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  cast_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, x, dst, y, n);
  return cudaGetLastError();
}

}  // namespace keel::cuda
