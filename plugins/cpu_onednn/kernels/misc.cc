// plugins/cpu_onednn/kernels/misc.cc — pooling (Max/Average/GlobalAverage/GlobalMax), BatchNormalization
// (inference), LayerNormalization (last axis), Softmax/LogSoftmax, element-wise unary ops, binary ops with
// broadcasting, Concat, Transpose (a reorder), ReduceMean/Sum/Max/Min and Pow (constant exponent), all on the graph's
// plain row-major layout: f32 here; the same kernels serve bf16 for kernels/bf16.cc (common/plain.h).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "common/plain.h"
#include "common/pool2x2.h"
#include "common/team.h"
#include "steps/silu.h"  // has_avx512f

namespace keel::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;

// The common shape of the kernels here: one primitive with plain memory objects bound per run, and (bf16 kernels)
// f32 copies of small parameter inputs.
struct PlainPlan {
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
  bool empty = false;  // zero-size output: nothing to run
};

// A kernel on tensors of one data type `dt_` (f32 or bf16).
class PlainKernel : public Kernel {
 public:
  explicit PlainKernel(dt d) : dt_(d) {}
  void setup(Ctx& c) override {
    const bool bf16 = dt_ == dt::bf16;
    const int32_t want = bf16 ? KEEL_DTYPE_BF16 : KEEL_DTYPE_F32;
    const int count = typed_inputs();
    for (int i = 0; i < c.input_count() && (count < 0 || i < count); ++i)
      if (c.has_input(i) && c.dtype(i) != want) throw Reject{bf16 ? "bf16 only" : "f32 only"};
    if (bf16 && c.output_dtype(0) != KEEL_DTYPE_BF16) throw Reject{"bf16 output only"};
    check(c);
    if (!uses_primitive()) return;
    bool known = true;
    for (int i = 0; i < c.input_count(); ++i)
      if (c.has_input(i) && !c.dims_known(i)) known = false;
    if (known) {
      PlainPlan& p = plans_.get(shape_key(c), [&] { return build_plan(c); });
      // oneDNN's reference implementations (ref:any, simple:any reorders) are slower than Keel's reference
      // kernels: leave those cases to them. (Only decidable at create time when the shapes are known.)
      if (!p.empty) {
        const char* impl = nullptr;
        dnnl_primitive_desc_query(p.prim.get_primitive_desc(), dnnl_query_impl_info_str, 0, &impl);
        std::string name = impl ? impl : "";
        if (slow_impl(name)) throw Reject{"oneDNN would use its reference implementation (" + name + ")"};
      }
    }
  }
  void run(Ctx& c) override {
    PlainPlan& p = plans_.get(shape_key(c), [&] { return build_plan(c); });
    keel_tensor_t* y = c.output(0, p.out_dims);
    if (p.empty) return;
    limit_threads_for(static_cast<double>(numel(p.out_dims)) + numel(c.dims(0)));
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
        for (size_t k = 0; k < buf.size(); ++k) buf[k] = bf16_to_f32(s[k]);
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
  // Implementations slower than Keel's reference kernels (oneDNN's own reference ones).
  virtual bool slow_impl(const std::string& impl) const { return impl.rfind("ref", 0) == 0; }
  // How many leading inputs must have the kernel's data type (-1 = all).
  virtual int typed_inputs() const { return -1; }
  // False when check() chose a path of the kernel's own for every shape: setup then builds no primitive.
  virtual bool uses_primitive() const { return true; }
  // Attribute checks at create (throw Reject).
  virtual void check(const Ctx& c) = 0;
  // Builds the primitive for the current input shapes: sets out_dims, prim, and calls add_input for each input.
  virtual void build(const Ctx& c, PlainPlan& p) = 0;

  // A plain row-major memory descriptor of the kernel's data type.
  dnnl::memory::desc typed_md(const Dims& d) const { return plain_md(d, dt_); }
  static void add_input(PlainPlan& p, int arg, int input, const dnnl::memory::desc& md) {
    p.in_args.emplace_back(arg, input);
    p.in_mems.emplace_back(md, engine(), nullptr);
  }
  // A parameter vector of n elements given to oneDNN as f32: bound as it is in an f32 kernel, widened from bf16 or
  // f32 per run in a bf16 one.
  void add_param(PlainPlan& p, int arg, int input, int64_t n) const {
    const dnnl::memory::desc vec({n}, dt::f32, tag::a);
    if (dt_ == dt::f32) return add_input(p, arg, input, vec);
    p.f32_args.emplace_back(arg, input);
    p.f32_bufs.emplace_back(static_cast<size_t>(n));
    p.f32_mems.emplace_back(vec, engine(), p.f32_bufs.back().data());
  }
  // Inputs after the first may be parameters of another type in a bf16 kernel (typed_inputs() for such kernels).
  int data_inputs_only() const { return dt_ == dt::f32 ? -1 : 1; }

  const dt dt_;

 private:
  std::unique_ptr<PlainPlan> build_plan(const Ctx& c) {
    auto p = std::make_unique<PlainPlan>();
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
  PlanCache<PlainPlan> plans_;
};

// ---------------------------------------------------------------------------------------------------- pooling

// ---------------------------------------------------------------------------------------------- 2x2 max pooling

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* placeholders (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// One output row of 2x2 / stride-2 max pooling: OW windows over rows r0 and r1 (each at least 2*OW wide) into y.
// Each window's maximum is its first maximum in the order a, b, c, d (top-left, top-right, bottom-left,
// bottom-right) with comparisons that are false on NaN: the reference kernel's choice, and the one MaxPoolGrad's
// 2x2 path (kernels/train.cc) sends the gradient to. The last < 16 windows with masked loads and stores.
__attribute__((target("avx512f"))) void max_pool2x2_row_f32(const float* r0, const float* r1, float* y, int64_t OW) {
  for (int64_t ow = 0; ow < OW; ow += 16) {
    const Windows2x2 w = load_windows_2x2(r0, r1, ow, std::min<int64_t>(16, OW - ow));
    __m512 m = _mm512_mask_mov_ps(w.a, _mm512_cmp_ps_mask(w.b, w.a, _CMP_GT_OQ), w.b);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(w.c, m, _CMP_GT_OQ), w.c);
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(w.d, m, _CMP_GT_OQ), w.d);
    _mm512_mask_storeu_ps(y + ow, w.kw, m);
  }
}

#pragma GCC diagnostic pop

class PoolKernel : public PlainKernel {
 public:
  PoolKernel(dt d, bool max, bool global) : PlainKernel(d), max_(max), global_(global) {}

