// plugins/cpu_onednn/chain/ops/conv.cc — Conv (oneDNN convolution, 1-D/2-D/3-D, with its post-ops, folded
// BatchNormalization and squeeze-excite channel scale) and ConvTranspose.
#include "chain/builder.h"

namespace keel::onednn::chain {

// Squeeze-excite's Mul(x, s), s a [1,C,1,1] value computed here and x [1,C,H,W], whose only reader is a 1x1
// convolution (stride 1, no pads, group 1, constant f32 weights [M,C,1,1]) with M <= H*W/4: instead of a binary
// step over x (C*H*W products and a pass over memory) that convolution reads x and its weights are scaled by s each
// run (exec_scale_weights: M*C products). EfficientNet-B0's first five projections (M = 16..40 at 112..28 px). True
// when folded (the Mul then runs nothing; conv() finds it in se_folds_); false, changing nothing, otherwise.
bool Builder::fold_channel_scale(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (act_ != dt::f32 || n.out.size() != 1 || is_const(n.in[0]) || is_const(n.in[1])) return false;
  if (!vals_.count(n.in[0]) || !vals_.count(n.in[1])) return false;
  std::string x = n.in[0], s = n.in[1];
  if (dims_of(x).size() != 4 || numel(dims_of(x)) < numel(dims_of(s))) std::swap(x, s);
  const Dims xd = dims_of(x), sd = dims_of(s);
  if (xd.size() != 4 || xd[0] != 1 || dims_of(n.out[0]) != xd) return false;
  if (sd != Dims{1, xd[1], 1, 1} && sd != Dims{xd[1], 1, 1}) return false;
  const Val &xv = vals_[x], &sv = vals_[s];
  if (xv.scale != 1.f || sv.scale != 1.f || xv.md.data_type() != dt::f32 || sv.md.data_type() != dt::f32) return false;
  // s's element c must sit at offset c: plain, or nChw16c of [1,C,1,1].
  if (!is_plain_dense(sv.md) && sv.md != md_t({1, xd[1], 1, 1}, dt::f32, tag::nChw16c)) return false;
  const size_t u = sole_user(n.out[0]);
  if (u == npos) return false;
  const NodeDesc& cn = r_.nodes[u];
  if (cn.op != "Conv" || cn.in[0] != n.out[0] || cn.out.size() != 1) return false;
  const ConstT* W = cst(cn.in_at(1));
  if (!W || W->dtype != KEEL_DTYPE_F32 || W->dims.size() != 4 || W->dims[1] != xd[1] || W->dims[2] != 1 ||
      W->dims[3] != 1 || cn.ai("group", 1) != 1)
    return false;
  if (cn.ais("strides", {1, 1}) != Dims{1, 1} || cn.ais("pads", {0, 0, 0, 0}) != Dims{0, 0, 0, 0} ||
      cn.ais("dilations", {1, 1}) != Dims{1, 1})
    return false;
  const std::string ap = cn.as("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID" && !ap.empty()) return false;
  if (W->dims[0] * 4 > xd[2] * xd[3]) return false;
  se_folds_[n.out[0]] = {x, s};
  return true;
}

// The per-run step of a folded squeeze-excite scale: the convolution's weights `wmem` (in its layout, reordered
// once from `wplain` [M,C,1,1]) stay unscaled, and each run writes wmem * scale[c] into weights of its own, c being
// each element's input channel, found once by reordering a plain image of channel numbers into the layout. Returns
// the memory the convolution reads its weights from: a buffer of the run's workspace, live from this step to the
// convolution. (The scaled weights once went back into `wmem`, which every run of the session shares: two
// concurrent runs then scaled each other's weights, and one run's gate leaked into the other's output: random
// chains' concurrent runs, DeviceConformance.ConcurrentRunsOfChainsMatchSequentialOnes.)
dnnl::memory Builder::exec_scale_weights(const dnnl::memory& wmem, const md_t& wplain, const std::string& chan_scale) {
  const md_t wmd = wmem.get_desc();
  const Dims wd = md_dims(wplain);
  const int64_t M = wd[0], C = wd[1];
  std::vector<float> image(static_cast<size_t>(M * C));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) image[m * C + c] = static_cast<float>(c + 1);  // exact: C < 2^24
  dnnl::memory img(wplain, engine(), image.data()), blocked(wmd, engine());
  dnnl::reorder(img, blocked).execute(stream(), img, blocked);
  stream().wait();
  const size_t n = wmd.get_size() / sizeof(float);
  const float* b = static_cast<const float*>(blocked.get_data_handle());
  std::vector<int32_t> chan(n);
  for (size_t j = 0; j < n; ++j) chan[j] = b[j] > 0.f ? static_cast<int32_t>(b[j]) - 1 : -1;  // -1: padding
  // One channel per 16 floats (padding aside)? Then one map entry per 16 floats, else one per float.
  bool rows = n % 16 == 0;
  std::vector<int32_t> row_chan(rows ? n / 16 : 0, 0);
  for (size_t r = 0; rows && r < n / 16; ++r) {
    int32_t c = -1;
    for (size_t k = 16 * r; k < 16 * r + 16; ++k) {
      if (chan[k] < 0) continue;
      if (c >= 0 && c != chan[k]) rows = false;
      c = chan[k];
    }
    row_chan[r] = std::max(c, 0);  // an all-padding row: 0 * s[0]
  }
  const size_t len = rows ? n / 16 : n;
  dnnl::memory map(md_t({static_cast<int64_t>(len)}, dt::s32, tag::a), engine());
  int32_t* mp = static_cast<int32_t*>(map.get_data_handle());
  for (size_t j = 0; j < len; ++j) mp[j] = rows ? row_chan[j] : std::max(chan[j], 0);  // padding: 0 * s[0]
  p_->owned.push_back(map);
  const Val& sv = val(chan_scale);
  const int scaled = new_buf(wmd.get_size());
  p_->bufs[scaled].values = 1;  // no value's: never written in place
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_DST, mem_at(wmd, scaled, 0)}, {DNNL_ARG_SRC, wmem}, {kArgMap, map}, {kArgScale, mem_of(sv)}};
  Exec e;
  e.single = true;
  e.own = rows ? run_scale_weights16 : run_scale_weights;
  e.args = std::move(args);
  exec_own(std::move(e), rows ? "keel:scale_weights16" : "keel:scale_weights", false,
           r_.nodes[cur_node_].name + " weights x " + chan_scale + " " + dims_str(wd));
  return mem_at(wmd, scaled, 0);  // touched again at the convolution's step, which comes next
}

