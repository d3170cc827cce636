// keel/core/runtime/onnx_import.cc — ModelProto -> Graph: the ONNX checker, the version converter for old opsets,
// attribute checks before ONNX shape inference, shape inference itself (strict or lenient), sparse initializers,
// subgraphs, load from a file or from memory.
#include "core/runtime/onnx_io.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include "core/base/log.h"
#include "core/runtime/attribute_checks.h"
#include "core/runtime/onnx_io_internal.h"
#include "core/runtime/shape_values.h"

namespace keel {
namespace fs = std::filesystem;
using onnx_detail::check_static_sizes;
using onnx_detail::emit_warning;
using onnx_detail::FileBytes;
using onnx_detail::infer_onnx_shapes;
using onnx_detail::merge_value_info;
using onnx_detail::one_line;
using onnx_detail::read_file_bytes;
using onnx_detail::value_info_from_type;

namespace {

struct ImportContext {
  fs::path base_dir;
  uint64_t max_bytes;
  std::unordered_set<std::string> node_names;  // across the model and its subgraphs
  uint64_t external_bytes = 0;
  int depth = 0;
};

// Densifies a SparseTensorProto (values + indices, linear [NNZ] or coordinates [NNZ, rank]).
StatusOr<Tensor> tensor_from_sparse(const onnx::SparseTensorProto& sp, ImportContext& ctx) {
  KEEL_ASSIGN_OR_RETURN(Tensor values, tensor_from_proto(sp.values(), ctx.base_dir, ctx.max_bytes), "sparse values");
  KEEL_ASSIGN_OR_RETURN(Tensor indices, tensor_from_proto(sp.indices(), ctx.base_dir, ctx.max_bytes), "sparse indices");
  Shape shape(sp.dims().begin(), sp.dims().end());
  KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(values.dtype(), shape, ctx.max_bytes), "sparse tensor");
  (void)bytes;
  if (indices.dtype() != DType::kI64) return invalid_argument("sparse tensor indices must be int64");
  KEEL_ASSIGN_OR_RETURN(Tensor dense, Tensor::host(values.dtype(), shape), "sparse tensor");
  const int64_t nnz = values.rank() == 1 ? values.shape()[0] : -1;
  if (nnz < 0) return invalid_argument("sparse tensor values must be 1-D");
  const int64_t total = dense.numel();
  const size_t es = dtype_size(values.dtype());
  const int64_t* idx = indices.data<int64_t>();
  const bool linear = indices.rank() == 1;
  if (linear ? indices.shape()[0] != nnz
             : (indices.rank() != 2 || indices.shape()[0] != nnz ||
                indices.shape()[1] != static_cast<int64_t>(shape.size()))) {
    return invalid_argument("sparse tensor indices have shape " + shape_to_string(indices.shape()));
  }
  for (int64_t k = 0; k < nnz; ++k) {
    int64_t off = 0;
    if (linear) {
      off = idx[k];
    } else {
      for (size_t r = 0; r < shape.size(); ++r) {
        int64_t i = idx[k * static_cast<int64_t>(shape.size()) + static_cast<int64_t>(r)];
        if (i < 0 || i >= shape[r]) return invalid_argument("sparse tensor index out of range");
        off = off * shape[r] + i;
      }
    }
    if (off < 0 || off >= total) return invalid_argument("sparse tensor index out of range");
    std::memcpy(static_cast<char*>(dense.raw_data()) + off * es, static_cast<const char*>(values.raw_data()) + k * es,
                es);
  }
  return dense;
}

Status import_graph(const onnx::GraphProto& gp, Graph& g, ImportContext& ctx);

StatusOr<Attribute> import_attribute(const onnx::AttributeProto& ap, ImportContext& ctx) {
  Attribute a;
  switch (ap.type()) {
    case onnx::AttributeProto::FLOAT:
      a.kind = AttrKind::kFloat;
      a.f = ap.f();
      break;
    case onnx::AttributeProto::INT:
      a.kind = AttrKind::kInt;
      a.i = ap.i();
      break;
    case onnx::AttributeProto::STRING:
      a.kind = AttrKind::kString;
      a.s = ap.s();
      break;
    case onnx::AttributeProto::FLOATS:
      a.kind = AttrKind::kFloats;
      a.floats.assign(ap.floats().begin(), ap.floats().end());
      break;
    case onnx::AttributeProto::INTS:
      a.kind = AttrKind::kInts;
      a.ints.assign(ap.ints().begin(), ap.ints().end());
      break;
    case onnx::AttributeProto::STRINGS:
      a.kind = AttrKind::kStrings;
      a.strings.assign(ap.strings().begin(), ap.strings().end());
      break;
    case onnx::AttributeProto::TENSOR: {
      a.kind = AttrKind::kTensor;
      KEEL_ASSIGN_OR_RETURN(a.t, tensor_from_proto(ap.t(), ctx.base_dir, ctx.max_bytes),
                            "attribute '" + ap.name() + "'");
      break;
    }
    case onnx::AttributeProto::SPARSE_TENSOR: {
      a.kind = AttrKind::kTensor;
      KEEL_ASSIGN_OR_RETURN(a.t, tensor_from_sparse(ap.sparse_tensor(), ctx), "attribute '" + ap.name() + "'");
      break;
    }
    case onnx::AttributeProto::TYPE_PROTO: {
      a.kind = AttrKind::kType;
      a.type = value_info_from_type(ap.tp());
      if (a.type.dtype == DType::kUndefined) {
        return unimplemented("attribute '" + ap.name() +
                             "' names a type Keel does not represent (tensors, sequences and optionals of them only)");
      }
      break;
    }
    case onnx::AttributeProto::GRAPH: {
      if (ctx.depth > 64) return invalid_argument("subgraphs nested too deeply");
      a.kind = AttrKind::kGraph;
      a.g = std::make_shared<Graph>();
      ++ctx.depth;
      Status s = import_graph(ap.g(), *a.g, ctx);
      --ctx.depth;
      KEEL_RETURN_IF_ERROR(s, "subgraph attribute '" + ap.name() + "'");
      break;
    }
    default:
      return unimplemented("attribute '" + ap.name() + "' has type " +
                           onnx::AttributeProto::AttributeType_Name(ap.type()) + ", which Keel does not support");
  }
  return a;
}

Status import_graph(const onnx::GraphProto& gp, Graph& g, ImportContext& ctx) {
  g.name = gp.name();
  for (const auto& init : gp.initializer()) {
    if (init.name().empty()) return invalid_argument("an initializer has no name");
    KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(init, ctx.base_dir, ctx.max_bytes),
                          "initializer '" + init.name() + "'");
    if (init.data_location() == onnx::TensorProto::EXTERNAL) ctx.external_bytes += t.byte_size();
    g.value_info[init.name()] = ValueInfo{t.dtype(), t.shape()};
    g.initializers[init.name()] = std::move(t);
  }
  for (const auto& sp : gp.sparse_initializer()) {
    const std::string& n = sp.values().name();
    KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_sparse(sp, ctx), "sparse initializer '" + n + "'");
    g.value_info[n] = ValueInfo{t.dtype(), t.shape()};
    g.initializers[n] = std::move(t);
  }
  for (const auto& vi : gp.input()) {
    if (g.is_initializer(vi.name())) continue;
    g.inputs.push_back(vi.name());
    merge_value_info(g.value_info[vi.name()], value_info_from_type(vi.type()));
  }
  for (const auto& vi : gp.output()) {
    g.outputs.push_back(vi.name());
    if (g.is_initializer(vi.name())) continue;
    merge_value_info(g.value_info[vi.name()], value_info_from_type(vi.type()));
  }
  for (const auto& vi : gp.value_info()) {
    if (g.is_initializer(vi.name())) continue;
    merge_value_info(g.value_info[vi.name()], value_info_from_type(vi.type()));
  }
  int index = 0;
  for (const auto& np : gp.node()) {
    Node n;
    n.domain = np.domain() == "ai.onnx" ? std::string() : np.domain();
    n.op_type = np.op_type();
    n.name = np.name();
    if (n.name.empty() || ctx.node_names.count(n.name)) {
      std::string base = (n.name.empty() ? n.op_type : n.name) + "_" + std::to_string(index);
      std::string cand = base;
      for (int k = 1; ctx.node_names.count(cand); ++k) cand = base + "_" + std::to_string(k);
      n.name = cand;
    }
    ctx.node_names.insert(n.name);
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    for (const auto& ap : np.attribute()) {
      if (!ap.ref_attr_name().empty())
        return unimplemented("node '" + n.name + "': attribute references are only valid in functions");
      KEEL_ASSIGN_OR_RETURN(Attribute a, import_attribute(ap, ctx), "node '" + n.name + "' (" + n.op_type + ")");
      n.attrs[ap.name()] = std::move(a);
    }
    g.add_node(std::move(n));
    ++index;
  }
  return Status::ok();
}

