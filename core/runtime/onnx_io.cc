// keel/core/runtime/onnx_io.cc — ONNX import/export over libonnx (checker, shape inference, version converter).
#include "core/runtime/onnx_io.h"

#include <onnx/checker.h>
#include <onnx/onnx-data.pb.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <system_error>
#include <unordered_set>

#include "core/base/log.h"
#include "core/runtime/attribute_checks.h"
#include "core/runtime/shape_values.h"

namespace keel {
namespace fs = std::filesystem;

namespace {

constexpr int64_t kExportIrVersion = 8;

void emit_warning(const OnnxLoadOptions& options, const std::string& message) {
  if (options.warn) {
    options.warn(message);
  } else {
    log::warn("{}", message);
  }
}

// Reads a whole file, refusing more than `limit` bytes.
StatusOr<std::string> read_file_bytes(const fs::path& file, uint64_t limit, const char* what) {
  std::error_code ec;
  auto st = fs::status(file, ec);
  if (ec || !fs::exists(st)) return not_found(std::string(what) + " '" + file.string() + "' does not exist");
  if (!fs::is_regular_file(st)) return invalid_argument(std::string(what) + " '" + file.string() + "' is not a regular file");
  uint64_t size = fs::file_size(file, ec);
  if (ec) return invalid_argument("cannot read the size of '" + file.string() + "': " + ec.message());
  if (size > limit) {
    return invalid_argument(std::string(what) + " '" + file.string() + "' has " + std::to_string(size) +
                            " bytes, over the limit of " + std::to_string(limit));
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("cannot open '" + file.string() + "'");
  std::string bytes;
  bytes.resize(size);
  if (size > 0 && !in.read(bytes.data(), static_cast<std::streamsize>(size))) {
    return invalid_argument("cannot read '" + file.string() + "'");
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------------------------
// TensorProto -> Tensor

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
    return invalid_argument("external data location '" + location + "' is absolute; it must be relative to the model's directory");
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
      if (!parse_u64(kv.value(), offset)) return invalid_argument(tensor_label(p) + ": bad external data offset '" + kv.value() + "'");
    } else if (kv.key() == "length") {
      if (!parse_u64(kv.value(), length)) return invalid_argument(tensor_label(p) + ": bad external data length '" + kv.value() + "'");
      has_length = true;
    }
  }
  if (has_length && length != bytes) {
    return invalid_argument(tensor_label(p) + ": external data length " + std::to_string(length) + " differs from the " +
                            std::to_string(bytes) + " bytes its shape needs");
  }
  KEEL_ASSIGN_OR_RETURN(fs::path file, resolve_external_location(base_dir, location), tensor_label(p));
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return not_found(tensor_label(p) + ": external data file '" + location + "' does not exist");
  uint64_t file_size = fs::file_size(file, ec);
  if (ec) return invalid_argument(tensor_label(p) + ": cannot read the size of '" + location + "'");
  if (offset > file_size || bytes > file_size - offset) {
    return invalid_argument(tensor_label(p) + ": external data '" + location + "' has " + std::to_string(file_size) +
                            " bytes; offset " + std::to_string(offset) + " + " + std::to_string(bytes) + " bytes is past its end");
  }
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, std::move(shape)), tensor_label(p));
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
                              " bytes but its type and shape " + shape_to_string(shape) + " need " + std::to_string(bytes));
    }
    KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, std::move(shape)), tensor_label(p));
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
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, std::move(shape)), tensor_label(p));
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
  if (!t.location().is_host()) return invalid_argument("tensor '" + name + "' is on " + t.location().to_string() + ", not the host");
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

// ---------------------------------------------------------------------------------------------------------------
// Model import

namespace {

ValueInfo value_info_from_type(const onnx::TypeProto& type, int depth = 0) {
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
      s.push_back(d.value_case() == onnx::TensorShapeProto::Dimension::kDimValue && d.dim_value() >= 0 ? d.dim_value() : -1);
    }
    vi.shape = std::move(s);
  }
  return vi;
}

