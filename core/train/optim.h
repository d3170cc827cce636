// keel/core/train/optim.h — optimizers (SGD, Adam, AdamW), learning-rate schedulers, gradient clipping and a dynamic
// loss scaler for fp16 (PaddlePaddle's / PyTorch's GradScaler).
//
// Update rules are PyTorch's (torch.optim, foreach=False), written as eager ops under NoGradGuard, so they run on
// whatever device the parameters live on:
//   SGD:   g += wd·p;  b = momentum·b + (1 − dampening)·g  (b = g on the first step);  g = nesterov ? g + momentum·b :
//   b;
//          p −= lr·g
//   Adam:  g += wd·p;  m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²;
//          p −= lr/(1 − β1ᵗ) · m / (sqrt(v)/sqrt(1 − β2ᵗ) + eps)
//   AdamW: p *= 1 − lr·wd, then Adam without the wd term.
// Parameters without a gradient are skipped (their state untouched). Master weights stay in the parameters' dtype
// (fp32 under autocast: autocast casts copies, never the parameters). An f32 parameter on the CPU is updated in one
// pass over its memory instead (SGD from its second step, Adam/AdamW every step): the same operations in the same
// order, so the same bits as the eager ops; the moment and momentum buffers are then updated in place, as PyTorch's
// are.
//
// Schedulers compute the learning rate of step t in closed form from the optimizer's initial lr (PyTorch's formulas),
// so resuming at any t gives the same rate. Call step() once per epoch or per iteration, as PyTorch does.
//
// Thread-safety: an optimizer, a scheduler and a scaler are driven by one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/runtime/eager.h"
#include "core/train/checkpoint.h"

namespace keel::train {

using eager::Tensor;

struct ParamGroup {
  std::vector<Tensor> params;
  double lr = -1;            // < 0: the optimizer's lr
  double weight_decay = -1;  // < 0: the optimizer's weight_decay
  double initial_lr = 0;     // what schedulers scale (set from lr when the optimizer is built)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter that has a gradient. Throws eager::Error on device or shape problems.
  virtual void step() = 0;
  virtual std::string name() const = 0;
  void zero_grad();  // every parameter's grad becomes undefined (set_to_none)

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  double lr() const { return groups_.empty() ? 0 : groups_[0].lr; }
  void set_lr(double lr);  // every group

  // Per-parameter state (tensors named "<param index>.<buffer>") and hyper-parameters.
  virtual State state_dict() const;
  // Restores what state_dict() gave: the optimizer type, the number and shapes of parameters must match.
  virtual Status load_state_dict(const State& state);

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups);
  // Per-parameter buffers by name, parallel to the flattened parameter list.
  std::vector<std::map<std::string, Tensor>> state_;
  std::vector<int64_t> steps_;  // per parameter
  std::vector<Tensor*> flat_params();
  // Before a step writes the parameters: computes the deferred values that read them (eager::compute_deferred).
  void compute_deferred_reading_params();

 private:
  std::vector<ParamGroup> groups_;
};

struct SGDOptions {
  double lr = 0.01, momentum = 0, dampening = 0, weight_decay = 0;
  bool nesterov = false;
};
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  void step() override;
  std::string name() const override { return "SGD"; }
  const SGDOptions& options() const { return o_; }

 private:
  // One parameter by eager ops (the first step, which makes the momentum buffer, and what no fused path takes).
  void sgd_eager_update(Tensor& p, Tensor g, size_t idx, float lr, float wd);
  SGDOptions o_;
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
};
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options, bool decoupled_weight_decay = false);
  Adam(std::vector<ParamGroup> groups, AdamOptions options, bool decoupled_weight_decay = false);
  void step() override;
  std::string name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 private:
  // One parameter by eager ops (what no fused path takes: other dtypes, devices without an AdamStep kernel).
  void adam_eager_update(Tensor& p, Tensor g, size_t idx, double lr, double weight_decay, double bc2, double step_size);
  AdamOptions o_;
  bool decoupled_;
};
// AdamW: decoupled weight decay (default 0.01 as in PyTorch).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options) : Adam(std::move(params), options, true) {}
  static AdamOptions defaults() {
    AdamOptions o;
    o.weight_decay = 0.01;
    return o;
  }
};

