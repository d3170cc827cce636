// The canonicalisation pass plugin: graph clean-ups every pipeline starts with. Built against the SDK alone.
//
//   fold_constants                   nodes whose inputs are all constants become initializers (evaluated through the
//                                    graph API on the reference CPU); Shape/Size of statically shaped values fold from
//                                    value info, so static Shape->Gather->Concat->Reshape chains collapse. Options:
//                                    max_bytes (largest folded tensor, default 64 MiB), max_rounds (default 8),
//                                    keep_qdq (leave QuantizeLinear/DequantizeLinear alone, default true).
//   eliminate_dead_code              nodes none of whose outputs reach a graph output; initializers they leave unread.
//   remove_identity                  Identity, inference Dropout (mask unused), Cast to the same type, Reshape to the
//                                    same shape, Transpose with the identity permutation, one-input Concat. Graph
//                                    output names are kept.
//   eliminate_common_subexpressions  nodes with the same op, domain, inputs and attributes; small initializers with
//                                    the same contents.
#include <keel/plugin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/graph_view.h"
#include "common/pass_instance.h"

namespace keel::passes {
namespace {

// Ops whose results are not a function of their inputs (never folded or merged).
bool is_random(const std::string& op) {
  static const std::set<std::string> k = {"RandomNormal",      "RandomUniform", "RandomNormalLike",
                                          "RandomUniformLike", "Multinomial",   "Bernoulli"};
  return k.count(op) != 0;
}
// Ops with subgraphs or effects that folding does not look inside.
// Control flow, and the ops that make or take apart sequences and optionals: their values are not tensors (the
// executor runs them), so neither folding nor CSE touches them.
bool is_control_flow(const std::string& op) {
  static const std::set<std::string> kOps = {"If",
                                             "Loop",
                                             "Scan",
                                             "SequenceMap",
                                             "SequenceConstruct",
                                             "SequenceEmpty",
                                             "SequenceInsert",
                                             "SequenceAt",
                                             "SequenceErase",
                                             "SequenceLength",
                                             "SplitToSequence",
                                             "ConcatFromSequence",
                                             "Optional",
                                             "OptionalHasElement",
                                             "OptionalGetElement"};
  return kOps.count(op) != 0;
}

// Removes a node and then every initializer it read that nobody reads any more; returns the bytes released.
int64_t remove_node_and_orphans(GraphView& gv, keel_node_id_t n) {
  std::vector<std::string> ins = gv.inputs(n);
  gv.remove_node(n);
  int64_t bytes = 0;
  std::set<std::string> seen;
  for (const auto& in : ins) {
    if (in.empty() || !seen.insert(in).second) continue;
    const keel_tensor_t* t = gv.initializer(in);
    if (!t || gv.use_count(in) != 0) continue;
    bytes += static_cast<int64_t>(t->byte_size);
    gv.remove_initializer(in);
  }
  return bytes;
}

// ------------------------------------------------------------------------------------------------ fold_constants

struct FoldStats {
  int64_t nodes = 0, shapes = 0, bytes = 0;
};

// Folds Shape and Size nodes whose input has a fully known static shape. Returns the number folded.
int64_t fold_static_shapes(GraphView& gv, Report& report) {
  int64_t folded = 0;
  for (keel_node_id_t n : gv.nodes()) {
    bool shape = gv.is(n, "Shape"), size = gv.is(n, "Size");
    if (!shape && !size) continue;
    std::string out = gv.output(n, 0);
    if (out.empty() || gv.is_graph_output(out)) continue;
    auto vt = gv.value_type(gv.input(n, 0));
    if (!vt || !vt->fully_known()) continue;
    HostTensor t;
    if (shape) {
      int64_t r = vt->ndim;
      int64_t start = gv.attr_int(n, "start").value_or(0), end = gv.attr_int(n, "end").value_or(r);
      if (start < 0) start += r;
      if (end < 0) end += r;
      start = std::clamp<int64_t>(start, 0, r);
      end = std::clamp<int64_t>(end, 0, r);
      std::vector<int64_t> dims(vt->dims.begin() + start, vt->dims.begin() + std::max(start, end));
      t = HostTensor::of<int64_t>(KEEL_DTYPE_I64, {static_cast<int64_t>(dims.size())}, dims);
    } else {
      t = HostTensor::of<int64_t>(KEEL_DTYPE_I64, {}, std::vector<int64_t>{numel(vt->dims)});
    }
    remove_node_and_orphans(gv, n);
    gv.set_initializer(out, t);
    ++folded;
  }
  if (folded) report.note("folded " + std::to_string(folded) + " Shape/Size node(s) from static shapes");
  return folded;
}

// One round of evaluation-based folding. Returns the number of nodes removed.
int64_t fold_round(GraphView& gv, const PassOptions& opts, Report& report, FoldStats& stats) {
  const int64_t max_bytes = opts.get_int("max_bytes", int64_t(64) << 20);
  const bool keep_qdq = opts.get_bool("keep_qdq", true);
  std::vector<keel_node_id_t> order = gv.nodes();
  std::unordered_set<keel_node_id_t> foldable;
  std::unordered_set<std::string> const_values;  // outputs of foldable nodes
  std::vector<keel_node_id_t> folded_order;
  for (keel_node_id_t n : order) {
    std::string op = gv.op(n), dom = gv.domain(n);
    if (!dom.empty() || is_random(op) || is_control_flow(op)) continue;
    if (keep_qdq && (op == "QuantizeLinear" || op == "DequantizeLinear" || op == "DynamicQuantizeLinear")) continue;
    bool ok = true;
    for (const auto& in : gv.inputs(n))
      if (!in.empty() && !gv.is_initializer(in) && !const_values.count(in)) ok = false;
    if (!ok) continue;
    for (const auto& o : gv.outputs(n)) {
      if (o.empty()) continue;
      if (gv.is_graph_output(o)) ok = false;  // a graph output keeps its producer (and its name)
      auto vt = gv.value_type(o);
      if (vt && vt->fully_known() && dtype_size(vt->dtype) * numel(vt->dims) > static_cast<uint64_t>(max_bytes))
        ok = false;
    }
    if (!ok) continue;
    foldable.insert(n);
    folded_order.push_back(n);
    for (const auto& o : gv.outputs(n))
      if (!o.empty()) const_values.insert(o);
  }
  if (foldable.empty()) return 0;
  // The frontier: constant values read by nodes that stay.
  std::vector<std::string> frontier;
  for (keel_node_id_t n : folded_order)
    for (const auto& o : gv.outputs(n)) {
      if (o.empty()) continue;
      bool outside = false;
      for (keel_node_id_t c : gv.consumers(o)) outside = outside || !foldable.count(c);
      if (outside) frontier.push_back(o);
    }
  std::map<std::string, keel_tensor_t*> results;
  auto release_all = [&] {
    for (auto& [k, t] : results) gv.api()->release_tensor(t);
    results.clear();
  };
  if (!frontier.empty()) {
    std::vector<const char*> names;
    for (const auto& f : frontier) names.push_back(f.c_str());
    std::vector<keel_tensor_t*> outs(frontier.size(), nullptr);
    keel_status_t st = gv.api()->evaluate(gv.raw(), nullptr, nullptr, 0, names.data(), names.size(), outs.data());
    if (st == nullptr) {
      for (size_t i = 0; i < frontier.size(); ++i) results[frontier[i]] = outs[i];
    } else {
      keel_status_release(st);
      // One value at a time, so that one op without a CPU kernel does not stop the rest.
      for (const auto& f : frontier) {
        const char* nm = f.c_str();
        keel_tensor_t* t = nullptr;
        keel_status_t s1 = gv.api()->evaluate(gv.raw(), nullptr, nullptr, 0, &nm, 1, &t);
        if (s1 == nullptr) {
          results[f] = t;
        } else {
          report.note("cannot fold '" + f + "': " + (s1->message ? s1->message : "evaluation failed"));
          keel_status_release(s1);
        }
      }
    }
  }
  try {
    std::set<std::string> accepted;
    for (auto& [name, t] : results) {
      if (static_cast<int64_t>(t->byte_size) > max_bytes) {
        report.note("not folding '" + name + "': " + std::to_string(t->byte_size) + " bytes > max_bytes");
        continue;
      }
      accepted.insert(name);
    }
    // Decide removals in reverse topological order: a node goes when each of its outputs is replaced by a constant
    // or read by nobody that stays.
    std::unordered_set<keel_node_id_t> removed;
    for (auto it = folded_order.rbegin(); it != folded_order.rend(); ++it) {
      keel_node_id_t n = *it;
      bool removable = true;
      for (const auto& o : gv.outputs(n)) {
        if (o.empty() || accepted.count(o)) continue;
        for (keel_node_id_t c : gv.consumers(o)) removable = removable && removed.count(c);
        removable = removable && !gv.is_graph_output(o);
      }
      if (removable) {
        removed.insert(n);
      } else {
        for (const auto& o : gv.outputs(n)) accepted.erase(o);
      }
    }
    if (removed.empty()) {
      release_all();
      return 0;
    }
    for (keel_node_id_t n : folded_order) {
      if (!removed.count(n)) continue;
      std::vector<std::string> outs = gv.outputs(n);
      stats.bytes += remove_node_and_orphans(gv, n);
      for (const auto& o : outs)
        if (accepted.count(o)) gv.set_initializer(o, results[o]);
    }
    stats.nodes += static_cast<int64_t>(removed.size());
    release_all();
    return static_cast<int64_t>(removed.size());
  } catch (...) {
    release_all();
    throw;
  }
}

keel_status_t fold_constants(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o, const char*,
                             keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions opts(g_host->options, o);
    FoldStats stats;
    const int64_t rounds = std::max<int64_t>(1, opts.get_int("max_rounds", 8));
    for (int64_t i = 0; i < rounds; ++i) {
      int64_t shapes = fold_static_shapes(gv, report);
      stats.shapes += shapes;
      int64_t folded = fold_round(gv, opts, report, stats);
      if (shapes == 0 && folded == 0) break;
      // New constants may make more shapes static (a Reshape whose shape became a constant).
      keel_status_t st = api->infer_shapes(g);
      if (st) {
        report.note(std::string("shape inference after folding failed: ") + (st->message ? st->message : ""));
        keel_status_release(st);
        break;
      }
    }
    report.count("nodes_folded", stats.nodes + stats.shapes);
    report.count("shapes_folded", stats.shapes);
    if (stats.bytes) report.count("bytes_saved", stats.bytes);
  });
}

