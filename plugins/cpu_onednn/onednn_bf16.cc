// plugins/cpu_onednn/onednn_bf16.cc — the bf16 inference kernels that a mixed-precision graph (convert_precision,
// `keel run --precision bf16`) needs besides the bf16 Conv/Gemm/MatMul/Relu/MaxPool/Cast of onednn_train.cc, so that
// ResNet-18, MobileNetV2 and the transformer encoder stay on oneDNN in bf16 instead of bouncing to the reference
// kernels: binary ops with broadcasting (Add, Sub, Mul, Div, Max, Min), pooling (Average, GlobalAverage,
// GlobalMax), BatchNormalization (inference), LayerNormalization (last axis), Softmax/LogSoftmax, unary eltwise ops
// (Clip, LeakyRelu, Sigmoid, Tanh, HardSwish, keel.Gelu (erf or tanh), Abs, Neg, Elu), Concat and Transpose; and Conv
// and keel.FusedConv with constant weights prepacked once (inference; bias, residual and activation as post-ops).
//
// Tensors are bf16 on the graph's plain row-major layout; oneDNN computes in f32 inside each primitive (softmax and
// normalisation statistics included). Normalisation parameters (BatchNormalization scale/bias/mean/var,
// LayerNormalization scale/bias) arrive in bf16 (or f32) and are widened to the f32 vectors oneDNN wants, per run
// (they are [C] / [D] vectors). Each kernel rejects what it does not handle and the core falls back to the reference
// kernels, which are the oracle tests/device_conformance checks these against (its bf16 cases).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "onednn_common.h"

namespace keel::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;

inline float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A plan: one primitive with plain memories bound per run, and f32 copies of small parameter inputs.
struct Plan {
  Dims out_dims;
  dnnl::primitive prim;
  std::vector<std::pair<int, int>> in_args;  // (DNNL_ARG_*, input index), bound directly
  std::vector<dnnl::memory> in_mems;
  std::vector<std::pair<int, int>> f32_args;  // (DNNL_ARG_*, input index), widened to f32 first
  std::vector<std::vector<float>> f32_bufs;
  std::vector<dnnl::memory> f32_mems;
  dnnl::memory dst;
  int dst_arg = DNNL_ARG_DST;
  std::unordered_map<int, dnnl::memory> args;
  bool empty = false;
};

class Bf16Kernel : public Kernel {
 public:
  void setup(Ctx& c) override {
    for (int i = 0; i < c.input_count() && i < bf16_inputs(); ++i)
      if (c.has_input(i) && c.dtype(i) != KEEL_DTYPE_BF16) throw Reject{"bf16 only"};
    if (c.output_dtype(0) != KEEL_DTYPE_BF16) throw Reject{"bf16 output only"};
    check(c);
    bool known = true;
    for (int i = 0; i < c.input_count(); ++i)
      if (c.has_input(i) && !c.dims_known(i)) known = false;
    if (known) {
      Plan& p = plans_.get(shape_key(c), [&] { return build_plan(c); });
      if (!p.empty) {
        const char* impl = nullptr;
        dnnl_primitive_desc_query(p.prim.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
        std::string name = impl ? impl : "";
        // oneDNN's own reference implementations are slower than Keel's reference kernels.
        if (name.rfind("ref", 0) == 0 || (reorder_ && name.rfind("simple:any", 0) == 0))
          throw Reject{"oneDNN would use its reference implementation (" + name + ")"};
      }
    }
  }
  void run(Ctx& c) override {
    Plan& p = plans_.get(shape_key(c), [&] { return build_plan(c); });
    keel_tensor_t* y = c.output(0, p.out_dims);
    if (p.empty) return;
    for (size_t i = 0; i < p.in_args.size(); ++i) bind(p.in_mems[i], c.input(p.in_args[i].second)->data);
    for (size_t i = 0; i < p.f32_args.size(); ++i) {
      const keel_tensor_t* t = c.input(p.f32_args[i].second);
      std::vector<float>& buf = p.f32_bufs[i];
      const int64_t n = numel(c.dims(p.f32_args[i].second));
      if (static_cast<int64_t>(buf.size()) != n) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "parameter size changed"};
      if (t->dtype == KEEL_DTYPE_F32) {
        std::memcpy(buf.data(), t->data, buf.size() * sizeof(float));
      } else if (t->dtype == KEEL_DTYPE_BF16) {
        const uint16_t* s = static_cast<const uint16_t*>(t->data);
        for (size_t k = 0; k < buf.size(); ++k) buf[k] = bf16_bits_to_f32(s[k]);
      } else {
        throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "parameters must be bf16 or f32"};
      }
    }
    bind(p.dst, y->data);
    auto& s = stream();
    p.prim.execute(s, p.args);
    s.wait();
  }

 protected:
  // How many leading inputs must be bf16 (the rest: parameters handled by the kernel).
  virtual int bf16_inputs() const { return 1 << 20; }
  virtual void check(const Ctx& c) = 0;
  virtual void build(const Ctx& c, Plan& p) = 0;
  bool reorder_ = false;  // Transpose: oneDNN's element-wise "simple:any" reorder is slower than the reference

  static void add_input(Plan& p, int arg, int input, const dnnl::memory::desc& md) {
    p.in_args.emplace_back(arg, input);
    p.in_mems.emplace_back(md, engine(), nullptr);
  }
  // A parameter vector of n elements (bf16 or f32 in the graph) given to oneDNN as f32.
  static void add_f32_param(Plan& p, int arg, int input, int64_t n) {
    p.f32_args.emplace_back(arg, input);
    p.f32_bufs.emplace_back(static_cast<size_t>(n));
    p.f32_mems.emplace_back(dnnl::memory::desc({n}, dt::f32, tag::a), engine(), p.f32_bufs.back().data());
  }

 private:
  std::unique_ptr<Plan> build_plan(const Ctx& c) {
    auto p = std::make_unique<Plan>();
    build(c, *p);
    if (numel(p->out_dims) == 0) {
      p->empty = true;
      return p;
    }
    for (size_t i = 0; i < p->in_args.size(); ++i) p->args[p->in_args[i].first] = p->in_mems[i];
    for (size_t i = 0; i < p->f32_args.size(); ++i) {
      p->f32_mems[i].set_data_handle(p->f32_bufs[i].data());
      p->args[p->f32_args[i].first] = p->f32_mems[i];
    }
    p->args[p->dst_arg] = p->dst;
    return p;
  }
  PlanCache<Plan> plans_;
};

