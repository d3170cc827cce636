// plugins/cpu_onednn/chain/scan.h — (internal) claim time: a view of the host's graph (GraphScan) and the
// questions claim_chains asks of each node (which ops a chain takes, from the table in chain/ops/table.cc;
// constants; int8 candidates; channels-last values) and the 1-D lift of a recipe. Used by one thread at a time.
#pragma once

#include <functional>

#include "chain/ops/table.h"
#include "chain/recipe.h"

namespace keel::onednn::chain {

// ------------------------------------------------------------------------------------------------ claim time

using G = keel_graph_t;

struct GraphScan {
  const G* g;
  const keel_graph_api_t* api;
  std::vector<keel_node_id_t> order;
  std::map<keel_node_id_t, size_t> pos;

  std::string op(keel_node_id_t n) const { return api->node_op_type(g, n); }
  std::vector<std::string> ins(keel_node_id_t n) const {
    std::vector<std::string> v;
    for (size_t i = 0; i < api->node_input_count(g, n); ++i) v.emplace_back(api->node_input(g, n, i));
    return v;
  }
  std::vector<std::string> outs(keel_node_id_t n) const {
    std::vector<std::string> v;
    for (size_t i = 0; i < api->node_output_count(g, n); ++i) v.emplace_back(api->node_output(g, n, i));
    return v;
  }
  bool info(const std::string& v, int32_t* dtype, Dims* d) const {
    int64_t buf[16];
    int32_t nd = -1;
    if (!api->value_info(g, v.c_str(), dtype, &nd, buf, 16)) return false;
    if (nd < 0 || nd > 16) return false;
    d->assign(buf, buf + nd);
    for (int64_t x : *d)
      if (x < 0) return false;
    return true;
  }
  std::vector<keel_node_id_t> consumers(const std::string& v) const {
    std::vector<keel_node_id_t> ids(64);
    size_t n = api->value_consumers(g, v.c_str(), ids.data(), ids.size());
    if (n > ids.size()) {
      ids.resize(n);
      api->value_consumers(g, v.c_str(), ids.data(), ids.size());
    }
    ids.resize(n);
    return ids;
  }
  bool dtype(const std::string& v, int32_t* t) const {
    int64_t buf[16];
    int32_t nd = -1;
    return api->value_info(g, v.c_str(), t, &nd, buf, 16) != 0;
  }
  bool producer(const std::string& v, keel_node_id_t* p) const {
    return !v.empty() && api->value_producer(g, v.c_str(), p);
  }
  NodeDesc desc(keel_node_id_t n) const {
    NodeDesc d;
    d.id = n;
    d.op = op(n);
    d.name = api->node_name(g, n);
    d.in = ins(n);
    d.out = outs(n);
    for (size_t i = 0; i < api->node_attr_count(g, n); ++i) {
      std::string name = api->node_attr_name(g, n, i);
      Attr a;
      a.kind = api->node_attr_kind(g, n, name.c_str());
      const int64_t* is;
      const float* fs;
      const char* s;
      size_t cnt;
      switch (a.kind) {
        case KEEL_ATTR_INT: api->node_attr_int(g, n, name.c_str(), &a.i); break;
        case KEEL_ATTR_FLOAT: api->node_attr_float(g, n, name.c_str(), &a.f); break;
        case KEEL_ATTR_STRING:
          if (api->node_attr_string(g, n, name.c_str(), &s)) a.s = s;
          break;
        case KEEL_ATTR_INTS:
          if (api->node_attr_ints(g, n, name.c_str(), &is, &cnt)) a.ints.assign(is, is + cnt);
          break;
        case KEEL_ATTR_FLOATS:
          if (api->node_attr_floats(g, n, name.c_str(), &fs, &cnt)) a.floats.assign(fs, fs + cnt);
          break;
        default: break;
      }
      d.attrs[name] = a;
    }
    return d;
  }
};

// The ops a chain computes (not int8 ones, not constants-only nodes): the op table's compute and view rows.
const std::set<std::string>& compute_ops();
// Whether a node of `domain` (NULL or "" for ai.onnx) and `op` may be claimed (the op table's domains).
bool claimable_domain(const char* domain, const std::string& op);
// Ops that only move or view data: a claim needs real work besides them.
bool is_view_op(const std::string& op);
// A constant's host copy (bf16 widened to f32).
ConstT const_of(const keel_tensor_t* t);
// The int8 ops a chain takes (keel.QConv, keel.QGemm, ai.onnx QuantizeLinear/DequantizeLinear).
bool int8_op(const char* domain, const std::string& op);
bool int8_candidate(const GraphScan& sc, keel_node_id_t n, const std::function<bool(const std::string&)>& is_const);
std::set<std::string> channels_last_values(const GraphScan& sc);
// Rewrites 1-D convolutions and poolings (and what lies between them) as 2-D ones over [N,C,1,L].
void lift_1d(Recipe& r);

}  // namespace keel::onednn::chain
