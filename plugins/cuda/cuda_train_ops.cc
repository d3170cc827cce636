// plugins/cuda/cuda_train_ops.cc — host side of the CUDA plugin's training kernels: the keel-domain backward ops
// that the gradient rules (ops/gradients.cc) emit and the ONNX loss that eager training runs forward.
//
//   keel.ConvGrad            dX by cudnnConvolutionBackwardData, dW by cudnnConvolutionBackwardFilter, dB by a
//                            per-channel sum; 1-D / 2-D / 3-D, groups, strides, dilations, pads (asymmetric ones:
//                            X padded explicitly by the difference, dX cropped out, as the forward Conv). The two
//                            algorithms are chosen once per shape (cuDNN's heuristics, workspace bounded as the
//                            forward's) and cached in the kernel with the descriptors (KEEL_CUDNN_GRAPH=1: both
//                            through cuDNN's graph API with cached plans, cuda_dnn_graph.h). A dY whose spatial size
//                            is not the convolution's output is rejected (the CPU runs it).
//   keel.MaxPoolGrad, keel.AveragePoolGrad     own scatter kernels (f32 atomics; direct writes in the data's dtype
//                            when windows do not overlap), 1-3 spatial dims, the pooling attributes as the forward
//                            (auto_pad, ceil_mode, dilations, count_include_pad).
//   keel.ReluGrad, SigmoidGrad, TanhGrad, GeluGrad, LeakyReluGrad             element-wise.
//   SoftmaxCrossEntropyLoss  (ai.onnx 12+) loss and log_prob, weights, ignore_index, reduction none / sum / mean;
//                            keel.SoftmaxCrossEntropyLossGrad.
//   keel.BatchNormTraining   batch statistics (f64 sums), Y, mean, invstd, unbiased variance; keel.BatchNormGrad.
//   keel.LayerNormGrad       dX per row, dScale / dB as column sums; statistics in the data's dtype or f32.
//   keel.GatherGrad          zeros plus an atomic scatter-add of dY at the indices.
//   keel.DropoutMask         training dropout's mask from a counter-based stream (the seed read on the device).
//   Momentum                 (ai.onnx.preview.training) SGD with momentum over many f32 tensors in one launch.
//   keel.AdamStep            Adam / AdamW (PyTorch's formulas) over many f32 tensors in one launch.
//   keel.CheckFiniteAndUnscale  GradScaler's unscale and inf/NaN flag over many gradients in one launch.
//
// Semantics are the reference kernels' (ops/reference/grad.cc, misc.cc); the device conformance suite checks them.
// Dtypes f32, f16, bf16 (one dtype per call, as the schemas say); anything else is rejected at create, so the core
// runs the node on the CPU. Every kernel launches on the kernel context's stream and does not synchronise, except
// SoftmaxCrossEntropyLoss, which reads back one flag to report an out-of-range label as the reference does.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "cuda_common.h"
#include "cuda_dnn_graph.h"
#include "cuda_dnn_kernels.h"
#include "cuda_dnn_util.h"
#include "cuda_train_kernels.h"