  // f32 MaxPool with 2x2 windows, stride 2, no padding, dilation 1 (SimpleCNN's, LeNet's, VGG's) on AVX-512: the
  // rows above, one pass over the input. oneDNN's pooling over the plain layout took 0.77 ms for SimpleCNN's
  // [64, 32, 26, 26] at 1 thread (`KEEL_EAGER_PROFILE`, eager_bench), about 9 GB/s; the rest goes to the primitive.
  void run(Ctx& c) override {
    if (!pool2x2_) return PlainKernel::run(c);
    const Dims x = c.dims(0);
    const int64_t N = x[0], C = x[1], H = x[2], W = x[3], OH = H / 2, OW = W / 2;
    keel_tensor_t* out = c.output(0, Dims{N, C, OH, OW});
    if (N * C * OH * OW == 0) return;
    const float* xp = static_cast<const float*>(c.input(0)->data);
    float* yp = static_cast<float*>(out->data);
    const int64_t rows = N * C * OH;
    parallel_for(rows, [&](int64_t row) {
      const int64_t nc = row / OH, oh = row % OH;
      const float* r0 = xp + (nc * H + 2 * oh) * W;
      max_pool2x2_row_f32(r0, r0 + W, yp + row * OW, OW);
    });
  }

 protected:
  bool uses_primitive() const override { return !pool2x2_; }
  void check(const Ctx& c) override {
    if (!c.rank_known(0)) throw Reject{"input rank unknown"};
    size_t rank = c.dims(0).size();
    if (rank < 3 || rank > 5) throw Reject{"rank " + std::to_string(rank)};
    if (c.output_count() > 1 && c.output_dtype(1) != KEEL_DTYPE_UNDEFINED) throw Reject{"Indices output"};
    if (global_) return;
    if (!c.has_attr_ints("kernel_shape")) throw Reject{"no kernel_shape"};
    const std::string ap = c.attr_s("auto_pad", "NOTSET");
    pool2x2_ = has_avx512f() && dt_ == dt::f32 && max_ && rank == 4 && c.attr_ints("kernel_shape", {}) == Dims{2, 2} &&
               c.attr_ints("strides", Dims{1, 1}) == Dims{2, 2} && c.attr_ints("dilations", Dims{1, 1}) == Dims{1, 1} &&
               c.attr_ints("pads", Dims(4, 0)) == Dims(4, 0) && (ap == "NOTSET" || ap == "VALID" || ap.empty()) &&
               c.attr_i("ceil_mode", 0) == 0 && c.attr_i("storage_order", 0) == 0;
    if (dt_ == dt::bf16) {
      if (c.attr_i("ceil_mode", 0)) throw Reject{"ceil_mode"};
      if (ap != "NOTSET" && !ap.empty() && ap != "VALID") throw Reject{"auto_pad " + ap};
      if (c.has_attr_ints("dilations")) {
        for (int64_t d : c.attr_ints("dilations", {}))
          if (d != 1) throw Reject{"dilations"};
      }
      return;
    }
    if (!max_ && c.attr_i("ceil_mode", 0) && c.attr_i("count_include_pad", 0))
      throw Reject{"ceil_mode with count_include_pad"};
    if (max_ && c.attr_i("storage_order", 0) != 0) throw Reject{"storage_order"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    const size_t r = x.size() - 2;
    Dims in(x.begin() + 2, x.end());
    Dims k, s(r, 1), d(r, 1), pl(r, 0), pr(r, 0), out(r);
    if (global_) {
      k = in;
      out.assign(r, 1);
    } else {
      k = c.attr_ints("kernel_shape", {});
      s = c.attr_ints("strides", Dims(r, 1));
      d = max_ ? c.attr_ints("dilations", Dims(r, 1)) : Dims(r, 1);
      if (k.size() != r || s.size() != r || d.size() != r) throw Reject{"attribute rank mismatch"};
      const std::string auto_pad = c.attr_s("auto_pad", "NOTSET");
      const sdk::AutoPad ap = sdk::auto_pad_of(auto_pad);
      if (ap == sdk::AutoPad::kNotSet) {
        Dims pads = c.attr_ints("pads", Dims(2 * r, 0));
        if (pads.size() != 2 * r) throw Reject{"pads rank"};
        for (size_t i = 0; i < r; ++i) pl[i] = pads[i], pr[i] = pads[i + r];
      } else if (ap == sdk::AutoPad::kUnknown) {
        throw Reject{"auto_pad " + auto_pad};
      }
      bool ceil = c.attr_i("ceil_mode", 0) != 0;
      for (size_t i = 0; i < r; ++i) {
        const int64_t eff = sdk::dilated_extent(k[i], d[i]);
        if (sdk::is_same(ap)) sdk::same_pads(ap, in[i], eff, s[i], &pl[i], &pr[i]);
        out[i] = sdk::window_output(in[i], pl[i] + pr[i], eff, s[i], ceil);
        if (out[i] < 0) throw Reject{"kernel larger than the padded input"};
        // oneDNN checks out = (in + pl + pr - eff) / s + 1 with integer division; ceil_mode needs more padding.
        if (ceil) pr[i] = std::max(pr[i], (out[i] - 1) * s[i] + eff - in[i] - pl[i]);
      }
    }
    Dims y{x[0], x[1]};
    for (int64_t o : out) y.push_back(o);
    p.out_dims = y;
    if (numel(y) == 0 || numel(x) == 0) return;
    alg a = max_ ? alg::pooling_max
                 : (global_ || c.attr_i("count_include_pad", 0) ? alg::pooling_avg_include_padding
                                                                : alg::pooling_avg_exclude_padding);
    dnnl::memory::dims dil(r);
    for (size_t i = 0; i < r; ++i) dil[i] = d[i] - 1;
    dnnl::memory::desc src = typed_md(x), dst = typed_md(y);
    dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, a, src, dst, to_dnnl(s), to_dnnl(k), dil,
                                        to_dnnl(pl), to_dnnl(pr));
    dnnl::pooling_v2_forward::primitive_desc pd(desc, engine());
    p.prim = dnnl::pooling_v2_forward(pd);
    add_input(p, DNNL_ARG_SRC, 0, src);
    p.dst = dnnl::memory(dst, engine(), nullptr);
  }

