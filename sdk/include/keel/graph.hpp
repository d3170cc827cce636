// keel/graph.hpp — a header-only C++17 layer over the graph part of plugin.h, for passes and claimers.
//
// The plugin boundary is C (plugin.h); this header is C++ convenience on the plugin's own side of it, compiled into
// the plugin. It depends on <keel/plugin.h>, <keel/shape.hpp> and the standard library only. It gives:
//  - GraphView: reading (nodes in topological order, attributes, value info, initializers as typed vectors,
//    producers/consumers) and editing (add/remove nodes, initializers, attributes) with std:: types. Every string
//    the C API returns is copied at once (they die on the next edit). Editing failures throw PassError. A graph given
//    read-only (claim_subgraphs) is only read.
//  - PassError and run_pass(): a pass body throws freely; run_pass catches everything at the C edge and turns it into
//    a keel_status_t made by the host (no exception crosses the boundary).
//  - Report and PassOptions: thin wrappers of keel_pass_report_t and keel_options_api_t; register_pass().
// Nothing here is thread-safe: a graph is read or edited by one pass (or claimer) at a time.
#pragma once

#include <keel/plugin.h>
#include <keel/shape.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace keel::sdk {

class PassError : public std::exception {
 public:
  PassError(int32_t code, std::string message) : code_(code), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  int32_t code() const { return code_; }

 private:
  int32_t code_;
  std::string message_;
};

// Throws a PassError carrying `st`'s code and message (with `context` in front); releases `st`. NULL = no-op.
inline void throw_if_error(keel_status_t st, const std::string& context) {
  if (st == nullptr) return;
  int32_t code = st->code == KEEL_STATUS_OK ? KEEL_STATUS_INTERNAL : st->code;
  std::string msg = context + ": " + (st->message ? st->message : "");
  keel_status_release(st);
  throw PassError(code, msg);
}

// A value's type as the graph knows it. ndim -1: rank unknown; dims of -1 unknown.
struct ValueType {
  int32_t dtype = KEEL_DTYPE_UNDEFINED;
  int32_t ndim = -1;
  std::vector<int64_t> dims;
  bool fully_known() const {
    if (ndim < 0) return false;
    for (int64_t d : dims)
      if (d < 0) return false;
    return true;
  }
};

// An attribute value, for copying nodes and comparing them. Kinds the C API cannot read (tensor, graph, strings)
// are `unreadable`.
struct AttrValue {
  int32_t kind = KEEL_ATTR_UNDEFINED;
  int64_t i = 0;
  float f = 0;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<float> floats;
  bool unreadable() const {
    return kind != KEEL_ATTR_INT && kind != KEEL_ATTR_FLOAT && kind != KEEL_ATTR_STRING && kind != KEEL_ATTR_INTS &&
           kind != KEEL_ATTR_FLOATS;
  }
  bool operator==(const AttrValue& o) const {
    if (kind != o.kind || unreadable()) return false;
    // Floats compare bitwise so that NaN attributes of two identical nodes still match.
    auto feq = [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    if (floats.size() != o.floats.size()) return false;
    for (size_t k = 0; k < floats.size(); ++k)
      if (!feq(floats[k], o.floats[k])) return false;
    return i == o.i && feq(f, o.f) && s == o.s && ints == o.ints;
  }
  static AttrValue of_int(int64_t v) {
    AttrValue a;
    a.kind = KEEL_ATTR_INT;
    a.i = v;
    return a;
  }
  static AttrValue of_float(float v) {
    AttrValue a;
    a.kind = KEEL_ATTR_FLOAT;
    a.f = v;
    return a;
  }
  static AttrValue of_string(std::string v) {
    AttrValue a;
    a.kind = KEEL_ATTR_STRING;
    a.s = std::move(v);
    return a;
  }
  static AttrValue of_ints(std::vector<int64_t> v) {
    AttrValue a;
    a.kind = KEEL_ATTR_INTS;
    a.ints = std::move(v);
    return a;
  }
  static AttrValue of_floats(std::vector<float> v) {
    AttrValue a;
    a.kind = KEEL_ATTR_FLOATS;
    a.floats = std::move(v);
    return a;
  }
};
using Attrs = std::map<std::string, AttrValue>;

// A host tensor owned by the pass (to write initializers).
struct HostTensor {
  int32_t dtype = KEEL_DTYPE_F32;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;

