// plugins/cpu_onednn/chain/builder.h — (internal) the Builder: turns a Recipe into a Plan, node by node,
// choosing layouts, fusing post-ops (chain/fusion.cc) and building each op (chain/ops/*.cc, dispatched through the
// table in chain/ops/table.cc). A Builder is used once, by one thread.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>

#include "chain/ops/table.h"
#include "chain/plan.h"

namespace keel::onednn::chain {

struct Val {
  md_t md;
  int buf = -1;
  uint64_t off = 0;
  float scale = 1.f;     // a pending scalar factor (a Mul/Div folded into the consumer MatMul)
  std::string scale_of;  // the value it scales
};

inline bool is_plain_dense(const md_t& md) {
  if (md.data.format_kind != dnnl_blocked) return false;
  if (md.data.format_desc.blocking.inner_nblks != 0) return false;
  const int n = md.data.ndims;
  int64_t s = 1;
  for (int i = n - 1; i >= 0; --i) {
    if (md.data.dims[i] != 1 && md.data.format_desc.blocking.strides[i] != s) return false;
    s *= md.data.dims[i];
  }
  return md.data.offset0 == 0;
}
inline bool is_strided(const md_t& md) {
  return md.data.format_kind == dnnl_blocked && md.data.format_desc.blocking.inner_nblks == 0;
}
inline Dims md_dims(const md_t& md) { return Dims(md.data.dims, md.data.dims + md.data.ndims); }
inline Dims md_strides(const md_t& md) {
  return Dims(md.data.format_desc.blocking.strides, md.data.format_desc.blocking.strides + md.data.ndims);
}
// Whether a strided md lays its dims out densely in some order (a permuted plain layout: no gaps, no offset): that
// order, outermost first, in *order (dims of 1 wherever their strides sort them).
inline bool dense_order(const md_t& md, Dims* order) {
  if (!is_strided(md) || md.data.offset0 != 0) return false;
  const Dims d = md_dims(md), st = md_strides(md);
  Dims idx(d.size());
  for (size_t k = 0; k < idx.size(); ++k) idx[k] = static_cast<int64_t>(k);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return st[x] > st[y]; });
  int64_t expect = 1;
  for (size_t k = idx.size(); k-- > 0;) {
    const auto j = static_cast<size_t>(idx[k]);
    if (d[j] == 1) continue;
    if (st[j] != expect) return false;
    expect *= d[j];
  }
  *order = std::move(idx);
  return true;
}
inline md_t strided_md(const Dims& d, const Dims& strides, dt t = dt::f32) {
  if (d.empty()) return md_t({1}, t, tag::a);
  return md_t(to_dnnl(d), t, to_dnnl(strides));
}
// The same layout with another data type (a Cast between f32 and bf16 keeps its input's layout).
inline md_t with_dtype(const md_t& md, dt t) {
  dnnl_memory_desc_t d = md.data;
  d.data_type = static_cast<dnnl_data_type_t>(t);
  return md_t(d);
}
inline size_t elem_size(const md_t& md) { return dnnl_data_type_size(md.data.data_type); }
// A pooling's output extent over `in` positions (window k, stride st, padding before / after; floor or ceil), as
// Builder::pool computes it; 0 where the window does not fit or the stride is not positive. For the steps that fuse
// a pooling into the convolution before it (conv_pool_fused, qconv_stem).
inline int64_t pooled_extent(int64_t in, int64_t k, int64_t st, int64_t before, int64_t after, bool ceil) {
  const int64_t span = in + before + after - k;
  return span < 0 || st < 1 ? 0 : 1 + (ceil ? (span + st - 1) / st : span / st);
}
// B [K, N] (or [N, K] when trans_b) of a Gemm reading a flattened [N, C, H, W] value as it lies in memory
// (flatten_into_gemm): the rows (K = C*H*W index) reordered to that memory's order, nhwc or nChw16c.
template <typename T>
std::vector<T> flat_fold_rows(const T* src, const Dims& x, bool nhwc, int64_t N, bool trans_b) {
  const int64_t C = x[1], HW = x[2] * x[3], K = C * HW;
  std::vector<T> perm(static_cast<size_t>(K * N));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t p = 0; p < HW; ++p) {
      const int64_t from = c * HW + p;
      const int64_t to = nhwc ? p * C + c : ((c / 16) * HW + p) * 16 + c % 16;
      for (int64_t j = 0; j < N; ++j) {
        if (trans_b) perm[j * K + to] = src[j * K + from];
        else perm[to * N + j] = src[from * N + j];
      }
    }
  return perm;
}
inline std::string impl_of(const dnnl::primitive& p) {
  const char* impl = nullptr;
  dnnl_primitive_desc_query(p.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
  return impl ? impl : "?";
}

// Plain weights' format tag by spatial rank (the activations' tags by rank are in common/common.h).
inline tag weights_tag(size_t spatial, bool grouped, bool transposed) {
  if (spatial == 3) return grouped ? (transposed ? tag::giodhw : tag::goidhw) : (transposed ? tag::iodhw : tag::oidhw);
  return grouped ? (transposed ? tag::giohw : tag::goihw) : (transposed ? tag::iohw : tag::oihw);
}
// ONNX dilations (1 = dense) as oneDNN's (0 = dense).
inline dnnl::memory::dims dnnl_dilations(const Dims& d) {
  dnnl::memory::dims r;
  for (int64_t v : d) r.push_back(v - 1);
  return r;
}
inline int64_t prod(const Dims& d) {
  int64_t p = 1;
  for (int64_t v : d) p *= v;
  return p;
}

// Where the chain takes the few-row product (steps/skinny_gemm.h) for a MatMul/Gemm (Builder::skinny_gemm): 32 to 64
// rows and constant weights of 8 MiB or more, which come from memory at every run (docs/ONEDNN_PERFORMANCE.md,
// "(skinny)"); for a convolution (Builder::conv_skinny) from 1.5 MiB of weights: ResNet-50's layer4 1x1s (2048 x 512,
// 4 MiB) ran at 78% of the FMA peak on oneDNN's jit_1x1, 88% on the step ("(skc)"); MobileNetV2's last 1x1 (320 x
// 1280 with ReLU6, 1.6 MB) 10-15% faster on the step at 1 thread, level at 2 ("(xdw7)").
constexpr int64_t kSkinnyMinRows = 32, kSkinnyMinWeightBytes = int64_t{8} << 20,
                  kSkinnyConvMinWeightBytes = int64_t{3} << 19;

// Thrown when a node of the claim cannot be built: the claim is retried without it.
struct NodeReject {
  size_t node;
  std::string why;
};

class Builder {
 public:
  // time_convs off (the claim's plan, built before the session's team is known): convolutions take oneDNN's first
  // implementation instead of timing the candidates, which the plan records in Plan::deferred.
  explicit Builder(const Recipe& r, bool time_convs = true) : r_(r), time_convs_(time_convs) {}

  std::unique_ptr<Plan> build();

  // The table of ops a chain takes, with their build functions (chain/ops/table.cc).
  friend const std::vector<ChainOp>& chain_ops();

 private:
  // --- values and buffers
  int new_buf(uint64_t bytes) {
    Buf b;
    b.bytes = (bytes + 63) / 64 * 64;
    p_->bufs.push_back(b);
    return static_cast<int>(p_->bufs.size()) - 1;
  }
  void touch(int buf) {
    if (buf < 0) return;
    Buf& b = p_->bufs[buf];
    int step = static_cast<int>(p_->execs.size());
    b.first = std::min(b.first, step);
    b.last = std::max(b.last, step);
  }
  // The buffers of a step's arguments touched at the step itself (the one about to be added), wherever their memory
  // objects were made: mem_at touches a buffer at the step current when it is called, and a builder that binds a
  // source and then emits a reorder or copy (a residual placed in the destination) would otherwise end the source's
  // life before the step that reads it, and the buffer plan could give its memory to the destination.
  void touch_args(const std::unordered_map<int, dnnl::memory>& args) {
    for (const auto& [arg, m] : args)
      for (auto b = p_->binds.rbegin(); b != p_->binds.rend(); ++b)
        if (b->mem.get() == m.get()) {
          touch(b->buf);
          break;
        }
  }
  // A memory object over a value's data (bound at run time), touching its buffer at the current step.
  dnnl::memory mem_of(const Val& v) { return mem_at(v.md, v.buf, v.off); }
  dnnl::memory mem_at(const md_t& md, int buf, uint64_t off) {
    if (buf >= 0 && p_->bufs[buf].kind == BufKind::kOwned)  // constants: their own memory, never rebound
      return dnnl::memory(md, engine(), static_cast<char*>(owned_of_buf_[buf].get_data_handle()) + off);
    dnnl::memory m(md, engine(), DNNL_MEMORY_NONE);
    p_->binds.push_back({m, buf, off});
    touch(buf);
    return m;
  }
  Val& define(const std::string& name, const md_t& md, int buf = -2) {
    auto known = r_.dims.find(name);
    if (known != r_.dims.end() && known->second != md_dims(md))
      throw Reject{"'" + name + "': computed shape " + dims_str(md_dims(md)) + " differs from the inferred " +
                   dims_str(known->second)};
    Val v;
    v.md = md;
    v.buf = buf == -2 ? new_buf(md.get_size()) : buf;
    // A part of a channel concatenation (batch 1, nChw16c, 16-aligned channels): written in place in the
    // concatenation's buffer, so the Concat costs nothing.
    auto part = concat_parts_.find(name);
    if (buf == -2 && part != concat_parts_.end() && md.data.ndims == 4 &&
        md == md_t(md.dims(), concat_buf_types_.at(part->second.first), tag::nChw16c)) {
      p_->bufs.pop_back();
      v.buf = part->second.first;
      v.off = part->second.second;
      placed_parts_.insert(name);
    }
    p_->bufs[v.buf].values++;
    vals_[name] = v;
    return vals_[name];
  }
  // A reorder step's primitive. Like every primitive of a chain, its scratchpad (when it needs one) is user-managed:
  // bound in each run's workspace (bind_scratchpads), never a library-managed one that the primitive owns and that
  // two concurrent runs of the session would share.
  static dnnl::reorder reorder_prim(const dnnl::memory& from, const dnnl::memory& to) {
    return dnnl::reorder(dnnl::reorder::primitive_desc(from, to, user_scratchpad()));
  }
  // Memory-bound steps (reorders, element-wise, normalisation, softmax, pooling, ...) touching under 1 MiB run on
  // one thread: the work takes microseconds, a team's barrier can take a scheduler slice on a busy machine.
  // (They pick their split at run time; convolutions and matmuls keep the team they were created for.)
  void exec(dnnl::primitive prim, std::unordered_map<int, dnnl::memory> args) {
    touch_args(args);
    p_->impls.push_back(impl_of(prim));
    exec_layout_.push_back(layout_reorder_);
    {
      std::string w = cur_node_ < r_.nodes.size() ? r_.nodes[cur_node_].name : std::string("(outputs)");
      auto s = args.find(DNNL_ARG_SRC);
      if (s == args.end()) s = args.find(DNNL_ARG_FROM);
      auto d = args.find(DNNL_ARG_DST);
      if (d == args.end()) d = args.find(DNNL_ARG_TO);
      if (s != args.end()) w += " " + dims_str(md_dims(s->second.get_desc()));
      if (d != args.end()) w += " -> " + dims_str(md_dims(d->second.get_desc()));
      p_->what.push_back(std::move(w));
    }
    auto kind = prim.get_kind();
    uint64_t bytes = 0;
    for (auto& [arg, m] : args) bytes += m.get_desc().get_size();
    bool single =
        kind != dnnl::primitive::kind::convolution && kind != dnnl::primitive::kind::matmul && bytes < (1u << 20);
    p_->execs.push_back({std::move(prim), std::move(args), single, nullptr, nullptr, nullptr});
  }
  // A step of the plugin's own (Exec::own set, with its args), named `impl` in profiles and logs, `what` its line
  // there; `layout`: whether it only moves data between layouts (as exec()'s layout reorders).
  void exec_own(Exec e, const char* impl, bool layout, std::string what) {
    touch_args(e.args);
    p_->impls.push_back(impl);
    exec_layout_.push_back(layout);
    p_->what.push_back(std::move(what));
    p_->execs.push_back(std::move(e));
  }
  // An own step's constants: `floats` floats of weights in the plan's weight arena, filled by pack(pointer), as its
  // WEIGHTS argument, and (unless null) a copy of `bias` as its BIAS argument.
  template <class Pack>
  void own_weights(Exec& e, size_t floats, Pack&& pack, const std::vector<float>* bias) {
    p_->owned.emplace_back(md_t({static_cast<int64_t>(floats)}, dt::f32, tag::a), engine(),
                           p_->weights.alloc(floats * sizeof(float)));
    pack(static_cast<float*>(p_->owned.back().get_data_handle()));
    e.args[DNNL_ARG_WEIGHTS] = p_->owned.back();
    if (!bias) return;
    p_->owned.emplace_back(md_t({static_cast<int64_t>(bias->size())}, dt::f32, tag::a), engine());
    std::memcpy(p_->owned.back().get_data_handle(), bias->data(), bias->size() * sizeof(float));
    e.args[DNNL_ARG_BIAS] = p_->owned.back();
  }
  // An own step's scratch (its SCRATCHPAD argument, bound by bind_scratchpads): `per_thread` floats for each of the
  // plan's threads, in the run's region for own steps.
  void team_scratch(Exec& e, size_t per_thread) { e.run_scratch = std::max<size_t>(per_thread, 16) * sizeof(float); }
  // The value as it is now (a constant gets an owned plain memory the first time it is read as data).
  const Val& val(const std::string& name) {
    auto it = vals_.find(name);
    if (it != vals_.end()) return it->second;
    auto c = r_.consts.find(name);
    if (c == r_.consts.end() || c->second.dtype != KEEL_DTYPE_F32)
      throw Reject{"value '" + name + "' is not available"};
    Val v;
    v.md = plain_md(c->second.dims, dt::f32);
    p_->owned.emplace_back(v.md, engine());
    std::memcpy(p_->owned.back().get_data_handle(), c->second.bytes.data(), c->second.bytes.size());
    if (act_ != dt::f32) {  // read by a bf16 node: converted once
      dnnl::memory f = p_->owned.back();
      v.md = plain_md(c->second.dims);
      p_->owned.emplace_back(v.md, engine());
      dnnl::reorder(f, p_->owned.back()).execute(stream(), f, p_->owned.back());
      stream().wait();
    }
    Buf b;
    b.kind = BufKind::kOwned;
    p_->bufs.push_back(b);
    v.buf = static_cast<int>(p_->bufs.size()) - 1;
    owned_of_buf_[v.buf] = p_->owned.back();
    vals_[name] = v;
    return vals_[name];
  }
  // The value in layout `want` (a reorder into a new buffer the first time; shared by later readers).
  Val as_md(const std::string& name, const md_t& want) {
    const Val& v = val(name);
    if (v.scale != 1.f) throw Reject{"a scaled view read by an op that cannot scale"};
    if (v.md == want) return v;
    std::string key = name + "#" +
                      std::to_string(std::hash<std::string>()(
                          std::string(reinterpret_cast<const char*>(&want.data), sizeof want.data)));
    auto it = vals_.find(key);
    if (it != vals_.end()) return it->second;
    Val src = v;
    Val& dst = define(key, want);
    copy_of_[key] = name;
    dnnl::memory s = mem_of(src), d = mem_of(dst);
    layout_reorder_ = true;
    exec(reorder_prim(s, d), {{DNNL_ARG_FROM, s}, {DNNL_ARG_TO, d}});
    layout_reorder_ = false;
    return dst;
  }
  Val as_plain(const std::string& name) { return as_md(name, plain_md(dims_of(name))); }
  Dims dims_of(const std::string& name) {
    auto it = vals_.find(name);
    if (it != vals_.end()) return md_dims(it->second.md);
    auto c = r_.consts.find(name);
    if (c != r_.consts.end()) return c->second.dims;
    auto d = r_.dims.find(name);
    if (d != r_.dims.end()) return d->second;
    throw Reject{"shape of '" + name + "' unknown"};
  }
  const ConstT* cst(const std::string& name) const {
    auto it = r_.consts.find(name);
    return it == r_.consts.end() ? nullptr : &it->second;
  }
  bool is_const(const std::string& name) const { return !name.empty() && r_.consts.count(name) > 0; }
  // Consumers of a value among the claim's nodes (node indices), and whether it leaves the claim.
  const std::vector<size_t>& users(const std::string& v) {
    static const std::vector<size_t> none;
    auto it = users_.find(v);
    return it == users_.end() ? none : it->second;
  }
  bool escapes(const std::string& v) const { return outputs_.count(v) > 0; }
  // True when `v`'s memory may be overwritten by node `at`: a workspace value that nobody reads after `at`, nor
  // any other value in its buffer (views of it: the Transpose of a residual that an in-projection read).
  bool dead_after(const std::string& v, size_t at) {
    if (escapes(v) || !vals_.count(v)) return false;
    const Val& x = vals_[v];
    if (x.buf < 0 || p_->bufs[x.buf].kind != BufKind::kWorkspace) return false;
    auto read_later = [&](const std::string& w) {
      if (escapes(w)) return true;
      for (size_t u : users(w))
        if (u != at && !done_[u]) return true;
      return false;
    };
    if (p_->bufs[x.buf].values == 1) return !read_later(v);
    if (!options().view_post_ops) return false;
    // Every value in the buffer, and for a layout copy (as_md) the value it copies: a view of a reordered copy
    // (Unsqueeze, Squeeze) overwritten in place while the original was read again later, through the same copy, gave
    // wrong results (random chain `conv -> Unsqueeze -> Squeeze -> Mul(scalar) -> Add(with the conv)`).
    for (const auto& [name, w] : vals_) {
      if (w.buf != x.buf) continue;
      auto src = copy_of_.find(name);
      if (read_later(name) || (src != copy_of_.end() && read_later(src->second))) return false;
    }
    return true;
  }
  // The single consumer of `v` that may be fused into its producer, or npos.
  size_t sole_user(const std::string& v) {
    if (escapes(v)) return npos;
    const auto& u = users(v);
    if (u.size() != 1 || done_[u[0]]) return npos;
    // The value must be read by that node once, as its data input (not as two operands).
    const NodeDesc& n = r_.nodes[u[0]];
    int reads = 0;
    for (const auto& i : n.in) reads += i == v;
    return reads == 1 ? u[0] : npos;
  }
  static constexpr size_t npos = static_cast<size_t>(-1);
  // A Transpose's permutation of a rank-`rank` input (the default reverses the dims); empty where it does not fit the
  // rank or repeats or leaves a dim.
  static Dims perm_of(const NodeDesc& t, size_t rank) {
    Dims perm = t.ais("perm", {});
    if (perm.empty())
      for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
    std::vector<bool> seen(rank, false);
    if (perm.size() != rank) return {};
    for (int64_t k : perm) {
      if (k < 0 || k >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(k)]) return {};
      seen[static_cast<size_t>(k)] = true;
    }
    return perm;
  }
  // A value of dims `y` read only by a Transpose (a valid perm, default reversed): its producer may write the
  // transposed layout directly, so that the Transpose costs nothing (matmul(), attention()). Returns the Transpose
  // (npos if none) with the transposed dims in *yt and, in *ys, the strides of `y` whose transposed view is dense.
  size_t sole_transpose(const std::string& v, const Dims& y, Dims* yt, Dims* ys) {
    const size_t tr = sole_user(v);
    if (tr == npos) return npos;
    const NodeDesc& t = r_.nodes[tr];
    const Dims perm = perm_of(t, y.size());
    if (t.op != "Transpose" || t.out.size() != 1 || t.in[0] != v || perm.empty()) return npos;
    yt->resize(y.size());
    for (size_t k = 0; k < y.size(); ++k) (*yt)[k] = y[perm[k]];
    const Dims st = dense_strides(*yt);
    ys->resize(y.size());
    for (size_t k = 0; k < y.size(); ++k) (*ys)[perm[k]] = st[k];
    return tr;
  }
  // Whether every reader of `v` is a keel.Attention, directly or through Transposes (and `v` stays in the claim); with
  // `merged` (one flag per dim of `v`), also whether each attention reads the flagged dims as batch dims, not as its
  // rows or columns (an atom view's merged dims: shape.cc reshape_like).
  bool read_by_attention_only(const std::string& v, const std::vector<bool>* merged = nullptr) {
    if (escapes(v) || users(v).empty()) return false;
    for (size_t u : users(v)) {
      const NodeDesc& n = r_.nodes[u];
      if (n.op == "Attention") {
        if (merged)
          for (size_t d = merged->size() >= 2 ? merged->size() - 2 : 0; d < merged->size(); ++d)
            if ((*merged)[d]) return false;
        continue;
      }
      if (n.op != "Transpose" || n.out.size() != 1) return false;
      std::vector<bool> permuted;
      if (merged) {
        const Dims perm = perm_of(n, merged->size());
        if (perm.empty()) return false;
        for (int64_t p : perm) permuted.push_back((*merged)[static_cast<size_t>(p)]);
      }
      if (!read_by_attention_only(n.out[0], merged ? &permuted : nullptr)) return false;
    }
    return true;
  }
  // When `v` is read only by Sigmoid(v) and by Mul(v, that sigmoid) (the sigmoid read by nothing else): the Mul.
  // With `hard`, also hard-swish as torch exports it below opset 14 (and tf2onnx always): Mul(v, HardSigmoid(v))
  // with alpha 1/6 and beta 0.5, oneDNN's eltwise_hardswish; *hard then says which of the two was found.
  size_t silu_after(const std::string& v, bool* hard = nullptr) {
    if (escapes(v)) return npos;
    const auto& u = users(v);
    if (u.size() != 2 || done_[u[0]] || done_[u[1]]) return npos;
    for (int k = 0; k < 2; ++k) {
      const NodeDesc& sg = r_.nodes[u[k]];
      const NodeDesc& m = r_.nodes[u[1 - k]];
      const bool hs = hard && sg.op == "HardSigmoid" && std::fabs(sg.af("alpha", 0.2f) - 1.f / 6.f) < 1e-6f &&
                      sg.af("beta", 0.5f) == 0.5f;
      if ((sg.op != "Sigmoid" && !hs) || m.op != "Mul" || sg.in.size() != 1 || sg.out.size() != 1 || m.in.size() != 2 ||
          m.out.size() != 1)
        continue;
      if (hard) *hard = hs;
      const std::string& s = sg.out[0];
      if (escapes(s) || users(s).size() != 1 || users(s)[0] != u[1 - k]) continue;
      if ((m.in[0] == v && m.in[1] == s) || (m.in[0] == s && m.in[1] == v)) return u[1 - k];
    }
    return npos;
  }

  // --- post-op fusion
  struct Fusion {
    dnnl::post_ops po;
    std::string out;                        // the value the fused op finally writes
    std::string sum_with;                   // residual added by a sum post-op
    std::vector<float> conv_bias_add;       // per-channel constant added (conv)
    std::vector<float> bn_scale, bn_shift;  // conv: folded BatchNormalization
    std::vector<float> mm_bias;             // matmul: constant bias over the last axis
    float out_scale = 1.f;                  // matmul: scalar applied before the bias
    bool silu_pass = false;                 // conv: a trailing SiLU runs as the chain's own step (take_silu)
    bool gelu_pass = false;                 // matmul, conv: a trailing GELU runs as the chain's own step (take_gelu)
    bool gelu_tanh = false;                 // ... and it is the tanh approximation
    // An activation left to a pass after the primitive: a path whose kernel applies the post-ops itself refuses.
    bool pass_after() const { return silu_pass || gelu_pass; }
    bool viewed = false;  // matmul: `out` is a view of the product with other dims (same_order_view)
    // matmul: `out` is the product [N,H,W,C] permuted to [N,C,H,W] (channels_first_view): defined as that strided
    // view of the product's memory, the residual summed in that layout.
    bool permuted = false;
    std::vector<float> col_scale;  // matmul: per-column factor of the product, folded into its constant weights
    bool dst_f32 = false;          // matmul: a bf16 product written in f32 (a Cast to float fused)
    std::vector<size_t> nodes;     // fused nodes
    int count = 0;
  };
  bool eltwise_of(const NodeDesc& n, alg* a, float* alpha, float* beta);
  bool eltwise_po(const NodeDesc& n, dnnl::post_ops* po);
  static bool eltwise_fits(const dnnl::post_ops& po, alg a, float alpha, float beta);
  static bool add_eltwise(dnnl::post_ops* po, alg a, float alpha, float beta);
  Fusion fuse_after(const std::string& out, size_t at, bool conv, int64_t channels);
  bool same_order_view(const NodeDesc& n, const std::string& in);
  bool channels_first_view(const NodeDesc& n, const std::string& in);
  bool take_silu(Fusion& f);
  void exec_silu(const Val& v, const std::string& name);
  bool take_gelu(Fusion& f);
  void exec_gelu(const Val& v, bool tanh);
  bool take_trailing_eltwise(Fusion& f, alg a);

  // --- ops
  void conv(size_t i);
  void deconv(size_t i);
  void conv_like_tail(size_t i, const Fusion& f, dnnl::primitive prim, const md_t& src_md, const md_t& wei_md,
                      const md_t& dmd, const md_t& wplain, std::vector<float>& w, bool has_bias,
                      const std::vector<float>& bias, double flops, std::unordered_map<int, dnnl::memory> extra = {},
                      const std::string& src = {}, const std::string& chan_scale = {});
  bool fold_channel_scale(size_t i);
  bool conv_as_gemv(size_t i, const Fusion& f, const std::vector<float>& w, bool has_bias,
                    const std::vector<float>& bias);
  dnnl::memory exec_scale_weights(const dnnl::memory& wmem, const md_t& wplain, const std::string& chan_scale);
  // Mul outputs folded into their 1x1 convolution (fold_channel_scale): output -> (the data, the [1,C,1,1] scale).
  std::map<std::string, std::pair<std::string, std::string>> se_folds_;
  // Flattens read as they lie (flatten_into_gemm): output -> the [N,C,H,W] input's dims and whether it is nhwc
  // (else nChw16c); the Gemm reading it takes its constant B with rows in that memory order.
  std::map<std::string, std::pair<Dims, bool>> flat_folds_;
  bool flatten_into_gemm(size_t i, const Dims& x, const Dims& y);
  bool qconv_stem(size_t i, const QuantSetup& q, const QConvGeom& g, const Dims& x, const Dims& y, const int8_t* w);
  bool qconv_expand_dw(size_t i, const QuantSetup& q, const QConvGeom& g, const Dims& x, const Dims& y,
                       const int8_t* w);
  bool conv_residual_merged(size_t i);
  bool conv_pool_fused(size_t i);
  bool conv_grouped4(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y, int64_t stride,
                     const std::vector<float>& w, const std::vector<float>& bias, double flops);
  static bool sum_relu_of(const Fusion& f, bool* sum, bool* relu, float* relu_max = nullptr);
  bool conv_skinny(size_t i, const Fusion& f, Im2RowShape rows, const std::vector<std::string>& srcs, int64_t M,
                   const std::vector<float>& w, const std::vector<float>& bias, double flops);
  bool conv_wino4(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                  const std::vector<float>& w, const std::vector<float>& bias, double flops, const Wino4Shape& mode,
                  bool pick_f2 = false);
  size_t wino_few_tiles_pick(const Wino4Shape& s, const std::vector<float>& w);
  bool conv_pointwise(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y,
                      const std::vector<float>& w, const std::vector<float>& bias, double flops);
  bool conv_dilated_phases(size_t i, const Fusion& f, const std::string& src, const Dims& x, const Dims& y, int64_t dil,
                           const md_t& wany, const md_t& bmd, const dnnl::primitive_attr& attr, const md_t& wplain,
                           std::vector<float>& w, bool has_bias, const std::vector<float>& bias, double flops);
  // The 3x3 or 5x5 depthwise convolution (padding k / 2, stride 1 or 2, constant f32 weights [M,1,k,k]) that is the
  // sole reader of a 1x1 convolution's output, with its own fusion and its weights and bias with that fusion's folds
  // applied.
  struct DwReader {
    size_t node = 0;
    int64_t k = 3, stride = 1;
    Fusion fusion;
    std::vector<float> w, bias;  // [M][k*k], [M]
  };
  bool dw_reader_of(const Fusion& f, int64_t M, DwReader* d);
  // A convolution's constant weights W ([M][...]) and bias B (null: zeros) with fusion f's BatchNormalization and
  // bias-add folds applied, into *w and *bias [M].
  static void folded_weights(const Fusion& f, const ConstT& W, const ConstT* B, int64_t M, std::vector<float>* w,
                             std::vector<float>* bias);
  bool conv_dw_fused(size_t i, const Fusion& f, const md_t& src, const md_t& wany, const md_t& bmd,
                     const std::vector<float>& w, const std::vector<float>& bias, double flops);
  bool conv_expand_dw(size_t i, const Fusion& f, const std::string& src, const Dims& x, const std::vector<float>& w,
                      const std::vector<float>& bias, double flops, bool stem = false);
  // A 1x1 convolution projecting a value, with at most a residual sum and an activation (conv_expand_dw).
  struct Projection {
    size_t node = 0;
    int64_t out_channels = 0;
    bool residual = false;
    dnnl::post_ops act_po;  // the fusion's post-ops after the residual sum
    Fusion fusion;
    std::vector<float> w, bias;  // [P][M], [P]
  };
  bool projection_of(const std::string& v, int64_t M, const std::string& residual_src, const Dims& rdims,
                     int64_t stride, Projection* p);
  // A depthwise convolution whose output goes through SiLU as one step of the chain's own (steps/dwsilu.h), the
  // SiLU of its source too when its producer left that to it (defer_silu: deferred_silu_ holds those values).
  bool dw_silu_plan(size_t u, DwSiluShape* s, Fusion* f);
  bool defer_silu(const std::string& v, const md_t& md);
  bool conv_dw_silu(size_t i);
  bool conv_dw_ln(size_t i);
  std::set<std::string> deferred_silu_;
  bool se_excite_fused(size_t i);
  void matmul(size_t i);
  bool narrow_gemm(size_t i, const Fusion& f, const std::string& an, const Dims& a, const Dims& y, const ConstT* bc,
                   bool trans_b, float weight_scale);
  bool skinny_gemm(size_t i, const Fusion& f, const std::string& an, const Dims& a, const Dims& y, const float* w,
                   bool w_transposed, const std::function<Val&()>& place_output);
  void pool(size_t i);
  void eltwise(size_t i);
  void binary(size_t i);
  void concat(size_t i);
  void batchnorm(size_t i);
  void softmax(size_t i);
  void reduce_mean(size_t i);
  void attention(size_t i);
  void layernorm_node(size_t i);  // LayerNormalization: checks its attributes, then layernorm()
  void layernorm(size_t i, const std::string& x, const std::string& out, const ConstT* scale, const ConstT* shift,
                 float eps);
  void reshape_like(size_t i);
  void transpose(size_t i);
  void slice(size_t i);
  void pad(size_t i);
  // A Pad folded into the padding of every node reading it (pad): its output -> (its input, the spatial pads added
  // at the start and at the end of each spatial axis). The Pad's output has no memory of its own.
  struct PadFold {
    std::string in;
    Dims begin, end;
  };
  std::map<std::string, PadFold> pad_folds_;
  bool pad_foldable_into(size_t u, const std::string& v, const std::string& src, const Dims& begin, const Dims& end,
                         float value);
  bool non_negative(const std::string& v) const;
  void resize(size_t i);
  // --- int8 steps (keel.QConv / keel.QGemm; defined in the int8 section below)
  void qconv(size_t i);
  void qgemm(size_t i);
  void qdq(size_t i);
  QNodeView qnode_view(const NodeDesc& n) const;
  bool qconv_x_only(const std::string& v, size_t rank);
  Val residual_last(const std::string& name, const Dims& y);
  // The buffer of a destination (descriptor dmd) that a sum post-op adds to, holding `v` (`name`'s value, in dmd's
  // layout) first: `name`'s own buffer when `v` is it and nobody reads it after node `at`, else a copy of `v`.
  int sum_destination(const std::string& name, const Val& v, const md_t& dmd, size_t at);
  // Node i's destination buffer under fusion f: sum_destination's for f's residual (f.sum_with), else -2 (new).
  int residual_destination(size_t i, const Fusion& f, const md_t& dmd);
  Val quantized(const std::string& name, const QuantSetup& q, const md_t& want);
  dnnl::memory zero_point_mem(int32_t v);
  md_t boundary_md(const std::string& name, const Dims& d, dt t) const;
  void outputs();
  void bind_scratchpads();
  void plan_workspace();

  void plan_concats();
  void plan_concat_prefixes();
  dt concat_type(const NodeDesc& n) const;

  // The data type the node being built computes in (its output's: f32 or bf16). Unqualified plain_md() in the
  // Builder makes memory of that type; constants (f32 here) are converted to it when read as data.
  dt act_ = dt::f32;
  md_t plain_md(const Dims& d, dt t) const { return ::keel::onednn::plain_md(d, t); }
  md_t plain_md(const Dims& d) const { return plain_md(d, act_); }
  void cast(size_t i);

  const Recipe& r_;
  bool time_convs_ = true;
  std::unique_ptr<Plan> p_;
  std::map<std::string, std::pair<int, uint64_t>> concat_parts_;  // concat input -> (buffer, byte offset)
  std::map<int, dt> concat_buf_types_;                            // concat buffer -> its element type
  std::map<std::string, int> concat_bufs_;                        // concat output -> its buffer
  std::set<std::string> placed_parts_;
  std::map<std::string, Val> vals_;
  // Values that no one memory descriptor describes, read only by keel.Attention through Transposes (a batched q/k/v
  // slice of a packed in-projection split into heads: steps/attention.h reshape_atoms): the Val's md is the strided
  // view of the atoms; here the dims the graph gives the value and, per dim, the atoms (md dims) it merges.
  struct AtomView {
    Dims dims;
    std::vector<Dims> groups;
  };
  std::map<std::string, AtomView> atom_views_;
  // as_md's copies of values in another layout (their keys in vals_) -> the value each copies: a copy serves every
  // later reader of that value, so its buffer is live as long as the value is read (dead_after).
  std::map<std::string, std::string> copy_of_;
  std::map<std::string, std::vector<size_t>> users_;
  std::set<std::string> outputs_;
  std::vector<bool> done_;
  std::map<int, dnnl::memory> owned_of_buf_;
  size_t cur_node_ = static_cast<size_t>(-1);  // the node being built (for the profile's step names)
  bool layout_reorder_ = false;                // the exec being added is a layout change (as_md)
  std::vector<bool> exec_layout_;              // per exec: a layout change
  void label_steps(size_t node, size_t first_exec, const std::vector<bool>& done_before);
};

}  // namespace keel::onednn::chain
