// plugins/cpu_onednn/chain/ops/int8.cc — keel.QConv, keel.QGemm and per-tensor QuantizeLinear/DequantizeLinear steps
// (the standalone kernels' set-up, kernels/int8.h).
#include "chain/builder.h"

#include <optional>

namespace keel::onednn::chain {

QNodeView Builder::qnode_view(const NodeDesc& n) const {
  QNodeView v;
  v.in.resize(n.in.size());
  for (size_t k = 0; k < n.in.size(); ++k) {
    const std::string& name = n.in[k];
    QInputView& x = v.in[k];
    if (name.empty()) continue;
    x.present = true;
    if (const ConstT* c = cst(name)) {
      x.dtype = c->dtype;
      x.dims = c->dims;
      x.dims_known = true;
      x.data = c->bytes.empty() ? nullptr : c->bytes.data();
      continue;
    }
    if (auto t = r_.dtypes.find(name); t != r_.dtypes.end()) x.dtype = t->second;
    if (auto d = r_.dims.find(name); d != r_.dims.end()) x.dims = d->second, x.dims_known = true;
  }
  if (auto t = r_.dtypes.find(n.out.empty() ? std::string() : n.out[0]); t != r_.dtypes.end()) v.out_dtype = t->second;
  v.activation = n.as("activation", "");
  if (auto a = n.attrs.find("activation_params"); a != n.attrs.end() && a->second.kind == KEEL_ATTR_FLOATS) {
    v.has_activation_params = true;
    v.activation_params = a->second.floats;
  }
  return v;
}

// A boundary value's layout: channels-last where the graph holds it so (an int8 region's value), else plain.
md_t Builder::boundary_md(const std::string& name, const Dims& d, dt t) const {
  if (r_.channels_last.count(name) && d.size() >= 3 && d.size() <= 5)
    return md_t(to_dnnl(d), t, channels_last_tag(d.size()));
  return plain_md(d, t);
}

// An s32 scalar the plan owns (a primitive's runtime zero point).
dnnl::memory Builder::zero_point_mem(int32_t v) {
  p_->owned.emplace_back(md_t({1}, dt::s32, tag::a), engine());
  *static_cast<int32_t*>(p_->owned.back().get_data_handle()) = v;
  return p_->owned.back();
}

// Whether every reader of `v` in the claim is a QConv of rank `rank` reading it as its X only (and there is one).
bool Builder::qconv_x_only(const std::string& v, size_t rank) {
  const auto& us = users(v);
  for (size_t u : us) {
    const NodeDesc& c = r_.nodes[u];
    if (c.op != "QConv" || c.in.empty() || c.in[0] != v || std::count(c.in.begin(), c.in.end(), v) != 1) return false;
    const ConstT* w = cst(c.in_at(1));
    if (!w || w->dims.size() != rank) return false;
  }
  return !us.empty();
}

// The f32 value `name` quantized with q's x_scale and x_zero_point into `want` (u8/s8): one step the first time,
// shared by later readers with the same parameters and layout. The arithmetic is the standalone kernels' (x * (1 /
// x_scale), rounded half to even, plus the zero point, saturated), so the bytes are theirs.
Val Builder::quantized(const std::string& name, const QuantSetup& q, const md_t& want) {
  const Val v = val(name);
  if (v.scale != 1.f) throw Reject{"a scaled view read by an int8 step"};
  if (v.md.data_type() != dt::f32) throw Reject{"X is not f32"};
  const QuantizeSpec spec = q.quantize_spec();
  std::string key = name + "#q";
  key.append(reinterpret_cast<const char*>(&spec), sizeof spec);
  key.append(reinterpret_cast<const char*>(&want.data), sizeof want.data);
  key = name + "#q" + std::to_string(std::hash<std::string>()(key));
  if (auto it = vals_.find(key); it != vals_.end()) return it->second;
  const Dims d = md_dims(want);
  const int64_t n = numel(d), N = d.empty() ? 1 : d[0], C = d.size() > 1 ? d[1] : 1;
  const int64_t S = N * C > 0 ? n / (N * C) : 0;
  const bool to_last = d.size() >= 3 && want == md_t(want.dims(), want.data_type(), channels_last_tag(d.size()));
  Int8QuantizeStep st;
  st.q = spec;
  st.n = n, st.N = N, st.C = C, st.S = S;
  const char* how = nullptr;
  if (int8_own_kernels()) {
    if (with_dtype(v.md, want.data_type()) == want && v.md.get_size() == static_cast<size_t>(n) * sizeof(float)) {
      st.kind = Int8QuantizeStep::Kind::kSame, how = "own_quantize:avx512";
    } else if (to_last && is_plain_dense(v.md)) {
      st.kind = Int8QuantizeStep::Kind::kToNhwc, how = "own_quantize_to_nhwc:avx512";
    } else if (to_last && v.md == md_t(v.md.dims(), dt::f32, blocked16_tag(d.size()))) {
      st.kind = Int8QuantizeStep::Kind::kBlocked, how = "own_quantize_nChw16c_to_nhwc:avx512";
    }
  }
  Val& dst = define(key, want);
  if (how) {
    Exec e;
    e.own = run_int8_quantize;
    e.own_kind = "reorder";
    e.params = std::make_shared<const Int8QuantizeStep>(st);
    e.args = {{DNNL_ARG_SRC, mem_of(v)}, {DNNL_ARG_DST, mem_of(dst)}};
    exec_own(std::move(e), how, false, r_.nodes[cur_node_].name + " quantize " + dims_str(d));
    return dst;
  }
  dnnl::primitive_attr a = user_scratchpad();
  a.set_output_scales(0, {spec.inv_scale});
  if (spec.zero != 0) a.set_zero_points(DNNL_ARG_DST, 0, {DNNL_RUNTIME_S32_VAL});
  dnnl::reorder::primitive_desc pd(engine(), v.md, engine(), want, a);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, mem_of(v)}, {DNNL_ARG_TO, mem_of(dst)}};
  if (spec.zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zero_point_mem(spec.zero);
  exec(dnnl::reorder(pd), std::move(args));
  return dst;
}