// Finds the ai.onnx opset a model declares (1 when an old model declares none).
int64_t onnx_opset(const onnx::ModelProto& m) {
  for (const auto& o : m.opset_import())
    if (o.domain().empty() || o.domain() == "ai.onnx") return o.version();
  return m.opset_import_size() == 0 ? 1 : 0;  // 0: the model does not use ai.onnx
}

// onnx::checker::check_model(model) with the model's directory set, so that its external-data check looks in the
// right place (the public overload resolves locations against the working directory). Mirrors check_model of ONNX
// 1.12 (checker.cc); the loader's own resolution later refuses locations that escape the directory.
Status run_checker(const onnx::ModelProto& m, const fs::path& base_dir, const std::string& name) {
  try {
    if (!m.ir_version()) return invalid_argument(name + ": the model has no ir_version");
    if (m.ir_version() > onnx::IR_VERSION) {
      return unimplemented(name + ": the model's ir_version " + std::to_string(m.ir_version()) +
                           " is newer than this ONNX library knows (" + std::to_string(onnx::IR_VERSION) + ")");
    }
    std::unordered_map<std::string, int> opsets;
    for (const auto& o : m.opset_import()) {
      if (opsets.count(o.domain()))
        return invalid_argument(name + ": opset domain '" + o.domain() + "' is imported twice");
      opsets[o.domain()] = static_cast<int>(o.version());
    }
    if (m.ir_version() >= 3) {
      if (opsets.empty()) return invalid_argument(name + ": a model with IR version >= 3 must import an opset");
    } else {
      if (!opsets.empty()) return invalid_argument(name + ": a model with IR version < 3 cannot import opsets");
      opsets[""] = 1;
    }
    onnx::checker::CheckerContext ctx;
    ctx.set_ir_version(static_cast<int>(m.ir_version()));
    ctx.set_opset_imports(opsets);
    std::string dir = base_dir.empty() ? std::string() : base_dir.string();
    if (!dir.empty() && dir.back() != '/') dir += '/';
    ctx.set_model_dir(dir);
    onnx::checker::LexicalScopeContext lex;
    onnx::checker::check_graph(m.graph(), ctx, lex);
    if (m.ir_version() >= 8) onnx::checker::check_model_local_functions(m, ctx, lex);
  } catch (const std::exception& e) {
    return invalid_argument(name + ": the ONNX checker refused the model: " + one_line(e.what()));
  }
  return Status::ok();
}

