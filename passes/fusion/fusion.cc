// The fusion pass plugin: pattern rewrites that make fewer, bigger ops. Built against the SDK alone.
//
//   fuse_conv_bn            BatchNormalization (inference) after a Conv with constant weights folds into the Conv's
//                           weights and bias: a pure-ONNX result.
//   fuse_gelu               x*0.5*(1+erf(x/sqrt(2))) and its tanh approximation (any of their usual spellings)
//                           -> keel.Gelu (approximate = "tanh" for the latter)
//   fuse_layer_norm         ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul][/Add] -> LayerNormalization (ai.onnx
//                           opset >= 17 in the graph) or keel.LayerNormalization (same semantics, older opsets)
//   fuse_attention          MatMul(Q,Kt) -> Div|Mul(scalar) -> [Add(mask)] -> Softmax(last axis) -> MatMul(.,V)
//                           -> keel.Attention
//   fuse_conv_activation    Conv [+ per-channel constant Add] [+ residual Add] [+ activation] -> keel.FusedConv
//   fuse_matmul_activation  MatMul [+ constant bias Add] [+ residual Add] [+ activation] -> keel.FusedMatMul;
//                           Gemm [+ residual Add] [+ activation] -> keel.FusedGemm
//
// The rule every keel-domain rewrite follows: the fused op is produced only when the target device has a kernel for
// it (host->kernel_exists) ranked at least as high as the kernel the pattern's main op runs on now
// (host->kernel_priority, ABI 1.2): where oneDNN runs Conv/MatMul and claims their chains itself, the reference
// keel.FusedConv would be a step down. Otherwise the nodes stay as they were and the report says why. A fused node
// writes the value the last node of its pattern wrote (same name), so the value info the graph has stays valid.
//
// Semantics of the keel ops (also implemented by ops/reference/fused.cc):
//   FusedConv(X, W, [B], [Z])       Y = act(conv(X, W) + B + Z); Conv's attributes
//   FusedMatMul(A, B, [bias], [Z])  Y = act(matmul(A, B) + bias + Z); bias is 1-D over the last axis
//   FusedGemm(A, B, [C], [Z])       Y = act(alpha * A' B' + beta * C + Z); Gemm's attributes
//   Gelu(X)                         Y = 0.5 x (1 + erf(x / sqrt 2))
//   LayerNormalization(X, Scale, [B])  as ONNX LayerNormalization-17 (only output 0)
//   Attention(Q, Kt, V, [mask])     Y = softmax(matmul(Q, Kt) * scale + mask, last axis) @ V; attribute scale
//   act: attribute `activation` = "" | Relu | Sigmoid | Tanh | HardSwish | LeakyRelu | Clip | Gelu, with
//   `activation_params` (LeakyRelu: alpha; Clip: min, max).
#include <keel/plugin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/graph_view.h"
#include "common/pass_instance.h"

