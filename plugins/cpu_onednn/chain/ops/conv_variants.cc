// plugins/cpu_onednn/chain/ops/conv_variants.cc — other ways of running a convolution: a merged bottleneck end, a
// dilated 3x3 over phases, a depthwise fused into its producer; and the tail every convolution shares (conv_like_tail).
#include "chain/builder.h"

namespace keel::onednn::chain {

// ResNet's strided bottleneck end, y = Conv1x1(h) + Conv1x1_s2(x) (the last convolution of the block and the
// stride-2 projection shortcut, both without padding, read only by that Add), as one 1x1 convolution over the
// channels of h and of x (every other row and column) side by side, with the weights [W_h | W_x] and the biases
// summed: the shortcut's output never goes to memory and back for a sum post-op, oneDNN's strided 1x1 (which
// gathers the strided source per thread) is not used, and the reduction is longer. h is reordered into the first
// channels of an nChw16c buffer, x subsampled into the rest (one own step, steps/dilated.h). Post-ops:
// what follows the Add (Relu). Batch 1, f32, channels multiples of 16, node `i` being the first of the two
// convolutions; false, changing nothing, otherwise or when oneDNN offers no jit kernel. (With a stride-1 shortcut,
// ResNet-50's layer1.0, h and x copied into one buffer made it slower: docs/ONEDNN_PERFORMANCE.md.)
bool Builder::conv_residual_merged(size_t i) {
  if (act_ != dt::f32) return false;
  auto unit_conv = [&](const NodeDesc& c, int64_t* stride) {
    if (c.op != "Conv" || c.in.size() < 2 || c.out.size() != 1 || c.ai("group", 1) != 1) return false;
    const ConstT* W = cst(c.in_at(1));
    if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || W->dims[2] != 1 || W->dims[3] != 1) return false;
    if (!c.in_at(2).empty() && (!cst(c.in_at(2)) || cst(c.in_at(2))->count() != W->dims[0])) return false;
    const std::string ap = c.as("auto_pad", "NOTSET");
    if ((ap != "NOTSET" && !ap.empty() && ap != "VALID") || c.ais("pads", {0, 0, 0, 0}) != Dims{0, 0, 0, 0} ||
        c.ais("dilations", {1, 1}) != Dims{1, 1})
      return false;
    Dims st = c.ais("strides", {1, 1});
    if (st.size() != 2 || st[0] != st[1] || (st[0] != 1 && st[0] != 2)) return false;
    *stride = st[0];
    const std::string& in = c.in[0];
    return vals_.count(in) > 0 && !pad_folds_.count(in) && !se_folds_.count(in) && vals_[in].scale == 1.f &&
           vals_[in].md.data_type() == dt::f32;
  };
  const NodeDesc& n = r_.nodes[i];
  int64_t si = 0, sj = 0;
  if (!unit_conv(n, &si) || si != 1) return false;
  const size_t a = sole_user(n.out[0]);
  if (a == npos) return false;
  const NodeDesc& an = r_.nodes[a];
  if (an.op != "Add" || an.in.size() != 2 || an.out.size() != 1 || an.in[0] == an.in[1]) return false;
  const std::string& other = an.in[0] == n.out[0] ? an.in[1] : an.in[0];
  size_t j = npos;
  for (size_t k = 0; k < r_.nodes.size(); ++k)
    if (!r_.nodes[k].out.empty() && r_.nodes[k].out[0] == other) j = k;
  if (j == npos || j == i || done_[j] || sole_user(other) != a) return false;
  const NodeDesc& jn = r_.nodes[j];
  if (!unit_conv(jn, &sj) || sj != 2) return false;
  const Dims h = dims_of(n.in[0]), x = dims_of(jn.in[0]), y = dims_of(an.out[0]);
  if (h.size() != 4 || x.size() != 4 || h[0] != 1 || x[0] != 1) return false;
  const ConstT *Wi = cst(n.in_at(1)), *Wj = cst(jn.in_at(1));
  const int64_t M = Wi->dims[0], Ch = h[1], Cx = x[1];
  if (Wj->dims[0] != M || Wi->dims[1] != Ch || Wj->dims[1] != Cx || Ch % 16 || Cx % 16 || M % 16) return false;
  if ((x[2] - 1) / sj + 1 != h[2] || (x[3] - 1) / sj + 1 != h[3] || y != Dims{1, M, h[2], h[3]}) return false;
  const Val xv = vals_[jn.in[0]];
  const md_t xblocked(to_dnnl(x), dt::f32, tag::nChw16c);
  if (xv.md != xblocked) return false;  // the strided view is of nChw16c memory
  Fusion f = fuse_after(an.out[0], a, true, M);
  if (f.pass_after()) return false;
  // Weights [M, Ch + Cx] and the summed bias, with the folds after the Add applied.
  const int64_t K = Ch + Cx;
  std::vector<float> w(M * K), bias(M, 0.f);
  for (int64_t m = 0; m < M; ++m) {
    std::copy(Wi->f32() + m * Ch, Wi->f32() + (m + 1) * Ch, w.begin() + m * K);
    std::copy(Wj->f32() + m * Cx, Wj->f32() + (m + 1) * Cx, w.begin() + m * K + Ch);
  }
  for (const NodeDesc* c : {&n, &jn})
    if (const ConstT* B = c->in_at(2).empty() ? nullptr : cst(c->in_at(2)))
      for (int64_t m = 0; m < M; ++m) bias[m] += static_cast<float>(B->at(m));
  if (!f.bn_scale.empty())
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) w[m * K + k] *= f.bn_scale[m];
      bias[m] = bias[m] * f.bn_scale[m] + f.bn_shift[m];
    }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) bias[k] += f.conv_bias_add[k];
  f.nodes.insert(f.nodes.begin(), {j, a});  // before the fused nodes: an Add among those is a sum post-op's
  // Few output pixels and large weights (ResNet-50's layer4.0 end at batch 1: 49 x 1536 x 2048): the two sources'
  // pixels side by side as rows times the weights, the chain's own few-row product (conv_skinny).
  {
    Im2RowShape rows;
    rows.oh = h[2], rows.ow = h[3], rows.parts = 2;
    rows.part[0].c = Ch, rows.part[0].h = h[2], rows.part[0].w = h[3];
    rows.part[1].c = Cx, rows.part[1].h = x[2], rows.part[1].w = x[3], rows.part[1].stride = sj;
    if (conv_skinny(i, f, rows, {n.in[0], jn.in[0]}, M, w, bias, 2.0 * M * K * h[2] * h[3])) return true;
  }
  const Dims cat{1, K, h[2], h[3]};
  const md_t cmd(to_dnnl(cat), dt::f32, tag::nChw16c), hmd(to_dnnl(h), dt::f32, tag::nChw16c),
      xsmd(to_dnnl(Dims{1, Cx, h[2], h[3]}), dt::f32, tag::nChw16c);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  try {
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, alg::convolution_direct, cmd,
                                       md_t({M, K, 1, 1}, dt::f32, tag::any), md_t({M}, dt::f32, tag::a),
                                       md_t(to_dnnl(y), dt::f32, tag::nChw16c), {1, 1}, {0, 0}, {0, 0});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
  } catch (const dnnl::error&) {
    return false;
  }
  if (std::string(pd->impl_info_str()).rfind("jit_1x1", 0) != 0 || pd->src_desc() != cmd) return false;
  // The side-by-side source: h reordered into its first Ch channels, x (subsampled) into the next Cx.
  const std::string key = n.out[0] + "#merged_source";
  Val& cv = define(key, cmd);
  const int cbuf = cv.buf;
  const uint64_t coff = cv.off, xoff = coff + static_cast<uint64_t>(Ch) * h[2] * h[3] * sizeof(float);
  const Val hv = vals_[n.in[0]];
  const md_t hnhwc(to_dnnl(h), dt::f32, tag::nhwc);
  if (hv.md == hnhwc || hv.md == hmd) {
    // One own step (steps/dilated.h) for both: at 2 threads oneDNN's two reorders took 0.091 / 0.047 / 0.033 ms
    // in ResNet-50's layer2.0 / 3.0 / 4.0, this 0.068 / 0.031 / 0.030 (level at 1 thread): docs/ONEDNN_PERFORMANCE.md,
    // (r50e).
    MergedSourceShape ms;
    ms.ch = Ch, ms.cx = Cx, ms.h = h[2], ms.w = h[3], ms.xh = x[2], ms.xw = x[3], ms.stride = sj;
    ms.h_nhwc = hv.md == hnhwc;
    Exec e;
    e.own = run_merged_source;
    e.own_kind = "reorder";
    e.args = {{DNNL_ARG_SRC, mem_of(hv)}, {DNNL_ARG_SRC_1, mem_of(xv)}, {DNNL_ARG_DST, mem_at(cmd, cbuf, coff)}};
    e.params = std::make_shared<const MergedSourceShape>(ms);
    exec_own(std::move(e), "keel:merged_source", true,
             n.name + " " + dims_str(h) + " + " + dims_str(x) + " -> " + dims_str(cat));
  } else {
    dnnl::memory s1 = mem_of(hv), d1 = mem_at(hmd, cbuf, coff);
    layout_reorder_ = true;
    exec(reorder_prim(s1, d1), {{DNNL_ARG_FROM, s1}, {DNNL_ARG_TO, d1}});
    dnnl_memory_desc_t vd = xblocked.data;  // every sj-th row and column: the strides times sj
    vd.dims[2] = vd.padded_dims[2] = h[2];
    vd.dims[3] = vd.padded_dims[3] = h[3];
    vd.format_desc.blocking.strides[2] *= sj;
    vd.format_desc.blocking.strides[3] *= sj;
    dnnl::memory s2 = mem_at(md_t(vd), xv.buf, xv.off), d2 = mem_at(xsmd, cbuf, xoff);
    exec(reorder_prim(s2, d2), {{DNNL_ARG_FROM, s2}, {DNNL_ARG_TO, d2}});
    layout_reorder_ = false;
  }
  md_t wplain(to_dnnl(Dims{M, K, 1, 1}), dt::f32, tag::oihw);
  conv_like_tail(i, f, dnnl::convolution_forward(*pd), cmd, pd->weights_desc(), pd->dst_desc(), wplain, w, true, bias,
                 2.0 * M * K * h[2] * h[3], {}, key, "");
  return true;
}