// The ONNX 1.12 checker does not verify that graph outputs are produced, and ONNX's IR import (used by the
// version converter) dereferences null for an undefined one. Checks every graph output and (for subgraphs) every
// value read from an outer scope.
Status check_values_defined(const onnx::GraphProto& gp, std::vector<const std::unordered_set<std::string>*>& outer,
                            int depth) {
  if (depth > 64) return invalid_argument("subgraphs nested too deeply");
  std::unordered_set<std::string> defined;
  for (const auto& v : gp.input()) defined.insert(v.name());
  for (const auto& t : gp.initializer()) defined.insert(t.name());
  for (const auto& t : gp.sparse_initializer()) defined.insert(t.values().name());
  auto known = [&](const std::string& v) {
    if (v.empty() || defined.count(v)) return true;
    for (const auto* scope : outer)
      if (scope->count(v)) return true;
    return false;
  };
  outer.push_back(&defined);
  for (const auto& n : gp.node()) {
    for (const auto& i : n.input()) {
      if (!known(i)) {
        outer.pop_back();
        return invalid_argument("node '" + n.name() + "' (" + n.op_type() + ") reads '" + i +
                                "', which nothing defines");
      }
    }
    for (const auto& a : n.attribute()) {
      std::vector<const onnx::GraphProto*> subs;
      if (a.has_g()) subs.push_back(&a.g());
      for (const auto& g : a.graphs()) subs.push_back(&g);
      for (const auto* g : subs) {
        Status s = check_values_defined(*g, outer, depth + 1);
        if (!s.is_ok()) {
          outer.pop_back();
          return s.with_context("node '" + n.name() + "' (" + n.op_type() + ") attribute '" + a.name() + "'");
        }
      }
    }
    for (const auto& o : n.output()) defined.insert(o);
  }
  outer.pop_back();
  for (const auto& o : gp.output()) {
    if (!known(o.name())) return invalid_argument("graph output '" + o.name() + "' is not produced by any node");
  }
  return Status::ok();
}

