// The host side of the plugin ABI: the kernel API, the graph API and the per-plugin host table.
#include "core/runtime/host_api.h"

#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <set>
#include <type_traits>
#include <unordered_set>

#include "core/runtime/environment.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"

namespace keel {
namespace {

using Ctx = keel_kernel_context_t;

// ---------------------------------------------------------------------------------------------- kernel API

int32_t k_input_count(const Ctx* c) { return static_cast<int32_t>(c->inputs.size()); }
const keel_tensor_t* k_input(const Ctx* c, int32_t i) {
  return i >= 0 && i < static_cast<int32_t>(c->inputs.size()) ? c->inputs[i] : nullptr;
}
int32_t k_output_count(const Ctx* c) { return static_cast<int32_t>(c->output_dtypes.size()); }
int32_t k_output_dtype(const Ctx* c, int32_t i) {
  return i >= 0 && i < static_cast<int32_t>(c->output_dtypes.size()) ? static_cast<int32_t>(c->output_dtypes[i])
                                                                     : KEEL_DTYPE_UNDEFINED;
}

keel_status_t k_output(Ctx* c, int32_t i, int32_t ndim, const int64_t* dims, keel_tensor_t** out) {
  if (c->phase != Ctx::Phase::kCompute)
    return make_c_status(KEEL_STATUS_FAILED_PRECONDITION, "output() outside compute");
  if (i < 0 || i >= static_cast<int32_t>(c->output_dtypes.size())) {
    return make_c_status(KEEL_STATUS_OUT_OF_RANGE, ("output index " + std::to_string(i) + " out of range").c_str());
  }
  if (ndim < 0 || (ndim > 0 && dims == nullptr))
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "output(): bad rank");
  Shape shape(dims, dims + ndim);
  for (int64_t d : shape)
    if (d < 0) {
      return make_c_status(KEEL_STATUS_INVALID_ARGUMENT,
                           ("output(): negative dimension in " + shape_to_string(shape)).c_str());
    }
  auto t = c->allocate_output(i, c->output_dtypes[i], shape);
  if (!t.is_ok()) return t.status().to_c();
  c->outputs[i] = std::move(t).value();
  c->output_views[i] = c->outputs[i].c_view();
  *out = &c->output_views[i];
  return nullptr;
}

const Attribute* find_attr(const Ctx* c, const char* name, AttrKind kind) {
  if (c->node == nullptr || name == nullptr) return nullptr;
  const Attribute* a = c->node->attr(name);
  return a && a->kind == kind ? a : nullptr;
}
int k_attr_int(const Ctx* c, const char* n, int64_t* v) {
  if (auto* a = find_attr(c, n, AttrKind::kInt)) {
    *v = a->i;
    return 1;
  }
  return 0;
}
int k_attr_float(const Ctx* c, const char* n, float* v) {
  if (auto* a = find_attr(c, n, AttrKind::kFloat)) {
    *v = a->f;
    return 1;
  }
  return 0;
}
int k_attr_string(const Ctx* c, const char* n, const char** v) {
  if (auto* a = find_attr(c, n, AttrKind::kString)) {
    *v = a->s.c_str();
    return 1;
  }
  return 0;
}
int k_attr_ints(const Ctx* c, const char* n, const int64_t** v, size_t* count) {
  if (auto* a = find_attr(c, n, AttrKind::kInts)) {
    *v = a->ints.data();
    *count = a->ints.size();
    return 1;
  }
  return 0;
}
int k_attr_floats(const Ctx* c, const char* n, const float** v, size_t* count) {
  if (auto* a = find_attr(c, n, AttrKind::kFloats)) {
    *v = a->floats.data();
    *count = a->floats.size();
    return 1;
  }
  return 0;
}
int k_attr_tensor(const Ctx* c, const char* n, const keel_tensor_t** v) {
  auto* a = find_attr(c, n, AttrKind::kTensor);
  if (!a) return 0;
  auto* mc = const_cast<Ctx*>(c);
  auto [it, inserted] = mc->attr_tensor_views.emplace(n, a->t.c_view());
  *v = &it->second;
  return 1;
}
int k_attr_strings(const Ctx* c, const char* n, const char* const** v, size_t* count) {
  auto* a = find_attr(c, n, AttrKind::kStrings);
  if (!a) return 0;
  auto* mc = const_cast<Ctx*>(c);
  auto& list = mc->attr_string_lists[n];
  list.clear();
  for (const auto& s : a->strings) list.push_back(s.c_str());
  *v = list.data();
  *count = list.size();
  return 1;
}
const char* k_node_name(const Ctx* c) { return c->node ? c->node->name.c_str() : ""; }
int32_t k_opset(const Ctx* c) { return c->opset; }
int32_t k_device_index(const Ctx* c) { return c->device_index; }
keel_stream_t k_stream(const Ctx* c) { return c->stream; }
keel_status_t k_workspace(Ctx* c, uint64_t bytes, void** out) {
  if (!c->allocate_workspace) return make_c_status(KEEL_STATUS_FAILED_PRECONDITION, "workspace() outside compute");
  auto p = c->allocate_workspace(bytes);
  if (!p.is_ok()) return p.status().to_c();
  *out = p.value();
  return nullptr;
}
void k_parallel_for(const Ctx* c, int64_t n, int64_t min_chunk, void (*fn)(void*, int64_t, int64_t), void* arg) {
  if (c->pool == nullptr) {
    fn(arg, 0, n);
    return;
  }
  c->pool->parallel_for(n, min_chunk, [&](int64_t b, int64_t e) { fn(arg, b, e); });
}
int32_t k_thread_count(const Ctx* c) { return c->pool ? c->pool->thread_count() : 1; }
int32_t k_profiling(const Ctx* c) { return c != nullptr && c->profiling && c->phase == Ctx::Phase::kCompute ? 1 : 0; }
keel_status_t k_profile_step(Ctx* c, const keel_profile_step_t* step) {
  if (step == nullptr || step->struct_size < offsetof(keel_profile_step_t, kind) + sizeof(step->kind)) {
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "profile_step: NULL record or struct_size too small");
  }
  if (c == nullptr || !c->profiling || c->phase != Ctx::Phase::kCompute || !c->report_step) return nullptr;
  try {
    c->report_step(*step);
  } catch (const std::exception& e) {
    return make_c_status(KEEL_STATUS_INTERNAL, (std::string("profile_step: ") + e.what()).c_str());
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------- graph API

using G = keel_graph_t;

const std::vector<NodeId>& order(const G* g) {
  auto* mg = const_cast<G*>(g);
  if (mg->order_cache.empty() && g->graph->node_count() > 0) {
    auto o = g->graph->topological_order();
    mg->order_cache = o.is_ok() ? o.value() : g->graph->node_ids();
  }
  return mg->order_cache;
}
const Node* N(const G* g, keel_node_id_t id) { return g->graph->node(id); }

size_t g_nodes(const G* g, keel_node_id_t* out, size_t cap) {
  const auto& o = order(g);
  for (size_t i = 0; i < o.size() && i < cap; ++i) out[i] = o[i];
  return o.size();
}
int g_node_exists(const G* g, keel_node_id_t id) { return N(g, id) != nullptr; }
const char* g_op_type(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  return n ? n->op_type.c_str() : "";
}
const char* g_domain(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  return n ? n->domain.c_str() : "";
}
const char* g_name(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  return n ? n->name.c_str() : "";
}
// A node with subgraphs lists, after its own inputs, the values its subgraphs read from this graph (read-only), so
// that passes see every read (dead code, consumers) without knowing about subgraphs.
size_t g_in_count(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  if (!n) return 0;
  return n->inputs.size() + (has_subgraphs(*n) ? const_cast<G*>(g)->implicit(*n).size() : 0);
}
const char* g_in(const G* g, keel_node_id_t id, size_t i) {
  auto* n = N(g, id);
  if (!n) return "";
  if (i < n->inputs.size()) return n->inputs[i].c_str();
  if (!has_subgraphs(*n)) return "";
  const auto& implicit = const_cast<G*>(g)->implicit(*n);
  return i - n->inputs.size() < implicit.size() ? implicit[i - n->inputs.size()].c_str() : "";
}
size_t g_out_count(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  return n ? n->outputs.size() : 0;
}
const char* g_out(const G* g, keel_node_id_t id, size_t i) {
  auto* n = N(g, id);
  return n && i < n->outputs.size() ? n->outputs[i].c_str() : "";
}
const Attribute* g_attr(const G* g, keel_node_id_t id, const char* name, AttrKind kind) {
  auto* n = N(g, id);
  if (!n || !name) return nullptr;
  auto* a = n->attr(name);
  return a && (kind == AttrKind::kUndefined || a->kind == kind) ? a : nullptr;
}
int32_t g_attr_kind(const G* g, keel_node_id_t id, const char* name) {
  auto* a = g_attr(g, id, name, AttrKind::kUndefined);
  return a ? static_cast<int32_t>(a->kind) : KEEL_ATTR_UNDEFINED;
}
int g_attr_int(const G* g, keel_node_id_t id, const char* name, int64_t* v) {
  if (auto* a = g_attr(g, id, name, AttrKind::kInt)) {
    *v = a->i;
    return 1;
  }
  return 0;
}
int g_attr_float(const G* g, keel_node_id_t id, const char* name, float* v) {
  if (auto* a = g_attr(g, id, name, AttrKind::kFloat)) {
    *v = a->f;
    return 1;
  }
  return 0;
}
int g_attr_string(const G* g, keel_node_id_t id, const char* name, const char** v) {
  if (auto* a = g_attr(g, id, name, AttrKind::kString)) {
    *v = a->s.c_str();
    return 1;
  }
  return 0;
}
int g_attr_ints(const G* g, keel_node_id_t id, const char* name, const int64_t** v, size_t* n) {
  if (auto* a = g_attr(g, id, name, AttrKind::kInts)) {
    *v = a->ints.data();
    *n = a->ints.size();
    return 1;
  }
  return 0;
}
int g_attr_floats(const G* g, keel_node_id_t id, const char* name, const float** v, size_t* n) {
  if (auto* a = g_attr(g, id, name, AttrKind::kFloats)) {
    *v = a->floats.data();
    *n = a->floats.size();
    return 1;
  }
  return 0;
}
size_t g_attr_count(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  return n ? n->attrs.size() : 0;
}
const char* g_attr_name(const G* g, keel_node_id_t id, size_t i) {
  auto* n = N(g, id);
  if (!n || i >= n->attrs.size()) return "";
  auto it = n->attrs.begin();
  std::advance(it, i);
  return it->first.c_str();
}
const char* g_device(const G* g, keel_node_id_t id) {
  auto* n = N(g, id);
  return n ? n->device_type.c_str() : "";
}

int g_value_info(const G* g, const char* value, int32_t* dtype, int32_t* ndim, int64_t* dims, size_t cap) {
  if (!value) return 0;
  const Graph& gr = *g->graph;
  const ValueInfo* vi = gr.info(value);
  auto init = gr.initializers.find(value);
  if (init != gr.initializers.end()) {
    *dtype = static_cast<int32_t>(init->second.dtype());
    *ndim = static_cast<int32_t>(init->second.rank());
    for (size_t i = 0; i < init->second.shape().size() && i < cap; ++i) dims[i] = init->second.shape()[i];
    return 1;
  }
  bool exists = vi != nullptr || gr.producer(value).has_value() || gr.is_graph_input(value);
  if (!exists) return 0;
  // Sequences and optionals: no tensor type (passes leave them alone).
  *dtype = vi ? static_cast<int32_t>(vi->tensor_dtype()) : KEEL_DTYPE_UNDEFINED;
  if (vi && vi->shape && vi->is_tensor()) {
    *ndim = static_cast<int32_t>(vi->shape->size());
    for (size_t i = 0; i < vi->shape->size() && i < cap; ++i) dims[i] = (*vi->shape)[i];
  } else {
    *ndim = -1;
  }
  return 1;
}
int g_producer(const G* g, const char* value, keel_node_id_t* out) {
  auto p = g->graph->producer(value ? value : "");
  if (!p) return 0;
  *out = *p;
  return 1;
}
size_t g_consumers(const G* g, const char* value, keel_node_id_t* out, size_t cap) {
  auto c = g->graph->consumers(value ? value : "");
  for (size_t i = 0; i < c.size() && i < cap; ++i) out[i] = c[i];
  return c.size();
}
int g_is_output(const G* g, const char* value) { return value && g->graph->is_graph_output(value); }
int g_initializer(const G* g, const char* value, const keel_tensor_t** out) {
  if (!value) return 0;
  auto it = g->graph->initializers.find(value);
  if (it == g->graph->initializers.end()) return 0;
  auto* mg = const_cast<G*>(g);
  auto& entry = mg->initializer_views.emplace_back(it->second, keel_tensor_t{});
  entry.second = entry.first.c_view();  // dims point into the kept copy's shape
  *out = &entry.second;
  return 1;
}
size_t g_in_n(const G* g) { return g->graph->inputs.size(); }
const char* g_in_i(const G* g, size_t i) { return i < g->graph->inputs.size() ? g->graph->inputs[i].c_str() : ""; }
size_t g_out_n(const G* g) { return g->graph->outputs.size(); }
const char* g_out_i(const G* g, size_t i) { return i < g->graph->outputs.size() ? g->graph->outputs[i].c_str() : ""; }
int32_t g_opset(const G* g, const char* domain) {
  auto it = g->graph->opsets.find(normalize_domain(domain ? domain : ""));
  return it == g->graph->opsets.end() ? 0 : it->second;
}

keel_status_t guard(const std::function<Status()>& fn) {
  try {
    return fn().to_c();
  } catch (const std::bad_alloc&) {
    return make_c_status(KEEL_STATUS_OUT_OF_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return make_c_status(KEEL_STATUS_INTERNAL, e.what());
  } catch (...) {
    return make_c_status(KEEL_STATUS_INTERNAL, "an exception of unknown type");
  }
}
Node* M(G* g, keel_node_id_t id) { return g->graph->node(id); }
keel_status_t missing_node(keel_node_id_t id) {
  return make_c_status(KEEL_STATUS_NOT_FOUND, ("no node with id " + std::to_string(id)).c_str());
}

keel_status_t g_add_node(G* g, const char* domain, const char* op, const char* name, const char* const* ins, size_t nin,
                         const char* const* outs, size_t nout, keel_node_id_t* out) {
  return guard([&] {
    if (!op || !*op) return invalid_argument("add_node: op_type is empty");
    Node n;
    n.domain = normalize_domain(domain ? domain : "");
    n.op_type = op;
    n.name = name && *name ? std::string(name) : g->graph->unique_name(n.op_type);
    for (size_t i = 0; i < nin; ++i) n.inputs.emplace_back(ins[i] ? ins[i] : "");
    for (size_t i = 0; i < nout; ++i) n.outputs.emplace_back(outs[i] ? outs[i] : "");
    for (const auto& o : n.outputs)
      if (!o.empty() && (g->graph->producer(o) || g->graph->is_initializer(o) || g->graph->is_graph_input(o)))
        return invalid_argument("add_node: value '" + o + "' is already defined");
    // A pass that introduces a domain (the fusion passes' "keel" ops) imports it at version 1, so that placement
    // looks kernels up at that opset (export writes the same import).
    if (!n.domain.empty() && !g->graph->opsets.count(n.domain)) g->graph->opsets[n.domain] = 1;
    NodeId id = g->graph->add_node(std::move(n));
    if (out) *out = id;
    g->touched();
    return Status::ok();
  });
}
keel_status_t g_remove_node(G* g, keel_node_id_t id) {
  return guard([&] {
    g->touched();
    return g->graph->remove_node(id);
  });
}
keel_status_t g_set_input(G* g, keel_node_id_t id, size_t i, const char* value) {
  Node* n = M(g, id);
  if (!n) return missing_node(id);
  if (has_subgraphs(*n) && i >= n->inputs.size()) {
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT,
                         ("set_node_input: node '" + n->name + "' has subgraphs; its inputs past " +
                          std::to_string(n->inputs.size()) + " are what they read (use replace_uses)")
                             .c_str());
  }
  if (i >= n->inputs.size()) n->inputs.resize(i + 1);
  n->inputs[i] = value ? value : "";
  g->touched();
  return nullptr;
}
keel_status_t g_replace_uses(G* g, const char* from, const char* to) {
  if (!from || !to) return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "replace_uses: NULL name");
  g->graph->replace_uses(from, to);
  g->touched();
  return nullptr;
}
template <typename F>
keel_status_t set_attr(G* g, keel_node_id_t id, const char* name, F make) {
  Node* n = M(g, id);
  if (!n) return missing_node(id);
  if (!name || !*name) return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "attribute name is empty");
  n->attrs[name] = make();
  return nullptr;
}
keel_status_t g_set_int(G* g, keel_node_id_t id, const char* name, int64_t v) {
  return set_attr(g, id, name, [&] { return Attribute::of_int(v); });
}
keel_status_t g_set_float(G* g, keel_node_id_t id, const char* name, float v) {
  return set_attr(g, id, name, [&] { return Attribute::of_float(v); });
}
keel_status_t g_set_string(G* g, keel_node_id_t id, const char* name, const char* v) {
  return set_attr(g, id, name, [&] { return Attribute::of_string(v ? v : ""); });
}
keel_status_t g_set_ints(G* g, keel_node_id_t id, const char* name, const int64_t* v, size_t n) {
  return set_attr(g, id, name, [&] { return Attribute::of_ints(std::vector<int64_t>(v, v + n)); });
}
keel_status_t g_set_floats(G* g, keel_node_id_t id, const char* name, const float* v, size_t n) {
  return set_attr(g, id, name, [&] { return Attribute::of_floats(std::vector<float>(v, v + n)); });
}
keel_status_t g_remove_attr(G* g, keel_node_id_t id, const char* name) {
  Node* n = M(g, id);
  if (!n) return missing_node(id);
  n->attrs.erase(name ? name : "");
  return nullptr;
}