namespace keel::passes {
namespace {

constexpr int32_t kKeelOpset = 1;

// What the fused ops will compute in, and whether any kernel will do. Pass options:
//   dtype      = "f32" (default: the graph as matched; every matcher takes f32 patterns only), or "bf16"/"f16" when
//                convert_precision runs after the fusion passes (`keel run --precision bf16` sets it): kernels are
//                looked up for that type, so that a kernel for another type only (oneDNN's bf16 keel.FusedConv for
//                an f32 graph) does not count;
//   any_kernel = true skips the ranking below (any kernel will do: to get the keel ops for a device this process has
//                not loaded, or to test the rewrites).
struct Gate {
  bool any_kernel = false;
  int32_t dtype = KEEL_DTYPE_F32;
};

Gate gate_of(const keel_options_t* o) {
  PassOptions po(g_host->options, o);
  Gate g;
  g.any_kernel = po.get_bool("any_kernel", false);
  const std::string d = po.get_string("dtype", "f32");
  if (d == "bf16") g.dtype = KEEL_DTYPE_BF16;
  else if (d == "f16") g.dtype = KEEL_DTYPE_F16;
  else if (d != "f32")
    throw PassError(KEEL_STATUS_INVALID_ARGUMENT, "option dtype = '" + d + "': expected f32, bf16 or f16");
  return g;
}

// Whether to produce `domain.op` (at `opset`) on `device` in place of patterns built around the ai.onnx ops
// `anchors` (at the graph's `onnx_opset`): the device must have a kernel for it in the gate's dtype, ranked at least
// as high as the kernels the anchors run on now (ABI 1.2 kernel_priority). A fused op served only by a lower-ranked
// provider (the reference keel.FusedConv where oneDNN runs Conv, and claims Conv + Add + Relu chains itself) would
// move the work onto slower kernels. `why` gets the reason when not.
bool fusion_pays(const char* domain, const char* op, int32_t opset, std::initializer_list<const char*> anchors,
                 int32_t onnx_opset, const char* device, const Gate& gate, std::string* why) {
  const std::string dev = device ? device : "cpu";
  const std::string name = (domain && *domain ? std::string(domain) + "." : std::string()) + op;
  const int32_t dt[] = {gate.dtype};
  if (!g_host->kernel_exists || !g_host->kernel_exists(g_plugin, domain, op, opset, dev.c_str(), dt, 1)) {
    *why =
        "no kernel for " + name + " on device '" + dev + "'" + (gate.dtype == KEEL_DTYPE_F32 ? "" : " in that dtype");
    return false;
  }
  if (gate.any_kernel || !KEEL_HAS_MEMBER(g_host, keel_core_api_t, kernel_priority) ||
      g_host->kernel_priority == nullptr)
    return true;
  const int32_t fused = g_host->kernel_priority(g_plugin, domain, op, opset, dev.c_str(), dt, 1);
  for (const char* a : anchors) {
    const int32_t base = g_host->kernel_priority(g_plugin, "", a, onnx_opset, dev.c_str(), dt, 1);
    if (base > fused) {
      *why = name + "'s kernel on device '" + dev + "' ranks below " + a + "'s (priority " + std::to_string(fused) +
             " < " + std::to_string(base) + ")";
      return false;
    }
  }
  return true;
}

std::string unfused_note(const std::string& why, int64_t patterns) {
  return why + ": left " + std::to_string(patterns) + " pattern(s) unfused";
}

// Removes `nodes`, adds the replacement, then drops initializers the removed nodes read that nobody reads any more.
// Returns the bytes released.
int64_t replace_pattern(GraphView& gv, const std::vector<keel_node_id_t>& nodes, const std::string& dom,
                        const std::string& op, const std::string& name, const std::vector<std::string>& ins,
                        const std::vector<std::string>& outs, const Attrs& attrs) {
  std::set<std::string> read;
  for (keel_node_id_t n : nodes) {
    for (const auto& i : gv.inputs(n))
      if (!i.empty()) read.insert(i);
    gv.remove_node(n);
  }
  gv.add_node(dom, op, name, ins, outs, attrs);
  int64_t bytes = 0;
  for (const auto& v : read) {
    const keel_tensor_t* t = gv.initializer(v);
    if (!t || gv.use_count(v) != 0) continue;
    bytes += static_cast<int64_t>(t->byte_size);
    gv.remove_initializer(v);
  }
  return bytes;
}

// The single node reading `v` (and v is no graph output), if it is an ai.onnx `op`.
std::optional<keel_node_id_t> sole_consumer(const GraphView& gv, const std::string& v, const char* op = nullptr) {
  if (!gv.single_use(v)) return std::nullopt;
  keel_node_id_t c = gv.consumers(v)[0];
  if (op && !gv.is(c, op)) return std::nullopt;
  return c;
}

// The other input of a binary node, given one of them ("" when the node reads `v` twice or is not binary).
std::string other_input(const GraphView& gv, keel_node_id_t n, const std::string& v) {
  std::vector<std::string> ins = gv.inputs(n);
  if (ins.size() != 2 || ins[0] == ins[1]) return "";
  if (ins[0] == v) return ins[1];
  if (ins[1] == v) return ins[0];
  return "";
}

bool near(double a, double b, double rel = 1e-3) { return std::fabs(a - b) <= rel * std::max(1.0, std::fabs(b)); }

// ------------------------------------------------------------------------------------------------ fuse_conv_bn

keel_status_t fuse_conv_bn(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t*, const char*,
                           keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    int64_t fused = 0, bytes = 0;
    std::map<std::string, int64_t> skipped;
    for (keel_node_id_t conv : gv.nodes()) {
      if (!gv.exists(conv) || !gv.is(conv, "Conv")) continue;
      std::string y = gv.output(conv, 0);
      auto bn = sole_consumer(gv, y, "BatchNormalization");
      if (!bn || gv.input(*bn, 0) != y) continue;
      if (gv.attr_int(*bn, "training_mode").value_or(0) != 0) {
        ++skipped["training-mode BatchNormalization"];
        continue;
      }
      bool extra_outputs = false;
      for (size_t i = 1; i < gv.outputs(*bn).size(); ++i) {
        std::string o = gv.output(*bn, i);
        extra_outputs = extra_outputs || (!o.empty() && gv.use_count(o) != 0);
      }
      if (extra_outputs) {
        ++skipped["BatchNormalization statistics outputs in use"];
        continue;
      }
      auto w = gv.f32_values(gv.input(conv, 1));
      auto scale = gv.f32_values(gv.input(*bn, 1)), shift = gv.f32_values(gv.input(*bn, 2));
      auto mean = gv.f32_values(gv.input(*bn, 3)), var = gv.f32_values(gv.input(*bn, 4));
      if (!w || !scale || !shift || !mean || !var) {
        ++skipped["non-constant or non-f32 weights/statistics"];
        continue;
      }
      std::string b_name = gv.input(conv, 2);
      std::optional<std::vector<float>> b0;
      if (!b_name.empty()) {
        b0 = gv.f32_values(b_name);
        if (!b0) {
          ++skipped["non-constant Conv bias"];
          continue;
        }
      }
      std::vector<int64_t> wdims = GraphView::dims_of(gv.initializer(gv.input(conv, 1)));
      if (wdims.empty()) continue;
      const int64_t M = wdims[0];
      const size_t m = static_cast<size_t>(M);
      if (scale->size() != m || shift->size() != m || mean->size() != m || var->size() != m ||
          (b0 && b0->size() != m)) {
        ++skipped["channel counts differ"];
        continue;
      }
      Attrs attrs = gv.attrs(conv);
      if (!GraphView::all_readable(attrs)) {
        ++skipped["Conv attributes unreadable"];
        continue;
      }
      const double eps = gv.attr_float(*bn, "epsilon").value_or(1e-5f);
      const int64_t per = M > 0 ? static_cast<int64_t>(w->size()) / M : 0;
      std::vector<float> w2(w->size()), b2(m);
      for (int64_t oc = 0; oc < M; ++oc) {
        double s = (*scale)[oc] / std::sqrt(static_cast<double>((*var)[oc]) + eps);
        for (int64_t k = 0; k < per; ++k) w2[oc * per + k] = static_cast<float>((*w)[oc * per + k] * s);
        double bias = b0 ? (*b0)[oc] : 0.0;
        b2[oc] = static_cast<float>((bias - (*mean)[oc]) * s + (*shift)[oc]);
      }
      std::string name = gv.name(conv);
      std::string wn = gv.add_f32(name.empty() ? "conv_bn_w" : name + "_w", wdims, w2);
      std::string bn_b = gv.add_f32(name.empty() ? "conv_bn_b" : name + "_b", {M}, b2);
      std::string out = gv.output(*bn, 0);
      bytes += replace_pattern(gv, {conv, *bn}, "", "Conv", name, {gv.input(conv, 0), wn, bn_b}, {out}, attrs);
      ++fused;
    }
    report.count("ops_fused", fused);
    if (bytes) report.count("bytes_saved", bytes);
    for (const auto& [why, n] : skipped)
      report.note("skipped " + std::to_string(n) + " Conv+BatchNormalization: " + why);
  });
}