namespace keel::cuda {
namespace {

using namespace dnn;  // cuda_dnn_util.h: is_float, invalid, unimplemented, geometry, cuDNN plumbing

void require_same_float(const Ctx& c, int first, int last) {
  const int32_t dt = c.dtype(first);
  if (!is_float(dt)) throw Reject{"dtype " + std::to_string(dt) + " (only f32, f16, bf16)"};
  for (int i = first + 1; i <= last && i < c.input_count(); ++i)
    if (c.has_input(i) && c.dtype(i) != dt) throw Reject{"inputs of different dtypes"};
}
bool is_index(int32_t t) { return t == KEEL_DTYPE_I32 || t == KEEL_DTYPE_I64; }
bool wants(const Ctx& c, int i) { return i < c.output_count() && c.output_dtype(i) != KEEL_DTYPE_UNDEFINED; }
int64_t axis_of(int64_t axis, int64_t rank, const char* op) {
  if (axis < -rank || axis >= rank)
    throw invalid(std::string(op) + ": axis " + std::to_string(axis) + " out of range for rank " +
                  std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

// ---------------------------------------------------------------------------------------------------------------
// Activation gradients: (dY, Y or X) -> dX
// ---------------------------------------------------------------------------------------------------------------

class ActGradK : public Kernel {
 public:
  explicit ActGradK(ActGrad op) : op_(op) {}
  void setup(Ctx& c) override {
    require_same_float(c, 0, 1);
    alpha_ = c.attr_f("alpha", 0.01f);
    // Its GELU derivative is the erf form's: the tanh approximation's goes to another kernel (the reference one).
    if (op_ == ActGrad::kGelu && c.attr_s("approximate", "none") != "none") throw Reject{"approximate = tanh"};
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    if (c.dims(1) != d) throw invalid("dY " + dims_str(d) + " and " + dims_str(c.dims(1)) + " differ in shape");
    keel_tensor_t* dx = c.output(0, d);
    check_cuda(launch_act_grad(op_, c.dtype(0), c.data(0), c.data(1), dx->data, numel(d), alpha_, c.stream()),
               ("activation gradient, " + dims_str(d)).c_str());
  }

 private:
  ActGrad op_;
  float alpha_ = 0.01f;
};

// ---------------------------------------------------------------------------------------------------------------
// Pooling backward
// ---------------------------------------------------------------------------------------------------------------

class PoolGradK : public Kernel {
 public:
  explicit PoolGradK(bool max) : max_(max) {}
  void setup(Ctx& c) override {
    require_same_float(c, 0, max_ ? 1 : 0);
    if (c.attr_i("storage_order", 0) != 0) throw Reject{"storage_order = 1"};
    attrs_.read(c, true);
    include_pad_ = c.attr_i("count_include_pad", 0) != 0;
    if (!max_) input_shape_ = c.attr_ints("input_shape", {});
    if (attrs_.kernel_shape.empty()) throw Reject{"attribute kernel_shape is required"};
    if (attrs_.kernel_shape.size() > static_cast<size_t>(kPoolMaxDims)) throw Reject{"more than 3 spatial dims"};
  }
  void run(Ctx& c) override {
    const char* op = max_ ? "MaxPoolGrad" : "AveragePoolGrad";
    const Dims dy = c.dims(0);
    const Dims x = max_ ? c.dims(1) : input_shape_;
    if (!max_ && x.empty()) throw invalid("AveragePoolGrad: attribute input_shape is required");
    if (x.size() < 3 || dy.size() != x.size() || dy[0] != x[0] || dy[1] != x[1])
      throw invalid(std::string(op) + ": dY " + dims_str(dy) + " does not match the pooled input " + dims_str(x));
    const Dims in(x.begin() + 2, x.end());
    const Geom g = make_geom(attrs_, in, attrs_.kernel_shape, op);
    if (Dims(dy.begin() + 2, dy.end()) != g.out)
      throw invalid(std::string(op) + ": dY " + dims_str(dy) + " does not match the pooling output " + dims_str(g.out));
    PoolGeom pg;
    pg.r = g.r;
    pg.nc = x[0] * x[1];
    for (int d = 0; d < g.r; ++d) {
      pg.in[d] = g.in[d];
      pg.out[d] = g.out[d];
      pg.kernel[d] = g.kernel[d];
      pg.strides[d] = g.strides[d];
      pg.dilations[d] = g.dilations[d];
      pg.pad_begin[d] = g.pads[d];
      pg.pad_end[d] = g.pads[d + g.r];
    }
    const int32_t dt = c.dtype(0);
    keel_tensor_t* dx = c.output(0, x);
    // An f32 accumulator for overlapping windows in f16 / bf16 (none for disjoint ones: LeNet's 2x2 / 2 in fp16 took
    // an f32 copy of X's size, the largest block of a SimpleCNN step's device memory).
    float* acc = dt == KEEL_DTYPE_F32 || pool_windows_disjoint(pg)
                     ? nullptr
                     : static_cast<float*>(c.workspace(static_cast<uint64_t>(numel(x)) * sizeof(float)));
    const std::string what = std::string(op) + ", dY " + dims_str(dy) + ", X " + dims_str(x);
    if (max_) check_cuda(launch_max_pool_grad(dt, c.data(0), c.data(1), dx->data, acc, pg, c.stream()), what.c_str());
    else check_cuda(launch_average_pool_grad(dt, c.data(0), dx->data, acc, pg, include_pad_, c.stream()), what.c_str());
  }

 private:
  bool max_;
  SpatialAttrs attrs_;
  bool include_pad_ = false;
  Dims input_shape_;
};

// ---------------------------------------------------------------------------------------------------------------
// Softmax cross-entropy
// ---------------------------------------------------------------------------------------------------------------

struct XentAttrs {
  int32_t reduction = 2;
  bool has_ignore = false;
  int64_t ignore = 0;
  void read(const Ctx& c) {
    const std::string r = c.attr_s("reduction", "mean");
    if (r == "none") reduction = 0;
    else if (r == "sum") reduction = 1;
    else if (r == "mean") reduction = 2;
    else throw Reject{"unknown reduction '" + r + "'"};
    if (auto i = c.attr_i_opt("ignore_index")) {
      has_ignore = true;
      ignore = *i;
    }
  }
};

// [N, C, D...] -> N, C, D and the labels' shape [N, D...]; throws Failure naming `what` unless labels match.
void xent_dims(const Dims& x, const Dims& labels, const char* what, int64_t* N, int64_t* C, int64_t* D) {
  if (x.size() < 2) throw invalid(std::string(what) + " must have rank >= 2 ([N, C, ...]), got " + dims_str(x));
  Dims t = x;
  t.erase(t.begin() + 1);
  if (labels != t) throw invalid("labels shape " + dims_str(labels) + " should be " + dims_str(t));
  *N = x[0];
  *C = x[1];
  *D = 1;
  for (size_t i = 2; i < x.size(); ++i) *D *= x[i];
}

class SoftmaxXentK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 0);
    if (c.input_count() > 2 && c.has_input(2) && c.dtype(2) != c.dtype(0)) throw Reject{"weights of another dtype"};
    if (!is_index(c.dtype(1))) throw Reject{"labels are not int32/int64"};
    a_.read(c);
  }
  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    int64_t N = 0, C = 0, D = 0;
    xent_dims(x, c.dims(1), "scores", &N, &C, &D);
    const bool has_w = c.input_count() > 2 && c.has_input(2);
    if (has_w && numel(c.dims(2)) != C) throw invalid("weights must have C = " + std::to_string(C) + " entries");
    Dims ls = a_.reduction == 0 ? c.dims(1) : Dims{};
    keel_tensor_t* loss = c.output(0, ls);
    void* lp = wants(c, 1) ? c.output(1, x)->data : nullptr;
    const int64_t rows = N * D;
    auto* ws = static_cast<char*>(c.workspace(static_cast<uint64_t>(2 * rows) * sizeof(float) + 16));
    auto* bad = reinterpret_cast<int32_t*>(ws);
    auto* scratch = reinterpret_cast<float*>(ws + 16);
    const std::string what = "SoftmaxCrossEntropyLoss, scores " + dims_str(x);
    check_cuda(cudaMemsetAsync(bad, 0, sizeof(int32_t), c.stream()), what.c_str());
    check_cuda(launch_softmax_xent(c.dtype(0), c.data(0), c.dtype(1), c.data(1), has_w ? c.data(2) : nullptr, N, C, D,
                                   a_.has_ignore, a_.ignore, a_.reduction, loss->data, lp, scratch, bad, c.stream()),
               what.c_str());
    // An out-of-range label is an error of this call (as the reference says), which needs the flag on the host.
    int32_t h = 0;
    check_cuda(cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, c.stream()), what.c_str());
    check_cuda(cudaStreamSynchronize(c.stream()), what.c_str());
    if (h) throw invalid("SoftmaxCrossEntropyLoss: a label is out of range [0, " + std::to_string(C) + ")");
  }

 private:
  XentAttrs a_;
};