StatusOr<Tensor> tensor_from_view(const keel_tensor_t* t) {
  if (t == nullptr) return invalid_argument("tensor is NULL");
  if (!dtype_is_valid(t->dtype)) return invalid_argument("tensor has an invalid dtype " + std::to_string(t->dtype));
  if (t->ndim < 0 || (t->ndim > 0 && t->dims == nullptr)) return invalid_argument("tensor has a bad rank");
  if (t->memory_kind == KEEL_MEMORY_DEVICE) return invalid_argument("tensor must be in host memory");
  Shape shape(t->dims, t->dims + t->ndim);
  KEEL_ASSIGN_OR_RETURN(Tensor out, Tensor::host(static_cast<DType>(t->dtype), shape), "");
  if (out.byte_size() > 0) {
    if (t->data == nullptr || t->byte_size < out.byte_size())
      return invalid_argument("tensor data is smaller than its shape " + shape_to_string(shape) + " needs");
    std::memcpy(out.raw_data(), t->data, out.byte_size());
  }
  return out;
}

keel_status_t g_set_initializer(G* g, const char* value, const keel_tensor_t* t) {
  return guard([&]() -> Status {
    if (!value || !*value) return invalid_argument("set_initializer: empty name");
    KEEL_ASSIGN_OR_RETURN(Tensor copy, tensor_from_view(t), std::string("set_initializer '") + value + "'");
    g->graph->value_info[value] = ValueInfo{copy.dtype(), copy.shape()};
    g->graph->initializers[value] = std::move(copy);
    g->touched();
    return Status::ok();
  });
}
keel_status_t g_remove_initializer(G* g, const char* value) {
  if (!value || g->graph->initializers.erase(value) == 0) {
    return make_c_status(KEEL_STATUS_NOT_FOUND, (std::string("no initializer '") + (value ? value : "") + "'").c_str());
  }
  g->touched();
  return nullptr;
}
keel_status_t g_unique_name(G* g, const char* prefix, char* buf, size_t size) {
  std::string n = g->graph->unique_name(prefix ? prefix : "v");
  if (buf == nullptr || n.size() + 1 > size)
    return make_c_status(KEEL_STATUS_OUT_OF_RANGE, "unique_name: buffer too small");
  std::memcpy(buf, n.c_str(), n.size() + 1);
  return nullptr;
}

