// plugins/cuda/cuda_train_kernels.cu — the CUDA plugin's training kernels (launchers declared in
// cuda_train_kernels.h): activation gradients, pooling backward, softmax cross-entropy, batch-norm statistics and
// backward, layer-norm backward, Gather backward, per-channel sums. Kept apart from cuda_kernels.cu so that the
// inference kernels do not recompile with these (nvcc is the slow part of the build).
//
// Values are computed in float for F32, F16 and BF16 (loads widen, stores round to nearest even); per-channel and
// per-row sums are taken in double, as the reference kernels do. Scatters (pooling backward, Gather backward)
// accumulate with f32 atomics: overlapping windows and repeated indices add up in an unspecified order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda_train_kernels.h"

namespace keel::cuda {
namespace {

// keel_dtype_t values (keel/plugin.h), repeated so this file needs only the CUDA headers.
enum : int32_t { F32 = 1, I32 = 6, I64 = 7, F16 = 10, BF16 = 16 };

#include "cuda_device_util.cuh"  // kThreads, blocks_for, ld/st

// Calls f(T*{}) for the float dtype; cudaErrorInvalidValue for any other.
template <class F>
cudaError_t by_dtype(int32_t dtype, F&& f) {
  switch (dtype) {
    case F32: f(static_cast<float*>(nullptr)); break;
    case F16: f(static_cast<__half*>(nullptr)); break;
    case BF16: f(static_cast<__nv_bfloat16*>(nullptr)); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

__device__ __forceinline__ int64_t ld_int(const void* p, int32_t dtype, int64_t i) {
  return dtype == I32 ? static_cast<int64_t>(static_cast<const int32_t*>(p)[i]) : static_cast<const int64_t*>(p)[i];
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_sumf(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_maxf(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum (blockDim.x == kThreads); every thread gets the result.
__device__ double block_sum(double v, double* smem) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < warps ? smem[lane] : 0.0;
  return warp_sum(v);
}

#define KEEL_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

template <class T>
__global__ void to_dtype_kernel(const float* acc, T* y, int64_t n) {
  KEEL_GRID_STRIDE(i, n) st(y, i, acc[i]);
}

// ------------------------------------------------------------------------------------------ activation gradients

template <class T>
__global__ void act_grad_kernel(ActGrad op, const T* dy, const T* v, T* dx, int64_t n, float alpha) {
  KEEL_GRID_STRIDE(i, n) {
    const float g = ld(dy, i), x = ld(v, i);
    float r = g;
    switch (op) {
      case ActGrad::kRelu: r = x > 0.f ? g : 0.f; break;
      case ActGrad::kSigmoid: r = g * x * (1.f - x); break;
      case ActGrad::kTanh: r = g * (1.f - x * x); break;
      case ActGrad::kGelu: {
        const float cdf = 0.5f * (1.f + erff(x * 0.70710678118654752f));
        const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f;
        r = g * (cdf + x * pdf);
        break;
      }
      case ActGrad::kLeakyRelu: r = x > 0.f ? g : g * alpha; break;
    }
    st(dx, i, r);
  }
}

// ------------------------------------------------------------------------------------------ pooling backward

// Calls f(flat input offset) for every window position of output o inside X, in scan order (last dim fastest);
// returns the number of positions inside the padded input.
template <class F>
__device__ int64_t for_window(const PoolGeom& g, int64_t o, F&& f) {
  int64_t oi[kPoolMaxDims] = {}, ki[kPoolMaxDims] = {};
  for (int d = g.r - 1; d >= 0; --d) {
    oi[d] = o % g.out[d];
    o /= g.out[d];
  }
  int64_t ksize = 1;
  for (int d = 0; d < g.r; ++d) ksize *= g.kernel[d];
  int64_t padded = 0;
  for (int64_t kk = 0; kk < ksize; ++kk) {
    bool inside = true, inside_padded = true;
    int64_t flat = 0;
    for (int d = 0; d < g.r; ++d) {
      const int64_t id = oi[d] * g.strides[d] - g.pad_begin[d] + ki[d] * g.dilations[d];
      if (id < 0 || id >= g.in[d]) inside = false;
      if (id < -g.pad_begin[d] || id >= g.in[d] + g.pad_end[d]) inside_padded = false;
      flat = flat * g.in[d] + id;
    }
    if (inside_padded) ++padded;
    if (inside) f(flat);
    for (int d = g.r - 1; d >= 0; --d) {
      if (++ki[d] < g.kernel[d]) break;
      ki[d] = 0;
    }
  }
  return padded;
}

// The input position of window o's first maximum in xc (one channel), -1 when the window holds no input position.
template <class T>
__device__ int64_t window_argmax(const PoolGeom& g, const T* xc, int64_t o) {
  int64_t best = -1;
  float bv = 0.f;
  for_window(g, o, [&](int64_t p) {
    const float v = ld(xc, p);
    if (best < 0 || v > bv) {
      best = p;
      bv = v;
    }
  });
  return best;
}

// The divisor of window o's average: positions inside the padded input (count_include_pad) or inside X.
__device__ int64_t window_count(const PoolGeom& g, int64_t o, bool include_pad) {
  int64_t inside = 0;
  const int64_t padded = for_window(g, o, [&](int64_t) { ++inside; });
  return include_pad ? padded : inside;
}

// Where the pooling gradients go: an f32 accumulator, with atomics, where windows overlap; dx itself in its dtype where
// they do not (stride >= the window's extent in every dim, LeNet's 2x2 / 2): each input position then gets at most one
// window's gradient, written straight into dx (zeroed first): no f32 accumulator, no atomics, no conversion pass.
template <bool kAtomic, class Out>
__device__ __forceinline__ void put_grad(Out* out, int64_t p, float v) {
  if constexpr (kAtomic) atomicAdd(out + p, v);
  else st(out, p, v);
}

template <bool kAtomic, class T, class Out>
__global__ void max_pool_grad_kernel(const T* dy, const T* x, Out* out, PoolGeom g, int64_t O, int64_t I) {
  KEEL_GRID_STRIDE(e, g.nc * O) {
    const int64_t nc = e / O;
    const int64_t best = window_argmax(g, x + nc * I, e % O);
    if (best >= 0) put_grad<kAtomic>(out + nc * I, best, ld(dy, e));
  }
}

template <bool kAtomic, class T, class Out>
__global__ void average_pool_grad_kernel(const T* dy, Out* out, PoolGeom g, int64_t O, int64_t I, bool include_pad) {
  KEEL_GRID_STRIDE(e, g.nc * O) {
    const int64_t nc = e / O, o = e % O;
    const int64_t cnt = window_count(g, o, include_pad);
    if (cnt == 0) continue;
    const float v = ld(dy, e) / static_cast<float>(cnt);
    Out* oc = out + nc * I;
    for_window(g, o, [&](int64_t p) { put_grad<kAtomic>(oc, p, v); });
  }
}

int64_t pool_size(const int64_t* d, int r) {
  int64_t n = 1;
  for (int i = 0; i < r; ++i) n *= d[i];
  return n;
}

// Zeroes the f32 accumulator (dx itself for F32), runs `scatter(acc)`, converts into dx for F16 / BF16.
template <class Scatter>
cudaError_t scatter_into(int32_t dtype, void* dx, float* acc, int64_t n, cudaStream_t s, Scatter&& scatter) {
  if (n == 0) return cudaSuccess;  // an empty dx (whose buffers may be null: a workspace of 0 bytes is)
  float* a = dtype == F32 ? static_cast<float*>(dx) : acc;
  if (a == nullptr) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(a, 0, static_cast<size_t>(n) * sizeof(float), s);
  if (e != cudaSuccess) return e;
  e = scatter(a);
  if (e != cudaSuccess || dtype == F32) return e;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    to_dtype_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(a, static_cast<T*>(dx), n);
  });
}

// ------------------------------------------------------------------------------------------ softmax cross-entropy

// One warp per (n, d) row of scores [N, C, D].
template <class T>
__global__ void softmax_xent_kernel(const T* x, const void* labels, int32_t ldt, const T* w, int64_t N, int64_t C,
                                    int64_t D, bool has_ignore, int64_t ignore, int32_t reduction, T* loss_none,
                                    T* log_prob, float* scratch, int32_t* bad) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = N * D, warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t r = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
    const int64_t n = r / D, d = r % D;
    const T* xr = x + n * C * D + d;
    float mx = -INFINITY;
    for (int64_t c = lane; c < C; c += 32) mx = fmaxf(mx, ld(xr, c * D));
    mx = warp_maxf(mx);
    float sum = 0.f;
    for (int64_t c = lane; c < C; c += 32) sum += expf(ld(xr, c * D) - mx);
    const float ls = logf(warp_sumf(sum));
    if (log_prob)
      for (int64_t c = lane; c < C; c += 32) st(log_prob + n * C * D + d, c * D, ld(xr, c * D) - mx - ls);
    if (lane != 0) continue;
    const int64_t t = ld_int(labels, ldt, r);
    float l = 0.f, wt = 0.f;
    if (!(has_ignore && t == ignore)) {
      if (t < 0 || t >= C) {
        if (bad) *bad = 1;
      } else {
        wt = w ? ld(w, t) : 1.f;
        l = -(ld(xr, t * D) - mx - ls) * wt;
      }
    }
    if (reduction == 0) {
      st(loss_none, r, l);
    } else {
      scratch[r] = l;
      scratch[rows + r] = wt;
    }
  }
}

// One block: loss[0] = sum (reduction 1) or sum / sum of weights (2; 0 when that is 0).
template <class T>
__global__ void xent_reduce_kernel(const float* scratch, int64_t rows, int32_t reduction, T* loss) {
  __shared__ double smem[32];
  double l = 0, w = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    l += scratch[r];
    w += scratch[rows + r];
  }
  l = block_sum(l, smem);
  w = block_sum(w, smem);
  if (threadIdx.x == 0) st(loss, 0, static_cast<float>(reduction == 1 ? l : (w == 0 ? 0.0 : l / w)));
}

// One block: *wsum = the sum of the weights of the counted labels.
template <class T>
__global__ void xent_weight_sum_kernel(const void* labels, int32_t ldt, const T* w, int64_t rows, int64_t C,
                                       bool has_ignore, int64_t ignore, float* wsum) {
  __shared__ double smem[32];
  double s = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t t = ld_int(labels, ldt, r);
    if ((has_ignore && t == ignore) || t < 0 || t >= C) continue;
    s += w ? ld(w, t) : 1.f;
  }
  s = block_sum(s, smem);
  if (threadIdx.x == 0) *wsum = static_cast<float>(s);
}

