// plugins/cpu_onednn/chain/scan.cc — claim-time helpers: the graph view (GraphScan), which nodes a chain may
// take (from the op table), constants, int8 candidates, channels-last values and the 1-D lift.
#include "chain/scan.h"

namespace keel::onednn::chain {

const std::set<std::string>& compute_ops() {
  static const std::set<std::string> s = [] {
    std::set<std::string> ops;
    for (const ChainOp& r : chain_ops())
      if (r.role != ChainRole::kInt8) ops.insert(r.op);
    return ops;
  }();
  return s;
}
// ai.onnx nodes (but ops the table lists for the keel domain alone: keel.Attention), and the keel ops (ops/schemas.cc)
// that mean what their ai.onnx namesakes mean: keel.Gelu is Gelu-20, keel.LayerNormalization is
// LayerNormalization-17 for older opsets (what fuse_gelu / fuse_layer_norm produce); and keel.Attention
// (fuse_attention's; Builder::attention). The int8 ops are int8_op's.
bool claimable_domain(const char* domain, const std::string& op) {
  const ChainOp* r = find_chain_op(op);
  const bool listed = r != nullptr && r->role != ChainRole::kInt8;
  if (domain == nullptr || *domain == 0) return !listed || (r->domains & kOnnx) != 0;
  return std::strcmp(domain, "keel") == 0 && listed && (r->domains & kKeel) != 0;
}
bool is_view_op(const std::string& op) {
  const ChainOp* r = find_chain_op(op);
  return r != nullptr && r->role == ChainRole::kView;
}

// A constant's host copy; bf16 values are widened to f32 (exactly), which the builder converts back where a bf16
// primitive reads them (weights reordered into its layout, constants read as data).
ConstT const_of(const keel_tensor_t* t) {
  ConstT c;
  c.dtype = t->dtype;
  c.dims.assign(t->dims, t->dims + t->ndim);
  const char* p = static_cast<const char*>(t->data);
  if (t->dtype == KEEL_DTYPE_BF16) {
    c.dtype = KEEL_DTYPE_F32;
    const size_t n = t->byte_size / 2;
    c.bytes.resize(n * sizeof(float));
    for (size_t k = 0; k < n; ++k) {
      const float v = bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[k]);
      std::memcpy(c.bytes.data() + k * sizeof(float), &v, sizeof v);
    }
    return c;
  }
  c.bytes.assign(p, p + t->byte_size);
  return c;
}

// --- int8 nodes at claim time (Builder::qconv / qgemm)

bool int8_op(const char* domain, const std::string& op) {
  const ChainOp* r = find_chain_op(op);
  if (domain == nullptr || r == nullptr || r->role != ChainRole::kInt8) return false;
  if (*domain == 0) return (r->domains & kOnnx) != 0;
  return std::strcmp(domain, "keel") == 0 && (r->domains & kKeel) != 0;
}