// ONNX 1.12's data propagators (shape inference with data_prop) crash on two malformed shape computations that the
// shape-computation fuzzer (tests/fuzz/fuzz_shape_computations.py) found: Add/Sub/Mul read past an operand of 0
// elements when the other has one (`Shape(x, start=rank) * [2]`), and Shape dereferences the type of an input that
// inference could not type (Shape of an Add whose operands do not broadcast). The propagators of those schemas in
// ONNX's process-wide registry are wrapped, once per process, with checks that skip those cases: a skipped
// propagation loses only shape knowledge (the node's kernel still checks its inputs when it runs).
void guard_onnx_data_propagators() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto math = [](const onnx::DataPropagationFunction& inner) -> onnx::DataPropagationFunction {
      return [inner](onnx::DataPropagationContext& ctx) {
        const auto* a = ctx.getNumInputs() > 0 ? ctx.getInputData(0) : nullptr;
        const auto* b = ctx.getNumInputs() > 1 ? ctx.getInputData(1) : nullptr;
        if (a != nullptr && b != nullptr && a->dim_size() != b->dim_size() &&
            (a->dim_size() == 0 || b->dim_size() == 0))
          return;
        inner(ctx);
      };
    };
    auto typed_input = [](const onnx::DataPropagationFunction& inner) -> onnx::DataPropagationFunction {
      return [inner](onnx::DataPropagationContext& ctx) {
        if (ctx.getNumInputs() == 0 || ctx.getInputType(0) == nullptr) return;
        inner(ctx);
      };
    };
    for (const char* op : {"Add", "Sub", "Mul", "Shape"}) {
      std::set<const onnx::OpSchema*> seen;
      for (int v = 1; v <= kMaxOnnxOpset; ++v) {
        const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(op, v, onnx::ONNX_DOMAIN);
        if (schema == nullptr || !schema->has_data_propagation_function() || !seen.insert(schema).second) continue;
        const auto inner = schema->GetDataPropagationFunction();
        // The registry keeps its schemas as (non-const) values; it only hands out const pointers.
        const_cast<onnx::OpSchema*>(schema)->PartialDataPropagationFunction(
            std::string(op) == "Shape" ? typed_input(inner) : math(inner));
      }
    }
  });
}