// ------------------------------------------------------------------------------------------------ eliminate_dead_code

keel_status_t eliminate_dead_code(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t*,
                                  const char*, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    std::unordered_set<std::string> live;
    for (const auto& o : gv.graph_outputs()) live.insert(o);
    std::vector<keel_node_id_t> order = gv.nodes();
    std::vector<keel_node_id_t> dead;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      bool used = false;
      for (const auto& o : gv.outputs(*it)) used = used || (!o.empty() && live.count(o));
      if (!used) {
        dead.push_back(*it);
        continue;
      }
      for (const auto& in : gv.inputs(*it))
        if (!in.empty()) live.insert(in);
    }
    // Remove consumers before producers, so initializers become unread only once all their readers are gone.
    int64_t bytes = 0;
    for (keel_node_id_t n : dead) bytes += remove_node_and_orphans(gv, n);
    report.count("nodes_removed", static_cast<int64_t>(dead.size()));
    if (bytes) report.count("bytes_saved", bytes);
  });
}

// ------------------------------------------------------------------------------------------------ remove_identity

// Re-creates node `n` with `outputs` in place of its outputs (attributes copied). False when a node attribute cannot
// be read through the C API (tensor, graph or string-list kinds), so the node cannot be re-created.
bool rename_outputs(GraphView& gv, keel_node_id_t n, const std::vector<std::string>& outputs) {
  Attrs attrs = gv.attrs(n);
  if (!GraphView::all_readable(attrs)) return false;
  std::string dom = gv.domain(n), op = gv.op(n), name = gv.name(n);
  std::vector<std::string> ins = gv.inputs(n);
  gv.remove_node(n);
  gv.add_node(dom, op, name, ins, outputs, attrs);
  return true;
}

