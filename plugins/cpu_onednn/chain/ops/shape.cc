// plugins/cpu_onednn/chain/ops/shape.cc — ops that view or move data:
// Reshape/Flatten/Squeeze/Unsqueeze/Identity/Dropout, Pad, Resize, Transpose, Cast, Slice.
#include "chain/builder.h"

namespace keel::onednn::chain {

// Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference): a view of the input's plain memory.
void Builder::reshape_like(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.op == "Dropout") {
    for (size_t k = 1; k < n.out.size(); ++k)
      if (!n.out[k].empty()) throw Reject{"Dropout mask output"};
  }
  Dims x = dims_of(n.in[0]);
  Dims y;
  auto dit = r_.dims.find(n.out[0]);
  if (n.op == "Reshape") {
    const ConstT* s = cst(n.in_at(1));
    if (!s) throw Reject{"non-constant shape"};
    if (n.ai("allowzero", 0)) throw Reject{"allowzero"};
    int64_t known = 1, neg = -1;
    for (int64_t k = 0; k < s->count(); ++k) {
      int64_t v = s->iat(k);
      if (v == 0) v = k < static_cast<int64_t>(x.size()) ? x[k] : throw Reject{"0 past the input rank"};
      if (v == -1) neg = k;
      else known = mul_sat(known, v);
      y.push_back(v);
    }
    if (neg >= 0) y[neg] = known ? numel(x) / known : 0;
  } else if (n.op == "Flatten") {
    int64_t axis = n.ai("axis", 1);
    if (axis < 0) axis += static_cast<int64_t>(x.size());
    int64_t a = 1, b = 1;
    for (int64_t k = 0; k < static_cast<int64_t>(x.size()); ++k) (k < axis ? a : b) *= x[k];
    y = {a, b};
  } else if (dit != r_.dims.end()) {
    y = dit->second;
  } else if (n.op == "Identity" || n.op == "Dropout") {
    y = x;
  } else {
    throw Reject{"output shape unknown"};
  }
  if (numel(y) != numel(x)) throw Reject{"element count changes"};
  if (dit != r_.dims.end() && dit->second != y) throw Reject{"shape differs from the inferred one"};
  const Val& v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  if (flatten_into_gemm(i, x, y)) return;
  // A strided view (a q/k/v slice of an in-projection) read only by keel.Attention (through Transposes) is
  // reshaped as a view where its strides allow: the heads' split moves nothing. (Not for MatMul readers: oneDNN's
  // batched matmul over such views ran slower at 1 thread than the reorder plus the plain product.)
  Dims ys;
  const bool attention_view = is_strided(v.md) && !is_plain_dense(v.md) && read_by_attention_only(n.out[0]);
  if (attention_view && reshape_strides(x, md_strides(v.md), y, &ys)) {
    Val o = v;
    o.md = strided_md(y, ys, v.md.data_type());
    if (is_plain_dense(o.md)) o.md = plain_md(y, v.md.data_type());
    p_->bufs[o.buf].values++;
    vals_[n.out[0]] = o;
    return;
  }
  // Where no one view expresses it (torch's packed in-projection at a batch above 1: [S, B, H*Dh] as [S, B*H, Dh]),
  // the atoms' view, which keel.Attention reads with the merged dims as its batch (each batch entry its own offset):
  // the heads' split still moves nothing. f32 only (a bf16 operand is converted to plain f32 by attention()).
  Dims atoms, atom_strides;
  std::vector<Dims> groups;
  if (attention_view && v.md.data_type() == dt::f32 &&
      reshape_atoms(x, md_strides(v.md), y, &atoms, &atom_strides, &groups)) {
    std::vector<bool> merged(groups.size());
    for (size_t k = 0; k < groups.size(); ++k) merged[k] = groups[k].size() > 1;
    if (read_by_attention_only(n.out[0], &merged)) {
      Val o = v;
      o.md = strided_md(atoms, atom_strides, dt::f32);
      p_->bufs[o.buf].values++;
      vals_[n.out[0]] = o;
      atom_views_[n.out[0]] = {y, std::move(groups)};
      return;
    }
  }
  Val pv = as_plain(n.in[0]);
  Val o = pv;
  o.md = plain_md(y);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
}