template <class T>
__global__ void xent_grad_kernel(const T* dl, const T* lp, const void* labels, int32_t ldt, const T* w, int64_t N,
                                 int64_t C, int64_t D, bool has_ignore, int64_t ignore, int32_t reduction,
                                 const float* wsum, T* dx) {
  KEEL_GRID_STRIDE(i, N * C * D) {
    const int64_t d = i % D, j = (i / D) % C, n = i / (C * D), row = n * D + d;
    const int64_t t = ld_int(labels, ldt, row);
    float r = 0.f;
    if (!(has_ignore && t == ignore) && t >= 0 && t < C) {
      float s = reduction == 0 ? ld(dl, row) : ld(dl, 0);
      if (reduction == 2) s = *wsum == 0.f ? 0.f : s / *wsum;
      s *= w ? ld(w, t) : 1.f;
      r = s * (expf(ld(lp, i)) - (j == t ? 1.f : 0.f));
    }
    st(dx, i, r);
  }
}

// ------------------------------------------------------------------------------------------ batch normalisation

// One block per channel of x [N, C, S]: mean and biased variance (f64).
template <class T>
__global__ void bn_stats_kernel(const T* x, int64_t N, int64_t C, int64_t S, float eps, T* mean, T* invstd,
                                T* var_unbiased, double* scratch) {
  __shared__ double smem[32];
  const int64_t c = blockIdx.x, cnt = N * S;
  double s = 0;
  for (int64_t e = threadIdx.x; e < cnt; e += blockDim.x) s += ld(x, ((e / S) * C + c) * S + e % S);
  const double m = block_sum(s, smem) / static_cast<double>(cnt);
  double s2 = 0;
  for (int64_t e = threadIdx.x; e < cnt; e += blockDim.x) {
    const double v = ld(x, ((e / S) * C + c) * S + e % S) - m;
    s2 += v * v;
  }
  s2 = block_sum(s2, smem);
  if (threadIdx.x != 0) return;
  const double var = s2 / static_cast<double>(cnt);
  const double inv = 1.0 / sqrt(var + static_cast<double>(eps));
  // y uses the statistics as the outputs hold them (rounded to the dtype), as the reference does.
  scratch[c] = static_cast<float>(m);
  scratch[C + c] = static_cast<float>(inv);
  if (mean) st(mean, c, static_cast<float>(m));
  if (invstd) st(invstd, c, static_cast<float>(inv));
  if (var_unbiased) st(var_unbiased, c, static_cast<float>(cnt > 1 ? s2 / static_cast<double>(cnt - 1) : var));
}