// Scales gradients in place so that their global L2 norm (over all parameters with a gradient) is at most max_norm
// (PyTorch's clip_grad_norm_: coefficient max_norm / (norm + 1e-6), applied only when < 1). Returns the norm before
// clipping. error_if_nonfinite: a NaN/inf norm throws eager::Error instead.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite = false);

// --- learning-rate schedulers ---

class LRScheduler {
 public:
  explicit LRScheduler(Optimizer& opt) : opt_(opt) {}
  virtual ~LRScheduler() = default;
  // Advances one step and sets every group's lr to the rate of the new step.
  void step();
  int64_t last_step() const { return step_; }
  // The factor applied to a group's initial lr at step t (t = 0: before the first step()).
  virtual double factor(int64_t t) const = 0;
  State state_dict() const;
  Status load_state_dict(const State& s);  // restores the step and applies its rate

 protected:
  void apply();
  Optimizer& opt_;
  int64_t step_ = 0;
};

// lr = initial · gamma^floor(t / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  double factor(int64_t t) const override;

 private:
  int64_t size_;
  double gamma_;
};

// lr = initial · gamma^(number of milestones <= t)
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);
  double factor(int64_t t) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// lr = eta_min + (initial − eta_min)·(1 + cos(π·t/T_max))/2 (PyTorch's closed form; t is not clamped to T_max).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t t_max, double eta_min = 0);
  double factor(int64_t t) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warmup (PyTorch's LinearLR): factor goes from start_factor to end_factor over total_steps, then stays;
// `after`, when given, takes over once warmup is done, with its own step count starting at 0 (SequentialLR).
class LinearWarmupLR : public LRScheduler {
 public:
  LinearWarmupLR(Optimizer& opt, int64_t total_steps, double start_factor = 1.0 / 3, double end_factor = 1.0,
                 std::shared_ptr<LRScheduler> after = nullptr);
  double factor(int64_t t) const override;

 private:
  int64_t total_;
  double start_, end_;
  std::shared_ptr<LRScheduler> after_;
};

// --- dynamic loss scaling (fp16) ---

struct GradScalerOptions {
  double init_scale = 65536.0, growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

// Usage per iteration: scaler.scale(loss).backward(); scaler.step(opt); scaler.update();
// step() unscales the gradients (unless unscale_() was called, e.g. before clipping) and skips the optimizer step when
// any gradient holds inf/NaN; update() shrinks the scale by backoff_factor after such a step, and grows it by
// growth_factor after growth_interval consecutive good steps. Disabled: every call is a pass-through.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  Tensor scale(const Tensor& loss) const;
  // Divides the gradients by the scale and records whether any element of any is non-finite. Once per step. f32
  // gradients in host memory are unscaled in place, one pass each (as PyTorch's unscale_). On another device with a
  // keel.CheckFiniteAndUnscale kernel (the CUDA plugin's) one call per device does both for all its gradients, and the
  // unscaled tensors replace the parameters' .grad (a gradient tensor taken before keeps the scaled values); elsewhere
  // eager ops divide each .grad in place. Either way one flag per device is read back: one host sync per device and
  // step, not one per gradient.
  void unscale_(Optimizer& opt);
  // Returns true when the optimizer step ran, false when it was skipped.
  bool step(Optimizer& opt);
  void update();
  double get_scale() const { return scale_; }
  bool found_inf() const { return found_inf_; }
  int64_t skipped_steps() const { return skipped_; }
  bool enabled() const { return o_.enabled; }
  State state_dict() const;
  Status load_state_dict(const State& s);

 private:
  GradScalerOptions o_;
  double scale_;
  int64_t growth_tracker_ = 0, skipped_ = 0;
  bool unscaled_ = false, found_inf_ = false, stepped_ = false;
};

}  // namespace keel::train