// ------------------------------------------------------------------------------------------------ fuse_gelu

struct GeluMatch {
  std::vector<keel_node_id_t> nodes;
  std::string x, out;
  bool tanh = false;  // the tanh approximation (keel.Gelu approximate = "tanh")
};

// The part after the Erf / Tanh node `act` (whose input came from x): Add(1) -> then either Mul(x, .) -> Mul(., 0.5),
// Mul(., 0.5) -> Mul(x, .), or Mul(Mul(x, 0.5), .). Appends its nodes to m and sets m.out and m.x.
bool match_gelu_tail(const GraphView& gv, keel_node_id_t act, const std::string& x, GeluMatch& m) {
  std::string e_out = gv.output(act, 0);
  auto add = sole_consumer(gv, e_out, "Add");
  if (!add) return false;
  auto one = gv.scalar(other_input(gv, *add, e_out));
  if (!one || !near(*one, 1.0, 1e-6)) return false;
  m.nodes.push_back(act);
  m.nodes.push_back(*add);
  std::string a_out = gv.output(*add, 0);
  auto mul1 = sole_consumer(gv, a_out, "Mul");
  if (!mul1) return false;
  std::string other = other_input(gv, *mul1, a_out);
  if (other.empty()) return false;
  m.nodes.push_back(*mul1);
  std::string m1_out = gv.output(*mul1, 0);
  if (other == x) {
    // (x * (1 + erf)) * 0.5
    auto mul2 = sole_consumer(gv, m1_out, "Mul");
    if (!mul2) return false;
    auto half = gv.scalar(other_input(gv, *mul2, m1_out));
    if (!half || !near(*half, 0.5, 1e-6)) return false;
    m.nodes.push_back(*mul2);
    m.out = gv.output(*mul2, 0);
  } else if (auto half = gv.scalar(other)) {
    // ((1 + erf) * 0.5) * x
    if (!near(*half, 0.5, 1e-6)) return false;
    auto mul2 = sole_consumer(gv, m1_out, "Mul");
    if (!mul2 || other_input(gv, *mul2, m1_out) != x) return false;
    m.nodes.push_back(*mul2);
    m.out = gv.output(*mul2, 0);
  } else {
    // (x * 0.5) * (1 + erf)
    auto hp = gv.producer(other);
    if (!hp || !gv.is(*hp, "Mul") || !gv.single_use(other)) return false;
    std::string hx;
    for (int k = 0; k < 2 && hx.empty(); ++k) {
      auto c = gv.scalar(gv.input(*hp, k));
      if (c && near(*c, 0.5, 1e-6)) hx = gv.input(*hp, 1 - k);
    }
    if (hx != x) return false;
    m.nodes.push_back(*hp);
    m.out = m1_out;
  }
  m.x = x;
  return true;
}

// Root: an Erf node. Accepts Div(x, sqrt2) | Mul(x, 1/sqrt2) -> Erf -> the tail above.
std::optional<GeluMatch> match_gelu(const GraphView& gv, keel_node_id_t erf) {
  GeluMatch m;
  std::string e_in = gv.input(erf, 0);
  auto et = gv.value_type(e_in);
  if (et && et->dtype != KEEL_DTYPE_F32 && et->dtype != KEEL_DTYPE_UNDEFINED) return std::nullopt;
  auto pre = gv.producer(e_in);
  if (!pre || !gv.single_use(e_in)) return std::nullopt;
  std::string x;
  if (gv.is(*pre, "Div")) {
    auto c = gv.scalar(gv.input(*pre, 1));
    if (!c || !near(*c, std::sqrt(2.0))) return std::nullopt;
    x = gv.input(*pre, 0);
  } else if (gv.is(*pre, "Mul")) {
    for (int k = 0; k < 2 && x.empty(); ++k) {
      auto c = gv.scalar(gv.input(*pre, k));
      if (c && near(*c, 1.0 / std::sqrt(2.0))) x = gv.input(*pre, 1 - k);
    }
    if (x.empty()) return std::nullopt;
  } else {
    return std::nullopt;
  }
  m.nodes = {*pre};
  if (!match_gelu_tail(gv, erf, x, m)) return std::nullopt;
  return m;
}

// The input of a single-use binary `op` node producing `v` whose other input is a scalar near `c` ("" otherwise).
std::string scaled_input(const GraphView& gv, const std::string& v, const char* op, double c,
                         std::vector<keel_node_id_t>& nodes) {
  auto n = gv.producer(v);
  if (!n || !gv.is(*n, op) || !gv.single_use(v)) return "";
  for (int k = 0; k < 2; ++k) {
    auto s = gv.scalar(gv.input(*n, k));
    if (s && near(*s, c, 1e-6)) {
      nodes.push_back(*n);
      return gv.input(*n, 1 - k);
    }
  }
  return "";
}

