// keel/core/runtime/onnx_io_internal.h — helpers the ONNX I/O files share (not part of onnx_io.h's interface).
//
// onnx_io.h's functions live in four files by concern: onnx_tensor_proto.cc (TensorProto <-> Tensor, external
// data), onnx_import.cc (ModelProto -> Graph: checker, version converter, attribute checks, shape inference),
// onnx_export.cc (Graph -> ModelProto, save_onnx, infer_shapes) and onnx_tensor_files.cc (.pb and .npy files).
// Everything here is reentrant and stateless.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/base/value.h"
#include "core/runtime/onnx_io.h"

namespace onnx {
class ModelProto;
class TypeProto;
struct ShapeInferenceOptions;
}  // namespace onnx

namespace keel::onnx_detail {

// The IR version export writes (ONNX 1.12 reads up to 8).
inline constexpr int64_t kExportIrVersion = 8;

// Passes `message` to options.warn, or logs it when the caller gave no callback.
void emit_warning(const OnnxLoadOptions& options, const std::string& message);

// A file's bytes in host storage: not zero-filled before the read, and on huge pages when large (a model's 100 MB
// read into a std::string was zeroed first and faulted in 4 KiB at a time: core/base/tensor.h).
struct FileBytes {
  std::shared_ptr<Storage> storage;
  uint64_t bytes = 0;
  const char* data() const { return storage ? static_cast<const char*>(storage->data()) : ""; }
  uint64_t size() const { return bytes; }
};

// Reads a whole file, refusing more than `limit` bytes; `what` names the file's role in errors ("model", ...).
StatusOr<FileBytes> read_file_bytes(const std::filesystem::path& file, uint64_t limit, const char* what);

// The ValueInfo an ONNX type describes (dtype, shape with -1 for unknown dims, sequence/optional containers);
// an empty ValueInfo for what Keel cannot represent (maps, ...).
ValueInfo value_info_from_type(const onnx::TypeProto& type, int depth = 0);

// Merges what `b` knows into `a` (b wins where it is more specific).
void merge_value_info(ValueInfo& a, const ValueInfo& b);

// An ONNX checker / inference message on one line (its "==> Context: ..." text kept whole).
std::string one_line(std::string s);

// ONNX shape inference on `m` in place, with Keel's guards against ONNX 1.12's crashes (attributes inference
// divides by, data propagators) installed first. Throws what ONNX throws (onnx::InferenceError, ...).
void infer_onnx_shapes(onnx::ModelProto& m, const onnx::ShapeInferenceOptions& opts);

// Refuses a graph with a value whose static shape no tensor could hold (over 1 TiB), naming the first.
Status check_static_sizes(const Graph& g);

}  // namespace keel::onnx_detail