// Merges what `b` knows into `a` (b wins where it is more specific).
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
             : (indices.rank() != 2 || indices.shape()[0] != nnz || indices.shape()[1] != static_cast<int64_t>(shape.size()))) {
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
    std::memcpy(static_cast<char*>(dense.raw_data()) + off * es, static_cast<const char*>(values.raw_data()) + k * es, es);
  }
  return dense;
}

Status import_graph(const onnx::GraphProto& gp, Graph& g, ImportContext& ctx);

StatusOr<Attribute> import_attribute(const onnx::AttributeProto& ap, ImportContext& ctx) {
  Attribute a;
  switch (ap.type()) {
    case onnx::AttributeProto::FLOAT: a.kind = AttrKind::kFloat; a.f = ap.f(); break;
    case onnx::AttributeProto::INT: a.kind = AttrKind::kInt; a.i = ap.i(); break;
    case onnx::AttributeProto::STRING: a.kind = AttrKind::kString; a.s = ap.s(); break;
    case onnx::AttributeProto::FLOATS: a.kind = AttrKind::kFloats; a.floats.assign(ap.floats().begin(), ap.floats().end()); break;
    case onnx::AttributeProto::INTS: a.kind = AttrKind::kInts; a.ints.assign(ap.ints().begin(), ap.ints().end()); break;
    case onnx::AttributeProto::STRINGS: a.kind = AttrKind::kStrings; a.strings.assign(ap.strings().begin(), ap.strings().end()); break;
    case onnx::AttributeProto::TENSOR: {
      a.kind = AttrKind::kTensor;
      KEEL_ASSIGN_OR_RETURN(a.t, tensor_from_proto(ap.t(), ctx.base_dir, ctx.max_bytes), "attribute '" + ap.name() + "'");
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
        return unimplemented("attribute '" + ap.name() + "' names a type Keel does not represent (tensors, sequences and optionals of them only)");
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
    KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(init, ctx.base_dir, ctx.max_bytes), "initializer '" + init.name() + "'");
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
      if (!ap.ref_attr_name().empty()) return unimplemented("node '" + n.name + "': attribute references are only valid in functions");
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

// "==> Context: Bad node spec for node. Name: X OpType: Y" is how the checker names the node; keep its text whole
// but on one line.
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
      if (opsets.count(o.domain())) return invalid_argument(name + ": opset domain '" + o.domain() + "' is imported twice");
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
        return invalid_argument("node '" + n.name() + "' (" + n.op_type() + ") reads '" + i + "', which nothing defines");
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
        if (a != nullptr && b != nullptr && a->dim_size() != b->dim_size() && (a->dim_size() == 0 || b->dim_size() == 0))
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
        const_cast<onnx::OpSchema*>(schema)->PartialDataPropagationFunction(std::string(op) == "Shape" ? typed_input(inner)
                                                                                                        : math(inner));
      }
    }
  });
}

// ONNX shape inference, with the data propagators guarded (above) and the inference functions of ops with attribute
// rules checking attributes first (attribute_checks.h). Every inference in the core goes through here.
void infer_onnx_shapes(onnx::ModelProto& m, const onnx::ShapeInferenceOptions& opts) {
  guard_onnx_data_propagators();
  guard_onnx_inference_attributes();
  onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), opts);
}

