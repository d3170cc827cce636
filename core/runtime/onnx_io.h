// keel/core/runtime/onnx_io.h — ONNX model import/export and tensor files (.pb, .npy).
//
// Import: parses a ModelProto, upgrades models declaring ai.onnx opset < 7 with ONNX's version converter, runs the
// ONNX checker and shape inference (their complaints become INVALID_ARGUMENT naming the node), reads external data
// (relative to the model's directory only), refuses huge declared sizes before allocating, and converts to the graph
// IR. Opsets above kMaxOnnxOpset are refused (the reference kernels and ONNX 1.12 know nothing newer).
//
// Export: writes any Graph back as a ModelProto (ir_version 8, initializers as raw_data, a "keel" domain import
// when a node uses it, subgraphs and sequence/optional types included); save_onnx moves weights to an external data
// file when the model would pass protobuf's 2 GiB limit.
//
// Every function here is reentrant: no global state besides ONNX's own schema registry (read-only, except that the
// first inference wraps four of its data propagators against crashes of ONNX 1.12, once, under std::call_once).
// Malformed input of any kind gives an error status, never a crash (the loader has a fuzz target, and shape
// computations a model generator, in tests/fuzz/). A value whose static shape could not be held by any tensor (over
// 1 TiB) is refused by name, at load and by infer_shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/base/value.h"

namespace onnx {
class TensorProto;
class ModelProto;
}  // namespace onnx

