// plugins/cpu_onednn/chain/ops/norm.cc — BatchNormalization, Softmax, ReduceMean, LayerNormalization.
#include "chain/builder.h"

namespace keel::onednn::chain {

void Builder::batchnorm(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  if (n.in.size() != 5 || n.ai("training_mode", 0) != 0) throw Reject{"training BatchNormalization"};
  for (size_t k = 1; k < n.out.size(); ++k)
    if (!n.out[k].empty()) throw Reject{"training outputs"};
  Dims x = dims_of(n.in[0]);
  if (x.size() < 2) throw Reject{"rank"};
  const int64_t C = x[1];
  std::vector<float> ss[4];
  for (int k = 0; k < 4; ++k) {
    const ConstT* c = cst(n.in[1 + k]);
    if (!c || c->count() != C) throw Reject{"non-constant or mis-sized scale/bias/mean/var"};
    for (int64_t j = 0; j < C; ++j) ss[k].push_back(static_cast<float>(c->at(j)));
  }
  const Val xv = val(n.in[0]);
  md_t md = is_strided(xv.md) && !is_plain_dense(xv.md) ? plain_md(x) : xv.md;
  Val sv = as_md(n.in[0], md);
  // A Relu after it (DenseNet's pre-activation BatchNormalization-Relu in front of each convolution): oneDNN's
  // fused flag, one pass instead of two.
  auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
               dnnl::normalization_flags::use_shift;
  std::string out = n.out[0];
  const size_t relu = sole_user(out);
  if (relu != npos && r_.nodes[relu].op == "Relu" && r_.nodes[relu].out.size() == 1) {
    flags |= dnnl::normalization_flags::fuse_norm_relu;
    out = r_.nodes[relu].out[0];
    done_[relu] = true;
  }
  dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md, n.af("epsilon", 1e-5f), flags);
  dnnl::batch_normalization_forward::primitive_desc pd(d, user_scratchpad(), engine());
  std::unordered_map<int, dnnl::memory> args;
  const int arg[4] = {DNNL_ARG_SCALE, DNNL_ARG_SHIFT, DNNL_ARG_MEAN, DNNL_ARG_VARIANCE};
  for (int k = 0; k < 4; ++k) {
    p_->owned.emplace_back(md_t({C}, dt::f32, tag::a), engine());
    std::memcpy(p_->owned.back().get_data_handle(), ss[k].data(), C * sizeof(float));
    args[arg[k]] = p_->owned.back();
  }
  args[DNNL_ARG_SRC] = mem_of(sv);
  Val& o = define(out, md);
  args[DNNL_ARG_DST] = mem_of(o);
  exec(dnnl::batch_normalization_forward(pd), std::move(args));
}

void Builder::softmax(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  int64_t rank = static_cast<int64_t>(x.size());
  int64_t axis = n.ai("axis", -1);
  if (axis < 0) axis += rank;
  if (axis != rank - 1) throw Reject{"Softmax over an axis other than the last"};  // equal for every opset
  Val sv = as_plain(n.in[0]);
  md_t md = plain_md(x);
  dnnl::softmax_forward::desc d(dnnl::prop_kind::forward_inference, md, static_cast<int>(axis));
  dnnl::softmax_forward::primitive_desc pd(d, user_scratchpad(), engine());
  int buf = dead_after(n.in[0], i) && vals_[n.in[0]].buf == sv.buf ? sv.buf : -2;
  if (buf >= 0) p_->bufs[buf].values--;
  dnnl::memory sm = mem_of(sv);
  Val& o = define(n.out[0], md, buf);
  dnnl::memory dm = mem_of(o);
  exec(dnnl::softmax_forward(pd), {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, dm}});
}