// ONNX 1.12's shape-inference functions index input dims without checking ranks in places (the fuzzer found
// ConvTranspose reading W's dims by X's rank), which crashes on malformed models. These checks run first.
Status precheck_for_shape_inference(const onnx::GraphProto& gp, std::unordered_map<std::string, int>& ranks, int depth) {
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
      if ((xr >= 0 && xr < 3) || (wr >= 0 && wr < 3)) return invalid_argument(who + ": input and weight need rank 3 or more");
      if (xr >= 0 && wr >= 0 && xr != wr) {
        return invalid_argument(who + ": input has rank " + std::to_string(xr) + " but weight has rank " + std::to_string(wr));
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
      if (a.has_g()) KEEL_RETURN_IF_ERROR(precheck_for_shape_inference(a.g(), ranks, depth + 1), "node '" + n.name() + "'");
      for (const auto& g : a.graphs()) KEEL_RETURN_IF_ERROR(precheck_for_shape_inference(g, ranks, depth + 1), "node '" + n.name() + "'");
    }
  }
  return Status::ok();
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
      return unimplemented(name + ": the model uses ai.onnx opset " + std::to_string(opset) + "; Keel supports opsets " +
                           std::to_string(kMinOnnxOpset) + " to " + std::to_string(kMaxOnnxOpset));
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
        return unimplemented(name + ": the model uses ai.onnx opset " + std::to_string(opset) +
                             "; Keel runs opsets " + std::to_string(kMinOnnxOpset) + " and newer");
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
                             " and ONNX's version converter could not upgrade it to opset " +
                             std::to_string(target) + ": " + failure);
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
  KEEL_ASSIGN_OR_RETURN(std::string bytes, read_file_bytes(file, static_cast<uint64_t>(INT_MAX), "model file"), "load_onnx");
  fs::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  return load_onnx_from_memory(bytes.data(), bytes.size(), dir, options, file.string());
}

// ---------------------------------------------------------------------------------------------------------------
// Export

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
    onnx::TypeProto* elem = vi.containers[level] == ValueKind::kSequence ? tp.mutable_sequence_type()->mutable_elem_type()
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

