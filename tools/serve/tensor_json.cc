// keel/tools/serve/tensor_json.cc — KServe v2 JSON tensors (see tensor_json.h).
#include "tools/serve/tensor_json.h"

#include <limits>
#include <type_traits>

namespace keel::serve {

using json = nlohmann::json;

namespace {

// FP16 and BF16 elements: 16-bit patterns in memory, numbers in JSON.
struct Half {
  uint16_t bits;
};
struct BFloat {
  uint16_t bits;
};

// Calls f(T{}) with the C++ element type of `t` (Half / BFloat for the 16-bit floats); false for dtypes without one.
template <typename F>
bool visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kBool: f(bool{}); return true;
    case DType::kU8: f(uint8_t{}); return true;
    case DType::kU16: f(uint16_t{}); return true;
    case DType::kU32: f(uint32_t{}); return true;
    case DType::kU64: f(uint64_t{}); return true;
    case DType::kI8: f(int8_t{}); return true;
    case DType::kI16: f(int16_t{}); return true;
    case DType::kI32: f(int32_t{}); return true;
    case DType::kI64: f(int64_t{}); return true;
    case DType::kF16: f(Half{}); return true;
    case DType::kBF16: f(BFloat{}); return true;
    case DType::kF32: f(float{}); return true;
    case DType::kF64: f(double{}); return true;
    default: return false;
  }
}

template <typename T>
bool convert_leaf(const json& v, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) {
      out = v.get<bool>();
      return true;
    }
    if (v.is_number_integer()) {
      auto i = v.get<int64_t>();
      out = i != 0;
      return i == 0 || i == 1;
    }
    return false;
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat>) {
    if (!v.is_number()) return false;
    const float f = static_cast<float>(v.get<double>());
    out.bits = std::is_same_v<T, Half> ? f32_to_f16(f) : f32_to_bf16(f);
    return true;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return false;
    out = static_cast<T>(v.get<double>());
    return true;
  } else {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      out = static_cast<T>(u);
      return true;
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (i < 0 || static_cast<uint64_t>(i) > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      } else {
        if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) return false;
      }
      out = static_cast<T>(i);
      return true;
    }
    return false;
  }
}

template <typename T>
bool fill_leaves(const json& data, T*& dst) {
  if (data.is_array()) {
    for (const auto& e : data)
      if (!fill_leaves(e, dst)) return false;
    return true;
  }
  return convert_leaf(data, *dst++);
}

}  // namespace

const char* kserve_name(DType t) {
  switch (t) {
    case DType::kBool: return "BOOL";
    case DType::kU8: return "UINT8";
    case DType::kU16: return "UINT16";
    case DType::kU32: return "UINT32";
    case DType::kU64: return "UINT64";
    case DType::kI8: return "INT8";
    case DType::kI16: return "INT16";
    case DType::kI32: return "INT32";
    case DType::kI64: return "INT64";
    case DType::kF16: return "FP16";
    case DType::kF32: return "FP32";
    case DType::kF64: return "FP64";
    case DType::kBF16: return "BF16";
    case DType::kString: return "BYTES";
    default: return "UNDEFINED";
  }
}

std::optional<DType> from_kserve_name(const std::string& s) {
  for (DType t : {DType::kBool, DType::kU8, DType::kU16, DType::kU32, DType::kU64, DType::kI8, DType::kI16, DType::kI32,
                  DType::kI64, DType::kF16, DType::kF32, DType::kF64, DType::kBF16})
    if (s == kserve_name(t)) return t;
  return std::nullopt;
}

bool count_leaves(const json& data, uint64_t& n) {
  if (data.is_array()) {
    for (const auto& e : data)
      if (!count_leaves(e, n)) return false;
    return true;
  }
  if (data.is_number() || data.is_boolean()) {
    ++n;
    return true;
  }
  return false;
}

bool fill_tensor(const json& data, Tensor& t) {
  bool ok = false;
  const bool known = visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw_data());
    ok = fill_leaves<T>(data, p);
  });
  return known && ok;
}

json to_json_data(const Tensor& t) {
  json out = json::array();
  const int64_t n = t.numel();
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, Half>) out.push_back(f16_to_f32(p[i].bits));
      else if constexpr (std::is_same_v<T, BFloat>) out.push_back(bf16_to_f32(p[i].bits));
      else out.push_back(p[i]);
    }
  });
  return out;
}

}  // namespace keel::serve