keel_status_t g_evaluate(const G* g, const char* const* in_names, const keel_tensor_t* const* ins, size_t nin,
                         const char* const* out_names, size_t nout, keel_tensor_t** outs) {
  return guard([&]() -> Status {
    if (g->env == nullptr) return failed_precondition("evaluate: this graph has no environment");
    std::vector<std::string> wanted;
    for (size_t i = 0; i < nout; ++i) wanted.emplace_back(out_names[i] ? out_names[i] : "");
    std::vector<std::pair<std::string, Tensor>> feeds;
    for (size_t i = 0; i < nin; ++i) {
      KEEL_ASSIGN_OR_RETURN(Tensor t, tensor_from_view(ins[i]), "evaluate input");
      feeds.emplace_back(in_names[i] ? in_names[i] : "", std::move(t));
    }
    KEEL_ASSIGN_OR_RETURN(Graph sub, extract_subgraph(*g->graph, feeds, wanted), "evaluate");
    SessionOptions opts;
    opts.devices = {"cpu"};
    opts.claims = false;  // (a claim hook may itself evaluate constants: no recursion)
    KEEL_ASSIGN_OR_RETURN(auto session, Session::create(*g->env, std::move(sub), opts), "evaluate");
    KEEL_ASSIGN_OR_RETURN(auto results, session->run(feeds), "evaluate");
    for (size_t i = 0; i < nout; ++i) {
      auto* t = new keel_tensor_t(results[i].c_view());
      // The C view owns a heap copy of the shape and the bytes, released by g_release_tensor.
      auto* dims = new int64_t[std::max<size_t>(1, results[i].shape().size())];
      std::copy(results[i].shape().begin(), results[i].shape().end(), dims);
      t->dims = dims;
      void* data = std::malloc(std::max<uint64_t>(1, results[i].byte_size()));
      if (!data) return out_of_memory("evaluate: result copy");
      std::memcpy(data, results[i].raw_data(), results[i].byte_size());
      t->data = data;
      outs[i] = t;
    }
    return Status::ok();
  });
}
void g_release_tensor(keel_tensor_t* t) {
  if (!t) return;
  delete[] t->dims;
  std::free(t->data);
  delete t;
}