template <class T>
__global__ void bn_apply_kernel(const T* x, const T* scale, const T* b, const double* scratch, T* y, int64_t C,
                                int64_t S, int64_t n) {
  KEEL_GRID_STRIDE(i, n) {
    const int64_t c = (i / S) % C;
    const float m = static_cast<float>(scratch[c]), inv = static_cast<float>(scratch[C + c]);
    st(y, i, (ld(x, i) - m) * inv * ld(scale, c) + ld(b, c));
  }
}

// One block per channel: sum dY and sum dY * xhat (f64); dScale / dB written here.
template <class T>
__global__ void bn_grad_sums_kernel(const T* dy, const T* x, const T* mean, const T* invstd, int64_t N, int64_t C,
                                    int64_t S, T* dscale, T* db, double* scratch) {
  __shared__ double smem[32];
  const int64_t c = blockIdx.x, cnt = N * S;
  const float m = ld(mean, c), inv = ld(invstd, c);
  double sdy = 0, sdyx = 0;
  for (int64_t e = threadIdx.x; e < cnt; e += blockDim.x) {
    const int64_t j = ((e / S) * C + c) * S + e % S;
    const float g = ld(dy, j);
    sdy += g;
    sdyx += static_cast<double>(g) * ((ld(x, j) - m) * inv);
  }
  sdy = block_sum(sdy, smem);
  sdyx = block_sum(sdyx, smem);
  if (threadIdx.x != 0) return;
  scratch[c] = sdy;
  scratch[C + c] = sdyx;
  if (dscale) st(dscale, c, static_cast<float>(sdyx));
  if (db) st(db, c, static_cast<float>(sdy));
}

