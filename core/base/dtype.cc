#include "core/base/dtype.h"

#include <cmath>

namespace keel {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
    case DType::kU32: return 4;
    case DType::kF64:
    case DType::kI64:
    case DType::kU64: return 8;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
    case DType::kString:
    case DType::kUndefined: return 0;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kU16: return "u16";
    case DType::kI16: return "i16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kString: return "string";
    case DType::kBool: return "bool";
    case DType::kF16: return "f16";
    case DType::kF64: return "f64";
    case DType::kU32: return "u32";
    case DType::kU64: return "u64";
    case DType::kBF16: return "bf16";
    case DType::kUndefined: return "undefined";
  }
  return "invalid";
}

std::optional<DType> dtype_from_name(std::string_view n) {
  struct Entry {
    const char* a;
    const char* b;
    DType t;
  };
  static const Entry kTable[] = {
      {"f32", "float", DType::kF32},      {"f64", "double", DType::kF64},       {"f16", "float16", DType::kF16},
      {"bf16", "bfloat16", DType::kBF16}, {"i8", "int8", DType::kI8},           {"u8", "uint8", DType::kU8},
      {"i16", "int16", DType::kI16},      {"u16", "uint16", DType::kU16},       {"i32", "int32", DType::kI32},
      {"u32", "uint32", DType::kU32},     {"i64", "int64", DType::kI64},        {"u64", "uint64", DType::kU64},
      {"bool", "bool", DType::kBool},     {"string", "string", DType::kString},
  };
  for (const auto& e : kTable)
    if (n == e.a || n == e.b) return e.t;
  if (n == "float32") return DType::kF32;
  if (n == "float64") return DType::kF64;
  return std::nullopt;
}

bool dtype_is_valid(int32_t v) { return (v >= 1 && v <= 13) || v == 16; }
bool dtype_is_float(DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16; }
bool dtype_is_integer(DType t) {
  switch (t) {
    case DType::kI8:
    case DType::kU8:
    case DType::kI16:
    case DType::kU16:
    case DType::kI32:
    case DType::kU32:
    case DType::kI64:
    case DType::kU64: return true;
    default: return false;
  }
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow (incl. rounding) -> inf
  if (mag < 0x38800000u) {                                               // subnormal or zero in half
    if (mag < 0x33000000u) return static_cast<uint16_t>(sign);           // underflow to zero (< half of min subnormal)
    uint32_t e = mag >> 23;
    uint32_t m = (mag & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // aligns the 24-bit mantissa to the half subnormal's 10 bits
    uint32_t res = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (res & 1u))) res++;
    return static_cast<uint16_t>(sign | res);
  }
  uint32_t res = ((mag - 0x38000000u) >> 13);
  uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) res++;
  return static_cast<uint16_t>(sign | res);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (man == 0) {
      out = sign;
    } else {  // subnormal: normalise
      float f = std::ldexp(static_cast<float>(man), -24);
      std::memcpy(&out, &f, 4);
      out |= sign;
    }
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (man << 13);
  } else {
    out = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace keel