// A 1x1 convolution over a [1,C,1,1] value expanding to M >= 512 >= 4*C channels (squeeze-excite's excitation in
// EfficientNet's later blocks) is a vector-matrix product that oneDNN's matmul (brgemm) runs faster than its 1x1
// convolution kernel: 48 -> 1152 in 10 us instead of 15-17 (weights cold, in the network, 1 thread), 28 -> 672 in
// 5-7 instead of 8. Not for the squeeze (1152 -> 48: 10 against 5 us) nor small ones (level or slower). The input
// is read where it is (element c at offset c: plain, or nChw16c of [1,C,1,1]), the output is plain [1,M,1,1];
// post-ops as the convolution's (and the SiLU pass). False, changing nothing, when the input sits otherwise or
// oneDNN refuses.
bool Builder::conv_as_gemv(size_t i, const Fusion& f, const std::vector<float>& w, bool has_bias,
                           const std::vector<float>& bias) {
  const NodeDesc& n = r_.nodes[i];
  const Val& xv = val(n.in[0]);
  const int64_t C = dims_of(n.in[0])[1], M = static_cast<int64_t>(bias.size());
  if (M < 512 || M < 4 * C || xv.scale != 1.f || xv.md.data_type() != dt::f32) return false;
  if (!is_plain_dense(xv.md) && xv.md != md_t({1, C, 1, 1}, dt::f32, tag::nChw16c)) return false;
  const md_t a({1, C}, dt::f32, tag::ab), b({C, M}, dt::f32, tag::any), bm({1, M}, dt::f32, tag::ab),
      d({1, M}, dt::f32, tag::ab);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  std::unique_ptr<dnnl::matmul::primitive_desc> pd;
  try {
    pd = std::make_unique<dnnl::matmul::primitive_desc>(dnnl::matmul::desc(a, b, has_bias ? bm : md_t(), d), attr,
                                                        engine());
  } catch (const dnnl::error&) {
    return false;
  }
  dnnl::memory wuser(md_t({C, M}, dt::f32, tag::ba), engine(), const_cast<float*>(w.data()));  // w is [M][C]
  p_->owned.emplace_back(pd->weights_desc(), engine(), p_->weights.alloc(pd->weights_desc().get_size()));
  dnnl::memory wmem = p_->owned.back();
  dnnl::reorder(wuser, wmem).execute(stream(), wuser, wmem);
  stream().wait();
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_WEIGHTS, wmem}};
  if (has_bias) {
    p_->owned.emplace_back(bm, engine());
    std::memcpy(p_->owned.back().get_data_handle(), bias.data(), bias.size() * sizeof(float));
    args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  args[DNNL_ARG_SRC] = mem_at(a, xv.buf, xv.off);
  Val& out = define(f.out, md_t({1, M, 1, 1}, dt::f32, tag::nchw));
  args[DNNL_ARG_DST] = mem_at(d, out.buf, out.off);
  p_->flops += 2.0 * static_cast<double>(C * M);
  exec(dnnl::matmul(*pd), std::move(args));
  if (f.silu_pass) exec_silu(out, f.out);
  if (f.gelu_pass) exec_gelu(out, f.gelu_tanh);
  for (size_t k : f.nodes) done_[k] = true;
  return true;
}