// A Flatten (or Reshape) of [N,C,H,W] to [N,C*H*W] whose only reader is a Gemm with a constant B (a small CNN's
// classifier after its last pooling), over a value in nChw16c (C a multiple of 16: no padded channels) or nhwc:
// each sample's C*H*W floats lie contiguous in that layout, only in another order, so the Gemm reads them where
// they are and takes B's rows in the same order (permuted once, when it is prepacked) instead of a reorder to the
// plain layout on every run (simple_cnn at batch 32, [32,32,15,15]: 0.03 ms of 0.43 at 1 thread).
bool Builder::flatten_into_gemm(size_t i, const Dims& x, const Dims& y) {
  const NodeDesc& n = r_.nodes[i];
  const bool bytes = act_ == dt::u8 || act_ == dt::s8;
  if (x.size() != 4 || y.size() != 2 || y[0] != x[0] || x[2] * x[3] == 1 || (act_ != dt::f32 && !bytes)) return false;
  const size_t u = sole_user(n.out[0]);
  if (u == npos) return false;
  const NodeDesc& g = r_.nodes[u];
  // An f32 Gemm, or (1-byte data) keel.QGemm, whose constant B the builder permutes the same way (qgemm).
  if (g.op != (bytes ? "QGemm" : "Gemm") || g.in[0] != n.out[0] || g.ai("transA", 0) != 0 || g.in.size() < 2 ||
      g.in[1] == n.out[0])
    return false;
  const ConstT* b = cst(g.in[1]);
  if (!b || b->dtype != (bytes ? KEEL_DTYPE_I8 : KEEL_DTYPE_F32) || b->dims.size() != 2) return false;
  const Val& v = val(n.in[0]);
  const bool nhwc = v.md == md_t(to_dnnl(x), act_, channels_last_tag(4));
  const bool blocked = x[1] % 16 == 0 && v.md == md_t(to_dnnl(x), act_, blocked16_tag(4));
  if (!nhwc && !blocked) return false;
  Val o = v;
  o.md = plain_md(y);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
  flat_folds_[n.out[0]] = {x, nhwc};
  return true;
}

// Pad, constant mode. All-zero pads (torch exports AvgPool3d/AvgPool1d with one): a view of its input. Otherwise
// (TF/Keras exports: ZeroPadding2D before a convolution or pooling, SAME padding made explicit) the pads, all on the
// spatial axes and not negative, are folded into the padding of every node that reads the output, when that is
// exactly what the Pad computes (pad_foldable_into): the Pad costs nothing and its output never exists. Anything
// else (reflect/edge modes, a non-zero value before a convolution, another reader) is rejected: the Pad runs on
// its own kernel.
void Builder::pad(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.as("mode", "constant") != "constant") throw Reject{"Pad mode other than constant"};
  const ConstT* p = cst(n.in_at(1));
  if (!p) throw Reject{"non-constant pads"};
  if (n.has("pads") || n.in.size() > 3) throw Reject{"Pad form"};
  bool zero = true;
  for (int64_t k = 0; k < p->count(); ++k) zero = zero && p->iat(k) == 0;
  if (zero) {
    if (dims_of(n.in[0]) != dims_of(n.out[0])) throw Reject{"shape changes"};
    const Val v = val(n.in[0]);
    if (v.scale != 1.f) throw Reject{"scaled input"};
    vals_[n.out[0]] = v;
    p_->bufs[v.buf].values++;
    return;
  }
  const Dims x = dims_of(n.in[0]), y = dims_of(n.out[0]);
  const int64_t rank = static_cast<int64_t>(x.size());
  if (rank != 4 && rank != 5) throw Reject{"Pad of a rank other than 4 or 5"};
  // A rank-3 Pad lifted to [N,C,1,L] (lift_1d) keeps its 6 pads: none on the inserted axis.
  Dims pads(2 * rank, 0);
  if (p->count() == 2 * rank) {
    for (int64_t k = 0; k < 2 * rank; ++k) pads[k] = p->iat(k);
  } else if (rank == 4 && p->count() == 6 && x[2] == 1) {
    pads = {p->iat(0), p->iat(1), 0, p->iat(2), p->iat(3), p->iat(4), 0, p->iat(5)};
  } else {
    throw Reject{"Pad: " + std::to_string(p->count()) + " pads for rank " + std::to_string(rank)};
  }
  if (pads[0] || pads[1] || pads[rank] || pads[rank + 1]) throw Reject{"Pad on the batch or channel axis"};
  Dims begin(pads.begin() + 2, pads.begin() + rank), end(pads.begin() + rank + 2, pads.end());
  for (size_t k = 0; k < begin.size(); ++k) {
    if (begin[k] < 0 || end[k] < 0) throw Reject{"negative pads (a crop)"};
    if (y[2 + k] != x[2 + k] + begin[k] + end[k]) throw Reject{"Pad output shape"};
  }
  float value = 0.f;
  if (!n.in_at(2).empty()) {
    const ConstT* c = cst(n.in_at(2));
    if (!c || c->count() != 1 || c->dtype != KEEL_DTYPE_F32) throw Reject{"Pad value not a constant f32 scalar"};
    value = c->f32()[0];
  }
  const std::string& out = n.out[0];
  if (escapes(out) || users(out).empty()) throw Reject{"Pad output read outside the claim"};
  for (size_t u : users(out))
    if (done_[u] || !pad_foldable_into(u, out, n.in[0], begin, end, value))
      throw Reject{"Pad not foldable into " + r_.nodes[u].op + " '" + r_.nodes[u].name + "'"};
  val(n.in[0]);  // the input must be available
  pad_folds_[out] = {n.in[0], begin, end};
}

