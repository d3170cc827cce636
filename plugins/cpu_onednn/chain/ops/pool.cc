// plugins/cpu_onednn/chain/ops/pool.cc — MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool.
#include "chain/builder.h"

namespace keel::onednn::chain {

void Builder::pool(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims x = dims_of(n.in[0]);
  // 2-D and 3-D (1-D ones arrive lifted to 2-D: lift_1d).
  if (x.size() != 4 && x.size() != 5) throw Reject{"2-D and 3-D pooling only"};
  if (n.out.size() > 1 && !n.out[1].empty()) throw Reject{"Indices output"};
  const size_t sp = x.size() - 2;
  const bool global = n.op.rfind("Global", 0) == 0, mx = n.op.find("Max") != std::string::npos;
  Dims k(x.begin() + 2, x.end()), s(sp, 1), dl(sp, 1), pl(sp, 0), pr(sp, 0), out(sp, 1);
  if (!global) {
    k = n.ais("kernel_shape", {});
    s = n.ais("strides", Dims(sp, 1));
    dl = mx ? n.ais("dilations", Dims(sp, 1)) : Dims(sp, 1);
    Dims pads = n.ais("pads", Dims(2 * sp, 0));
    if (k.size() != sp || s.size() != sp || dl.size() != sp || pads.size() != 2 * sp) throw Reject{"attribute ranks"};
    if (mx && n.ai("storage_order", 0) != 0) throw Reject{"storage_order"};
    std::string ap = n.as("auto_pad", "NOTSET");
    if (ap != "NOTSET" && !ap.empty() && ap != "VALID") throw Reject{"auto_pad " + ap};
    if (ap != "VALID") pl.assign(pads.begin(), pads.begin() + sp), pr.assign(pads.begin() + sp, pads.end());
    bool ceil = n.ai("ceil_mode", 0) != 0;
    if (!mx && ceil && n.ai("count_include_pad", 0)) throw Reject{"ceil_mode with count_include_pad"};
    for (size_t j = 0; j < sp; ++j) {
      int64_t eff = (k[j] - 1) * dl[j] + 1;
      int64_t span = x[2 + j] + pl[j] + pr[j] - eff;
      if (span < 0 || s[j] <= 0) throw Reject{"bad geometry"};
      out[j] = 1 + (ceil ? (span + s[j] - 1) / s[j] : span / s[j]);
      if (ceil) pr[j] = std::max(pr[j], (out[j] - 1) * s[j] + eff - x[2 + j] - pl[j]);
    }
  }
  Dims y{x[0], x[1]};
  y.insert(y.end(), out.begin(), out.end());
  // A Pad folded into this pooling (pad): read its input, the Pad's pads added to the pooling's (counted by an
  // average: pad_foldable_into admits only that case).
  std::string src_name = n.in[0];
  const auto pf = global ? pad_folds_.end() : pad_folds_.find(n.in[0]);
  if (pf != pad_folds_.end()) {
    src_name = pf->second.in;
    for (size_t j = 0; j < sp; ++j) pl[j] += pf->second.begin[j], pr[j] += pf->second.end[j];
  }
  alg a = mx ? alg::pooling_max
             : (global || n.ai("count_include_pad", 0) || pf != pad_folds_.end() ? alg::pooling_avg_include_padding
                                                                                 : alg::pooling_avg_exclude_padding);
  const bool bytes = act_ == dt::u8 || act_ == dt::s8;
  if (bytes && pf != pad_folds_.end()) throw Reject{"a Pad folded into 1-byte pooling"};
  // 1-byte max pooling (fuse_qdq's, between int8 steps) reads channels-last: oneDNN's int8 pooling has no jit
  // kernel for the plain layout (ref:any, ~50x slower on SimpleCNN's [1000, 32, 26, 26]).
  const Val xv = bytes ? as_md(src_name, md_t(to_dnnl(x), act_, channels_last_tag(x.size()))) : val(src_name);
  if (bytes && mx && sp == 2 && int8_own_kernels()) {  // the plugin's own loop (steps/int8_pool.h)
    BytePoolShape bs;
    bs.n = x[0], bs.c = x[1], bs.h = x[2], bs.w = x[3], bs.oh = y[2], bs.ow = y[3];
    bs.kh = k[0], bs.kw = k[1], bs.sh = s[0], bs.sw = s[1], bs.dh = dl[0], bs.dw = dl[1], bs.pt = pl[0], bs.pl = pl[1];
    bs.s8 = act_ == dt::s8;
    Exec e;
    e.own = run_int8_pool;
    e.own_kind = "pooling";
    e.params = std::make_shared<const BytePoolShape>(bs);
    e.args = {{DNNL_ARG_SRC, mem_of(xv)},
              {DNNL_ARG_DST, mem_of(define(n.out[0], md_t(to_dnnl(y), act_, channels_last_tag(y.size()))))}};
    exec_own(std::move(e), "own_int8_maxpool:avx512", false, n.name + " " + dims_str(x) + " -> " + dims_str(y));
    return;
  }
  // Activations after the pool (Relu, Clip, LeakyRelu, Sigmoid, Tanh, SiLU, hard-swish) run as its eltwise post-ops.
  Fusion f;
  f.out = n.out[0];
  for (; !bytes;) {
    bool hard = false;
    if (size_t m = silu_after(f.out, &hard);
        m != npos && add_eltwise(&f.po, hard ? alg::eltwise_hardswish : alg::eltwise_swish, hard ? 0.f : 1.f, 0.f)) {
      f.nodes.push_back(users(f.out)[0] == m ? users(f.out)[1] : users(f.out)[0]);
      f.nodes.push_back(m);
      f.out = r_.nodes[m].out[0];
      continue;
    }
    size_t u = sole_user(f.out);
    if (u == npos || r_.nodes[u].out.size() != 1 || r_.nodes[u].in[0] != f.out || !eltwise_po(r_.nodes[u], &f.po))
      break;
    f.nodes.push_back(u);
    f.out = r_.nodes[u].out[0];
  }
  // Max pooling of nChw16c floats without padding, nothing fused after it, at 2+ threads: the own step split by output
  // rows (the rows the convolutions before it wrote on each core) instead of oneDNN's split by channel blocks, whose
  // threads read half their source from the other core (at 1 thread oneDNN's kernel is the faster).
  if (mx && sp == 2 && !bytes && act_ == dt::f32 && f.nodes.empty() && pf == pad_folds_.end() && p_->threads > 1 &&
      options().maxpool_rows && has_avx512f() && dl == Dims{1, 1} && pl == Dims{0, 0} && pr == Dims{0, 0} &&
      xv.md == md_t(to_dnnl(x), dt::f32, tag::nChw16c)) {
    PoolArgShape ps;
    ps.n = x[0], ps.c = x[1], ps.h = x[2], ps.w = x[3], ps.kh = k[0], ps.kw = k[1], ps.sh = s[0], ps.sw = s[1];
    ps.oh = y[2], ps.ow = y[3], ps.block = 16;
    Exec e;
    e.own = run_max_pool16;
    e.own_kind = "pooling";
    e.params = std::make_shared<const PoolArgShape>(ps);
    e.args = {{DNNL_ARG_SRC, mem_of(xv)},
              {DNNL_ARG_DST, mem_of(define(n.out[0], md_t(to_dnnl(y), dt::f32, tag::nChw16c)))}};
    exec_own(std::move(e), "own_maxpool_rows:avx512", false, n.name + " " + dims_str(x) + " -> " + dims_str(y));
    return;
  }
  dnnl::primitive_attr attr = user_scratchpad();
  attr.set_post_ops(f.po);
  dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, a, xv.md, md_t(to_dnnl(y), act_, tag::any),
                                   to_dnnl(s), to_dnnl(k), dnnl_dilations(dl), to_dnnl(pl), to_dnnl(pr));
  dnnl::pooling_v2_forward::primitive_desc pd;
  try {
    pd = dnnl::pooling_v2_forward::primitive_desc(d, attr, engine());
  } catch (const dnnl::error&) {  // no pooling with these post-ops: the activations run as their own steps
    f.nodes.clear();
    f.out = n.out[0];
    pd = dnnl::pooling_v2_forward::primitive_desc(d, user_scratchpad(), engine());
  }
  Val sv = bytes ? xv : as_md(src_name, pd.src_desc());
  Val& o = define(f.out, pd.dst_desc());
  dnnl::memory sm = mem_of(sv), dm = mem_of(o);
  exec(dnnl::pooling_v2_forward(pd), {{DNNL_ARG_SRC, sm}, {DNNL_ARG_DST, dm}});
  for (size_t k2 : f.nodes) done_[k2] = true;
}

}  // namespace keel::onednn::chain