dnnl::memory::desc bmd(const Dims& d) { return plain_md(d, dt::bf16); }

// ---------------------------------------------------------------------------------------------------- pooling

class PoolKernel : public Bf16Kernel {
 public:
  PoolKernel(bool max, bool global) : max_(max), global_(global) {}

 protected:
  void check(const Ctx& c) override {
    if (!c.rank_known(0)) throw Reject{"input rank unknown"};
    size_t rank = c.dims(0).size();
    if (rank < 3 || rank > 5) throw Reject{"rank " + std::to_string(rank)};
    if (c.output_count() > 1 && c.output_dtype(1) != KEEL_DTYPE_UNDEFINED) throw Reject{"Indices output"};
    if (!global_) {
      if (!c.has_attr_ints("kernel_shape")) throw Reject{"no kernel_shape"};
      if (c.attr_i("ceil_mode", 0)) throw Reject{"ceil_mode"};
      std::string ap = c.attr_s("auto_pad", "NOTSET");
      if (ap != "NOTSET" && !ap.empty() && ap != "VALID") throw Reject{"auto_pad " + ap};
      if (c.has_attr_ints("dilations")) {
        for (int64_t d : c.attr_ints("dilations", {}))
          if (d != 1) throw Reject{"dilations"};
      }
    }
  }
  void build(const Ctx& c, Plan& p) override {
    Dims x = c.dims(0);
    const size_t r = x.size() - 2;
    Dims k, s(r, 1), pl(r, 0), pr(r, 0), out(r);
    if (global_) {
      k.assign(x.begin() + 2, x.end());
      out.assign(r, 1);
    } else {
      k = c.attr_ints("kernel_shape", {});
      s = c.attr_ints("strides", Dims(r, 1));
      if (k.size() != r || s.size() != r) throw Reject{"attribute rank mismatch"};
      if (c.attr_s("auto_pad", "NOTSET") != "VALID") {
        Dims pads = c.attr_ints("pads", Dims(2 * r, 0));
        if (pads.size() != 2 * r) throw Reject{"pads rank"};
        for (size_t i = 0; i < r; ++i) pl[i] = pads[i], pr[i] = pads[i + r];
      }
      for (size_t i = 0; i < r; ++i) {
        int64_t span = x[2 + i] + pl[i] + pr[i] - k[i];
        if (span < 0) throw Reject{"kernel larger than the padded input"};
        out[i] = span / s[i] + 1;
      }
    }
    Dims y{x[0], x[1]};
    for (int64_t o : out) y.push_back(o);
    p.out_dims = y;
    if (numel(y) == 0 || numel(x) == 0) return;
    alg a = max_ ? alg::pooling_max
                 : (global_ || c.attr_i("count_include_pad", 0) ? alg::pooling_avg_include_padding
                                                                 : alg::pooling_avg_exclude_padding);
    dnnl::memory::desc src = bmd(x), dst = bmd(y);
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, a, src, dst, to_dnnl(s), to_dnnl(k),
                                     dnnl::memory::dims(r, 0), to_dnnl(pl), to_dnnl(pr));
    p.prim = dnnl::pooling_v2_forward(dnnl::pooling_v2_forward::primitive_desc(d, engine()));
    add_input(p, DNNL_ARG_SRC, 0, src);
    p.dst = dnnl::memory(dst, engine(), nullptr);
  }

 private:
  bool max_, global_;
};

