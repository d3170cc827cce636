#include "ops/schemas.h"

#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>

#include <algorithm>
#include <mutex>

namespace keel::ops {
namespace {

using onnx::OpSchema;

const std::vector<std::string>& float_types() {
  static const std::vector<std::string> t = {"tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"};
  return t;
}

// Shape inference borrowed from the ai.onnx op a fused op extends (Conv, MatMul, Gemm): the fused op's leading inputs
// are that op's inputs, its extra inputs (bias, residual) do not change the output.
onnx::InferenceFunction borrowed_inference(const char* op, int opset) {
  const OpSchema* base = onnx::OpSchemaRegistry::Schema(op, opset, onnx::ONNX_DOMAIN);
  if (base == nullptr) return onnx::propagateShapeAndTypeFromFirstInput;
  return base->GetTypeAndShapeInferenceFunction();
}

void register_one(OpSchema schema) { onnx::OpSchemaRegistry::OpSchemaRegisterOnce once(schema); }

OpSchema fused(const char* name, const char* doc) {
  OpSchema s;
  s.SetName(name).SetDomain("keel").SinceVersion(1).SetDoc(doc).AllowUncheckedAttributes();
  s.TypeConstraint("T", float_types(), "float tensors");
  s.Output(0, "Y", "result", "T");
  return s;
}

// A backward (training) op: inputs and outputs of type T (float) unless named in `int_inputs` (type Tind, int32/64).
// Output i takes its element type from input 0 and its shape from `shape_from[i]`: an input index, -1 (unknown),
// kDim0Of2 ([dim 0 of input 2]: a conv bias) or kDim1Of0 ([dim 1 of input 0]: per-channel statistics).
constexpr int kDim0Of2 = -2;
constexpr int kDim1Of0 = -3;
struct GradIO {
  const char* name;
  bool optional = false;
  bool integer = false;
  bool byte = false;  // uint8 (type Tb)
};
void register_grad_op(const char* name, const char* doc, std::vector<GradIO> ins, std::vector<GradIO> outs,
                      std::vector<int> shape_from) {
  OpSchema s;
  s.SetName(name).SetDomain("keel").SinceVersion(1).SetDoc(doc).AllowUncheckedAttributes();
  s.TypeConstraint("T", float_types(), "float tensors");
  s.TypeConstraint("Tind", {"tensor(int32)", "tensor(int64)"}, "indices / labels");
  if (std::any_of(ins.begin(), ins.end(), [](const GradIO& io) { return io.byte; }))
    s.TypeConstraint("Tb", {"tensor(uint8)"}, "window positions");
  for (size_t i = 0; i < ins.size(); ++i)
    s.Input(static_cast<int>(i), ins[i].name, "",
            ins[i].integer ? "Tind"
            : ins[i].byte  ? "Tb"
                           : "T",
            ins[i].optional ? OpSchema::Optional : OpSchema::Single);
  for (size_t i = 0; i < outs.size(); ++i)
    s.Output(static_cast<int>(i), outs[i].name, "", "T", outs[i].optional ? OpSchema::Optional : OpSchema::Single);
  s.TypeAndShapeInferenceFunction([shape_from](onnx::InferenceContext& ctx) {
    for (size_t i = 0; i < ctx.getNumOutputs() && i < shape_from.size(); ++i) {
      onnx::propagateElemTypeFromInputToOutput(ctx, 0, i);
      int from = shape_from[i];
      if (from >= 0 && static_cast<size_t>(from) < ctx.getNumInputs() && onnx::hasInputShape(ctx, from)) {
        onnx::propagateShapeFromInputToOutput(ctx, from, i);
      } else if ((from == kDim0Of2 && ctx.getNumInputs() > 2 && onnx::hasInputShape(ctx, 2)) ||
                 (from == kDim1Of0 && onnx::hasInputShape(ctx, 0))) {
        const auto& in = ctx.getInputType(from == kDim0Of2 ? 2 : 0)->tensor_type().shape();
        int d = from == kDim0Of2 ? 0 : 1;
        if (in.dim_size() <= d) continue;
        auto* out = ctx.getOutputType(i)->mutable_tensor_type()->mutable_shape();
        *out->add_dim() = in.dim(d);
      }
    }
  });
  register_one(s);
}

}  // namespace

void register_keel_schemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    onnx::OpSchemaRegistry::DomainToVersionRange::Instance().AddDomainToVersion("keel", 1, 1);

