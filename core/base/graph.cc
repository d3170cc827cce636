#include "core/base/graph.h"

#include <algorithm>
#include <deque>
#include <set>
#include <unordered_set>

namespace keel {

std::string ValueInfo::to_string() const {
  std::string t = std::string(dtype_name(dtype)) + (shape ? shape_to_string(*shape) : std::string("[?...]"));
  for (auto it = containers.rbegin(); it != containers.rend(); ++it)
    t = (*it == ValueKind::kSequence ? "seq(" : "optional(") + t + ")";
  return t;
}

namespace {

void collect_outer_reads(const Graph& g, std::vector<std::string>& out, std::unordered_set<std::string>& seen) {
  std::unordered_set<std::string> defined(g.inputs.begin(), g.inputs.end());
  for (const auto& [k, v] : g.initializers) defined.insert(k);
  for (NodeId id : g.node_ids())
    for (const auto& o : g.node(id)->outputs) defined.insert(o);
  auto note = [&](const std::string& v) {
    if (!v.empty() && !defined.count(v) && seen.insert(v).second) out.push_back(v);
  };
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    for (const auto& in : n->inputs) note(in);
    for (const auto& v : implicit_inputs(*n)) note(v);
  }
  for (const auto& o : g.outputs) note(o);
}

// Renames reads of `from` inside `g` (and deeper), unless `g` defines a value of that name itself.
void rename_outer_reads(Graph& g, const std::string& from, const std::string& to) {
  if (g.is_graph_input(from) || g.is_initializer(from) || g.producer(from)) return;
  g.replace_uses(from, to);
}

}  // namespace

std::vector<std::string> outer_scope_reads(const Graph& sub) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  collect_outer_reads(sub, out, seen);
  return out;
}

bool has_subgraphs(const Node& node) {
  for (const auto& [k, a] : node.attrs)
    if (a.kind == AttrKind::kGraph && a.g) return true;
  return false;
}

std::vector<std::string> implicit_inputs(const Node& node) {
  std::vector<std::string> out;
  if (!has_subgraphs(node)) return out;
  std::unordered_set<std::string> seen;
  for (const auto& [k, a] : node.attrs)
    if (a.kind == AttrKind::kGraph && a.g) collect_outer_reads(*a.g, out, seen);
  return out;
}

Graph::Graph(const Graph& o) { *this = o; }

Graph& Graph::operator=(const Graph& o) {
  if (this == &o) return *this;
  name = o.name;
  opsets = o.opsets;
  nodes_ = o.nodes_;
  for (auto& [id, n] : nodes_) {
    for (auto& [k, a] : n.attrs)
      if (a.g) a.g = std::make_shared<Graph>(*a.g);
  }
  next_id_ = o.next_id_;
  name_counter_ = o.name_counter_;
  inputs = o.inputs;
  outputs = o.outputs;
  value_info = o.value_info;
  initializers = o.initializers;
  return *this;
}

NodeId Graph::add_node(Node node) {
  node.id = next_id_++;
  NodeId id = node.id;
  nodes_.emplace(id, std::move(node));
  return id;
}

Status Graph::remove_node(NodeId id) {
  if (nodes_.erase(id) == 0) return not_found("no node with id " + std::to_string(id));
  return Status::ok();
}

