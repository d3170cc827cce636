// keel/tools/serve/tensor_json.cc — KServe v2 JSON tensors (see tensor_json.h).
#include "tools/serve/tensor_json.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
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

namespace {

// What each byte is to the array scanner: one table lookup per byte (a chain of comparisons per byte made scanning
// 60 KB of numbers take about 0.1 ms).
enum ByteClass : uint8_t { kOther, kSpace, kToken, kOpen, kClose, kComma };
constexpr std::array<uint8_t, 256> make_byte_classes() {
  std::array<uint8_t, 256> t{};
  for (char c : std::string_view("0123456789-+.eEtrufals")) t[static_cast<uint8_t>(c)] = kToken;
  for (char c : std::string_view(" \t\n\r")) t[static_cast<uint8_t>(c)] = kSpace;
  t['['] = kOpen;
  t[']'] = kClose;
  t[','] = kComma;
  return t;
}
constexpr std::array<uint8_t, 256> kByteClass = make_byte_classes();
uint8_t byte_class(char c) { return kByteClass[static_cast<uint8_t>(c)]; }
bool space(char c) { return byte_class(c) == kSpace; }

// Whether `tok` is a JSON value the scanner may lift: true, false, or a number in JSON's grammar
// (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?). Anything else ("01", "1.", ".5", "+1", "tru") leaves its array
// in the text, where the general parser refuses the request as it would have without the lifting.
bool json_value_token(std::string_view tok) {
  const char* p = tok.data();
  const char* const e = p + tok.size();
  if (p == e) return false;
  if (*p == 't') return tok == "true";
  if (*p == 'f') return tok == "false";
  auto digit = [&] { return p < e && static_cast<unsigned>(*p - '0') < 10u; };
  if (*p == '-') ++p;
  if (!digit()) return false;
  const char* const int_start = p;
  if (*p == '0') ++p;
  else
    while (digit()) ++p;
  const ptrdiff_t int_digits = p - int_start;
  if (p < e && *p == '.') {
    ++p;
    if (!digit()) return false;
    while (digit()) ++p;
  }
  int64_t exponent = 0;
  if (p < e && (*p == 'e' || *p == 'E')) {
    ++p;
    if (p < e && (*p == '+' || *p == '-')) ++p;
    if (!digit()) return false;
    while (digit()) exponent = std::min<int64_t>(exponent * 10 + (*p++ - '0'), 100000);
  }
  if (p != e) return false;
  // nlohmann-json refuses a number beyond double's range (strtod's infinity) as a parse error of the whole text: so
  // must the lifter, for the rare tokens that may be one (a large exponent or a long integer part).
  if (exponent + int_digits > 300) {
    const std::string copy(tok);
    return !std::isinf(std::strtod(copy.c_str(), nullptr));
  }
  return true;
}

// Parses the array starting at body[i] == '['; on success returns the index after its ']' and appends its tokens.
// Only JSON numbers, true and false (json_value_token), commas, brackets and whitespace, in JSON's array grammar,
// nested at most max_depth deep (the array itself counts 1).
size_t scan_array(std::string_view body, size_t i, int max_depth, std::vector<std::string_view>& tokens) {
  int depth = 0;
  bool need_value = true, may_close = true;  // after '[': a value or ']'; after ',': a value; after a value: ',' or ']'
  const char* const data = body.data();
  const size_t size = body.size();
  while (i < size) {
    switch (byte_class(data[i])) {
      case kSpace: ++i; break;
      case kOpen:
        if (!need_value || depth == max_depth) return 0;
        ++depth;
        ++i;
        need_value = true;
        may_close = true;
        break;
      case kClose:
        if (need_value && !may_close) return 0;
        --depth;
        ++i;
        need_value = false;
        may_close = true;
        if (depth == 0) return i;
        break;
      case kComma:
        if (need_value) return 0;
        ++i;
        need_value = true;
        may_close = false;
        break;
      case kToken: {
        if (!need_value) return 0;
        const size_t start = i;
        while (i < size && byte_class(data[i]) == kToken) ++i;
        tokens.emplace_back(data + start, i - start);
        if (!json_value_token(tokens.back())) return 0;
        need_value = false;
        may_close = true;
        break;
      }
      default: return 0;
    }
  }
  return 0;
}

// A lifted token (json_value_token) as a T, with the general path's conversions (convert_leaf): what nlohmann-json
// reads the token as, then converted the same way.
template <typename T>
bool parse_token(std::string_view tok, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (tok == "true" || tok == "1") out = true;
    else if (tok == "false" || tok == "0" || tok == "-0") out = false;  // "-0" is the integer 0 to the general path
    else return false;
    return true;
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat>) {
    float f = 0;
    if (!parse_token(tok, f)) return false;
    out.bits = std::is_same_v<T, Half> ? f32_to_f16(f) : f32_to_bf16(f);
    return true;
  } else {
    // JSON numbers only: a sign is '-' alone, never "true"/"false" for a number.
    if (tok.empty() || !(tok[0] == '-' || (tok[0] >= '0' && tok[0] <= '9'))) return false;
    if constexpr (std::is_floating_point_v<T>) {
      double d = 0;  // via double, as the general path reads numbers
      auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), d);
      if (ec == std::errc::result_out_of_range) {
        // Beyond double's range either way: the general path (strtod) refuses an overflow and reads an underflow as
        // the nearest double (0, or a subnormal from_chars also calls out of range).
        const std::string copy(tok);
        char* end = nullptr;
        d = std::strtod(copy.c_str(), &end);
        if (end != copy.c_str() + copy.size() || std::isinf(d)) return false;
      } else if (ec != std::errc() || p != tok.data() + tok.size()) {
        return false;
      }
      out = static_cast<T>(d);
      return true;
    } else {
      if constexpr (std::is_unsigned_v<T>) {
        if (tok == "-0") {  // the integer 0 to the general path
          out = 0;
          return true;
        }
      }
      auto [p, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), out);
      return ec == std::errc() && p == tok.data() + tok.size();  // out of range, a fraction or an exponent: false
    }
  }
}

}  // namespace

