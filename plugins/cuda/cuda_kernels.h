// plugins/cuda/cuda_kernels.h — (internal) launchers of the CUDA plugin's own kernels (cuda_kernels.cu).
//
// Plain C++ with no Keel type in it: the host side (cuda_ops.cc) decides shapes and dtypes, these launch on the
// given stream of the current device and return the launch's cudaError_t. Dtypes are keel_dtype_t values.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace keel::cuda {

constexpr int kMaxRank = 8;

// A strided view of up to kMaxRank dims: out element i (row-major over `dims`) reads at sum(idx[d] * strides[d]).
// A stride of 0 broadcasts.
struct Strided {
  int32_t ndim = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank][3] = {};  // per operand (up to 3), in elements
};

enum class Unary : int32_t {
  kRelu,
  kSigmoid,
  kTanh,
  kExp,
  kLog,
  kNeg,
  kAbs,
  kSqrt,
  kReciprocal,
  kErf,
  kLeakyRelu,
  kElu,
  kHardSigmoid,
  kSoftplus,
  kSoftsign,
  kSin,
  kCos,
  kFloor,
  kCeil,
  kHardSwish,
  kSelu,
  kGeluErf,
  kGeluTanh,
  kClip,  // min(max(x, alpha), beta)
};
enum class Binary : int32_t { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin };

// y = op(x) over n elements; dtype F32, F16 or BF16. alpha/beta: the op's attributes (LeakyRelu, Elu, ...).
cudaError_t launch_unary(Unary op, int32_t dtype, const void* x, void* y, int64_t n, float alpha, float beta,
                         float gamma, cudaStream_t s);
// y = a op b; `st` describes y's dims with strides for a (operand 0) and b (operand 1). `same_shape` = no broadcast.
cudaError_t launch_binary(Binary op, int32_t dtype, const void* a, const void* b, void* y, int64_t n, const Strided& st,
                          bool same_shape, cudaStream_t s);
// y = cond ? x : yv, elements of `elem_size` bytes; operands 0 = cond (bytes), 1 = x, 2 = y.
cudaError_t launch_where(int32_t elem_size, const uint8_t* cond, const void* x, const void* yv, void* out, int64_t n,
                         const Strided& st, cudaStream_t s);
// Softmax (or LogSoftmax) over the last of [rows, cols], dtype F32, F16 or BF16.
cudaError_t launch_softmax(int32_t dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log, cudaStream_t s);
// out[i] = in[strided offset of i] (operand 0): Transpose, Expand-like broadcasts. elem_size 1, 2, 4 or 8.
cudaError_t launch_strided_copy(int32_t elem_size, const void* in, void* out, int64_t n, const Strided& st,
                                cudaStream_t s);
// Element-wise conversion between F32, F16, BF16, F64, I8, U8, I16, I32, I64, BOOL. Returns cudaErrorInvalidValue
// for a pair it does not handle (checked beforehand with cast_supported).
bool cast_supported(int32_t dtype);
cudaError_t launch_cast(int32_t src_dtype, const void* x, int32_t dst_dtype, void* y, int64_t n, cudaStream_t s);

// Reductions (ReduceSum ... ReduceLogSumExp). Output element o (row-major over `out.dims`) reduces the n_red
// elements of the `red` view (row-major over red.dims; operand 0 strides) starting at x + offset_of(out, o).
// Accumulates in float; dtype F32, F16 or BF16; n_red may be 0 (the identity, as ONNX says).
enum class Reduce : int32_t { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL1, kL2, kLogSum, kLogSumExp };
// scratch: reduce_scratch_bytes(op, n_out, n_red) bytes of device memory (null when that is 0): a few long reductions
// are split across blocks and their parts combined by a second kernel.
size_t reduce_scratch_bytes(Reduce op, int64_t n_out, int64_t n_red);
cudaError_t launch_reduce(Reduce op, int32_t dtype, const void* x, void* y, int64_t n_out, const Strided& out,
                          int64_t n_red, const Strided& red, float* scratch, cudaStream_t s);
// ArgMax / ArgMin over one axis: y (int64) element o compares x[offset_of(out, o) + k * red_stride], k < n_red
// (n_red >= 1). Ties: the first index, or the last with `select_last`.
cudaError_t launch_arg_reduce(bool is_max, bool select_last, int32_t dtype, const void* x, int64_t* y, int64_t n_out,
                              const Strided& out, int64_t n_red, int64_t red_stride, cudaStream_t s);
// LayerNormalization over the last `cols` of [rows, cols]: y = (x - mean) * rsqrt(var + eps) * scale + bias
// (bias may be null; scale/bias have `cols` elements of the same dtype). mean/inv_std (may be null) get one value
// per row in `stat_dtype` (F32, F16 or BF16).
cudaError_t launch_layer_norm(int32_t dtype, const void* x, const void* scale, const void* bias, void* y, int64_t rows,
                              int64_t cols, float epsilon, int32_t stat_dtype, void* mean, void* inv_std,
                              cudaStream_t s);
// Gather along one axis of data viewed as [outer, axis_len, inner] (elements of elem_size bytes) with n_idx
// indices (I32 or I64; negative ones count from the end). An index out of [-axis_len, axis_len) sets *bad = 1
// (device memory, may be null) and writes zeros.
cudaError_t launch_gather(int32_t elem_size, const void* data, int32_t index_dtype, const void* indices, void* out,
                          int64_t outer, int64_t axis_len, int64_t inner, int64_t n_idx, int32_t* bad, cudaStream_t s);
// Pad: out dims = in dims + begin + end (either may be negative: crops). mode 0 constant (`value`, converted to the
// dtype), 1 reflect, 2 edge.
struct PadDesc {
  int32_t ndim = 0;
  int64_t out_dims[kMaxRank] = {};
  int64_t in_dims[kMaxRank] = {};
  int64_t begin[kMaxRank] = {};
};
cudaError_t launch_pad(int32_t dtype, int32_t elem_size, const void* in, void* out, int64_t n, const PadDesc& p,
                       int32_t mode, double value, cudaStream_t s);
// Resize of x viewed as [outer, in_h, in_w] to [outer, out_h, out_w] (1-D: in_h = out_h = 1). Coordinates in
// double exactly as the reference kernels compute them. coord: 0 half_pixel, 1 pytorch_half_pixel,
// 2 align_corners, 3 asymmetric; nearest: 0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil, 4 simple
// (opset 10: ceil when downscaling, else floor).
struct ResizeDesc {
  int64_t outer = 1, in_h = 1, in_w = 1, out_h = 1, out_w = 1;
  double scale_h = 1, scale_w = 1;
  int32_t coord = 0, nearest = 0;
  bool linear = false;
};
cudaError_t launch_resize(int32_t dtype, const void* x, void* y, const ResizeDesc& d, cudaStream_t s);

}  // namespace keel::cuda