class SoftmaxXentGradK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 1);
    if (c.input_count() > 3 && c.has_input(3) && c.dtype(3) != c.dtype(0)) throw Reject{"weights of another dtype"};
    if (!is_index(c.dtype(2))) throw Reject{"labels are not int32/int64"};
    a_.read(c);
  }
  void run(Ctx& c) override {
    const Dims dl = c.dims(0), lp = c.dims(1);
    int64_t N = 0, C = 0, D = 0;
    xent_dims(lp, c.dims(2), "log_prob", &N, &C, &D);
    if ((a_.reduction == 0 && dl != c.dims(2)) || (a_.reduction != 0 && numel(dl) != 1))
      throw invalid("dLoss shape " + dims_str(dl) + " does not match the reduction");
    const bool has_w = c.input_count() > 3 && c.has_input(3);
    if (has_w && numel(c.dims(3)) != C) throw invalid("weights must have C = " + std::to_string(C) + " entries");
    keel_tensor_t* dx = c.output(0, lp);
    auto* scratch = static_cast<float*>(c.workspace(sizeof(float)));
    check_cuda(
        launch_softmax_xent_grad(c.dtype(0), c.data(0), c.data(1), c.dtype(2), c.data(2), has_w ? c.data(3) : nullptr,
                                 N, C, D, a_.has_ignore, a_.ignore, a_.reduction, dx->data, scratch, c.stream()),
        ("SoftmaxCrossEntropyLossGrad, log_prob " + dims_str(lp)).c_str());
  }

 private:
  XentAttrs a_;
};

// ---------------------------------------------------------------------------------------------------------------
// Normalisation
// ---------------------------------------------------------------------------------------------------------------

// N, C, S of an [N, C, ...] tensor; throws Failure for rank < 2.
void ncs(const Dims& x, const char* what, int64_t* N, int64_t* C, int64_t* S) {
  if (x.size() < 2) throw invalid(std::string(what) + " must have rank >= 2, got " + dims_str(x));
  *N = x[0];
  *C = x[1];
  *S = 1;
  for (size_t i = 2; i < x.size(); ++i) *S *= x[i];
}

class BatchNormTrainK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 2);
    if (c.input_count() < 3 || !c.has_input(1) || !c.has_input(2)) throw Reject{"needs X, scale and B"};
    eps_ = c.attr_f("epsilon", 1e-5f);
  }
  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    int64_t N = 0, C = 0, S = 0;
    ncs(x, "BatchNormTraining X", &N, &C, &S);
    if (numel(c.dims(1)) != C || numel(c.dims(2)) != C)
      throw invalid("BatchNormTraining: scale and B must have " + std::to_string(C) + " entries");
    if (N * S == 0) throw invalid("BatchNormTraining: batch statistics over an empty batch, X " + dims_str(x));
    keel_tensor_t* y = c.output(0, x);
    void* st[3] = {nullptr, nullptr, nullptr};
    for (int i = 1; i <= 3; ++i)
      if (wants(c, i)) st[i - 1] = c.output(i, {C})->data;
    auto* scratch = static_cast<double*>(c.workspace(static_cast<uint64_t>(2 * C) * sizeof(double)));
    check_cuda(launch_batch_norm_train(c.dtype(0), c.data(0), c.data(1), c.data(2), y->data, st[0], st[1], st[2], N, C,
                                       S, eps_, scratch, c.stream()),
               ("BatchNormTraining, X " + dims_str(x)).c_str());
  }

 private:
  float eps_ = 1e-5f;
};

class BatchNormGradK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 4);
    if (c.input_count() < 5) throw Reject{"needs dY, X, scale, mean, invstd"};
  }
  void run(Ctx& c) override {
    const Dims dy = c.dims(0), x = c.dims(1), sc = c.dims(2);
    if (dy != x) throw invalid("BatchNormGrad: dY " + dims_str(dy) + " and X " + dims_str(x) + " must match");
    int64_t N = 0, C = 0, S = 0;
    ncs(x, "BatchNormGrad X", &N, &C, &S);
    if (numel(sc) != C || numel(c.dims(3)) != C || numel(c.dims(4)) != C)
      throw invalid("BatchNormGrad: scale, mean, invstd must have " + std::to_string(C) + " entries");
    void* dx = wants(c, 0) ? c.output(0, x)->data : nullptr;
    void* ds = wants(c, 1) ? c.output(1, sc)->data : nullptr;
    void* db = wants(c, 2) ? c.output(2, sc)->data : nullptr;
    auto* scratch = static_cast<double*>(c.workspace(static_cast<uint64_t>(2 * C) * sizeof(double)));
    check_cuda(launch_batch_norm_grad(c.dtype(0), c.data(0), c.data(1), c.data(2), c.data(3), c.data(4), dx, ds, db, N,
                                      C, S, scratch, c.stream()),
               ("BatchNormGrad, X " + dims_str(x)).c_str());
  }
};

