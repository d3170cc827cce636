// plugins/cpu_onednn/kernels/bf16.cc — the bf16 inference kernels that a mixed-precision graph (convert_precision,
// `keel run --precision bf16`) needs besides the bf16 Conv/Gemm/MatMul/Relu/MaxPool/Cast of kernels/train.cc, so that
// ResNet-18, MobileNetV2 and the transformer encoder stay on oneDNN in bf16 instead of bouncing to the reference
// kernels: binary ops with broadcasting (Add, Sub, Mul, Div, Max, Min), pooling (Average, GlobalAverage,
// GlobalMax), BatchNormalization (inference), LayerNormalization (last axis), Softmax/LogSoftmax, unary eltwise ops
// (Clip, LeakyRelu, Sigmoid, Tanh, HardSwish, keel.Gelu (erf or tanh), Abs, Neg, Elu), Concat and Transpose; and Conv
// and keel.FusedConv with constant weights prepacked once (inference; bias, residual and activation as post-ops).
//
// Tensors are bf16 on the graph's plain row-major layout; oneDNN computes in f32 inside each primitive (softmax and
// normalisation statistics included). All but Conv are kernels/misc.cc's plain-layout kernels (common/plain.h) made
// for bf16: normalisation parameters (BatchNormalization scale/bias/mean/var, LayerNormalization scale/bias) arrive
// in bf16 (or f32) and are widened to the f32 vectors oneDNN wants, per run (they are [C] / [D] vectors). Each kernel
// rejects what it does not handle and the core falls back to the reference kernels, which are the oracle
// tests/device_conformance checks these against (its bf16 cases).
#include <cstring>

#include "common/plain.h"

namespace keel::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using alg = dnnl::algorithm;

// ---------------------------------------------------------------------------------------------------- conv

// Conv (2-D) for inference with constant weights: forward_inference, weights reordered into the primitive's blocked
// layout once per plan instead of on every call (kernels/train.cc's bf16 Conv, which training needs with weights that
// change every step, reorders them each call). Registered before it, so it takes the constant-weight case first.
// Also keel.FusedConv (fusion/fusion.cc: Y = act(conv(X, W) + B + Z)): the residual Z as a sum post-op, the
// activation as an eltwise post-op, so a bf16 graph fused by fuse_conv_activation runs one primitive per conv.
class ConvKernel : public Kernel {
 public:
  explicit ConvKernel(bool fused = false) : fused_(fused) {}
  void setup(Ctx& c) override {
    if (fused_) act_ = read_fused_activation(c);
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
    if (x[1] != w[1] * group_ || M % group_ != 0)
      throw Failure{KEEL_STATUS_INVALID_ARGUMENT, "Conv: channels do not match"};
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
      act_.append_to(po);
      dnnl::primitive_attr attr = user_scratchpad();
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
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, p.src}, {DNNL_ARG_WEIGHTS, p.wei}, {DNNL_ARG_DST, p.dst}};
    if (has_bias_) args[DNNL_ARG_BIAS] = p.bias;
    execute(*p.prim, s, args);
    if (p.dst_reorder) p.dst_reorder->execute(s, p.dst, p.dst_user);
    s.wait();
  }

 private:
  bool fused_;
  int64_t group_ = 1;
  Dims strides_, dil_, pads_;
  bool has_bias_ = false, has_z_ = false;
  FusedActivation act_;
  PlanCache<Plan> plans_;
};

// ------------------------------------------------------------------------------------------------ registration

const std::vector<TypedKernelInfo>& bf16_kernels() {
  using K = Kernel*;
  const std::vector<int32_t> T = {KEEL_DTYPE_BF16};
  static const std::vector<TypedKernelInfo> k = {
      {"", "Conv", 1, "onednn_bf16_conv_inference", T, []() -> K { return new ConvKernel(); }},
      {"keel", "FusedConv", 1, "onednn_bf16_keel_fusedconv", T, []() -> K { return new ConvKernel(true); }},
      {"", "Add", 7, "onednn_bf16_add", T, []() -> K { return make_binary_kernel(dt::bf16, alg::binary_add, true); }},
      {"", "Sub", 7, "onednn_bf16_sub", T, []() -> K { return make_binary_kernel(dt::bf16, alg::binary_sub, false); }},
      {"", "Mul", 7, "onednn_bf16_mul", T, []() -> K { return make_binary_kernel(dt::bf16, alg::binary_mul, true); }},
      {"", "Div", 7, "onednn_bf16_div", T, []() -> K { return make_binary_kernel(dt::bf16, alg::binary_div, false); }},
      {"", "Max", 8, "onednn_bf16_max", T, []() -> K { return make_binary_kernel(dt::bf16, alg::binary_max, true); }},
      {"", "Min", 8, "onednn_bf16_min", T, []() -> K { return make_binary_kernel(dt::bf16, alg::binary_min, true); }},
      {"", "AveragePool", 1, "onednn_bf16_averagepool", T,
       []() -> K { return make_pool_kernel(dt::bf16, false, false); }},
      {"", "GlobalAveragePool", 1, "onednn_bf16_globalaveragepool", T,
       []() -> K { return make_pool_kernel(dt::bf16, false, true); }},
      {"", "GlobalMaxPool", 1, "onednn_bf16_globalmaxpool", T,
       []() -> K { return make_pool_kernel(dt::bf16, true, true); }},
      {"", "BatchNormalization", 7, "onednn_bf16_batchnormalization", T,
       []() -> K { return make_batch_norm_kernel(dt::bf16); }},
      {"", "LayerNormalization", 17, "onednn_bf16_layernormalization", T,
       []() -> K { return make_layer_norm_kernel(dt::bf16); }},
      {"keel", "LayerNormalization", 1, "onednn_bf16_keel_layernormalization", T,
       []() -> K { return make_layer_norm_kernel(dt::bf16); }},
      {"", "Softmax", 1, "onednn_bf16_softmax", T, []() -> K { return make_softmax_kernel(dt::bf16, false); }},
      {"", "LogSoftmax", 1, "onednn_bf16_logsoftmax", T, []() -> K { return make_softmax_kernel(dt::bf16, true); }},
      {"", "Clip", 6, "onednn_bf16_clip", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kClip); }},
      {"", "LeakyRelu", 6, "onednn_bf16_leakyrelu", T,
       []() -> K { return make_unary_kernel(dt::bf16, Unary::kLeakyRelu); }},
      {"", "Sigmoid", 6, "onednn_bf16_sigmoid", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kSigmoid); }},
      {"", "Tanh", 6, "onednn_bf16_tanh", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kTanh); }},
      {"", "HardSwish", 14, "onednn_bf16_hardswish", T,
       []() -> K { return make_unary_kernel(dt::bf16, Unary::kHardSwish); }},
      {"keel", "Gelu", 1, "onednn_bf16_keel_gelu", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kGelu); }},
      {"", "Abs", 6, "onednn_bf16_abs", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kAbs); }},
      {"", "Neg", 6, "onednn_bf16_neg", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kNeg); }},
      {"", "Elu", 6, "onednn_bf16_elu", T, []() -> K { return make_unary_kernel(dt::bf16, Unary::kElu); }},
      {"", "Concat", 4, "onednn_bf16_concat", T, []() -> K { return make_concat_kernel(dt::bf16); }},
      {"", "Transpose", 1, "onednn_bf16_transpose", T, []() -> K { return make_transpose_kernel(dt::bf16); }},
  };
  return k;
}

}  // namespace

keel_status_t register_bf16_kernels(Instance& instance) {
  return register_kernel_table(instance, bf16_kernels(), false);
}

}  // namespace keel::onednn