template <class T>
__global__ void bn_grad_dx_kernel(const T* dy, const T* x, const T* scale, const T* mean, const T* invstd,
                                  const double* scratch, T* dx, int64_t C, int64_t S, int64_t n, double cnt) {
  KEEL_GRID_STRIDE(i, n) {
    const int64_t c = (i / S) % C;
    const double inv = ld(invstd, c);
    const double xh = (ld(x, i) - ld(mean, c)) * inv;
    st(dx, i, static_cast<float>(ld(scale, c) * inv / cnt * (cnt * ld(dy, i) - scratch[c] - xh * scratch[C + c])));
  }
}

// One block per channel: db[c] = sum of dy at channel c.
template <class T>
__global__ void channel_sum_kernel(const T* dy, T* db, int64_t N, int64_t C, int64_t S) {
  __shared__ double smem[32];
  const int64_t c = blockIdx.x, cnt = N * S;
  double s = 0;
  for (int64_t e = threadIdx.x; e < cnt; e += blockDim.x) s += ld(dy, ((e / S) * C + c) * S + e % S);
  s = block_sum(s, smem);
  if (threadIdx.x == 0) st(db, c, static_cast<float>(s));
}

// ------------------------------------------------------------------------------------------ layer normalisation

template <class T, class U>
__global__ void ln_grad_dx_kernel(const T* dy, const T* x, const T* scale, const U* mean, const U* invstd, T* dx,
                                  int64_t cols) {
  __shared__ double smem[32];
  const int64_t o = blockIdx.x;
  const float m = ld(mean, o), inv = ld(invstd, o);
  const T* dyr = dy + o * cols;
  const T* xr = x + o * cols;
  double sg = 0, sgx = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const double g = static_cast<double>(ld(dyr, i)) * ld(scale, i);
    sg += g;
    sgx += g * ((ld(xr, i) - m) * inv);
  }
  sg = block_sum(sg, smem) / static_cast<double>(cols);
  sgx = block_sum(sgx, smem) / static_cast<double>(cols);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const double g = static_cast<double>(ld(dyr, i)) * ld(scale, i);
    const double xh = (ld(xr, i) - m) * inv;
    st(dx + o * cols, i, static_cast<float>(inv * (g - sg - xh * sgx)));
  }
}