namespace keel {

// The newest ai.onnx opset the loader accepts, and the version older models are upgraded to.
inline constexpr int32_t kMaxOnnxOpset = 17;
inline constexpr int32_t kMinOnnxOpset = 7;

// What a model file says about itself (filled by the loader when OnnxLoadOptions::meta is set).
struct OnnxModelMeta {
  int64_t ir_version = 0;
  std::string producer_name, producer_version, domain, doc_string;
  int64_t model_version = 0;
  std::map<std::string, std::string> metadata_props;  // the model's custom metadata (key -> value)
  std::map<std::string, int32_t> declared_opsets;     // as the file declared them, before any upgrade
  bool upgraded = false;                              // the version converter ran
  uint64_t file_bytes = 0;                            // the model file alone
  uint64_t external_bytes = 0;                        // bytes read from external-data files
};

struct OnnxLoadOptions {
  // Run the ONNX checker (structure, schemas, attribute types).
  bool check = true;
  // Run ONNX shape inference (with data propagation) and keep the inferred value_info.
  bool infer_shapes = true;
  // Node-level shape-inference errors fail the load (true: the default; every model of the ONNX test suites passes)
  // or are reported as warnings, and inference continues without them (false).
  bool strict_shape_inference = true;
  // Upgrade models whose ai.onnx opset is below kMinOnnxOpset with ONNX's version converter.
  bool upgrade_old_opsets = true;
  // The ai.onnx opset old models are upgraded to (kMinOnnxOpset..kMaxOnnxOpset).
  int32_t upgrade_target = kMinOnnxOpset;
  // The largest tensor (initializer, attribute, external-data chunk) the loader will allocate, in bytes.
  uint64_t max_tensor_bytes = 1ull << 34;  // 16 GiB
  // Receives warnings (opset upgrades, relaxed shape inference). Empty: logged through spdlog at warn level.
  std::function<void(const std::string&)> warn;
  // When set, receives the model's metadata.
  OnnxModelMeta* meta = nullptr;
};

// Loads an ONNX model file. INVALID_ARGUMENT for malformed models (message names the file and, where it applies,
// the node), NOT_FOUND for a missing file, UNIMPLEMENTED for content the IR cannot hold (string or sparse
// initializers, opsets newer than kMaxOnnxOpset).
StatusOr<Graph> load_onnx(const std::filesystem::path& file, const OnnxLoadOptions& options = {});

// The same from bytes in memory; external data resolves against `base_dir` (empty: external data is refused).
// `name` is used in error messages.
StatusOr<Graph> load_onnx_from_memory(const void* data, size_t size, const std::filesystem::path& base_dir,
                                      const OnnxLoadOptions& options = {}, const std::string& name = "<memory>");

// Converts an already-parsed ModelProto (the same pipeline as load_onnx after parsing). `model` may be modified
// (upgraded, shapes inferred).
StatusOr<Graph> graph_from_model_proto(onnx::ModelProto& model, const std::filesystem::path& base_dir,
                                       const OnnxLoadOptions& options = {}, const std::string& name = "<model>");

// Exports a graph as a ModelProto: ir_version 8, opset imports from graph.opsets (plus "keel" version 1 when a node
// uses that domain), initializers as raw_data, value_info for every value with a known dtype.
StatusOr<std::string> serialize_onnx(const Graph& graph);
Status graph_to_model_proto(const Graph& graph, onnx::ModelProto& out);
struct OnnxSaveOptions {
  enum class ExternalData {
    kAuto,    // only when the model would be over protobuf's 2 GiB limit
    kAlways,  // every initializer of at least `external_threshold` bytes
    kNever,   // over 2 GiB is an error
  };
  ExternalData external_data = ExternalData::kAuto;
  // Initializers of at least this many bytes go to the external data file (when external data is written).
  uint64_t external_threshold = 1024;
  // The external data file's name, in the model's directory; empty: the model's file name + ".data".
  std::string external_file;
};
// Exports and writes `graph`. Weights that would take the model past protobuf's 2 GiB limit (or, per `options`,
// any large initializer) are written to one external data file beside the model (64-byte aligned, ONNX's
// location/offset/length keys), which load_onnx reads back.
Status save_onnx(const Graph& graph, const std::filesystem::path& file, const OnnxSaveOptions& options = {});

// Runs ONNX shape inference on `graph` (exported, inferred, copied back): every value the inference types gets its
// dtype and shape in graph.value_info; values it cannot type keep what they had. Nodes ONNX does not know (the
// "keel" domain) are skipped, and so is whatever depends only on them. Node-level inference errors are ignored.
// Shape computations are followed as ONNX Runtime's graph resolve does: the values of small tensors known at this
// point (small initializers, Constant nodes, Shape/Size of statically shaped values, and arithmetic, Gather, Concat,
// Slice, ... over those; shape_values.h) are computed on the reference kernels and given to a further round of
// ONNX inference as initializers, until nothing new is learnt, so a Reshape or Slice whose shape input is computed
// from Shape ops gets a static output shape. The graph keeps its nodes; only types and shapes are written back.
Status infer_shapes(Graph& graph);

// Tensor files: ONNX TensorProto (.pb, any other extension) or NumPy (.npy, v1/v2/v3, little-endian, C order).
// `name`, when given, receives the TensorProto's name ("" for .npy).
StatusOr<Tensor> read_tensor_file(const std::filesystem::path& file, std::string* name = nullptr);
StatusOr<Tensor> read_npy(const void* data, size_t size);
StatusOr<Tensor> read_tensor_pb(const void* data, size_t size, std::string* name = nullptr);
// Writes `tensor` (on the host) as a TensorProto with `name`.
Status write_tensor_pb(const Tensor& tensor, const std::filesystem::path& file, const std::string& name = "");

// Values of any kind (the ONNX test data's input_K.pb / output_K.pb): a TensorProto, a SequenceProto (of tensors)
// or an OptionalProto (of a tensor or a sequence), as `declared` says (nullptr or a tensor type: a TensorProto).
// `name`, when given, receives the proto's name. .npy files hold tensors only.
StatusOr<RunValue> read_value_file(const std::filesystem::path& file, const ValueInfo* declared,
                                   std::string* name = nullptr);
StatusOr<RunValue> read_value_pb(const void* data, size_t size, const ValueInfo* declared, std::string* name = nullptr);
// Writes `value` (host tensors) as the proto `declared` calls for (a TensorProto for tensors when it is nullptr).
Status write_value_pb(const RunValue& value, const ValueInfo* declared, const std::filesystem::path& file,
                      const std::string& name = "");

// TensorProto <-> Tensor. `base_dir` resolves external data (empty: refused). Raw data, and every typed field
// (float_data, int32_data — also for f16/bf16/bool/i8/u8/i16/u16 —, int64_data, double_data, uint64_data), are read.
StatusOr<Tensor> tensor_from_proto(const onnx::TensorProto& proto, const std::filesystem::path& base_dir = {},
                                   uint64_t max_bytes = 1ull << 34);
// Host tensors only; data goes to raw_data.
Status tensor_to_proto(const Tensor& tensor, const std::string& name, onnx::TensorProto& out);

}  // namespace keel
