// keel/core/runtime/onnx_export.cc — Graph -> ModelProto (serialize_onnx, save_onnx with external data past 2 GiB)
// and infer_shapes, which round-trips a graph through ONNX shape inference.
#include "core/runtime/onnx_io.h"

#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>

#include "core/base/log.h"
#include "core/runtime/attribute_checks.h"
#include "core/runtime/onnx_io_internal.h"
#include "core/runtime/shape_values.h"

namespace keel {
namespace fs = std::filesystem;
using onnx_detail::check_static_sizes;
using onnx_detail::infer_onnx_shapes;
using onnx_detail::kExportIrVersion;
using onnx_detail::merge_value_info;
using onnx_detail::one_line;
using onnx_detail::value_info_from_type;

namespace {

struct ExportOptions {
  // Initializers above this size go out as typed graph inputs without data (for shape inference only).
  uint64_t max_initializer_bytes = UINT64_MAX;
  // Only write value_info for outputs of nodes ONNX cannot infer (other domains): the rest is inferred afresh, so
  // types that passes made stale cannot conflict with what inference finds.
  bool value_info_only_for_custom_domains = false;
};

void set_type_proto(onnx::TypeProto& tp, const ValueInfo& vi, size_t level = 0) {
  if (level < vi.containers.size()) {
    onnx::TypeProto* elem = vi.containers[level] == ValueKind::kSequence
                                ? tp.mutable_sequence_type()->mutable_elem_type()
                                : tp.mutable_optional_type()->mutable_elem_type();
    set_type_proto(*elem, vi, level + 1);
    return;
  }
  auto* tt = tp.mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(vi.dtype));
  if (vi.shape) {
    auto* sh = tt->mutable_shape();
    for (int64_t d : *vi.shape) {
      auto* dim = sh->add_dim();
      if (d >= 0) dim->set_dim_value(d);
    }
  }
}

void set_type(onnx::ValueInfoProto& vp, const ValueInfo& vi) {
  if (vi.dtype == DType::kUndefined) return;
  set_type_proto(*vp.mutable_type(), vi);
}

Status export_graph(const Graph& g, onnx::GraphProto& gp, const ExportOptions& eo, bool main);

Status export_attribute(const std::string& name, const Attribute& a, onnx::AttributeProto& ap,
                        const ExportOptions& eo) {
  ap.set_name(name);
  switch (a.kind) {
    case AttrKind::kFloat:
      ap.set_type(onnx::AttributeProto::FLOAT);
      ap.set_f(a.f);
      break;
    case AttrKind::kInt:
      ap.set_type(onnx::AttributeProto::INT);
      ap.set_i(a.i);
      break;
    case AttrKind::kString:
      ap.set_type(onnx::AttributeProto::STRING);
      ap.set_s(a.s);
      break;
    case AttrKind::kFloats:
      ap.set_type(onnx::AttributeProto::FLOATS);
      for (float f : a.floats) ap.add_floats(f);
      break;
    case AttrKind::kInts:
      ap.set_type(onnx::AttributeProto::INTS);
      for (int64_t i : a.ints) ap.add_ints(i);
      break;
    case AttrKind::kStrings:
      ap.set_type(onnx::AttributeProto::STRINGS);
      for (const auto& s : a.strings) ap.add_strings(s);
      break;
    case AttrKind::kTensor:
      ap.set_type(onnx::AttributeProto::TENSOR);
      KEEL_RETURN_IF_ERROR(tensor_to_proto(a.t, "", *ap.mutable_t()), "attribute '" + name + "'");
      break;
    case AttrKind::kGraph:
      if (!a.g) return invalid_argument("graph attribute '" + name + "' is empty");
      ap.set_type(onnx::AttributeProto::GRAPH);
      KEEL_RETURN_IF_ERROR(export_graph(*a.g, *ap.mutable_g(), eo, false), "attribute '" + name + "'");
      break;
    case AttrKind::kType:
      if (a.type.dtype == DType::kUndefined)
        return invalid_argument("type attribute '" + name + "' has no element type");
      ap.set_type(onnx::AttributeProto::TYPE_PROTO);
      set_type_proto(*ap.mutable_tp(), a.type);
      break;
    default: return invalid_argument("attribute '" + name + "' has no kind");
  }
  return Status::ok();
}

Status export_graph(const Graph& g, onnx::GraphProto& gp, const ExportOptions& eo, bool main) {
  gp.set_name(g.name.empty() ? (main ? "main" : "subgraph") : g.name);
  std::vector<std::string> init_names;
  for (const auto& [n, t] : g.initializers) init_names.push_back(n);
  std::sort(init_names.begin(), init_names.end());  // deterministic output

  std::set<std::string> declared;
  for (const auto& n : g.inputs) {
    auto* vp = gp.add_input();
    vp->set_name(n);
    if (const ValueInfo* vi = g.info(n)) set_type(*vp, *vi);
    declared.insert(n);
  }
  for (const auto& n : init_names) {
    const Tensor& t = g.initializers.at(n);
    if (t.byte_size() > eo.max_initializer_bytes) {
      auto* vp = gp.add_input();
      vp->set_name(n);
      set_type(*vp, ValueInfo{t.dtype(), t.shape()});
    } else {
      KEEL_RETURN_IF_ERROR(tensor_to_proto(t, n, *gp.add_initializer()), "initializer '" + n + "'");
    }
    declared.insert(n);
  }
  for (const auto& n : g.outputs) {
    auto* vp = gp.add_output();
    vp->set_name(n);
    if (const ValueInfo* vi = g.info(n)) set_type(*vp, *vi);
  }
  for (const auto& n : g.outputs) declared.insert(n);

  KEEL_ASSIGN_OR_RETURN(std::vector<NodeId> order, g.topological_order(), "graph '" + g.name + "'");
  std::vector<std::string> vi_names;
  for (NodeId id : order) {
    const Node* n = g.node(id);
    auto* np = gp.add_node();
    if (!n->name.empty()) np->set_name(n->name);
    np->set_op_type(n->op_type);
    if (!n->domain.empty()) np->set_domain(n->domain);
    for (const auto& i : n->inputs) np->add_input(i);
    for (const auto& o : n->outputs) {
      np->add_output(o);
      if (!o.empty() && !declared.count(o)) {
        declared.insert(o);
        if (!eo.value_info_only_for_custom_domains || !(n->domain.empty() || n->domain == "ai.onnx"))
          vi_names.push_back(o);
      }
    }
    for (const auto& [k, a] : n->attrs) {
      if (a.kind == AttrKind::kUndefined) continue;
      KEEL_RETURN_IF_ERROR(export_attribute(k, a, *np->add_attribute(), eo), "node '" + n->name + "'");
    }
  }
  for (const auto& n : vi_names) {
    const ValueInfo* vi = g.info(n);
    if (!vi || vi->dtype == DType::kUndefined) continue;
    auto* vp = gp.add_value_info();
    vp->set_name(n);
    set_type(*vp, *vi);
  }
  return Status::ok();
}

bool uses_domain(const Graph& g, const std::string& domain) {
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->domain == domain) return true;
    for (const auto& [k, a] : n->attrs)
      if (a.g && uses_domain(*a.g, domain)) return true;
  }
  return false;
}

