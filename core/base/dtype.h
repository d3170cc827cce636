// keel/core/base/dtype.h — element types. Values equal the C ABI's keel_dtype_t (= ONNX TensorProto.DataType).
// f16 and bf16 are stored as raw 16-bit patterns; conversion helpers live here. Stateless, thread-safe.
#pragma once

#include <keel/plugin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace keel {

enum class DType : int32_t {
  kUndefined = KEEL_DTYPE_UNDEFINED,
  kF32 = KEEL_DTYPE_F32,
  kU8 = KEEL_DTYPE_U8,
  kI8 = KEEL_DTYPE_I8,
  kU16 = KEEL_DTYPE_U16,
  kI16 = KEEL_DTYPE_I16,
  kI32 = KEEL_DTYPE_I32,
  kI64 = KEEL_DTYPE_I64,
  kString = KEEL_DTYPE_STRING,
  kBool = KEEL_DTYPE_BOOL,
  kF16 = KEEL_DTYPE_F16,
  kF64 = KEEL_DTYPE_F64,
  kU32 = KEEL_DTYPE_U32,
  kU64 = KEEL_DTYPE_U64,
  kBF16 = KEEL_DTYPE_BF16,
};

// Bytes per element; 0 for undefined and string.
size_t dtype_size(DType t);
// "f32", "bf16", "bool", ...
const char* dtype_name(DType t);
// Parses the names dtype_name gives (and "float", "float16", "int64", ... as ONNX spells them).
std::optional<DType> dtype_from_name(std::string_view name);
// True for a value of the keel_dtype_t enum the core supports.
bool dtype_is_valid(int32_t value);
bool dtype_is_float(DType t);    // f16 bf16 f32 f64
bool dtype_is_integer(DType t);  // signed and unsigned integers (not bool)

// IEEE half and bfloat16 conversions (round to nearest even).
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace keel