 private:
  bool max_, global_;
  bool pool2x2_ = false;  // run() takes the AVX-512 2x2 path (set by check(), from the CPU and the attributes alone)
};

// ----------------------------------------------------------------------------------------------- normalisation

// BatchNormalization (inference). bf16: X/Y bf16, statistics and affine parameters bf16 or f32.
class BatchNormKernel : public PlainKernel {
 public:
  using PlainKernel::PlainKernel;

 protected:
  int typed_inputs() const override { return data_inputs_only(); }
  void check(const Ctx& c) override {
    if (c.attr_i("training_mode", 0) != 0) throw Reject{"training_mode"};
    if (c.input_count() != 5) throw Reject{"needs 5 inputs"};
    for (int i = 1; i < c.output_count(); ++i)
      if (c.output_dtype(i) != KEEL_DTYPE_UNDEFINED) throw Reject{"training outputs"};
    if (!c.rank_known(0) || c.dims(0).size() < 2 || c.dims(0).size() > 5) throw Reject{"input rank"};
    if (c.opset() < 9 && c.has_attr("spatial") && c.attr_i("spatial", 1) != 1) throw Reject{"spatial = 0"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    for (int i = 1; i < 5; ++i)
      if (c.dims(i) != Dims{x[1]}) throw Reject{"scale/bias/mean/var must be [C]"};
    float eps = c.attr_f("epsilon", 1e-5f);
    dnnl::memory::desc src = typed_md(x);
    dnnl::batch_normalization_forward::desc d(dnnl::prop_kind::forward_inference, src, eps,
                                              dnnl::normalization_flags::use_global_stats |
                                                  dnnl::normalization_flags::use_scale |
                                                  dnnl::normalization_flags::use_shift);
    dnnl::batch_normalization_forward::primitive_desc pd(d, engine());
    p.prim = dnnl::batch_normalization_forward(pd);
    add_input(p, DNNL_ARG_SRC, 0, src);
    add_param(p, DNNL_ARG_SCALE, 1, x[1]);
    add_param(p, DNNL_ARG_SHIFT, 2, x[1]);
    add_param(p, DNNL_ARG_MEAN, 3, x[1]);
    add_param(p, DNNL_ARG_VARIANCE, 4, x[1]);
    p.dst = dnnl::memory(src, engine(), nullptr);
  }
};

// LayerNormalization over the last axis (ai.onnx 17 and, bf16, keel.LayerNormalization); f32 statistics.
class LayerNormKernel : public PlainKernel {
 public:
  using PlainKernel::PlainKernel;