class LayerNormGradK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 2);
    if (c.input_count() < 5) throw Reject{"needs dY, X, scale, mean, invstd"};
    const int32_t sdt = c.dtype(3);
    if (c.dtype(4) != sdt || (sdt != c.dtype(0) && sdt != KEEL_DTYPE_F32))
      throw Reject{"mean / invstd dtype " + std::to_string(sdt) + " (the data's or f32)"};
    axis_ = c.attr_i("axis", -1);
  }
  void run(Ctx& c) override {
    const Dims dy = c.dims(0), x = c.dims(1), sc = c.dims(2);
    if (dy != x) throw invalid("LayerNormGrad: dY " + dims_str(dy) + " and X " + dims_str(x) + " differ");
    const int64_t r = static_cast<int64_t>(x.size());
    const int64_t axis = axis_of(axis_, r, "LayerNormGrad");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < r; ++d) (d < axis ? outer : inner) *= x[d];
    if (numel(sc) != inner)
      throw invalid("LayerNormGrad: scale must have " + std::to_string(inner) + " entries (the normalised dims)");
    if (numel(c.dims(3)) != outer || numel(c.dims(4)) != outer)
      throw invalid("LayerNormGrad: mean and invstd must have " + std::to_string(outer) + " entries");
    void* dx = wants(c, 0) ? c.output(0, x)->data : nullptr;
    void* ds = wants(c, 1) ? c.output(1, sc)->data : nullptr;
    void* db = wants(c, 2) ? c.output(2, sc)->data : nullptr;
    check_cuda(launch_layer_norm_grad(c.dtype(0), c.dtype(3), c.data(0), c.data(1), c.data(2), c.data(3), c.data(4), dx,
                                      ds, db, outer, inner, c.stream()),
               ("LayerNormGrad, X " + dims_str(x)).c_str());
  }

 private:
  int64_t axis_ = -1;
};

// ---------------------------------------------------------------------------------------------------------------
// GatherGrad
// ---------------------------------------------------------------------------------------------------------------

class GatherGradK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 0);
    if (!is_index(c.dtype(1))) throw Reject{"indices are not int32/int64"};
    axis_ = c.attr_i("axis", 0);
    data_ = c.attr_ints("data_shape", {});
  }
  void run(Ctx& c) override {
    if (!c.has_attr_ints("data_shape")) throw invalid("GatherGrad: attribute data_shape is required");
    const int64_t r = static_cast<int64_t>(data_.size());
    if (r == 0) throw invalid("GatherGrad: data_shape is a scalar");
    const int64_t axis = axis_of(axis_, r, "GatherGrad");
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= data_[d];
    for (int64_t d = axis + 1; d < r; ++d) inner *= data_[d];
    const int64_t A = data_[axis], J = numel(c.dims(1));
    const Dims dy = c.dims(0);
    if (numel(dy) != outer * J * inner)
      throw invalid("GatherGrad: dY " + dims_str(dy) + " does not match data_shape " + dims_str(data_) + " and " +
                    std::to_string(J) + " indices");
    const int32_t dt = c.dtype(0);
    keel_tensor_t* out = c.output(0, data_);
    float* acc = dt == KEEL_DTYPE_F32
                     ? nullptr
                     : static_cast<float*>(c.workspace(static_cast<uint64_t>(numel(data_)) * sizeof(float)));
    check_cuda(launch_gather_grad(dt, c.data(0), c.dtype(1), c.data(1), out->data, acc, outer, A, inner, J, c.stream()),
               ("GatherGrad, dY " + dims_str(dy) + ", data " + dims_str(data_)).c_str());
  }

 private:
  int64_t axis_ = 0;
  Dims data_;
};

// ---------------------------------------------------------------------------------------------------------------
// DropoutMask
// ---------------------------------------------------------------------------------------------------------------

class DropoutMaskK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (!is_float(c.dtype(0))) throw Reject{"X dtype " + std::to_string(c.dtype(0)) + " (only f32, f16, bf16)"};
    if (!is_index(c.dtype(1))) throw Reject{"seed is not int32/int64"};
    const float ratio = c.attr_f("ratio", 0.5f);
    if (!(ratio >= 0.f && ratio < 1.f))
      throw invalid("DropoutMask: ratio must be in [0, 1), got " + std::to_string(ratio));
    cut_ = static_cast<uint32_t>(std::llround(static_cast<double>(ratio) * 4294967296.0));
    kept_ = static_cast<float>(1.0 / (1.0 - static_cast<double>(ratio)));
  }
  void run(Ctx& c) override {
    if (numel(c.dims(1)) != 1) throw invalid("DropoutMask: seed must hold one value, got " + dims_str(c.dims(1)));
    const Dims d = c.dims(0);
    keel_tensor_t* m = c.output(0, d);
    check_cuda(launch_dropout_mask(c.dtype(0), m->data, numel(d), c.dtype(1), c.data(1), cut_, kept_, c.stream()),
               ("DropoutMask, " + dims_str(d)).c_str());
  }

 private:
  uint32_t cut_ = 0;
  float kept_ = 2.f;
};

// ---------------------------------------------------------------------------------------------------------------
// Momentum (ai.onnx.preview.training): R, T, X1..Xn, G1..Gn, V1..Vn -> X1_new..Xn_new, V1_new..Vn_new
// ---------------------------------------------------------------------------------------------------------------