void collect_domains(const Graph& g, std::set<std::string>& out) {
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    out.insert(n->domain);
    for (const auto& [k, a] : n->attrs)
      if (a.g) collect_domains(*a.g, out);
  }
}

Status export_model(const Graph& g, onnx::ModelProto& m, const ExportOptions& eo) {
  m.Clear();
  m.set_ir_version(kExportIrVersion);
  m.set_producer_name("keel");
  m.set_producer_version("0.1.0");
  std::map<std::string, int32_t> opsets = g.opsets;
  std::set<std::string> domains;
  collect_domains(g, domains);
  for (const auto& d : domains) {
    if (opsets.count(d)) continue;
    if (d.empty()) opsets[d] = kMaxOnnxOpset;
    else opsets[d] = 1;
  }
  for (const auto& [d, v] : opsets) {
    auto* o = m.add_opset_import();
    o->set_domain(d);
    o->set_version(v);
  }
  return export_graph(g, *m.mutable_graph(), eo, true);
}

// Copies inferred types from a (shape-inferred) GraphProto back into the IR, recursing into subgraphs in the
// same node order export_graph used.
void copy_back_types(const onnx::GraphProto& gp, Graph& g) {
  auto take = [&](const onnx::ValueInfoProto& vp) {
    if (g.is_initializer(vp.name())) return;
    ValueInfo vi = value_info_from_type(vp.type());
    if (vi.dtype == DType::kUndefined && !vi.shape) return;
    merge_value_info(g.value_info[vp.name()], vi);
  };
  for (const auto& vp : gp.value_info()) take(vp);
  for (const auto& vp : gp.output()) take(vp);
  auto order = g.topological_order();
  if (!order.is_ok() || static_cast<int>(order->size()) != gp.node_size()) return;
  for (int i = 0; i < gp.node_size(); ++i) {
    Node* n = g.node((*order)[i]);
    const auto& np = gp.node(i);
    for (const auto& ap : np.attribute()) {
      if (ap.type() != onnx::AttributeProto::GRAPH) continue;
      auto it = n->attrs.find(ap.name());
      if (it != n->attrs.end() && it->second.g) copy_back_types(ap.g(), *it->second.g);
    }
  }
}

}  // namespace