// A 3x3 convolution with dilation d and padding d (stride 1, group 1; DeepLab's and FCN's atrous layers) is a plain
// 3x3 convolution with padding 1 over the d*d phases of its input (every d-th row and column, from each of the d*d
// offsets), whose outputs are the phases of its output: oneDNN has no Winograd kernel for the dilated one, and runs
// the plain one over the phases as a batch of d*d images. So: the source (nChw16c) is split into its phases (an
// own step), Winograd runs over them with the node's post-ops, and the phases of the result are put back in place
// (a second own step). FCN-ResNet50's layer3 at 128x128 input (256 channels, 16x16, dilation 2), 1 thread: alone
// 0.51-0.62 ms against 1.20-1.25 ms for the dilated convolution on brgemm over nhwc; in the network, where the
// weights (4x larger in Winograd's domain: 9.4 MB) come from memory, the five steps with their layout steps 6.4
// against 6.6 ms. With 512 channels (layer4, dilation 2 and 4; 38 MB of Winograd weights) no faster, hence the
// caller's limit of C*M <= 256*256 (docs/ONEDNN_PERFORMANCE.md, r50c). False, changing nothing, when oneDNN offers no
// Winograd kernel for the phases in nChw16c.
bool Builder::conv_dilated_phases(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                                  int64_t dil, const md_t& wany, const md_t& bmd, const dnnl::primitive_attr& attr,
                                  const md_t& wplain, std::vector<float>& w, bool has_bias,
                                  const std::vector<float>& bias, double flops) {
  const int64_t ph = x[2] / dil, pw = x[3] / dil, batch = x[0] * dil * dil;
  const md_t image(to_dnnl(x), dt::f32, tag::nChw16c), out(to_dnnl(y), dt::f32, tag::nChw16c),
      pin(to_dnnl(Dims{batch, x[1], ph, pw}), dt::f32, tag::nChw16c),
      pout(to_dnnl(Dims{batch, y[1], ph, pw}), dt::f32, tag::nChw16c);
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  try {
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, alg::convolution_winograd, pin, wany,
                                       has_bias ? bmd : md_t(), pout, {1, 1}, {0, 0}, {1, 1}, {1, 1});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
  } catch (const dnnl::error&) {
    return false;
  }
  if (std::string(pd->impl_info_str()).find("wino") == std::string::npos || pd->src_desc() != pin ||
      pd->dst_desc() != pout)
    return false;
  const std::string& name = r_.nodes[i].out[0];
  auto own = [&](void (*fn)(const Exec&), const Val& from, const Val& to, const char* impl, const char* what) {
    Exec e;
    e.single = from.md.get_size() + to.md.get_size() < (1u << 20);  // memory-bound, as Builder::exec's reorders
    e.own = fn;
    e.own_kind = "reorder";
    e.args = {{DNNL_ARG_SRC, mem_of(from)}, {DNNL_ARG_DST, mem_of(to)}};
    exec_own(std::move(e), impl, true,
             r_.nodes[i].name + what + dims_str(md_dims(from.md)) + " -> " + dims_str(md_dims(to.md)));
  };
  const Val xv = as_md(src, image);
  const Val& phases_in = define(name + "#phases", pin);
  own(run_to_phases, xv, phases_in, "keel:space_to_phases", " phases ");
  Fusion fp = f;
  fp.out = name + "#phase_out";
  conv_like_tail(i, fp, dnnl::convolution_forward(*pd), pin, pd->weights_desc(), pout, wplain, w, has_bias, bias, flops,
                 {}, name + "#phases", "");
  const Val phases_out = vals_[fp.out];
  const Val& o = define(f.out, out);
  own(run_from_phases, phases_out, o, "keel:phases_to_space", " from phases ");
  return true;
}