// Root: a Tanh node. The tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch exports
// F.gelu(approximate="tanh") and Hugging Face's gelu_new / GPT-2 write it: Mul(sqrt(2/pi), Add(x, Mul(0.044715, x^3)))
// -> Tanh -> the tail above, with x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x), operands in either order.
std::optional<GeluMatch> match_gelu_tanh(const GraphView& gv, keel_node_id_t tanh) {
  GeluMatch m;
  m.tanh = true;
  std::string t_in = gv.input(tanh, 0);
  auto tt = gv.value_type(t_in);
  if (tt && tt->dtype != KEEL_DTYPE_F32 && tt->dtype != KEEL_DTYPE_UNDEFINED) return std::nullopt;
  const std::string inner = scaled_input(gv, t_in, "Mul", 0.7978845608028654 /* sqrt(2 / pi) */, m.nodes);
  if (inner.empty()) return std::nullopt;
  auto add = gv.producer(inner);
  if (!add || !gv.is(*add, "Add") || !gv.single_use(inner)) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    std::vector<keel_node_id_t> head = m.nodes;
    head.push_back(*add);
    const std::string x = gv.input(*add, k);
    const std::string cube = scaled_input(gv, gv.input(*add, 1 - k), "Mul", 0.044715, head);
    if (cube.empty() || x.empty()) continue;
    auto cn = gv.producer(cube);
    if (!cn || !gv.single_use(cube)) continue;
    bool is_cube = false;
    if (gv.is(*cn, "Pow")) {
      auto e = gv.scalar(gv.input(*cn, 1));
      is_cube = gv.input(*cn, 0) == x && e && near(*e, 3.0, 1e-6);
      head.push_back(*cn);
    } else if (gv.is(*cn, "Mul")) {
      // x * (x * x) or (x * x) * x
      for (int j = 0; j < 2 && !is_cube; ++j) {
        if (gv.input(*cn, j) != x) continue;
        const std::string sq = gv.input(*cn, 1 - j);
        auto sn = gv.producer(sq);
        if (sn && gv.is(*sn, "Mul") && gv.single_use(sq) && gv.input(*sn, 0) == x && gv.input(*sn, 1) == x) {
          is_cube = true;
          head.push_back(*cn);
          head.push_back(*sn);
        }
      }
    }
    if (!is_cube) continue;
    m.nodes = head;
    if (!match_gelu_tail(gv, tanh, x, m)) return std::nullopt;
    return m;
  }
  return std::nullopt;
}

keel_status_t fuse_gelu(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                        const char* device, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    const Gate gate = gate_of(o);
    std::string why_erf, why_tanh;
    const bool ok_erf = fusion_pays("keel", "Gelu", kKeelOpset, {"Erf"}, gv.opset(""), device, gate, &why_erf);
    const bool ok_tanh = fusion_pays("keel", "Gelu", kKeelOpset, {"Tanh"}, gv.opset(""), device, gate, &why_tanh);
    int64_t fused = 0, found_erf = 0, found_tanh = 0, bytes = 0;
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n)) continue;
      std::optional<GeluMatch> m;
      if (gv.is(n, "Erf")) m = match_gelu(gv, n);
      else if (gv.is(n, "Tanh")) m = match_gelu_tanh(gv, n);
      if (!m) continue;
      ++(m->tanh ? found_tanh : found_erf);
      if (!(m->tanh ? ok_tanh : ok_erf)) continue;
      Attrs attrs;
      if (m->tanh) attrs["approximate"] = AttrValue::of_string("tanh");
      bytes += replace_pattern(gv, m->nodes, "keel", "Gelu", gv.name(n), {m->x}, {m->out}, attrs);
      ++fused;
    }
    report.count("ops_fused", fused);
    if (bytes) report.count("bytes_saved", bytes);
    if (found_erf && !ok_erf) report.note(unfused_note(why_erf, found_erf));
    if (found_tanh && !ok_tanh) report.note(unfused_note(why_tanh, found_tanh));
  });
}

// ------------------------------------------------------------------------------------------------ fuse_layer_norm

// Normalised, sorted axes of a ReduceMean (attribute, or constant input 1); nullopt when unknown.
std::optional<std::vector<int64_t>> reduce_axes(const GraphView& gv, keel_node_id_t n, int64_t rank) {
  std::optional<std::vector<int64_t>> axes = gv.attr_ints(n, "axes");
  if (!axes && !gv.input(n, 1).empty()) {
    auto c = gv.constant_values(gv.input(n, 1));
    if (!c) return std::nullopt;
    axes = std::vector<int64_t>(c->begin(), c->end());
  }
  if (!axes || axes->empty() || gv.attr_int(n, "keepdims").value_or(1) != 1) return std::nullopt;
  for (auto& a : *axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return std::nullopt;
  }
  std::sort(axes->begin(), axes->end());
  return axes;
}

struct LnMatch {
  std::vector<keel_node_id_t> nodes;
  std::string x, out, gamma, beta;
  int64_t axis = -1;
  float eps = 1e-5f;
  std::vector<int64_t> norm_dims;
};

