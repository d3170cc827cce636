// keel/shape.hpp — header-only C++17 helpers for shapes, dtypes and ONNX window geometry, for plugins and passes.
//
// Pure functions over plain integers and std::vector: no state, nothing that crosses the plugin boundary, safe from
// any thread. Depends on <keel/plugin.h> (the dtype values) and the standard library only.
//
//  - dtype_size: bytes of one element of a keel_dtype_t.
//  - mul_sat / numel: element counts that saturate at INT64_MAX instead of overflowing, so that the shape product of a
//    hostile model stays defined (and too large for any check or allocation that follows).
//  - dims_str: "[1,3,224,224]" for messages.
//  - ONNX Conv / Pool / ConvTranspose window geometry (onnx/defs/nn/defs.cc convPoolShapeInference and
//    ConvTranspose's shape inference): auto_pad parsing, the SAME_UPPER / SAME_LOWER pads, output extents. The
//    functions work on one spatial dimension, so that every caller keeps its own validation and its own way of
//    saying no (a kernel rejects, a reference kernel reports INVALID_ARGUMENT).
#pragma once

#include <keel/plugin.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace keel::sdk {

using Dims = std::vector<int64_t>;

// Bytes of one element of `dtype` (a keel_dtype_t); 0 for dtypes without a fixed size (STRING, UNDEFINED, unknown).
inline size_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case KEEL_DTYPE_U8:
    case KEEL_DTYPE_I8:
    case KEEL_DTYPE_BOOL: return 1;
    case KEEL_DTYPE_U16:
    case KEEL_DTYPE_I16:
    case KEEL_DTYPE_F16:
    case KEEL_DTYPE_BF16: return 2;
    case KEEL_DTYPE_F32:
    case KEEL_DTYPE_I32:
    case KEEL_DTYPE_U32: return 4;
    case KEEL_DTYPE_F64:
    case KEEL_DTYPE_I64:
    case KEEL_DTYPE_U64: return 8;
    default: return 0;
  }
}

// a * b, saturated at INT64_MAX when the product overflows (either sign).
inline int64_t mul_sat(int64_t a, int64_t b) {
#if defined(__GNUC__) || defined(__clang__)
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
#else
  if (a == 0 || b == 0) return 0;
  const int64_t hi = std::numeric_limits<int64_t>::max(), lo = std::numeric_limits<int64_t>::min();
  const bool overflow = a > 0 ? (b > 0 ? a > hi / b : b < lo / a) : (b > 0 ? a < lo / b : a != 0 && b < hi / a);
  return overflow ? hi : a * b;
#endif
}

// Element count of a shape: 0 when any dimension is 0, else the product of the dimensions saturated at INT64_MAX
// (mul_sat). A rank-0 shape has one element. Unknown (-1) dimensions are multiplied like any other.
inline int64_t numel(const int64_t* dims, size_t ndim) {
  for (size_t i = 0; i < ndim; ++i)
    if (dims[i] == 0) return 0;
  int64_t n = 1;
  for (size_t i = 0; i < ndim; ++i) n = mul_sat(n, dims[i]);
  return n;
}
inline int64_t numel(const Dims& dims) { return numel(dims.data(), dims.size()); }
// Element count of a tensor view (its ndim dims); 0 for a negative ndim (rank unknown).
inline int64_t numel(const keel_tensor_t& t) { return t.ndim < 0 ? 0 : numel(t.dims, static_cast<size_t>(t.ndim)); }

// "[d0,d1,...]".
inline std::string dims_str(const Dims& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(d[i]);
  }
  return s + "]";
}

// ------------------------------------------------------------------------------------------------ ONNX windows

// ONNX's auto_pad attribute. kUnknown: a value ONNX does not define.
enum class AutoPad { kNotSet, kValid, kSameUpper, kSameLower, kUnknown };

// "" and "NOTSET" are kNotSet (ONNX's default).
inline AutoPad auto_pad_of(std::string_view s) {
  if (s.empty() || s == "NOTSET") return AutoPad::kNotSet;
  if (s == "VALID") return AutoPad::kValid;
  if (s == "SAME_UPPER") return AutoPad::kSameUpper;
  if (s == "SAME_LOWER") return AutoPad::kSameLower;
  return AutoPad::kUnknown;
}
inline bool is_same(AutoPad a) { return a == AutoPad::kSameUpper || a == AutoPad::kSameLower; }

// Extent of a kernel of `kernel` taps with dilation `dilation`.
inline int64_t dilated_extent(int64_t kernel, int64_t dilation) { return (kernel - 1) * dilation + 1; }

// The begin / end pads of one spatial dimension under SAME_UPPER or SAME_LOWER (Conv, pools): the output keeps
// ceil(in / stride) positions; the total padding is split in two, the odd one at the end (UPPER) or the begin
// (LOWER). `extent` is the dilated kernel extent; `stride` > 0. For any other auto_pad both pads are 0.
inline void same_pads(AutoPad a, int64_t in, int64_t extent, int64_t stride, int64_t* begin, int64_t* end) {
  *begin = *end = 0;
  if (!is_same(a)) return;
  const int64_t residual = stride > 1 ? in % stride : 0;
  int64_t total = residual == 0 ? extent - stride : extent - residual;
  if (total < 0) total = 0;
  const int64_t small = total >> 1, big = total - small;
  *begin = a == AutoPad::kSameUpper ? small : big;
  *end = a == AutoPad::kSameUpper ? big : small;
}

// Output positions of a window of `extent` sliding by `stride` (> 0) over `in` plus `pads` (begin + end) of padding:
// 1 + floor(span / stride), or ceil with ceil_mode (pools). -1 when the window is larger than the padded input.
inline int64_t window_output(int64_t in, int64_t pads, int64_t extent, int64_t stride, bool ceil_mode = false) {
  const int64_t span = in + pads - extent;
  if (span < 0) return -1;
  return 1 + (ceil_mode ? (span + stride - 1) / stride : span / stride);
}

// ConvTranspose: the full output extent of one spatial dimension before pads are taken off,
// stride * (in - 1) + output_padding + extent.
inline int64_t transposed_extent(int64_t in, int64_t stride, int64_t output_padding, int64_t extent) {
  return stride * (in - 1) + output_padding + extent;
}
// ConvTranspose with an output_shape or SAME auto_pad: splits the total padding `total` (transposed_extent minus the
// target output extent; it may be negative) into begin / end pads: SAME_UPPER puts the odd one at the end, every
// other auto_pad (SAME_LOWER, or NOTSET with output_shape) at the begin. Halves round towards minus infinity.
inline void transposed_pads(AutoPad a, int64_t total, int64_t* begin, int64_t* end) {
  const int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2);
  if (a == AutoPad::kSameUpper) {
    *begin = half;
    *end = total - half;
  } else {
    *end = half;
    *begin = total - half;
  }
}

}  // namespace keel::sdk