// A QConv's f32 residual Z in channels-last (the layout the int8 primitive adds it in): from an fp32 step's
// nChw16c / nCdhw16c / nCw16c by the plugin's own copy (blocked16_to_nhwc_f32, one step shared by later readers),
// else as as_md() reorders it.
Val Builder::residual_last(const std::string& name, const Dims& y) {
  const md_t want(to_dnnl(y), dt::f32, channels_last_tag(y.size()));
  const Val v = val(name);
  if (v.scale != 1.f || v.md == want || !int8_own_kernels() ||
      v.md != md_t(to_dnnl(y), dt::f32, blocked16_tag(y.size())))
    return as_md(name, want);
  const std::string key = name + "#z_last";
  if (auto it = vals_.find(key); it != vals_.end()) return it->second;
  Int8QuantizeStep st;
  st.N = y[0], st.C = y[1], st.S = numel(y) / std::max<int64_t>(1, y[0] * y[1]);
  st.kind = Int8QuantizeStep::Kind::kBlockedF32;
  Val& dst = define(key, want);
  Exec e;
  e.own = run_int8_quantize;
  e.own_kind = "reorder";
  e.params = std::make_shared<const Int8QuantizeStep>(st);
  e.args = {{DNNL_ARG_SRC, mem_of(v)}, {DNNL_ARG_DST, mem_of(dst)}};
  layout_reorder_ = true;
  exec_own(std::move(e), "own_nChw16c_to_nhwc_f32:avx512", true, r_.nodes[cur_node_].name + " Z " + dims_str(y));
  layout_reorder_ = false;
  return dst;
}

