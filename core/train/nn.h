// keel/core/train/nn.h — layers in the style of PyTorch's C++ frontend (torch::nn), on eager tensors.
//
// A Module owns named parameters (leaves that require grad), buffers (state that is saved but not trained, e.g.
// BatchNorm's running statistics) and child modules. Names are dotted paths ("features.0.weight") in registration
// order, the order PyTorch gives, so state dicts line up with a PyTorch model of the same structure.
// Parameters live in slots with stable addresses: a layer keeps pointers to its own slots, so moving a module to
// another device (to()) or loading a state dict updates what forward() uses. to() replaces the parameter tensors
// (as PyTorch's does for a device change): move a module before building its optimizer.
//
// Initialisation follows PyTorch's defaults and draws from the global generator (eager::manual_seed):
// Linear/Conv2D/ConvTranspose2D weights kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)), biases
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm/LayerNorm weight 1, bias 0; Embedding N(0, 1).
//
// Errors: shape/device problems in forward() throw eager::Error (from the ops). load_state_dict returns a Status
// naming every missing or unexpected key and every size mismatch.
// Thread-safety: a module is used by one thread at a time (forward records autograd state on its parameters).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.h"
#include "core/runtime/eager.h"

namespace keel::train {

using eager::Tensor;
// An ordered list of (dotted name, tensor): parameters and buffers.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

namespace nn {

class Module {
 public:
  explicit Module(std::string type_name);
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The single-input forward pass. The base class throws eager::Error (the module has no single-input forward).
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  const std::string& type_name() const { return type_name_; }
  // One line per module with its configuration, indented like PyTorch's repr.
  std::string to_string() const;

  // Registration. Names must be non-empty, without '.', unique within this module (eager::Error otherwise).
  // Returns the slot (stable for the module's lifetime).
  Tensor* register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor* register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  int64_t num_parameters() const;

  // Training mode for this module and its children (Dropout and BatchNorm behave differently).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Parameters then buffers of each module, depth-first (PyTorch's order). Tensors alias the module's.
  StateDict state_dict() const;
  // Copies values in (dtype converted, no autograd). strict: every key of the module must be present and no other
  // key may be; always: shapes must match. The error lists every problem; on error nothing is changed.
  Status load_state_dict(const StateDict& state, bool strict = true);

  void zero_grad();  // every parameter's grad becomes undefined
  // Moves parameters and buffers to a device ("cuda", "cuda:1": eager::Tensor::to) or casts floating ones to a
  // dtype (in their slots).
  void to(const std::string& device);
  void to(DType dtype);

 protected:
  // Extra configuration for to_string() ("in_features=4, out_features=2").
  virtual std::string extra_repr() const { return {}; }

 private:
  struct Slot {
    std::string name;
    Tensor tensor;
  };
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  void check_name(const std::string& name) const;
  void collect(const std::string& prefix, bool params, bool buffers, bool recurse,
               std::vector<std::pair<std::string, Tensor*>>& out) const;
  void repr(std::string& out, int indent) const;

  std::string type_name_;
  bool training_ = true;
  std::deque<Slot> params_, buffers_;  // deque: slot addresses stay valid as more are added
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// --- layers ------------------------------------------------------------------------------------------------------

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }  // [out, in]
  Tensor& bias() { return *bias_; }      // [out]; undefined without bias
  void reset_parameters();

 protected:
  std::string extra_repr() const override;

 private:
  int64_t in_, out_;
  Tensor* weight_;
  Tensor* bias_;
  Tensor no_bias_;
};

struct Conv2DOptions {
  Conv2DOptions(int64_t in, int64_t out, std::array<int64_t, 2> k) : in_channels(in), out_channels(out), kernel(k) {}
  int64_t in_channels, out_channels;
  std::array<int64_t, 2> kernel;
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1}, output_padding{0, 0} /*transpose only*/;
  int64_t groups = 1;
  bool bias = true;
  // Conv2D only: forward returns relu(conv(x)) through eager::conv2d_relu (one fused kernel where the device has one;
  // Keras' activation="relu", Paddle fluid's act="relu").
  bool relu = false;
  Conv2DOptions& with_relu(bool on = true) {
    relu = on;
    return *this;
  }
  // Conv2D only: forward then max-pools over windows of max_pool (at that stride, no padding) — with relu through
  // eager::conv2d_relu_max_pool2d (one kernel on a CPU device, the convolution's output never stored whole); {0, 0}:
  // no pooling.
  std::array<int64_t, 2> max_pool{0, 0};
  Conv2DOptions& with_max_pool(int64_t k) {
    max_pool = {k, k};
    return *this;
  }
  Conv2DOptions& with_stride(int64_t s) {
    stride = {s, s};
    return *this;
  }
  Conv2DOptions& with_padding(int64_t p) {
    padding = {p, p};
    return *this;
  }
  Conv2DOptions& with_dilation(int64_t d) {
    dilation = {d, d};
    return *this;
  }
  Conv2DOptions& with_output_padding(int64_t p) {
    output_padding = {p, p};
    return *this;
  }
  Conv2DOptions& with_groups(int64_t g) {
    groups = g;
    return *this;
  }
  Conv2DOptions& with_bias(bool b) {
    bias = b;
    return *this;
  }
};