// Column sums over the rows: block (32, 8), 32 columns per block, 8 row groups reduced in shared memory.
template <class T, class U>
__global__ void ln_grad_params_kernel(const T* dy, const T* x, const U* mean, const U* invstd, T* dscale, T* db,
                                      int64_t rows, int64_t cols) {
  __shared__ float ss[8][33], sb[8][33];
  const int64_t i = blockIdx.x * 32 + threadIdx.x;
  float a = 0.f, b = 0.f;
  if (i < cols)
    for (int64_t o = threadIdx.y; o < rows; o += 8) {
      const float g = ld(dy, o * cols + i);
      a += g * ((ld(x, o * cols + i) - ld(mean, o)) * ld(invstd, o));
      b += g;
    }
  ss[threadIdx.y][threadIdx.x] = a;
  sb[threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  if (threadIdx.y != 0 || i >= cols) return;
  for (int k = 1; k < 8; ++k) {
    a += ss[k][threadIdx.x];
    b += sb[k][threadIdx.x];
  }
  if (dscale) st(dscale, i, a);
  if (db) st(db, i, b);
}

// ------------------------------------------------------------------------------------------ gather backward

template <class T>
__global__ void gather_grad_kernel(const T* dy, const void* idx, int32_t idt, float* acc, int64_t A, int64_t inner,
                                   int64_t J, int64_t n) {
  KEEL_GRID_STRIDE(e, n) {
    const int64_t i = e % inner, j = (e / inner) % J, o = e / (inner * J);
    int64_t a = ld_int(idx, idt, j);
    if (a < 0) a += A;
    if (a < 0 || a >= A) continue;
    atomicAdd(acc + (o * A + a) * inner + i, ld(dy, e));
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------ launchers

cudaError_t launch_act_grad(ActGrad op, int32_t dtype, const void* dy, const void* v, void* dx, int64_t n, float alpha,
                            cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    act_grad_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(op, static_cast<const T*>(dy), static_cast<const T*>(v),
                                                          static_cast<T*>(dx), n, alpha);
  });
}

bool pool_windows_disjoint(const PoolGeom& g) {
  for (int d = 0; d < g.r; ++d)
    if (g.strides[d] < (g.kernel[d] - 1) * g.dilations[d] + 1) return false;
  return true;
}

cudaError_t launch_max_pool_grad(int32_t dtype, const void* dy, const void* x, void* dx, float* acc, const PoolGeom& g,
                                 cudaStream_t s) {
  const int64_t O = pool_size(g.out, g.r), I = pool_size(g.in, g.r);
  if (pool_windows_disjoint(g)) {
    return by_dtype(dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (cudaMemsetAsync(dx, 0, static_cast<size_t>(g.nc * I) * sizeof(T), s) != cudaSuccess || g.nc * O == 0) return;
      max_pool_grad_kernel<false, T><<<blocks_for(g.nc * O), kThreads, 0, s>>>(
          static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<T*>(dx), g, O, I);
    });
  }
  return scatter_into(dtype, dx, acc, g.nc * I, s, [&](float* a) {
    if (g.nc * O == 0) return cudaSuccess;
    return by_dtype(dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      max_pool_grad_kernel<true, T>
          <<<blocks_for(g.nc * O), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<const T*>(x), a, g, O, I);
    });
  });
}

cudaError_t launch_average_pool_grad(int32_t dtype, const void* dy, void* dx, float* acc, const PoolGeom& g,
                                     bool count_include_pad, cudaStream_t s) {
  const int64_t O = pool_size(g.out, g.r), I = pool_size(g.in, g.r);
  if (pool_windows_disjoint(g)) {
    return by_dtype(dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      if (cudaMemsetAsync(dx, 0, static_cast<size_t>(g.nc * I) * sizeof(T), s) != cudaSuccess || g.nc * O == 0) return;
      average_pool_grad_kernel<false, T><<<blocks_for(g.nc * O), kThreads, 0, s>>>(
          static_cast<const T*>(dy), static_cast<T*>(dx), g, O, I, count_include_pad);
    });
  }
  return scatter_into(dtype, dx, acc, g.nc * I, s, [&](float* a) {
    if (g.nc * O == 0) return cudaSuccess;
    return by_dtype(dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      average_pool_grad_kernel<true, T>
          <<<blocks_for(g.nc * O), kThreads, 0, s>>>(static_cast<const T*>(dy), a, g, O, I, count_include_pad);
    });
  });
}

cudaError_t launch_softmax_xent(int32_t dtype, const void* scores, int32_t label_dtype, const void* labels,
                                const void* weights, int64_t N, int64_t C, int64_t D, bool has_ignore,
                                int64_t ignore_index, int32_t reduction, void* loss, void* log_prob, float* scratch,
                                int32_t* bad, cudaStream_t s) {
  const int64_t rows = N * D;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (rows > 0) {  // C == 0 too: every label not ignored is then out of range (bad), as the reference reports
      constexpr int kWarps = kThreads / 32;
      const int64_t b = (rows + kWarps - 1) / kWarps;
      softmax_xent_kernel<T><<<static_cast<int>(b > 132 * 64 ? 132 * 64 : b), kThreads, 0, s>>>(
          static_cast<const T*>(scores), labels, label_dtype, static_cast<const T*>(weights), N, C, D, has_ignore,
          ignore_index, reduction, static_cast<T*>(loss), static_cast<T*>(log_prob), scratch, bad);
    } else if (reduction == 0) {
      return;  // an empty loss
    }
    if (reduction != 0) xent_reduce_kernel<T><<<1, kThreads, 0, s>>>(scratch, rows, reduction, static_cast<T*>(loss));
  });
}