// Whether node `u`, reading the output `v` of a Pad of `src` (pads `begin`/`end` of value `value` on the spatial
// axes), computes the same with the pads added to its own padding: a Conv when the value is 0 (its padding is
// zeros); an AveragePool when the value is 0 and it counts the padding (count_include_pad, or no pads of its own),
// without ceil_mode; a MaxPool when the value is -inf (or the lowest float), or 0 over a value known not to be
// negative (a Relu's output: a window that holds at least one element of the input, as each does when every pad is
// smaller than the window, then has the same maximum), without ceil_mode. The node's own auto_pad must be NOTSET
// (or VALID for the poolings).
bool Builder::pad_foldable_into(size_t u, const std::string& v, const std::string& src, const Dims& begin,
                                const Dims& end, float value) {
  const NodeDesc& n = r_.nodes[u];
  if (n.in.empty() || n.in[0] != v) return false;
  for (size_t k = 1; k < n.in.size(); ++k)
    if (n.in[k] == v) return false;
  const size_t sp = begin.size();
  const std::string ap = n.as("auto_pad", "NOTSET");
  if (n.op == "Conv") return value == 0.f && (ap == "NOTSET" || ap.empty() || ap == "VALID");
  if (n.op != "MaxPool" && n.op != "AveragePool") return false;
  if (ap != "NOTSET" && !ap.empty() && ap != "VALID") return false;
  if (n.ai("ceil_mode", 0) != 0) return false;
  Dims own = ap == "VALID" ? Dims(2 * sp, 0) : n.ais("pads", Dims(2 * sp, 0));
  if (own.size() != 2 * sp) return false;
  if (n.op == "AveragePool") {
    if (value != 0.f) return false;
    bool own_zero = std::all_of(own.begin(), own.end(), [](int64_t q) { return q == 0; });
    return own_zero || n.ai("count_include_pad", 0) != 0;
  }
  const bool lowest = std::isinf(value) ? value < 0 : value <= -std::numeric_limits<float>::max();
  if (!lowest && !(value == 0.f && non_negative(src))) return false;
  Dims k = n.ais("kernel_shape", {}), d = n.ais("dilations", Dims(sp, 1));
  if (k.size() != sp || d.size() != sp) return false;
  for (size_t j = 0; j < sp; ++j) {
    const int64_t eff = (k[j] - 1) * d[j] + 1;
    if (own[j] + begin[j] >= eff || own[sp + j] + end[j] >= eff) return false;
  }
  return true;
}

// Whether value `v` is known not to be negative: the output of a Relu (or of a Clip with a constant min >= 0) in
// this claim.
bool Builder::non_negative(const std::string& v) const {
  for (const NodeDesc& n : r_.nodes) {
    if (n.out.empty() || n.out[0] != v) continue;
    if (n.op == "Relu") return true;
    if (n.op == "Clip") {
      if (n.has("min")) return n.af("min", -1.f) >= 0.f;
      const ConstT* lo = n.in_at(1).empty() ? nullptr : cst(n.in_at(1));
      return lo && lo->count() == 1 && lo->at(0) >= 0.0;
    }
    return false;
  }
  return false;
}

