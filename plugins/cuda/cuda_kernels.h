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
  kRelu, kSigmoid, kTanh, kExp, kLog, kNeg, kAbs, kSqrt, kReciprocal, kErf, kLeakyRelu, kElu, kHardSigmoid,
  kSoftplus, kSoftsign, kSin, kCos, kFloor, kCeil, kHardSwish, kSelu, kGeluErf, kGeluTanh,
};
enum class Binary : int32_t { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin };

// y = op(x) over n elements; dtype F32, F16 or BF16. alpha/beta: the op's attributes (LeakyRelu, Elu, ...).
cudaError_t launch_unary(Unary op, int32_t dtype, const void* x, void* y, int64_t n, float alpha, float beta,
                         float gamma, cudaStream_t s);
// y = a op b; `st` describes y's dims with strides for a (operand 0) and b (operand 1). `same_shape` = no broadcast.
cudaError_t launch_binary(Binary op, int32_t dtype, const void* a, const void* b, void* y, int64_t n,
                          const Strided& st, bool same_shape, cudaStream_t s);
// y = cond ? x : yv, elements of `elem_size` bytes; operands 0 = cond (bytes), 1 = x, 2 = y.
cudaError_t launch_where(int32_t elem_size, const uint8_t* cond, const void* x, const void* yv, void* out, int64_t n,
                         const Strided& st, cudaStream_t s);
// Softmax (or LogSoftmax) over the last of [rows, cols], dtype F32, F16 or BF16.
cudaError_t launch_softmax(int32_t dtype, const void* x, void* y, int64_t rows, int64_t cols, bool log,
                           cudaStream_t s);
// out[i] = in[strided offset of i] (operand 0): Transpose, Expand-like broadcasts. elem_size 1, 2, 4 or 8.
cudaError_t launch_strided_copy(int32_t elem_size, const void* in, void* out, int64_t n, const Strided& st,
                                cudaStream_t s);
// Element-wise conversion between F32, F16, BF16, F64, I8, U8, I16, I32, I64, BOOL. Returns cudaErrorInvalidValue
// for a pair it does not handle (checked beforehand with cast_supported).
bool cast_supported(int32_t dtype);
cudaError_t launch_cast(int32_t src_dtype, const void* x, int32_t dst_dtype, void* y, int64_t n, cudaStream_t s);

}  // namespace keel::cuda