 protected:
  int typed_inputs() const override { return data_inputs_only(); }
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
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    const int64_t D = x.back();
    auto vec_ok = [&](int i) { return !c.dims(i).empty() && numel(c.dims(i)) == D && c.dims(i).back() == D; };
    if (!vec_ok(1)) throw Reject{"Scale must have the normalised size"};
    const bool shift = c.has_input(2);
    if (shift && !vec_ok(2)) throw Reject{"B must have the normalised size"};
    float eps = c.attr_f("epsilon", 1e-5f);
    dnnl::memory::desc src = typed_md(x);
    auto flags = dnnl::normalization_flags::use_scale;
    if (shift) flags |= dnnl::normalization_flags::use_shift;
    dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_inference, src, eps, flags);
    dnnl::layer_normalization_forward::primitive_desc pd(d, engine());
    p.prim = dnnl::layer_normalization_forward(pd);
    add_input(p, DNNL_ARG_SRC, 0, src);
    add_param(p, DNNL_ARG_SCALE, 1, D);
    if (shift) add_param(p, DNNL_ARG_SHIFT, 2, D);
    p.dst = dnnl::memory(src, engine(), nullptr);
  }
};

class SoftmaxKernel : public PlainKernel {
 public:
  SoftmaxKernel(dt d, bool log) : PlainKernel(d), log_(log) {}