Status export_attribute(const std::string& name, const Attribute& a, onnx::AttributeProto& ap, const ExportOptions& eo) {
  ap.set_name(name);
  switch (a.kind) {
    case AttrKind::kFloat: ap.set_type(onnx::AttributeProto::FLOAT); ap.set_f(a.f); break;
    case AttrKind::kInt: ap.set_type(onnx::AttributeProto::INT); ap.set_i(a.i); break;
    case AttrKind::kString: ap.set_type(onnx::AttributeProto::STRING); ap.set_s(a.s); break;
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
      if (a.type.dtype == DType::kUndefined) return invalid_argument("type attribute '" + name + "' has no element type");
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
        if (!eo.value_info_only_for_custom_domains || !(n->domain.empty() || n->domain == "ai.onnx")) vi_names.push_back(o);
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
    return unimplemented("serialize_onnx: the model is over 2 GiB; exporting weights as external data is not supported yet");
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
    KEEL_RETURN_IF_ERROR(externalize(*m.mutable_graph(), location, std::max<uint64_t>(options.external_threshold, 1),
                                     data, offset, 0),
                         where);
    data.close();
    if (!data) return internal_error(where + ": writing the external data file '" + location + "' failed");
  }
  if (m.ByteSizeLong() > static_cast<size_t>(INT_MAX)) {
    return invalid_argument(where + ": the model is over protobuf's 2 GiB limit" +
                            (options.external_data == ED::kNever ? std::string(" and external data is off")
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
      if (!added) break;
      try {
        infer_onnx_shapes(next, opts);
      } catch (const std::exception& e) {
        log::debug("infer_shapes: inference with learnt shape values failed, keeping the previous round: {}",
                      one_line(e.what()));
        break;
      }
      m = std::move(next);
    }
    if (!known.empty() && rounds > 0)
      log::debug("infer_shapes: {} shape value(s) known after {} round(s) of inference ({:.1f} ms)", known.size(),
                    rounds + 1, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    copy_back_types(m.graph(), graph);
    // The learnt values are initializers of the last inferred copy: their types are not in its value_info.
    for (const auto& [name, t] : known)
      if (!graph.is_initializer(name)) merge_value_info(graph.value_info[name], ValueInfo(t.dtype(), t.shape()));
    KEEL_RETURN_IF_ERROR(check_graph_attributes(graph), "infer_shapes");  // again, with the shapes inference learnt
    return check_static_sizes(graph);
  } catch (const std::exception& e) {
    return internal_error(std::string("infer_shapes: ") + e.what());
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor files

StatusOr<Tensor> read_tensor_pb(const void* data, size_t size, std::string* name) {
  if (size > static_cast<size_t>(INT_MAX)) return invalid_argument("tensor file over 2 GiB");
  onnx::TensorProto p;
  try {
    if (!p.ParseFromArray(data, static_cast<int>(size))) return invalid_argument("not a valid ONNX TensorProto");
  } catch (const std::exception& e) {
    return invalid_argument(std::string("not a valid ONNX TensorProto: ") + e.what());
  }
  if (p.data_location() == onnx::TensorProto::EXTERNAL) return invalid_argument("tensor files with external data are not supported");
  if (name) *name = p.name();
  return tensor_from_proto(p, {}, uint64_t{1} << 36);
}

namespace {

// Finds `'key': value` in a NumPy header dict; returns the raw value text (up to the next top-level comma or brace).
std::optional<std::string> npy_field(const std::string& header, const std::string& key) {
  for (const char q : {'\'', '"'}) {
    std::string k = std::string(1, q) + key + std::string(1, q);
    size_t pos = header.find(k);
    if (pos == std::string::npos) continue;
    pos = header.find(':', pos + k.size());
    if (pos == std::string::npos) return std::nullopt;
    ++pos;
    while (pos < header.size() && header[pos] == ' ') ++pos;
    if (pos >= header.size()) return std::nullopt;
    if (header[pos] == '(') {
      size_t end = header.find(')', pos);
      if (end == std::string::npos) return std::nullopt;
      return header.substr(pos, end - pos + 1);
    }
    if (header[pos] == '\'' || header[pos] == '"') {
      size_t end = header.find(header[pos], pos + 1);
      if (end == std::string::npos) return std::nullopt;
      return header.substr(pos + 1, end - pos - 1);
    }
    size_t end = header.find_first_of(",}", pos);
    if (end == std::string::npos) return std::nullopt;
    std::string v = header.substr(pos, end - pos);
    while (!v.empty() && v.back() == ' ') v.pop_back();
    return v;
  }
  return std::nullopt;
}

}  // namespace

StatusOr<Tensor> read_npy(const void* data, size_t size) {
  const auto* b = static_cast<const unsigned char*>(data);
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) return invalid_argument("not a NumPy .npy file (bad magic)");
  const int major = b[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = b[8] | (size_t{b[9]} << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) return invalid_argument("truncated .npy header");
    header_len = b[8] | (size_t{b[9]} << 8) | (size_t{b[10]} << 16) | (size_t{b[11]} << 24);
    header_start = 12;
  } else {
    return invalid_argument(".npy format version " + std::to_string(major) + " is not supported");
  }
  if (header_len > size - header_start) return invalid_argument("truncated .npy header");
  std::string header(reinterpret_cast<const char*>(b + header_start), header_len);
  auto descr = npy_field(header, "descr");
  auto fortran = npy_field(header, "fortran_order");
  auto shape_text = npy_field(header, "shape");
  if (!descr || !shape_text) return invalid_argument(".npy header lacks descr or shape: " + header);
  if (fortran && *fortran != "False") return unimplemented(".npy files in Fortran order are not supported");
  if (descr->size() < 3) return invalid_argument(".npy dtype '" + *descr + "' is not understood");
  const char endian = (*descr)[0];
  const std::string kind = descr->substr(1);
  static const std::map<std::string, DType> kTypes = {
      {"f2", DType::kF16}, {"f4", DType::kF32}, {"f8", DType::kF64}, {"i1", DType::kI8},  {"i2", DType::kI16},
      {"i4", DType::kI32}, {"i8", DType::kI64}, {"u1", DType::kU8},  {"u2", DType::kU16}, {"u4", DType::kU32},
      {"u8", DType::kU64}, {"b1", DType::kBool}};
  auto it = kTypes.find(kind);
  if (it == kTypes.end()) return unimplemented(".npy dtype '" + *descr + "' is not supported");
  const DType dtype = it->second;
  if (endian == '>' && dtype_size(dtype) > 1) return unimplemented(".npy big-endian data is not supported");
  if (endian != '<' && endian != '|' && endian != '=' && endian != '>') {
    return invalid_argument(".npy dtype '" + *descr + "' is not understood");
  }
  Shape shape;
  std::string s = *shape_text;
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') return invalid_argument(".npy shape '" + s + "' is not a tuple");
  s = s.substr(1, s.size() - 2);
  size_t pos = 0;
  while (pos < s.size()) {
    while (pos < s.size() && (s[pos] == ' ' || s[pos] == ',')) ++pos;
    if (pos >= s.size()) break;
    size_t end = pos;
    while (end < s.size() && s[end] >= '0' && s[end] <= '9') ++end;
    if (end == pos) return invalid_argument(".npy shape '" + *shape_text + "' is not understood");
    int64_t d = 0;
    auto [p, ec] = std::from_chars(s.data() + pos, s.data() + end, d);
    if (ec != std::errc()) return invalid_argument(".npy shape '" + *shape_text + "' is too large");
    (void)p;
    shape.push_back(d);
    while (end < s.size() && s[end] == 'L') ++end;  // Python 2 longs
    pos = end;
  }
  KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape, uint64_t{1} << 36), ".npy");
  const size_t data_start = header_start + header_len;
  if (size - data_start < bytes) {
    return invalid_argument(".npy data has " + std::to_string(size - data_start) + " bytes; shape " +
                            shape_to_string(shape) + " needs " + std::to_string(bytes));
  }
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, shape), ".npy");
  if (bytes) std::memcpy(t.raw_data(), b + data_start, bytes);
  return t;
}