    OpSchema conv = fused("FusedConv", "act(conv(X, W) + B + Z), Conv's attributes plus activation");
    conv.Input(0, "X", "input", "T")
        .Input(1, "W", "weights", "T")
        .Input(2, "B", "bias", "T", OpSchema::Optional)
        .Input(3, "Z", "residual", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(borrowed_inference("Conv", 11));
    register_one(conv);

    // eager's conv2d_relu_max_pool2d: the convolution's output is pooled inside the kernel and never stored whole.
    OpSchema cmp = fused("FusedConvMaxPool",
                         "MaxPool(act(conv(X, W) + B)): Conv's attributes plus activation (none or Relu), 2-D "
                         "pool_kernel_shape and pool_strides (default: the window; no padding, floor); output Arg "
                         "(uint8, optional): each window's first maximum as kh * window width + kw");
    cmp.Input(0, "X", "input", "T")
        .Input(1, "W", "weights", "T")
        .Input(2, "B", "bias", "T", OpSchema::Optional)
        .Output(1, "Arg", "window positions of the maxima", "Tb", OpSchema::Optional)
        .TypeConstraint("Tb", {"tensor(uint8)"}, "window positions")
        .TypeAndShapeInferenceFunction([conv = borrowed_inference("Conv", 11)](onnx::InferenceContext& ctx) {
          conv(ctx);
          auto* y = ctx.getOutputType(0)->mutable_tensor_type();
          const auto* ks = ctx.getAttribute("pool_kernel_shape");
          const auto* st = ctx.getAttribute("pool_strides");
          if (y->has_shape() && y->shape().dim_size() == 4 && ks != nullptr && ks->ints_size() == 2)
            for (int i = 0; i < 2; ++i) {
              auto* d = y->mutable_shape()->mutable_dim(2 + i);
              const int64_t k = ks->ints(i), s = st != nullptr && st->ints_size() == 2 ? st->ints(i) : k;
              if (d->has_dim_value() && k > 0 && s > 0 && d->dim_value() >= k)
                d->set_dim_value((d->dim_value() - k) / s + 1);
              else d->Clear();
            }
          if (ctx.getNumOutputs() > 1) {
            auto* arg = ctx.getOutputType(1)->mutable_tensor_type();
            arg->set_elem_type(onnx::TensorProto::UINT8);
            if (y->has_shape()) *arg->mutable_shape() = y->shape();
          }
        });
    register_one(cmp);

    OpSchema mm = fused("FusedMatMul", "act(matmul(A, B) + bias + Z)");
    mm.Input(0, "A", "", "T")
        .Input(1, "B", "", "T")
        .Input(2, "bias", "", "T", OpSchema::Optional)
        .Input(3, "Z", "residual", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(borrowed_inference("MatMul", 13));
    register_one(mm);

    OpSchema gemm = fused("FusedGemm", "act(alpha A' B' + beta C + Z), Gemm's attributes plus activation");
    gemm.Input(0, "A", "", "T")
        .Input(1, "B", "", "T")
        .Input(2, "C", "", "T", OpSchema::Optional)
        .Input(3, "Z", "residual", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(borrowed_inference("Gemm", 13));
    register_one(gemm);

    OpSchema gelu = fused("Gelu",
                          "0.5 x (1 + erf(x / sqrt 2)); attribute approximate = \"tanh\": 0.5 x (1 + tanh(sqrt(2 / pi) "
                          "(x + 0.044715 x^3)))");
    gelu.Input(0, "X", "", "T").TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    register_one(gelu);

    OpSchema ln = fused("LayerNormalization", "as ONNX LayerNormalization-17 (output 0 only), for older opsets");
    ln.Input(0, "X", "", "T")
        .Input(1, "Scale", "", "T")
        .Input(2, "B", "", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    register_one(ln);

    OpSchema attn = fused("Attention", "softmax(matmul(Q, Kt) * scale + mask, last axis) @ V");
    attn.Input(0, "Q", "", "T")
        .Input(1, "Kt", "", "T")
        .Input(2, "V", "", "T")
        .Input(3, "mask", "", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction([](onnx::InferenceContext& ctx) {
          onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
          if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 2)) return;
          const auto& q = ctx.getInputType(0)->tensor_type().shape();
          const auto& v = ctx.getInputType(2)->tensor_type().shape();
          if (q.dim_size() < 2 || v.dim_size() < 2) return;
          auto* out = ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape();
          for (int i = 0; i < q.dim_size() - 1; ++i) *out->add_dim() = q.dim(i);
          *out->add_dim() = v.dim(v.dim_size() - 1);
        });
    register_one(attn);

    // INT8 ops (passes/quantize_int8 `fuse_qdq`): semantics in ops/reference/fused.cc. The output is f32, or, with
    // y_scale and y_zero_point, quantized to y_zero_point's type.
    auto q_output_type = [](onnx::InferenceContext& ctx) {
      int32_t et = onnx::TensorProto::FLOAT;
      if (ctx.getNumInputs() > 7 && ctx.getInputType(7) != nullptr && ctx.getInputType(7)->has_tensor_type())
        et = ctx.getInputType(7)->tensor_type().elem_type();
      ctx.getOutputType(0)->mutable_tensor_type()->set_elem_type(et);
    };
    auto quantized = [](const char* name, const char* doc, const char* x, const char* w, const char* b) {
      OpSchema s;
      s.SetName(name).SetDomain("keel").SinceVersion(1).SetDoc(doc).AllowUncheckedAttributes();
      s.TypeConstraint("T1", {"tensor(uint8)", "tensor(int8)", "tensor(float)"},
                       "quantized activations (f32: quantized with x_scale / x_zero_point first)");
      s.TypeConstraint("T0", {"tensor(uint8)", "tensor(int8)"}, "activation zero point");
      s.TypeConstraint("T2", {"tensor(int8)"}, "quantized weights");
      s.TypeConstraint("T3", {"tensor(uint8)", "tensor(int8)"}, "quantized output");
      s.TypeConstraint("T4", {"tensor(uint8)", "tensor(int8)", "tensor(float)"}, "output");
      s.Input(0, x, "", "T1")
          .Input(1, w, "", "T2")
          .Input(2, b, "f32 bias", "tensor(float)", OpSchema::Optional)
          .Input(3, "x_scale", "", "tensor(float)")
          .Input(4, "x_zero_point", "", "T0", OpSchema::Optional)
          .Input(5, "w_scale", "", "tensor(float)")
          .Input(6, "y_scale", "", "tensor(float)", OpSchema::Optional)
          .Input(7, "y_zero_point", "", "T3", OpSchema::Optional);
      s.Output(0, "Y", "", "T4");
      return s;
    };
    OpSchema qconv =
        quantized("QConv", "act(conv(dequant(X), dequant(W)) + B + Z), quantized when y_scale is given", "X", "W", "B");
    qconv.Input(8, "Z", "f32 residual added before the activation (the output's shape; layout: residual_layout)",
                "tensor(float)", OpSchema::Optional);
    qconv.TypeAndShapeInferenceFunction(
        [conv = borrowed_inference("Conv", 11), q_output_type](onnx::InferenceContext& ctx) {
          conv(ctx);
          q_output_type(ctx);
        });
    register_one(qconv);
    OpSchema qgemm = quantized("QGemm",
                               "act(dequant(A) x dequant(B) + C), quantized when y_scale is given; B [K, N] "
                               "(or [N, K] with transB)",
                               "A", "B", "C");
    qgemm.TypeAndShapeInferenceFunction([q_output_type](onnx::InferenceContext& ctx) {
      q_output_type(ctx);
      if (!onnx::hasInputShape(ctx, 0) || !onnx::hasInputShape(ctx, 1)) return;
      const auto& a = ctx.getInputType(0)->tensor_type().shape();
      const auto& b = ctx.getInputType(1)->tensor_type().shape();
      if (a.dim_size() < 2 || b.dim_size() != 2) return;
      const auto* tb = ctx.getAttribute("transB");
      const bool trans = tb != nullptr && tb->i() != 0;
      auto* out = ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape();
      for (int i = 0; i < a.dim_size() - 1; ++i) *out->add_dim() = a.dim(i);
      *out->add_dim() = b.dim(trans ? 0 : 1);
    });
    register_one(qgemm);
    // --- backward (training) ops: the gradient rules of ops/gradients.cc emit them; reference kernels in
    // ops/reference/grad.cc, oneDNN ones in plugins/cpu_onednn/onednn_train.cc ---
    register_grad_op("ConvGrad",
                     "gradients of Conv(X, W, B) from dY, Conv's attributes; the output spatial size is "
                     "dY's. Outputs: dX, dW, dB (each optional)",
                     {{"dY"}, {"X"}, {"W"}}, {{"dX", true}, {"dW", true}, {"dB", true}}, {1, 2, kDim0Of2});
    register_grad_op("FusedConvMaxPoolGrad",
                     "dX, dW, dB of keel.FusedConvMaxPool (its attributes) from dP, with its input X, weights W, "
                     "pooled output P and window positions Arg: each window's dP goes to the position Arg names "
                     "(times P > 0 under a Relu), then as ConvGrad",
                     {{"dP"}, {"X"}, {"W"}, {"P"}, {"Arg", false, false, true}},
                     {{"dX", true}, {"dW", true}, {"dB", true}}, {1, 2, kDim0Of2});
    register_grad_op("MaxPoolGrad",
                     "dX of MaxPool(X) (MaxPool's attributes): dY goes to the first maximum of each window",
                     {{"dY"}, {"X"}}, {{"dX"}}, {1});
    register_grad_op("AveragePoolGrad", "dX of AveragePool (its attributes plus input_shape)", {{"dY"}}, {{"dX"}},
                     {-1});
    register_grad_op("ReluGrad", "dY * (Y > 0)", {{"dY"}, {"Y"}}, {{"dX"}}, {0});
    register_grad_op("SigmoidGrad", "dY * Y * (1 - Y)", {{"dY"}, {"Y"}}, {{"dX"}}, {0});
    register_grad_op("TanhGrad", "dY * (1 - Y^2)", {{"dY"}, {"Y"}}, {{"dX"}}, {0});
    register_grad_op("GeluGrad", "dY * d/dX gelu(X) (erf form; attribute approximate = tanh: the tanh form's)",
                     {{"dY"}, {"X"}}, {{"dX"}}, {0});
    register_grad_op("LeakyReluGrad", "dY * (X > 0 ? 1 : alpha)", {{"dY"}, {"X"}}, {{"dX"}}, {0});
    register_grad_op("SoftmaxCrossEntropyLossGrad",
                     "dScores of SoftmaxCrossEntropyLoss from dLoss, log_prob and labels (reduction, ignore_index)",
                     {{"dLoss"}, {"log_prob"}, {"labels", false, true}, {"weights", true}}, {{"dScores"}}, {1});
    register_grad_op("BatchNormTraining",
                     "batch normalisation with batch statistics over all axes but 1 (epsilon): Y, mean, invstd and "
                     "the unbiased variance (for running estimates)",
                     {{"X"}, {"scale"}, {"B"}}, {{"Y"}, {"mean", true}, {"invstd", true}, {"var", true}},
                     {0, kDim1Of0, kDim1Of0, kDim1Of0});
    register_grad_op("BatchNormGrad", "dX, dScale, dB of BatchNormTraining from dY, X, scale, mean, invstd",
                     {{"dY"}, {"X"}, {"scale"}, {"mean"}, {"invstd"}}, {{"dX", true}, {"dScale", true}, {"dB", true}},
                     {1, 2, 2});
    register_grad_op("LayerNormGrad", "dX, dScale, dB of LayerNormalization(axis) from dY, X, scale, Mean, InvStdDev",
                     {{"dY"}, {"X"}, {"scale"}, {"mean"}, {"invstd"}}, {{"dX", true}, {"dScale", true}, {"dB", true}},
                     {1, 2, 2});
    register_grad_op("GatherGrad", "dData of Gather(data, indices, axis): dY scattered (added) into data_shape",
                     {{"dY"}, {"indices", false, true}}, {{"dData"}}, {-1});
    // Adam / AdamW's step over n f32 parameters (Adam::step on a device): PyTorch's formulas, in its order of
    // operations.
    {
      OpSchema s;
      s.SetName("AdamStep").SetDomain("keel").SinceVersion(1).AllowUncheckedAttributes();
      s.SetDoc(
          "Adam / AdamW over n tensors: inputs scalars (f32[9]: decay_scale, weight_decay, beta1, 1 - beta1, beta2, "
          "1 - beta2, sqrt(1 - beta2^t), eps, lr / (1 - beta1^t)), then P1..Pn, G1..Gn, M1..Mn, V1..Vn; outputs "
          "P1_new..Pn_new, M1_new..Mn_new, V1_new..Vn_new. Per element, each operation rounded to f32: p = p * "
          "decay_scale (when not 1); g = g + p * weight_decay (when not 0); m = m * beta1 + g * (1 - beta1); v = v * "
          "beta2 + (g * g) * (1 - beta2); p = p - (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)) * (lr / (1 - beta1^t))");
      s.Input(0, "scalars", "", "tensor(float)");
      s.Input(1, "tensors", "P..., G..., M..., V...", "tensor(float)", OpSchema::Variadic);
      s.Output(0, "outputs", "P_new..., M_new..., V_new...", "tensor(float)", OpSchema::Variadic);
      s.TypeAndShapeInferenceFunction([](onnx::InferenceContext& ctx) {
        const size_t n = ctx.getNumInputs() > 1 ? (ctx.getNumInputs() - 1) / 4 : 0;
        for (size_t o = 0; o < ctx.getNumOutputs() && n > 0; ++o) {
          const size_t group = o / n, i = o % n;  // P, M, V: inputs 1 + i, 1 + 2n + i, 1 + 3n + i
          const size_t from = 1 + (group == 0 ? 0 : group + 1) * n + i;
          if (from >= ctx.getNumInputs()) continue;
          onnx::propagateElemTypeFromInputToOutput(ctx, from, o);
          if (onnx::hasInputShape(ctx, from)) onnx::propagateShapeFromInputToOutput(ctx, from, o);
        }
      });
      register_one(s);
    }
    // GradScaler's unscale and inf/NaN check over every gradient in one call (Paddle's check_finite_and_unscale,
    // PyTorch's _amp_foreach_non_finite_check_and_unscale_).
    {
      OpSchema s;
      s.SetName("CheckFiniteAndUnscale").SetDomain("keel").SinceVersion(1).AllowUncheckedAttributes();
      s.SetDoc(
          "Unscales n gradients and checks them: inputs inv_scale (f32, one value), then G1..Gn (one dtype: f32, f16 "
          "or bf16; any shapes); outputs found_inf (f32 scalar: 1 when an element of any U is inf or NaN, else 0), "
          "then "
          "U1..Un, Ui = Gi * inv_scale computed in f32 and rounded to Gi's dtype");
      s.TypeConstraint("T", {"tensor(float)", "tensor(float16)", "tensor(bfloat16)"}, "gradients");
      s.Input(0, "inv_scale", "", "tensor(float)");
      s.Input(1, "G", "gradients", "T", OpSchema::Variadic);
      s.Output(0, "found_inf", "", "tensor(float)");
      s.Output(1, "U", "unscaled gradients", "T", OpSchema::Variadic);
      s.TypeAndShapeInferenceFunction([](onnx::InferenceContext& ctx) {
        onnx::updateOutputElemType(ctx, 0, onnx::TensorProto::FLOAT);
        ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape();  // a scalar
        for (size_t o = 1; o < ctx.getNumOutputs() && o < ctx.getNumInputs(); ++o) {
          onnx::propagateElemTypeFromInputToOutput(ctx, o, o);
          if (onnx::hasInputShape(ctx, o)) onnx::propagateShapeFromInputToOutput(ctx, o, o);
        }
      });
      register_one(s);
    }
    // Training-mode dropout's mask (eager dropout emits it; the gradient flows through the Mul by the mask).
    register_grad_op("DropoutMask",
                     "X's shape and dtype: 1 / (1 - ratio) where element i's uniform is at least ratio * 2^32, else "
                     "0. The uniforms: value i / 2 of the SplitMix64 stream `seed` (state seed + (k + 1) * "
                     "0x9e3779b97f4a7c15, then SplitMix64's mix), its low 32 bits for even i, high for odd; X's "
                     "values are not read",
                     {{"X"}, {"seed", false, true}}, {{"mask"}}, {0});
  });
}

}  // namespace keel::ops