// Conv, 2-D, constant weights (and bias).
// A convolution of which, along every spatial axis, only one kernel tap ever reads inside the input, and reads the
// output position itself (stride 1, same size): the others read padding only. That is a 1x1 convolution with the
// live tap's weights; a dilated 3x3 whose dilation is at least the input's size is one (DeepLabV3's ASPP, rates
// 12/24/36, over the 10x10 map of a 160x160 image: three 1x1 convolutions instead of three dilated ones on oneDNN's
// brgemm kernel between reorders). On true, *ks is all 1 and *w holds [M, C/g, 1, ...] (the caller resets the
// dilations and pads); false changes nothing.
static bool trim_to_centre_tap(const Dims& x, const Dims& y, const Dims& s, const Dims& d, const Dims& pl, Dims* ks,
                               std::vector<float>* w) {
  const size_t sp = ks->size();
  if (prod(*ks) == 1) return false;
  Dims live(sp);
  for (size_t k = 0; k < sp; ++k) {
    if (s[k] != 1 || y[2 + k] != x[2 + k]) return false;
    int64_t found = -1;
    for (int64_t t = 0; t < (*ks)[k]; ++t) {
      const int64_t first = t * d[k] - pl[k], last = y[2 + k] - 1 + t * d[k] - pl[k];  // the input rows tap t reads
      if (last < 0 || first > x[2 + k] - 1) continue;
      if (found >= 0 || first != 0) return false;
      found = t;
    }
    if (found < 0) return false;
    live[k] = found;
  }
  const int64_t taps = prod(*ks), rows = static_cast<int64_t>(w->size()) / taps;
  int64_t at = 0;  // the live tap's index within a [k0, k1, ...] kernel
  for (size_t k = 0; k < sp; ++k) at = at * (*ks)[k] + live[k];
  std::vector<float> t(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) t[r] = (*w)[r * taps + at];
  *w = std::move(t);
  *ks = Dims(sp, 1);
  return true;
}