 protected:
  void check(const Ctx& c) override {
    if (!c.rank_known(0) || c.dims(0).empty()) throw Reject{"input rank"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    int64_t rank = static_cast<int64_t>(x.size());
    bool legacy = c.opset() < 13;
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
    dnnl::memory::desc md = typed_md(shape);
    dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_inference,
                                     log_ ? alg::softmax_log : alg::softmax_accurate, md, md, dnnl_axis);
    dnnl::softmax_v2_forward::primitive_desc pd(d, engine());
    p.prim = dnnl::softmax_v2_forward(pd);
    add_input(p, DNNL_ARG_SRC, 0, md);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }

 private:
  bool log_;
};

// ----------------------------------------------------------------------------------------------------- unary

// The ONNX op a Unary computes.
const char* unary_op(Unary u) {
  static const char* const kOps[] = {"Relu", "LeakyRelu", "Elu",  "Sigmoid", "Tanh",     "Exp",  "Log",  "Sqrt",
                                     "Abs",  "HardSwish", "Clip", "Neg",     "Softplus", "Gelu", "Round"};
  return kOps[static_cast<int>(u)];
}

class UnaryKernel : public PlainKernel {
 public:
  UnaryKernel(dt d, Unary u) : PlainKernel(d), u_(u) {}

 protected:
  int typed_inputs() const override { return data_inputs_only(); }  // bf16 Clip: bounds bf16 or f32
  void check(const Ctx& c) override {
    const std::string approx = u_ == Unary::kGelu ? c.attr_s("approximate", "none") : std::string("none");
    if (!eltwise_algorithm(unary_op(u_), approx, &a_, &alpha_, &beta_)) throw Reject{"approximate = " + approx};
    switch (u_) {
      case Unary::kLeakyRelu: alpha_ = c.attr_f("alpha", 0.01f); break;
      case Unary::kElu: alpha_ = c.attr_f("alpha", 1.f); break;
      case Unary::kClip: {
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
            if (c.dtype(i) == KEEL_DTYPE_BF16) v = bf16_to_f32(*c.data<uint16_t>(i));
            else if (c.dtype(i) == KEEL_DTYPE_F32) v = *c.data<float>(i);
            else throw Reject{"Clip bounds dtype"};
            (i == 1 ? alpha_ : beta_) = v;
          }
        }
        if (std::isnan(alpha_) || std::isnan(beta_)) throw Reject{"NaN bounds"};
        break;
      }
      default: break;
    }
    if (!c.rank_known(0)) throw Reject{"input rank unknown"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    dnnl::memory::desc m({numel(x)}, dt_, tag::a);
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, a_, m, alpha_, beta_);
    dnnl::eltwise_forward::primitive_desc pd(d, engine());
    p.prim = dnnl::eltwise_forward(pd);
    add_input(p, DNNL_ARG_SRC, 0, m);
    p.dst = dnnl::memory(m, engine(), nullptr);
  }

 private:
  Unary u_;
  alg a_ = alg::eltwise_relu;
  float alpha_ = 0.f, beta_ = 0.f;
};

// ----------------------------------------------------------------------------------------------------- binary

class BinaryKernel : public PlainKernel {
 public:
  BinaryKernel(dt d, alg a, bool commutative) : PlainKernel(d), a_(a), commutative_(commutative) {}

 protected:
  void check(const Ctx& c) override {
    if (c.input_count() != 2) throw Reject{"needs exactly 2 inputs"};
    if (!c.rank_known(0) || !c.rank_known(1)) throw Reject{"operand rank unknown"};
    if (c.opset() < 7 && c.attr_i("broadcast", 0) != 0) throw Reject{"legacy broadcast attribute"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims a = c.dims(0), b = c.dims(1);
    size_t r = std::max<size_t>({a.size(), b.size(), 1});
    while (a.size() < r) a.insert(a.begin(), 1);
    while (b.size() < r) b.insert(b.begin(), 1);
    if (r > 6) throw Reject{"rank > 6"};
    Dims out(r);
    for (size_t i = 0; i < r; ++i) {
      if (a[i] != b[i] && a[i] != 1 && b[i] != 1) throw Reject{"shapes do not broadcast"};
      out[i] = (a[i] == 1) ? b[i] : a[i];
    }
    Dims out_graph(out.end() - static_cast<int64_t>(std::max(c.dims(0).size(), c.dims(1).size())), out.end());
    p.out_dims = out_graph;
    if (numel(out) == 0) return;
    int i0 = 0, i1 = 1;
    if (a != out) {
      if (!commutative_ || b != out) throw Reject{"the first operand broadcasts"};
      std::swap(a, b);
      std::swap(i0, i1);
    }
    dnnl::memory::desc m0 = typed_md(a), m1 = typed_md(b), md = typed_md(out);
    dnnl::binary::desc d(a_, m0, m1, md);
    dnnl::binary::primitive_desc pd(d, engine());
    p.prim = dnnl::binary(pd);
    add_input(p, DNNL_ARG_SRC_0, i0, m0);
    add_input(p, DNNL_ARG_SRC_1, i1, m1);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }

 private:
  alg a_;
  bool commutative_;
};

// ----------------------------------------------------------------------------------------------------- concat

class ConcatKernel : public PlainKernel {
 public:
  using PlainKernel::PlainKernel;

