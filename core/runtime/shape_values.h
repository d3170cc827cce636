// keel/core/runtime/shape_values.h — (internal) the values of small shape-computing tensors, learnt at session time
// so that ONNX shape inference (infer_shapes, onnx_io.h) can give static shapes to what a Shape -> Gather -> Concat
// -> Reshape chain produces, as ONNX Runtime's graph resolve does, without rewriting the graph.
//
// A value is known when it is a small initializer, the output of Shape/Size of a tensor whose inferred shape is
// fully static, or the output of an allowed ai.onnx node (Constant, Gather, Unsqueeze, Concat, Slice, Cast,
// arithmetic, Range, Where, ConstantOfShape, Expand, ...) whose inputs are all known. Nodes are evaluated with the
// reference CPU kernels (the same kernel definitions a session runs) of a process-wide environment that holds the
// reference device alone (created on first use, never destroyed). Every known value has at most kMaxElements
// elements, and a node is only evaluated when its inferred output shapes say so: a hostile model cannot make
// inference allocate more than a few hundred bytes per value. A node whose kernel fails leaves its outputs unknown
// (the session reports the problem when the node runs, as before).
//
// Thread-safety: propagate() may run on several threads at once (each kernel call has its own context; the
// environment is read-only after creation).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/base/graph.h"
#include "core/base/tensor.h"

namespace keel::shape_values {

// The largest value (elements) that is learnt.
inline constexpr int64_t kMaxElements = 64;

// False when the environment variable KEEL_SHAPE_VALUES is "0" (read once): infer_shapes then runs ONNX inference
// alone, as before (for A/B measurements and bisecting).
bool enabled();

// Learns what it can in one sweep over `graph` (topological order) and adds it to `known`: `types` holds the
// types inferred so far (value name -> ValueInfo; shapes with -1 for unknown dims); `tried` holds the nodes already
// evaluated or failed (not tried again). Seeds `known` with the graph's small initializers (not those that are
// also graph inputs, which a run may override) when it is empty.
// Returns the number of values added that a node reads whose outputs are not all statically shaped (what another
// round of inference can use).
int64_t propagate(const Graph& graph, const std::unordered_map<std::string, ValueInfo>& types,
                  std::unordered_map<std::string, Tensor>& known, std::unordered_set<NodeId>& tried);

}  // namespace keel::shape_values
