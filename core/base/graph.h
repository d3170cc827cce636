// keel/core/base/graph.h — the graph IR.
//
// A Graph is an ONNX-shaped dataflow graph: named values, nodes that read and write them, graph inputs and outputs,
// initializers (constants, host tensors) and per-value type information (dtype + shape, possibly partial). Node ids
// are stable and never reused within a graph. `topological_order()` is recomputed lazily after edits.
//
// The same IR serves models imported from ONNX, graphs built in code (GraphBuilder), passes (through the C graph API
// in core/runtime/host_api.cc) and export back to ONNX. A Graph is not thread-safe; a session owns its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/base/status.h"
#include "core/base/tensor.h"

namespace keel {

class Graph;

enum class AttrKind : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kInt = 2,
  kString = 3,
  kTensor = 4,
  kGraph = 5,
  kFloats = 6,
  kInts = 7,
  kStrings = 8,
  kType = 13,  // an ONNX TypeProto (the `type` of Optional)
};

// What kind of value a name holds: a tensor, or a container of tensors (ONNX sequence and optional types).
enum class ValueKind : int32_t { kTensor = 0, kSequence = 1, kOptional = 2 };

// Type information of a value. `shape` is nullopt when the rank is unknown; dims of -1 are unknown.
// Containers: `containers` lists them outermost first ({kOptional, kSequence} = optional(sequence(tensor))), and
// dtype/shape describe the innermost tensor; empty = a tensor.
struct ValueInfo {
  ValueInfo() = default;
  ValueInfo(DType d, std::optional<Shape> s = std::nullopt, std::vector<ValueKind> c = {})
      : dtype(d), shape(std::move(s)), containers(std::move(c)) {}
  DType dtype = DType::kUndefined;
  std::optional<Shape> shape;
  std::vector<ValueKind> containers;
  bool is_tensor() const { return containers.empty(); }
  // The tensor type, or kUndefined for containers (what kernels and passes may rely on).
  DType tensor_dtype() const { return is_tensor() ? dtype : DType::kUndefined; }
  std::string to_string() const;
};

struct Attribute {
  AttrKind kind = AttrKind::kUndefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  ValueInfo type;  // kType

  static Attribute of_int(int64_t v) {
    Attribute a;
    a.kind = AttrKind::kInt;
    a.i = v;
    return a;
  }
  static Attribute of_float(float v) {
    Attribute a;
    a.kind = AttrKind::kFloat;
    a.f = v;
    return a;
  }
  static Attribute of_string(std::string v) {
    Attribute a;
    a.kind = AttrKind::kString;
    a.s = std::move(v);
    return a;
  }
  static Attribute of_ints(std::vector<int64_t> v) {
    Attribute a;
    a.kind = AttrKind::kInts;
    a.ints = std::move(v);
    return a;
  }
  static Attribute of_floats(std::vector<float> v) {
    Attribute a;
    a.kind = AttrKind::kFloats;
    a.floats = std::move(v);
    return a;
  }
  static Attribute of_tensor(Tensor v) {
    Attribute a;
    a.kind = AttrKind::kTensor;
    a.t = std::move(v);
    return a;
  }
};

using NodeId = uint64_t;

struct Node {
  NodeId id = 0;
  std::string name;
  std::string domain;  // "" = ai.onnx
  std::string op_type;
  std::vector<std::string> inputs;   // "" = absent optional input
  std::vector<std::string> outputs;  // "" = unused optional output
  std::map<std::string, Attribute> attrs;
  std::string device_type;  // set by placement; "" before