// A 2-D QConv over at most 4 input channels (a network's first layer, on the image), with the MaxPool that alone
// reads its output fused, as the plugin's own step (steps/int8_stem.h): oneDNN's int8 convolutions multiply groups
// of 4 input channels, so a 1- or 2-channel image wastes half or more of every product, and the pooling reads what
// the convolution wrote. Taken for 1-2 channels, and for 3-4 with a pooling to fuse (ResNet's RGB 7x7 stem and 3x3 / 2
// pooling, 1 thread: 0.81-0.85 ms against oneDNN's 0.90-0.92 ms convolution, 0.06-0.08 reorder and 0.15-0.17
// pooling). False, changing nothing, for anything else (or without AVX-512 VNNI). The caller counted the flops.
bool Builder::qconv_stem(size_t i, const QuantSetup& q, const QConvGeom& g, const Dims& x, const Dims& y,
                         const int8_t* w) {
  const NodeDesc& n = r_.nodes[i];
  if (!Int8StemConv::available() || g.rank != 4 || g.group != 1 || q.residual || x[1] > 4) return false;
  if (g.dilations[0] != 1 || g.dilations[1] != 1) return false;
  if (q.act != "" && q.act != "Relu" && q.act != "Clip") return false;
  const std::vector<float> scale = own_int8_scales(q, y[1]);
  for (float v : scale)
    if (!(v > 0)) return false;  // the pooling needs a monotone epilogue
  StemShape s;
  s.N = x[0], s.C = x[1], s.H = x[2], s.W = x[3], s.M = y[1], s.KH = g.w_dims[2], s.KW = g.w_dims[3];
  s.SH = g.strides[0], s.SW = g.strides[1], s.PT = g.pads[0], s.PL = g.pads[1], s.OH = y[2], s.OW = y[3];
  std::string out = n.out[0];
  size_t pool_node = npos;
  if (size_t u = sole_user(n.out[0]); u != npos && r_.nodes[u].op == "MaxPool" && r_.nodes[u].in[0] == n.out[0]) {
    const NodeDesc& pn = r_.nodes[u];
    const Dims pk = pn.ais("kernel_shape", {}), ps = pn.ais("strides", {1, 1}), pp = pn.ais("pads", {0, 0, 0, 0});
    const std::string ap = pn.as("auto_pad", "NOTSET");
    const bool plain_pool = pk.size() == 2 && ps.size() == 2 && pp.size() == 4 &&
                            pn.ais("dilations", {1, 1}) == Dims{1, 1} && pn.ai("storage_order", 0) == 0 &&
                            (pn.out.size() == 1 || pn.out[1].empty()) &&
                            (ap == "NOTSET" || ap.empty() || ap == "VALID");
    if (plain_pool) {
      const bool valid = ap == "VALID", ceil = pn.ai("ceil_mode", 0) != 0;
      s.pool = true;
      s.PKH = pk[0], s.PKW = pk[1], s.PSH = ps[0], s.PSW = ps[1];
      s.PPT = valid ? 0 : pp[0], s.PPL = valid ? 0 : pp[1];
      s.PH = pooled_extent(s.OH, s.PKH, s.PSH, s.PPT, valid ? 0 : pp[2], ceil);
      s.PW = pooled_extent(s.OW, s.PKW, s.PSW, s.PPL, valid ? 0 : pp[3], ceil);
      const Dims py{s.N, s.M, s.PH, s.PW};
      auto known = r_.dims.find(pn.out[0]);
      if (Int8StemConv::check(s).empty() && (known == r_.dims.end() || known->second == py)) {
        pool_node = u;
        out = pn.out[0];
      } else {
        s.pool = false;
      }
    }
  }
  if (x[1] > 2 && !s.pool) return false;
  if (!Int8StemConv::check(s).empty()) return false;
  auto stem = std::make_shared<const Int8StemConv>(s, own_int8_quant(q), w, scale.data(),
                                                   q.bias_f32.empty() ? nullptr : q.bias_f32.data());
  const dt xt = int8_dnnl_type(q.x_type), yt = q.y_type == KEEL_DTYPE_F32 ? dt::f32 : int8_dnnl_type(q.y_type);
  const md_t x_plain(to_dnnl(x), xt, tag::nchw);
  const Val sv = q.x_f32 ? quantized(n.in[0], q, x_plain) : as_md(n.in[0], x_plain);
  const Dims yd = s.pool ? Dims{s.N, s.M, s.PH, s.PW} : y;
  Exec e;
  e.own = run_int8_stem;
  e.own_kind = "convolution";
  e.params = stem;
  e.args = {{DNNL_ARG_SRC, mem_of(sv)}, {DNNL_ARG_DST, mem_of(define(out, md_t(to_dnnl(yd), yt, tag::nhwc)))}};
  exec_own(
      std::move(e), "own_int8_stem:avx512_vnni", false,
      n.name + (s.pool ? " + " + r_.nodes[pool_node].name : std::string()) + " " + dims_str(x) + " -> " + dims_str(yd));
  if (pool_node != npos) done_[pool_node] = true;
  return true;
}