  template <class T>
  static HostTensor of(int32_t dtype, std::vector<int64_t> dims, const std::vector<T>& values) {
    HostTensor t;
    t.dtype = dtype;
    t.dims = std::move(dims);
    t.bytes.resize(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    return t;
  }
  keel_tensor_t view() const {
    keel_tensor_t v{};
    v.struct_size = sizeof v;
    v.dtype = dtype;
    v.ndim = static_cast<int32_t>(dims.size());
    v.dims = dims.data();
    v.data = const_cast<uint8_t*>(bytes.data());
    v.byte_size = bytes.size();
    v.memory_kind = KEEL_MEMORY_HOST;
    v.device_index = 0;
    return v;
  }
};

class GraphView {
 public:
  GraphView(keel_graph_t* g, const keel_graph_api_t* api) : g_(g), api_(api) {}
  // A read-only graph (a device's or claimer's claim_subgraphs): use only the reading functions.
  GraphView(const keel_graph_t* g, const keel_graph_api_t* api) : g_(const_cast<keel_graph_t*>(g)), api_(api) {}

  keel_graph_t* raw() const { return g_; }
  const keel_graph_api_t* api() const { return api_; }

  // ------------------------------------------------------------------------------------------------ reading
  std::vector<keel_node_id_t> nodes() const {
    size_t n = api_->nodes(g_, nullptr, 0);
    std::vector<keel_node_id_t> ids(n);
    if (n) ids.resize(api_->nodes(g_, ids.data(), n));
    return ids;
  }
  size_t node_count() const { return api_->nodes(g_, nullptr, 0); }
  bool exists(keel_node_id_t n) const { return api_->node_exists(g_, n) != 0; }
  std::string op(keel_node_id_t n) const { return api_->node_op_type(g_, n); }
  // "" for ai.onnx (either spelling).
  std::string domain(keel_node_id_t n) const {
    std::string d = api_->node_domain(g_, n);
    return d == "ai.onnx" ? std::string() : d;
  }
  std::string name(keel_node_id_t n) const { return api_->node_name(g_, n); }
  // True for an ai.onnx node of this op type.
  bool is(keel_node_id_t n, const char* op_type) const {
    return exists(n) && domain(n).empty() && std::strcmp(api_->node_op_type(g_, n), op_type) == 0;
  }
  std::vector<std::string> inputs(keel_node_id_t n) const {
    std::vector<std::string> v;
    for (size_t i = 0, c = api_->node_input_count(g_, n); i < c; ++i) v.emplace_back(api_->node_input(g_, n, i));
    return v;
  }
  std::vector<std::string> outputs(keel_node_id_t n) const {
    std::vector<std::string> v;
    for (size_t i = 0, c = api_->node_output_count(g_, n); i < c; ++i) v.emplace_back(api_->node_output(g_, n, i));
    return v;
  }
  // Input i, "" when absent.
  std::string input(keel_node_id_t n, size_t i) const {
    return i < api_->node_input_count(g_, n) ? std::string(api_->node_input(g_, n, i)) : std::string();
  }
  std::string output(keel_node_id_t n, size_t i) const {
    return i < api_->node_output_count(g_, n) ? std::string(api_->node_output(g_, n, i)) : std::string();
  }

