// keel/core/runtime/onnx_tensor_files.cc — Tensor and value files: ONNX TensorProto / SequenceProto / OptionalProto
// .pb files and NumPy .npy.
#include "core/runtime/onnx_io.h"

#include <onnx/onnx_pb.h>  // first: it defines ONNX_API, which onnx-data.pb.h uses

#include <onnx/onnx-data.pb.h>

#include <charconv>
#include <climits>
#include <cstring>
#include <fstream>
#include <optional>

#include "core/base/log.h"
#include "core/runtime/onnx_io_internal.h"

namespace keel {
namespace fs = std::filesystem;
using onnx_detail::FileBytes;
using onnx_detail::read_file_bytes;

StatusOr<Tensor> read_tensor_pb(const void* data, size_t size, std::string* name) {
  if (size > static_cast<size_t>(INT_MAX)) return invalid_argument("tensor file over 2 GiB");
  onnx::TensorProto p;
  try {
    if (!p.ParseFromArray(data, static_cast<int>(size))) return invalid_argument("not a valid ONNX TensorProto");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("not a valid ONNX TensorProto: ") + e.what());
  }
  if (p.data_location() == onnx::TensorProto::EXTERNAL)
    return invalid_argument("tensor files with external data are not supported");
  if (name) *name = p.name();
  return tensor_from_proto(p, {}, uint64_t{1} << 36);
}

namespace {

// Finds `'key': value` in a NumPy header dict; returns the raw value text (up to the next top-level comma or brace).
std::optional<std::string> npy_field(const std::string& header, const std::string& key) {
  for (const char q : {'\'', '"'}) {
    std::string k = std::string(1, q) + key + std::string(1, q);
    size_t pos = header.find(k);
    if (pos == std::string::npos) continue;
    pos = header.find(':', pos + k.size());
    if (pos == std::string::npos) return std::nullopt;
    ++pos;
    while (pos < header.size() && header[pos] == ' ') ++pos;
    if (pos >= header.size()) return std::nullopt;
    if (header[pos] == '(') {
      size_t end = header.find(')', pos);
      if (end == std::string::npos) return std::nullopt;
      return header.substr(pos, end - pos + 1);
    }
    if (header[pos] == '\'' || header[pos] == '"') {
      size_t end = header.find(header[pos], pos + 1);
      if (end == std::string::npos) return std::nullopt;
      return header.substr(pos + 1, end - pos - 1);
    }
    size_t end = header.find_first_of(",}", pos);
    if (end == std::string::npos) return std::nullopt;
    std::string v = header.substr(pos, end - pos);
    while (!v.empty() && v.back() == ' ') v.pop_back();
    return v;
  }
  return std::nullopt;
}

}  // namespace