 protected:
  void check(const Ctx& c) override {
    if (c.input_count() < 1 || c.input_count() > 64) throw Reject{"input count"};
    for (int i = 0; i < c.input_count(); ++i)
      if (!c.has_input(i) || !c.rank_known(i)) throw Reject{"input rank unknown"};
    if (!c.has_attr("axis")) throw Reject{"no axis"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims first = c.dims(0);
    int64_t rank = static_cast<int64_t>(first.size());
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
      mds.push_back(typed_md(d));
    }
    p.out_dims = out;
    dnnl::memory::desc md = typed_md(out);
    dnnl::concat::primitive_desc pd(md, static_cast<int>(axis), mds, engine());
    p.prim = dnnl::concat(pd);
    for (int i = 0; i < c.input_count(); ++i) add_input(p, DNNL_ARG_MULTIPLE_SRC + i, i, mds[i]);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }
};

// ------------------------------------------------------------------------------------- transpose, reduce, pow

// Transpose as a oneDNN reorder from a permuted-strides view of the input to the plain output.
class TransposeKernel : public PlainKernel {
 public:
  using PlainKernel::PlainKernel;

 protected:
  // "simple:any" is the element-by-element reorder: far slower than the reference Transpose.
  bool slow_impl(const std::string& impl) const override {
    return impl.rfind("ref", 0) == 0 || impl.rfind("simple:any", 0) == 0;
  }
  void check(const Ctx& c) override {
    if (!c.rank_known(0) || c.dims(0).empty() || c.dims(0).size() > 6) throw Reject{"rank"};
  }
  void build(const Ctx& c, PlainPlan& p) override {
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
    dnnl::memory::desc src(to_dnnl(out), dt_, view_strides), dst = typed_md(out);
    dnnl::reorder::primitive_desc pd(engine(), src, engine(), dst);
    p.prim = dnnl::reorder(pd);
    add_input(p, DNNL_ARG_FROM, 0, src);
    p.dst = dnnl::memory(dst, engine(), nullptr);
    p.dst_arg = DNNL_ARG_TO;
  }
};

class ReduceKernel : public PlainKernel {
 public:
  explicit ReduceKernel(alg a) : PlainKernel(dt::f32), a_(a) {}

 protected:
  int typed_inputs() const override { return 1; }
  void check(const Ctx& c) override {
    if (!c.rank_known(0) || c.dims(0).empty() || c.dims(0).size() > 6) throw Reject{"rank"};
    if (c.attr_i("noop_with_empty_axes", 0) != 0) throw Reject{"noop_with_empty_axes"};
    if (c.input_count() > 1 && c.has_input(1)) {
      if (!c.is_constant(1) || c.dtype(1) != KEEL_DTYPE_I64) throw Reject{"axes input not constant"};
      const int64_t* a = c.data<int64_t>(1);
      axes_.assign(a, a + numel(c.dims(1)));
    } else {
      axes_ = c.attr_ints("axes", {});
    }
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    const int64_t r = static_cast<int64_t>(x.size());
    std::vector<bool> reduce(r, axes_.empty());
    for (int64_t a : axes_) {
      if (a < 0) a += r;
      if (a < 0 || a >= r) throw Reject{"axis out of range"};
      reduce[a] = true;
    }
    Dims kept = x, out;
    for (int64_t i = 0; i < r; ++i) {
      if (reduce[i]) kept[i] = 1;
      if (!reduce[i] || c.attr_i("keepdims", 1)) out.push_back(kept[i]);
    }
    p.out_dims = out;
    if (numel(x) == 0) throw Reject{"empty input"};
    if (kept == x) throw Reject{"nothing to reduce"};
    dnnl::memory::desc src = plain_md(x), dst = plain_md(kept);
    dnnl::reduction::desc d(a_, src, dst, 0.f, 0.f);
    dnnl::reduction::primitive_desc pd(d, engine());
    p.prim = dnnl::reduction(pd);
    add_input(p, DNNL_ARG_SRC, 0, src);
    p.dst = dnnl::memory(dst, engine(), nullptr);
  }