// ---------------------------------------------------------------------------------------------- host table

keel_status_t h_status_create(int32_t code, const char* message) { return make_c_status(code, message); }

// A plugin's messages go to the log of the environment that loaded it (its handle's target).
void h_log(keel_plugin_handle_t* p, int32_t level, const char* message) {
  const char* name = p ? p->name.c_str() : "plugin";
  auto lvl = static_cast<spdlog::level::level_enum>(std::clamp(level, 0, 4));
  const log::Target* target = p ? p->log_target.load() : nullptr;
  if (target != nullptr && target->has_callback()) {
    log::write(lvl, fmt::format("[{}] {}", name, message ? message : ""), target);
  } else {
    log::default_logger()->log(lvl, "[{}] {}", name, message ? message : "");
  }
}

// The registry of a live handle; null for a NULL handle or one whose environment was released (see host_api.h).
Registry* registry_of(keel_plugin_handle_t* p) { return p != nullptr ? p->registry.load() : nullptr; }
keel_status_t gone(const char* what) {
  return make_c_status(KEEL_STATUS_FAILED_PRECONDITION,
                       (std::string(what) + ": NULL plugin handle, or the handle's environment was released").c_str());
}

keel_status_t h_register_device(keel_plugin_handle_t* p, const keel_device_table_t* t) {
  Registry* r = registry_of(p);
  return r ? r->add_device(p->id, p->priority, t).to_c() : gone("register_device");
}
keel_status_t h_register_kernel(keel_plugin_handle_t* p, const keel_kernel_def_t* k) {
  Registry* r = registry_of(p);
  return r ? r->add_kernel(p->id, p->priority, k).to_c() : gone("register_kernel");
}
keel_status_t h_register_pass(keel_plugin_handle_t* p, const keel_pass_def_t* d) {
  Registry* r = registry_of(p);
  return r ? r->add_pass(p->id, d).to_c() : gone("register_pass");
}
keel_status_t h_register_collective(keel_plugin_handle_t* p, const keel_collective_table_t* t) {
  Registry* r = registry_of(p);
  return r ? r->add_collective(p->id, t).to_c() : gone("register_collective");
}