// An int8 node the chain may take: static shapes, X and Y u8/s8/f32, a 1-D/2-D/3-D QConv with an f32 Z if any; a
// QuantizeLinear / DequantizeLinear of an activation (not of a constant: weights stay constants for the
// convolutions reading them) with a constant scalar scale and zero point. The builder checks the rest; what it cannot
// build stays on the standalone kernel. `is_const`: whether a value is an initializer or a folded constant.
bool int8_candidate(const GraphScan& sc, keel_node_id_t n, const std::function<bool(const std::string&)>& is_const) {
  auto ins = sc.ins(n), outs = sc.outs(n);
  if (outs.size() != 1 || outs[0].empty() || ins.empty() || ins[0].empty()) return false;
  auto ok = [](int32_t t) { return t == KEEL_DTYPE_U8 || t == KEEL_DTYPE_I8 || t == KEEL_DTYPE_F32; };
  int32_t t = 0;
  Dims d;
  if (!sc.info(outs[0], &t, &d) || !ok(t) || numel(d) == 0) return false;
  if (!sc.info(ins[0], &t, &d) || !ok(t)) return false;
  if (sc.op(n) == "QuantizeLinear" || sc.op(n) == "DequantizeLinear") {
    if (is_const(ins[0]) || ins.size() < 2 || ins.size() > 3 || !is_const(ins[1])) return false;
    if (ins.size() == 3 && !ins[2].empty() && !is_const(ins[2])) return false;
    // Only next to an int8 node (a QuantizeLinear a QConv / QGemm reads, a DequantizeLinear of one's output): a QDQ
    // graph run as it is (fuse_qdq off) keeps its fp32 chains as they were.
    auto int8_node = [&](keel_node_id_t m) { return sc.op(m) == "QConv" || sc.op(m) == "QGemm"; };
    if (sc.op(n) == "QuantizeLinear") {
      for (auto u : sc.consumers(outs[0]))
        if (int8_node(u)) return true;
      return false;
    }
    keel_node_id_t p = 0;
    return sc.producer(ins[0], &p) && int8_node(p);
  }
  if (sc.op(n) == "QConv" && (d.size() < 3 || d.size() > 5)) return false;
  if (ins.size() > 8 && !ins[8].empty() && (!sc.info(ins[8], &t, &d) || t != KEEL_DTYPE_F32)) return false;
  return true;
}

// The values fuse_qdq holds channels-last (NHWC bytes under the NCHW shape): a QConv's output with output_layout
// NHWC, its X with input_layout NHWC, its Z with residual_layout NHWC, and the values of the element-wise Add /
// QuantizeLinear nodes such values pass through (fuse_qdq keeps all of those channels-last together).
std::set<std::string> channels_last_values(const GraphScan& sc) {
  std::set<std::string> cl;
  auto attr = [&](keel_node_id_t n, const char* name) {
    const char* v = nullptr;
    return sc.api->node_attr_string(sc.g, n, name, &v) && v ? std::string(v) : std::string();
  };
  for (keel_node_id_t n : sc.order) {
    const char* dom = sc.api->node_domain(sc.g, n);
    if (!dom || std::strcmp(dom, "keel") != 0 || sc.op(n) != "QConv") continue;
    auto ins = sc.ins(n), outs = sc.outs(n);
    const std::string out_l = attr(n, "output_layout");
    if (out_l == "NHWC" && !outs.empty()) cl.insert(outs[0]);
    if (attr(n, "input_layout") == "NHWC" && !ins.empty()) cl.insert(ins[0]);
    const std::string z_l = attr(n, "residual_layout");
    if (ins.size() > 8 && !ins[8].empty() && (z_l == "NHWC" || (z_l.empty() && out_l == "NHWC"))) cl.insert(ins[8]);
  }
  if (cl.empty()) return cl;
  for (bool grew = true; grew;) {
    grew = false;
    for (keel_node_id_t n : sc.order) {
      const char* dom = sc.api->node_domain(sc.g, n);
      const std::string op = sc.op(n);
      if ((dom && *dom) || (op != "Add" && op != "QuantizeLinear")) continue;
      auto vals = sc.ins(n);
      vals.resize(op == "Add" ? std::min<size_t>(vals.size(), 2) : std::min<size_t>(vals.size(), 1));
      for (const auto& o : sc.outs(n)) vals.push_back(o);
      bool any = false;
      for (const auto& v : vals) any = any || cl.count(v);
      if (!any) continue;
      for (const auto& v : vals) grew = cl.insert(v).second || grew;
    }
  }
  return cl;
}