class Conv2D : public Module {
 public:
  Conv2D(int64_t in_channels, int64_t out_channels, int64_t kernel)
      : Conv2D(Conv2DOptions(in_channels, out_channels, {kernel, kernel})) {}
  explicit Conv2D(Conv2DOptions options);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }  // [out, in/groups, kh, kw]
  Tensor& bias() { return *bias_; }
  const Conv2DOptions& options() const { return o_; }

 protected:
  std::string extra_repr() const override;

 private:
  Conv2DOptions o_;
  Tensor* weight_;
  Tensor* bias_;
  Tensor no_bias_;
};

class ConvTranspose2D : public Module {
 public:
  ConvTranspose2D(int64_t in_channels, int64_t out_channels, int64_t kernel)
      : ConvTranspose2D(Conv2DOptions(in_channels, out_channels, {kernel, kernel})) {}
  explicit ConvTranspose2D(Conv2DOptions options);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }  // [in, out/groups, kh, kw]
  Tensor& bias() { return *bias_; }

 protected:
  std::string extra_repr() const override;

 private:
  Conv2DOptions o_;
  Tensor* weight_;
  Tensor* bias_;
  Tensor no_bias_;
};

class BatchNorm2D : public Module {
 public:
  explicit BatchNorm2D(int64_t num_features, float eps = 1e-5f, float momentum = 0.1f, bool affine = true,
                       bool track_running_stats = true);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }
  Tensor& running_mean() { return *mean_; }
  Tensor& running_var() { return *var_; }
  int64_t num_batches_tracked() const;

  // SyncBatchNorm (sync_batch_norm in data_parallel.h sets it): in training, the batch statistics are taken over every
  // replica's batch: the element count and each per-channel sum go through `reduce`, a differentiable sum across the
  // replicas, before use (two passes: the mean, then the squared deviations from it). Empty (the default): this
  // process's batch alone.
  using StatsReducer = std::function<Tensor(const Tensor&)>;
  void set_stats_reducer(StatsReducer reduce) { reduce_ = std::move(reduce); }
  bool synchronized() const { return static_cast<bool>(reduce_); }

 protected:
  std::string extra_repr() const override;

 private:
  Tensor synchronized_forward(const Tensor& x, const Tensor& w, const Tensor& b);
  StatsReducer reduce_;
  int64_t n_;
  float eps_, momentum_;
  bool affine_, track_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor* mean_ = nullptr;
  Tensor* var_ = nullptr;
  Tensor* tracked_ = nullptr;
  Tensor none_;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, float eps = 1e-5f, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor& weight() { return *weight_; }
  Tensor& bias() { return *bias_; }

 protected:
  std::string extra_repr() const override;

 private:
  std::vector<int64_t> shape_;
  float eps_;
  Tensor* weight_ = nullptr;
  Tensor* bias_ = nullptr;
  Tensor none_;
};

class Dropout : public Module {
 public:
  explicit Dropout(float p = 0.5f);
  Tensor forward(const Tensor& x) override;

 protected:
  std::string extra_repr() const override;