keel_status_t h_register_claimer(keel_plugin_handle_t* p, const keel_claimer_def_t* d) {
  Registry* r = registry_of(p);
  return r ? r->add_claimer(p->id, p->priority, d).to_c() : gone("register_claimer");
}

// The highest-ranked kernel for (domain, op) at `opset` on `device` accepting `dtypes` (count 0: any), or nullptr.
const KernelEntry* best_kernel(keel_plugin_handle_t* p, const char* domain, const char* op, int32_t opset,
                               const char* device, const int32_t* dtypes, size_t count) {
  Registry* r = registry_of(p);
  if (r == nullptr || op == nullptr || device == nullptr) return nullptr;
  for (const KernelEntry* k : r->kernels_for(domain ? domain : "", op, opset, device)) {
    if (count == 0 || k->constraints.empty()) return k;
    // Without the op's schema we cannot map dtypes to type parameters; accept when every dtype is allowed by some
    // constraint of the kernel.
    bool all = true;
    for (size_t i = 0; i < count && all; ++i) {
      bool found = false;
      for (const auto& c : k->constraints)
        for (DType d : c.dtypes) found = found || static_cast<int32_t>(d) == dtypes[i];
      all = found;
    }
    if (all) return k;
  }
  return nullptr;
}

int h_kernel_exists(keel_plugin_handle_t* p, const char* domain, const char* op, int32_t opset, const char* device,
                    const int32_t* dtypes, size_t count) {
  return best_kernel(p, domain, op, opset, device, dtypes, count) != nullptr ? 1 : 0;
}