cudaError_t launch_softmax_xent_grad(int32_t dtype, const void* dloss, const void* log_prob, int32_t label_dtype,
                                     const void* labels, const void* weights, int64_t N, int64_t C, int64_t D,
                                     bool has_ignore, int64_t ignore_index, int32_t reduction, void* dscores,
                                     float* scratch, cudaStream_t s) {
  const int64_t n = N * C * D;
  if (n == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* w = static_cast<const T*>(weights);
    if (reduction == 2)
      xent_weight_sum_kernel<T>
          <<<1, kThreads, 0, s>>>(labels, label_dtype, w, N * D, C, has_ignore, ignore_index, scratch);
    xent_grad_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
        static_cast<const T*>(dloss), static_cast<const T*>(log_prob), labels, label_dtype, w, N, C, D, has_ignore,
        ignore_index, reduction, scratch, static_cast<T*>(dscores));
  });
}

cudaError_t launch_batch_norm_train(int32_t dtype, const void* x, const void* scale, const void* b, void* y, void* mean,
                                    void* invstd, void* var_unbiased, int64_t N, int64_t C, int64_t S, float eps,
                                    double* scratch, cudaStream_t s) {
  const int64_t n = N * C * S;
  if (n == 0 || C > INT32_MAX) return n == 0 ? cudaSuccess : cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bn_stats_kernel<T><<<static_cast<unsigned>(C), kThreads, 0, s>>>(static_cast<const T*>(x), N, C, S, eps,
                                                                     static_cast<T*>(mean), static_cast<T*>(invstd),
                                                                     static_cast<T*>(var_unbiased), scratch);
    bn_apply_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<const T*>(scale),
                                                          static_cast<const T*>(b), scratch, static_cast<T*>(y), C, S,
                                                          n);
  });
}

cudaError_t launch_batch_norm_grad(int32_t dtype, const void* dy, const void* x, const void* scale, const void* mean,
                                   const void* invstd, void* dx, void* dscale, void* db, int64_t N, int64_t C,
                                   int64_t S, double* scratch, cudaStream_t s) {
  const int64_t n = N * C * S;
  if (C == 0) return cudaSuccess;
  if (C > INT32_MAX) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bn_grad_sums_kernel<T><<<static_cast<unsigned>(C), kThreads, 0, s>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(mean), static_cast<const T*>(invstd),
        N, C, S, static_cast<T*>(dscale), static_cast<T*>(db), scratch);
    if (dx && n > 0)
      bn_grad_dx_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<const T*>(x),
                                                              static_cast<const T*>(scale), static_cast<const T*>(mean),
                                                              static_cast<const T*>(invstd), scratch,
                                                              static_cast<T*>(dx), C, S, n, static_cast<double>(N * S));
  });
}

cudaError_t launch_layer_norm_grad(int32_t dtype, int32_t stat_dtype, const void* dy, const void* x, const void* scale,
                                   const void* mean, const void* invstd, void* dx, void* dscale, void* db, int64_t rows,
                                   int64_t cols, cudaStream_t s) {
  if (rows == 0 && (dscale || db)) {  // no rows: the parameter gradients are zeros
    const size_t bytes = static_cast<size_t>(cols) * (dtype == F32 ? 4 : 2);
    if (dscale)
      if (cudaError_t e = cudaMemsetAsync(dscale, 0, bytes, s)) return e;
    if (db) return cudaMemsetAsync(db, 0, bytes, s);
    return cudaSuccess;
  }
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (rows > INT32_MAX) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    // The statistics' dtype: the data's, or f32 (LayerNormalization-17's stash_type).
    auto run = [&](auto* stag) {
      using U = std::remove_pointer_t<decltype(stag)>;
      if (dx)
        ln_grad_dx_kernel<T, U><<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(scale),
            static_cast<const U*>(mean), static_cast<const U*>(invstd), static_cast<T*>(dx), cols);
      if (dscale || db)
        ln_grad_params_kernel<T, U><<<static_cast<unsigned>((cols + 31) / 32), dim3(32, 8), 0, s>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const U*>(mean),
            static_cast<const U*>(invstd), static_cast<T*>(dscale), static_cast<T*>(db), rows, cols);
    };
    if (stat_dtype == dtype) run(static_cast<T*>(nullptr));
    else run(static_cast<float*>(nullptr));
  });
}

