// plugins/cpu_onednn/chain/ops/concat.cc — Concat.
#include "chain/builder.h"

namespace keel::onednn::chain {

void Builder::concat(size_t i) {
  const NodeDesc& n = r_.nodes[i];
  Dims y = dims_of(n.out[0]);
  if (auto cb = concat_bufs_.find(n.out[0]); cb != concat_bufs_.end()) {
    bool all = true;
    for (const auto& in : n.in) all = all && placed_parts_.count(in) && vals_.count(in) && vals_[in].scale == 1.f;
    if (all) {
      // Every input already sits in its slice: the output is that buffer.
      Val v;
      v.md = md_t(to_dnnl(y), concat_buf_types_.at(cb->second), tag::nChw16c);
      v.buf = cb->second;
      p_->bufs[v.buf].values++;
      vals_[n.out[0]] = v;
      return;
    }
  }
  int64_t axis = n.ai("axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(y.size());
  std::vector<md_t> mds;
  std::vector<Val> srcs;
  bool blocked = true;
  for (const auto& in : n.in) {
    if (in.empty() || numel(dims_of(in)) == 0) throw Reject{"empty input"};
    const Val& v = val(in);
    if (v.scale != 1.f) throw Reject{"scaled input"};
    blocked = blocked && !is_strided(v.md);
  }
  md_t first = val(n.in[0]).md;
  bool all_blocked = true;
  for (const auto& in : n.in) {
    const Val& v = val(in);
    all_blocked = all_blocked && blocked && axis == 1 &&
                  v.md.data.format_desc.blocking.inner_nblks == first.data.format_desc.blocking.inner_nblks &&
                  v.md.data.dims[1] % 16 == 0;
  }
  if (!all_blocked) {
    // ShuffleNet's channel shuffle after the Concat of its g halves (C/g channels each): Reshape [N,g,C/g,H,W] ->
    // Transpose(0,2,1,3,4) -> Reshape [N,C,H,W]. Each source is reordered straight into its interleaved channels of
    // the shuffled output (source k's channel j is channel j*g+k): one reorder per source, none for the shuffle.
    auto sole = [&](const std::string& v, const char* op) -> size_t {
      const size_t u = sole_user(v);
      return u != npos && r_.nodes[u].op == op && r_.nodes[u].out.size() == 1 && r_.nodes[u].in[0] == v ? u : npos;
    };
    // Reorders source `in` into buffer `obuf` at `byte_off`, through a view of the output with strides `strides`.
    auto place = [&](const std::string& in, const Dims& strides, int obuf, uint64_t byte_off) {
      Val sv = val(in);
      if (sv.md.data_type() != act_) throw Reject{"Concat of mixed dtypes"};
      dnnl::memory sm = mem_of(sv), dm = mem_at(strided_md(dims_of(in), strides, act_), obuf, byte_off);
      exec(reorder_prim(sm, dm), {{DNNL_ARG_FROM, sm}, {DNNL_ARG_TO, dm}});
    };
    const int64_t g = static_cast<int64_t>(n.in.size());
    const size_t r1 = sole(n.out[0], "Reshape"), tr = r1 == npos ? npos : sole(r_.nodes[r1].out[0], "Transpose"),
                 r2 = tr == npos ? npos : sole(r_.nodes[tr].out[0], "Reshape");
    bool shuffle = r2 != npos && axis == 1 && y.size() == 4 && g > 1 && y[1] % g == 0;
    if (shuffle) {
      shuffle = dims_of(r_.nodes[r1].out[0]) == Dims{y[0], g, y[1] / g, y[2], y[3]} &&
                r_.nodes[tr].ais("perm", {}) == Dims{0, 2, 1, 3, 4} && dims_of(r_.nodes[r2].out[0]) == y;
      for (const auto& in : n.in) shuffle = shuffle && dims_of(in) == Dims{y[0], y[1] / g, y[2], y[3]};
    }
    if (shuffle) {
      Val& o = define(r_.nodes[r2].out[0], plain_md(y));
      const int obuf = o.buf;
      const uint64_t ooff = o.off;
      const size_t esize = elem_size(o.md);
      const int64_t hw = y[2] * y[3];
      const Dims ds{y[1] * hw, g * hw, y[3], 1};
      for (int64_t k = 0; k < g; ++k)
        place(n.in[static_cast<size_t>(k)], ds, obuf, ooff + static_cast<uint64_t>(k * hw) * esize);
      done_[r1] = done_[tr] = done_[r2] = true;
      return;
    }
    // A plain output, each source reordered straight into its slice (any layout in, a strided view of the output
    // out): oneDNN's concat over plain memory is its simple kernel, measured 10x slower than the reorders (ShuffleNet's
    // [1,58,28,28] halves: 0.15 ms against 0.014 ms each), and it needed its sources plain first.
    Val& o = define(n.out[0], plain_md(y));
    const int obuf = o.buf;
    const uint64_t ooff = o.off;
    const Dims ys = md_strides(o.md);
    const size_t esize = elem_size(o.md);
    uint64_t at = 0;  // elements into the output
    for (const auto& in : n.in) {
      place(in, ys, obuf, ooff + at * esize);
      at += static_cast<uint64_t>(dims_of(in)[axis] * ys[axis]);
    }
    return;
  }
  for (const auto& in : n.in) {
    // One layout for every source: the first one's, all blocked alike.
    const Val& v = val(in);
    md_t want = v.md;
    srcs.push_back(as_md(in, want));
    mds.push_back(want);
  }
  dnnl::concat::primitive_desc pd(static_cast<int>(axis), mds, engine(), user_scratchpad());
  Val& o = define(n.out[0], pd.dst_desc());
  std::unordered_map<int, dnnl::memory> args;
  for (size_t k = 0; k < srcs.size(); ++k) args[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(k)] = mem_of(srcs[k]);
  args[DNNL_ARG_DST] = mem_of(o);
  exec(dnnl::concat(pd), std::move(args));
}

}  // namespace keel::onednn::chain