StatusOr<Tensor> read_npy(const void* data, size_t size) {
  const auto* b = static_cast<const unsigned char*>(data);
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) return invalid_argument("not a NumPy .npy file (bad magic)");
  const int major = b[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = b[8] | (size_t{b[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return invalid_argument("truncated .npy header");
    header_len = b[8] | (size_t{b[9]} << 8) | (size_t{b[10]} << 16) | (size_t{b[11]} << 24);
    header_start = 12;
  } else {
    return invalid_argument(".npy format version " + std::to_string(major) + " is not supported");
  }
  if (header_len > size - header_start) return invalid_argument("truncated .npy header");
  std::string header(reinterpret_cast<const char*>(b + header_start), header_len);
  auto descr = npy_field(header, "descr");
  auto fortran = npy_field(header, "fortran_order");
  auto shape_text = npy_field(header, "shape");
  if (!descr || !shape_text) return invalid_argument(".npy header lacks descr or shape: " + header);
  if (fortran && *fortran != "False") return unimplemented(".npy files in Fortran order are not supported");
  if (descr->size() < 3) return invalid_argument(".npy dtype '" + *descr + "' is not understood");
  const char endian = (*descr)[0];
  const std::string kind = descr->substr(1);
  static const std::map<std::string, DType> kTypes = {{"f2", DType::kF16}, {"f4", DType::kF32}, {"f8", DType::kF64},
                                                      {"i1", DType::kI8},  {"i2", DType::kI16}, {"i4", DType::kI32},
                                                      {"i8", DType::kI64}, {"u1", DType::kU8},  {"u2", DType::kU16},
                                                      {"u4", DType::kU32}, {"u8", DType::kU64}, {"b1", DType::kBool}};
  auto it = kTypes.find(kind);
  if (it == kTypes.end()) return unimplemented(".npy dtype '" + *descr + "' is not supported");
  const DType dtype = it->second;
  if (endian == '>' && dtype_size(dtype) > 1) return unimplemented(".npy big-endian data is not supported");
  if (endian != '<' && endian != '|' && endian != '=' && endian != '>') {
    return invalid_argument(".npy dtype '" + *descr + "' is not understood");
  }
  Shape shape;
  std::string s = *shape_text;
  if (s.size() < 2 || s.front() != '(' || s.back() != ')')
    return invalid_argument(".npy shape '" + s + "' is not a tuple");
  s = s.substr(1, s.size() - 2);
  size_t pos = 0;
  while (pos < s.size()) {
    while (pos < s.size() && (s[pos] == ' ' || s[pos] == ',')) ++pos;
    if (pos >= s.size()) break;
    size_t end = pos;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    if (end == pos) return invalid_argument(".npy shape '" + *shape_text + "' is not understood");
    int64_t d = 0;
    auto [p, ec] = std::from_chars(s.data() + pos, s.data() + end, d);
    if (ec != std::errc()) return invalid_argument(".npy shape '" + *shape_text + "' is too large");
    (void)p;
    shape.push_back(d);
    while (end < s.size() && s[end] == 'L') ++end;  // Python 2 longs
    pos = end;
  }
  KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape, uint64_t{1} << 36), ".npy");
  const size_t data_start = header_start + header_len;
  if (size - data_start < bytes) {
    return invalid_argument(".npy data has " + std::to_string(size - data_start) + " bytes; shape " +
                            shape_to_string(shape) + " needs " + std::to_string(bytes));
  }
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, shape), ".npy");
  if (bytes) std::memcpy(t.raw_data(), b + data_start, bytes);
  return t;
}

StatusOr<Tensor> read_tensor_file(const fs::path& file, std::string* name) {
  if (name) name->clear();
  KEEL_ASSIGN_OR_RETURN(FileBytes bytes, read_file_bytes(file, uint64_t{1} << 36, "tensor file"), "read_tensor_file");
  StatusOr<Tensor> t =
      (file.extension() == ".npy" || (bytes.size() >= 6 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0))
          ? read_npy(bytes.data(), bytes.size())
          : read_tensor_pb(bytes.data(), bytes.size(), name);
  if (!t.is_ok()) return t.status().with_context(file.string());
  return t;
}

namespace {

constexpr uint64_t kMaxTensorFileBytes = uint64_t{1} << 36;

StatusOr<RunValue> sequence_from_proto(const onnx::SequenceProto& p) {
  if (p.elem_type() != onnx::SequenceProto::TENSOR && p.elem_type() != onnx::SequenceProto::UNDEFINED) {
    return unimplemented("sequence '" + p.name() + "': only sequences of tensors are supported");
  }
  std::vector<Tensor> items;
  DType dtype = DType::kUndefined;
  for (const auto& tp : p.tensor_values()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(tp, {}, kMaxTensorFileBytes), "sequence '" + p.name() + "'");
    dtype = t.dtype();
    items.push_back(std::move(t));
  }
  return RunValue::of_sequence(std::move(items), dtype);
}

Status sequence_to_proto(const RunValue& v, const std::string& name, onnx::SequenceProto& p) {
  p.set_name(name);
  p.set_elem_type(onnx::SequenceProto::TENSOR);
  for (const auto& t : v.sequence)
    KEEL_RETURN_IF_ERROR(tensor_to_proto(t, "", *p.add_tensor_values()), "sequence '" + name + "'");
  return Status::ok();
}

template <typename Proto>
Status parse_proto(Proto& p, const void* data, size_t size, const char* what) {
  if (size > static_cast<size_t>(INT_MAX)) return invalid_argument(std::string(what) + " file over 2 GiB");
  try {
    if (!p.ParseFromArray(data, static_cast<int>(size)))
      return invalid_argument(std::string("not a valid ONNX ") + what);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("not a valid ONNX ") + what + ": " + e.what());
  }
  return Status::ok();
}

}  // namespace