class MomentumK : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int rest = c.input_count() - 2;
    if (rest <= 0 || rest % 3 != 0) throw Reject{"inputs are not R, T and three groups of tensors"};
    n_ = rest / 3;
    if (c.output_count() != 2 * n_) throw Reject{"outputs are not X_new... and V_new..."};
    if (c.dtype(0) != KEEL_DTYPE_F32) throw Reject{"R is not f32"};
    if (c.dtype(1) != KEEL_DTYPE_I64) throw Reject{"T is not int64"};
    for (int i = 2; i < c.input_count(); ++i)
      if (c.dtype(i) != KEEL_DTYPE_F32) throw Reject{"a tensor that is not f32 (only f32 here)"};
    if (!c.has_attr("alpha") || !c.has_attr("beta") || !c.has_attr("norm_coefficient") || !c.has_attr("mode"))
      throw invalid("Momentum: attributes alpha, beta, mode and norm_coefficient are required");
    alpha_ = c.attr_f("alpha", 0.f);
    beta_ = c.attr_f("beta", 0.f);
    norm_ = c.attr_f("norm_coefficient", 0.f);
    const std::string mode = c.attr_s("mode", "standard");
    if (mode != "standard" && mode != "nesterov")
      throw invalid("Momentum: mode must be standard or nesterov, got '" + mode + "'");
    nesterov_ = mode == "nesterov";
  }
  void run(Ctx& c) override {
    if (numel(c.dims(0)) != 1 || numel(c.dims(1)) != 1) throw invalid("Momentum: R and T must be scalars");
    MomentumTensors ts;
    for (int i = 0; i < n_; ++i) {
      const Dims d = c.dims(2 + i);
      if (c.dims(2 + n_ + i) != d || c.dims(2 + 2 * n_ + i) != d)
        throw invalid("Momentum: X" + std::to_string(i + 1) + " " + dims_str(d) + ", its gradient and its momentum " +
                      "differ in shape");
      ts.x[ts.count] = static_cast<const float*>(c.data(2 + i));
      ts.g[ts.count] = static_cast<const float*>(c.data(2 + n_ + i));
      ts.v[ts.count] = static_cast<const float*>(c.data(2 + 2 * n_ + i));
      ts.x_out[ts.count] = static_cast<float*>(c.output(i, d)->data);
      ts.v_out[ts.count] = static_cast<float*>(c.output(n_ + i, d)->data);
      ts.n[ts.count] = numel(d);
      if (++ts.count == kMomentumTensors || i + 1 == n_) {
        check_cuda(launch_momentum(ts, static_cast<const float*>(c.data(0)), static_cast<const int64_t*>(c.data(1)),
                                   alpha_, beta_, norm_, nesterov_, c.stream()),
                   ("Momentum over " + std::to_string(n_) + " tensor(s)").c_str());
        ts.count = 0;
      }
    }
  }

 private:
  int n_ = 0;
  float alpha_ = 0.f, beta_ = 0.f, norm_ = 0.f;
  bool nesterov_ = false;
};

// ---------------------------------------------------------------------------------------------------------------
// keel.AdamStep: scalars, P1..Pn, G1..Gn, M1..Mn, V1..Vn -> P_new..., M_new..., V_new...
// ---------------------------------------------------------------------------------------------------------------

class AdamStepK : public Kernel {
 public:
  void setup(Ctx& c) override {
    const int rest = c.input_count() - 1;
    if (rest <= 0 || rest % 4 != 0) throw Reject{"inputs are not scalars and four groups of tensors"};
    n_ = rest / 4;
    if (c.output_count() != 3 * n_) throw Reject{"outputs are not P_new..., M_new..., V_new..."};
    for (int i = 0; i < c.input_count(); ++i)
      if (c.dtype(i) != KEEL_DTYPE_F32) throw Reject{"a tensor that is not f32 (only f32 here)"};
  }
  void run(Ctx& c) override {
    if (numel(c.dims(0)) != 9) throw invalid("AdamStep: scalars must hold 9 values, got " + dims_str(c.dims(0)));
    AdamTensors ts;
    for (int i = 0; i < n_; ++i) {
      const Dims d = c.dims(1 + i);
      for (int g = 1; g < 4; ++g)
        if (c.dims(1 + g * n_ + i) != d)
          throw invalid("AdamStep: P" + std::to_string(i + 1) + " " + dims_str(d) + ", its gradient and its moments " +
                        "differ in shape");
      ts.p[ts.count] = static_cast<const float*>(c.data(1 + i));
      ts.g[ts.count] = static_cast<const float*>(c.data(1 + n_ + i));
      ts.m[ts.count] = static_cast<const float*>(c.data(1 + 2 * n_ + i));
      ts.v[ts.count] = static_cast<const float*>(c.data(1 + 3 * n_ + i));
      ts.p_out[ts.count] = static_cast<float*>(c.output(i, d)->data);
      ts.m_out[ts.count] = static_cast<float*>(c.output(n_ + i, d)->data);
      ts.v_out[ts.count] = static_cast<float*>(c.output(2 * n_ + i, d)->data);
      ts.n[ts.count] = numel(d);
      if (++ts.count == kMomentumTensors || i + 1 == n_) {
        check_cuda(launch_adam_step(ts, static_cast<const float*>(c.data(0)), c.stream()),
                   ("AdamStep over " + std::to_string(n_) + " tensor(s)").c_str());
        ts.count = 0;
      }
    }
  }

 private:
  int n_ = 0;
};

// ---------------------------------------------------------------------------------------------------------------
// keel.CheckFiniteAndUnscale: inv_scale, G1..Gn -> found_inf, U1..Un
// ---------------------------------------------------------------------------------------------------------------

class CheckFiniteAndUnscaleK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (c.input_count() < 2 || c.output_count() != c.input_count())
      throw Reject{"inputs are not inv_scale and gradients, or outputs not found_inf and one per gradient"};
    if (c.dtype(0) != KEEL_DTYPE_F32) throw Reject{"inv_scale is not f32"};
    dt_ = c.dtype(1);
    if (!is_float(dt_)) throw Reject{"gradient dtype " + std::to_string(dt_) + " (only f32, f16, bf16)"};
    for (int i = 2; i < c.input_count(); ++i)
      if (c.dtype(i) != dt_) throw Reject{"gradients of different dtypes"};
  }
  void run(Ctx& c) override {
    if (numel(c.dims(0)) != 1) throw invalid("CheckFiniteAndUnscale: inv_scale must hold one value");
    const int n = c.input_count() - 1;
    auto* found = static_cast<float*>(c.output(0, {})->data);
    check_cuda(cudaMemsetAsync(found, 0, sizeof(float), c.stream()), "CheckFiniteAndUnscale flag");
    UnscaleTensors ts;
    for (int i = 0; i < n; ++i) {
      const Dims d = c.dims(1 + i);
      ts.g[ts.count] = c.data(1 + i);
      ts.u[ts.count] = c.output(1 + i, d)->data;
      ts.n[ts.count] = numel(d);
      if (++ts.count == kMomentumTensors || i + 1 == n) {
        check_cuda(launch_check_finite_and_unscale(ts, dt_, static_cast<const float*>(c.data(0)), found, c.stream()),
                   "CheckFiniteAndUnscale");
        ts.count = 0;
      }
    }
  }

 private:
  int32_t dt_ = KEEL_DTYPE_F32;
};