// ONNX 1.12's shape-inference functions index input dims without checking ranks in places (the fuzzer found
// ConvTranspose reading W's dims by X's rank), which crashes on malformed models. These checks run first.
Status precheck_for_shape_inference(const onnx::GraphProto& gp, std::unordered_map<std::string, int>& ranks,
                                    int depth) {
  if (depth > 64) return invalid_argument("subgraphs nested too deeply");
  auto note = [&](const onnx::ValueInfoProto& v) {
    if (v.type().has_tensor_type() && v.type().tensor_type().has_shape())
      ranks[v.name()] = v.type().tensor_type().shape().dim_size();
  };
  for (const auto& v : gp.input()) note(v);
  for (const auto& v : gp.value_info()) note(v);
  for (const auto& v : gp.output()) note(v);
  for (const auto& t : gp.initializer()) ranks[t.name()] = t.dims_size();
  auto rank_of = [&](const onnx::NodeProto& n, int i) {
    if (i >= n.input_size()) return -1;
    auto it = ranks.find(n.input(i));
    return it == ranks.end() ? -1 : it->second;
  };
  static const std::unordered_map<std::string, std::pair<int, int>> kConvs = {
      {"Conv", {0, 1}}, {"ConvTranspose", {0, 1}}, {"ConvInteger", {0, 1}}, {"QLinearConv", {0, 3}}};
  for (const auto& n : gp.node()) {
    const bool onnx_domain = n.domain().empty() || n.domain() == "ai.onnx";
    auto conv = kConvs.find(n.op_type());
    if (onnx_domain && conv != kConvs.end()) {
      const int xr = rank_of(n, conv->second.first), wr = rank_of(n, conv->second.second);
      const std::string who = "node '" + n.name() + "' (" + n.op_type() + ")";
      if ((xr >= 0 && xr < 3) || (wr >= 0 && wr < 3))
        return invalid_argument(who + ": input and weight need rank 3 or more");
      if (xr >= 0 && wr >= 0 && xr != wr) {
        return invalid_argument(who + ": input has rank " + std::to_string(xr) + " but weight has rank " +
                                std::to_string(wr));
      }
      const int spatial = (xr >= 0 ? xr : wr) - 2;
      if (spatial > 0) {
        for (const auto& a : n.attribute()) {
          const int want = a.name() == "pads" ? 2 * spatial : spatial;
          const bool sized = a.name() == "kernel_shape" || a.name() == "strides" || a.name() == "dilations" ||
                             a.name() == "pads" || a.name() == "output_padding" || a.name() == "output_shape";
          if (sized && a.ints_size() != want && !(a.name() == "output_shape" && a.ints_size() == spatial + 2)) {
            return invalid_argument(who + ": attribute '" + a.name() + "' has " + std::to_string(a.ints_size()) +
                                    " values, expected " + std::to_string(want));
          }
        }
      }
    }
    for (const auto& a : n.attribute()) {
      if (a.has_g())
        KEEL_RETURN_IF_ERROR(precheck_for_shape_inference(a.g(), ranks, depth + 1), "node '" + n.name() + "'");
      for (const auto& g : a.graphs())
        KEEL_RETURN_IF_ERROR(precheck_for_shape_inference(g, ranks, depth + 1), "node '" + n.name() + "'");
    }
  }
  return Status::ok();
}

Status run_shape_inference(onnx::ModelProto& m, bool strict, const std::string& name, const OnnxLoadOptions& options) {
  auto attempt = [&](int error_mode) -> std::optional<std::string> {
    try {
      onnx::ShapeInferenceOptions opts(/*check_type=*/false, error_mode, /*data_prop=*/true);
      infer_onnx_shapes(m, opts);
    } catch (const std::exception& e) {
      return one_line(e.what());
    }
    return std::nullopt;
  };
  onnx::ModelProto backup;
  if (!strict) backup = m;
  if (auto err = attempt(1)) {
    if (strict) return invalid_argument(name + ": ONNX shape inference failed: " + *err);
    emit_warning(options, name + ": ONNX shape inference reported: " + *err + " (continuing without those shapes)");
    m = std::move(backup);
    if (auto err2 = attempt(0)) {
      return invalid_argument(name + ": ONNX shape inference failed: " + *err2);
    }
  }
  return Status::ok();
}

// PRelu before opset 7 took a per-channel slope of shape [C] for an input [N, C, ...]; opset 7 broadcasts the slope
// from the right instead, and ONNX's version converter does not rewrite it. Reshapes such constant slopes to
// [C, 1, ..., 1] so the upgraded model means what the old one did.
void fix_legacy_prelu(Graph& g) {
  for (NodeId id : g.node_ids()) {
    Node* n = g.node(id);
    if (!n->domain.empty() || n->op_type != "PRelu" || n->inputs.size() != 2) continue;
    auto it = g.initializers.find(n->inputs[1]);
    const ValueInfo* x = g.info(n->inputs[0]);
    if (it == g.initializers.end() || !x || !x->shape || x->shape->size() < 3) continue;
    const Tensor& slope = it->second;
    if (slope.rank() != 1 || slope.shape()[0] <= 1 || (*x->shape)[1] != slope.shape()[0]) continue;
    Shape shape(x->shape->size() - 1, 1);
    shape[0] = slope.shape()[0];
    auto reshaped = slope.reshaped(shape);
    if (!reshaped.is_ok()) continue;
    std::string name = g.unique_name(n->inputs[1] + "_per_channel");
    g.initializers[name] = std::move(reshaped).value();
    g.value_info[name] = ValueInfo{slope.dtype(), shape};
    const std::string old = n->inputs[1];
    n->inputs[1] = name;
    if (g.consumers(old).empty() && !g.is_graph_output(old)) {
      g.initializers.erase(old);
      g.value_info.erase(old);
    }
  }
}

}  // namespace

