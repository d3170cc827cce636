// keel/core/runtime/attribute_checks.h — validation of node attributes (and of small constant inputs that act as
// attributes: axes, K, repeats, ...) before ONNX shape inference and before any kernel sees a node.
//
// ONNX 1.12 (Debian's libonnx) trusts attributes in its shape-inference functions: Conv(strides=[0, 0]) divides by
// zero inside convPoolShapeInference and ends the process with SIGFPE, and axes out of range index past the input's
// dims. Kernels divide by, index with and allocate from the same values. The checks here are table-driven, one list
// of rules per op (ai.onnx opsets 7-17 and the keel domain): every attribute that inference or a kernel divides by,
// indexes with or allocates from is checked against the op's rules and, where they are known, the input ranks and dims.
// An offence is INVALID_ARGUMENT naming node, attribute and value, e.g.
//   node "conv0" (Conv): attribute strides = [0, 0]: every stride must be >= 1
// Unknown ranks or dims skip the checks that need them (they run again once inference knows them).
//
// Where they run: at load (graph_from_model_proto, before the first ONNX inference); inside ONNX inference itself
// (guard_onnx_inference_attributes wraps the inference functions of the checked ops once per process, so values whose
// ranks only inference learns are checked before ONNX's own function reads them); and on the graph IR by
// infer_shapes (before and after inference), which sessions and eager ops go through before creating kernels.
//
// Thread-safety: every function is reentrant; guard_onnx_inference_attributes modifies ONNX's schema registry once,
// under std::call_once.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"

namespace onnx {
class GraphProto;
}  // namespace onnx

namespace keel {

// What the checks see of one node. Built by the adapters below; tests may fill one directly.
struct AttrCheckNode {
  std::string op_type;
  std::string domain;  // "" = ai.onnx
  int32_t opset = 0;   // the node's domain opset; 0 = unknown (the newest forms are assumed)
  // Prefix of error messages, e.g. `node "conv0" (Conv)`; empty inside ONNX inference (ONNX names the node).
  std::string label;
  // The attribute `name`, or nullptr when absent. Must stay valid while the checks run.
  std::function<const Attribute*(const std::string& name)> attr;
  // Per input slot: whether it is present, its shape (nullopt: unknown rank; -1 dims unknown) and, for small
  // constant integer inputs (initializers, up to 64 values), the values.
  std::vector<bool> input_present;
  std::vector<std::optional<Shape>> input_shapes;
  std::vector<std::optional<std::vector<int64_t>>> input_ints;
  size_t num_outputs = 0;
};

// Checks one node. OK for ops without rules.
Status check_node_attributes(const AttrCheckNode& node);

// Checks every node of a graph IR (and of its subgraphs) with the shapes its value_info knows. With
// `inferred_shapes` false only the graph inputs' shapes are used (before inference: the value_info of other values
// may be stale after a pass rewrote the graph).
Status check_graph_attributes(const Graph& graph, bool inferred_shapes = true);

// Checks every node of an ONNX graph (and its subgraphs) with the shapes that its inputs, initializers and
// value_info declare; `opsets` maps domain ("" = ai.onnx) to version. Runs before any ONNX inference.
Status check_model_attributes(const onnx::GraphProto& graph, const std::function<int32_t(const std::string&)>& opset);

// Wraps the shape-inference functions of every checked op in ONNX's registry (ai.onnx opsets 1-17, keel opset 1) so
// that they run the checks first and fail inference (an onnx::InferenceError) instead of reading bad attributes.
// Once per process; later calls do nothing. Called by infer_onnx_shapes before every inference.
void guard_onnx_inference_attributes();

// The ops (domain-qualified for non-ai.onnx: "keel.FusedConv") that have rules; sorted.
std::vector<std::string> attribute_checked_ops();

}  // namespace keel
