#include "ops/schemas.h"

#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>

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

}  // namespace

void register_keel_schemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    onnx::OpSchemaRegistry::DomainToVersionRange::Instance().AddDomainToVersion("keel", 1, 1);

    OpSchema conv = fused("FusedConv", "act(conv(X, W) + B + Z), Conv's attributes plus activation");
    conv.Input(0, "X", "input", "T").Input(1, "W", "weights", "T")
        .Input(2, "B", "bias", "T", OpSchema::Optional).Input(3, "Z", "residual", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(borrowed_inference("Conv", 11));
    register_one(conv);

    OpSchema mm = fused("FusedMatMul", "act(matmul(A, B) + bias + Z)");
    mm.Input(0, "A", "", "T").Input(1, "B", "", "T").Input(2, "bias", "", "T", OpSchema::Optional)
        .Input(3, "Z", "residual", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(borrowed_inference("MatMul", 13));
    register_one(mm);

    OpSchema gemm = fused("FusedGemm", "act(alpha A' B' + beta C + Z), Gemm's attributes plus activation");
    gemm.Input(0, "A", "", "T").Input(1, "B", "", "T").Input(2, "C", "", "T", OpSchema::Optional)
        .Input(3, "Z", "residual", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(borrowed_inference("Gemm", 13));
    register_one(gemm);

    OpSchema gelu = fused("Gelu", "0.5 x (1 + erf(x / sqrt 2))");
    gelu.Input(0, "X", "", "T").TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    register_one(gelu);

    OpSchema ln = fused("LayerNormalization", "as ONNX LayerNormalization-17 (output 0 only), for older opsets");
    ln.Input(0, "X", "", "T").Input(1, "Scale", "", "T").Input(2, "B", "", "T", OpSchema::Optional)
        .TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    register_one(ln);

    OpSchema attn = fused("Attention", "softmax(matmul(Q, Kt) * scale + mask, last axis) @ V");
    attn.Input(0, "Q", "", "T").Input(1, "Kt", "", "T").Input(2, "V", "", "T")
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
      s.TypeConstraint("T1", {"tensor(uint8)", "tensor(int8)"}, "quantized activations");
      s.TypeConstraint("T2", {"tensor(int8)"}, "quantized weights");
      s.TypeConstraint("T3", {"tensor(uint8)", "tensor(int8)"}, "quantized output");
      s.TypeConstraint("T4", {"tensor(uint8)", "tensor(int8)", "tensor(float)"}, "output");
      s.Input(0, x, "", "T1").Input(1, w, "", "T2").Input(2, b, "f32 bias", "tensor(float)", OpSchema::Optional)
          .Input(3, "x_scale", "", "tensor(float)").Input(4, "x_zero_point", "", "T1", OpSchema::Optional)
          .Input(5, "w_scale", "", "tensor(float)").Input(6, "y_scale", "", "tensor(float)", OpSchema::Optional)
          .Input(7, "y_zero_point", "", "T3", OpSchema::Optional);
      s.Output(0, "Y", "", "T4");
      return s;
    };
    OpSchema qconv = quantized("QConv", "act(conv(dequant(X), dequant(W)) + B), quantized when y_scale is given", "X",
                               "W", "B");
    qconv.TypeAndShapeInferenceFunction([conv = borrowed_inference("Conv", 11), q_output_type](onnx::InferenceContext& ctx) {
      conv(ctx);
      q_output_type(ctx);
    });
    register_one(qconv);
    OpSchema qgemm = quantized("QGemm", "act(dequant(A) x dequant(B) + C), quantized when y_scale is given; B [K, N] "
                               "(or [N, K] with transB)", "A", "B", "C");
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
  });
}

}  // namespace keel::ops