// ----------------------------------------------------------------------------------------------- normalisation

// BatchNormalization (inference): bf16 X/Y, statistics and affine parameters in f32.
class BatchNormKernel : public Bf16Kernel {
 protected:
  int bf16_inputs() const override { return 1; }
  void check(const Ctx& c) override {
    if (c.attr_i("training_mode", 0) != 0) throw Reject{"training_mode"};
    if (c.input_count() != 5) throw Reject{"needs 5 inputs"};
    for (int i = 1; i < c.output_count(); ++i)
      if (c.output_dtype(i) != KEEL_DTYPE_UNDEFINED) throw Reject{"training outputs"};
    if (!c.rank_known(0) || c.dims(0).size() < 2 || c.dims(0).size() > 5) throw Reject{"input rank"};
    if (c.opset() < 9 && c.has_attr("spatial") && c.attr_i("spatial", 1) != 1) throw Reject{"spatial = 0"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    for (int i = 1; i < 5; ++i)
      if (c.dims(i) != Dims{x[1]}) throw Reject{"scale/bias/mean/var must be [C]"};
    dnnl::memory::desc src = bmd(x);
    dnnl::batch_normalization_forward::desc d(
        dnnl::prop_kind::forward_inference, src, c.attr_f("epsilon", 1e-5f),
        dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
            dnnl::normalization_flags::use_shift);
    p.prim = dnnl::batch_normalization_forward(dnnl::batch_normalization_forward::primitive_desc(d, engine()));
    add_input(p, DNNL_ARG_SRC, 0, src);
    add_f32_param(p, DNNL_ARG_SCALE, 1, x[1]);
    add_f32_param(p, DNNL_ARG_SHIFT, 2, x[1]);
    add_f32_param(p, DNNL_ARG_MEAN, 3, x[1]);
    add_f32_param(p, DNNL_ARG_VARIANCE, 4, x[1]);
    p.dst = dnnl::memory(src, engine(), nullptr);
  }
};

// LayerNormalization over the last axis (ai.onnx 17 and keel.LayerNormalization): bf16 X/Y, f32 statistics.
class LayerNormKernel : public Bf16Kernel {
 protected:
  int bf16_inputs() const override { return 1; }
  void check(const Ctx& c) override {
    if (!c.rank_known(0) || c.dims(0).empty()) throw Reject{"input rank"};
    int64_t rank = static_cast<int64_t>(c.dims(0).size());
    int64_t axis = c.attr_i("axis", -1);
    if (axis < 0) axis += rank;
    if (axis != rank - 1) throw Reject{"axis other than the last"};
    if (rank > 5) throw Reject{"rank > 5"};
    for (int i = 1; i < c.output_count(); ++i)
      if (c.output_dtype(i) != KEEL_DTYPE_UNDEFINED) throw Reject{"Mean/InvStdDev outputs"};
    if (c.attr_i("stash_type", 1) != 1) throw Reject{"stash_type"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    const int64_t D = x.back();
    auto vec_ok = [&](int i) { return numel(c.dims(i)) == D && c.dims(i).back() == D; };
    if (!vec_ok(1)) throw Reject{"Scale must have the normalised size"};
    const bool shift = c.input_count() > 2 && c.has_input(2);
    if (shift && !vec_ok(2)) throw Reject{"B must have the normalised size"};
    dnnl::memory::desc src = bmd(x);
    auto flags = dnnl::normalization_flags::use_scale;
    if (shift) flags |= dnnl::normalization_flags::use_shift;
    dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_inference, src, c.attr_f("epsilon", 1e-5f),
                                              flags);
    p.prim = dnnl::layer_normalization_forward(dnnl::layer_normalization_forward::primitive_desc(d, engine()));
    add_input(p, DNNL_ARG_SRC, 0, src);
    add_f32_param(p, DNNL_ARG_SCALE, 1, D);
    if (shift) add_f32_param(p, DNNL_ARG_SHIFT, 2, D);
    p.dst = dnnl::memory(src, engine(), nullptr);
  }
};

class SoftmaxKernel : public Bf16Kernel {
 public:
  explicit SoftmaxKernel(bool log) : log_(log) {}