// The depthwise convolution that is the sole reader of f.out (M channels): a Conv with group M, constant f32 weights
// [M,1,k,k] with k 3 or 5 (and bias [M]), padding k / 2 on every side, stride 1 or 2, no dilation, reading f.out as its
// data; its own fusion (fuse_after) without a residual sum; weights and bias with that fusion's BatchNormalization /
// bias folds applied. False, changing nothing, when there is none.
bool Builder::dw_reader_of(const Fusion& f, int64_t M, DwReader* d) {
  const size_t u = sole_user(f.out);
  if (u == npos) return false;
  const NodeDesc& dn = r_.nodes[u];
  if (dn.op != "Conv" || done_[u] || dn.in[0] != f.out || dn.out.size() != 1) return false;
  const ConstT* W = cst(dn.in_at(1));
  const ConstT* B = dn.in_at(2).empty() ? nullptr : cst(dn.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || (!dn.in_at(2).empty() && (!B || B->count() != M))) return false;
  if (dn.ai("group", 1) != M || W->dims.size() != 4) return false;
  const int64_t k = W->dims[2], p = k / 2;
  if ((k != 3 && k != 5) || W->dims != Dims{M, 1, k, k}) return false;
  if (dn.ais("kernel_shape", {k, k}) != Dims{k, k} || dn.ais("dilations", {1, 1}) != Dims{1, 1} ||
      dn.ais("pads", {0, 0, 0, 0}) != Dims{p, p, p, p})
    return false;
  const std::string ap = dn.as("auto_pad", "NOTSET");
  if (ap != "NOTSET" && !ap.empty()) return false;
  const Dims ds = dn.ais("strides", {1, 1});
  if (ds != Dims{1, 1} && ds != Dims{2, 2}) return false;
  Fusion g = fuse_after(dn.out[0], u, true, M);
  if (!g.sum_with.empty()) return false;
  d->node = u;
  d->k = k;
  d->stride = ds[0];
  folded_weights(g, *W, B, M, &d->w, &d->bias);
  d->fusion = std::move(g);
  return true;
}