void Builder::conv(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (conv_residual_merged(i)) return;
  if (conv_pool_fused(i)) return;
  if (conv_dw_silu(i)) return;
  if (conv_dw_ln(i)) return;
  if (se_excite_fused(i)) return;
  if (deferred_silu_.erase(n.in[0])) exec_silu(val(n.in[0]), n.in[0]);  // (not reached: defer_silu checked the plan)
  Dims x = dims_of(n.in[0]);
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || (!n.in_at(2).empty() && !B)) throw Reject{"non-constant weights"};
  // 2-D and 3-D (1-D ones arrive lifted to 2-D: lift_1d).
  if ((x.size() != 4 && x.size() != 5) || W->dims.size() != x.size()) throw Reject{"2-D and 3-D convolutions only"};
  const size_t sp = x.size() - 2;
  const int64_t N = x[0], C = x[1], M = W->dims[0];
  int64_t g = n.ai("group", 1);
  if (g <= 0 || C != W->dims[1] * g || M % g != 0) throw Reject{"channels do not match weights and group"};
  Dims ks(W->dims.begin() + 2, W->dims.end());
  if (n.ais("kernel_shape", ks) != ks) throw Reject{"kernel_shape differs from the weights"};
  Dims s = n.ais("strides", Dims(sp, 1)), d = n.ais("dilations", Dims(sp, 1)), pads = n.ais("pads", Dims(2 * sp, 0));
  if (s.size() != sp || d.size() != sp || pads.size() != 2 * sp) throw Reject{"attribute ranks"};
  std::string ap = n.as("auto_pad", "NOTSET");
  const sdk::AutoPad apk = sdk::auto_pad_of(ap);
  Dims pl(pads.begin(), pads.begin() + sp), pr(pads.begin() + sp, pads.end());
  if (sdk::is_same(apk)) {
    for (size_t k = 0; k < sp; ++k)
      sdk::same_pads(apk, x[2 + k], sdk::dilated_extent(ks[k], d[k]), s[k], &pl[k], &pr[k]);
  } else if (apk == sdk::AutoPad::kValid) {
    pl = pr = Dims(sp, 0);
  } else if (apk == sdk::AutoPad::kUnknown) {
    throw Reject{"auto_pad " + ap};
  }
  Dims y{N, M};
  y.resize(x.size(), 0);
  for (size_t k = 0; k < sp; ++k) {
    if (s[k] <= 0 || d[k] <= 0 || pl[k] < 0 || pr[k] < 0) throw Reject{"bad geometry"};
    y[2 + k] = sdk::window_output(x[2 + k], pl[k] + pr[k], sdk::dilated_extent(ks[k], d[k]), s[k]);
    if (y[2 + k] < 0) throw Reject{"kernel larger than the padded input"};
  }
  // A Pad folded into this convolution (pad): read its input, with the Pad's pads added to the convolution's.
  std::string src_name = n.in[0], chan_scale;
  if (auto pf = pad_folds_.find(n.in[0]); pf != pad_folds_.end()) {
    src_name = pf->second.in;
    x = dims_of(src_name);
    for (size_t k = 0; k < sp; ++k) pl[k] += pf->second.begin[k], pr[k] += pf->second.end[k];
  }
  Fusion f = fuse_after(n.out[0], i, true, M);
  f.silu_pass = take_silu(f);
  f.gelu_pass = !f.silu_pass && take_gelu(f);
  // Weights and bias with folds applied.
  std::vector<float> w(W->f32(), W->f32() + W->count());
  std::vector<float> bias(M, 0.f);
  bool has_bias = B != nullptr || !f.conv_bias_add.empty() || !f.bn_shift.empty();
  if (B) {
    if (B->count() != M) throw Reject{"bias size"};
    for (int64_t k = 0; k < M; ++k) bias[k] = static_cast<float>(B->at(k));
  }
  if (!f.bn_scale.empty()) {
    const int64_t per = W->count() / M;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < per; ++k) w[m * per + k] *= f.bn_scale[m];
      bias[m] = bias[m] * f.bn_scale[m] + f.bn_shift[m];
    }
  }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) bias[k] += f.conv_bias_add[k];

  // A squeeze-excite Mul folded into this convolution (fold_channel_scale): read its data operand, scale weights.
  if (auto fd = se_folds_.find(n.in[0]); fd != se_folds_.end()) std::tie(src_name, chan_scale) = fd->second;
  if (trim_to_centre_tap(x, y, s, d, pl, &ks, &w)) {  // (DeepLabV3's ASPP over a small feature map)
    d = Dims(sp, 1);
    pl = pr = Dims(sp, 0);
  }
  const double conv_flops = 2.0 * numel(y) * (C / g) * prod(ks);
  // Groups of 4 channels run as the chain's own step where it takes them (conv_grouped4: f32, 3x3, stride 1 or 2,
  // pads 1, at most a Relu after). Otherwise groups of 4 or 8 channels (ResNeXt's 32 groups, RegNet's 8-channel
  // ones) run merged into groups of 16 in and 16
  // out, the weights block-diagonal within each merged group (zeros across the original groups): 2-4x the
  // multiply-adds, but oneDNN's jit kernel over nChw16c, with no reorders to its blocked-by-4/8 layout and back.
  // Measured alone at 1 thread (fastest of 60, with those reorders): 128 channels in 32 groups at 56x56 0.57 ms
  // instead of 0.94 ms; 256 at 56x56 stride 2 0.30 ms instead of 0.41 ms; 256 at 28x28 0.29 ms instead of 0.32 ms.
  const int64_t cg = C / g;
  if (g > 1 && cg == 4 && M == C && sp == 2 && ks == Dims{3, 3} && s[0] == s[1] && (s[0] == 1 || s[0] == 2) &&
      d == Dims{1, 1} && pl == Dims{1, 1} && pr == Dims{1, 1} && f.sum_with.empty() && chan_scale.empty() &&
      !f.pass_after() && act_ == dt::f32 && has_avx512f() &&
      conv_grouped4(i, f, src_name, x, y, s[0], w, bias, conv_flops))
    return;
  if (g > 1 && M == C && cg >= 4 && cg < 16 && 16 % cg == 0 && g % (16 / cg) == 0 && chan_scale.empty()) {
    const int64_t k = 16 / cg, g2 = g / k, kk = prod(ks);
    std::vector<float> w2(static_cast<size_t>(M * 16 * kk), 0.f);
    for (int64_t m = 0; m < M; ++m) {  // output channel m of group m / cg
      const int64_t j = (m / cg) % k;  // its place in the merged group
      for (int64_t c = 0; c < cg; ++c) std::copy_n(&w[(m * cg + c) * kk], kk, &w2[(m * 16 + j * cg + c) * kk]);
    }
    w = std::move(w2);
    g = g2;
  }
  Dims wd = g > 1 ? Dims{g, M / g, C / g} : Dims{M, C};
  wd.insert(wd.end(), ks.begin(), ks.end());
  md_t wany(to_dnnl(wd), act_, tag::any), bmd({M}, dt::f32, tag::a), none;
  const Val& xv = val(src_name);
  // Source: the producer's layout when blocked and of this node's type; the plain layout only for few channels (the
  // first layer). An nhwc source (from a brgemm convolution, below) is not kept: this convolution takes its own choice.
  // Nor is one blocked by other than 16 channels (a grouped convolution's own choice, below): kept, it sends a 1x1
  // convolution to oneDNN's gemm kernel (ResNeXt's conv3 after nChw4c: 11 ms instead of 0.9 ms).
  const auto& blk = xv.md.data.format_desc.blocking;
  const bool odd_block = xv.md.data.format_kind == dnnl_blocked && blk.inner_nblks > 0 && blk.inner_blks[0] != 16;
  bool keep_src = ((!is_plain_dense(xv.md) && xv.md != md_t(to_dnnl(x), act_, channels_last_tag(x.size()))) || C < 8) &&
                  !odd_block && xv.md.data_type() == act_;
  md_t src = keep_src ? xv.md : md_t(to_dnnl(x), act_, tag::any);
  md_t dst = M % 16 == 0 ? md_t(to_dnnl(y), act_, blocked16_tag(y.size())) : md_t(to_dnnl(y), act_, tag::any);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  bool wino = options().winograd && sp == 2 && ks[0] == 3 && ks[1] == 3 && g == 1 && s[0] == 1 && s[1] == 1 &&
              d[0] == 1 && d[1] == 1 && C >= 16 && M >= 16;
  std::unique_ptr<dnnl::convolution_forward::primitive_desc> pd;
  auto make = [&](alg a, const md_t& sm, const md_t& dm) {
    try {
      dnnl::convolution_forward::desc cd(dnnl::prop_kind::forward_inference, a, sm, wany, has_bias ? bmd : none, dm,
                                         to_dnnl(s), dnnl_dilations(d), to_dnnl(pl), to_dnnl(pr));
      pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cd, attr, engine());
    } catch (const dnnl::error&) {
      pd.reset();
    }
  };
  md_t src_any(to_dnnl(x), act_, tag::any), dst_any(to_dnnl(y), act_, tag::any);
  auto is_ref = [&] { return pd && std::string(pd->impl_info_str()).rfind("ref", 0) == 0; };
  if (sp == 2 && g == 1 && N == 1 && ks == Dims{1, 1} && x[2] == 1 && x[3] == 1 && y[2] == 1 && y[3] == 1 &&
      f.sum_with.empty() && chan_scale.empty() && act_ == dt::f32 && conv_as_gemv(i, f, w, has_bias, bias))
    return;
  // A network's first convolution (3x3 stride 2 over a few plain channels) read by a depthwise one: the stem as the
  // first stage of the chain's own expand_dw step (MobileNetV2's 3 -> 32 -> depthwise -> 16).
  if (sp == 2 && g == 1 && ks == Dims{3, 3} && s == Dims{2, 2} && d == Dims{1, 1} && pl == Dims{1, 1} &&
      pr == Dims{1, 1} && C <= 8 && f.sum_with.empty() && act_ == dt::f32 && chan_scale.empty() &&
      conv_expand_dw(i, f, src_name, x, w, bias, conv_flops, true))
    return;
  if (sp == 2 && g == 1 && ks[0] == 1 && ks[1] == 1 && s[0] == 1 && s[1] == 1 && pl == Dims{0, 0} && pr == Dims{0, 0} &&
      f.sum_with.empty() && (act_ == dt::f32 || act_ == dt::bf16) && chan_scale.empty() &&
      (conv_expand_dw(i, f, src_name, x, w, bias, conv_flops) ||
       (act_ == dt::f32 && conv_dw_fused(i, f, src, wany, bmd, w, bias, conv_flops))))
    return;
  if (options().winograd && sp == 2 && g == 1 && ks == Dims{3, 3} && s == Dims{1, 1} && d[0] == d[1] && d[0] > 1 &&
      pl == Dims{d[0], d[0]} && pr == pl && x[2] % d[0] == 0 && x[3] % d[0] == 0 && x[2] / d[0] >= 4 &&
      x[3] / d[0] >= 4 && C % 16 == 0 && M % 16 == 0 && C * M <= 256 * 256 && act_ == dt::f32 && chan_scale.empty() &&
      f.sum_with.empty() &&
      conv_dilated_phases(i, f, src_name, x, y, d[0], wany, bmd, attr,
                          md_t(to_dnnl(wd), dt::f32, weights_tag(sp, false, false)), w, has_bias, bias, conv_flops))
    return;
  // The chain's own Winograd F(4,3) (steps/wino4.h) where it takes the convolution and either has 32 tiles or more
  // (its transformed weights, 4x the plain ones, then serve enough tiles) or its transformed weights are small enough
  // to stay in cache between runs (3 MiB). Measured in the chain (fastest of 60-300 runs, KEEL_ONEDNN_PROFILE; against
  // oneDNN's F(2,3) or F(4,3), whichever the timing above picks): ResNet-50's 56x56 and 28x28 3x3s 0.55-0.64 ->
  // 0.39-0.48 ms at 1 thread, 0.32-0.36 -> 0.27-0.33 and 0.37-0.40 -> 0.31-0.34 at 2; SqueezeNet's eight expands
  // (13x13 included) together 1.69 -> 1.26 ms at 1 thread. With fewer tiles and larger weights (which then come
  // from memory at every run: ResNet's 14x14 and 7x7 at batch 1), the step position by position
  // (Wino4Shape::position_major: each position's weights read once per run, the next position's prefetched during
  // the products), in F(4,3) from 16 tiles (or F(2,3) where that times faster, the weights coming from memory:
  // wino_few_tiles_pick, "(wft)"), else in F(2,3) from 16 of its 2x2 tiles (the 7x7: 4 and 16). Against
  // the earlier choices in ResNet-50 at 1 / 2 threads (3 alternating rounds): the five 14x14s 3.16-4.20 -> 2.26-3.30 /
  // 2.33-2.51 -> 1.80-2.08 ms (with the weights transformed at every run before, Wino4Shape::streamed, itself 25%
  // faster than oneDNN's kernels), the two 7x7s 2.29-2.60 -> 1.43-1.96 / 1.34-1.37 -> 0.92-1.08 ms (oneDNN's F(2,3)
  // before). See docs/ONEDNN_PERFORMANCE.md, "(w4)", "(w4s)" and "(w2)".
  constexpr int64_t kWino4MinTiles = 32, kWino4FewMinTiles = 16;
  constexpr int64_t kWino4CachedBytes = int64_t{3} << 20;
  const int64_t wino4_tiles = N * ((y[2] + 3) / 4) * ((y[3] + 3) / 4);
  const int64_t wino2_tiles = N * ((y[2] + 1) / 2) * ((y[3] + 1) / 2);
  Wino4Shape mode;
  const int64_t wino4_weight_bytes = 36 * C * M * static_cast<int64_t>(sizeof(float));  // transformed, F(4,3)
  bool take = wino4_tiles >= kWino4MinTiles || wino4_weight_bytes <= kWino4CachedBytes;
  // Taken with over 1 MiB of transformed weights (ResNet's 28x28 128->128, SqueezeNet's 13x13 expands): the tiles
  // position by position too (each position's weights read once per block of tiles, where register tile by register
  // tile read the group's weights again for each, past L2 beside the block's transformed input). ResNet-50's three
  // 28x28s 1.15-1.17 -> 1.02-1.03 ms at 1 thread and 0.85-0.95 -> 0.78-0.86 at 2, ResNet-18's two 1.16 -> 1.00-1.02 /
  // 0.87 -> 0.79-0.80 (docs/ONEDNN_PERFORMANCE.md, "(w4p)"). Not with smaller weights: at 2 threads the step splits
  // its output groups position by position (the input transform on each thread), and ResNet's 56x56 64->64 lost a
  // fifth that way.
  constexpr int64_t kWino4PositionMajorBytes = int64_t{1} << 20;
  if (take && options().wino4_position_major && wino4_weight_bytes > kWino4PositionMajorBytes)
    mode.position_major = true;
  bool pick_f2 = false;  // F(4,3) of few tiles, or F(2,3): timed (wino_few_tiles_pick)
  if (!take && options().wino_few_tiles) {
    mode.position_major = true;
    pick_f2 = wino4_tiles >= kWino4FewMinTiles;
    mode.f2 = wino4_tiles < kWino4FewMinTiles;
    take = wino4_tiles >= kWino4FewMinTiles || wino2_tiles >= kWino4FewMinTiles;
  } else if (!take && options().wino4_streamed) {
    mode.streamed = take = wino4_tiles >= kWino4FewMinTiles;
  }
  if (wino && options().wino4 && take && pl == Dims{1, 1} && pr == Dims{1, 1} && chan_scale.empty() &&
      !f.pass_after() && act_ == dt::f32 && conv_wino4(i, f, src_name, x, y, w, bias, conv_flops, mode, pick_f2))
    return;
  // Few output pixels and large weights (ResNet-50's stride-2 3x3 in layer4.0 at batch 1): the windows times the
  // weights as the chain's own few-row product (conv_skinny). Not the 3x3s Winograd takes (fewer multiply-adds).
  if (!wino && sp == 2 && g == 1 && N == 1 && s[0] == s[1] && d[0] == d[1] && chan_scale.empty() &&
      y[2] * y[3] >= kSkinnyMinRows && y[2] * y[3] <= kSkinnyGemmMaxRows &&
      C * M * prod(ks) * static_cast<int64_t>(sizeof(float)) >= kSkinnyConvMinWeightBytes) {
    Im2RowShape rows;
    rows.oh = y[2], rows.ow = y[3];
    Im2RowPart& p = rows.part[0];
    p.c = C, p.h = x[2], p.w = x[3], p.kh = ks[0], p.kw = ks[1], p.stride = s[0], p.dilation = d[0];
    p.pad_top = pl[0], p.pad_left = pl[1];
    std::vector<float> wr(w.size());  // [M][C][kh][kw] -> [M][kh][kw][C], the rows' order
    const int64_t taps = prod(ks);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t t = 0; t < taps; ++t) wr[(m * taps + t) * C + c] = w[(m * C + c) * taps + t];
    if (conv_skinny(i, f, rows, {src_name}, M, wr, bias, conv_flops)) return;
  }
  // A 1x1 stride-1 convolution: the chain's own step (steps/pointwise.h), level with oneDNN's jit_1x1 on ResNet-50's
  // 1x1s and faster on small ones (SqueezeNet 0.985x / 0.966x the model's latency at 1 / 2 threads, DeepLabV3 0.982x /
  // level): docs/ONEDNN_PERFORMANCE.md, "(pw)".
  if (options().pointwise && sp == 2 && g == 1 && ks == Dims{1, 1} && s == Dims{1, 1} && pl == Dims{0, 0} &&
      pr == Dims{0, 0} && C % 16 == 0 && M % 16 == 0 && chan_scale.empty() && !f.pass_after() && act_ == dt::f32 &&
      conv_pointwise(i, f, src_name, x, y, w, bias, conv_flops))
    return;
  if (wino) make(alg::convolution_winograd, src, dst);
  // oneDNN's Winograd kernels (F(2,3), F(4,3): another must win by a third) and, at 2+ threads over at most 14x14
  // pixels, its direct one over the same layouts (by 5%), timed here: the fastest runs (common/conv_pick.h).
  if (wino && pd && !is_ref()) {
    auto cands = conv_impls_like(*pd, engine());
    std::vector<double> margins(cands.size(), 1.0 / 3);
    if (p_->threads > 1 && y[2] * y[3] <= 196 && keep_src && M % 16 == 0) {
      auto wpd = std::move(pd);
      make(alg::convolution_direct, src, dst);
      if (pd && !is_ref() && pd->src_desc() == wpd->src_desc() && pd->dst_desc() == wpd->dst_desc())
        cands.push_back(*pd), margins.push_back(0.05);
      pd = std::move(wpd);
    }
    size_t pick = 0;
    if (time_convs_) pick = fastest_conv_remembered(cands, engine(), stream(), margins);
    else if (cands.size() > 1) p_->deferred.push_back({cands, margins, {}});
    pd = std::make_unique<dnnl::convolution_forward::primitive_desc>(cands[pick]);
  }
  // Other spatial convolutions (strided 3x3s, dilated ones, 3x3s Winograd leaves): oneDNN's brgemm kernel over nhwc
  // beats its nChw16c jit one here, the reorders in and out included. Measured in ResNet-50 at 1 thread (fastest
  // run of each step over 4 interleaved rounds, KEEL_ONEDNN_PROFILE): the 3x3 stride-2 convolutions at 56/28/14 px
  // went from 1.27/1.41/1.77 ms to 1.15/1.19/1.60 ms with their reorders; on its own at 2 threads brgemm is level or
  // ahead. Only when oneDNN picks brgemm for it (nhwc with a jit kernel is no better than nChw16c). Not for a bf16
  // convolution written into its slice of a Concat (nChw16c, chain/builder.cc plan_concats): in SqueezeNet's fire
  // modules at 27x27 and 13x13 the nhwc 3x3 expand cost a reorder of its source, the Concat one per input into a
  // plain output and the next squeeze one more, about 0.5 of a 1.64 ms bf16 run at 2 threads, where oneDNN's nChw16c
  // bf16 kernel takes the 3x3 itself at the same speed (16->64 at 55x55 and 32->128 at 27x27 both 0.067 ms).
  const bool into_concat = act_ == dt::bf16 && concat_parts_.count(f.out) != 0;
  if (!pd && !into_concat && g == 1 && prod(ks) > 1 && C >= 32 && M >= 32 && C % 16 == 0 && M % 16 == 0) {
    make(alg::convolution_direct, md_t(to_dnnl(x), act_, channels_last_tag(x.size())),
         md_t(to_dnnl(y), act_, channels_last_tag(y.size())));
    if (pd && std::string(pd->impl_info_str()).rfind("brg", 0) != 0) pd.reset();
  }
  if (!pd) make(alg::convolution_direct, src, dst);
  if (!pd) make(alg::convolution_direct, src_any, dst_any);
  // oneDNN's reference convolution is orders of magnitude slower than its jit ones (measured: a pruned SqueezeNet's
  // 3x3 expand with 8 input channels read as padded nChw16c took ref:any, ~1.2 s of a 2.4 ms model). The jit kernels
  // take fewer than 16 input channels only from plain memory (their first-layer path): try that, then oneDNN's own
  // choice of layouts, before settling for the reference.
  if (is_ref()) {
    auto ref_pd = std::move(pd);
    md_t src_plain(to_dnnl(x), act_, plain_tag(x.size()));
    // A depthwise convolution: oneDNN's jit kernels want source and destination alike, nChw16c (jit_dw, a partial
    // last block padded: MobileNet-V3's 72 or 200 channels) or nhwc (brdgmm_dw: kept when the source is nhwc, as in
    // ConvNeXt's blocks); a blocked source with an `any` destination, or any source with an nChw16c one, gets
    // ref:any, and plain memory only the gemm kernel (measured at 56x56: 72 channels 0.04 ms vs 0.7 ms, ConvNeXt's
    // 7x7 over 96 channels 0.17 ms vs 5.1 ms).
    if (g == C && g == M) {
      const bool nhwc = xv.md == md_t(to_dnnl(x), act_, channels_last_tag(x.size()));
      const tag t = nhwc ? channels_last_tag(x.size()) : blocked16_tag(x.size());
      make(alg::convolution_direct, md_t(to_dnnl(x), act_, t), md_t(to_dnnl(y), act_, t));
    }
    // A grouped convolution whose groups are not whole 16-channel blocks (ResNeXt's 4 and 8 channels per group,
    // RegNet's 8): oneDNN's jit kernel takes it in a layout of its own choice (blocked by 4 or 8), behind a reorder,
    // where plain memory would get its gemm kernel (measured 128 channels in 32 groups at 56x56: 0.56 ms vs 1.39 ms).
    if ((is_ref() || !pd) && g > 1 && g < C && (C / g) % 16 != 0) make(alg::convolution_direct, src_any, dst_any);
    if (is_ref() || !pd) make(alg::convolution_direct, src_plain, dst);
    if (is_ref() || !pd) make(alg::convolution_direct, src_plain, dst_any);
    if (is_ref() || !pd) make(alg::convolution_direct, src_any, dst_any);
    if (is_ref() || !pd) pd = std::move(ref_pd);
  }
  if (!pd) throw Reject{"oneDNN has no convolution for this case"};
  md_t wplain(to_dnnl(wd), dt::f32, weights_tag(sp, g > 1, false));
  conv_like_tail(i, f, dnnl::convolution_forward(*pd), pd->src_desc(), pd->weights_desc(), pd->dst_desc(), wplain, w,
                 has_bias, bias, conv_flops, {}, src_name, chan_scale);
}

