// keel/tools/serve/tensor_json.h — tensors in KServe v2 JSON: datatype names, `data` (flat or nested) to a host
// tensor and back. Only plain numbers and booleans are read: nothing in a request becomes anything but a tensor.
//
// Every dtype Keel runs has a JSON form: booleans, integers (range-checked: 300 is not a UINT8, 1.5 not an INT64),
// FP32/FP64, and FP16/BF16 (numbers, rounded to nearest even; the binary extension carries their raw bits).
// Stateless and thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/tensor.h"

namespace keel::serve {

// "FP32", "INT64", "BOOL", ... ("BYTES" for strings, which are not served; "UNDEFINED" for others).
const char* kserve_name(DType t);
// The dtype of a KServe datatype name, for the dtypes served (not BYTES).
std::optional<DType> from_kserve_name(const std::string& s);

// Counts the leaves of (possibly nested) `data`; false when something is neither an array, a number nor a boolean.
bool count_leaves(const nlohmann::json& data, uint64_t& n);
// Writes the leaves of `data` into `t` (already sized: count_leaves(data) == t.numel()); false when a value does
// not fit the dtype.
bool fill_tensor(const nlohmann::json& data, Tensor& t);
// The tensor's elements as a flat JSON array.
nlohmann::json to_json_data(const Tensor& t);

// The fast path for large JSON tensors. nlohmann-json builds a tree node per number (60 KB of floats: milliseconds);
// lift_data_arrays() takes every `"data": [...]` whose content is only JSON numbers, true/false and nested arrays out
// of the text first (checking the array grammar and each number's), keeps each number's text, and leaves
// {"<key>": K} in its place (the key random per call); the rest, now small, is parsed as usual and
// fill_tensor_from_tokens() converts the kept numbers with std::from_chars. Arrays with anything else (strings, null,
// objects, bad grammar, a number JSON does not allow such as 01 or 1.) stay in the text and take the general path
// with its errors. Both paths accept the same requests and read the same values (checked by a differential fuzzer,
// tests/serve/tensor_json_test.cc), the lifted one in a fraction of the time.
struct LiftedData {
  std::string text;                                   // the request with the lifted arrays replaced
  std::vector<std::vector<std::string_view>> arrays;  // the number tokens of array K, views into the body
  std::string key;                                    // the placeholders' key ("" when none could be left)
};
// An array that would nest the document deeper than max_depth stays in the text, so that a depth check of the
// returned text (which the server runs instead of one of the whole body) also bounds the lifted arrays.
LiftedData lift_data_arrays(std::string_view body, int max_depth);
// The K of a placeholder {"<lifted.key>": K} that lift_data_arrays left, or -1 (for anything else, including a
// request's own look-alike).
int64_t lifted_index(const nlohmann::json& data, const LiftedData& lifted);
// Writes the tokens into `t` (tokens.size() == t.numel()); false when one is not a value of the dtype (a fraction or
// an exponent for an integer, out of range, a boolean for a number, ...), as fill_tensor() would refuse the same
// numbers parsed by nlohmann-json.
bool fill_tensor_from_tokens(const std::vector<std::string_view>& tokens, Tensor& t);

// A request input's `data` (from the JSON parsed out of lifted.text) as a host tensor of `dtype` and `shape`: the
// lifted array it names, or its own leaves (flat or nested). The element count is checked before anything is
// allocated. INVALID_ARGUMENT saying what is wrong (the counts, a value not of the dtype, something that is not a
// number); the allocation's error when the tensor cannot be had.
StatusOr<Tensor> decode_data(const nlohmann::json& data, const LiftedData& lifted, DType dtype, const Shape& shape);

}  // namespace keel::serve