std::optional<LnMatch> match_layer_norm(const GraphView& gv, keel_node_id_t rm1) {
  LnMatch m;
  m.x = gv.input(rm1, 0);
  auto xt = gv.value_type(m.x);
  if (!xt || xt->ndim < 1 || xt->dtype != KEEL_DTYPE_F32) return std::nullopt;
  const int64_t rank = xt->ndim;
  auto axes = reduce_axes(gv, rm1, rank);
  if (!axes) return std::nullopt;
  for (size_t i = 0; i < axes->size(); ++i)
    if ((*axes)[i] != rank - static_cast<int64_t>(axes->size()) + static_cast<int64_t>(i)) return std::nullopt;
  m.axis = (*axes)[0];
  m.norm_dims.assign(xt->dims.begin() + m.axis, xt->dims.end());
  std::string mean = gv.output(rm1, 0);
  auto sub = sole_consumer(gv, mean, "Sub");
  if (!sub || gv.input(*sub, 0) != m.x || gv.input(*sub, 1) != mean) return std::nullopt;
  std::string d = gv.output(*sub, 0);
  if (gv.is_graph_output(d)) return std::nullopt;
  std::vector<keel_node_id_t> dc = gv.consumers(d);
  if (dc.size() != 2) return std::nullopt;
  keel_node_id_t sq = dc[0], div = dc[1];
  if (gv.is(sq, "Div")) std::swap(sq, div);
  if (!gv.is(div, "Div") || gv.input(div, 0) != d) return std::nullopt;
  if (gv.is(sq, "Pow")) {
    auto e = gv.scalar(gv.input(sq, 1));
    if (gv.input(sq, 0) != d || !e || *e != 2.0) return std::nullopt;
  } else if (gv.is(sq, "Mul")) {
    if (gv.input(sq, 0) != d || gv.input(sq, 1) != d) return std::nullopt;
  } else {
    return std::nullopt;
  }
  auto rm2 = sole_consumer(gv, gv.output(sq, 0), "ReduceMean");
  if (!rm2) return std::nullopt;
  auto axes2 = reduce_axes(gv, *rm2, rank);
  if (!axes2 || *axes2 != *axes) return std::nullopt;
  std::string var = gv.output(*rm2, 0);
  auto add = sole_consumer(gv, var, "Add");
  if (!add) return std::nullopt;
  auto eps = gv.scalar(other_input(gv, *add, var));
  if (!eps) return std::nullopt;
  m.eps = static_cast<float>(*eps);
  auto sqrt = sole_consumer(gv, gv.output(*add, 0), "Sqrt");
  if (!sqrt || gv.input(div, 1) != gv.output(*sqrt, 0) || !gv.single_use(gv.output(*sqrt, 0))) return std::nullopt;
  m.nodes = {rm1, *sub, sq, *rm2, *add, *sqrt, div};
  m.out = gv.output(div, 0);
  const int64_t norm_numel = numel(m.norm_dims);
  auto fits = [&](const std::string& v) {
    const keel_tensor_t* t = gv.initializer(v);
    return t && t->dtype == KEEL_DTYPE_F32 && numel(GraphView::dims_of(t)) == norm_numel &&
           static_cast<int64_t>(GraphView::dims_of(t).size()) <= static_cast<int64_t>(m.norm_dims.size());
  };
  if (auto mul = sole_consumer(gv, m.out, "Mul")) {
    std::string gamma = other_input(gv, *mul, m.out);
    if (fits(gamma)) {
      m.gamma = gamma;
      m.nodes.push_back(*mul);
      m.out = gv.output(*mul, 0);
      if (auto badd = sole_consumer(gv, m.out, "Add")) {
        std::string beta = other_input(gv, *badd, m.out);
        if (fits(beta)) {
          m.beta = beta;
          m.nodes.push_back(*badd);
          m.out = gv.output(*badd, 0);
        }
      }
    }
  }
  for (int64_t dd : m.norm_dims)
    if (dd < 0 && m.gamma.empty()) return std::nullopt;  // cannot make a Scale of ones without the size
  return m;
}

keel_status_t fuse_layer_norm(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                              const char* device, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    const Gate gate = gate_of(o);
    const int32_t onnx_opset = gv.opset("");
    std::string dom, op = "LayerNormalization";
    std::string why;
    if (onnx_opset >= 17 &&
        fusion_pays("", "LayerNormalization", onnx_opset, {"ReduceMean"}, onnx_opset, device, gate, &why))
      dom = "";
    else if (fusion_pays("keel", "LayerNormalization", kKeelOpset, {"ReduceMean"}, onnx_opset, device, gate, &why))
      dom = "keel";
    else dom = "-";
    int64_t fused = 0, found = 0, bytes = 0;
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n) || !gv.is(n, "ReduceMean")) continue;
      auto m = match_layer_norm(gv, n);
      if (!m) continue;
      ++found;
      if (dom == "-") continue;
      // Scale and B as LayerNormalization wants them: the normalised shape.
      auto reshape_to_norm = [&](const std::string& v, float fill) -> std::string {
        if (!v.empty()) {
          const keel_tensor_t* t = gv.initializer(v);
          if (GraphView::dims_of(t) == m->norm_dims) return v;
          return gv.add_f32(v + "_ln", m->norm_dims, *gv.f32_values(v));
        }
        return gv.add_f32(fill == 1.f ? "ln_scale" : "ln_bias", m->norm_dims,
                          std::vector<float>(static_cast<size_t>(numel(m->norm_dims)), fill));
      };
      std::string scale = reshape_to_norm(m->gamma, 1.f);
      std::vector<std::string> ins = {m->x, scale};
      if (!m->beta.empty()) ins.push_back(reshape_to_norm(m->beta, 0.f));
      Attrs attrs = {{"axis", AttrValue::of_int(m->axis)}, {"epsilon", AttrValue::of_float(m->eps)}};
      bytes += replace_pattern(gv, m->nodes, dom, op, gv.name(n), ins, {m->out}, attrs);
      ++fused;
    }
    report.count("ops_fused", fused);
    if (bytes) report.count("bytes_saved", bytes);
    if (found && dom == "-") report.note(unfused_note(why, found));
    if (fused && dom == "keel")
      report.note("the graph imports ai.onnx opset " + std::to_string(onnx_opset) +
                  " (< 17): produced keel.LayerNormalization");
  });
}

// ------------------------------------------------------------------------------------------------ fuse_attention

struct AttnMatch {
  std::vector<keel_node_id_t> nodes;
  std::string q, kt, v, mask, out;
  float scale = 1.f;
};