StatusOr<RunValue> read_value_pb(const void* data, size_t size, const ValueInfo* declared, std::string* name) {
  if (!declared || declared->is_tensor()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, read_tensor_pb(data, size, name), "");
    return RunValue(std::move(t));
  }
  if (declared->containers[0] == ValueKind::kSequence) {
    onnx::SequenceProto p;
    KEEL_RETURN_IF_ERROR(parse_proto(p, data, size, "SequenceProto"), "");
    if (name) *name = p.name();
    return sequence_from_proto(p);
  }
  onnx::OptionalProto p;
  KEEL_RETURN_IF_ERROR(parse_proto(p, data, size, "OptionalProto"), "");
  if (name) *name = p.name();
  switch (p.elem_type()) {
    case onnx::OptionalProto::UNDEFINED: return RunValue::none();
    case onnx::OptionalProto::TENSOR: {
      if (!p.has_tensor_value()) return RunValue::none();
      KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(p.tensor_value(), {}, kMaxTensorFileBytes),
                            "optional '" + p.name() + "'");
      return RunValue(std::move(t));
    }
    case onnx::OptionalProto::SEQUENCE:
      if (!p.has_sequence_value()) return RunValue::none();
      return sequence_from_proto(p.sequence_value());
    default: return unimplemented("optional '" + p.name() + "': only optional tensors and sequences are supported");
  }
}

StatusOr<RunValue> read_value_file(const fs::path& file, const ValueInfo* declared, std::string* name) {
  if (name) name->clear();
  if (!declared || declared->is_tensor()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, read_tensor_file(file, name), "");
    return RunValue(std::move(t));
  }
  KEEL_ASSIGN_OR_RETURN(FileBytes bytes, read_file_bytes(file, kMaxTensorFileBytes, "value file"), "read_value_file");
  auto v = read_value_pb(bytes.data(), bytes.size(), declared, name);
  if (!v.is_ok()) return v.status().with_context(file.string());
  return v;
}

Status write_value_pb(const RunValue& value, const ValueInfo* declared, const fs::path& file, const std::string& name) {
  std::string bytes;
  const bool optional = declared && !declared->containers.empty() && declared->containers[0] == ValueKind::kOptional;
  if (optional) {
    onnx::OptionalProto p;
    p.set_name(name);
    if (value.is_tensor()) {
      p.set_elem_type(onnx::OptionalProto::TENSOR);
      KEEL_RETURN_IF_ERROR(tensor_to_proto(value.tensor, "", *p.mutable_tensor_value()), "write_value_pb");
    } else if (value.is_sequence()) {
      p.set_elem_type(onnx::OptionalProto::SEQUENCE);
      KEEL_RETURN_IF_ERROR(sequence_to_proto(value, "", *p.mutable_sequence_value()), "write_value_pb");
    } else {
      const bool seq = declared->containers.size() > 1 && declared->containers[1] == ValueKind::kSequence;
      p.set_elem_type(seq ? onnx::OptionalProto::SEQUENCE : onnx::OptionalProto::TENSOR);
    }
    if (!p.SerializeToString(&bytes)) return internal_error("write_value_pb: serialisation failed (over 2 GiB?)");
  } else if (value.is_sequence()) {
    onnx::SequenceProto p;
    KEEL_RETURN_IF_ERROR(sequence_to_proto(value, name, p), "write_value_pb");
    if (!p.SerializeToString(&bytes)) return internal_error("write_value_pb: serialisation failed (over 2 GiB?)");
  } else if (value.is_tensor()) {
    return write_tensor_pb(value.tensor, file, name);
  } else {
    return invalid_argument("write_value_pb: '" + name + "' holds " + value.describe() + " but is not optional");
  }
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("write_value_pb: cannot open '" + file.string() + "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return internal_error("write_value_pb: writing '" + file.string() + "' failed");
  return Status::ok();
}

Status write_tensor_pb(const Tensor& tensor, const fs::path& file, const std::string& name) {
  onnx::TensorProto p;
  KEEL_RETURN_IF_ERROR(tensor_to_proto(tensor, name, p), "write_tensor_pb");
  std::string bytes;
  if (!p.SerializeToString(&bytes)) return internal_error("write_tensor_pb: serialisation failed (over 2 GiB?)");
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("write_tensor_pb: cannot open '" + file.string() + "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return internal_error("write_tensor_pb: writing '" + file.string() + "' failed");
  return Status::ok();
}

}  // namespace keel
