// keel/core/runtime/onnx_io_util.cc — the helpers onnx_io_internal.h declares.
#include <onnx/onnx_pb.h>

#include <fstream>
#include <system_error>

#include "core/base/log.h"
#include "core/runtime/onnx_io_internal.h"

namespace keel::onnx_detail {
namespace fs = std::filesystem;

void emit_warning(const OnnxLoadOptions& options, const std::string& message) {
  if (options.warn) {
    options.warn(message);
  } else {
    log::warn("{}", message);
  }
}

// Reads a whole file, refusing more than `limit` bytes.
StatusOr<FileBytes> read_file_bytes(const fs::path& file, uint64_t limit, const char* what) {
  std::error_code ec;
  auto st = fs::status(file, ec);
  if (ec || !fs::exists(st)) return not_found(std::string(what) + " '" + file.string() + "' does not exist");
  if (!fs::is_regular_file(st))
    return invalid_argument(std::string(what) + " '" + file.string() + "' is not a regular file");
  uint64_t size = fs::file_size(file, ec);
  if (ec) return invalid_argument("cannot read the size of '" + file.string() + "': " + ec.message());
  if (size > limit) {
    return invalid_argument(std::string(what) + " '" + file.string() + "' has " + std::to_string(size) +
                            " bytes, over the limit of " + std::to_string(limit));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("cannot open '" + file.string() + "'");
  FileBytes bytes;
  KEEL_ASSIGN_OR_RETURN(bytes.storage, Storage::allocate_host(size, /*zero=*/false), file.string());
  bytes.bytes = size;
  if (size > 0 && !in.read(static_cast<char*>(bytes.storage->data()), static_cast<std::streamsize>(size))) {
    return invalid_argument("cannot read '" + file.string() + "'");
  }
  return bytes;
}

ValueInfo value_info_from_type(const onnx::TypeProto& type, int depth) {
  ValueInfo vi;
  if (depth > 16) return vi;
  if (type.value_case() == onnx::TypeProto::kSequenceType || type.value_case() == onnx::TypeProto::kOptionalType) {
    const bool seq = type.value_case() == onnx::TypeProto::kSequenceType;
    const onnx::TypeProto& elem = seq ? type.sequence_type().elem_type() : type.optional_type().elem_type();
    if ((seq && !type.sequence_type().has_elem_type()) || (!seq && !type.optional_type().has_elem_type())) return vi;
    vi = value_info_from_type(elem, depth + 1);
    if (vi.dtype == DType::kUndefined && vi.containers.empty() && elem.value_case() != onnx::TypeProto::kTensorType) {
      return ValueInfo{};  // maps and the like: not representable
    }
    vi.containers.insert(vi.containers.begin(), seq ? ValueKind::kSequence : ValueKind::kOptional);
    return vi;
  }
  if (type.value_case() != onnx::TypeProto::kTensorType) return vi;
  const auto& tt = type.tensor_type();
  if (dtype_is_valid(tt.elem_type())) vi.dtype = static_cast<DType>(tt.elem_type());
  if (tt.has_shape()) {
    Shape s;
    for (const auto& d : tt.shape().dim()) {
      s.push_back(d.value_case() == onnx::TensorShapeProto::Dimension::kDimValue && d.dim_value() >= 0 ? d.dim_value()
                                                                                                       : -1);
    }
    vi.shape = std::move(s);
  }
  return vi;
}

void merge_value_info(ValueInfo& a, const ValueInfo& b) {
  if (b.dtype != DType::kUndefined || !b.containers.empty()) {
    if (a.containers != b.containers) a.shape.reset();
    a.containers = b.containers;
  }
  if (b.dtype != DType::kUndefined) a.dtype = b.dtype;
  if (b.shape) {
    if (!a.shape || a.shape->size() != b.shape->size()) {
      a.shape = b.shape;
    } else {
      for (size_t i = 0; i < b.shape->size(); ++i)
        if ((*b.shape)[i] >= 0) (*a.shape)[i] = (*b.shape)[i];
    }
  }
}

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n') {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace keel::onnx_detail