std::optional<AttnMatch> match_attention(const GraphView& gv, keel_node_id_t softmax, int32_t opset) {
  AttnMatch m;
  std::string s_in = gv.input(softmax, 0);
  auto st = gv.value_type(s_in);
  int64_t axis = gv.attr_int(softmax, "axis").value_or(opset >= 13 ? -1 : 1);
  if (axis != -1) {
    if (!st || st->ndim < 0 || axis != st->ndim - 1) return std::nullopt;
  }
  if (st && st->dtype != KEEL_DTYPE_F32 && st->dtype != KEEL_DTYPE_UNDEFINED) return std::nullopt;
  std::vector<keel_node_id_t> chain;
  std::string cur = s_in;
  auto p = gv.producer(cur);
  if (!p || !gv.single_use(cur)) return std::nullopt;
  // Optional additive mask.
  if (gv.is(*p, "Add")) {
    std::vector<std::string> ins = gv.inputs(*p);
    for (int k = 0; k < 2; ++k) {
      auto pp = gv.producer(ins[k]);
      if (pp && (gv.is(*pp, "Div") || gv.is(*pp, "Mul") || gv.is(*pp, "MatMul")) && gv.single_use(ins[k])) {
        m.mask = ins[1 - k];
        chain.push_back(*p);
        cur = ins[k];
        p = pp;
        break;
      }
    }
    if (m.mask.empty()) return std::nullopt;
  }
  if (gv.is(*p, "Div") || gv.is(*p, "Mul")) {
    bool div = gv.is(*p, "Div");
    std::string a = gv.input(*p, 0), b = gv.input(*p, 1);
    std::optional<double> c = gv.scalar(b);
    std::string mm = a;
    if (!c && !div) {
      c = gv.scalar(a);
      mm = b;
    }
    if (!c || *c == 0) return std::nullopt;
    m.scale = static_cast<float>(div ? 1.0 / *c : *c);
    chain.push_back(*p);
    cur = mm;
    p = gv.producer(cur);
    if (!p || !gv.single_use(cur)) return std::nullopt;
  }
  if (!gv.is(*p, "MatMul")) return std::nullopt;
  chain.push_back(*p);
  m.q = gv.input(*p, 0);
  m.kt = gv.input(*p, 1);
  // A scalar Mul/Div of Q or of Kt in front of the MatMul (torch's scaled_dot_product_attention and
  // nn.MultiheadAttention scale q before q @ k^T; some exports scale q and k by d^-1/4 each): into the scale.
  for (std::string* operand : {&m.q, &m.kt}) {
    auto pre = gv.producer(*operand);
    if (!pre || m.q == m.kt || !gv.single_use(*operand) || !(gv.is(*pre, "Div") || gv.is(*pre, "Mul"))) continue;
    const bool div = gv.is(*pre, "Div");
    std::string x = gv.input(*pre, 0);
    std::optional<double> c = gv.scalar(gv.input(*pre, 1));
    if (!c && !div) {
      c = gv.scalar(x);
      x = gv.input(*pre, 1);
    }
    if (!c || *c == 0 || !std::isfinite(*c)) continue;
    // x keeps the operand's shape: the constant must not broadcast it to a higher rank.
    auto xt = gv.value_type(x), ot = gv.value_type(*operand);
    if (!xt || !ot || xt->ndim < 0 || xt->ndim != ot->ndim) continue;
    if (xt->dtype != KEEL_DTYPE_F32 && xt->dtype != KEEL_DTYPE_UNDEFINED) continue;
    m.scale = static_cast<float>(m.scale * (div ? 1.0 / *c : *c));
    chain.push_back(*pre);
    *operand = x;
  }
  std::string s_out = gv.output(softmax, 0);
  auto mm2 = sole_consumer(gv, s_out, "MatMul");
  if (!mm2 || gv.input(*mm2, 0) != s_out) return std::nullopt;
  m.v = gv.input(*mm2, 1);
  m.out = gv.output(*mm2, 0);
  std::reverse(chain.begin(), chain.end());
  m.nodes = chain;
  m.nodes.push_back(softmax);
  m.nodes.push_back(*mm2);
  return m;
}

keel_status_t fuse_attention(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                             const char* device, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    const Gate gate = gate_of(o);
    std::string why;
    const bool ok =
        fusion_pays("keel", "Attention", kKeelOpset, {"MatMul", "Softmax"}, gv.opset(""), device, gate, &why);
    const int32_t opset = gv.opset("");
    int64_t fused = 0, found = 0;
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n) || !gv.is(n, "Softmax")) continue;
      auto m = match_attention(gv, n, opset);
      if (!m) continue;
      ++found;
      if (!ok) continue;
      std::vector<std::string> ins = {m->q, m->kt, m->v};
      if (!m->mask.empty()) ins.push_back(m->mask);
      replace_pattern(gv, m->nodes, "keel", "Attention", gv.name(n), ins, {m->out},
                      {{"scale", AttrValue::of_float(m->scale)}});
      ++fused;
    }
    report.count("ops_fused", fused);
    if (found && !ok) report.note(unfused_note(why, found));
  });
}

// ------------------------------------------------------------------------------------------------ epilogues

struct Epilogue {
  std::vector<keel_node_id_t> nodes;
  std::optional<std::vector<float>> bias;  // a constant Add folded into the bias (already broadcast to `channels`)
  std::string z;                           // a residual Add's other operand
  std::string activation;
  std::vector<float> params;
  std::string out;
  bool empty() const { return nodes.empty(); }
};