  const Attribute* attr(const std::string& n) const {
    auto it = attrs.find(n);
    return it == attrs.end() ? nullptr : &it->second;
  }
  int64_t attr_int(const std::string& n, int64_t dflt) const {
    auto* a = attr(n);
    return a && a->kind == AttrKind::kInt ? a->i : dflt;
  }
  float attr_float(const std::string& n, float dflt) const {
    auto* a = attr(n);
    return a && a->kind == AttrKind::kFloat ? a->f : dflt;
  }
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph& other);  // deep copy (initializer bytes shared, they are immutable)
  Graph& operator=(const Graph& other);

  std::string name;
  std::map<std::string, int32_t> opsets = {{"", 17}};  // domain -> version

  // --- nodes ---
  NodeId add_node(Node node);  // assigns node.id; returns it
  Status remove_node(NodeId id);
  Node* node(NodeId id);
  const Node* node(NodeId id) const;
  size_t node_count() const { return nodes_.size(); }
  // Nodes in a topological order (stable: ties keep insertion order). INVALID_ARGUMENT when there is a cycle.
  StatusOr<std::vector<NodeId>> topological_order() const;
  // Every node, in insertion order (no ordering guarantee about data flow).
  std::vector<NodeId> node_ids() const;
  // The node producing `value`, or nullopt (graph input, initializer, or unknown).
  std::optional<NodeId> producer(const std::string& value) const;
  // Nodes reading `value` (each once, insertion order), including nodes whose subgraphs read it.
  std::vector<NodeId> consumers(const std::string& value) const;
  // Rewires every reader of `from` (also inside subgraphs that read it from this graph), and the graph outputs, to
  // `to`.
  void replace_uses(const std::string& from, const std::string& to);

  // --- values ---
  std::vector<std::string> inputs;   // graph inputs, in order (not including initializers)
  std::vector<std::string> outputs;  // graph outputs, in order
  std::unordered_map<std::string, ValueInfo> value_info;
  std::unordered_map<std::string, Tensor> initializers;  // host tensors

  bool is_initializer(const std::string& v) const { return initializers.count(v) != 0; }
  bool is_graph_input(const std::string& v) const;
  bool is_graph_output(const std::string& v) const;
  const ValueInfo* info(const std::string& v) const;
  // A fresh value name starting with `prefix`.
  std::string unique_name(const std::string& prefix);

  // Checks structure: every read value is defined once (input, initializer or one producer), outputs are defined,
  // no cycle; values that subgraphs read from this graph count as reads of their node. The message names the first
  // offending node and value.
  Status validate() const;

 private:
  std::map<NodeId, Node> nodes_;  // ordered by id = insertion order
  NodeId next_id_ = 1;
  uint64_t name_counter_ = 0;
};

// Subgraphs (graph-valued attributes: If's branches, Loop's and Scan's bodies, SequenceMap's body) may read values
// of the graphs that enclose them, by name. These are a node's implicit inputs: every scheduling and liveness
// question (topological order, consumers, validate, dead code) treats them like its inputs.
//
// The values `sub` reads but does not define (nor do the subgraphs nested in it): what it needs from outside, in
// first-read order, each once.
std::vector<std::string> outer_scope_reads(const Graph& sub);
// The values `node`'s subgraph attributes read from the enclosing graph (empty for nodes without subgraphs).
std::vector<std::string> implicit_inputs(const Node& node);
bool has_subgraphs(const Node& node);

// Builds graphs in code: the tests' and the main job's way to make models without ONNX files.
class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name = "graph", int32_t opset = 17);
  // Declares a graph input with its type.
  std::string input(const std::string& name, DType dtype, Shape shape);
  // Adds a constant.
  std::string constant(const std::string& name, Tensor value);
  // Adds a node with fresh output names (or the given ones) and returns the output names.
  std::vector<std::string> op(const std::string& op_type, std::vector<std::string> inputs,
                              std::map<std::string, Attribute> attrs = {}, size_t num_outputs = 1,
                              const std::string& domain = "");
  // Single-output shorthand.
  std::string op1(const std::string& op_type, std::vector<std::string> inputs,
                  std::map<std::string, Attribute> attrs = {}) {
    return op(op_type, std::move(inputs), std::move(attrs), 1)[0];
  }
  void output(const std::string& value);
  Graph& graph() { return graph_; }
  Graph take() { return std::move(graph_); }

 private:
  Graph graph_;
};

}  // namespace keel