Status graph_to_model_proto(const Graph& graph, onnx::ModelProto& out) {
  try {
    KEEL_RETURN_IF_ERROR(export_model(graph, out, {}), "ONNX export");
    // Graph outputs need a type in a valid model; fill in what ONNX can infer where the IR does not know it.
    bool missing = false;
    for (const auto& o : out.graph().output())
      if (!o.has_type()) missing = true;
    if (missing) {
      onnx::ModelProto inferred = out;
      try {
        onnx::ShapeInferenceOptions opts(false, 0, true);
        infer_onnx_shapes(inferred, opts);
        std::unordered_map<std::string, const onnx::ValueInfoProto*> by_name;
        for (const auto& v : inferred.graph().value_info()) by_name[v.name()] = &v;
        for (const auto& v : inferred.graph().output()) by_name[v.name()] = &v;
        for (auto& o : *out.mutable_graph()->mutable_output()) {
          auto it = by_name.find(o.name());
          if (!o.has_type() && it != by_name.end() && it->second->has_type()) *o.mutable_type() = it->second->type();
        }
      } catch (const std::exception&) {
        // Best effort: the model stays valid in structure, the checker will name the untyped output.
      }
    }
    return Status::ok();
  } catch (const std::exception& e) {
    return internal_error(std::string("ONNX export: ") + e.what());
  }
}

StatusOr<std::string> serialize_onnx(const Graph& graph) {
  onnx::ModelProto m;
  KEEL_RETURN_IF_ERROR(graph_to_model_proto(graph, m), "serialize_onnx");
  if (m.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return unimplemented(
        "serialize_onnx: the model is over 2 GiB; exporting weights as external data is not supported yet");
  }
  std::string out;
  if (!m.SerializeToString(&out)) return internal_error("serialize_onnx: protobuf serialisation failed");
  return out;
}

namespace {

// Moves raw_data of initializers >= threshold (in `gp` and its subgraphs) to `out` at 64-byte aligned offsets.
Status externalize(onnx::GraphProto& gp, const std::string& location, uint64_t threshold, std::ofstream& out,
                   uint64_t& offset, int depth) {
  if (depth > 64) return invalid_argument("subgraphs nested too deeply");
  for (auto& t : *gp.mutable_initializer()) {
    if (!t.has_raw_data() || t.raw_data().size() < threshold) continue;
    const uint64_t aligned = (offset + 63) / 64 * 64;
    static const char kZeros[64] = {};
    out.write(kZeros, static_cast<std::streamsize>(aligned - offset));
    out.write(t.raw_data().data(), static_cast<std::streamsize>(t.raw_data().size()));
    if (!out) return internal_error("writing external data '" + location + "' failed");
    const uint64_t length = t.raw_data().size();
    t.clear_raw_data();
    t.set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* e = t.add_external_data();
      e->set_key(k);
      e->set_value(v);
    };
    add("location", location);
    add("offset", std::to_string(aligned));
    add("length", std::to_string(length));
    offset = aligned + length;
  }
  for (auto& n : *gp.mutable_node())
    for (auto& a : *n.mutable_attribute())
      if (a.has_g()) KEEL_RETURN_IF_ERROR(externalize(*a.mutable_g(), location, threshold, out, offset, depth + 1), "");
  return Status::ok();
}

}  // namespace

