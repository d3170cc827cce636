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

}  // namespace keel::serve