// The activation node `n` as (name, params), or nullopt.
std::optional<std::pair<std::string, std::vector<float>>> activation_of(const GraphView& gv, keel_node_id_t n,
                                                                        int32_t opset) {
  // (keel.Gelu's tanh approximation has no fused-activation form: it stays a node of its own.)
  if (gv.domain(n) == "keel" && gv.op(n) == "Gelu")
    return gv.attr_string(n, "approximate").value_or("none") == "none"
               ? std::make_optional(std::make_pair(std::string("Gelu"), std::vector<float>{}))
               : std::nullopt;
  if (!gv.domain(n).empty()) return std::nullopt;
  std::string op = gv.op(n);
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish")
    return std::make_pair(op, std::vector<float>{});
  if (op == "LeakyRelu") return std::make_pair(op, std::vector<float>{gv.attr_float(n, "alpha").value_or(0.01f)});
  if (op == "Clip") {
    float lo = -FLT_MAX, hi = FLT_MAX;
    if (opset < 11) {
      lo = gv.attr_float(n, "min").value_or(lo);
      hi = gv.attr_float(n, "max").value_or(hi);
    } else {
      std::string a = gv.input(n, 1), b = gv.input(n, 2);
      if (!a.empty()) {
        auto v = gv.scalar(a);
        if (!v) return std::nullopt;
        lo = static_cast<float>(*v);
      }
      if (!b.empty()) {
        auto v = gv.scalar(b);
        if (!v) return std::nullopt;
        hi = static_cast<float>(*v);
      }
    }
    return std::make_pair(op, std::vector<float>{lo, hi});
  }
  return std::nullopt;
}

// Follows `v` through [constant bias Add] [residual Add] [activation]. `bias_ok(dims)` says whether a constant of
// those dims adds per output channel; `channels` is how many entries the fused bias has.
template <class BiasOk>
Epilogue match_epilogue(const GraphView& gv, std::string v, int32_t opset, int64_t channels, BiasOk bias_ok) {
  Epilogue e;
  auto vt = gv.value_type(v);
  if (channels > 0) {
    if (auto add = sole_consumer(gv, v, "Add")) {
      std::string c = other_input(gv, *add, v);
      const keel_tensor_t* t = gv.initializer(c);
      if (t && t->dtype == KEEL_DTYPE_F32 && bias_ok(GraphView::dims_of(t))) {
        std::vector<float> vals = *gv.f32_values(c);
        if (vals.size() == 1) vals.assign(static_cast<size_t>(channels), vals[0]);
        if (static_cast<int64_t>(vals.size()) == channels) {
          e.bias = vals;
          e.nodes.push_back(*add);
          v = gv.output(*add, 0);
        }
      }
    }
  }
  if (auto add = sole_consumer(gv, v, "Add")) {
    std::string c = other_input(gv, *add, v);
    auto ct = gv.value_type(c);
    auto ot = gv.value_type(gv.output(*add, 0));
    if (!c.empty() && !gv.is_initializer(c) && vt && ct && ot && vt->fully_known() && ct->fully_known() &&
        ct->dims == vt->dims && ot->fully_known() && ot->dims == vt->dims && ct->dtype == vt->dtype) {
      e.z = c;
      e.nodes.push_back(*add);
      v = gv.output(*add, 0);
    }
  }
  if (auto c = sole_consumer(gv, v)) {
    if (gv.input(*c, 0) == v) {
      if (auto act = activation_of(gv, *c, opset)) {
        e.activation = act->first;
        e.params = act->second;
        e.nodes.push_back(*c);
        v = gv.output(*c, 0);
      }
    }
  }
  e.out = v;
  return e;
}

void add_activation_attrs(Attrs& attrs, const Epilogue& e) {
  if (!e.activation.empty()) attrs["activation"] = AttrValue::of_string(e.activation);
  if (!e.params.empty()) attrs["activation_params"] = AttrValue::of_floats(e.params);
}

// ------------------------------------------------------------------------------------------------ fuse_conv_activation

keel_status_t fuse_conv_activation(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                                   const char* device, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    const Gate gate = gate_of(o);
    const int32_t opset = gv.opset("");
    std::string why;
    const bool ok = fusion_pays("keel", "FusedConv", kKeelOpset, {"Conv"}, opset, device, gate, &why);
    int64_t fused = 0, found = 0, merged = 0, bytes = 0;
    for (keel_node_id_t conv : gv.nodes()) {
      if (!gv.exists(conv) || !gv.is(conv, "Conv")) continue;
      Attrs attrs = gv.attrs(conv);
      if (!GraphView::all_readable(attrs)) continue;
      std::string w = gv.input(conv, 1), b = gv.input(conv, 2);
      auto wt = gv.value_type(w);
      if (!wt || wt->ndim < 3 || wt->dims[0] <= 0 || wt->dtype != KEEL_DTYPE_F32) continue;
      const int64_t M = wt->dims[0], rank = wt->ndim;
      std::optional<std::vector<float>> b0;
      bool bias_const = b.empty();
      if (!b.empty()) {
        b0 = gv.f32_values(b);
        bias_const = b0.has_value();
      }
      auto per_channel = [&](const std::vector<int64_t>& d) {
        if (numel(d) == 1) return static_cast<int64_t>(d.size()) <= rank;
        // [M, 1, ...] (rank-1 dims) or [1, M, 1, ...] (rank dims).
        size_t off = d.size() == static_cast<size_t>(rank) ? 1 : d.size() == static_cast<size_t>(rank - 1) ? 0 : 99;
        if (off == 99 || (off == 1 && d[0] != 1) || d[off] != M) return false;
        for (size_t i = off + 1; i < d.size(); ++i)
          if (d[i] != 1) return false;
        return true;
      };
      Epilogue e = match_epilogue(gv, gv.output(conv, 0), opset, bias_const ? M : 0, per_channel);
      if (e.empty()) continue;
      ++found;
      if (!ok) continue;
      std::string bias = b;
      if (e.bias) {
        std::vector<float> sum = *e.bias;
        if (b0)
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += (*b0)[i];
        bias = gv.add_f32(gv.name(conv) + "_bias", {M}, sum);
      }
      add_activation_attrs(attrs, e);
      std::vector<std::string> ins = {gv.input(conv, 0), w, bias};
      if (!e.z.empty()) ins.push_back(e.z);
      std::vector<keel_node_id_t> nodes = {conv};
      nodes.insert(nodes.end(), e.nodes.begin(), e.nodes.end());
      bytes += replace_pattern(gv, nodes, "keel", "FusedConv", gv.name(conv), ins, {e.out}, attrs);
      ++fused;
      merged += static_cast<int64_t>(e.nodes.size());
    }
    report.count("ops_fused", fused);
    report.count("nodes_merged", merged);
    if (bytes) report.count("bytes_saved", bytes);
    if (found && !ok) report.note(unfused_note(why, found));
  });
}