Status save_onnx(const Graph& graph, const fs::path& file, const OnnxSaveOptions& options) {
  const std::string where = "save_onnx '" + file.string() + "'";
  onnx::ModelProto m;
  KEEL_RETURN_IF_ERROR(graph_to_model_proto(graph, m), where);
  const bool too_big = m.ByteSizeLong() > static_cast<size_t>(INT_MAX);
  using ED = OnnxSaveOptions::ExternalData;
  if (options.external_data == ED::kAlways || (too_big && options.external_data == ED::kAuto)) {
    std::string location = options.external_file.empty() ? file.filename().string() + ".data" : options.external_file;
    if (fs::path(location).has_parent_path() || location.empty()) {
      return invalid_argument(where + ": the external data file '" + location + "' must be a plain file name");
    }
    std::ofstream data(file.parent_path().empty() ? fs::path(location) : file.parent_path() / location,
                       std::ios::binary | std::ios::trunc);
    if (!data) return not_found(where + ": cannot open the external data file '" + location + "' for writing");
    uint64_t offset = 0;
    KEEL_RETURN_IF_ERROR(
        externalize(*m.mutable_graph(), location, std::max<uint64_t>(options.external_threshold, 1), data, offset, 0),
        where);
    data.close();
    if (!data) return internal_error(where + ": writing the external data file '" + location + "' failed");
  }
  if (m.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return invalid_argument(where + ": the model is over protobuf's 2 GiB limit" +
                            (options.external_data == ED::kNever
                                 ? std::string(" and external data is off")
                                 : std::string(" even with its weights in external data")));
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes)) return internal_error(where + ": protobuf serialisation failed");
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("save_onnx: cannot open '" + file.string() + "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return internal_error("save_onnx: writing '" + file.string() + "' failed");
  return Status::ok();
}

namespace {

// The types of the top-level values of a shape-inferred model (name -> ValueInfo).
std::unordered_map<std::string, ValueInfo> inferred_types(const onnx::GraphProto& gp) {
  std::unordered_map<std::string, ValueInfo> types;
  for (const auto* list : {&gp.input(), &gp.value_info(), &gp.output()})
    for (const auto& vp : *list) types[vp.name()] = value_info_from_type(vp.type());
  for (const auto& t : gp.initializer())
    types[t.name()] = ValueInfo(static_cast<DType>(t.data_type()), Shape(t.dims().begin(), t.dims().end()));
  return types;
}

// The values of a 1-D int64 initializer or Constant node output of `gp` (at most 64), if it is one.
std::optional<std::vector<int64_t>> small_i64_constant(const onnx::GraphProto& gp, const std::string& name) {
  auto read = [](const onnx::TensorProto& t) -> std::optional<std::vector<int64_t>> {
    if (t.data_type() != onnx::TensorProto::INT64 || t.dims_size() != 1 || t.dims(0) < 0 || t.dims(0) > 64)
      return std::nullopt;
    const auto n = static_cast<size_t>(t.dims(0));
    std::vector<int64_t> v(n);
    if (t.has_raw_data()) {
      if (t.raw_data().size() != n * sizeof(int64_t)) return std::nullopt;
      if (n > 0) std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());  // an empty vector's data() is null
    } else {
      if (static_cast<size_t>(t.int64_data_size()) != n) return std::nullopt;
      std::copy(t.int64_data().begin(), t.int64_data().end(), v.begin());
    }
    return v;
  };
  for (const auto& t : gp.initializer())
    if (t.name() == name) return read(t);
  for (const auto& np : gp.node())
    if (np.op_type() == "Constant" && np.output_size() == 1 && np.output(0) == name)
      for (const auto& a : np.attribute())
        if (a.name() == "value" && a.has_t()) return read(a.t());
  return std::nullopt;
}