int32_t h_kernel_priority(keel_plugin_handle_t* p, const char* domain, const char* op, int32_t opset,
                          const char* device, const int32_t* dtypes, size_t count) {
  const KernelEntry* k = best_kernel(p, domain, op, opset, device, dtypes, count);
  return k != nullptr ? k->priority : INT32_MIN;
}

keel_status_t g_infer_shapes(G* g) {
  g->touched();
  return infer_shapes(*g->graph).to_c();
}

// The exception edge of every host-table entry: a plugin calls these from C frames, so nothing may leave them.
// A failure becomes a status (OUT_OF_MEMORY / INTERNAL) where the entry returns one, else the entry's "nothing"
// value (0, "", NULL) and a logged error.
template <typename R>
R failure(int32_t code, const char* what, const char* detail) {
  if constexpr (std::is_same_v<R, keel_status_t>) {
    return make_c_status(code, (std::string(what) + ": " + detail).c_str());
  } else {
    try {
      log::error("host table entry {} failed: {}", what, detail);
    } catch (...) {}
    if constexpr (std::is_void_v<R>) return;
    else if constexpr (std::is_same_v<R, const char*>) return "";
    else return R{};
  }
}

template <auto Fn>
struct Safe;
template <typename R, typename... A, R (*Fn)(A...)>
struct Safe<Fn> {
  static R call(A... a) noexcept {
    try {
      return Fn(a...);
    } catch (const std::bad_alloc&) {
      return failure<R>(KEEL_STATUS_OUT_OF_MEMORY, name(), "out of memory");
    } catch (const std::exception& e) {
      return failure<R>(KEEL_STATUS_INTERNAL, name(), e.what());
    } catch (...) {
      return failure<R>(KEEL_STATUS_INTERNAL, name(), "an exception of unknown type");
    }
  }
  static const char* name() { return "of the plugin core API"; }
};
#define KEEL_SAFE(fn) (&Safe<&fn>::call)

}  // namespace