 private:
  float p_;
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;  // int64 indices of any shape -> [..., dim]
  Tensor& weight() { return *weight_; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t num_, dim_;
  Tensor* weight_;
};

class MaxPool2D : public Module {
 public:
  explicit MaxPool2D(int64_t kernel, int64_t stride = 0 /*0 = kernel*/, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  int64_t kernel() const { return k_; }
  int64_t stride() const { return s_; }
  int64_t padding() const { return p_; }

 protected:
  std::string extra_repr() const override;

 private:
  int64_t k_, s_, p_;
};

class AvgPool2D : public Module {
 public:
  explicit AvgPool2D(int64_t kernel, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;

 protected:
  std::string extra_repr() const override;

 private:
  int64_t k_, s_, p_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return eager::relu(x); }
};
class GELU : public Module {
 public:
  GELU() : Module("GELU") {}
  Tensor forward(const Tensor& x) override { return eager::gelu(x); }
};
class Sigmoid : public Module {
 public:
  Sigmoid() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override { return eager::sigmoid(x); }
};
class Tanh : public Module {
 public:
  Tanh() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override { return eager::tanh(x); }
};
// Flattens dims >= start_dim into one (PyTorch's Flatten(start_dim, end_dim = -1)).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1) : Module("Flatten"), start_(start_dim) {}
  Tensor forward(const Tensor& x) override;

 private:
  int64_t start_;
};

// Runs its children in order; they are named "0", "1", ... A Conv2D (of no activation or pooling of its own) followed
// by a ReLU, and then by a MaxPool2D whose stride is its kernel and that pads nothing, runs as the one module
// Conv2DOptions(...).with_relu().with_max_pool(k) would: eager::conv2d_relu_max_pool2d (or conv2d_relu without the
// pooling), one kernel on the CPU that never stores the convolution's output whole. The same parameters and the same
// results as the layers one by one (the fused ops have their own gradients); exactly these classes, not subclasses,
// which may override forward. On the CPU the layers called one by one fuse as well (eager::conv2d defers its
// computation, see eager.h); Sequential fuses on every device (conv2d_relu on a GPU).
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  Sequential& push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return named_children().size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return named_children().at(i).second; }
};

// --- losses (PyTorch's, reduction "mean" | "sum" | "none") ---------------------------------------------------------

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return eager::cross_entropy(logits, target, reduction_);
  }

 private:
  std::string reduction_;
};
class MSELoss {
 public:
  explicit MSELoss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return eager::mse_loss(input, target, reduction_);
  }

 private:
  std::string reduction_;
};
class BCEWithLogitsLoss {
 public:
  explicit BCEWithLogitsLoss(std::string reduction = "mean") : reduction_(std::move(reduction)) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return eager::binary_cross_entropy_with_logits(logits, target, reduction_);
  }

 private:
  std::string reduction_;
};

// Knowledge distillation's soft loss (Hinton, Vinyals & Dean 2015; PaddleSlim's soft-label loss): the
// Kullback-Leibler divergence of the student's softened class distribution from the teacher's,
//   T^2 * KL(softmax(teacher / T) || softmax(student / T)) = T^2 * sum_c p_c * (log p_c - log q_c),
// over the classes (axis 1) of logits [N, C], reduced over the N rows: "batchmean" (the sum divided by N, PyTorch's
// kl_div(reduction="batchmean")), "sum" or "none" ([N]). The T^2 factor keeps the soft gradient, T * (q - p) / N with
// respect to the student's logits, on the scale of the label loss as T changes. The teacher's logits are a constant
// (detached; no gradient reaches them). Errors (eager::Error): temperature not a positive finite number, logits not
// both [N, C] of one shape, an unknown reduction.
Tensor distillation_kl(const Tensor& student_logits, const Tensor& teacher_logits, float temperature,
                       const std::string& reduction = "batchmean");

// alpha * distillation_kl(student, teacher, T) + (1 - alpha) * cross_entropy(student, target): the distillation
// objective `keel train --teacher` minimises (PaddleSlim / Hinton), "batchmean" and "mean" reductions. alpha in [0, 1]
// (0: the label loss alone; 1: the teacher alone), temperature > 0; the constructor throws eager::Error otherwise.
class DistillationLoss {
 public:
  explicit DistillationLoss(float temperature = 4.f, float alpha = 0.9f);
  struct Parts {
    Tensor loss;  // the weighted sum (what backward() starts from)
    Tensor soft;  // T^2 * KL (unweighted)
    Tensor hard;  // cross-entropy with the labels (unweighted)
  };
  Parts parts(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& target) const;
  Tensor operator()(const Tensor& student_logits, const Tensor& teacher_logits, const Tensor& target) const {
    return parts(student_logits, teacher_logits, target).loss;
  }
  float temperature() const { return temperature_; }
  float alpha() const { return alpha_; }

 private:
  float temperature_, alpha_;
};

}  // namespace nn
}  // namespace keel::train