StatusOr<Tensor> read_tensor_file(const fs::path& file, std::string* name) {
  if (name) name->clear();
  KEEL_ASSIGN_OR_RETURN(std::string bytes, read_file_bytes(file, uint64_t{1} << 36, "tensor file"), "read_tensor_file");
  StatusOr<Tensor> t = (file.extension() == ".npy" || (bytes.size() >= 6 && std::memcmp(bytes.data(), "\x93NUMPY", 6) == 0))
                           ? read_npy(bytes.data(), bytes.size())
                           : read_tensor_pb(bytes.data(), bytes.size(), name);
  if (!t.is_ok()) return t.status().with_context(file.string());
  return t;
}

namespace {

constexpr uint64_t kMaxTensorFileBytes = uint64_t{1} << 36;

StatusOr<RunValue> sequence_from_proto(const onnx::SequenceProto& p) {
  if (p.elem_type() != onnx::SequenceProto::TENSOR && p.elem_type() != onnx::SequenceProto::UNDEFINED) {
    return unimplemented("sequence '" + p.name() + "': only sequences of tensors are supported");
  }
  std::vector<Tensor> items;
  DType dtype = DType::kUndefined;
  for (const auto& tp : p.tensor_values()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(tp, {}, kMaxTensorFileBytes), "sequence '" + p.name() + "'");
    dtype = t.dtype();
    items.push_back(std::move(t));
  }
  return RunValue::of_sequence(std::move(items), dtype);
}

Status sequence_to_proto(const RunValue& v, const std::string& name, onnx::SequenceProto& p) {
  p.set_name(name);
  p.set_elem_type(onnx::SequenceProto::TENSOR);
  for (const auto& t : v.sequence) KEEL_RETURN_IF_ERROR(tensor_to_proto(t, "", *p.add_tensor_values()), "sequence '" + name + "'");
  return Status::ok();
}

template <typename Proto>
Status parse_proto(Proto& p, const void* data, size_t size, const char* what) {
  if (size > static_cast<size_t>(INT_MAX)) return invalid_argument(std::string(what) + " file over 2 GiB");
  try {
    if (!p.ParseFromArray(data, static_cast<int>(size))) return invalid_argument(std::string("not a valid ONNX ") + what);
  } catch (const std::exception& e) {
    return invalid_argument(std::string("not a valid ONNX ") + what + ": " + e.what());
  }
  return Status::ok();
}

}  // namespace

