// keel/ops/gradients.h — gradient rules: for an op (ONNX or keel domain), the ops that compute the gradients of its
// inputs from the gradients of its outputs (reverse mode), as a small program of ordinary ops.
//
// A rule sees the forward node (attributes), the concrete dtypes and shapes of its inputs and outputs, and which
// inputs need a gradient; it emits steps that read forward inputs (x(i)), forward outputs (y(j)), output gradients
// (dy(j)) and constants, and names the gradient of each input (grad(i, value)). Backward kernels that are more than
// a composition of ONNX ops are keel-domain ops (ConvGrad, MaxPoolGrad, ReluGrad, SoftmaxCrossEntropyLossGrad,
// BatchNormTraining/BatchNormGrad, LayerNormGrad, GatherGrad, ...; schemas in ops/schemas.cc, reference kernels in
// ops/reference/grad.cc), so every device can provide them. The eager autograd (core/runtime/eager_autograd.cc) runs
// these programs through the kernel registry and keeps alive only the forward values a program reads.
//
// Stateless: the rule table is immutable; a GradBuilder is used by one thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"

namespace keel::ops {

struct TypeShape {
  DType dtype = DType::kUndefined;
  Shape shape;
};

struct GradStep {
  std::string domain, op_type;
  std::vector<std::string> inputs;   // value names; "" = absent
  std::vector<std::string> outputs;  // "" = not wanted
  std::map<std::string, Attribute> attrs;
};

// The backward of one forward node.
struct GradProgram {
  std::vector<GradStep> steps;
  std::map<std::string, Tensor> constants;       // host tensors
  std::vector<std::string> input_grads;          // per forward input: the value holding its gradient, "" = none
  std::vector<bool> reads_x, reads_y, reads_dy;  // which forward inputs / outputs / output grads the steps read
};

class GradBuilder {
 public:
  GradBuilder(const Node& node, int32_t opset, std::vector<TypeShape> inputs, std::vector<TypeShape> outputs,
              std::vector<bool> needs_grad);

  const Node& node() const { return node_; }
  int32_t opset() const { return opset_; }
  size_t num_inputs() const { return in_.size(); }
  size_t num_outputs() const { return out_.size(); }
  bool has_input(size_t i) const { return i < in_.size() && in_[i].dtype != DType::kUndefined; }
  const TypeShape& in(size_t i) const { return in_.at(i); }
  const TypeShape& out(size_t j) const { return out_.at(j); }
  bool needs(size_t i) const { return i < needs_.size() && needs_[i]; }
  // The value of integer input i when the caller provided it (host tensor; shape/axes inputs), else nullptr.
  const Tensor* value(size_t i) const { return i < values_.size() && values_[i].defined() ? &values_[i] : nullptr; }
  void set_values(std::vector<Tensor> host_values) { values_ = std::move(host_values); }

  // Names of forward values and incoming gradients.
  static std::string x(size_t i) { return "x:" + std::to_string(i); }
  static std::string y(size_t j) { return "y:" + std::to_string(j); }
  static std::string dy(size_t j) { return "dy:" + std::to_string(j); }

  // Adds a step; returns its output names (fresh), "" for outputs not wanted (wanted empty = all wanted).
  std::vector<std::string> op_n(const std::string& op_type, std::vector<std::string> inputs, size_t num_outputs,
                                std::map<std::string, Attribute> attrs = {}, std::vector<bool> wanted = {},
                                const std::string& domain = "");
  std::string op(const std::string& op_type, std::vector<std::string> inputs,
                 std::map<std::string, Attribute> attrs = {}, const std::string& domain = "") {
    return op_n(op_type, std::move(inputs), 1, std::move(attrs), {}, domain)[0];
  }
  std::string constant(Tensor host_tensor);
  std::string ints(const std::vector<int64_t>& v);  // int64 1-D constant
  // A rank-0 constant (scalar_constant); for a dtype without numbers it records the error in status() and returns
  // "" (an absent value).
  std::string scalar(double v, DType dtype);
  // Sums g (of shape `from`) down to `to` under numpy broadcasting (identity when equal).
  std::string sum_to(const std::string& g, const Shape& from, const Shape& to);
  void grad(size_t i, const std::string& value);

  // The first error of a helper above (OK when none failed): a rule's program is valid only when this is OK.
  const Status& status() const { return status_; }
  GradProgram take();

 private:
  const Node& node_;
  int32_t opset_;
  std::vector<TypeShape> in_, out_;
  std::vector<bool> needs_;
  std::vector<Tensor> values_;
  GradProgram prog_;
  int counter_ = 0;
  Status status_;
};

using GradRule = Status (*)(GradBuilder&);

// A rank-0 host tensor of `dtype` holding v (converted as static_cast does; f16 and bf16 rounded from f32): the
// constants of gradient programs and eager's scalar operands. INVALID_ARGUMENT for a dtype other than f32, f64, f16,
// bf16, i64 or i32.
StatusOr<Tensor> scalar_constant(double v, DType dtype);

// The rule for (domain, op_type) ("" = ai.onnx), or nullptr when the op has none (not differentiable here).
GradRule gradient_rule(const std::string& domain, const std::string& op_type);

// Ops (domain.op_type) with a gradient rule, for tests and documentation.
std::vector<std::string> differentiable_ops();

}  // namespace keel::ops