const keel_kernel_api_t* kernel_api() {
  static const keel_kernel_api_t api = {
      sizeof(keel_kernel_api_t), KEEL_PLUGIN_ABI_MAJOR,     KEEL_PLUGIN_ABI_MINOR,     KEEL_SAFE(k_input_count),
      KEEL_SAFE(k_input),        KEEL_SAFE(k_output_count), KEEL_SAFE(k_output),       KEEL_SAFE(k_output_dtype),
      KEEL_SAFE(k_attr_int),     KEEL_SAFE(k_attr_float),   KEEL_SAFE(k_attr_string),  KEEL_SAFE(k_attr_ints),
      KEEL_SAFE(k_attr_floats),  KEEL_SAFE(k_attr_tensor),  KEEL_SAFE(k_attr_strings), KEEL_SAFE(k_node_name),
      KEEL_SAFE(k_opset),        KEEL_SAFE(k_device_index), KEEL_SAFE(k_stream),       KEEL_SAFE(k_workspace),
      KEEL_SAFE(k_parallel_for), KEEL_SAFE(k_thread_count), KEEL_SAFE(k_profiling),    KEEL_SAFE(k_profile_step),
  };
  return &api;
}

const keel_graph_api_t* graph_api() {
  static const keel_graph_api_t api = {
      sizeof(keel_graph_api_t),
      KEEL_PLUGIN_ABI_MAJOR,
      KEEL_PLUGIN_ABI_MINOR,
      KEEL_SAFE(g_nodes),
      KEEL_SAFE(g_node_exists),
      KEEL_SAFE(g_op_type),
      KEEL_SAFE(g_domain),
      KEEL_SAFE(g_name),
      KEEL_SAFE(g_in_count),
      KEEL_SAFE(g_in),
      KEEL_SAFE(g_out_count),
      KEEL_SAFE(g_out),
      KEEL_SAFE(g_attr_kind),
      KEEL_SAFE(g_attr_int),
      KEEL_SAFE(g_attr_float),
      KEEL_SAFE(g_attr_string),
      KEEL_SAFE(g_attr_ints),
      KEEL_SAFE(g_attr_floats),
      KEEL_SAFE(g_attr_count),
      KEEL_SAFE(g_attr_name),
      KEEL_SAFE(g_device),
      KEEL_SAFE(g_value_info),
      KEEL_SAFE(g_producer),
      KEEL_SAFE(g_consumers),
      KEEL_SAFE(g_is_output),
      KEEL_SAFE(g_initializer),
      KEEL_SAFE(g_in_n),
      KEEL_SAFE(g_in_i),
      KEEL_SAFE(g_out_n),
      KEEL_SAFE(g_out_i),
      KEEL_SAFE(g_opset),
      KEEL_SAFE(g_add_node),
      KEEL_SAFE(g_remove_node),
      KEEL_SAFE(g_set_input),
      KEEL_SAFE(g_replace_uses),
      KEEL_SAFE(g_set_int),
      KEEL_SAFE(g_set_float),
      KEEL_SAFE(g_set_string),
      KEEL_SAFE(g_set_ints),
      KEEL_SAFE(g_set_floats),
      KEEL_SAFE(g_remove_attr),
      KEEL_SAFE(g_set_initializer),
      KEEL_SAFE(g_remove_initializer),
      KEEL_SAFE(g_unique_name),
      KEEL_SAFE(g_infer_shapes),
      KEEL_SAFE(g_evaluate),
      KEEL_SAFE(g_release_tensor),
  };
  return &api;
}

std::unique_ptr<keel_plugin_handle_s> make_plugin_handle(Registry& registry, PluginId id, int32_t priority,
                                                         std::string name, std::string dir, Options options) {
  auto h = std::make_unique<keel_plugin_handle_s>();
  h->registry.store(&registry);
  h->id = id;
  h->priority = priority;
  h->name = std::move(name);
  h->dir = std::move(dir);
  h->options = std::move(options);
  h->api = keel_core_api_t{
      sizeof(keel_core_api_t),
      KEEL_PLUGIN_ABI_MAJOR,
      KEEL_PLUGIN_ABI_MINOR,
      KEEL_SAFE(h_status_create),
      KEEL_SAFE(h_log),
      KEEL_SAFE(h_register_device),
      KEEL_SAFE(h_register_kernel),
      KEEL_SAFE(h_register_pass),
      KEEL_SAFE(h_register_collective),
      KEEL_SAFE(h_kernel_exists),
      kernel_api(),
      graph_api(),
      options_api(),
      &h->options,
      h->dir.c_str(),
      KEEL_SAFE(h_register_claimer),
      KEEL_SAFE(h_kernel_priority),
  };
  return h;
}

}  // namespace keel