// ReduceMean over constant axes (attribute, or input 1 from opset 18) as oneDNN's reduction over plain memory;
// keepdims 0 is the same bytes under the squeezed dims.
void Builder::reduce_mean(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const Dims xd = dims_of(n.in[0]);
  const int64_t rank = static_cast<int64_t>(xd.size());
  Dims axes = n.ais("axes", {});
  if (n.in.size() > 1 && !n.in[1].empty()) {
    const ConstT* c = cst(n.in[1]);
    if (!c) throw Reject{"non-constant axes"};
    for (int64_t k = 0; k < c->count(); ++k) axes.push_back(static_cast<int64_t>(c->at(k)));
  }
  if (axes.empty()) {
    if (n.ai("noop_with_empty_axes", 0) != 0) throw Reject{"noop_with_empty_axes"};
    for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
  }
  Dims kept = xd;
  for (int64_t a : axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) throw Reject{"axis out of range"};
    kept[a] = 1;
  }
  if (numel(kept) == numel(xd)) throw Reject{"nothing to reduce"};
  const Val& xv = val(n.in[0]);
  if (xv.scale != 1.f) throw Reject{"scaled input"};
  Val sv = as_plain(n.in[0]);
  const md_t src = plain_md(xd), dst = plain_md(kept);
  dnnl::reduction::desc d(alg::reduction_mean, src, dst, 0.f, 0.f);
  dnnl::reduction::primitive_desc pd(d, user_scratchpad(), engine());
  Val& o = define(n.out[0], plain_md(dims_of(n.out[0])));
  dnnl::memory dm = mem_at(dst, o.buf, o.off);
  exec(dnnl::reduction(pd), {{DNNL_ARG_SRC, mem_of(sv)}, {DNNL_ARG_DST, dm}});
}

void Builder::layernorm(size_t i, const std::string& x, const std::string& out, const ConstT* scale,
                        const ConstT* shift, float eps) {
  (void)i;
  Dims xd = dims_of(x);
  const int64_t D = xd.back();
  if (!scale || scale->count() != D || (shift && shift->count() != D)) throw Reject{"scale/bias size"};
  Val sv = as_plain(x);
  md_t md = plain_md(xd);
  auto flags = dnnl::normalization_flags::use_scale;
  if (shift) flags |= dnnl::normalization_flags::use_shift;
  dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_inference, md, eps, flags);
  dnnl::layer_normalization_forward::primitive_desc pd(d, user_scratchpad(), engine());
  std::unordered_map<int, dnnl::memory> args;
  auto vec = [&](const ConstT* c) {
    p_->owned.emplace_back(md_t({D}, dt::f32, tag::a), engine());
    float* p = static_cast<float*>(p_->owned.back().get_data_handle());
    for (int64_t k = 0; k < D; ++k) p[k] = static_cast<float>(c->at(k));
    return p_->owned.back();
  };
  args[DNNL_ARG_SCALE] = vec(scale);
  if (shift) args[DNNL_ARG_SHIFT] = vec(shift);
  args[DNNL_ARG_SRC] = mem_of(sv);
  Val& o = define(out, md);
  args[DNNL_ARG_DST] = mem_of(o);
  exec(dnnl::layer_normalization_forward(pd), std::move(args));
}

// A LayerNormalization node over the last axis with constant scale (and bias), without Mean/InvStdDev outputs.
void Builder::layernorm_node(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  const ConstT* s = cst(n.in_at(1));
  const ConstT* b = n.in_at(2).empty() ? nullptr : cst(n.in_at(2));
  if (!s || (!n.in_at(2).empty() && !b)) throw Reject{"non-constant scale or bias"};
  int64_t axis = n.ai("axis", -1), rank = static_cast<int64_t>(dims_of(n.in[0]).size());
  if (axis < 0) axis += rank;
  if (axis != rank - 1) throw Reject{"axis other than the last"};
  if (n.out.size() > 1) throw Reject{"Mean/InvStdDev outputs"};
  layernorm(i, n.in[0], n.out[0], s, b, n.af("epsilon", 1e-5f));
}

}  // namespace keel::onednn::chain