cudaError_t launch_gather_grad(int32_t dtype, const void* dy, int32_t index_dtype, const void* indices, void* ddata,
                               float* acc, int64_t outer, int64_t A, int64_t inner, int64_t J, cudaStream_t s) {
  const int64_t n = outer * J * inner;
  return scatter_into(dtype, ddata, acc, outer * A * inner, s, [&](float* a) {
    if (n == 0) return cudaSuccess;
    return by_dtype(dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      gather_grad_kernel<T>
          <<<blocks_for(n), kThreads, 0, s>>>(static_cast<const T*>(dy), indices, index_dtype, a, A, inner, J, n);
    });
  });
}

cudaError_t launch_channel_sum(int32_t dtype, const void* dy, void* db, int64_t N, int64_t C, int64_t S,
                               cudaStream_t s) {
  if (C == 0) return cudaSuccess;
  if (C > INT32_MAX) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    channel_sum_kernel<T>
        <<<static_cast<unsigned>(C), kThreads, 0, s>>>(static_cast<const T*>(dy), static_cast<T*>(db), N, C, S);
  });
}

// ------------------------------------------------------------------------------------------ Momentum, AdamStep

namespace {

// Multi-tensor launches: block b updates a chunk of kChunk elements of one tensor; tensor i has blocks
// [first[i], first[i + 1]).
constexpr int64_t kChunk = 4096;
int64_t chunk_blocks(const int64_t* n, int32_t count, int64_t* first) {
  first[0] = 0;
  for (int32_t i = 0; i < count; ++i) first[i + 1] = first[i] + (n[i] + kChunk - 1) / kChunk;
  return first[count];
}
struct Chunk {
  int i;               // the tensor
  int64_t begin, end;  // the elements
};
__device__ Chunk chunk_of(const int64_t* first, const int64_t* n, int32_t count) {
  Chunk c{0, 0, 0};
  while (c.i + 1 < count && static_cast<int64_t>(blockIdx.x) >= first[c.i + 1]) ++c.i;
  c.begin = (static_cast<int64_t>(blockIdx.x) - first[c.i]) * kChunk;
  c.end = c.begin + kChunk < n[c.i] ? c.begin + kChunk : n[c.i];
  return c;
}

// A multi-tensor launch's prologue: l.ts = ts and its chunk table. Returns the grid size: 0 when there is nothing to
// do, -1 when ts holds more than kMomentumTensors tensors or the grid would exceed CUDA's limit.
template <class Launch, class Tensors>
int64_t prepare_launch(Launch& l, const Tensors& ts) {
  if (ts.count < 0 || ts.count > kMomentumTensors) return -1;
  l.ts = ts;
  const int64_t blocks = chunk_blocks(ts.n, ts.count, l.first_block);
  return blocks > 0x7fffffff ? -1 : blocks;
}

struct MomentumLaunch {
  MomentumTensors ts;
  int64_t first_block[kMomentumTensors + 1];
};

__global__ void momentum_kernel(const __grid_constant__ MomentumLaunch l, const float* r, const int64_t* t, float alpha,
                                float beta, float norm, bool nesterov) {
  const Chunk c = chunk_of(l.first_block, l.ts.n, l.ts.count);
  const float lr = *r, b1 = *t > 0 ? beta : 1.f;
  const float *x = l.ts.x[c.i], *g = l.ts.g[c.i], *v = l.ts.v[c.i];
  float *xo = l.ts.x_out[c.i], *vo = l.ts.v_out[c.i];
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x) {
    // Every operation rounded on its own (no fused multiply-add): the CPU loop's values.
    const float xj = x[j];
    float gr = g[j];
    gr = __fadd_rn(gr, __fmul_rn(xj, norm));  // with norm 0 too: an inf or NaN parameter gives NaN, as on the CPU
    const float b = __fadd_rn(__fmul_rn(v[j], alpha), __fmul_rn(gr, b1));
    vo[j] = b;
    const float step = nesterov ? __fadd_rn(gr, __fmul_rn(b, alpha)) : b;
    xo[j] = __fsub_rn(xj, __fmul_rn(step, lr));
  }
}

}  // namespace

cudaError_t launch_momentum(const MomentumTensors& ts, const float* r, const int64_t* t, float alpha, float beta,
                            float norm, bool nesterov, cudaStream_t s) {
  MomentumLaunch l;
  const int64_t blocks = prepare_launch(l, ts);
  if (blocks <= 0) return blocks == 0 ? cudaSuccess : cudaErrorInvalidValue;
  momentum_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(l, r, t, alpha, beta, norm, nesterov);
  return cudaGetLastError();
}