// Resize (opset 11+: X, roi, scales, sizes; constant scales or sizes) of the spatial axes of a 3-D to 5-D value, as
// oneDNN's resampling (the layout kept: nChw16c in, nChw16c out):
//   - linear with coordinate_transformation_mode half_pixel (pytorch_half_pixel where no output axis is 1): what
//     torch exports for bilinear/trilinear interpolation with align_corners=False; oneDNN computes the same
//     (x + 0.5) / scale - 0.5, clamped at the edges;
//   - nearest with integer upscale factors and asymmetric + floor (torch's nearest) or half_pixel +
//     round_prefer_floor/ceil: each output pixel then reads source pixel floor(x / scale), oneDNN's
//     floor((x + 0.5) / scale) for an integer scale.
// A 2-D linear Resize in f32 runs instead as the plugin's own bilinear step (steps/resize.h), which also takes the
// align_corners and asymmetric modes (torch's align_corners=True) and is several times faster over plain memory.
// Anything else (cubic, tf_crop_and_resize, antialias, axes, N or C resized, linear of another rank or in bf16
// with another mode) stays with the Resize kernel.
void Builder::resize(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.in.size() < 3) throw Reject{"Resize-10 form (X, scales)"};
  const Dims x = dims_of(n.in[0]), y = dims_of(n.out[0]);
  const size_t rank = x.size();
  if (rank < 3 || rank > 5 || y.size() != rank || x[0] != y[0] || x[1] != y[1]) throw Reject{"not a spatial resize"};
  if (n.has("axes") || n.ai("antialias", 0) != 0 || n.as("keep_aspect_ratio_policy", "stretch") != "stretch")
    throw Reject{"axes, antialias or keep_aspect_ratio_policy"};
  const std::string mode = n.as("mode", "nearest"), ctm = n.as("coordinate_transformation_mode", "half_pixel"),
                    nm = n.as("nearest_mode", "round_prefer_floor");
  const ConstT* sc = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  const ConstT* sz = n.in_at(3).empty() ? nullptr : cst(n.in_at(3));
  if ((!n.in_at(2).empty() && !sc) || (!n.in_at(3).empty() && !sz)) throw Reject{"non-constant scales or sizes"};
  if (sc && sc->count() == 0) sc = nullptr;
  if (sz && sz->count() == 0) sz = nullptr;
  if (!sc && !sz) throw Reject{"neither scales nor sizes"};
  // A 2-D bilinear resize in f32 runs as the plugin's own step (steps/resize.h) in any coordinate mode it knows.
  ResizeCoords coords = ResizeCoords::kHalfPixel;
  const bool own = mode == "linear" && rank == 4 && act_ == dt::f32 && resize_coords_of(ctm, &coords);
  std::vector<float> factors;
  for (size_t k = 2; k < rank; ++k) {
    if (sc) {
      if (sc->count() != static_cast<int64_t>(rank) || sc->at(0) != 1 || sc->at(1) != 1) throw Reject{"scales"};
      factors.push_back(static_cast<float>(sc->at(static_cast<int64_t>(k))));
    } else {
      if (sz->count() != static_cast<int64_t>(rank) || sz->iat(static_cast<int64_t>(k)) != y[k]) throw Reject{"sizes"};
      factors.push_back(static_cast<float>(y[k]) / static_cast<float>(x[k]));
    }
    // (oneDNN derives the output size from the float factor; the own step takes sizes as they are.)
    if (!(factors.back() > 0) ||
        ((sc || !own) && y[k] != static_cast<int64_t>(std::floor(x[k] * static_cast<double>(factors.back())))))
      throw Reject{"output size does not follow from the scales"};
  }
  alg a;
  if (mode == "linear") {
    bool one = false;
    for (size_t k = 2; k < rank; ++k) one = one || y[k] == 1;
    if (!own && ctm != "half_pixel" && !(ctm == "pytorch_half_pixel" && !one))
      throw Reject{"linear Resize with coordinate_transformation_mode " + ctm};
    a = alg::resampling_linear;
  } else if (mode == "nearest") {
    const bool floor_mode = ctm == "asymmetric" && nm == "floor";
    const bool round_mode = (ctm == "half_pixel" || ctm == "pytorch_half_pixel") &&
                            (nm == "round_prefer_floor" || nm == "round_prefer_ceil");
    if (!floor_mode && !round_mode) throw Reject{"nearest Resize with " + ctm + " / " + nm};
    for (size_t k = 2; k < rank; ++k) {
      const float f = factors[k - 2];
      if (f < 1 || f != std::floor(f) || y[k] != x[k] * static_cast<int64_t>(f))
        throw Reject{"nearest Resize by a non-integer factor"};
    }
    a = alg::resampling_nearest;
  } else {
    throw Reject{"Resize mode " + mode};
  }
  const Val& v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  // The producer's layout when it is plain or channel-blocked with whole blocks; else plain (a blocked value with a
  // partial last block, e.g. a 21-class segmentation map, is read plain: the resized copy is the big one).
  // A plain value stays plain: over 1x1 pixels it also compares equal to channels-last (oneDNN ignores the strides
  // of dims of 1), and its resized copy, written channels-last, was then taken for plain.
  md_t src = plain_md(x), dst = plain_md(y);
  const bool plain = v.md == plain_md(x);
  const bool blocked = !plain && v.md == md_t(to_dnnl(x), act_, blocked16_tag(rank)) && x[1] % 16 == 0;
  const bool nhwc = !plain && !blocked && v.md == md_t(to_dnnl(x), act_, channels_last_tag(rank));
  if (blocked || nhwc) {
    src = v.md;
    dst = md_t(to_dnnl(y), act_, blocked ? blocked16_tag(rank) : channels_last_tag(rank));
  }
  if (own) {
    auto shape = std::make_shared<BilinearShape>();
    shape->planes = blocked ? x[0] * ((x[1] + 15) / 16) : nhwc ? x[0] : x[0] * x[1];
    shape->vec = blocked ? 16 : nhwc ? x[1] : 1;
    shape->h = x[2], shape->w = x[3], shape->oh = y[2], shape->ow = y[3];
    // ONNX's scale: the scales input, else output / input length.
    shape->y = resize_axis(x[2], y[2], sc ? sc->at(2) : static_cast<double>(y[2]) / x[2], coords);
    shape->x = resize_axis(x[3], y[3], sc ? sc->at(3) : static_cast<double>(y[3]) / x[3], coords);
    Val sv = as_md(n.in[0], src);
    Exec e;
    e.args = {{DNNL_ARG_SRC, mem_of(sv)}};
    Val& o = define(n.out[0], dst);
    e.args[DNNL_ARG_DST] = mem_of(o);
    e.own = run_bilinear;
    e.own_kind = "resampling";
    e.single = src.get_size() + dst.get_size() < (1u << 20);
    e.params = shape;
    exec_own(std::move(e), "keel:bilinear", false,
             n.name + " " + dims_str(x) + " -> " + dims_str(y) + " (" + ctm + ")");
    return;
  }
  dnnl::resampling_forward::desc d(dnnl::prop_kind::forward_inference, a, factors, src, dst);
  dnnl::resampling_forward::primitive_desc pd(d, user_scratchpad(), engine());
  Val sv = as_md(n.in[0], src);
  dnnl::memory sm = mem_of(sv);
  Val& o = define(n.out[0], dst);
  dnnl::memory dm = mem_of(o);
  exec(dnnl::resampling_forward(pd), {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, dm}});
}

