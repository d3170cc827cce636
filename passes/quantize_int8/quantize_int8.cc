// The INT8 quantization pass plugin. Built against the SDK alone.
//
//   quantize_int8  inserts standard QDQ (QuantizeLinear -> DequantizeLinear) pairs in front of Conv, MatMul and Gemm,
//                  the form ONNX Runtime and int8 devices recognise:
//                  - weights (f32 initializers at input 1): symmetric s8, per output channel (Conv: axis 0; Gemm:
//                    axis 0 with transB=1, else 1; 2-D MatMul: axis 1) when the model's ai.onnx opset is >= 13,
//                    else per tensor; zero points 0. The weight is stored as an s8 initializer + DequantizeLinear.
//                  - activations (input 0): u8 asymmetric (or, with activation_type = "s8", s8 symmetric) from a
//                    calibration range given as an option `range.<value name>` = "min,max" (the range is widened
//                    to contain 0). One Q/DQ pair per value, shared by all its readers. An activation without a
//                    range leaves its node in fp32 (a note).
//                  - biases stay f32.
//                  Options: exclude (node names kept fp32), calibration (the method the ranges came from: only
//                  reported), range.<value> as above, activation_type (u8 | s8, default u8), per_channel (default
//                  true; false quantizes weights per tensor).
//                  Counters: nodes_quantized, nodes_excluded, activations_quantized, weights_quantized, bytes_saved.
//
//   fuse_qdq       the int8 execution form of a QDQ graph: DequantizeLinear(x) -> Conv|MatMul|Gemm(DequantizeLinear(w),
//                  f32 bias) [-> Add(f32 residual)] [-> Relu|Clip] [-> QuantizeLinear] becomes one keel-domain QConv /
//                  QGemm (semantics in ops/reference/fused.cc) that reads the u8/s8 activation and the s8 weight
//                  directly, with the bias, the activation, the residual Add (Conv only: QConv's input Z, an f32
//                  value of the output's shape) and the requantisation fused (without a QuantizeLinear after it, it
//                  writes f32).
//                  Only when host->kernel_exists finds the keel op on the target device; MatMul only with a 2-D
//                  weight; Gemm only with alpha = beta = 1, transA = 0 and a 1-D bias. Weights must be symmetric
//                  (zero points 0), quantized per tensor or along the output-channel axis.
//                  Values inside int8 regions are kept channels-last (option channels_last = true): a value written
//                  by a QConv, or by an element-wise Add / QuantizeLinear whose inputs are channels-last, and read
//                  only by QConvs (input 0) and such element-wise nodes; the QConvs get output_layout /
//                  input_layout = "NHWC", the element-wise nodes compute on the bytes as they are.
//                  The residual Add is folded when the Conv's output is read by that Add alone
//                  (option fuse_add = true); Z's layout is its own (attribute residual_layout).
//                  A QuantizeLinear whose output only a QConv/QGemm reads, with that node's x_scale and x_zero_point,
//                  is folded into it (option fold_quantize = true): the node reads the f32 value and quantizes it
//                  itself (on oneDNN inside the reorder into its layout: one pass over the data instead of two, and
//                  one step less).
//                  First, a per-tensor QuantizeLinear after MaxPool / GlobalMaxPool / a view moves in front of it
//                  (option hoist_quantize = true; exact: hoist_quantize below), so that the pooling runs on 1-byte
//                  values and the Conv before it requantizes instead of writing f32.
//                  Counters: conv_fused, gemm_fused, activations_fused, adds_fused, outputs_requantized,
//                  quantize_folded, quantize_hoisted, channels_last_edges (values).
#include <keel/plugin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/graph_view.h"
#include "common/pass_instance.h"