namespace onnx_detail {

// ONNX shape inference, with the data propagators guarded (above) and the inference functions of ops with attribute
// rules checking attributes first (attribute_checks.h). Every inference in the core goes through here.
void infer_onnx_shapes(onnx::ModelProto& m, const onnx::ShapeInferenceOptions& opts) {
  guard_onnx_data_propagators();
  guard_onnx_inference_attributes();
  onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), opts);
}

// A value whose static shape no machine could hold (over checked_byte_size's limit, 1 TiB: a broken or hostile model,
// e.g. a Reshape to constant dims of 10^12) is refused by name when the model is loaded and whenever shapes are
// inferred, before passes and devices multiply those dims. Values of subgraphs are checked when their node runs.
Status check_static_sizes(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& [name, vi] : g.value_info) {
    if (!vi.is_tensor() || !vi.shape) continue;
    if (std::any_of(vi.shape->begin(), vi.shape->end(), [](int64_t d) { return d < 0; })) continue;
    if (!checked_byte_size(vi.dtype, *vi.shape).is_ok()) names.push_back(name);
  }
  if (names.empty()) return Status::ok();
  std::sort(names.begin(), names.end());  // the same report every time
  const ValueInfo& first = g.value_info.at(names.front());
  return invalid_argument("value '" + names.front() + "' has the static shape " + shape_to_string(*first.shape) +
                          ", more than a tensor can hold" +
                          (names.size() > 1 ? " (and " + std::to_string(names.size() - 1) + " more value(s))" : "") +
                          ": the model cannot run");
}

}  // namespace onnx_detail

StatusOr<Graph> graph_from_model_proto(onnx::ModelProto& m, const fs::path& base_dir, const OnnxLoadOptions& options,
                                       const std::string& name) {
  try {
    OnnxModelMeta meta;
    meta.ir_version = m.ir_version();
    meta.producer_name = m.producer_name();
    meta.producer_version = m.producer_version();
    meta.domain = m.domain();
    meta.doc_string = m.doc_string();
    meta.model_version = m.model_version();
    for (const auto& p : m.metadata_props()) meta.metadata_props[p.key()] = p.value();
    for (const auto& o : m.opset_import()) {
      meta.declared_opsets[o.domain() == "ai.onnx" ? std::string() : o.domain()] = static_cast<int32_t>(o.version());
    }
    if (!m.has_graph()) return invalid_argument(name + ": the model has no graph");

    const int64_t opset = onnx_opset(m);
    if (opset > kMaxOnnxOpset) {
      return unimplemented(name + ": the model uses ai.onnx opset " + std::to_string(opset) +
                           "; Keel supports opsets " + std::to_string(kMinOnnxOpset) + " to " +
                           std::to_string(kMaxOnnxOpset));
    }
    if (options.check) KEEL_RETURN_IF_ERROR(run_checker(m, base_dir, name), "");
    {
      std::vector<const std::unordered_set<std::string>*> scopes;
      KEEL_RETURN_IF_ERROR(check_values_defined(m.graph(), scopes, 0), name);
      std::unordered_map<std::string, int> ranks;
      KEEL_RETURN_IF_ERROR(precheck_for_shape_inference(m.graph(), ranks, 0), name);
      // Attributes that ONNX 1.12's inference or a kernel would divide by, index with or allocate from.
      KEEL_RETURN_IF_ERROR(check_model_attributes(m.graph(),
                                                  [&m](const std::string& domain) {
                                                    for (const auto& o : m.opset_import()) {
                                                      const std::string d = o.domain() == "ai.onnx" ? "" : o.domain();
                                                      if (d == domain) return static_cast<int32_t>(o.version());
                                                    }
                                                    return 0;
                                                  }),
                           name);
    }

    if (opset != 0 && opset < kMinOnnxOpset) {
      if (!options.upgrade_old_opsets) {
        return unimplemented(name + ": the model uses ai.onnx opset " + std::to_string(opset) + "; Keel runs opsets " +
                             std::to_string(kMinOnnxOpset) + " and newer");
      }
      // Models without an opset import are opset 1 (IR version < 3); the converter wants it declared.
      if (m.opset_import_size() == 0) {
        auto* o = m.add_opset_import();
        o->set_domain("");
        o->set_version(1);
      }
      // The converter's broadcasting adapters need the shapes of intermediate values: infer them first.
      try {
        onnx::ShapeInferenceOptions opts(false, 0, false);
        infer_onnx_shapes(m, opts);
      } catch (const std::exception&) {
        // Best effort; the converter names what it misses.
      }
      const int32_t target = std::clamp(options.upgrade_target, kMinOnnxOpset, kMaxOnnxOpset);
      std::string failure;
      onnx::ModelProto upgraded;
      try {
        upgraded = onnx::version_conversion::ConvertVersion(m, target);
      } catch (const std::exception& e) {
        failure = one_line(e.what());
      }
      if (!failure.empty()) {
        return unimplemented(name + ": the model uses ai.onnx opset " + std::to_string(opset) +
                             " and ONNX's version converter could not upgrade it to opset " + std::to_string(target) +
                             ": " + failure);
      }
      if (upgraded.ir_version() < 3) upgraded.set_ir_version(3);
      m = std::move(upgraded);
      meta.upgraded = true;
      emit_warning(options, name + ": upgraded from ai.onnx opset " + std::to_string(opset) + " to " +
                                std::to_string(target) + " with ONNX's version converter");
      if (options.check) KEEL_RETURN_IF_ERROR(run_checker(m, base_dir, name + " (after the opset upgrade)"), "");
    }
    if (options.infer_shapes) {
      KEEL_RETURN_IF_ERROR(run_shape_inference(m, options.strict_shape_inference, name, options), "");
    }

    Graph g;
    g.opsets.clear();
    for (const auto& o : m.opset_import()) {
      g.opsets[o.domain() == "ai.onnx" ? std::string() : o.domain()] = static_cast<int32_t>(o.version());
    }
    if (m.opset_import_size() == 0) g.opsets[""] = 1;
    ImportContext ctx{base_dir, options.max_tensor_bytes, {}, 0, 0};
    KEEL_RETURN_IF_ERROR(import_graph(m.graph(), g, ctx), name);
    KEEL_RETURN_IF_ERROR(check_static_sizes(g), name);
    if (g.name.empty()) g.name = "main";
    if (meta.upgraded) fix_legacy_prelu(g);
    meta.external_bytes = ctx.external_bytes;
    if (options.meta) {
      meta.file_bytes = options.meta->file_bytes;
      *options.meta = std::move(meta);
    }
    return g;
  } catch (const std::bad_alloc&) {
    return out_of_memory(name + ": out of memory while loading the model");
  } catch (const std::exception& e) {
    return invalid_argument(name + ": " + one_line(e.what()));
  }
}