void Builder::folded_weights(const Fusion& f, const ConstT& W, const ConstT* B, int64_t M, std::vector<float>* w,
                             std::vector<float>* bias) {
  w->assign(W.f32(), W.f32() + W.count());
  bias->assign(static_cast<size_t>(M), 0.f);
  if (B)
    for (int64_t k = 0; k < M; ++k) (*bias)[k] = static_cast<float>(B->at(k));
  const int64_t per = W.count() / M;
  if (!f.bn_scale.empty())
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < per; ++k) (*w)[m * per + k] *= f.bn_scale[m];
      (*bias)[m] = (*bias)[m] * f.bn_scale[m] + f.bn_shift[m];
    }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) (*bias)[k] += f.conv_bias_add[k];
}

// A 1x1 convolution (stride 1, its post-ops in `f`) whose sole consumer is a 3x3 depthwise convolution (stride 1
// or 2, pad 1): one oneDNN primitive with the depthwise one as a post-op, so the expanded tensor (MobileNet's and
// EfficientNet's widest) never goes out to memory. False, changing nothing, when the pattern or oneDNN says no;
// also when oneDNN offers only ref_fused_convolution (the two kernels one after the other, nothing saved): oneDNN
// 2.6 fuses for real only where the 1x1's blocking suits it (MobileNet-V2: the 112x112 stride-2 block at 2 threads,
// the 112x112 and two 56x56 ones at 1). Option dw_fusion (KEEL_ONEDNN_DW_FUSION=0) turns it off (for A/B runs).
bool Builder::conv_dw_fused(size_t i, const Fusion& f, const md_t& src, const md_t& wany, const md_t& bmd,
                            const std::vector<float>& w, const std::vector<float>& bias, double flops) {
  // With the 1x1's SiLU as the chain's own pass the depthwise one cannot read its output inside the kernel; and
  // unfused is faster then anyway (EfficientNet-B0's 24->144 block at 56x56: 541 us fused with oneDNN's swish, 405 us
  // as two convolutions each followed by the SiLU pass).
  if (!options().dw_fusion || f.pass_after()) return false;
  const Dims y1 = dims_of(f.out);
  if (y1.size() != 4 || y1[1] % 16 != 0) return false;
  const int64_t M = y1[1];
  DwReader d;
  if (!dw_reader_of(f, M, &d) || d.k != 3) return false;
  const size_t u = d.node;
  const Fusion& g = d.fusion;
  dnnl::post_ops po = f.po;
  if (d.stride == 1) po.append_dw_k3s1p1(dt::f32, dt::f32, dt::f32, 0, {});
  else po.append_dw_k3s2p1(dt::f32, dt::f32, dt::f32, 0, {});
  for (int k = 0; k < g.po.len(); ++k) {
    if (g.po.kind(k) != dnnl::primitive::kind::eltwise) return false;
    float sc, al, be;
    alg a;
    g.po.get_params_eltwise(k, sc, a, al, be);
    po.append_eltwise(sc, a, al, be);
  }
  std::vector<float>& dw = d.w;
  const std::vector<float>& db = d.bias;
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(po);
  Dims x = dims_of(r_.nodes[i].in[0]);
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  try {
    dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, alg::convolution_direct, src, wany, bmd,
                                       md_t(to_dnnl(y1), dt::f32, tag::nChw16c), {1, 1}, {0, 0}, {0, 0}, {0, 0});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
  } catch (const dnnl::error&) {
    return false;
  }
  if (std::string(pd->impl_info_str()).rfind("jit_1x1", 0) != 0) return false;
  Dims y2 = dims_of(g.out);
  if (md_dims(pd->dst_desc()) != y2) return false;
  const int dw_w = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, dw_b = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS;
  md_t dwmd = pd->query_md(dnnl::query::exec_arg_md, dw_w), dbmd = pd->query_md(dnnl::query::exec_arg_md, dw_b);
  if (dwmd.is_zero()) return false;
  std::unordered_map<int, dnnl::memory> extra;
  {
    dnnl::memory wuser(md_t({M, 1, 1, 3, 3}, dt::f32, tag::goihw), engine(), dw.data());
    p_->owned.emplace_back(dwmd, engine(), p_->weights.alloc(dwmd.get_size()));
    dnnl::reorder(wuser, p_->owned.back()).execute(stream(), wuser, p_->owned.back());
    stream().wait();
    extra[dw_w] = p_->owned.back();
  }
  {
    md_t bm = dbmd.is_zero() ? md_t({M}, dt::f32, tag::a) : dbmd;
    p_->owned.emplace_back(bm, engine());
    std::memcpy(p_->owned.back().get_data_handle(), db.data(), std::min<size_t>(bm.get_size(), db.size() * 4));
    extra[dw_b] = p_->owned.back();
  }
  Fusion all = f;
  all.out = g.out;
  all.nodes.push_back(u);
  all.nodes.insert(all.nodes.end(), g.nodes.begin(), g.nodes.end());
  done_[u] = true;
  md_t wplain(to_dnnl(Dims{M, x[1], 1, 1}), dt::f32, tag::oihw);
  std::vector<float> wc = w;
  conv_like_tail(i, all, dnnl::convolution_forward(*pd), pd->src_desc(), pd->weights_desc(), pd->dst_desc(), wplain, wc,
                 true, bias, flops + 2.0 * numel(y2) * 9, std::move(extra));
  return true;
}