// The reason `n` is a no-op, or "" when it is not.
std::string identity_kind(GraphView& gv, keel_node_id_t n, int32_t opset) {
  if (!gv.domain(n).empty()) return "";
  std::string op = gv.op(n);
  std::string in = gv.input(n, 0);
  if (in.empty()) return "";
  if (op == "Identity") return "Identity";
  if (op == "Dropout") {
    std::string mask = gv.output(n, 1);
    if (!mask.empty() && gv.use_count(mask) != 0) return "";
    if (opset >= 12) {
      std::string training = gv.input(n, 2);
      if (!training.empty()) {
        auto v = gv.scalar(training);
        if (!v || *v != 0) return "";
      }
    }
    return "Dropout";
  }
  auto in_t = gv.value_type(in);
  if (op == "Cast") {
    auto to = gv.attr_int(n, "to");
    if (to && in_t && in_t->dtype == *to) return "Cast";
    return "";
  }
  if (op == "Reshape" || op == "Squeeze" || op == "Unsqueeze" || op == "Flatten" || op == "Expand") {
    auto out_t = gv.value_type(gv.output(n, 0));
    if (in_t && out_t && in_t->fully_known() && out_t->fully_known() && in_t->dims == out_t->dims &&
        in_t->dtype == out_t->dtype)
      return op;
    return "";
  }
  if (op == "Transpose") {
    auto perm = gv.attr_ints(n, "perm");
    if (!perm || perm->empty()) return "";
    for (size_t i = 0; i < perm->size(); ++i)
      if ((*perm)[i] != static_cast<int64_t>(i)) return "";
    return "Transpose";
  }
  if (op == "Concat" && gv.inputs(n).size() == 1) return "Concat";
  return "";
}