 private:
  alg a_;
  Dims axes_;
};

// Pow with a constant scalar exponent: eltwise_pow (x^b).
class PowKernel : public PlainKernel {
 public:
  PowKernel() : PlainKernel(dt::f32) {}

 protected:
  void check(const Ctx& c) override {
    if (!c.rank_known(0)) throw Reject{"rank"};
    if (!c.is_constant(1) || numel(c.dims(1)) != 1) throw Reject{"exponent not a constant scalar"};
    if (c.dims(1).size() > c.dims(0).size()) throw Reject{"exponent rank broadcasts the output"};
    beta_ = *c.data<float>(1);
  }
  void build(const Ctx& c, PlainPlan& p) override {
    Dims x = c.dims(0);
    p.out_dims = x;
    if (numel(x) == 0) return;
    dnnl::memory::desc md({numel(x)}, dt::f32, tag::a);
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, alg::eltwise_pow, md, 1.f, beta_);
    dnnl::eltwise_forward::primitive_desc pd(d, engine());
    p.prim = dnnl::eltwise_forward(pd);
    add_input(p, DNNL_ARG_SRC, 0, md);
    p.dst = dnnl::memory(md, engine(), nullptr);
  }

 private:
  float beta_ = 1.f;
};

}  // namespace

Kernel* make_pool_kernel(dt d, bool max, bool global) { return new PoolKernel(d, max, global); }
Kernel* make_batch_norm_kernel(dt d) { return new BatchNormKernel(d); }
Kernel* make_layer_norm_kernel(dt d) { return new LayerNormKernel(d); }
Kernel* make_softmax_kernel(dt d, bool log) { return new SoftmaxKernel(d, log); }
Kernel* make_unary_kernel(dt d, Unary u) { return new UnaryKernel(d, u); }
Kernel* make_binary_kernel(dt d, alg a, bool commutative) { return new BinaryKernel(d, a, commutative); }
Kernel* make_concat_kernel(dt d) { return new ConcatKernel(d); }
Kernel* make_transpose_kernel(dt d) { return new TransposeKernel(d); }