StatusOr<RunValue> read_value_pb(const void* data, size_t size, const ValueInfo* declared, std::string* name) {
  if (!declared || declared->is_tensor()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, read_tensor_pb(data, size, name), "");
    return RunValue(std::move(t));
  }
  if (declared->containers[0] == ValueKind::kSequence) {
    onnx::SequenceProto p;
    KEEL_RETURN_IF_ERROR(parse_proto(p, data, size, "SequenceProto"), "");
    if (name) *name = p.name();
    return sequence_from_proto(p);
  }
  onnx::OptionalProto p;
  KEEL_RETURN_IF_ERROR(parse_proto(p, data, size, "OptionalProto"), "");
  if (name) *name = p.name();
  switch (p.elem_type()) {
    case onnx::OptionalProto::UNDEFINED: return RunValue::none();
    case onnx::OptionalProto::TENSOR: {
      if (!p.has_tensor_value()) return RunValue::none();
      KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_proto(p.tensor_value(), {}, kMaxTensorFileBytes), "optional '" + p.name() + "'");
      return RunValue(std::move(t));
    }
    case onnx::OptionalProto::SEQUENCE:
      if (!p.has_sequence_value()) return RunValue::none();
      return sequence_from_proto(p.sequence_value());
    default: return unimplemented("optional '" + p.name() + "': only optional tensors and sequences are supported");
  }
}

StatusOr<RunValue> read_value_file(const fs::path& file, const ValueInfo* declared, std::string* name) {
  if (name) name->clear();
  if (!declared || declared->is_tensor()) {
    KEEL_ASSIGN_OR_RETURN(Tensor t, read_tensor_file(file, name), "");
    return RunValue(std::move(t));
  }
  KEEL_ASSIGN_OR_RETURN(std::string bytes, read_file_bytes(file, kMaxTensorFileBytes, "value file"), "read_value_file");
  auto v = read_value_pb(bytes.data(), bytes.size(), declared, name);
  if (!v.is_ok()) return v.status().with_context(file.string());
  return v;
}

Status write_value_pb(const RunValue& value, const ValueInfo* declared, const fs::path& file, const std::string& name) {
  std::string bytes;
  const bool optional = declared && !declared->containers.empty() && declared->containers[0] == ValueKind::kOptional;
  if (optional) {
    onnx::OptionalProto p;
    p.set_name(name);
    if (value.is_tensor()) {
      p.set_elem_type(onnx::OptionalProto::TENSOR);
      KEEL_RETURN_IF_ERROR(tensor_to_proto(value.tensor, "", *p.mutable_tensor_value()), "write_value_pb");
    } else if (value.is_sequence()) {
      p.set_elem_type(onnx::OptionalProto::SEQUENCE);
      KEEL_RETURN_IF_ERROR(sequence_to_proto(value, "", *p.mutable_sequence_value()), "write_value_pb");
    } else {
      const bool seq = declared->containers.size() > 1 && declared->containers[1] == ValueKind::kSequence;
      p.set_elem_type(seq ? onnx::OptionalProto::SEQUENCE : onnx::OptionalProto::TENSOR);
    }
    if (!p.SerializeToString(&bytes)) return internal_error("write_value_pb: serialisation failed (over 2 GiB?)");
  } else if (value.is_sequence()) {
    onnx::SequenceProto p;
    KEEL_RETURN_IF_ERROR(sequence_to_proto(value, name, p), "write_value_pb");
    if (!p.SerializeToString(&bytes)) return internal_error("write_value_pb: serialisation failed (over 2 GiB?)");
  } else if (value.is_tensor()) {
    return write_tensor_pb(value.tensor, file, name);
  } else {
    return invalid_argument("write_value_pb: '" + name + "' holds " + value.describe() + " but is not optional");
  }
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("write_value_pb: cannot open '" + file.string() + "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return internal_error("write_value_pb: writing '" + file.string() + "' failed");
  return Status::ok();
}

Status write_tensor_pb(const Tensor& tensor, const fs::path& file, const std::string& name) {
  onnx::TensorProto p;
  KEEL_RETURN_IF_ERROR(tensor_to_proto(tensor, name, p), "write_tensor_pb");
  std::string bytes;
  if (!p.SerializeToString(&bytes)) return internal_error("write_tensor_pb: serialisation failed (over 2 GiB?)");
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) return not_found("write_tensor_pb: cannot open '" + file.string() + "' for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return internal_error("write_tensor_pb: writing '" + file.string() + "' failed");
  return Status::ok();
}

}  // namespace keel