namespace {

struct AdamLaunch {
  AdamTensors ts;
  int64_t first_block[kMomentumTensors + 1];
};

__global__ void adam_step_kernel(const __grid_constant__ AdamLaunch l, const float* sc) {
  const Chunk c = chunk_of(l.first_block, l.ts.n, l.ts.count);
  const float decay_scale = sc[0], wd = sc[1], b1 = sc[2], k1 = sc[3], b2 = sc[4], k2 = sc[5], sqrt_bc2 = sc[6],
              eps = sc[7], step_size = sc[8];
  const int i = c.i;
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x) {
    float p = l.ts.p[i][j];
    if (decay_scale != 1.f) p = __fmul_rn(p, decay_scale);
    float g = l.ts.g[i][j];
    if (wd != 0.f) g = __fadd_rn(g, __fmul_rn(p, wd));
    const float m = __fadd_rn(__fmul_rn(l.ts.m[i][j], b1), __fmul_rn(g, k1));
    const float v = __fadd_rn(__fmul_rn(l.ts.v[i][j], b2), __fmul_rn(__fmul_rn(g, g), k2));
    l.ts.m_out[i][j] = m;
    l.ts.v_out[i][j] = v;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), sqrt_bc2), eps);
    l.ts.p_out[i][j] = __fsub_rn(p, __fmul_rn(__fdiv_rn(m, denom), step_size));
  }
}

}  // namespace

cudaError_t launch_adam_step(const AdamTensors& ts, const float* scalars, cudaStream_t s) {
  AdamLaunch l;
  const int64_t blocks = prepare_launch(l, ts);
  if (blocks <= 0) return blocks == 0 ? cudaSuccess : cudaErrorInvalidValue;
  adam_step_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(l, scalars);
  return cudaGetLastError();
}

// ------------------------------------------------------------------------------------------ GradScaler's unscale

namespace {

struct UnscaleLaunch {
  UnscaleTensors ts;
  int64_t first_block[kMomentumTensors + 1];
};

// u = g * inv in f32, rounded to T; a block that stores an inf or NaN sets *found (every such block writes the same
// 1, so the unordered writes agree; *found was zeroed before the first launch).
template <class T>
__global__ void unscale_kernel(const __grid_constant__ UnscaleLaunch l, const float* inv_p, float* found) {
  const Chunk c = chunk_of(l.first_block, l.ts.n, l.ts.count);
  const float inv = *inv_p;
  const T* g = static_cast<const T*>(l.ts.g[c.i]);
  T* u = static_cast<T*>(l.ts.u[c.i]);
  int bad = 0;
  for (int64_t j = c.begin + threadIdx.x; j < c.end; j += blockDim.x) {
    st(u, j, __fmul_rn(ld(g, j), inv));
    bad |= !isfinite(ld(u, j));
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1.f;
}

}  // namespace

cudaError_t launch_check_finite_and_unscale(const UnscaleTensors& ts, int32_t dtype, const float* inv_scale,
                                            float* found, cudaStream_t s) {
  UnscaleLaunch l;
  const int64_t blocks = prepare_launch(l, ts);
  if (blocks <= 0) return blocks == 0 ? cudaSuccess : cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    unscale_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(l, inv_scale, found);
  });
}

// ------------------------------------------------------------------------------------------ dropout mask

namespace {

__device__ __forceinline__ uint64_t splitmix64_at(uint64_t seed, uint64_t k) {
  uint64_t z = seed + (k + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One thread per pair of elements (one SplitMix64 value: its low half for the even element, high for the odd one).
template <class T>
__global__ void dropout_mask_kernel(T* mask, int64_t n, bool seed_i32, const void* seed, uint32_t cut, float kept) {
  const uint64_t sd = seed_i32 ? static_cast<uint64_t>(static_cast<int64_t>(*static_cast<const int32_t*>(seed)))
                               : static_cast<uint64_t>(*static_cast<const int64_t*>(seed));
  KEEL_GRID_STRIDE(j, (n + 1) / 2) {
    const uint64_t r = splitmix64_at(sd, static_cast<uint64_t>(j));
    st(mask, 2 * j, static_cast<uint32_t>(r) >= cut ? kept : 0.f);
    if (2 * j + 1 < n) st(mask, 2 * j + 1, static_cast<uint32_t>(r >> 32) >= cut ? kept : 0.f);
  }
}

}  // namespace

cudaError_t launch_dropout_mask(int32_t dtype, void* mask, int64_t n, int32_t seed_dtype, const void* seed,
                                uint32_t cut, float kept, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (seed_dtype != I64 && seed_dtype != I32) return cudaErrorInvalidValue;
  return by_dtype(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dropout_mask_kernel<T>
        <<<blocks_for((n + 1) / 2), kThreads, 0, s>>>(static_cast<T*>(mask), n, seed_dtype == I32, seed, cut, kept);
  });
}

}  // namespace keel::cuda