#if KEEL_CUDA_HAVE_CUDNN

void zero(keel_tensor_t* t, const Dims& d, int32_t dtype, cudaStream_t s) {
  const int64_t n = numel(d);
  if (n > 0)
    check_cuda(cudaMemsetAsync(t->data, 0, static_cast<size_t>(n) * static_cast<size_t>(dtype_size(dtype)), s),
               "memset");
}

// ---------------------------------------------------------------------------------------------------------------
// ConvGrad: (dY, X, W) -> dX, dW, dB
// ---------------------------------------------------------------------------------------------------------------

class ConvGradK : public Kernel {
 public:
  void setup(Ctx& c) override {
    require_same_float(c, 0, 2);
    dt_ = c.dtype(0);
    for (int i = 0; i < 3; ++i)
      if (c.rank_known(i) && (c.dims(i).size() < 3 || c.dims(i).size() > 5))
        throw Reject{"rank " + std::to_string(c.dims(i).size()) + " (only 1-D, 2-D and 3-D convolutions)"};
    attrs_.read(c, true);
    attrs_.ceil_mode = false;
    group_ = c.attr_i("group", 1);
    if (group_ <= 0 || group_ > INT_MAX) throw Reject{"group " + std::to_string(group_)};
    if (shape_known(c, 0) && shape_known(c, 1) && shape_known(c, 2)) {
      const Dims dy = c.dims(0), x = c.dims(1), w = c.dims(2);
      if (x.size() == w.size() && dy.size() == x.size() && numel(x) > 0 && numel(w) > 0 && numel(dy) > 0)
        reject_unsupported([&] {
          Plan p;
          describe(p, dy, x, w);
        });
    }
  }

  void run(Ctx& c) override {
    const Dims dy = c.dims(0), x = c.dims(1), w = c.dims(2);
    if (x.size() < 3 || x.size() > 5 || w.size() != x.size() || dy.size() != x.size())
      throw invalid("ConvGrad: dY " + dims_str(dy) + ", X " + dims_str(x) + ", W " + dims_str(w) +
                    " need one rank in 3..5");
    const int64_t N = x[0], Cin = x[1], M = w[0];
    if (Cin != w[1] * group_ || M % group_ != 0)
      throw invalid("ConvGrad: channels of X " + dims_str(x) + " and W " + dims_str(w) + " do not match group " +
                    std::to_string(group_));
    if (dy[0] != N || dy[1] != M) throw invalid("ConvGrad: dY " + dims_str(dy) + " does not match N of X and M of W");
    const bool want_dx = wants(c, 0), want_dw = wants(c, 1), want_db = wants(c, 2);
    keel_tensor_t* dx = want_dx ? c.output(0, x) : nullptr;
    keel_tensor_t* dw = want_dw ? c.output(1, w) : nullptr;
    keel_tensor_t* db = want_db ? c.output(2, {M}) : nullptr;
    if (want_db) {
      int64_t S = 1;
      for (size_t i = 2; i < dy.size(); ++i) S *= dy[i];
      check_cuda(launch_channel_sum(dt_, c.data(0), db->data, N, M, S, c.stream()), "ConvGrad dB");
    }
    if (!want_dx && !want_dw) return;
    if (numel(x) == 0 || numel(w) == 0 || numel(dy) == 0) {  // nothing flows: zeros (cuDNN takes no empty tensor)
      if (dx) zero(dx, x, dt_, c.stream());
      if (dw) zero(dw, w, dt_, c.stream());
      return;
    }
    if (!plan_ || plan_->dy != dy || plan_->x != x || plan_->w != w) build(c, dy, x, w);
    Plan& p = *plan_;
    DnnHandle h(c.device(), c.stream());
    const float one = 1.f, zero_f = 0.f;
    // One workspace for both calls, sized for whichever path each takes (the graph API's plans, or the legacy
    // algorithms'); a graph run that fails falls back to its legacy call with a workspace of its own.
    const bool g_dx = want_dx && use_graph_conv(p.graph_data, h.get(), "ConvGrad dX");
    const bool g_dw = want_dw && use_graph_conv(p.graph_filter, h.get(), "ConvGrad dW");
    const size_t need_dx = !want_dx ? 0 : g_dx ? p.graph_data->workspace(h.get()) : p.ws_data;
    const size_t need_dw = !want_dw ? 0 : g_dw ? p.graph_filter->workspace(h.get()) : p.ws_filter;
    void* ws = c.workspace(std::max(need_dx, need_dw));
    // Asymmetric pads: X padded explicitly for dW, dX computed over the padded shape and cropped out (Plan).
    const void* x_in = c.data(1);
    void* dx_out = want_dx ? dx->data : nullptr;
    const int prank = static_cast<int>(p.x_padded.size());
    if (p.explicit_pad) {
      const auto bytes = static_cast<uint64_t>(numel(p.x_padded) * dtype_size(dt_));
      if (want_dw) {
        void* padded = c.workspace(bytes);
        check_cuda(launch_pad(dt_, c.data(1), p.x4.data(), padded, p.x_padded.data(), p.pad_before.data(), prank, 0.f,
                              c.stream()),
                   ("ConvGrad X padding, " + p.shapes).c_str());
        x_in = padded;
      }
      if (want_dx) dx_out = c.workspace(bytes);
    }
    if (want_dx && !(g_dx && graph_conv(p.graph_data, h.get(), dx_out, c.data(2), c.data(0), ws, "ConvGrad dX"))) {
      void* wsd = g_dx ? c.workspace(p.ws_data) : ws;
      check_dnn(cudnnConvolutionBackwardData(h.get(), &one, p.wd.get(), c.data(2), p.dyd.get(), c.data(0),
                                             p.cd_data.get(), p.algo_data, wsd, p.ws_data, &zero_f, p.xd.get(), dx_out),
                "cudnnConvolutionBackwardData", p.shapes);
    }
    if (want_dx && p.explicit_pad)
      check_cuda(launch_pad(dt_, dx_out, p.x_padded.data(), dx->data, p.x4.data(), p.crop_before.data(), prank, 0.f,
                            c.stream()),
                 ("ConvGrad dX crop, " + p.shapes).c_str());
    if (want_dw && !(g_dw && graph_conv(p.graph_filter, h.get(), x_in, dw->data, c.data(0), ws, "ConvGrad dW"))) {
      void* wsf = g_dw ? c.workspace(p.ws_filter) : ws;
      check_dnn(
          cudnnConvolutionBackwardFilter(h.get(), &one, p.xd.get(), x_in, p.dyd.get(), c.data(0), p.cd_filter.get(),
                                         p.algo_filter, wsf, p.ws_filter, &zero_f, p.wd.get(), dw->data),
          "cudnnConvolutionBackwardFilter", p.shapes);
    }
  }