 protected:
  void check(const Ctx& c) override {
    if (!c.rank_known(0) || c.dims(0).empty()) throw Reject{"input rank"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    const int64_t rank = static_cast<int64_t>(x.size());
    const bool legacy = c.opset() < 13;
    int64_t axis = c.attr_i("axis", legacy ? 1 : -1);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) throw Reject{"axis out of range"};
    Dims shape = x;
    int dnnl_axis = static_cast<int>(axis);
    if (legacy) {  // opset < 13: softmax over the flattened [outer, inner] view
      int64_t outer = 1, inner = 1;
      for (int64_t i = 0; i < axis; ++i) outer *= x[i];
      for (int64_t i = axis; i < rank; ++i) inner *= x[i];
      shape = {outer, inner};
      dnnl_axis = 1;
    }
    if (shape.size() > 6) throw Reject{"rank > 6"};
    dnnl::memory::desc md = bmd(shape);
    dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference,
                                     log_ ? alg::softmax_log : alg::softmax_accurate, md, md, dnnl_axis);
    p.prim = dnnl::softmax_v2_forward(dnnl::softmax_v2_forward::primitive_desc(d, engine()));
    add_input(p, DNNL_ARG_SRC, 0, md);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }

 private:
  bool log_;
};

// ----------------------------------------------------------------------------------------------------- unary

enum class Unary { kClip, kLeakyRelu, kSigmoid, kTanh, kHardSwish, kGelu, kAbs, kNeg, kElu };

class UnaryKernel : public Bf16Kernel {
 public:
  explicit UnaryKernel(Unary u) : u_(u) {}

 protected:
  int bf16_inputs() const override { return 1; }
  void check(const Ctx& c) override {
    switch (u_) {
      case Unary::kLeakyRelu: a_ = alg::eltwise_relu; alpha_ = c.attr_f("alpha", 0.01f); break;
      case Unary::kSigmoid: a_ = alg::eltwise_logistic; break;
      case Unary::kTanh: a_ = alg::eltwise_tanh; break;
      case Unary::kHardSwish: a_ = alg::eltwise_hardswish; break;
      case Unary::kAbs: a_ = alg::eltwise_abs; break;
      case Unary::kNeg: a_ = alg::eltwise_linear; alpha_ = -1.f; break;
      case Unary::kElu: a_ = alg::eltwise_elu; alpha_ = c.attr_f("alpha", 1.f); break;
      case Unary::kGelu: {
        const std::string approx = c.attr_s("approximate", "none");
        if (approx == "none") a_ = alg::eltwise_gelu_erf;
        else if (approx == "tanh") a_ = alg::eltwise_gelu_tanh;
        else throw Reject{"approximate = " + approx};
        break;
      }
      case Unary::kClip: {
        a_ = alg::eltwise_clip_v2;
        alpha_ = -FLT_MAX;
        beta_ = FLT_MAX;
        if (c.opset() < 11) {
          alpha_ = c.attr_f("min", -FLT_MAX);
          beta_ = c.attr_f("max", FLT_MAX);
        } else {
          for (int i = 1; i < 3 && i < c.input_count(); ++i) {
            if (!c.has_input(i)) continue;
            if (!c.is_constant(i) || numel(c.dims(i)) != 1) throw Reject{"Clip min/max not constant scalars"};
            float v;
            if (c.dtype(i) == KEEL_DTYPE_BF16) v = bf16_bits_to_f32(*c.data<uint16_t>(i));
            else if (c.dtype(i) == KEEL_DTYPE_F32) v = *c.data<float>(i);
            else throw Reject{"Clip bounds dtype"};
            (i == 1 ? alpha_ : beta_) = v;
          }
        }
        if (std::isnan(alpha_) || std::isnan(beta_)) throw Reject{"NaN bounds"};
        break;
      }
    }
    if (!c.rank_known(0)) throw Reject{"input rank unknown"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    dnnl::memory::desc md({numel(x)}, dt::bf16, tag::a);
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, a_, md, alpha_, beta_);
    p.prim = dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(d, engine()));
    add_input(p, DNNL_ARG_SRC, 0, md);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }

 private:
  Unary u_;
  alg a_ = alg::eltwise_relu;
  float alpha_ = 0.f, beta_ = 0.f;
};

// ----------------------------------------------------------------------------------------------------- binary

// Binary ops with numpy broadcasting; the first operand must have the output's shape (commutative ops swap).
class BinaryKernel : public Bf16Kernel {
 public:
  BinaryKernel(alg a, bool commutative) : a_(a), commutative_(commutative) {}