// Transpose: a strided view when the input is plain-strided (normalised to plain when it is dense), else a
// reorder into the plain layout.
void Builder::transpose(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (auto av = atom_views_.find(n.in[0]); av != atom_views_.end()) {  // the dims and their atoms permuted
    const AtomView a = av->second;
    const Dims perm = perm_of(n, a.dims.size());
    if (perm.empty()) throw Reject{"perm"};
    AtomView o;
    for (int64_t p : perm) {
      o.dims.push_back(a.dims[static_cast<size_t>(p)]);
      o.groups.push_back(a.groups[static_cast<size_t>(p)]);
    }
    const Val v = val(n.in[0]);
    p_->bufs[v.buf].values++;
    vals_[n.out[0]] = v;
    atom_views_[n.out[0]] = std::move(o);
    return;
  }
  Dims x = dims_of(n.in[0]);
  Dims perm = n.ais("perm", {});
  if (perm.empty())
    for (size_t k = x.size(); k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  if (perm.size() != x.size()) throw Reject{"perm rank"};
  const Val v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  for (int64_t p : perm)
    if (p < 0 || p >= static_cast<int64_t>(x.size())) throw Reject{"perm out of range"};
  // A blocked value is reordered once, straight into the strided layout whose transposed view is dense (nChw16c
  // read as [N,H,W,C], ConvNeXt's permute in front of its LayerNorm: into nhwc), not to plain and again after.
  Val src = v;
  if (!is_strided(v.md)) {
    Dims xs(x.size());
    int64_t stride = 1;
    for (size_t k = perm.size(); k-- > 0;) {
      xs[perm[k]] = stride;
      stride *= x[perm[k]];
    }
    src = as_md(n.in[0], strided_md(x, xs, v.md.data_type()));
  }
  Dims st = md_strides(src.md), yd(x.size()), ys(x.size());
  for (size_t k = 0; k < perm.size(); ++k) {
    yd[k] = x[perm[k]];
    ys[k] = st[perm[k]];
  }
  Val o = src;
  o.md = strided_md(yd, ys, src.md.data_type());
  if (is_plain_dense(o.md)) o.md = plain_md(yd);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
}

// Cast between f32 and bf16: the value converted in its own layout (a strided view: into plain memory).
void Builder::cast(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const Val v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  const dt from = v.md.data_type();
  if ((from != dt::f32 && from != dt::bf16) || n.out.size() != 1) throw Reject{"Cast other than f32 <-> bf16"};
  if (from == act_) {  // a no-op Cast: a view
    p_->bufs[v.buf].values++;
    vals_[n.out[0]] = v;
    return;
  }
  md_t out = is_strided(v.md) ? plain_md(md_dims(v.md)) : with_dtype(v.md, act_);
  Val& o = define(n.out[0], out);
  dnnl::memory a = mem_of(v), b = mem_of(o);
  exec(reorder_prim(a, b), {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}});
}