// Ranks that ONNX 1.12's inference leaves open although they follow from what it knows: a Reshape whose target
// shape has a known length but values computed at run time (a dynamic batch: Shape -> Gather -> Concat), and a Slice
// with computed starts or ends (its output has its input's rank). Without a rank every node after them is untyped,
// and the passes that need one (layer normalisation, attention) leave a dynamic-batch transformer unfused. Adds to
// `m`'s value_info each such output with its rank and unknown dims (inference then fills in what it can); returns
// how many were added.
int add_open_ranks(onnx::ModelProto& m, const std::unordered_map<std::string, ValueInfo>& types) {
  auto rank_of = [&](const std::string& v) -> int64_t {
    auto it = types.find(v);
    return it != types.end() && it->second.is_tensor() && it->second.shape
               ? static_cast<int64_t>(it->second.shape->size())
               : -1;
  };
  auto open = [&](const std::string& v) { return !v.empty() && rank_of(v) < 0; };
  int added = 0;
  onnx::GraphProto& gp = *m.mutable_graph();
  const int n = gp.node_size();
  for (int i = 0; i < n; ++i) {
    const onnx::NodeProto& np = gp.node(i);
    if (!np.domain().empty() && np.domain() != "ai.onnx") continue;
    if (np.output_size() < 1 || np.input_size() < 2 || !open(np.output(0))) continue;
    auto data = types.find(np.input(0));
    if (data == types.end() || !data->second.is_tensor() || data->second.dtype == DType::kUndefined) continue;
    Shape shape;
    if (np.op_type() == "Reshape") {
      auto target = types.find(np.input(1));
      if (target != types.end() && target->second.shape && target->second.shape->size() == 1 &&
          (*target->second.shape)[0] >= 0 && (*target->second.shape)[0] <= 64)
        shape.assign(static_cast<size_t>((*target->second.shape)[0]), -1);
      else continue;
    } else if (np.op_type() == "Slice" && rank_of(np.input(0)) >= 0) {
      // Its rank, and the dims of the axes it does not slice where the axes are known (an initializer of `m`: a
      // small constant, or a value learnt by shape_values).
      const Shape& in = *data->second.shape;
      const int64_t rank = static_cast<int64_t>(in.size());
      shape.assign(in.size(), -1);
      std::optional<std::vector<int64_t>> axes;
      if (np.input_size() > 3 && !np.input(3).empty()) axes = small_i64_constant(gp, np.input(3));
      if (axes) {
        shape = in;
        for (int64_t a : *axes) {
          if (a < 0) a += rank;
          if (a >= 0 && a < rank) shape[static_cast<size_t>(a)] = -1;
        }
      }
    } else {
      continue;
    }
    auto* vp = gp.add_value_info();
    vp->set_name(np.output(0));
    set_type_proto(*vp->mutable_type(), ValueInfo(data->second.dtype, std::move(shape)));
    ++added;
  }
  return added;
}

// Inference runs in ONNX's lenient mode (error_mode 0), which leaves a node it cannot type without a word: the session
// then failed at its first run ("output 0 of 'Resize_3' has no known dtype") for a graph whose fault ONNX knew when it
// was built (a Resize with bf16 scales). Where an ONNX-domain node's output that something reads (a node, the graph's
// outputs) is still untyped, inference runs once more in the strict mode and its diagnostic becomes the error; a graph
// the strict mode accepts is left as it was. (A model loaded with lax shape inference loads, and is refused here.)
Status explain_untyped_outputs(const Graph& graph, const onnx::ModelProto& exported) {
  std::string untyped;
  for (NodeId id : graph.node_ids()) {
    const Node* n = graph.node(id);
    if (!n->domain.empty() && n->domain != "ai.onnx") continue;
    for (const auto& out : n->outputs) {
      if (out.empty()) continue;
      const ValueInfo* vi = graph.info(out);
      const bool untyped_value = !vi || (vi->is_tensor() && vi->dtype == DType::kUndefined);
      // (consumers() walks the graph: asked only of the rare untyped value)
      if (untyped_value && (graph.is_graph_output(out) || !graph.consumers(out).empty())) {
        untyped = "'" + out + "' (output of " + n->op_type + " node '" + n->name + "')";
        break;
      }
    }
    if (!untyped.empty()) break;
  }
  if (untyped.empty()) return Status::ok();
  onnx::ModelProto strict = exported;
  try {
    onnx::ShapeInferenceOptions opts(/*check_type=*/false, /*error_mode=*/1, /*data_prop=*/true);
    infer_onnx_shapes(strict, opts);
  } catch (const std::exception& e) {
    return invalid_argument("the type of " + untyped +
                            " is unknown: ONNX shape inference reports: " + one_line(e.what()));
  }
  return Status::ok();
}

}  // namespace