 protected:
  void check(const Ctx& c) override {
    if (c.input_count() != 2) throw Reject{"needs exactly 2 inputs"};
    if (!c.rank_known(0) || !c.rank_known(1)) throw Reject{"operand rank unknown"};
    if (c.opset() < 7 && c.attr_i("broadcast", 0) != 0) throw Reject{"legacy broadcast attribute"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims a = c.dims(0), b = c.dims(1);
    const size_t r = std::max<size_t>({a.size(), b.size(), 1});
    while (a.size() < r) a.insert(a.begin(), 1);
    while (b.size() < r) b.insert(b.begin(), 1);
    if (r > 6) throw Reject{"rank > 6"};
    Dims out(r);
    for (size_t i = 0; i < r; ++i) {
      if (a[i] != b[i] && a[i] != 1 && b[i] != 1) throw Reject{"shapes do not broadcast"};
      out[i] = a[i] == 1 ? b[i] : a[i];
    }
    p.out_dims = Dims(out.end() - static_cast<int64_t>(std::max(c.dims(0).size(), c.dims(1).size())), out.end());
    if (numel(out) == 0) return;
    int i0 = 0, i1 = 1;
    if (a != out) {
      if (!commutative_ || b != out) throw Reject{"the first operand broadcasts"};
      std::swap(a, b);
      std::swap(i0, i1);
    }
    dnnl::memory::desc m0 = bmd(a), m1 = bmd(b), md = bmd(out);
    dnnl::binary::desc d(a_, m0, m1, md);
    p.prim = dnnl::binary(dnnl::binary::primitive_desc(d, engine()));
    add_input(p, DNNL_ARG_SRC_0, i0, m0);
    add_input(p, DNNL_ARG_SRC_1, i1, m1);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }

 private:
  alg a_;
  bool commutative_;
};

// ------------------------------------------------------------------------------------------ concat, transpose

class ConcatKernel : public Bf16Kernel {
 protected:
  void check(const Ctx& c) override {
    if (c.input_count() < 1 || c.input_count() > 64) throw Reject{"input count"};
    for (int i = 0; i < c.input_count(); ++i)
      if (!c.has_input(i) || !c.rank_known(i)) throw Reject{"input rank unknown"};
    if (!c.has_attr("axis")) throw Reject{"no axis"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims first = c.dims(0);
    const int64_t rank = static_cast<int64_t>(first.size());
    if (rank == 0 || rank > 6) throw Reject{"rank"};
    int64_t axis = c.attr_i("axis", 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) throw Reject{"axis out of range"};
    Dims out = first;
    out[axis] = 0;
    std::vector<dnnl::memory::desc> mds;
    for (int i = 0; i < c.input_count(); ++i) {
      Dims d = c.dims(i);
      if (static_cast<int64_t>(d.size()) != rank) throw Reject{"ranks differ"};
      for (int64_t j = 0; j < rank; ++j)
        if (j != axis && d[j] != first[j]) throw Reject{"shapes differ off the axis"};
      if (numel(d) == 0) throw Reject{"empty input"};
      out[axis] += d[axis];
      mds.push_back(bmd(d));
    }
    p.out_dims = out;
    dnnl::memory::desc md = bmd(out);
    p.prim = dnnl::concat(dnnl::concat::primitive_desc(md, static_cast<int>(axis), mds, engine()));
    for (int i = 0; i < c.input_count(); ++i) add_input(p, DNNL_ARG_MULTIPLE_SRC + i, i, mds[i]);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }
};

// Transpose as a reorder from a permuted-strides view of the input to the plain output.
class TransposeKernel : public Bf16Kernel {
 public:
  TransposeKernel() { reorder_ = true; }

 protected:
  void check(const Ctx& c) override {
    if (!c.rank_known(0) || c.dims(0).empty() || c.dims(0).size() > 6) throw Reject{"rank"};
  }
  void build(const Ctx& c, Plan& p) override {
    Dims x = c.dims(0);
    const size_t r = x.size();
    Dims perm(r);
    for (size_t i = 0; i < r; ++i) perm[i] = static_cast<int64_t>(r - 1 - i);
    perm = c.attr_ints("perm", perm);
    if (perm.size() != r) throw Reject{"perm size"};
    Dims xs(r), out(r);
    int64_t st = 1;
    for (size_t i = r; i-- > 0;) xs[i] = st, st *= std::max<int64_t>(x[i], 1);
    dnnl::memory::dims view_strides(r);
    for (size_t i = 0; i < r; ++i) {
      if (perm[i] < 0 || perm[i] >= static_cast<int64_t>(r)) throw Reject{"perm out of range"};
      out[i] = x[perm[i]];
      view_strides[i] = xs[perm[i]];
    }
    p.out_dims = out;
    if (numel(out) == 0) return;
    dnnl::memory::desc src(to_dnnl(out), dt::bf16, view_strides), dst = bmd(out);
    p.prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), src, engine(), dst));
    add_input(p, DNNL_ARG_FROM, 0, src);
    p.dst = dnnl::memory(dst, engine(), nullptr);
    p.dst_arg = DNNL_ARG_TO;
  }
};