namespace keel::passes {
namespace {

struct ActQ {
  float scale;
  int32_t zp;
};

ActQ act_params(double lo, double hi, bool s8) {
  lo = std::min(lo, 0.0);
  hi = std::max(hi, 0.0);
  if (s8) {
    double scale = std::max(-lo, hi) / 127.0;
    if (!(scale > 0) || !std::isfinite(scale)) scale = 1.0;
    return {static_cast<float>(scale), 0};
  }
  double scale = (hi - lo) / 255.0;
  if (!(scale > 0) || !std::isfinite(scale)) scale = 1.0;
  double zp = std::round(-lo / scale);
  zp = std::clamp(zp, 0.0, 255.0);
  return {static_cast<float>(scale), static_cast<int32_t>(zp)};
}

keel_status_t quantize(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o, const char*,
                       keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions opts(g_host->options, o);
    std::vector<std::string> excl = opts.get_strings("exclude");
    std::set<std::string> exclude(excl.begin(), excl.end());
    const std::string method = opts.get_string("calibration", "minmax");
    const std::string act_type = opts.get_string("activation_type", "u8");
    if (act_type != "u8" && act_type != "s8")
      throw PassError(KEEL_STATUS_INVALID_ARGUMENT, "activation_type must be u8 or s8, got '" + act_type + "'");
    const bool s8 = act_type == "s8";
    const bool per_channel = opts.get_bool("per_channel", true);
    const bool per_axis_ok = per_channel && (gv.opset("") >= 13 || gv.opset("ai.onnx") >= 13);
    if (per_channel && !per_axis_ok) report.note("ai.onnx opset < 13: weights quantized per tensor");
    std::map<std::string, std::string> act_dq;  // activation -> its DequantizeLinear output
    std::map<std::string, std::string> w_dq;    // weight initializer -> its DequantizeLinear output
    int64_t nodes_q = 0, nodes_x = 0, acts = 0, weights = 0, saved = 0;
    for (keel_node_id_t n : gv.nodes()) {
      bool conv = gv.is(n, "Conv"), mm = gv.is(n, "MatMul"), gemm = gv.is(n, "Gemm");
      if (!conv && !mm && !gemm) continue;
      const std::string nname = gv.name(n);
      if (exclude.count(nname)) {
        ++nodes_x;
        report.note("kept fp32 (excluded): " + nname);
        continue;
      }
      std::string x = gv.input(n, 0), w = gv.input(n, 1);
      auto xt = gv.value_type(x);
      if (gv.is_initializer(x) || (xt && xt->dtype != KEEL_DTYPE_F32)) continue;
      std::optional<std::pair<double, double>> range;
      std::string rs = opts.get_string(("range." + x).c_str(), "");
      if (!rs.empty()) {
        char* end = nullptr;
        double lo = std::strtod(rs.c_str(), &end);
        if (end && *end == ',') range = std::make_pair(lo, std::strtod(end + 1, nullptr));
      }
      if (!range) {
        report.note("kept fp32 (no calibration range for '" + x + "'): " + nname);
        continue;
      }
      const keel_tensor_t* wt = gv.initializer(w);
      if (!wt || wt->dtype != KEEL_DTYPE_F32 || wt->ndim < 1) {
        report.note("kept fp32 (weight is not an f32 constant): " + nname);
        continue;
      }
      // Activation.
      auto it = act_dq.find(x);
      if (it == act_dq.end()) {
        ActQ q = act_params(range->first, range->second, s8);
        std::string s = gv.unique_name(x + "_scale"), z = gv.unique_name(x + "_zero_point");
        gv.set_initializer(s, HostTensor::of<float>(KEEL_DTYPE_F32, {}, std::vector<float>{q.scale}));
        if (s8) gv.set_initializer(z, HostTensor::of<int8_t>(KEEL_DTYPE_I8, {}, std::vector<int8_t>{0}));
        else
          gv.set_initializer(
              z, HostTensor::of<uint8_t>(KEEL_DTYPE_U8, {}, std::vector<uint8_t>{static_cast<uint8_t>(q.zp)}));
        std::string xq = gv.unique_name(x + "_quantized"), xd = gv.unique_name(x + "_dequantized");
        gv.add_node("", "QuantizeLinear", gv.unique_name(x + "_QuantizeLinear"), {x, s, z}, {xq});
        gv.add_node("", "DequantizeLinear", gv.unique_name(x + "_DequantizeLinear"), {xq, s, z}, {xd});
        it = act_dq.emplace(x, xd).first;
        ++acts;
      }
      gv.set_input(n, 0, it->second);
      // Weight.
      auto wit = w_dq.find(w);
      if (wit == w_dq.end()) {
        std::vector<int64_t> dims = GraphView::dims_of(wt);
        int axis = -1;
        if (per_axis_ok) {
          if (conv) axis = 0;
          else if (gemm) axis = gv.attr_int(n, "transB").value_or(0) ? 0 : 1;
          else if (dims.size() == 2) axis = 1;
          if (axis >= static_cast<int>(dims.size())) axis = -1;
        }
        std::vector<float> v = *gv.f32_values(w);
        int64_t len = axis < 0 ? 1 : dims[axis], inner = 1;
        if (axis >= 0)
          for (size_t d = axis + 1; d < dims.size(); ++d) inner *= dims[d];
        auto ch = [&](size_t i) { return axis < 0 ? int64_t{0} : (static_cast<int64_t>(i) / inner) % len; };
        std::vector<float> amax(static_cast<size_t>(len), 0.f);
        for (size_t i = 0; i < v.size(); ++i) amax[ch(i)] = std::max(amax[ch(i)], std::fabs(v[i]));
        std::vector<float> scale(amax.size());
        for (size_t c = 0; c < amax.size(); ++c) scale[c] = amax[c] > 0 ? amax[c] / 127.f : 1.f;
        std::vector<int8_t> q(v.size());
        for (size_t i = 0; i < v.size(); ++i) {
          const float r = std::nearbyint(v[i] / scale[ch(i)]);  // NaN for a NaN weight (or inf / inf): 0
          q[i] = std::isnan(r) ? int8_t{0} : static_cast<int8_t>(std::clamp(r, -127.f, 127.f));
        }
        std::vector<int64_t> sdims = axis < 0 ? std::vector<int64_t>{} : std::vector<int64_t>{len};
        std::string wq = gv.unique_name(w + "_quantized"), s = gv.unique_name(w + "_scale"),
                    z = gv.unique_name(w + "_zero_point"), wd = gv.unique_name(w + "_dequantized");
        gv.set_initializer(wq, HostTensor::of<int8_t>(KEEL_DTYPE_I8, dims, q));
        gv.set_initializer(s, HostTensor::of<float>(KEEL_DTYPE_F32, sdims, scale));
        gv.set_initializer(z, HostTensor::of<int8_t>(KEEL_DTYPE_I8, sdims, std::vector<int8_t>(scale.size(), 0)));
        Attrs a;
        if (axis >= 0) a["axis"] = AttrValue::of_int(axis);
        gv.add_node("", "DequantizeLinear", gv.unique_name(w + "_DequantizeLinear"), {wq, s, z}, {wd}, a);
        wit = w_dq.emplace(w, wd).first;
        ++weights;
        saved += static_cast<int64_t>(v.size() * 3 - scale.size() * 5);
      }
      gv.set_input(n, 1, wit->second);
      if (gv.use_count(w) == 0) gv.remove_initializer(w);
      ++nodes_q;
    }
    gv.infer_shapes();
    report.count("nodes_quantized", nodes_q);
    report.count("nodes_excluded", nodes_x);
    report.count("activations_quantized", acts);
    report.count("weights_quantized", weights);
    if (saved > 0) report.count("bytes_saved", saved);
    if (nodes_q) report.note("activation ranges from " + method + " calibration");
  });
}