std::vector<KernelInfo> misc_kernels() {
  using K = Kernel*;
  return {
      {"MaxPool", 1, 0, "onednn_f32_maxpool", []() -> K { return new PoolKernel(dt::f32, true, false); }},
      {"AveragePool", 1, 0, "onednn_f32_averagepool", []() -> K { return new PoolKernel(dt::f32, false, false); }},
      {"GlobalMaxPool", 1, 0, "onednn_f32_globalmaxpool", []() -> K { return new PoolKernel(dt::f32, true, true); }},
      {"GlobalAveragePool", 1, 0, "onednn_f32_globalaveragepool",
       []() -> K { return new PoolKernel(dt::f32, false, true); }},
      {"BatchNormalization", 7, 0, "onednn_f32_batchnormalization", []() -> K { return new BatchNormKernel(dt::f32); }},
      {"LayerNormalization", 17, 0, "onednn_f32_layernormalization",
       []() -> K { return new LayerNormKernel(dt::f32); }},
      {"LayerNormalization", 1, 0, "onednn_f32_keel_layernormalization",
       []() -> K { return new LayerNormKernel(dt::f32); }, "keel"},
      {"Softmax", 1, 0, "onednn_f32_softmax", []() -> K { return new SoftmaxKernel(dt::f32, false); }},
      {"LogSoftmax", 1, 0, "onednn_f32_logsoftmax", []() -> K { return new SoftmaxKernel(dt::f32, true); }},
      {"Relu", 6, 0, "onednn_f32_relu", []() -> K { return new UnaryKernel(dt::f32, Unary::kRelu); }},
      {"LeakyRelu", 6, 0, "onednn_f32_leakyrelu", []() -> K { return new UnaryKernel(dt::f32, Unary::kLeakyRelu); }},
      {"Elu", 6, 0, "onednn_f32_elu", []() -> K { return new UnaryKernel(dt::f32, Unary::kElu); }},
      {"Sigmoid", 6, 0, "onednn_f32_sigmoid", []() -> K { return new UnaryKernel(dt::f32, Unary::kSigmoid); }},
      {"Tanh", 6, 0, "onednn_f32_tanh", []() -> K { return new UnaryKernel(dt::f32, Unary::kTanh); }},
      {"Exp", 6, 0, "onednn_f32_exp", []() -> K { return new UnaryKernel(dt::f32, Unary::kExp); }},
      {"Log", 6, 0, "onednn_f32_log", []() -> K { return new UnaryKernel(dt::f32, Unary::kLog); }},
      {"Sqrt", 6, 0, "onednn_f32_sqrt", []() -> K { return new UnaryKernel(dt::f32, Unary::kSqrt); }},
      {"Abs", 6, 0, "onednn_f32_abs", []() -> K { return new UnaryKernel(dt::f32, Unary::kAbs); }},
      {"Neg", 6, 0, "onednn_f32_neg", []() -> K { return new UnaryKernel(dt::f32, Unary::kNeg); }},
      {"Round", 11, 0, "onednn_f32_round", []() -> K { return new UnaryKernel(dt::f32, Unary::kRound); }},
      {"HardSwish", 14, 0, "onednn_f32_hardswish", []() -> K { return new UnaryKernel(dt::f32, Unary::kHardSwish); }},
      {"Gelu", 20, 0, "onednn_f32_gelu", []() -> K { return new UnaryKernel(dt::f32, Unary::kGelu); }},
      {"Gelu", 1, 0, "onednn_f32_keel_gelu", []() -> K { return new UnaryKernel(dt::f32, Unary::kGelu); }, "keel"},
      {"Clip", 6, 0, "onednn_f32_clip", []() -> K { return new UnaryKernel(dt::f32, Unary::kClip); }},
      {"Add", 7, 0, "onednn_f32_add", []() -> K { return new BinaryKernel(dt::f32, alg::binary_add, true); }},
      {"Sub", 7, 0, "onednn_f32_sub", []() -> K { return new BinaryKernel(dt::f32, alg::binary_sub, false); }},
      {"Mul", 7, 0, "onednn_f32_mul", []() -> K { return new BinaryKernel(dt::f32, alg::binary_mul, true); }},
      {"Div", 7, 0, "onednn_f32_div", []() -> K { return new BinaryKernel(dt::f32, alg::binary_div, false); }},
      {"Max", 8, 0, "onednn_f32_max", []() -> K { return new BinaryKernel(dt::f32, alg::binary_max, true); }},
      {"Min", 8, 0, "onednn_f32_min", []() -> K { return new BinaryKernel(dt::f32, alg::binary_min, true); }},
      {"Concat", 4, 0, "onednn_f32_concat", []() -> K { return new ConcatKernel(dt::f32); }},
      {"Transpose", 1, 0, "onednn_f32_transpose", []() -> K { return new TransposeKernel(dt::f32); }},
      {"ReduceMean", 1, 17, "onednn_f32_reducemean", []() -> K { return new ReduceKernel(alg::reduction_mean); }},
      {"ReduceSum", 1, 0, "onednn_f32_reducesum", []() -> K { return new ReduceKernel(alg::reduction_sum); }},
      {"ReduceMax", 1, 17, "onednn_f32_reducemax", []() -> K { return new ReduceKernel(alg::reduction_max); }},
      {"ReduceMin", 1, 17, "onednn_f32_reducemin", []() -> K { return new ReduceKernel(alg::reduction_min); }},
      {"Pow", 7, 0, "onednn_f32_pow", []() -> K { return new PowKernel(); }},
  };
}

}  // namespace keel::onednn