// ---------------------------------------------------------------------------------------------------- conv

// Conv (2-D) for inference with constant weights: forward_inference, weights reordered into the primitive's blocked
// layout once per plan instead of on every call (onednn_train.cc's bf16 Conv, which training needs with weights that
// change every step, reorders them each call). Registered before it, so it takes the constant-weight case first.
// Also keel.FusedConv (fusion/fusion.cc: Y = act(conv(X, W) + B + Z)): the residual Z as a sum post-op, the
// activation as an eltwise post-op, so a bf16 graph fused by fuse_conv_activation runs one primitive per conv.
class ConvKernel : public Kernel {
 public:
  explicit ConvKernel(bool fused = false) : fused_(fused) {}
  void setup(Ctx& c) override {
    if (fused_) read_activation(c);
    has_z_ = fused_ && c.input_count() > 3 && c.has_input(3);
    for (int i = 0; i < c.input_count(); ++i)
      if (c.has_input(i) && c.dtype(i) != KEEL_DTYPE_BF16) throw Reject{"bf16 only"};
    if (!c.is_constant(1) || !c.dims_known(1) || c.dims(1).size() != 4) throw Reject{"weights not constant 4-D"};
    if (c.has_input(2) && !c.is_constant(2)) throw Reject{"bias not constant"};
    if (!c.rank_known(0) || c.dims(0).size() != 4) throw Reject{"2-D only"};
    const std::string ap = c.attr_s("auto_pad", "NOTSET");
    if (ap != "NOTSET" && !ap.empty() && ap != "VALID") throw Reject{"auto_pad " + ap};
    group_ = c.attr_i("group", 1);
    strides_ = c.attr_ints("strides", {1, 1});
    dil_ = c.attr_ints("dilations", {1, 1});
    pads_ = ap == "VALID" ? Dims{0, 0, 0, 0} : c.attr_ints("pads", {0, 0, 0, 0});
    if (group_ <= 0 || strides_.size() != 2 || dil_.size() != 2 || pads_.size() != 4) throw Reject{"attributes"};
    has_bias_ = c.input_count() > 2 && c.has_input(2);
  }
  struct Plan {
    std::unique_ptr<dnnl::convolution_forward> prim;
    dnnl::memory z_user;
    std::unique_ptr<dnnl::reorder> z_reorder;
    dnnl::memory src_user, src, wei, dst_user, dst, bias;
    std::unique_ptr<dnnl::reorder> src_reorder, dst_reorder;
    Dims out;
  };
  void run(Ctx& c) override {
    Dims x = c.dims(0), w = c.dims(1);
    const int64_t M = w[0];
    if (x[1] != w[1] * group_ || M % group_ != 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "Conv: channels do not match"};
    Plan& p = plans_.get(shape_key(c), [&] {
      auto pl = std::make_unique<Plan>();
      Dims y = {x[0], M, 0, 0};
      for (int i = 0; i < 2; ++i) {
        int64_t eff = (w[2 + i] - 1) * dil_[i] + 1, span = x[2 + i] + pads_[i] + pads_[i + 2] - eff;
        if (span < 0) throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "Conv: kernel larger than the padded input"};
        y[2 + i] = span / strides_[i] + 1;
      }
      pl->out = y;
      Dims wei = group_ > 1 ? Dims{group_, M / group_, w[1], w[2], w[3]} : w;
      auto& eng = engine();
      dnnl::memory::desc src_any(to_dnnl(x), dt::bf16, tag::any), dst_any(to_dnnl(y), dt::bf16, tag::any),
          wei_any(to_dnnl(wei), dt::bf16, tag::any), bias_md({M}, dt::bf16, tag::a), none;
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, alg::convolution_direct, src_any, wei_any,
                                        has_bias_ ? bias_md : none, dst_any, to_dnnl(strides_),
                                        {dil_[0] - 1, dil_[1] - 1}, {pads_[0], pads_[1]}, {pads_[2], pads_[3]});
      dnnl::post_ops po;
      if (has_z_) po.append_sum(1.f);
      if (act_set_) po.append_eltwise(1.f, act_, act_alpha_, act_beta_);
      dnnl::primitive_attr attr;
      attr.set_post_ops(po);
      dnnl::convolution_forward::primitive_desc pd(d, attr, eng);
      pl->prim = std::make_unique<dnnl::convolution_forward>(pd);
      dnnl::memory::desc src_plain(to_dnnl(x), dt::bf16, tag::nchw), dst_plain(to_dnnl(y), dt::bf16, tag::nchw);
      pl->src_user = dnnl::memory(src_plain, eng, nullptr);
      pl->src = pd.src_desc() == src_plain ? pl->src_user : dnnl::memory(pd.src_desc(), eng);
      if (pd.src_desc() != src_plain) pl->src_reorder = std::make_unique<dnnl::reorder>(pl->src_user, pl->src);
      pl->dst_user = dnnl::memory(dst_plain, eng, nullptr);
      pl->dst = pd.dst_desc() == dst_plain ? pl->dst_user : dnnl::memory(pd.dst_desc(), eng);
      if (pd.dst_desc() != dst_plain) pl->dst_reorder = std::make_unique<dnnl::reorder>(pl->dst, pl->dst_user);
      if (has_z_) {
        if (c.dims(3) != y) throw Reject{"Z must have the output's shape"};
        pl->z_user = dnnl::memory(dst_plain, eng, nullptr);
        if (pd.dst_desc() != dst_plain) pl->z_reorder = std::make_unique<dnnl::reorder>(pl->z_user, pl->dst);
      }
      // The weights, once, in the primitive's layout.
      dnnl::memory w_user(dnnl::memory::desc(to_dnnl(wei), dt::bf16, group_ > 1 ? tag::goihw : tag::oihw), eng,
                          const_cast<void*>(c.input(1)->data));
      pl->wei = dnnl::memory(pd.weights_desc(), eng);
      dnnl::reorder(w_user, pl->wei).execute(stream(), w_user, pl->wei);
      if (has_bias_) pl->bias = dnnl::memory(bias_md, eng, const_cast<void*>(c.input(2)->data));
      stream().wait();
      return pl;
    });
    keel_tensor_t* out = c.output(0, p.out);
    bind(p.src_user, c.input(0)->data);
    bind(p.dst_user, out->data);
    auto& s = stream();
    if (p.src_reorder) p.src_reorder->execute(s, p.src_user, p.src);
    if (has_z_) {  // the sum post-op adds what dst holds: Z, in the primitive's layout
      bind(p.z_user, c.input(3)->data);
      if (p.z_reorder) p.z_reorder->execute(s, p.z_user, p.dst);
      else std::memmove(out->data, c.input(3)->data, static_cast<size_t>(numel(p.out)) * 2);
    }
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, p.wei}, {DNNL_ARG_DST, p.dst}};
    if (has_bias_) args[DNNL_ARG_BIAS] = p.bias;
    p.prim->execute(s, args);
    if (p.dst_reorder) p.dst_reorder->execute(s, p.dst, p.dst_user);
    s.wait();
  }

  void read_activation(const Ctx& c) {
    const std::string a = c.attr_s("activation", "");
    const keel_kernel_api_t* api = g_host->kernel;
    const float* pv = nullptr;
    size_t pn = 0;
    std::vector<float> params;
    if (api->attr_floats(c.raw(), "activation_params", &pv, &pn)) params.assign(pv, pv + pn);
    act_set_ = !a.empty();
    if (a.empty()) return;
    if (a == "Relu") act_ = alg::eltwise_relu;
    else if (a == "Sigmoid") act_ = alg::eltwise_logistic;
    else if (a == "Tanh") act_ = alg::eltwise_tanh;
    else if (a == "HardSwish") act_ = alg::eltwise_hardswish;
    else if (a == "Gelu") act_ = alg::eltwise_gelu_erf;
    else if (a == "LeakyRelu") act_ = alg::eltwise_relu, act_alpha_ = params.empty() ? 0.01f : params[0];
    else if (a == "Clip") {
      if (params.size() != 2) throw Reject{"Clip activation without {min, max}"};
      act_ = alg::eltwise_clip_v2, act_alpha_ = params[0], act_beta_ = params[1];
    } else {
      throw Reject{"activation " + a};
    }
  }

 private:
  bool fused_;
  int64_t group_ = 1;
  Dims strides_, dil_, pads_;
  bool has_bias_ = false, has_z_ = false, act_set_ = false;
  alg act_ = alg::eltwise_relu;
  float act_alpha_ = 0.f, act_beta_ = 0.f;
  PlanCache<Plan> plans_;
};

