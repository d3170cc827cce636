// keel/core/runtime/onnx_tensor_proto.cc — TensorProto <-> Tensor: every dtype Keel holds, raw and typed fields,
// external data (resolved inside the model's directory only) and sizes checked before anything is allocated.
#include "core/runtime/onnx_io.h"

#include <onnx/onnx_pb.h>

#include <charconv>
#include <climits>
#include <cstring>
#include <fstream>
#include <system_error>

#include "core/base/log.h"

namespace keel {
namespace fs = std::filesystem;

namespace {

bool is_supported_dtype(int32_t t) { return dtype_is_valid(t) && t != KEEL_DTYPE_STRING && t != KEEL_DTYPE_UNDEFINED; }

std::string tensor_label(const onnx::TensorProto& p) {
  return p.name().empty() ? std::string("tensor") : "tensor '" + p.name() + "'";
}

bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Resolves an external-data location against the model's directory; refuses anything that leaves it.
StatusOr<fs::path> resolve_external_location(const fs::path& base_dir, const std::string& location) {
  if (base_dir.empty()) return invalid_argument("external data '" + location + "' but the model has no directory");
  if (location.empty()) return invalid_argument("external data with an empty location");
  if (location.find('\0') != std::string::npos) return invalid_argument("external data location contains a NUL byte");
  fs::path loc(location);
  if (loc.is_absolute() || loc.has_root_name() || loc.has_root_directory()) {
    return invalid_argument("external data location '" + location +
                            "' is absolute; it must be relative to the model's directory");
  }
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::absolute(base_dir, ec), ec);
  if (ec) return invalid_argument("cannot resolve the model directory '" + base_dir.string() + "': " + ec.message());
  fs::path full = fs::weakly_canonical(base / loc, ec);
  if (ec) return invalid_argument("cannot resolve external data location '" + location + "': " + ec.message());
  fs::path rel = full.lexically_relative(base);
  if (rel.empty() || rel == "." || *rel.begin() == "..") {
    return invalid_argument("external data location '" + location + "' escapes the model's directory");
  }
  return full;
}

StatusOr<Tensor> tensor_from_external(const onnx::TensorProto& p, DType dtype, Shape shape, uint64_t bytes,
                                      const fs::path& base_dir) {
  std::string location;
  uint64_t offset = 0, length = 0;
  bool has_length = false;
  for (const auto& kv : p.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset") {
      if (!parse_u64(kv.value(), offset))
        return invalid_argument(tensor_label(p) + ": bad external data offset '" + kv.value() + "'");
    } else if (kv.key() == "length") {
      if (!parse_u64(kv.value(), length))
        return invalid_argument(tensor_label(p) + ": bad external data length '" + kv.value() + "'");
      has_length = true;
    }
  }
  if (has_length && length != bytes) {
    return invalid_argument(tensor_label(p) + ": external data length " + std::to_string(length) +
                            " differs from the " + std::to_string(bytes) + " bytes its shape needs");
  }
  KEEL_ASSIGN_OR_RETURN(fs::path file, resolve_external_location(base_dir, location), tensor_label(p));
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    return not_found(tensor_label(p) + ": external data file '" + location + "' does not exist");
  uint64_t file_size = fs::file_size(file, ec);
  if (ec) return invalid_argument(tensor_label(p) + ": cannot read the size of '" + location + "'");
  if (offset > file_size || bytes > file_size - offset) {
    return invalid_argument(tensor_label(p) + ": external data '" + location + "' has " + std::to_string(file_size) +
                            " bytes; offset " + std::to_string(offset) + " + " + std::to_string(bytes) +
                            " bytes is past its end");
  }
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host_uninitialized(dtype, std::move(shape)), tensor_label(p));
  if (bytes > 0) {
    std::ifstream in(file, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(offset));
    if (!in || !in.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(bytes))) {
      return invalid_argument(tensor_label(p) + ": cannot read external data '" + location + "'");
    }
  }
  return t;
}

template <typename Dst, typename Field>
void copy_field(const Field& field, void* dst) {
  Dst* d = static_cast<Dst*>(dst);
  for (int i = 0; i < field.size(); ++i) d[i] = static_cast<Dst>(field.Get(i));
}

}  // namespace