LiftedData lift_data_arrays(std::string_view body, int max_depth) {
  LiftedData out;
  // The placeholder's key is new for every request (64 random bits), so that a request cannot write one itself and
  // name another input's array: such an object stays an object, refused as the general path refuses it.
  static constexpr char kHex[] = "0123456789abcdef";
  thread_local std::random_device entropy;  // opened once per thread: its construction cost 1.3% of a request's CPU
  uint64_t nonce = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  out.key = "__keel_data_";
  for (int k = 0; k < 16; ++k, nonce >>= 4) out.key += kHex[nonce & 15];
  out.key += "__";
  static constexpr std::string_view kKey = "\"data\"";
  size_t copied = 0;
  bool in_string = false, escaped = false;
  int depth = 0;  // of the text around the arrays
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (c != '"') continue;
    if (body.compare(i, kKey.size(), kKey) != 0) {
      in_string = true;
      continue;
    }
    size_t j = i + kKey.size();
    while (j < body.size() && space(body[j])) ++j;
    if (j >= body.size() || body[j] != ':') {
      i += kKey.size() - 1;
      continue;
    }
    ++j;
    while (j < body.size() && space(body[j])) ++j;
    std::vector<std::string_view> tokens;
    const size_t end = j < body.size() && body[j] == '[' ? scan_array(body, j, max_depth - depth, tokens) : 0;
    if (end == 0) {  // not a plain numeric array: the general path reads it
      i += kKey.size() - 1;
      continue;
    }
    out.text.append(body.substr(copied, j - copied));
    out.text += "{\"" + out.key + "\": " + std::to_string(out.arrays.size()) + "}";
    out.arrays.push_back(std::move(tokens));
    copied = end;
    i = end - 1;
  }
  out.text.append(body.substr(copied));
  return out;
}

int64_t lifted_index(const json& data, const LiftedData& lifted) {
  if (lifted.key.empty() || !data.is_object() || data.size() != 1 || !data.contains(lifted.key)) return -1;
  const json& k = data[lifted.key];
  return k.is_number_unsigned() ? static_cast<int64_t>(k.get<uint64_t>()) : -1;
}

bool fill_tensor_from_tokens(const std::vector<std::string_view>& tokens, Tensor& t) {
  bool ok = true;
  const bool known = visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw_data());
    for (size_t i = 0; ok && i < tokens.size(); ++i) ok = parse_token(tokens[i], p[i]);
  });
  return known && ok;
}

StatusOr<Tensor> decode_data(const json& data, const LiftedData& lifted, DType dtype, const Shape& shape) {
  const uint64_t numel = static_cast<uint64_t>(shape_numel(shape));
  const std::string dt = kserve_name(dtype);
  auto count_error = [&](uint64_t n) {
    return invalid_argument("shape " + shape_to_string(shape) + " has " + std::to_string(numel) +
                            " elements but `data` has " + std::to_string(n));
  };
  if (const int64_t li = lifted_index(data, lifted); li >= 0) {
    if (static_cast<uint64_t>(li) >= lifted.arrays.size()) return invalid_argument("malformed `data`");
    const auto& tokens = lifted.arrays[static_cast<size_t>(li)];
    if (tokens.size() != numel) return count_error(tokens.size());
    KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host_uninitialized(dtype, shape), "`data`");  // all written, or dropped
    if (!fill_tensor_from_tokens(tokens, t)) return invalid_argument("`data` has a value that is not a " + dt);
    return t;
  }
  uint64_t leaves = 0;
  if (!count_leaves(data, leaves)) return invalid_argument("`data` must hold numbers or booleans");
  if (leaves != numel) return count_error(leaves);
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host_uninitialized(dtype, shape), "`data`");
  if (!fill_tensor(data, t)) return invalid_argument("`data` has a value that is not a " + dt);
  return t;
}

}  // namespace keel::serve