 private:
  struct Plan {
    Dims dy, x, w;
    Dims x4, dy4, w4, pads4, strides4, dil4;  // as cuDNN sees them (1-D lifted to 2-D; symmetric pads)
    // Asymmetric pads: cuDNN takes one pad per axis, the smaller; X is padded explicitly by the difference (x_padded,
    // X placed at pad_before) for dW, and dX is computed over x_padded and cropped out of it (crop_before, launch_pad's
    // convention: minus X's offset in x_padded). The padded positions hold zeros, so dW is the convolution's; their
    // gradients are dropped.
    bool explicit_pad = false;
    Dims x_padded, pad_before, crop_before;
    std::string shapes;
    TensorDesc xd, dyd;
    FilterDesc wd;
    ConvDesc cd_data, cd_filter;  // one per direction: each carries its algorithm's math type
    cudnnConvolutionBwdDataAlgo_t algo_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    cudnnConvolutionBwdFilterAlgo_t algo_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    size_t ws_data = 0, ws_filter = 0;
    // KEEL_CUDNN_GRAPH=1: the graph API's plans (cuda_dnn_graph.h), else unset.
    std::unique_ptr<GraphConv> graph_data, graph_filter;
  };

  // Descriptors of the problem (no handle needed); throws Failure UNIMPLEMENTED for what cuDNN cannot express here:
  // a dY whose spatial size is not the one the forward convolution of X gives.
  void describe(Plan& p, const Dims& dy, const Dims& x, const Dims& w) const {
    const Dims in(x.begin() + 2, x.end()), kernel(w.begin() + 2, w.end());
    if (!attrs_.kernel_shape.empty() && attrs_.kernel_shape != kernel)
      throw invalid("ConvGrad kernel_shape " + dims_str(attrs_.kernel_shape) + " differs from W " + dims_str(w));
    const Geom g = make_geom(attrs_, in, kernel, "ConvGrad");
    const size_t r = in.size();
    p.dy = dy;
    p.x = x;
    p.w = w;
    p.shapes = "dY " + dims_str(dy) + ", X " + dims_str(x) + ", W " + dims_str(w) + ", pads " + dims_str(g.pads);
    Dims sym(r), before(r), after(r);
    for (size_t i = 0; i < r; ++i) {
      sym[i] = std::min(g.pads[i], g.pads[i + r]);
      before[i] = g.pads[i] - sym[i];
      after[i] = g.pads[i + r] - sym[i];
      if (before[i] != 0 || after[i] != 0) p.explicit_pad = true;
    }
    p.x4 = lift(x, 1), p.dy4 = lift(dy, 1), p.w4 = lift(w, 1);
    const Dims before4 = lift_spatial(before, 0), after4 = lift_spatial(after, 0);
    p.x_padded = p.x4;
    p.pad_before.assign(p.x4.size(), 0);
    p.crop_before.assign(p.x4.size(), 0);
    for (size_t i = 0; i < before4.size(); ++i) {
      p.x_padded[i + 2] += before4[i] + after4[i];
      p.pad_before[i + 2] = before4[i];
      p.crop_before[i + 2] = -before4[i];
    }
    p.xd.set(dt_, p.x_padded, "X");
    p.dyd.set(dt_, p.dy4, "dY");
    p.wd.set(dt_, p.w4);
    p.pads4 = lift_spatial(sym, 0), p.strides4 = lift_spatial(g.strides, 1), p.dil4 = lift_spatial(g.dilations, 1);
    p.cd_data.set(p.pads4, p.strides4, p.dil4, group_, p.shapes);
    p.cd_filter.set(p.pads4, p.strides4, p.dil4, group_, p.shapes);
    const Dims& dy4 = p.dy4;
    std::vector<int> od(dy4.size());
    check_dnn(cudnnGetConvolutionNdForwardOutputDim(p.cd_data.get(), p.xd.get(), p.wd.get(),
                                                    static_cast<int>(od.size()), od.data()),
              "cudnnGetConvolutionNdForwardOutputDim", p.shapes);
    for (size_t i = 0; i < od.size(); ++i)
      if (od[i] != dy4[i]) throw unimplemented("ConvGrad: dY is not the convolution's output shape (" + p.shapes + ")");
  }