StatusOr<Tensor> tensor_from_proto(const onnx::TensorProto& p, const fs::path& base_dir, uint64_t max_bytes) {
  const int32_t type = p.data_type();
  if (type == KEEL_DTYPE_STRING) return unimplemented(tensor_label(p) + ": string tensors are not supported");
  if (!is_supported_dtype(type)) {
    if (type == onnx::TensorProto::COMPLEX64 || type == onnx::TensorProto::COMPLEX128) {
      return unimplemented(tensor_label(p) + ": complex tensors are not supported");
    }
    return invalid_argument(tensor_label(p) + ": unknown or undefined data type " + std::to_string(type));
  }
  if (p.has_segment()) return unimplemented(tensor_label(p) + ": segmented tensors are not supported");
  const DType dtype = static_cast<DType>(type);
  Shape shape(p.dims().begin(), p.dims().end());
  KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape, max_bytes), tensor_label(p));
  const uint64_t numel = dtype_size(dtype) ? bytes / dtype_size(dtype) : 0;

  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    return tensor_from_external(p, dtype, std::move(shape), bytes, base_dir);
  }
  if (p.has_raw_data()) {
    if (p.raw_data().size() != bytes) {
      return invalid_argument(tensor_label(p) + ": raw_data has " + std::to_string(p.raw_data().size()) +
                              " bytes but its type and shape " + shape_to_string(shape) + " need " +
                              std::to_string(bytes));
    }
    KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host_uninitialized(dtype, std::move(shape)), tensor_label(p));
    if (bytes) std::memcpy(t.raw_data(), p.raw_data().data(), bytes);
    return t;
  }

  // Typed fields: exactly one of them holds the values, one per element.
  int64_t count = 0;
  switch (dtype) {
    case DType::kF32: count = p.float_data_size(); break;
    case DType::kF64: count = p.double_data_size(); break;
    case DType::kI64: count = p.int64_data_size(); break;
    case DType::kU32:
    case DType::kU64: count = p.uint64_data_size(); break;
    default: count = p.int32_data_size(); break;
  }
  if (static_cast<uint64_t>(count) != numel) {
    return invalid_argument(tensor_label(p) + " has " + std::to_string(count) + " values but its shape " +
                            shape_to_string(shape) + " needs " + std::to_string(numel));
  }
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host_uninitialized(dtype, std::move(shape)), tensor_label(p));
  void* d = t.raw_data();
  if (numel == 0) return t;
  switch (dtype) {
    case DType::kF32: copy_field<float>(p.float_data(), d); break;
    case DType::kF64: copy_field<double>(p.double_data(), d); break;
    case DType::kI64: copy_field<int64_t>(p.int64_data(), d); break;
    case DType::kU32: copy_field<uint32_t>(p.uint64_data(), d); break;
    case DType::kU64: copy_field<uint64_t>(p.uint64_data(), d); break;
    case DType::kI32: copy_field<int32_t>(p.int32_data(), d); break;
    case DType::kI16: copy_field<int16_t>(p.int32_data(), d); break;
    case DType::kU16:
    case DType::kF16:
    case DType::kBF16: copy_field<uint16_t>(p.int32_data(), d); break;
    case DType::kI8: copy_field<int8_t>(p.int32_data(), d); break;
    case DType::kU8: copy_field<uint8_t>(p.int32_data(), d); break;
    case DType::kBool: {
      auto* b = static_cast<uint8_t*>(d);
      for (int i = 0; i < p.int32_data_size(); ++i) b[i] = p.int32_data(i) != 0;
      break;
    }
    default: return unimplemented(tensor_label(p) + ": unsupported data type");
  }
  return t;
}

Status tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto& out) {
  out.Clear();
  if (!name.empty()) out.set_name(name);
  if (!t.defined()) return invalid_argument("tensor '" + name + "' is undefined");
  if (!t.location().is_host())
    return invalid_argument("tensor '" + name + "' is on " + t.location().to_string() + ", not the host");
  if (t.dtype() == DType::kString || t.dtype() == DType::kUndefined) {
    return unimplemented("tensor '" + name + "': cannot export dtype " + dtype_name(t.dtype()));
  }
  out.set_data_type(static_cast<int32_t>(t.dtype()));
  for (int64_t d : t.shape()) out.add_dims(d);
  const uint64_t bytes = t.byte_size();
  if (bytes > 0 && t.raw_data() != nullptr) {
    out.set_raw_data(t.raw_data(), bytes);
  } else {
    out.set_raw_data(std::string());
  }
  return Status::ok();
}

}  // namespace keel
