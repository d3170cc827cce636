// plugins/cpu_onednn/chain/ops/table.cc — the ops a chain takes (chain/ops/table.h). To let chains take a new op:
// one row here, and its build function in the family's file under chain/ops/ (README.md, "Adding an op").
#include "chain/ops/table.h"

#include <map>

#include "chain/builder.h"

namespace keel::onednn::chain {

const std::vector<ChainOp>& chain_ops() {
  using B = Builder;
  using R = ChainRole;
  using L = Lift1d;
  static const std::vector<ChainOp> rows{
      // convolutions (ops/conv.cc; their own-step and variant paths in ops/conv_own_steps.cc, ops/conv_variants.cc)
      {"Conv", kOnnx, &B::conv, R::kCompute, L::kSeed},
      {"ConvTranspose", kOnnx, &B::deconv, R::kCompute, L::kSeed},
      // matrix products (ops/matmul.cc)
      {"MatMul", kOnnx, &B::matmul, R::kCompute, L::kNo},
      {"Gemm", kOnnx, &B::matmul, R::kCompute, L::kNo},
      // pooling (ops/pool.cc)
      {"MaxPool", kOnnx, &B::pool, R::kCompute, L::kSeed},
      {"AveragePool", kOnnx, &B::pool, R::kCompute, L::kSeed},
      {"GlobalAveragePool", kOnnx, &B::pool, R::kCompute, L::kSeed},
      {"GlobalMaxPool", kOnnx, &B::pool, R::kCompute, L::kSeed},
      // unary element-wise (ops/elementwise.cc; the oneDNN algorithm from eltwise_algorithm, common/common.h)
      {"Relu", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"Clip", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"LeakyRelu", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"Sigmoid", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"Tanh", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"Gelu", kOnnxAndKeel, &B::eltwise, R::kCompute, L::kUnary},  // ai.onnx 20, keel.Gelu (fuse_gelu)
      {"HardSwish", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"HardSigmoid", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"Sqrt", kOnnx, &B::eltwise, R::kCompute, L::kNo},
      {"Round", kOnnx, &B::eltwise, R::kCompute, L::kUnary},
      {"Pow", kOnnx, &B::eltwise, R::kCompute, L::kNo},
      // binary element-wise (ops/elementwise.cc)
      {"Add", kOnnx, &B::binary, R::kCompute, L::kBinary},
      {"Sub", kOnnx, &B::binary, R::kCompute, L::kBinary},
      {"Mul", kOnnx, &B::binary, R::kCompute, L::kBinary},
      {"Div", kOnnx, &B::binary, R::kCompute, L::kBinary},
      {"Concat", kOnnx, &B::concat, R::kCompute, L::kBinary},  // ops/concat.cc
      // normalisation and reductions (ops/norm.cc)
      {"BatchNormalization", kOnnx, &B::batchnorm, R::kCompute, L::kUnary},
      {"Softmax", kOnnx, &B::softmax, R::kCompute, L::kNo},
      {"LayerNormalization", kOnnxAndKeel, &B::layernorm_node, R::kCompute, L::kNo},  // keel's: fuse_layer_norm
      {"ReduceMean", kOnnx, &B::reduce_mean, R::kCompute, L::kNo},
      // keel.Attention (fuse_attention's) as an own step (ops/attention.cc); no ai.onnx op of this name is taken
      {"Attention", kKeel, &B::attention, R::kCompute, L::kNo},
      // views and data movement (ops/shape.cc)
      {"Reshape", kOnnx, &B::reshape_like, R::kView, L::kNo},
      {"Flatten", kOnnx, &B::reshape_like, R::kView, L::kNo},
      {"Squeeze", kOnnx, &B::reshape_like, R::kView, L::kNo},
      {"Unsqueeze", kOnnx, &B::reshape_like, R::kView, L::kNo},
      {"Identity", kOnnx, &B::reshape_like, R::kView, L::kUnary},
      {"Dropout", kOnnx, &B::reshape_like, R::kView, L::kUnary},
      {"Transpose", kOnnx, &B::transpose, R::kView, L::kNo},
      {"Slice", kOnnx, &B::slice, R::kView, L::kNo},
      {"Pad", kOnnx, &B::pad, R::kView, L::kUnary},
      {"Resize", kOnnx, &B::resize, R::kCompute, L::kNo},
      {"Cast", kOnnx, &B::cast, R::kCompute, L::kNo},
      // int8 (ops/int8.cc): keel.QConv / keel.QGemm (fuse_qdq's), per-tensor ai.onnx Q/DQ of activations
      {"QConv", kKeel, &B::qconv, R::kInt8, L::kNo},
      {"QGemm", kKeel, &B::qgemm, R::kInt8, L::kNo},
      {"QuantizeLinear", kOnnx, &B::qdq, R::kInt8, L::kNo},
      {"DequantizeLinear", kOnnx, &B::qdq, R::kInt8, L::kNo},
  };
  return rows;
}

const ChainOp* find_chain_op(const std::string& op) {
  static const std::map<std::string, const ChainOp*> by_op = [] {
    std::map<std::string, const ChainOp*> m;
    for (const ChainOp& r : chain_ops()) m.emplace(r.op, &r);
    return m;
  }();
  auto it = by_op.find(op);
  return it == by_op.end() ? nullptr : it->second;
}

}  // namespace keel::onednn::chain