  // Descriptors plus both algorithms (cuDNN's heuristics, first that fits the workspace bound and the math policy).
  void build(Ctx& c, const Dims& dy, const Dims& x, const Dims& w) {
    auto p = std::make_unique<Plan>();
    describe(*p, dy, x, w);
    const std::string& shapes = p->shapes;
    DnnHandle h(c.device(), c.stream());
    p->cd_data.math(math_for(dt_), shapes);
    p->cd_filter.math(math_for(dt_), shapes);
    int max = 0;
    check_dnn(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.get(), &max),
              "cudnnGetConvolutionBackwardDataAlgorithmMaxCount", shapes);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> dperf(static_cast<size_t>(std::max(max, 1)));
    int got = 0;
    check_dnn(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h.get(), p->wd.get(), p->dyd.get(), p->cd_data.get(), p->xd.get(),
                                                    static_cast<int>(dperf.size()), &got, dperf.data()),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7", shapes);
    p->algo_data = pick_conv_algo(dperf, got, dt_, p->cd_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, shapes);
    check_dnn(cudnnGetConvolutionBackwardDataWorkspaceSize(h.get(), p->wd.get(), p->dyd.get(), p->cd_data.get(),
                                                           p->xd.get(), p->algo_data, &p->ws_data),
              "cudnnGetConvolutionBackwardDataWorkspaceSize", shapes);
    max = 0;
    check_dnn(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h.get(), &max),
              "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount", shapes);
    std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> fperf(static_cast<size_t>(std::max(max, 1)));
    got = 0;
    check_dnn(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h.get(), p->xd.get(), p->dyd.get(), p->cd_filter.get(),
                                                      p->wd.get(), static_cast<int>(fperf.size()), &got, fperf.data()),
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7", shapes);
    p->algo_filter = pick_conv_algo(fperf, got, dt_, p->cd_filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, shapes);
    check_dnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(h.get(), p->xd.get(), p->dyd.get(), p->cd_filter.get(),
                                                             p->wd.get(), p->algo_filter, &p->ws_filter),
              "cudnnGetConvolutionBackwardFilterWorkspaceSize", shapes);
    if (graph_api_enabled()) {
      const ConvProblem data{
          ConvDirection::kBackwardData, dt_, p->x_padded, p->w4, p->dy4, p->pads4, p->strides4, p->dil4, shapes};
      ConvProblem filter = data;
      filter.dir = ConvDirection::kBackwardFilter;
      p->graph_data = std::make_unique<GraphConv>(data);
      p->graph_filter = std::make_unique<GraphConv>(filter);
    }
    plan_ = std::move(p);
  }

  int32_t dt_ = KEEL_DTYPE_F32;
  SpatialAttrs attrs_;
  int64_t group_ = 1;
  std::unique_ptr<Plan> plan_;
};

#endif  // KEEL_CUDA_HAVE_CUDNN

template <class K, class... A>
Kernel* new_kernel(A... a) {
  return new K(a...);
}

}  // namespace

std::vector<KernelInfo> train_kernels() {
  std::vector<KernelInfo> v = {
      {"ReluGrad", 1, 0, "cuda_relu_grad", [] { return new_kernel<ActGradK>(ActGrad::kRelu); }, "keel"},
      {"SigmoidGrad", 1, 0, "cuda_sigmoid_grad", [] { return new_kernel<ActGradK>(ActGrad::kSigmoid); }, "keel"},
      {"TanhGrad", 1, 0, "cuda_tanh_grad", [] { return new_kernel<ActGradK>(ActGrad::kTanh); }, "keel"},
      {"GeluGrad", 1, 0, "cuda_gelu_grad", [] { return new_kernel<ActGradK>(ActGrad::kGelu); }, "keel"},
      {"LeakyReluGrad", 1, 0, "cuda_leaky_relu_grad", [] { return new_kernel<ActGradK>(ActGrad::kLeakyRelu); }, "keel"},
      {"MaxPoolGrad", 1, 0, "cuda_max_pool_grad", [] { return new_kernel<PoolGradK>(true); }, "keel"},
      {"AveragePoolGrad", 1, 0, "cuda_average_pool_grad", [] { return new_kernel<PoolGradK>(false); }, "keel"},
      {"SoftmaxCrossEntropyLoss", 12, 0, "cuda_softmax_cross_entropy_loss", [] { return new_kernel<SoftmaxXentK>(); }},
      {"SoftmaxCrossEntropyLossGrad", 1, 0, "cuda_softmax_cross_entropy_loss_grad",
       [] { return new_kernel<SoftmaxXentGradK>(); }, "keel"},
      {"BatchNormTraining", 1, 0, "cuda_batch_norm_training", [] { return new_kernel<BatchNormTrainK>(); }, "keel"},
      {"BatchNormGrad", 1, 0, "cuda_batch_norm_grad", [] { return new_kernel<BatchNormGradK>(); }, "keel"},
      {"LayerNormGrad", 1, 0, "cuda_layer_norm_grad", [] { return new_kernel<LayerNormGradK>(); }, "keel"},
      {"GatherGrad", 1, 0, "cuda_gather_grad", [] { return new_kernel<GatherGradK>(); }, "keel"},
      {"DropoutMask", 1, 0, "cuda_dropout_mask", [] { return new_kernel<DropoutMaskK>(); }, "keel"},
      {"Momentum", 1, 0, "cuda_momentum", [] { return new_kernel<MomentumK>(); }, "ai.onnx.preview.training"},
      {"AdamStep", 1, 0, "cuda_adam_step", [] { return new_kernel<AdamStepK>(); }, "keel"},
      {"CheckFiniteAndUnscale", 1, 0, "cuda_check_finite_and_unscale",
       [] { return new_kernel<CheckFiniteAndUnscaleK>(); }, "keel"},
  };
#if KEEL_CUDA_HAVE_CUDNN
  v.push_back({"ConvGrad", 1, 0, "cuda_cudnn_conv_grad", [] { return new_kernel<ConvGradK>(); }, "keel"});
#endif
  return v;
}

}  // namespace keel::cuda