StatusOr<Graph> load_onnx_from_memory(const void* data, size_t size, const fs::path& base_dir,
                                      const OnnxLoadOptions& options, const std::string& name) {
  if (size > static_cast<size_t>(INT_MAX)) {
    return invalid_argument(name + ": the model is " + std::to_string(size) +
                            " bytes; ONNX files over 2 GiB must keep their weights in external data files");
  }
  onnx::ModelProto m;
  try {
    if (!m.ParseFromArray(data, static_cast<int>(size))) {
      return invalid_argument(name + ": not a valid ONNX model (protobuf parse error)");
    }
  } catch (const std::exception& e) {
    return invalid_argument(name + ": not a valid ONNX model (" + std::string(e.what()) + ")");
  }
  if (options.meta) options.meta->file_bytes = size;
  return graph_from_model_proto(m, base_dir, options, name);
}

StatusOr<Graph> load_onnx(const fs::path& file, const OnnxLoadOptions& options) {
  std::error_code ec;
  if (fs::is_regular_file(file, ec)) {
    const uint64_t size = fs::file_size(file, ec);
    if (!ec && size > static_cast<uint64_t>(INT_MAX)) {
      return invalid_argument(file.string() + ": the model file is " + std::to_string(size) +
                              " bytes; ONNX files over 2 GiB must keep their weights in external data files");
    }
  }
  KEEL_ASSIGN_OR_RETURN(FileBytes bytes, read_file_bytes(file, static_cast<uint64_t>(INT_MAX), "model file"),
                        "load_onnx");
  fs::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  return load_onnx_from_memory(bytes.data(), bytes.size(), dir, options, file.string());
}

}  // namespace keel