// ConvTranspose, 2-D, constant weights (and bias); output_padding within the end pads; post-ops as for Conv.
void Builder::deconv(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  const ConstT* W = cst(n.in_at(1));
  const ConstT* B = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!W || W->dtype != KEEL_DTYPE_F32 || (!n.in_at(2).empty() && !B)) throw Reject{"non-constant weights"};
  // 2-D and 3-D (1-D ones arrive lifted to 2-D: lift_1d).
  if ((x.size() != 4 && x.size() != 5) || W->dims.size() != x.size())
    throw Reject{"2-D and 3-D transposed convolutions only"};
  if (n.has("output_shape")) throw Reject{"output_shape"};
  const size_t sp = x.size() - 2;
  const int64_t N = x[0], C = x[1], g = n.ai("group", 1);
  if (g <= 0 || C != W->dims[0] || C % g != 0) throw Reject{"channels do not match weights and group"};
  const int64_t M = W->dims[1] * g;
  Dims ks(W->dims.begin() + 2, W->dims.end());
  if (n.ais("kernel_shape", ks) != ks) throw Reject{"kernel_shape differs from the weights"};
  Dims s = n.ais("strides", Dims(sp, 1)), d = n.ais("dilations", Dims(sp, 1)), pads = n.ais("pads", Dims(2 * sp, 0)),
       opad = n.ais("output_padding", Dims(sp, 0));
  if (s.size() != sp || d.size() != sp || pads.size() != 2 * sp || opad.size() != sp) throw Reject{"attribute ranks"};
  std::string ap = n.as("auto_pad", "NOTSET");
  if (ap == "VALID") pads = Dims(2 * sp, 0);
  else if (ap != "NOTSET" && !ap.empty()) throw Reject{"auto_pad " + ap};
  Dims pl(pads.begin(), pads.begin() + sp), pr(sp), y{N, M};
  y.resize(x.size(), 0);
  for (size_t k = 0; k < sp; ++k) {
    if (s[k] <= 0 || d[k] <= 0 || pads[k] < 0 || pads[k + sp] < 0 || opad[k] < 0) throw Reject{"bad geometry"};
    y[2 + k] = s[k] * (x[2 + k] - 1) + opad[k] + (ks[k] - 1) * d[k] + 1 - pads[k] - pads[k + sp];
    pr[k] = pads[k + sp] - opad[k];
    if (y[2 + k] <= 0) throw Reject{"empty output"};
    if (pr[k] < 0) throw Reject{"output_padding larger than the end pad"};
  }
  Fusion f = fuse_after(n.out[0], i, true, M);
  // ONNX weights [C, M/g, kh, kw] = [g, C/g, M/g, kh, kw]; output channel m = (c / (C/g)) * (M/g) + o.
  std::vector<float> w(W->f32(), W->f32() + W->count());
  std::vector<float> bias(M, 0.f);
  bool has_bias = B != nullptr || !f.conv_bias_add.empty() || !f.bn_shift.empty();
  if (B) {
    if (B->count() != M) throw Reject{"bias size"};
    for (int64_t k = 0; k < M; ++k) bias[k] = static_cast<float>(B->at(k));
  }
  if (!f.bn_scale.empty()) {
    const int64_t per = prod(ks), mg = M / g, cg = C / g;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t o = 0; o < mg; ++o) {
        const int64_t m = (c / cg) * mg + o;
        for (int64_t k = 0; k < per; ++k) w[(c * mg + o) * per + k] *= f.bn_scale[m];
      }
    for (int64_t m = 0; m < M; ++m) bias[m] = bias[m] * f.bn_scale[m] + f.bn_shift[m];
  }
  for (size_t k = 0; k < f.conv_bias_add.size(); ++k) bias[k] += f.conv_bias_add[k];
  Dims wd = g > 1 ? Dims{g, M / g, C / g} : Dims{M, C};
  wd.insert(wd.end(), ks.begin(), ks.end());
  md_t wany(to_dnnl(wd), act_, tag::any), bmd({M}, dt::f32, tag::a), none;
  const Val& xv = val(n.in[0]);
  bool keep_src = ((!is_plain_dense(xv.md) && xv.md != md_t(to_dnnl(x), act_, channels_last_tag(x.size()))) || C < 8) &&
                  xv.md.data_type() == act_;
  md_t src = keep_src ? xv.md : md_t(to_dnnl(x), act_, tag::any);
  md_t dst = M % 16 == 0 ? md_t(to_dnnl(y), act_, blocked16_tag(y.size())) : md_t(to_dnnl(y), act_, tag::any);
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  std::unique_ptr<dnnl::deconvolution_forward::primitive_desc> pd;
  for (int attempt = 0; attempt < 2 && !pd; ++attempt) {
    md_t sm = attempt == 0 ? src : md_t(to_dnnl(x), act_, tag::any);
    md_t dm = attempt == 0 ? dst : md_t(to_dnnl(y), act_, tag::any);
    try {
      dnnl::deconvolution_forward::desc dd(dnnl::prop_kind::forward_inference, alg::deconvolution_direct, sm, wany,
                                           has_bias ? bmd : none, dm, to_dnnl(s), dnnl_dilations(d), to_dnnl(pl),
                                           to_dnnl(pr));
      pd = std::make_unique<dnnl::deconvolution_forward::primitive_desc>(dd, attr, engine());
    } catch (const dnnl::error&) {
      pd.reset();
    }
  }
  if (!pd) throw Reject{"oneDNN has no deconvolution for this case"};
  md_t wplain(to_dnnl(wd), dt::f32, weights_tag(sp, g > 1, true));
  conv_like_tail(i, f, dnnl::deconvolution_forward(*pd), pd->src_desc(), pd->weights_desc(), pd->dst_desc(), wplain, w,
                 has_bias, bias, 2.0 * numel(x) * (M / g) * prod(ks));
}

}  // namespace keel::onednn::chain