  std::optional<int64_t> attr_int(keel_node_id_t n, const char* a) const {
    int64_t v;
    if (api_->node_attr_int(g_, n, a, &v)) return v;
    return std::nullopt;
  }
  std::optional<float> attr_float(keel_node_id_t n, const char* a) const {
    float v;
    if (api_->node_attr_float(g_, n, a, &v)) return v;
    return std::nullopt;
  }
  std::optional<std::string> attr_string(keel_node_id_t n, const char* a) const {
    const char* v = nullptr;
    if (api_->node_attr_string(g_, n, a, &v) && v) return std::string(v);
    return std::nullopt;
  }
  std::optional<std::vector<int64_t>> attr_ints(keel_node_id_t n, const char* a) const {
    const int64_t* v = nullptr;
    size_t c = 0;
    if (api_->node_attr_ints(g_, n, a, &v, &c)) return std::vector<int64_t>(v, v + c);
    return std::nullopt;
  }
  std::optional<std::vector<float>> attr_floats(keel_node_id_t n, const char* a) const {
    const float* v = nullptr;
    size_t c = 0;
    if (api_->node_attr_floats(g_, n, a, &v, &c)) return std::vector<float>(v, v + c);
    return std::nullopt;
  }
  bool has_attr(keel_node_id_t n, const char* a) const { return api_->node_attr_kind(g_, n, a) != KEEL_ATTR_UNDEFINED; }
  // Every attribute of a node; kinds the API cannot read come back with only `kind` set (AttrValue::unreadable).
  Attrs attrs(keel_node_id_t n) const {
    Attrs out;
    for (size_t i = 0, c = api_->node_attr_count(g_, n); i < c; ++i) {
      std::string an = api_->node_attr_name(g_, n, i);
      AttrValue v;
      v.kind = api_->node_attr_kind(g_, n, an.c_str());
      switch (v.kind) {
        case KEEL_ATTR_INT: v.i = *attr_int(n, an.c_str()); break;
        case KEEL_ATTR_FLOAT: v.f = *attr_float(n, an.c_str()); break;
        case KEEL_ATTR_STRING: v.s = *attr_string(n, an.c_str()); break;
        case KEEL_ATTR_INTS: v.ints = *attr_ints(n, an.c_str()); break;
        case KEEL_ATTR_FLOATS: v.floats = *attr_floats(n, an.c_str()); break;
        default: break;
      }
      out.emplace(std::move(an), std::move(v));
    }
    return out;
  }
  static bool all_readable(const Attrs& a) {
    for (const auto& [k, v] : a)
      if (v.unreadable()) return false;
    return true;
  }

  std::optional<ValueType> value_type(const std::string& v) const {
    int32_t dt = 0, nd = -1;
    int64_t dims[16];
    if (!api_->value_info(g_, v.c_str(), &dt, &nd, dims, 16)) return std::nullopt;
    if (nd > 16) return ValueType{dt, -1, {}};
    ValueType t{dt, nd, {}};
    if (nd >= 0) t.dims.assign(dims, dims + nd);
    return t;
  }
  std::optional<keel_node_id_t> producer(const std::string& v) const {
    keel_node_id_t id;
    if (!v.empty() && api_->value_producer(g_, v.c_str(), &id)) return id;
    return std::nullopt;
  }
  std::vector<keel_node_id_t> consumers(const std::string& v) const {
    size_t n = api_->value_consumers(g_, v.c_str(), nullptr, 0);
    std::vector<keel_node_id_t> ids(n);
    if (n) ids.resize(api_->value_consumers(g_, v.c_str(), ids.data(), n));
    return ids;
  }
  bool is_graph_output(const std::string& v) const { return api_->value_is_graph_output(g_, v.c_str()) != 0; }
  bool is_graph_input(const std::string& v) const {
    for (size_t i = 0, c = api_->graph_input_count(g_); i < c; ++i)
      if (v == api_->graph_input(g_, i)) return true;
    return false;
  }
  // Readers of `v`: consuming nodes, plus one when it is a graph output.
  size_t use_count(const std::string& v) const { return consumers(v).size() + (is_graph_output(v) ? 1 : 0); }
  // The value has exactly one reader, a node, and is not a graph output.
  bool single_use(const std::string& v) const { return !is_graph_output(v) && consumers(v).size() == 1; }