Status infer_shapes(Graph& graph) {
  try {
    onnx::ModelProto exported;
    ExportOptions eo;
    eo.max_initializer_bytes = 4096;  // shape-carrying constants are small; weights only need their type
    eo.value_info_only_for_custom_domains = true;
    KEEL_RETURN_IF_ERROR(check_graph_attributes(graph, /*inferred_shapes=*/false), "infer_shapes");
    KEEL_RETURN_IF_ERROR(export_model(graph, exported, eo), "infer_shapes");
    onnx::ShapeInferenceOptions opts(/*check_type=*/false, /*error_mode=*/0, /*data_prop=*/true);
    onnx::ModelProto m = exported;
    try {
      infer_onnx_shapes(m, opts);
    } catch (const std::exception& e) {
      return invalid_argument(std::string("infer_shapes: ONNX shape inference failed: ") + one_line(e.what()));
    }
    // Infers `next` and takes it as the current round, or keeps the current one when inference fails on it.
    auto infer_next = [&](onnx::ModelProto& next, const char* with) {
      try {
        infer_onnx_shapes(next, opts);
      } catch (const std::exception& e) {
        log::debug("infer_shapes: inference with {} failed, keeping the previous round: {}", with, one_line(e.what()));
        return false;
      }
      m = std::move(next);
      return true;
    };
    // ONNX 1.12's data propagation misses Constant nodes, Div, and a Reshape whose shape is computed: learn the
    // small values of shape computations (shape_values.h) and infer again with them as initializers of the inferred
    // copy, until nothing new is learnt. The graph itself gets only the types.
    const auto t0 = std::chrono::steady_clock::now();
    std::unordered_map<std::string, Tensor> known;
    std::unordered_set<NodeId> tried;
    int rounds = 0;
    for (; rounds < 64 && shape_values::enabled(); ++rounds) {
      if (shape_values::propagate(graph, inferred_types(m.graph()), known, tried) == 0) break;
      onnx::ModelProto next = exported;
      bool added = false;
      for (const auto& [name, t] : known) {
        if (graph.is_initializer(name)) continue;
        KEEL_RETURN_IF_ERROR(tensor_to_proto(t, name, *next.mutable_graph()->add_initializer()), "infer_shapes");
        added = true;
      }
      if (!added || !infer_next(next, "learnt shape values")) break;
    }
    // Then the ranks inference left open (add_open_ranks), a few rounds: each can open the next.
    for (int r = 0; r < 8; ++r) {
      onnx::ModelProto next = m;
      if (add_open_ranks(next, inferred_types(m.graph())) == 0 || !infer_next(next, "the open ranks filled in")) break;
    }
    if (!known.empty() && rounds > 0)
      log::debug("infer_shapes: {} shape value(s) known after {} round(s) of inference ({:.1f} ms)", known.size(),
                 rounds + 1, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    copy_back_types(m.graph(), graph);
    KEEL_RETURN_IF_ERROR(explain_untyped_outputs(graph, exported), "infer_shapes");
    // The learnt values are initializers of the last inferred copy: their types are not in its value_info.
    for (const auto& [name, t] : known)
      if (!graph.is_initializer(name)) merge_value_info(graph.value_info[name], ValueInfo(t.dtype(), t.shape()));
    KEEL_RETURN_IF_ERROR(check_graph_attributes(graph), "infer_shapes");  // again, with the shapes inference learnt
    return check_static_sizes(graph);
  } catch (const std::exception& e) {
    return internal_error(std::string("infer_shapes: ") + e.what());
  }
}

}  // namespace keel