// An int8 inverted-residual block as one own step (steps/int8_expand_dw.h): this 1x1 QConv (the expansion, u8 ->
// u8), the 3x3 depthwise QConv (padding 1, stride 1 or 2) that alone reads its output and, where one alone reads
// that (option expand_dw_project), the 1x1 projection QConv with its residual Z. MobileNetV2's int8 blocks otherwise
// hand the expanded tensor from oneDNN's 1x1 to the own depthwise step through L3 (and at 2 threads half of it to the
// other core). False, changing nothing, where any part does not fit. The caller counted the expansion's flops.
bool Builder::qconv_expand_dw(size_t i, const QuantSetup& q, const QConvGeom& g, const Dims& x, const Dims& y,
                              const int8_t* w) {
  const NodeDesc& n = r_.nodes[i];
  if (!options().int8_expand_dw || g.rank != 4 || g.group != 1 || q.residual) return false;
  const Dims one{1, 1}, no_pads{0, 0, 0, 0};
  if (g.w_dims[2] != 1 || g.w_dims[3] != 1 || g.strides != one || g.dilations != one || g.pads != no_pads) return false;
  if (q.x_type != KEEL_DTYPE_U8 || q.y_type != KEEL_DTYPE_U8) return false;
  // A reader that is a QConv over this value as its X alone, with constant s8 weights, and its parameters; none on
  // anything a reader does not fit (QuantSetup::read and QConvGeom::read reject with exceptions).
  struct Reader {
    size_t node = npos;
    const ConstT* W = nullptr;
    QConvGeom g;
    QuantSetup q;
  };
  auto reader_of = [&](const std::string& v) -> std::optional<Reader> {
    Reader r;
    r.node = sole_user(v);
    if (r.node == npos) return std::nullopt;
    const NodeDesc& c = r_.nodes[r.node];
    if (c.op != "QConv" || c.out.size() != 1 || c.in.size() < 6 || c.in[0] != v) return std::nullopt;
    r.W = cst(c.in_at(1));
    if (!r.W || r.W->dtype != KEEL_DTYPE_I8 || r.W->dims.size() != 4) return std::nullopt;
    try {
      r.g.read(r.W->dims, c.ai("group", 1), c.as("auto_pad", "NOTSET"), c.ais("strides", Dims(2, 1)),
               c.ais("dilations", Dims(2, 1)), c.ais("pads", Dims(4, 0)));
      r.q.read(qnode_view(c), r.W->dims[0]);
    } catch (const Reject&) {
      return std::nullopt;
    }
    r.q.residual = !c.in_at(8).empty();  // (read() leaves Z to the caller, as qconv() does)
    return r;
  };
  const int64_t m = y[1];
  auto dw = reader_of(n.out[0]);
  if (!dw) return false;
  const Dims& wd = dw->W->dims;
  const int64_t st = dw->g.strides[0];
  if (dw->g.group != m || wd != Dims{m, 1, 3, 3} || dw->g.dilations != one || (st != 1 && st != 2) ||
      dw->g.strides[1] != st || dw->g.pads != Dims{1, 1, 1, 1} || dw->q.residual || dw->q.x_f32 ||
      dw->q.x_type != KEEL_DTYPE_U8 || dw->q.x_scale != q.y_scale || dw->q.x_zero != q.y_zero)
    return false;
  Int8ExpandDwShape s;
  s.n = x[0], s.c = x[1], s.m = m, s.h = x[2], s.w = x[3], s.stride = st;
  const Dims y2{s.n, m, s.oh(), s.ow()};
  if (dw->g.out_dims(y) != y2) return false;
  // The projection, and its residual Z where that is a value already computed (the block's input).
  std::optional<Reader> pr;
  if (options().expand_dw_project && dw->q.y_type == KEEL_DTYPE_U8) {
    pr = reader_of(r_.nodes[dw->node].out[0]);
    if (pr) {
      const NodeDesc& c = r_.nodes[pr->node];
      const bool fits = pr->g.group == 1 && pr->W->dims[1] == m && pr->W->dims[2] == 1 && pr->W->dims[3] == 1 &&
                        pr->g.strides == one && pr->g.dilations == one && pr->g.pads == no_pads && !pr->q.x_f32 &&
                        pr->q.x_type == KEEL_DTYPE_U8 && pr->q.x_scale == dw->q.y_scale &&
                        pr->q.x_zero == dw->q.y_zero &&
                        (!pr->q.residual || (vals_.count(c.in_at(8)) > 0 && r_.dtypes.count(c.in_at(8)) > 0 &&
                                             r_.dtypes.at(c.in_at(8)) == KEEL_DTYPE_F32));
      if (!fits) pr.reset();
    }
  }
  if (pr) s.proj = pr->W->dims[0], s.residual = pr->q.residual;
  const DwQuant q1 = own_int8_quant(q), q2 = own_int8_quant(dw->q);
  const std::optional<DwQuant> q3 = pr ? std::optional<DwQuant>(own_int8_quant(pr->q)) : std::nullopt;
  if (!Int8ExpandDw::check(s, q1, q2, q3 ? &*q3 : nullptr).empty()) {
    if (!pr) return false;
    pr.reset();  // perhaps without the projection (a residual of another shape)
    s.proj = 0, s.residual = false;
    if (!Int8ExpandDw::check(s, q1, q2, nullptr).empty()) return false;
  }
  const Dims yo = pr ? Dims{s.n, s.proj, s.oh(), s.ow()} : y2;
  if (pr && pr->g.out_dims(y2) != yo) return false;
  const std::vector<float> sc1 = own_int8_scales(q, m), sc2 = own_int8_scales(dw->q, m);
  const std::vector<float> sc3 = pr ? own_int8_scales(pr->q, s.proj) : std::vector<float>{};
  auto bias_of = [](const QuantSetup& k) { return k.bias_f32.empty() ? nullptr : k.bias_f32.data(); };
  const Int8Stage st1{w, sc1.data(), bias_of(q), q1};
  const Int8Stage st2{reinterpret_cast<const int8_t*>(dw->W->bytes.data()), sc2.data(), bias_of(dw->q), q2};
  Int8Stage st3;
  if (pr) st3 = {reinterpret_cast<const int8_t*>(pr->W->bytes.data()), sc3.data(), bias_of(pr->q), *q3};
  // An f32 X already channels-last (the residual stream between two blocks) is quantized by the step row by row;
  // in another layout, by a step of its own first (quantized()).
  const md_t x_last(to_dnnl(x), dt::u8, tag::nhwc);
  const bool quantize_rows =
      q.x_f32 && val(n.in[0]).scale == 1.f && val(n.in[0]).md == md_t(to_dnnl(x), dt::f32, tag::nhwc);
  const QuantizeSpec xq = q.quantize_spec();
  auto step = std::make_shared<const Int8ExpandDw>(s, st1, st2, pr ? &st3 : nullptr, quantize_rows ? &xq : nullptr);
  const Val sv = quantize_rows ? val(n.in[0]) : q.x_f32 ? quantized(n.in[0], q, x_last) : as_md(n.in[0], x_last);
  Exec e;
  if (s.residual) e.args[DNNL_ARG_SRC_1] = mem_of(residual_last(r_.nodes[pr->node].in_at(8), yo));
  const QuantSetup& last = pr ? pr->q : dw->q;
  const dt yt = last.y_type == KEEL_DTYPE_F32 ? dt::f32 : int8_dnnl_type(last.y_type);
  const std::string& out = r_.nodes[pr ? pr->node : dw->node].out[0];
  e.args[DNNL_ARG_SRC] = mem_of(sv);
  e.args[DNNL_ARG_DST] = mem_of(define(out, md_t(to_dnnl(yo), yt, tag::nhwc)));
  team_scratch(e, (step->scratch_bytes() + sizeof(float) - 1) / sizeof(float));
  e.own = run_int8_expand_dw;
  e.own_kind = "convolution";
  e.params = step;
  p_->flops += 2.0 * static_cast<double>(numel(y2) * 9) + (pr ? 2.0 * static_cast<double>(numel(yo) * m) : 0.0);
  exec_own(std::move(e), "own_int8_expand_dw:avx512_vnni", false,
           n.name + " + " + r_.nodes[dw->node].name + (pr ? " + " + r_.nodes[pr->node].name : "") +
               (s.residual ? " + Z " : " ") + dims_str(x) + " -> " + dims_str(yo));
  done_[dw->node] = true;
  if (pr) done_[pr->node] = true;
  return true;
}