// Slice with constant starts/ends/axes and step 1: a strided view.
void Builder::slice(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  const int64_t rank = static_cast<int64_t>(x.size());
  const ConstT *st = cst(n.in_at(1)), *en = cst(n.in_at(2));
  const ConstT* ax = n.in_at(3).empty() ? nullptr : cst(n.in_at(3));
  const ConstT* sp = n.in_at(4).empty() ? nullptr : cst(n.in_at(4));
  if (!st || !en || (!n.in_at(3).empty() && !ax) || (!n.in_at(4).empty() && !sp)) throw Reject{"non-constant Slice"};
  Dims y = x, off(rank, 0);
  for (int64_t k = 0; k < st->count(); ++k) {
    int64_t a = ax ? ax->iat(k) : k;
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) throw Reject{"axis"};
    if (sp && sp->iat(k) != 1) throw Reject{"step other than 1"};
    int64_t b = st->iat(k), e = en->iat(k), d = x[a];
    if (b < 0) b += d;
    if (e < 0) e += d;
    b = std::clamp<int64_t>(b, 0, d);
    e = std::clamp<int64_t>(e, 0, d);
    if (e <= b) throw Reject{"empty slice"};
    y[a] = e - b;
    off[a] = b;
  }
  const Val v = val(n.in[0]);
  if (v.scale != 1.f) throw Reject{"scaled input"};
  Val src = is_strided(v.md) ? v : as_plain(n.in[0]);
  Dims sst = md_strides(src.md);
  int64_t offset = 0;
  for (int64_t k = 0; k < rank; ++k) offset += off[k] * sst[k];
  Val o = src;
  o.md = strided_md(y, sst, src.md.data_type());
  o.off = src.off + static_cast<uint64_t>(offset) * elem_size(src.md);
  if (is_plain_dense(o.md)) o.md = plain_md(y);
  p_->bufs[o.buf].values++;
  vals_[n.out[0]] = o;
}

// ------------------------------------------------------------------------------------------------- int8 steps
//
// keel.QConv and keel.QGemm (what fuse_qdq makes of QDQ models) as steps of the chain, built with the set-up of the
// standalone kernels (kernels/int8.h: the same parameters, primitive descriptors, post-ops, own depthwise kernel and
// quantization loops), so that consecutive int8 layers run without a dispatch per node:
//   - u8/s8 activations stay in the primitives' channels-last layout from step to step;
//   - an f32 X (a QuantizeLinear fuse_qdq folded into its reader: the fp32 -> int8 boundary, a residual stream) is
//     quantized straight from its producer's layout (the plugin's own loops from plain, channels-last or nChw16c
//     memory; else one oneDNN quantizing reorder), once for all readers with the same scale and zero point;
//   - Z (a folded residual Add) is read channels-last, the layout the primitive adds it in; an f32 output stays in
//     the primitive's layout for its readers in the chain (GlobalAveragePool, MaxPool read it there);
//   - values the graph holds channels-last (Recipe::channels_last) cross the chain's boundary in that layout.

}  // namespace keel::onednn::chain