keel_status_t remove_identity(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t*, const char*,
                              keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    const int32_t opset = gv.opset("");
    std::map<std::string, int64_t> removed;
    int64_t kept = 0, bytes = 0;
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n)) continue;
      std::string kind = identity_kind(gv, n, opset);
      if (kind.empty()) continue;
      std::string in = gv.input(n, 0), out = gv.output(n, 0);
      if (out.empty()) continue;
      if (!gv.is_graph_output(out)) {
        gv.replace_uses(out, in);  // first, so that `in` keeps readers and is not dropped as an orphan
        bytes += remove_node_and_orphans(gv, n);
        ++removed[kind];
        continue;
      }
      // `out` names a graph output: keep the name by making the producer of `in` write it instead.
      auto p = gv.producer(in);
      if (p && !gv.is_graph_output(in) && gv.consumers(in).size() == 1 && !gv.is_graph_input(in)) {
        std::vector<std::string> pouts = gv.outputs(*p);
        for (auto& po : pouts)
          if (po == in) po = out;
        bytes += remove_node_and_orphans(gv, n);
        if (rename_outputs(gv, *p, pouts)) {
          ++removed[kind];
          continue;
        }
        // Could not re-create the producer: put the no-op back as an Identity.
        gv.add_node("", "Identity", "", {in}, {out});
      }
      ++kept;
    }
    int64_t total = 0;
    std::string what;
    for (const auto& [k, v] : removed) {
      total += v;
      what += (what.empty() ? "" : ", ") + std::to_string(v) + " " + k;
    }
    report.count("nodes_removed", total);
    if (bytes) report.count("bytes_saved", bytes);
    if (!what.empty()) report.note("removed " + what);
    if (kept)
      report.note("kept " + std::to_string(kept) +
                  " no-op node(s) that write a graph output directly from an input, "
                  "a constant or a shared value");
  });
}

// ------------------------------------------------------------------------------------------------ CSE

std::string attr_key(const Attrs& attrs) {
  std::ostringstream os;
  os.precision(9);
  for (const auto& [k, v] : attrs) {
    os << k << '=' << v.kind << ':';
    switch (v.kind) {
      case KEEL_ATTR_INT: os << v.i; break;
      case KEEL_ATTR_FLOAT: {
        uint32_t bits;
        std::memcpy(&bits, &v.f, 4);
        os << bits;
        break;
      }
      case KEEL_ATTR_STRING: os << v.s.size() << ':' << v.s; break;
      case KEEL_ATTR_INTS:
        for (int64_t x : v.ints) os << x << ',';
        break;
      case KEEL_ATTR_FLOATS:
        for (float f : v.floats) {
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          os << bits << ',';
        }
        break;
      default: break;
    }
    os << ';';
  }
  return os.str();
}