int Builder::sum_destination(const std::string& name, const Val& v, const md_t& dmd, size_t at) {
  const auto own = vals_.find(name);
  if (own != vals_.end() && own->second.buf == v.buf && own->second.off == v.off && v.md == dmd &&
      dead_after(name, at)) {
    p_->bufs[v.buf].values--;  // the value dies here; the destination takes its place
    return v.buf;
  }
  const int buf = new_buf(dmd.get_size());
  dnnl::memory a = mem_of(v), b = mem_at(dmd, buf, 0);
  exec(reorder_prim(a, b), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
  return buf;
}

// The buffer for node i's destination (memory dmd) under fusion f: with a residual sum (f.sum_with), one holding the
// residual already (its own when nobody reads it after the Add, else a copy); -2 (a new buffer) otherwise.
int Builder::residual_destination(size_t i, const Fusion& f, const md_t& dmd) {
  if (f.sum_with.empty()) return -2;
  size_t add_node = f.nodes.empty() ? i : f.nodes.back();
  for (size_t k : f.nodes)
    if (r_.nodes[k].op == "Add") add_node = k;
  const Val rv = vals_[f.sum_with];
  return sum_destination(f.sum_with, rv.md == dmd ? rv : as_md(f.sum_with, dmd), dmd, add_node);
}

// The rest of a convolution or deconvolution once its primitive is chosen: the weights reordered once (from `w` in
// layout `wplain`), the bias, the residual placed in the destination for a sum post-op, the step.
void Builder::conv_like_tail(size_t i, const Fusion& f, dnnl::primitive prim, const md_t& src_md, const md_t& wei_md,
                             const md_t& dmd, const md_t& wplain, std::vector<float>& w, bool has_bias,
                             const std::vector<float>& bias, double flops, std::unordered_map<int, dnnl::memory> extra,
                             const std::string& src, const std::string& chan_scale) {
  const NodeDesc& n = r_.nodes[i];
  Val sv = as_md(src.empty() ? n.in[0] : src, src_md);
  dnnl::memory wuser(wplain, engine(), w.data());
  p_->owned.emplace_back(wei_md, engine(), p_->weights.alloc(wei_md.get_size()));
  dnnl::memory wmem = p_->owned.back();
  dnnl::reorder(wuser, wmem).execute(stream(), wuser, wmem);
  stream().wait();
  std::unordered_map<int, dnnl::memory> args = std::move(extra);
  args[DNNL_ARG_WEIGHTS] = wmem;
  if (has_bias) {
    p_->owned.emplace_back(md_t({static_cast<int64_t>(bias.size())}, dt::f32, tag::a), engine());
    std::memcpy(p_->owned.back().get_data_handle(), bias.data(), bias.size() * sizeof(float));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  const int dbuf = residual_destination(i, f, dmd);
  if (!chan_scale.empty()) args[DNNL_ARG_WEIGHTS] = exec_scale_weights(wmem, wplain, chan_scale);
  Val& out = define(f.out, dmd, dbuf);
  args[DNNL_ARG_SRC] = mem_of(sv);
  args[DNNL_ARG_DST] = mem_of(out);
  p_->flops += flops;
  exec(std::move(prim), std::move(args));
  if (f.silu_pass && !defer_silu(f.out, out.md)) exec_silu(out, f.out);
  if (f.gelu_pass) exec_gelu(out, f.gelu_tanh);
  for (size_t k : f.nodes) done_[k] = true;
}

}  // namespace keel::onednn::chain