  const keel_tensor_t* initializer(const std::string& v) const {
    const keel_tensor_t* t = nullptr;
    if (!v.empty() && api_->initializer(g_, v.c_str(), &t)) return t;
    return nullptr;
  }
  bool is_initializer(const std::string& v) const { return initializer(v) != nullptr; }
  static std::vector<int64_t> dims_of(const keel_tensor_t* t) {
    return std::vector<int64_t>(t->dims, t->dims + t->ndim);
  }
  // Element count, saturated (keel/shape.hpp numel).
  static int64_t numel_of(const keel_tensor_t* t) { return numel(*t); }
  // An initializer's elements converted to double (numeric dtypes except f16/bf16); nullopt otherwise.
  std::optional<std::vector<double>> constant_values(const std::string& v) const {
    const keel_tensor_t* t = initializer(v);
    if (!t) return std::nullopt;
    int64_t n = numel_of(t);
    std::vector<double> r(static_cast<size_t>(n));
    auto fill = [&](auto* p) {
      for (int64_t i = 0; i < n; ++i) r[i] = static_cast<double>(p[i]);
    };
    switch (t->dtype) {
      case KEEL_DTYPE_F32: fill(static_cast<const float*>(t->data)); break;
      case KEEL_DTYPE_F64: fill(static_cast<const double*>(t->data)); break;
      case KEEL_DTYPE_I32: fill(static_cast<const int32_t*>(t->data)); break;
      case KEEL_DTYPE_I64: fill(static_cast<const int64_t*>(t->data)); break;
      case KEEL_DTYPE_I8: fill(static_cast<const int8_t*>(t->data)); break;
      case KEEL_DTYPE_U8: fill(static_cast<const uint8_t*>(t->data)); break;
      default: return std::nullopt;
    }
    return r;
  }
  // The value of a constant with exactly one element (any rank), else nullopt.
  std::optional<double> scalar(const std::string& v) const {
    auto c = constant_values(v);
    if (!c || c->size() != 1) return std::nullopt;
    return (*c)[0];
  }
  // An f32 initializer's elements.
  std::optional<std::vector<float>> f32_values(const std::string& v) const {
    const keel_tensor_t* t = initializer(v);
    if (!t || t->dtype != KEEL_DTYPE_F32) return std::nullopt;
    const float* p = static_cast<const float*>(t->data);
    return std::vector<float>(p, p + numel_of(t));
  }
  int32_t opset(const char* dom) const { return api_->opset(g_, dom); }
  std::vector<std::string> graph_outputs() const {
    std::vector<std::string> v;
    for (size_t i = 0, c = api_->graph_output_count(g_); i < c; ++i) v.emplace_back(api_->graph_output(g_, i));
    return v;
  }

  // ------------------------------------------------------------------------------------------------ editing
  keel_node_id_t add_node(const std::string& dom, const std::string& op_type, const std::string& node_name,
                          const std::vector<std::string>& ins, const std::vector<std::string>& outs,
                          const Attrs& attrs = {}) {
    std::vector<const char*> in_p, out_p;
    for (const auto& s : ins) in_p.push_back(s.c_str());
    for (const auto& s : outs) out_p.push_back(s.c_str());
    keel_node_id_t id = 0;
    throw_if_error(api_->add_node(g_, dom.c_str(), op_type.c_str(), node_name.c_str(), in_p.data(), in_p.size(),
                                  out_p.data(), out_p.size(), &id),
                   "adding " + op_type + " node '" + node_name + "'");
    for (const auto& [k, v] : attrs) set_attr(id, k, v);
    return id;
  }
  void set_attr(keel_node_id_t n, const std::string& k, const AttrValue& v) {
    keel_status_t st = nullptr;
    switch (v.kind) {
      case KEEL_ATTR_INT: st = api_->set_attr_int(g_, n, k.c_str(), v.i); break;
      case KEEL_ATTR_FLOAT: st = api_->set_attr_float(g_, n, k.c_str(), v.f); break;
      case KEEL_ATTR_STRING: st = api_->set_attr_string(g_, n, k.c_str(), v.s.c_str()); break;
      case KEEL_ATTR_INTS: st = api_->set_attr_ints(g_, n, k.c_str(), v.ints.data(), v.ints.size()); break;
      case KEEL_ATTR_FLOATS: st = api_->set_attr_floats(g_, n, k.c_str(), v.floats.data(), v.floats.size()); break;
      default: throw PassError(KEEL_STATUS_INTERNAL, "cannot set attribute '" + k + "' of an unreadable kind");
    }
    throw_if_error(st, "setting attribute '" + k + "'");
  }
  void remove_node(keel_node_id_t n) { throw_if_error(api_->remove_node(g_, n), "removing a node"); }
  void set_input(keel_node_id_t n, size_t i, const std::string& v) {
    throw_if_error(api_->set_node_input(g_, n, i, v.c_str()), "setting a node input");
  }
  void replace_uses(const std::string& from, const std::string& to) {
    throw_if_error(api_->replace_uses(g_, from.c_str(), to.c_str()), "replacing uses of '" + from + "'");
  }
  void set_initializer(const std::string& v, const HostTensor& t) {
    keel_tensor_t view = t.view();
    throw_if_error(api_->set_initializer(g_, v.c_str(), &view), "setting initializer '" + v + "'");
  }
  void set_initializer(const std::string& v, const keel_tensor_t* t) {
    throw_if_error(api_->set_initializer(g_, v.c_str(), t), "setting initializer '" + v + "'");
  }
  void remove_initializer(const std::string& v) {
    throw_if_error(api_->remove_initializer(g_, v.c_str()), "removing initializer '" + v + "'");
  }
  std::string unique_name(const std::string& prefix) {
    char buf[512];
    throw_if_error(api_->unique_name(g_, prefix.c_str(), buf, sizeof buf), "unique_name");
    return buf;
  }
  void infer_shapes() { throw_if_error(api_->infer_shapes(g_), "shape inference"); }
  // Adds a new f32 initializer named after `prefix` and returns its name.
  std::string add_f32(const std::string& prefix, std::vector<int64_t> dims, const std::vector<float>& values) {
    std::string n = unique_name(prefix);
    set_initializer(n, HostTensor::of<float>(KEEL_DTYPE_F32, std::move(dims), values));
    return n;
  }