// ------------------------------------------------------------------------------------------------ fuse_qdq

bool has_kernel(const char* domain, const char* op, int32_t opset, const char* device) {
  return g_host->kernel_exists &&
         g_host->kernel_exists(g_plugin, domain, op, opset, device ? device : "cpu", nullptr, 0);
}

// A scalar initializer's dtype (KEEL_DTYPE_UNDEFINED when `v` is not a one-element initializer).
int32_t scalar_dtype(const GraphView& gv, const std::string& v) {
  const keel_tensor_t* t = gv.initializer(v);
  return t && GraphView::numel_of(t) == 1 ? t->dtype : KEEL_DTYPE_UNDEFINED;
}

// A per-tensor QuantizeLinear (constant scalar scale > 0, u8/s8 zero point) of the output of MaxPool,
// GlobalMaxPool or a view (Flatten, Reshape, Squeeze, Unsqueeze, Identity) moves in front of that node, which then
// runs on the 1-byte values: exact, because quantizing is monotone (x * (1 / scale) rounded half to even, plus the
// zero point, saturated: a <= b gives q(a) <= q(b)), so the maximum of a window's quantized values is the quantized
// maximum, and a view moves bytes without changing them. It climbs as far as such nodes go, so that a QuantizeLinear
// in front of a classifier's Gemm climbs over Flatten and MaxPool to the Conv + Relu before them, which then
// requantizes its output (the fusion below) instead of writing f32 for the pooling to read: a quarter of the bytes
// through the pooling, and no separate quantizing step. Each node passed must read a value that it alone reads (else
// both forms would be kept) and have a kernel for the 1-byte type on the device (ai.onnx MaxPool takes int8/uint8
// from opset 12); the QuantizeLinear's output must not be a graph output. And the climb must pay: it passes a max
// pooling, or ends at a Conv / Relu / Clip output (a Conv that requantizes); a climb over a view alone (MobileNetV2's
// GlobalAveragePool -> Flatten -> QuantizeLinear -> Gemm) would only split the QuantizeLinear from the QGemm it
// folds into. Returns how many nodes were passed.
int64_t hoist_quantize(GraphView& gv, const char* device) {
  const int32_t opset = std::max(gv.opset(""), gv.opset("ai.onnx"));
  auto is_pool = [&](keel_node_id_t n) { return gv.is(n, "MaxPool") || gv.is(n, "GlobalMaxPool"); };
  auto is_view = [&](keel_node_id_t n) {
    return gv.is(n, "Flatten") || gv.is(n, "Reshape") || gv.is(n, "Squeeze") || gv.is(n, "Unsqueeze") ||
           gv.is(n, "Identity");
  };
  // The node producing `v` when the QuantizeLinear (of type qt) may move over it, else nothing.
  auto passable = [&](const std::string& v, int32_t qt) -> std::optional<keel_node_id_t> {
    auto p = gv.producer(v);
    if (!p || !gv.single_use(v) || !(is_pool(*p) || is_view(*p)) || (is_pool(*p) && opset < 12)) return std::nullopt;
    std::vector<std::string> outs = gv.outputs(*p);
    if (outs.empty() || outs[0] != v) return std::nullopt;
    for (size_t k = 1; k < outs.size(); ++k)
      if (!outs[k].empty()) return std::nullopt;  // MaxPool's Indices
    const std::string x = gv.input(*p, 0);
    auto xt = gv.value_type(x);
    if (x.empty() || gv.is_initializer(x) || !gv.single_use(x) || !xt || xt->dtype != KEEL_DTYPE_F32)
      return std::nullopt;
    const int32_t one = qt;
    if (!g_host->kernel_exists ||
        !g_host->kernel_exists(g_plugin, "", gv.op(*p).c_str(), opset, device ? device : "cpu", &one, 1))
      return std::nullopt;
    return p;
  };
  int64_t moved = 0;
  for (keel_node_id_t q : gv.nodes()) {
    if (!gv.exists(q) || !gv.is(q, "QuantizeLinear") || gv.has_attr(q, "saturate")) continue;
    std::vector<std::string> qi = gv.inputs(q);
    if (qi.size() != 3 || scalar_dtype(gv, qi[1]) != KEEL_DTYPE_F32) continue;
    const int32_t qt = scalar_dtype(gv, qi[2]);
    if (qt != KEEL_DTYPE_U8 && qt != KEEL_DTYPE_I8) continue;
    const auto scale = gv.scalar(qi[1]);
    if (!scale || !(*scale > 0) || !std::isfinite(*scale) || gv.is_graph_output(gv.output(q, 0))) continue;
    // The climb: the nodes it passes, from the QuantizeLinear up.
    std::vector<keel_node_id_t> path;
    bool pays = false;
    for (std::string v = qi[0];;) {
      auto p = passable(v, qt);
      if (!p) break;
      path.push_back(*p);
      pays = pays || is_pool(*p);
      v = gv.input(*p, 0);
    }
    if (path.empty()) continue;
    if (auto top = gv.producer(gv.input(path.back(), 0)))
      pays = pays || gv.is(*top, "Conv") || gv.is(*top, "Relu") || gv.is(*top, "Clip");
    if (!pays) continue;
    // x -> QuantizeLinear -> xq -> P -> v (now 1-byte) for each node P passed, read where the QuantizeLinear's output
    // was read.
    const Attrs qa = gv.attrs(q);
    keel_node_id_t cur = q;
    for (keel_node_id_t p : path) {
      const std::string x = gv.input(p, 0), v = gv.output(p, 0), y = gv.output(cur, 0);
      const std::string xq = gv.unique_name(x + "_quantized");
      keel_node_id_t next = gv.add_node("", "QuantizeLinear", gv.unique_name(gv.name(q)), {x, qi[1], qi[2]}, {xq}, qa);
      gv.set_input(p, 0, xq);
      gv.remove_node(cur);
      gv.replace_uses(y, v);
      cur = next;
      ++moved;
    }
  }
  return moved;
}