// ------------------------------------------------------------------------------------------------ registration

struct Bf16Info {
  const char* domain;
  const char* op_type;
  int32_t since_version;
  const char* name;
  Kernel* (*make)();
};

const std::vector<Bf16Info>& bf16_kernels() {
  using K = Kernel*;
  static const std::vector<Bf16Info> k = {
      {"", "Conv", 1, "onednn_bf16_conv_inference", []() -> K { return new ConvKernel(); }},
      {"keel", "FusedConv", 1, "onednn_bf16_keel_fusedconv", []() -> K { return new ConvKernel(true); }},
      {"", "Add", 7, "onednn_bf16_add", []() -> K { return new BinaryKernel(alg::binary_add, true); }},
      {"", "Sub", 7, "onednn_bf16_sub", []() -> K { return new BinaryKernel(alg::binary_sub, false); }},
      {"", "Mul", 7, "onednn_bf16_mul", []() -> K { return new BinaryKernel(alg::binary_mul, true); }},
      {"", "Div", 7, "onednn_bf16_div", []() -> K { return new BinaryKernel(alg::binary_div, false); }},
      {"", "Max", 8, "onednn_bf16_max", []() -> K { return new BinaryKernel(alg::binary_max, true); }},
      {"", "Min", 8, "onednn_bf16_min", []() -> K { return new BinaryKernel(alg::binary_min, true); }},
      {"", "AveragePool", 1, "onednn_bf16_averagepool", []() -> K { return new PoolKernel(false, false); }},
      {"", "GlobalAveragePool", 1, "onednn_bf16_globalaveragepool", []() -> K { return new PoolKernel(false, true); }},
      {"", "GlobalMaxPool", 1, "onednn_bf16_globalmaxpool", []() -> K { return new PoolKernel(true, true); }},
      {"", "BatchNormalization", 7, "onednn_bf16_batchnormalization", []() -> K { return new BatchNormKernel(); }},
      {"", "LayerNormalization", 17, "onednn_bf16_layernormalization", []() -> K { return new LayerNormKernel(); }},
      {"keel", "LayerNormalization", 1, "onednn_bf16_keel_layernormalization",
       []() -> K { return new LayerNormKernel(); }},
      {"", "Softmax", 1, "onednn_bf16_softmax", []() -> K { return new SoftmaxKernel(false); }},
      {"", "LogSoftmax", 1, "onednn_bf16_logsoftmax", []() -> K { return new SoftmaxKernel(true); }},
      {"", "Clip", 6, "onednn_bf16_clip", []() -> K { return new UnaryKernel(Unary::kClip); }},
      {"", "LeakyRelu", 6, "onednn_bf16_leakyrelu", []() -> K { return new UnaryKernel(Unary::kLeakyRelu); }},
      {"", "Sigmoid", 6, "onednn_bf16_sigmoid", []() -> K { return new UnaryKernel(Unary::kSigmoid); }},
      {"", "Tanh", 6, "onednn_bf16_tanh", []() -> K { return new UnaryKernel(Unary::kTanh); }},
      {"", "HardSwish", 14, "onednn_bf16_hardswish", []() -> K { return new UnaryKernel(Unary::kHardSwish); }},
      {"keel", "Gelu", 1, "onednn_bf16_keel_gelu", []() -> K { return new UnaryKernel(Unary::kGelu); }},
      {"", "Abs", 6, "onednn_bf16_abs", []() -> K { return new UnaryKernel(Unary::kAbs); }},
      {"", "Neg", 6, "onednn_bf16_neg", []() -> K { return new UnaryKernel(Unary::kNeg); }},
      {"", "Elu", 6, "onednn_bf16_elu", []() -> K { return new UnaryKernel(Unary::kElu); }},
      {"", "Concat", 4, "onednn_bf16_concat", []() -> K { return new ConcatKernel(); }},
      {"", "Transpose", 1, "onednn_bf16_transpose", []() -> K { return new TransposeKernel(); }},
  };
  return k;
}