// keel.QConv (1-D, 2-D or 3-D; lift_1d leaves QConvs alone, a 1-D one runs as a 1-D primitive): the own depthwise
// kernel where it applies (as the standalone kernel decides), else oneDNN's int8 convolution with the standalone
// kernel's primitive descriptor, over channels-last nwc / nhwc / ndhwc bytes.
void Builder::qconv(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.out.size() != 1 || n.in.size() < 6 || n.in.size() > 9 || n.in[0].empty() || is_const(n.in[0]))
    throw Reject{"QConv's inputs"};
  const ConstT* W = cst(n.in_at(1));
  if (!W || W->dtype != KEEL_DTYPE_I8) throw Reject{"non-constant weights"};
  const size_t sp = W->dims.size() >= 2 ? W->dims.size() - 2 : 0;
  QConvGeom g;
  g.read(W->dims, n.ai("group", 1), n.as("auto_pad", "NOTSET"), n.ais("strides", Dims(sp, 1)),
         n.ais("dilations", Dims(sp, 1)), n.ais("pads", Dims(2 * sp, 0)));
  // 1-D, 2-D and 3-D: the same primitive over channels-last nwc / nhwc / ndhwc bytes (the own depthwise kernel is
  // 2-D only: int8_own_depthwise declines the others).
  if (g.rank < 3 || g.rank > 5) throw Reject{"1-D, 2-D or 3-D int8 convolutions only"};
  QuantSetup q;
  q.read(qnode_view(n), W->dims[0]);
  q.residual = !n.in_at(8).empty();
  if (q.residual && (r_.dtypes.count(n.in[8]) == 0 || r_.dtypes.at(n.in[8]) != KEEL_DTYPE_F32))
    throw Reject{"Z must be f32"};
  // Z under an f32 output (a residual stream: ResNet's blocks) sits in the destination first (its own buffer where it
  // dies here) and is added as a sum post-op, which the int8 Winograd takes and a binary add it does not. Alone it
  // changes nothing measurable (ResNet-18's int8 step minima summed, 1 and 2 threads: within noise); oneDNN then
  // picks its brgemm kernel where the binary add kept the older jit one.
  q.residual_sum = q.residual && q.y_type == KEEL_DTYPE_F32;
  const Dims x = dims_of(n.in[0]);
  const Dims y = g.out_dims(x);
  const int8_t* w = reinterpret_cast<const int8_t*>(W->bytes.data());
  const dt xt = int8_dnnl_type(q.x_type), yt = int8_dnnl_type(q.y_type);
  const int64_t M = W->dims[0];
  const tag last = channels_last_tag(g.rank);
  double taps = 1;
  for (size_t k = 2; k < W->dims.size(); ++k) taps *= static_cast<double>(W->dims[k]);
  p_->flops += 2.0 * static_cast<double>(numel(y)) * static_cast<double>(x[1] / g.group) * taps;
  if (qconv_stem(i, q, g, x, y, w)) return;       // a first layer over few channels (+ its pooling): the own step
  if (qconv_expand_dw(i, q, g, x, y, w)) return;  // an inverted-residual block: the own step
  // An f32 X (the fp32 -> int8 boundary in front of a depthwise layer) is quantized into channels-last bytes by a
  // step of its own first (quantized()), so that the own kernel serves it too (the standalone kernel leaves it to
  // oneDNN's brdgmm_dw, 1.5-2x slower at 56x56).
  QuantSetup qk = q;
  qk.x_f32 = false;
  if (auto dw = int8_own_depthwise(qk, g, w, x, y, true, true)) {
    const md_t x_last(to_dnnl(x), xt, tag::nhwc);
    const Val sv = q.x_f32 ? quantized(n.in[0], q, x_last) : as_md(n.in[0], x_last);
    Val& out = define(n.out[0], md_t(to_dnnl(y), yt, tag::nhwc));
    Exec e;
    e.own = run_int8_depthwise;
    e.own_kind = "convolution";
    e.params = std::shared_ptr<const Int8Depthwise3x3>(std::move(dw));
    e.args = {{DNNL_ARG_SRC, mem_of(sv)}, {DNNL_ARG_DST, mem_of(out)}};
    exec_own(std::move(e), "own_int8_dw:avx512_vnni", false, n.name + " " + dims_str(x) + " -> " + dims_str(y));
    return;
  }
  auto pd = qconv_primitive_desc(q, g, x, y, q.residual ? last : tag::any);
  auto wino = qconv_winograd_desc(q, g, x, y, pd);
  // With the option int8_winograd, a residual under a quantized output (ResNet's last block of each stage, whose
  // output only QConvs read) is computed in f32 with Z as a sum and quantized by a step of its own (`requantize`),
  // where the Winograd takes it that way: it has no binary post-op.
  std::optional<QuantSetup> requantize;
  if (!wino && q.residual && q.y_type != KEEL_DTYPE_F32 && options().int8_winograd != Options::Choice::kOff) {
    QuantSetup f = q;
    f.y_type = KEEL_DTYPE_F32, f.y_scale = 1, f.y_zero = 0, f.residual_sum = true;
    auto fpd = qconv_primitive_desc(f, g, x, y, last);
    if (auto fwino = qconv_winograd_desc(f, g, x, y, fpd)) {
      requantize = QuantSetup{};
      requantize->x_type = q.y_type, requantize->x_scale = q.y_scale, requantize->x_zero = q.y_zero;
      q = f;
      pd = fpd;
      wino = fwino;
    }
  }
  // The option int8_winograd: oneDNN's int8 Winograd always, or where it runs faster (timed as the f32 convolutions
  // are: conv.cc; at batch 1, 1 thread, it took ResNet-18's 3x3 layers from 0.23/0.22/0.21/0.20 ms to
  // 0.18/0.14/0.13/0.18 ms at 56/28/14/7 pixels).
  if (wino) {
    std::vector<dnnl::convolution_forward::primitive_desc> cands{pd, *wino};
    const std::vector<double> margins{0, 0.05};
    size_t pick = 1;
    if (options().int8_winograd == Options::Choice::kTimed) {
      if (time_convs_) {
        pick = fastest_conv_remembered(cands, engine(), stream(), margins);
      } else {
        p_->deferred.push_back({cands, margins, {}});
        pick = 0;
      }
    }
    pd = cands[pick];
  }
  const Val sv = q.x_f32 ? quantized(n.in[0], q, pd.src_desc()) : as_md(n.in[0], pd.src_desc());
  std::unordered_map<int, dnnl::memory> args;
  const md_t wplain(to_dnnl(g.dnnl_weight_dims(x[1])), dt::s8, g.plain_weight_tag());
  p_->owned.push_back(int8_prepack(wplain, pd.weights_desc(), w, p_->weights.alloc(pd.weights_desc().get_size())));
  args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  if (!q.bias.empty()) {
    p_->owned.push_back(int8_bias_memory(q.bias, md_t({M}, dt::f32, tag::a)));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  int dbuf = -2;
  if (q.residual && !q.residual_sum) {
    const Val zv = residual_last(n.in[8], y);
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = mem_of(zv);
  } else if (q.residual) {
    dbuf = sum_destination(n.in[8], residual_last(n.in[8], y), pd.dst_desc(), i);
  }
  if (q.x_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = zero_point_mem(q.x_zero);
  if (q.y_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zero_point_mem(q.y_zero);
  const std::string out_name = requantize ? n.out[0] + "#f32" : n.out[0];
  Val& out = define(out_name, pd.dst_desc(), dbuf);
  args[DNNL_ARG_SRC] = mem_of(sv);
  args[DNNL_ARG_DST] = mem_of(out);
  exec(dnnl::convolution_forward(pd), std::move(args));
  if (requantize) {
    Val v = quantized(out_name, *requantize, md_t(to_dnnl(y), int8_dnnl_type(requantize->x_type), last));
    p_->bufs[v.buf].values++;  // the node's output is that value
    vals_[n.out[0]] = v;
  }
}

// keel.QGemm: A [..., K] (plain; quantized first when f32) x constant B -> [..., N] (plain), the standalone kernel's
// matmul.
void Builder::qgemm(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.out.size() != 1 || n.in.size() < 6 || n.in.size() > 8 || n.in[0].empty() || is_const(n.in[0]))
    throw Reject{"QGemm's inputs"};
  const ConstT* B = cst(n.in_at(1));
  if (!B || B->dtype != KEEL_DTYPE_I8 || B->dims.size() != 2) throw Reject{"non-constant 2-D B"};
  const bool tb = n.ai("transB", 0) != 0;
  const int64_t K = tb ? B->dims[1] : B->dims[0], N = tb ? B->dims[0] : B->dims[1];
  QuantSetup q;
  q.read(qnode_view(n), N);
  const Dims a = dims_of(n.in[0]);
  if (a.size() < 2 || a.back() != K) throw Reject{"A's last dimension differs from B's K"};
  const int64_t M = numel(a) / K;
  Dims yd(a.begin(), a.end() - 1);
  yd.push_back(N);
  const dt xt = int8_dnnl_type(q.x_type), yt = int8_dnnl_type(q.y_type);
  auto pd = qgemm_primitive_desc(q, M, K, N);
  if (pd.src_desc() != md_t({M, K}, xt, tag::ab) || pd.dst_desc() != md_t({M, N}, yt, tag::ab))
    throw Reject{"the int8 matmul wants other layouts"};
  const md_t a_plain = plain_md(a, xt);
  const Val sv = q.x_f32 ? quantized(n.in[0], q, a_plain) : as_md(n.in[0], a_plain);
  std::unordered_map<int, dnnl::memory> args;
  const int8_t* b = reinterpret_cast<const int8_t*>(B->bytes.data());
  std::vector<int8_t> permuted;  // A read as its producer's channels-last memory (flatten_into_gemm): B's rows so
  if (auto ff = flat_folds_.find(n.in[0]); ff != flat_folds_.end()) {
    permuted = flat_fold_rows(b, ff->second.first, ff->second.second, N, tb);
    b = permuted.data();
  }
  p_->owned.push_back(int8_prepack(md_t({K, N}, dt::s8, tb ? tag::ba : tag::ab), pd.weights_desc(), b,
                                   p_->weights.alloc(pd.weights_desc().get_size())));
  args[DNNL_ARG_WEIGHTS] = p_->owned.back();
  if (!q.bias.empty()) {
    p_->owned.push_back(int8_bias_memory(q.bias, md_t({1, N}, dt::f32, tag::ab)));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  if (q.x_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = zero_point_mem(q.x_zero);
  if (q.y_zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST] = zero_point_mem(q.y_zero);
  Val& out = define(n.out[0], plain_md(yd, yt));
  args[DNNL_ARG_SRC] = mem_at(pd.src_desc(), sv.buf, sv.off);
  args[DNNL_ARG_DST] = mem_at(pd.dst_desc(), out.buf, out.off);
  p_->flops += 2.0 * M * K * N;
  exec(dnnl::matmul(pd), std::move(args));
}

// QuantizeLinear / DequantizeLinear with a constant scalar scale and zero point (what fuse_qdq leaves of a QDQ
// model: a QuantizeLinear several int8 nodes read, a DequantizeLinear in front of an fp32 reader), element-wise in
// the layout their input has: the arithmetic of the standalone kernel (kernels/int8.cc's QdqKernel, a oneDNN
// reorder; a QuantizeLinear on the plugin's own loop where quantized() takes it, the same rounding).
void Builder::qdq(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const bool quant = n.op == "QuantizeLinear";
  const ConstT* s = cst(n.in_at(1));
  const ConstT* z = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (n.out.size() != 1 || !s || s->dtype != KEEL_DTYPE_F32 || s->count() != 1 || (!n.in_at(2).empty() && !z) ||
      (z && z->count() != 1))
    throw Reject{"a per-tensor constant scale and zero point only"};
  const float scale = s->f32()[0];
  if (!(scale > 0) || !std::isfinite(scale)) throw Reject{"scale must be positive"};
  int32_t zero = 0, qtype = z ? z->dtype : KEEL_DTYPE_U8;
  if (qtype == KEEL_DTYPE_U8 && z) zero = static_cast<uint8_t>(z->bytes[0]);
  else if (qtype == KEEL_DTYPE_I8 && z) zero = static_cast<int8_t>(z->bytes[0]);
  else if (qtype != KEEL_DTYPE_U8 && qtype != KEEL_DTYPE_I8) throw Reject{"zero point of another type than u8/s8"};
  const Val xv = val(n.in[0]);
  auto ot = r_.dtypes.find(n.out[0]);
  if (quant) {
    if (ot == r_.dtypes.end() || ot->second != qtype) throw Reject{"output type differs from the zero point's"};
    QuantSetup q;
    q.x_scale = scale, q.x_zero = zero, q.x_type = qtype;
    // Read only by QConvs, as their X (fuse_qdq leaves such a QuantizeLinear where several QConvs read it, e.g. a
    // ResNet block's input read by its first 3x3 and the downsampling 1x1): written channels-last straight away, the
    // layout the int8 convolutions read, instead of in X's layout and then reordered for them.
    md_t want = with_dtype(xv.md, int8_dnnl_type(qtype));
    const Dims d = md_dims(xv.md);
    if (d.size() >= 3 && d.size() <= 5 && qconv_x_only(n.out[0], d.size()) &&
        (!escapes(n.out[0]) || r_.channels_last.count(n.out[0])))
      want = md_t(to_dnnl(d), int8_dnnl_type(qtype), channels_last_tag(d.size()));
    Val v = quantized(n.in[0], q, want);
    p_->bufs[v.buf].values++;  // the node's output is that value
    vals_[n.out[0]] = v;
    return;
  }
  if (xv.md.data_type() != int8_dnnl_type(qtype) || ot == r_.dtypes.end() || ot->second != KEEL_DTYPE_F32)
    throw Reject{"u8/s8 -> f32 only, the zero point's type"};
  dnnl::primitive_attr a = user_scratchpad();
  a.set_output_scales(0, {scale});
  if (zero != 0) a.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  Val& out = define(n.out[0], with_dtype(xv.md, dt::f32));
  dnnl::reorder::primitive_desc pd(engine(), xv.md, engine(), out.md, a);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, mem_of(xv)}, {DNNL_ARG_TO, mem_of(out)}};
  if (zero != 0) args[DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC] = zero_point_mem(zero);
  exec(dnnl::reorder(pd), std::move(args));
}

}  // namespace keel::onednn::chain