keel_status_t eliminate_common_subexpressions(void*, keel_graph_t* g, const keel_graph_api_t* api,
                                              const keel_options_t* o, const char*, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions opts(g_host->options, o);
    const int64_t max_init_bytes = opts.get_int("max_initializer_bytes", 4096);
    int64_t merged_inits = 0, merged_nodes = 0, bytes = 0;
    // Small initializers with equal contents: readers switch to the first one seen.
    {
      std::map<std::string, std::string> by_content;  // dtype|dims|bytes -> name
      std::set<std::string> seen;
      for (keel_node_id_t n : gv.nodes())
        for (const auto& in : gv.inputs(n)) {
          if (in.empty() || !seen.insert(in).second) continue;
          const keel_tensor_t* t = gv.initializer(in);
          if (!t || static_cast<int64_t>(t->byte_size) > max_init_bytes || gv.is_graph_output(in)) continue;
          std::string key = std::to_string(t->dtype) + "|";
          for (int i = 0; i < t->ndim; ++i) key += std::to_string(t->dims[i]) + ",";
          key += "|";
          key.append(static_cast<const char*>(t->data), t->byte_size);
          auto [it, fresh] = by_content.emplace(key, in);
          if (fresh) continue;
          bytes += static_cast<int64_t>(t->byte_size);
          gv.replace_uses(in, it->second);
          gv.remove_initializer(in);
          ++merged_inits;
        }
    }
    // Nodes, in topological order: a duplicate's readers switch to the first node's outputs, which makes their
    // readers duplicates in turn.
    std::unordered_map<std::string, keel_node_id_t> by_key;
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n)) continue;
      std::string op = gv.op(n);
      if (is_random(op) || is_control_flow(op)) continue;
      Attrs attrs = gv.attrs(n);
      if (!GraphView::all_readable(attrs)) continue;
      std::vector<std::string> ins = gv.inputs(n), outs = gv.outputs(n);
      if (ins.empty()) continue;
      std::string key = gv.domain(n) + "|" + op + "|" + std::to_string(outs.size()) + "|";
      for (const auto& i : ins) key += std::to_string(i.size()) + ":" + i + ",";
      key += "|" + attr_key(attrs);
      auto [it, fresh] = by_key.emplace(key, n);
      if (fresh) continue;
      keel_node_id_t first = it->second;
      std::vector<std::string> first_outs = gv.outputs(first);
      bool ok = true;
      for (size_t i = 0; i < outs.size(); ++i) {
        if (outs[i].empty()) continue;
        if (gv.is_graph_output(outs[i]) || first_outs[i].empty()) ok = false;
      }
      if (!ok) continue;
      gv.remove_node(n);
      for (size_t i = 0; i < outs.size(); ++i)
        if (!outs[i].empty()) gv.replace_uses(outs[i], first_outs[i]);
      ++merged_nodes;
    }
    report.count("nodes_merged", merged_nodes);
    report.count("initializers_merged", merged_inits);
    if (bytes) report.count("bytes_saved", bytes);
  });
}

keel_status_t init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  static const PassSpec kPasses[] = {
      {"fold_constants", "evaluates nodes whose inputs are all constants, and Shape/Size of static shapes",
       fold_constants},
      {"eliminate_dead_code", "removes nodes that reach no graph output and the initializers they leave unread",
       eliminate_dead_code},
      {"remove_identity", "removes Identity, inference Dropout, no-op Cast/Reshape/Transpose", remove_identity},
      {"eliminate_common_subexpressions", "merges nodes with equal op, inputs and attributes, and equal constants",
       eliminate_common_subexpressions},
  };
  return init_pass_instance(host, plugin, out_instance, kPasses, [](const keel_core_api_t* h) -> const char* {
    const keel_graph_api_t* api = h->graph;
    return api == nullptr || !KEEL_HAS_MEMBER(api, keel_graph_api_t, release_tensor)
               ? "graph API too old (needs evaluate)"
               : nullptr;
  });
}

const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "canonicalize",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_PASS,
                               .init = nullptr,
                               .shutdown = nullptr,
                               .init_instance = init_instance,
                               .shutdown_instance = shutdown_pass_instance};

}  // namespace
}  // namespace keel::passes

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::passes::kPlugin; }