keel_status_t fuse_qdq(void*, keel_graph_t* g, const keel_graph_api_t* api, const keel_options_t* o, const char* device,
                       keel_pass_report_t* r) {
  return run_pass(g_host, [&] {
    GraphView gv(g, api);
    Report report(r);
    PassOptions opts(g_host->options, o);
    const bool opts_channels_last = opts.get_bool("channels_last", true);
    const bool fuse_add = opts.get_bool("fuse_add", true);
    const bool fold_quantize = opts.get_bool("fold_quantize", true);
    const bool hoist = opts.get_bool("hoist_quantize", true);
    const bool conv_ok = has_kernel("keel", "QConv", 1, device), gemm_ok = has_kernel("keel", "QGemm", 1, device);
    int64_t convs = 0, gemms = 0, acts = 0, adds = 0, requant = 0, no_kernel = 0;
    const int64_t hoisted = hoist ? hoist_quantize(gv, device) : 0;
    if (hoisted) gv.infer_shapes();
    report.count("quantize_hoisted", hoisted);
    for (keel_node_id_t n : gv.nodes()) {
      if (!gv.exists(n) || !gv.domain(n).empty()) continue;
      const bool conv = gv.is(n, "Conv"), mm = gv.is(n, "MatMul"), gemm = gv.is(n, "Gemm");
      if (!conv && !mm && !gemm) continue;
      std::vector<std::string> ins = gv.inputs(n);
      if (ins.size() < 2) continue;
      // Activation: DequantizeLinear(xq, x_scale f32 scalar, [x_zero_point u8/s8 scalar]).
      auto px = gv.producer(ins[0]);
      if (!px || !gv.is(*px, "DequantizeLinear")) continue;
      std::vector<std::string> xin = gv.inputs(*px);
      auto xt = gv.value_type(xin[0]);
      if (!xt || (xt->dtype != KEEL_DTYPE_U8 && xt->dtype != KEEL_DTYPE_I8)) continue;
      if (xin.size() < 2 || scalar_dtype(gv, xin[1]) != KEEL_DTYPE_F32) continue;
      std::string xzp = xin.size() > 2 ? xin[2] : "";
      if (!xzp.empty() && scalar_dtype(gv, xzp) != xt->dtype) continue;
      // Weight: DequantizeLinear(wq s8 constant, w_scale, [zero points all 0]).
      auto pw = gv.producer(ins[1]);
      if (!pw || !gv.is(*pw, "DequantizeLinear")) continue;
      std::vector<std::string> win = gv.inputs(*pw);
      const keel_tensor_t* wq = gv.initializer(win[0]);
      const keel_tensor_t* ws = win.size() > 1 ? gv.initializer(win[1]) : nullptr;
      if (!wq || wq->dtype != KEEL_DTYPE_I8 || !ws || ws->dtype != KEEL_DTYPE_F32) continue;
      if (win.size() > 2 && !win[2].empty()) {
        auto z = gv.constant_values(win[2]);
        if (!z || std::any_of(z->begin(), z->end(), [](double v) { return v != 0; })) continue;
      }
      std::vector<int64_t> wd = GraphView::dims_of(wq);
      const int64_t ws_n = GraphView::numel_of(ws);
      const int64_t wdq_axis = gv.attr_int(*pw, "axis").value_or(1);
      const bool trans_b = gemm && gv.attr_int(n, "transB").value_or(0) != 0;
      int64_t out_axis, out_ch;
      if (conv) {
        if (wd.size() < 3) continue;
        out_axis = 0;
      } else {
        if (wd.size() != 2) continue;
        out_axis = trans_b ? 0 : 1;
      }
      out_ch = wd[static_cast<size_t>(out_axis)];
      if (ws_n != 1 &&
          !(ws_n == out_ch && (wdq_axis == out_axis || wdq_axis == out_axis - static_cast<int64_t>(wd.size()))))
        continue;
      // Bias: an f32 constant with one entry per output channel.
      std::string bias;
      if (conv && ins.size() > 2) bias = ins[2];
      if (gemm) {
        if (gv.attr_int(n, "transA").value_or(0) != 0 || gv.attr_float(n, "alpha").value_or(1.f) != 1.f) continue;
        if (ins.size() > 2 && !ins[2].empty()) {
          if (gv.attr_float(n, "beta").value_or(1.f) != 1.f) continue;
          bias = ins[2];
        }
      }
      if (!bias.empty()) {
        const keel_tensor_t* bt = gv.initializer(bias);
        if (!bt || bt->dtype != KEEL_DTYPE_F32 || GraphView::numel_of(bt) != out_ch) continue;
      }
      if (mm) {
        auto at = gv.value_type(ins[0]);
        if (!at || at->dims.size() < 2) continue;
      }
      if (gemm) {
        auto at = gv.value_type(ins[0]);
        if (!at || at->dims.size() != 2) continue;
      }
      if ((conv && !conv_ok) || (!conv && !gemm_ok)) {
        ++no_kernel;
        continue;
      }
      // The chain after it: [Relu | Clip(constant min, max)] [QuantizeLinear(scalar scale, u8/s8 zero point)].
      std::vector<keel_node_id_t> chain = {n};
      std::string out = gv.output(n, 0);
      Attrs attrs;
      if (conv) {
        for (const char* a : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
          if (gv.has_attr(n, a)) attrs[a] = gv.attrs(n)[a];
      } else {
        attrs["transB"] = AttrValue::of_int(trans_b ? 1 : 0);
      }
      // A residual Add of an f32 value with the same shape (no broadcasting), folded in as QConv's input Z.
      std::string residual;
      if (conv && fuse_add && gv.single_use(out)) {
        keel_node_id_t c = gv.consumers(out)[0];
        std::vector<std::string> ai = gv.inputs(c);
        if (gv.is(c, "Add") && ai.size() == 2 && ai[0] != ai[1] && gv.outputs(c).size() == 1) {
          const std::string& other = ai[0] == out ? ai[1] : ai[0];
          auto ot = gv.value_type(out), zt = gv.value_type(other);
          if (ot && zt && ot->fully_known() && zt->fully_known() && ot->dims == zt->dims &&
              zt->dtype == KEEL_DTYPE_F32) {
            residual = other;
            chain.push_back(c);
            out = gv.output(c, 0);
            ++adds;
          }
        }
      }
      if (gv.single_use(out)) {
        keel_node_id_t c = gv.consumers(out)[0];
        std::optional<std::pair<float, float>> clip;
        if (gv.is(c, "Clip")) {
          std::vector<std::string> ci = gv.inputs(c);
          float lo = gv.attr_float(c, "min").value_or(-3.4028235e38f),
                hi = gv.attr_float(c, "max").value_or(3.4028235e38f);
          bool ok = true;
          if (ci.size() > 1 && !ci[1].empty()) {
            auto v = gv.scalar(ci[1]);
            ok = ok && v.has_value();
            if (v) lo = static_cast<float>(*v);
          }
          if (ci.size() > 2 && !ci[2].empty()) {
            auto v = gv.scalar(ci[2]);
            ok = ok && v.has_value();
            if (v) hi = static_cast<float>(*v);
          }
          if (ok) clip = std::make_pair(lo, hi);
        }
        if (gv.is(c, "Relu") || clip) {
          attrs["activation"] = AttrValue::of_string(clip ? "Clip" : "Relu");
          if (clip) attrs["activation_params"] = AttrValue::of_floats({clip->first, clip->second});
          chain.push_back(c);
          out = gv.output(c, 0);
          ++acts;
        }
      }
      std::string ys, yzp;
      if (gv.single_use(out)) {
        keel_node_id_t c = gv.consumers(out)[0];
        std::vector<std::string> qi = gv.inputs(c);
        if (gv.is(c, "QuantizeLinear") && qi.size() == 3 && scalar_dtype(gv, qi[1]) == KEEL_DTYPE_F32 &&
            (scalar_dtype(gv, qi[2]) == KEEL_DTYPE_U8 || scalar_dtype(gv, qi[2]) == KEEL_DTYPE_I8)) {
          ys = qi[1];
          yzp = qi[2];
          chain.push_back(c);
          out = gv.output(c, 0);
          ++requant;
        }
      }
      const std::string name = gv.name(n);
      std::vector<std::string> new_in = {xin[0], win[0], bias, xin[1], xzp, win[1], ys, yzp, residual};
      while (!new_in.empty() && new_in.back().empty()) new_in.pop_back();
      for (keel_node_id_t c : chain) gv.remove_node(c);
      gv.add_node("keel", conv ? "QConv" : "QGemm", name, new_in, {out}, attrs);
      for (keel_node_id_t dq : {*px, *pw})
        if (gv.exists(dq) && gv.use_count(gv.output(dq, 0)) == 0) gv.remove_node(dq);
      (conv ? convs : gemms)++;
    }
    // QuantizeLinear(f32 x, s, zp) -> QConv/QGemm(X, ..., x_scale = s, x_zero_point = zp): the int8 node reads x.
    // After the loop above, so that a QuantizeLinear after a Conv has been taken as that Conv's requantisation.
    int64_t q_folded = 0;
    auto same_scalar = [&](const std::string& a, const std::string& b) {
      if (a == b) return true;
      auto va = gv.scalar(a), vb = gv.scalar(b);
      return va && vb && *va == *vb && scalar_dtype(gv, a) == scalar_dtype(gv, b);
    };
    for (keel_node_id_t n : fold_quantize ? gv.nodes() : std::vector<keel_node_id_t>{}) {
      if (!gv.exists(n) || gv.domain(n) != "keel" || (gv.op(n) != "QConv" && gv.op(n) != "QGemm")) continue;
      std::vector<std::string> in = gv.inputs(n);
      if (in.size() < 5 || in[4].empty() || !gv.single_use(in[0])) continue;
      auto p = gv.producer(in[0]);
      if (!p || !gv.is(*p, "QuantizeLinear")) continue;
      std::vector<std::string> qi = gv.inputs(*p);
      auto ft = gv.value_type(qi[0]);
      if (qi.size() != 3 || !ft || ft->dtype != KEEL_DTYPE_F32 || !same_scalar(qi[1], in[3]) ||
          !same_scalar(qi[2], in[4]))
        continue;
      gv.set_input(n, 0, qi[0]);
      gv.remove_node(*p);
      ++q_folded;
    }
    report.count("quantize_folded", q_folded);
    // Channels-last regions (the layout int8 convolutions compute in): a value stays NHWC when it is written by a
    // QConv or by an element-wise Add / per-tensor QuantizeLinear whose activation inputs are NHWC themselves, and
    // every reader is a QConv (at its input 0) or such an element-wise node — so the residual path of an int8
    // network (QConv -> Add -> QuantizeLinear -> QConv) runs without converting layouts. Element-wise ops compute
    // the same on any layout as long as all their inputs and their output share it; graph outputs and any other
    // reader keep the plain layout. Found as a fixpoint: start from every candidate, drop what breaks a rule.
    auto is_qconv = [&](keel_node_id_t n) { return gv.domain(n) == "keel" && gv.op(n) == "QConv"; };
    // A QConv's residual input Z (input 8), read in whichever layout it has (residual_layout).
    auto qconv_z = [&](keel_node_id_t n) {
      std::vector<std::string> in = gv.inputs(n);
      return in.size() > 8 ? in[8] : std::string();
    };
    auto is_elementwise = [&](keel_node_id_t n) {
      if (!gv.domain(n).empty() || gv.outputs(n).size() != 1) return false;
      std::vector<std::string> in = gv.inputs(n);
      if (gv.is(n, "Add")) {
        if (in.size() != 2) return false;
        auto a = gv.value_type(in[0]), b = gv.value_type(in[1]);
        return a && b && a->fully_known() && a->ndim >= 3 && a->dims == b->dims;
      }
      if (gv.is(n, "QuantizeLinear"))
        return in.size() >= 2 && scalar_dtype(gv, in[1]) == KEEL_DTYPE_F32 &&
               (in.size() < 3 || in[2].empty() || scalar_dtype(gv, in[2]) != KEEL_DTYPE_UNDEFINED);
      return false;
    };
    // The inputs of an element-wise node that carry its activation (Add: both; QuantizeLinear: the first).
    auto act_inputs = [&](keel_node_id_t n) {
      std::vector<std::string> in = gv.inputs(n);
      if (!gv.is(n, "Add")) in.resize(1);
      return in;
    };
    std::set<std::string> cl;
    if (opts_channels_last)
      for (keel_node_id_t n : gv.nodes())
        if (gv.exists(n) && (is_qconv(n) || is_elementwise(n))) cl.insert(gv.output(n, 0));
    for (bool changed = true; changed;) {
      changed = false;
      for (auto it = cl.begin(); it != cl.end();) {
        const std::string v = *it;
        bool ok = !gv.is_graph_output(v);
        auto p = gv.producer(v);
        ok = ok && p.has_value();
        if (ok && is_elementwise(*p))
          for (const std::string& i : act_inputs(*p)) ok = ok && cl.count(i);
        for (keel_node_id_t c : ok ? gv.consumers(v) : std::vector<keel_node_id_t>{}) {
          std::vector<std::string> ci = gv.inputs(c);
          if (is_qconv(c)) {
            // As X (input 0) and/or as Z; no other input.
            ok = ok && std::count(ci.begin(), ci.end(), v) == (ci[0] == v) + (qconv_z(c) == v);
          } else if (is_elementwise(c)) {
            std::vector<std::string> ai = act_inputs(c);
            ok = ok && cl.count(gv.output(c, 0)) &&
                 std::count(ci.begin(), ci.end(), v) == std::count(ai.begin(), ai.end(), v);
            for (const std::string& i : ai) ok = ok && cl.count(i);
          } else {
            ok = false;
          }
        }
        if (ok) {
          ++it;
        } else {
          it = cl.erase(it);
          changed = true;
        }
      }
    }
    int64_t nhwc = 0;
    for (const std::string& v : cl) {
      if (auto p = gv.producer(v); p && is_qconv(*p)) gv.set_attr(*p, "output_layout", AttrValue::of_string("NHWC"));
      for (keel_node_id_t c : gv.consumers(v))
        if (is_qconv(c) && gv.inputs(c)[0] == v) gv.set_attr(c, "input_layout", AttrValue::of_string("NHWC"));
      ++nhwc;
    }
    for (keel_node_id_t n : gv.nodes())
      if (gv.exists(n) && is_qconv(n) && !qconv_z(n).empty())
        gv.set_attr(n, "residual_layout", AttrValue::of_string(cl.count(qconv_z(n)) ? "NHWC" : "NCHW"));
    report.count("channels_last_edges", nhwc);
    if (no_kernel)
      report.note("no QConv/QGemm kernel on device '" + std::string(device ? device : "") + "': left " +
                  std::to_string(no_kernel) + " pattern(s) in QDQ form");
    gv.infer_shapes();
    report.count("conv_fused", convs);
    report.count("gemm_fused", gemms);
    report.count("activations_fused", acts);
    report.count("adds_fused", adds);
    report.count("outputs_requantized", requant);
  });
}

keel_status_t init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  static const PassSpec kPasses[] = {
      {"quantize_int8",
       "INT8 QDQ quantization of Conv/MatMul/Gemm (per-channel s8 weights, u8/s8 activations from range.<value> "
       "options)",
       quantize},
      {"fuse_qdq",
       "QDQ Conv/MatMul/Gemm (+ Relu/Clip + QuantizeLinear) to int8 keel.QConv / keel.QGemm where the device has them",
       fuse_qdq},
  };
  return init_pass_instance(host, plugin, out_instance, kPasses, [](const keel_core_api_t* h) -> const char* {
    return h->graph == nullptr ? "no graph API" : nullptr;
  });
}

const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "quantize_int8",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_PASS,
                               .init = nullptr,
                               .shutdown = nullptr,
                               .init_instance = init_instance,
                               .shutdown_instance = shutdown_pass_instance};

}  // namespace
}  // namespace keel::passes

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::passes::kPlugin; }