 private:
  keel_graph_t* g_;
  const keel_graph_api_t* api_;
};

// The report sink, C++ side.
class Report {
 public:
  explicit Report(keel_pass_report_t* r) : r_(r) {}
  void count(const std::string& key, int64_t v) {
    if (r_ && r_->count) r_->count(r_, key.c_str(), v);
  }
  void note(const std::string& text) {
    if (r_ && r_->note) r_->note(r_, text.c_str());
  }

 private:
  keel_pass_report_t* r_;
};

// Pass options with defaults.
class PassOptions {
 public:
  PassOptions(const keel_options_api_t* api, const keel_options_t* o) : api_(api), o_(o) {}
  int64_t get_int(const char* k, int64_t def) const {
    int64_t v;
    return api_ && api_->get_int(o_, k, &v) ? v : def;
  }
  double get_float(const char* k, double def) const {
    double v;
    return api_ && api_->get_float(o_, k, &v) ? v : def;
  }
  bool get_bool(const char* k, bool def) const {
    int v;
    return api_ && api_->get_bool(o_, k, &v) ? v != 0 : def;
  }
  std::string get_string(const char* k, const std::string& def) const {
    const char* v = nullptr;
    return api_ && api_->get_string(o_, k, &v) && v ? std::string(v) : def;
  }
  // A string-list option (or a single string), empty when absent.
  std::vector<std::string> get_strings(const char* k) const {
    std::vector<std::string> out;
    const char* v = nullptr;
    if (!api_) return out;
    for (size_t i = 0; api_->get_string_at(o_, k, i, &v) && v; ++i) out.emplace_back(v);
    if (out.empty() && api_->get_string(o_, k, &v) && v) out.emplace_back(v);
    return out;
  }

 private:
  const keel_options_api_t* api_;
  const keel_options_t* o_;
};

// Runs a pass body at the C edge: every exception becomes a status made by the host.
template <class F>
keel_status_t run_pass(const keel_core_api_t* host, F&& body) {
  try {
    body();
    return nullptr;
  } catch (const PassError& e) {
    return host->status_create(e.code(), e.what());
  } catch (const std::bad_alloc&) {
    return host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return host->status_create(KEEL_STATUS_INTERNAL, e.what());
  } catch (...) {
    return host->status_create(KEEL_STATUS_INTERNAL, "unknown exception in a pass");
  }
}

// Registers one pass definition; returns the host's status.
inline keel_status_t register_pass(const keel_core_api_t* host, keel_plugin_handle_t* plugin, const char* name,
                                   const char* description,
                                   keel_status_t (*run)(void*, keel_graph_t*, const keel_graph_api_t*,
                                                        const keel_options_t*, const char*, keel_pass_report_t*)) {
  keel_pass_def_t p{};
  p.struct_size = sizeof p;
  p.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  p.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  p.name = name;
  p.description = description;
  p.user_data = nullptr;
  p.run = run;
  return host->register_pass(plugin, &p);
}

}  // namespace keel::sdk