// 1-D convolutions, transposed convolutions and poolings run as 2-D ones: [N,C,L] is [N,C,1,L] (the same bytes, plain
// or blocked), kernel 1xk, stride 1xs, pads (0,b)/(0,e). The lift rewrites the recipe before the plan is built, so
// the 2-D code (algorithms, layouts, post-ops, the residual sum) serves 1-D networks unchanged:
//   - the rank-3 values connected to a 1-D Conv/ConvTranspose/pool through ops that do not care about the rank
//     (BatchNormalization, activations, Add/Sub/Mul/Div, Concat, Identity, Dropout) get rank-4 twins "v@2d";
//   - those nodes read and write the twins; their attributes (kernel_shape, strides, dilations, pads,
//     output_padding, Concat's axis) and constant operands (weights [M,C/g,k] -> [M,C/g,1,k], broadcast constants
//     [C,1] -> [C,1,1]) are lifted with them;
//   - where the rank-3 value itself is needed (a boundary input or output, a reader such as MatMul, Transpose,
//     Softmax), an Identity view joins the two (a reorder to the plain layout when the value is blocked).
void lift_1d(Recipe& r) {
  auto rank3 = [&](const std::string& v) {
    auto d = r.dims.find(v);
    return !v.empty() && !r.consts.count(v) && d != r.dims.end() && d->second.size() == 3;
  };
  auto seed = [&](const NodeDesc& n) {
    const ChainOp* op = find_chain_op(n.op);
    if (op == nullptr || op->lift != Lift1d::kSeed || n.in.empty() || n.out.empty() || !rank3(n.in[0]) ||
        !rank3(n.out[0]))
      return false;
    if (n.op == "Conv" || n.op == "ConvTranspose") {
      auto w = r.consts.find(n.in_at(1));
      if (w == r.consts.end() || w->second.dims.size() != 3) return false;
    }
    return true;
  };
  // The data values (not constants) a liftable node reads and writes; empty when the node is not liftable.
  auto data_of = [&](const NodeDesc& n) -> std::vector<std::string> {
    const ChainOp* op = find_chain_op(n.op);
    const Lift1d lift = op != nullptr ? op->lift : Lift1d::kNo;
    if (seed(n) || lift == Lift1d::kUnary) {
      if (n.in.empty() || n.out.empty() || !rank3(n.in[0]) || !rank3(n.out[0])) return {};
      for (size_t k = 1; k < n.in.size(); ++k)
        if (!n.in[k].empty() && !r.consts.count(n.in[k])) return {};
      for (size_t k = 1; k < n.out.size(); ++k)
        if (!n.out[k].empty()) return {};
      return {n.in[0], n.out[0]};
    }
    if (lift == Lift1d::kBinary) {
      std::vector<std::string> d;
      if (n.out.size() != 1 || !rank3(n.out[0])) return {};
      for (const auto& v : n.in) {
        if (v.empty()) return {};
        if (auto c = r.consts.find(v); c != r.consts.end()) {
          if (n.op == "Concat" || c->second.dims.size() > 3) return {};
          continue;
        }
        if (!rank3(v)) return {};
        d.push_back(v);
      }
      d.push_back(n.out[0]);
      return d;
    }
    return {};
  };
  std::set<std::string> lifted;
  for (const NodeDesc& n : r.nodes)
    if (seed(n) && !data_of(n).empty()) lifted.insert({n.in[0], n.out[0]});
  if (lifted.empty()) return;
  for (bool grew = true; grew;) {
    grew = false;
    for (const NodeDesc& n : r.nodes) {
      auto d = data_of(n);
      bool any = false;
      for (const auto& v : d) any = any || lifted.count(v);
      if (any)
        for (const auto& v : d) grew = lifted.insert(v).second || grew;
    }
  }
  auto twin = [](const std::string& v) { return v + "@2d"; };
  auto up = [](Dims d) {  // [N,C,L] -> [N,C,1,L]
    d.insert(d.begin() + 2, 1);
    return d;
  };
  for (const auto& v : lifted) {
    r.dims[twin(v)] = up(r.dims.at(v));
    if (auto t = r.dtypes.find(v); t != r.dtypes.end()) r.dtypes[twin(v)] = t->second;
  }
  auto lift_const = [&](const std::string& c, bool weights) {
    const ConstT& k = r.consts.at(c);
    Dims d = k.dims;
    if (weights) {
      d.insert(d.begin() + 2, 1);
    } else {  // a broadcast operand of a rank-3 value
      if (d.size() < 2) return c;
      while (d.size() < 3) d.insert(d.begin(), 1);
      d = up(d);
    }
    std::string name = c + (weights ? "@2dw" : "@2d");
    if (!r.consts.count(name)) {
      ConstT t = k;
      t.dims = d;
      r.consts[name] = std::move(t);
    }
    return name;
  };
  auto lift_ints = [](NodeDesc& n, const char* name, int64_t fill, bool pads) {
    auto it = n.attrs.find(name);
    if (it == n.attrs.end() || it->second.kind != KEEL_ATTR_INTS) return;
    Dims& a = it->second.ints;
    if (pads && a.size() == 2) a = {fill, a[0], fill, a[1]};
    else if (!pads && a.size() == 1) a.insert(a.begin(), fill);
  };
  std::set<std::string> produced_by_lifted, needs_rank3;
  std::vector<bool> rewrite(r.nodes.size(), false);
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    auto d = data_of(r.nodes[i]);
    rewrite[i] = !d.empty() && lifted.count(d.front());
    if (rewrite[i])
      for (const auto& o : r.nodes[i].out) produced_by_lifted.insert(o);
    else
      for (const auto& v : r.nodes[i].in)
        if (lifted.count(v)) needs_rank3.insert(v);
  }
  for (const auto& o : r.outputs)
    if (lifted.count(o)) needs_rank3.insert(o);
  std::vector<NodeDesc> out;
  auto view = [&](const NodeDesc& near, const std::string& from, const std::string& to) {
    NodeDesc v;
    v.id = near.id;
    v.op = "Identity";
    v.name = near.name + "/rank";
    v.in = {from};
    v.out = {to};
    out.push_back(std::move(v));
  };
  // Lifted values nobody in the claim produces (boundary inputs): a view at the start.
  for (const auto& v : lifted)
    if (!produced_by_lifted.count(v) && std::find(r.inputs.begin(), r.inputs.end(), v) != r.inputs.end())
      view(r.nodes.front(), v, twin(v));
  for (size_t i = 0; i < r.nodes.size(); ++i) {
    NodeDesc n = r.nodes[i];
    if (rewrite[i]) {
      const bool w = n.op == "Conv" || n.op == "ConvTranspose";
      for (size_t k = 0; k < n.in.size(); ++k) {
        if (lifted.count(n.in[k])) n.in[k] = twin(n.in[k]);
        else if (!n.in[k].empty() && r.consts.count(n.in[k]) &&
                 ((w && k == 1) || n.op == "Add" || n.op == "Sub" || n.op == "Mul" || n.op == "Div"))
          n.in[k] = lift_const(n.in[k], w);
      }
      for (auto& o : n.out)
        if (lifted.count(o)) o = twin(o);
      for (const char* a : {"kernel_shape", "strides", "dilations"}) lift_ints(n, a, 1, false);
      lift_ints(n, "output_padding", 0, false);
      lift_ints(n, "pads", 0, true);
      if (n.op == "Concat") {
        int64_t axis = n.ai("axis", 0);
        if (axis < 0) axis += 3;
        n.attrs["axis"].kind = KEEL_ATTR_INT;
        n.attrs["axis"].i = axis == 2 ? 3 : axis;
      }
    }
    out.push_back(n);
    for (const auto& o : r.nodes[i].out) {
      if (!lifted.count(o)) continue;
      if (rewrite[i] && needs_rank3.count(o)) view(r.nodes[i], twin(o), o);
      else if (!rewrite[i]) view(r.nodes[i], o, twin(o));
    }
  }
  r.nodes = std::move(out);
}

}  // namespace keel::onednn::chain