// ------------------------------------------------------------------------------------------------
// fuse_matmul_activation

keel_status_t fuse_matmul_activation(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o,
                                     const char* device, keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    const Gate gate = gate_of(o);
    const int32_t opset = gv.opset("");
    std::string mm_why, gemm_why;
    const bool mm_ok = fusion_pays("keel", "FusedMatMul", kKeelOpset, {"MatMul"}, opset, device, gate, &mm_why);
    const bool gemm_ok = fusion_pays("keel", "FusedGemm", kKeelOpset, {"Gemm"}, opset, device, gate, &gemm_why);
    int64_t fused = 0, mm_found = 0, gemm_found = 0, merged = 0, bytes = 0;
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n)) continue;
      bool mm = gv.is(n, "MatMul"), gemm = gv.is(n, "Gemm");
      if (!mm && !gemm) continue;
      Attrs attrs = gv.attrs(n);
      if (!GraphView::all_readable(attrs)) continue;
      std::string y = gv.output(n, 0);
      auto yt = gv.value_type(y);
      if (yt && yt->dtype != KEEL_DTYPE_F32) continue;
      if (gemm) {
        Epilogue e = match_epilogue(gv, y, opset, 0, [](const std::vector<int64_t>&) { return false; });
        if (e.empty()) continue;
        ++gemm_found;
        if (!gemm_ok) continue;
        add_activation_attrs(attrs, e);
        std::vector<std::string> ins = {gv.input(n, 0), gv.input(n, 1), gv.input(n, 2)};
        if (!e.z.empty()) ins.push_back(e.z);
        std::vector<keel_node_id_t> nodes = {n};
        nodes.insert(nodes.end(), e.nodes.begin(), e.nodes.end());
        bytes += replace_pattern(gv, nodes, "keel", "FusedGemm", gv.name(n), ins, {e.out}, attrs);
        ++fused;
        merged += static_cast<int64_t>(e.nodes.size());
        continue;
      }
      // MatMul: the bias runs over the last axis, N = B's last dim.
      auto bt = gv.value_type(gv.input(n, 1));
      int64_t N = bt && bt->ndim >= 2 ? bt->dims.back() : -1;
      const int64_t out_rank = yt ? yt->ndim : -1;
      auto last_axis = [&](const std::vector<int64_t>& d) {
        if (d.empty()) return true;
        if (out_rank >= 0 ? static_cast<int64_t>(d.size()) > out_rank : d.size() > 1) return false;
        for (size_t i = 0; i + 1 < d.size(); ++i)
          if (d[i] != 1) return false;
        return d.back() == N || d.back() == 1;
      };
      Epilogue e = match_epilogue(gv, y, opset, N > 0 ? N : 0, last_axis);
      if (e.empty()) continue;
      ++mm_found;
      if (!mm_ok) continue;
      add_activation_attrs(attrs, e);
      std::string bias;
      if (e.bias) bias = gv.add_f32(gv.name(n).empty() ? "matmul_bias" : gv.name(n) + "_bias", {N}, *e.bias);
      std::vector<std::string> ins = {gv.input(n, 0), gv.input(n, 1), bias};
      if (!e.z.empty()) ins.push_back(e.z);
      std::vector<keel_node_id_t> nodes = {n};
      nodes.insert(nodes.end(), e.nodes.begin(), e.nodes.end());
      bytes += replace_pattern(gv, nodes, "keel", "FusedMatMul", gv.name(n), ins, {e.out}, attrs);
      ++fused;
      merged += static_cast<int64_t>(e.nodes.size());
    }
    report.count("ops_fused", fused);
    report.count("nodes_merged", merged);
    if (bytes) report.count("bytes_saved", bytes);
    if (mm_found && !mm_ok) report.note(unfused_note(mm_why, mm_found));
    if (gemm_found && !gemm_ok) report.note(unfused_note(gemm_why, gemm_found));
  });
}

keel_status_t init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  static const PassSpec kPasses[] = {
      {"fuse_conv_bn", "folds inference BatchNormalization into the preceding Conv's weights and bias", fuse_conv_bn},
      {"fuse_gelu", "recognises the decomposed Gelu (erf, or its tanh approximation) and makes keel.Gelu", fuse_gelu},
      {"fuse_layer_norm", "recognises decomposed layer normalisation and makes LayerNormalization", fuse_layer_norm},
      {"fuse_attention", "MatMul->scale->[mask]->Softmax->MatMul becomes keel.Attention", fuse_attention},
      {"fuse_conv_activation", "Conv + bias + residual Add + activation becomes keel.FusedConv", fuse_conv_activation},
      {"fuse_matmul_activation", "MatMul/Gemm + bias + residual Add + activation becomes keel.FusedMatMul/FusedGemm",
       fuse_matmul_activation},
  };
  return init_pass_instance(host, plugin, out_instance, kPasses);
}

const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "fusion",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_PASS,
                               .init = nullptr,
                               .shutdown = nullptr,
                               .init_instance = init_instance,
                               .shutdown_instance = shutdown_pass_instance};

}  // namespace
}  // namespace keel::passes

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::passes::kPlugin; }