const int32_t kBf16[] = {KEEL_DTYPE_BF16};

keel_status_t bf16_create(void* user_data, keel_kernel_context_t* ctx, void** out_state) {
  return create_kernel(static_cast<const Bf16Info*>(user_data)->make, ctx, out_state);
}
keel_status_t bf16_compute(void* state, keel_kernel_context_t* ctx) { return compute_kernel(state, ctx, false); }

}  // namespace

keel_status_t register_bf16_kernels(const keel_host_api_t* host, keel_plugin_handle_t* plugin) {
  for (const auto& info : bf16_kernels()) {
    keel_kernel_def_t def;
    std::memset(&def, 0, sizeof def);
    def.struct_size = sizeof def;
    def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
    def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
    def.name = info.name;
    def.domain = info.domain;
    def.op_type = info.op_type;
    def.since_version = info.since_version;
    def.end_version = 0;
    def.device_type = "cpu";
    keel_type_constraint_t tc{"T", kBf16, 1};
    def.constraints = &tc;
    def.constraint_count = 1;
    def.user_data = const_cast<Bf16Info*>(&info);
    def.create = bf16_create;
    def.compute = bf16_compute;
    def.release = release_kernel;
    if (keel_status_t st = host->register_kernel(plugin, &def)) return st;
  }
  return nullptr;
}

}  // namespace keel::onednn