Node* Graph::node(NodeId id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}
const Node* Graph::node(NodeId id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<NodeId> Graph::node_ids() const {
  std::vector<NodeId> ids;
  ids.reserve(nodes_.size());
  for (const auto& [id, n] : nodes_) ids.push_back(id);
  return ids;
}

StatusOr<std::vector<NodeId>> Graph::topological_order() const {
  std::unordered_map<std::string, NodeId> producer_of;
  for (const auto& [id, n] : nodes_)
    for (const auto& o : n.outputs)
      if (!o.empty()) producer_of[o] = id;
  std::map<NodeId, int> pending;  // unmet producer edges
  std::unordered_map<NodeId, std::vector<NodeId>> users;
  for (const auto& [id, n] : nodes_) {
    std::set<NodeId> deps;
    const NodeId self = id;  // a copy: clang before 16 cannot capture a structured binding
    auto depend = [&](const std::string& in) {
      if (in.empty()) return;
      auto it = producer_of.find(in);
      if (it != producer_of.end() && it->second != self) deps.insert(it->second);
    };
    for (const auto& in : n.inputs) depend(in);
    for (const auto& in : implicit_inputs(n)) depend(in);
    pending[id] = static_cast<int>(deps.size());
    for (NodeId d : deps) users[d].push_back(id);
  }
  std::set<NodeId> ready;  // ordered by id: keeps insertion order among ties
  for (const auto& [id, c] : pending)
    if (c == 0) ready.insert(id);
  std::vector<NodeId> order;
  order.reserve(nodes_.size());
  while (!ready.empty()) {
    NodeId id = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(id);
    for (NodeId u : users[id])
      if (--pending[u] == 0) ready.insert(u);
  }
  if (order.size() != nodes_.size()) {
    for (const auto& [id, c] : pending)
      if (c > 0) {
        const Node& n = nodes_.at(id);
        return invalid_argument("graph '" + name + "' has a cycle through node '" + n.name + "' (" + n.op_type + ")");
      }
  }
  return order;
}

std::optional<NodeId> Graph::producer(const std::string& value) const {
  if (value.empty()) return std::nullopt;
  for (const auto& [id, n] : nodes_)
    for (const auto& o : n.outputs)
      if (o == value) return id;
  return std::nullopt;
}

std::vector<NodeId> Graph::consumers(const std::string& value) const {
  std::vector<NodeId> out;
  if (value.empty()) return out;
  for (const auto& [id, n] : nodes_) {
    if (std::find(n.inputs.begin(), n.inputs.end(), value) != n.inputs.end()) {
      out.push_back(id);
    } else if (has_subgraphs(n)) {
      auto implicit = implicit_inputs(n);
      if (std::find(implicit.begin(), implicit.end(), value) != implicit.end()) out.push_back(id);
    }
  }
  return out;
}

void Graph::replace_uses(const std::string& from, const std::string& to) {
  for (auto& [id, n] : nodes_) {
    for (auto& in : n.inputs)
      if (in == from) in = to;
    for (auto& [k, a] : n.attrs)
      if (a.kind == AttrKind::kGraph && a.g) rename_outer_reads(*a.g, from, to);
  }
  for (auto& o : outputs)
    if (o == from) o = to;
}

bool Graph::is_graph_input(const std::string& v) const {
  return std::find(inputs.begin(), inputs.end(), v) != inputs.end();
}
bool Graph::is_graph_output(const std::string& v) const {
  return std::find(outputs.begin(), outputs.end(), v) != outputs.end();
}
const ValueInfo* Graph::info(const std::string& v) const {
  auto it = value_info.find(v);
  return it == value_info.end() ? nullptr : &it->second;
}

std::string Graph::unique_name(const std::string& prefix) {
  std::unordered_set<std::string> used(inputs.begin(), inputs.end());
  for (const auto& [k, v] : initializers) used.insert(k);
  for (const auto& [k, v] : value_info) used.insert(k);
  for (const auto& [id, n] : nodes_) {
    used.insert(n.outputs.begin(), n.outputs.end());
    used.insert(n.name);
  }
  for (;;) {
    std::string candidate = prefix + "_" + std::to_string(name_counter_++);
    if (!used.count(candidate)) return candidate;
  }
}

Status Graph::validate() const {
  std::unordered_set<std::string> defined(inputs.begin(), inputs.end());
  for (const auto& [k, v] : initializers) defined.insert(k);
  std::unordered_map<std::string, std::string> produced_by;
  for (const auto& [id, n] : nodes_) {
    for (const auto& o : n.outputs) {
      if (o.empty()) continue;
      if (defined.count(o) && !initializers.count(o) && !is_graph_input(o)) {
        return invalid_argument("value '" + o + "' is produced twice (node '" + n.name + "' and node '" +
                                produced_by[o] + "')");
      }
      if (is_graph_input(o) || initializers.count(o)) {
        return invalid_argument("node '" + n.name + "' (" + n.op_type + ") writes '" + o +
                                "', which is a graph input or initializer");
      }
      defined.insert(o);
      produced_by[o] = n.name;
    }
  }
  for (const auto& [id, n] : nodes_) {
    for (const auto& in : n.inputs)
      if (!in.empty() && !defined.count(in)) {
        return invalid_argument("node '" + n.name + "' (" + n.op_type + ") reads '" + in +
                                "', which no node, input or initializer defines");
      }
    for (const auto& in : implicit_inputs(n))
      if (!defined.count(in)) {
        return invalid_argument("a subgraph of node '" + n.name + "' (" + n.op_type + ") reads '" + in +
                                "', which no node, input or initializer of the enclosing graph defines");
      }
  }
  for (const auto& o : outputs)
    if (!defined.count(o)) return invalid_argument("graph output '" + o + "' is never defined");
  auto order = topological_order();
  if (!order.is_ok()) return order.status();
  return Status::ok();
}

GraphBuilder::GraphBuilder(std::string name, int32_t opset) {
  graph_.name = std::move(name);
  graph_.opsets = {{"", opset}};
}

std::string GraphBuilder::input(const std::string& name, DType dtype, Shape shape) {
  graph_.inputs.push_back(name);
  graph_.value_info[name] = ValueInfo{dtype, std::move(shape)};
  return name;
}

std::string GraphBuilder::constant(const std::string& name, Tensor value) {
  graph_.value_info[name] = ValueInfo{value.dtype(), value.shape()};
  graph_.initializers[name] = std::move(value);
  return name;
}

std::vector<std::string> GraphBuilder::op(const std::string& op_type, std::vector<std::string> inputs,
                                          std::map<std::string, Attribute> attrs, size_t num_outputs,
                                          const std::string& domain) {
  Node n;
  n.name = graph_.unique_name(op_type);
  n.domain = domain;
  n.op_type = op_type;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  for (size_t i = 0; i < num_outputs; ++i) n.outputs.push_back(n.name + "_out" + std::to_string(i));
  auto outs = n.outputs;
  graph_.add_node(std::move(n));
  return outs;
}

void GraphBuilder::output(const std::string& value) { graph_.outputs.push_back(value); }

}  // namespace keel
