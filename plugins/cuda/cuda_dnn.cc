// plugins/cuda/cuda_dnn.cc — convolution, pooling and normalisation kernels of the CUDA plugin, through cuDNN 9's
// descriptor API (cudnn_cnn / cudnn_ops):
//
//   Conv                 1-D / 2-D / 3-D (1-D runs as 2-D with H = 1), groups (depthwise included), dilations,
//                        strides, pads, auto_pad SAME_UPPER / SAME_LOWER / VALID; bias by the epilogue kernel.
//                        Asymmetric pads: the input is padded explicitly by the difference (cuda_dnn_kernels.cu) and
//                        cuDNN pads the symmetric rest.
//   keel.FusedConv       act(conv(X, W) + B + Z): cudnnConvolutionBiasActivationForward for Relu with a bias (Z as its
//                        z operand); every other activation (or no bias), and every one under KEEL_CUDNN_GRAPH=1,
//                        runs the convolution and then one epilogue kernel (bias + Z + activation). Should cuDNN refuse
//                        the fused call (BAD_PARAM / NOT_SUPPORTED for a configuration), the kernel switches to the
//                        unfused path for good.
//   ConvTranspose        cudnnConvolutionBackwardData + bias; output_padding (< stride), output_shape, auto_pad.
//                        Asymmetric pads: cuDNN computes with the smaller pad of each dimension, Y is cropped out.
//   MaxPool, AveragePool (count_include_pad), GlobalAveragePool, GlobalMaxPool: cudnnPoolingForward. Asymmetric pads
//                        and MaxPool's ceil_mode pad explicitly (-inf for MaxPool, 0 for AveragePool with
//                        count_include_pad). Rejected: dilations != 1, the Indices output, AveragePool's ceil_mode
//                        where it changes the output size, asymmetric pads of AveragePool without count_include_pad.
//   BatchNormalization   inference (training_mode = 0), an own kernel (the parameters may be f32 under f16 / bf16
//                        data, which cuDNN's BN does not take); built even without cuDNN.
//
// Dtypes: f32, f16, bf16 (inputs and outputs of one dtype; BN's parameters may differ). f32 computes in true f32
// (CUDNN_FMA_MATH) unless KEEL_CUDA_TF32=1; f16 / bf16 use tensor-op math with f32 accumulation.
// Algorithms are chosen once per input shape, when a kernel first runs it (cudnnGetConvolution*Algorithm_v7, the
// workspace bounded by kMaxWorkspace), and cached in the kernel with the descriptors. KEEL_CUDNN_GRAPH=1 runs Conv
// and keel.FusedConv's convolution through cuDNN's graph API with a cached execution plan instead (cuda_dnn_graph.h;
// the legacy call stays the fallback). cuDNN handles are pooled per
// device (a handle is bound to the computing stream for each call), created lazily, destroyed at plugin shutdown.
// Every cuDNN status is checked: NOT_SUPPORTED becomes UNIMPLEMENTED, allocation failures OUT_OF_MEMORY, the rest
// INTERNAL; messages name the call and the shapes. What cuDNN cannot express is rejected at kernel creation when the
// input shapes are known there (the core then places the node on the CPU); with shapes known only at run time it
// is an UNIMPLEMENTED error of that run (the core switches at run time only between kernels of the same device).
//
// Without cuDNN (KEEL_CUDA_HAVE_CUDNN 0, see CMakeLists.txt) only BatchNormalization is registered from here.
#include <algorithm>
#include <climits>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "cuda_common.h"
#include "cuda_dnn_graph.h"
#include "cuda_dnn_kernels.h"
#include "cuda_dnn_util.h"

#if KEEL_CUDA_HAVE_CUDNN
#include <cudnn.h>
#endif

namespace keel::cuda {
namespace {

using namespace dnn;  // cuda_dnn_util.h

// ---------------------------------------------------------------------------------------------------------------
// BatchNormalization (inference)
// ---------------------------------------------------------------------------------------------------------------

class BatchNormK : public Kernel {
 public:
  void setup(Ctx& c) override {
    if (!is_float(c.dtype(0))) throw Reject{"X dtype " + std::to_string(c.dtype(0)) + " (only f32, f16, bf16)"};
    if (c.input_count() < 5) throw Reject{"needs X, scale, B, mean, var"};
    for (int i = 1; i < 5; ++i)
      if (!c.has_input(i)) throw Reject{"input " + std::to_string(i) + " is absent"};
    pdt_ = c.dtype(1);
    if (!is_float(pdt_)) throw Reject{"scale dtype " + std::to_string(pdt_) + " (only f32, f16, bf16)"};
    for (int i = 2; i < 5; ++i)
      if (c.dtype(i) != pdt_) throw Reject{"scale, B, mean and var of different dtypes"};
    if (c.attr_i("training_mode", 0) != 0) throw Reject{"training_mode = 1 (only inference)"};
    if (c.opset() < 9 && c.attr_i("spatial", 1) == 0) throw Reject{"spatial = 0"};
    for (int i = 1; i < c.output_count(); ++i)
      if (c.output_dtype(i) != KEEL_DTYPE_UNDEFINED) throw Reject{"running statistics outputs (training)"};
    eps_ = c.attr_f("epsilon", 1e-5f);
  }
  void run(Ctx& c) override {
    const Dims d = c.dims(0);
    if (d.size() < 2) throw invalid("BatchNormalization X " + dims_str(d) + " needs rank >= 2");
    const int64_t C = d[1];
    for (int i = 1; i < 5; ++i)
      if (numel(c.dims(i)) != C)
        throw invalid("BatchNormalization input " + std::to_string(i) + " " + dims_str(c.dims(i)) + " has not " +
                      std::to_string(C) + " entries (X " + dims_str(d) + ")");
    int64_t inner = 1;
    for (size_t i = 2; i < d.size(); ++i) inner *= d[i];
    keel_tensor_t* y = c.output(0, d);
    const int64_t n = numel(d);
    if (n == 0) return;
    check_cuda(launch_batch_norm(c.dtype(0), pdt_, c.data(0), c.data(1), c.data(2), c.data(3), c.data(4), eps_, y->data,
                                 n, inner, C, c.stream()),
               ("BatchNormalization kernel, X " + dims_str(d)).c_str());
  }

 private:
  int32_t pdt_ = KEEL_DTYPE_F32;
  float eps_ = 1e-5f;
};

#if KEEL_CUDA_HAVE_CUDNN

// ---------------------------------------------------------------------------------------------------------------
// Conv and keel.FusedConv
// ---------------------------------------------------------------------------------------------------------------

class ConvK : public Kernel {
 public:
  explicit ConvK(bool fused) : fused_(fused) {}

  void setup(Ctx& c) override {
    dt_ = c.dtype(0);
    if (!is_float(dt_)) throw Reject{"X dtype " + std::to_string(dt_) + " (only f32, f16, bf16)"};
    const int last = fused_ ? 4 : 3;
    for (int i = 1; i < last && i < c.input_count(); ++i)
      if (c.has_input(i) && c.dtype(i) != dt_) throw Reject{"inputs of different dtypes"};
    for (int i : {0, 1})
      if (c.rank_known(i) && (c.dims(i).size() < 3 || c.dims(i).size() > 5))
        throw Reject{"rank " + std::to_string(c.dims(i).size()) + " (only 1-D, 2-D and 3-D convolutions)"};
    attrs_.read(c, true);
    attrs_.ceil_mode = false;
    group_ = c.attr_i("group", 1);
    if (group_ <= 0 || group_ > INT_MAX) throw Reject{"group " + std::to_string(group_)};
    if (fused_) act_ = read_fused_activation(c);
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0), w = c.dims(1);
    if (x.size() < 3 || x.size() > 5 || w.size() != x.size())
      throw invalid("Conv X " + dims_str(x) + " and W " + dims_str(w) + " need one rank in 3..5");
    const int64_t C = x[1], M = w[0];
    if (C != w[1] * group_ || M % group_ != 0)
      throw invalid("Conv channels do not match: X " + dims_str(x) + ", W " + dims_str(w) + ", group " +
                    std::to_string(group_));
    if (!plan_ || plan_->x != x || plan_->w != w) build(c, x, w);
    Plan& p = *plan_;
    const bool has_b = c.input_count() > 2 && c.has_input(2);
    const bool has_z = fused_ && c.input_count() > 3 && c.has_input(3);
    if (has_b && numel(c.dims(2)) != M)
      throw invalid("Conv B " + dims_str(c.dims(2)) + " needs " + std::to_string(M) + " entries");
    if (has_z && c.dims(3) != p.y)
      throw invalid("FusedConv Z " + dims_str(c.dims(3)) + " must have the output's shape " + dims_str(p.y));
    keel_tensor_t* y = c.output(0, p.y);
    if (numel(p.y) == 0) return;
    const std::string shapes = shapes3(x, w, p.y);
    if (p.empty) throw unimplemented("Conv over 0 input channels (" + shapes + ")");
    DnnHandle h(c.device(), c.stream());
    const void* xin = c.data(0);
    if (p.explicit_pad) {
      void* padded = c.workspace(static_cast<uint64_t>(numel(p.x_padded) * dtype_size(dt_)));
      check_cuda(launch_pad(dt_, xin, p.x_lifted.data(), padded, p.x_padded.data(), p.pad_before.data(),
                            static_cast<int>(p.x_padded.size()), 0.f, c.stream()),
                 ("Conv input padding, " + shapes).c_str());
      xin = padded;
    }
    const float one = 1.f, zero = 0.f;
    // With a graph-API plan the convolution goes through it and the epilogue kernel adds bias, Z and Relu: the
    // legacy fused call costs as much host time as the legacy convolution.
    const bool try_fused =
        fused_ && fused_ok_ && !p.graph && static_cast<FusedAct>(act_.kind) == FusedAct::kRelu && has_b;
    if (try_fused) {
      void* ws = c.workspace(p.ws);
      const float alpha2 = has_z ? 1.f : 0.f;
      cudnnStatus_t s = cudnnConvolutionBiasActivationForward(
          h.get(), &one, p.xd.get(), xin, p.wd.get(), c.data(1), p.cd.get(), p.algo, ws, p.ws, &alpha2, p.yd.get(),
          has_z ? c.data(3) : y->data, p.bd.get(), c.data(2), p.ad.get(), p.yd.get(), y->data);
      if (s == CUDNN_STATUS_SUCCESS) return;
      if (!not_supported(s) && !bad_param(s)) check_dnn(s, "cudnnConvolutionBiasActivationForward", shapes);
      // cuDNN refuses this configuration of the fused call (nothing ran): convolution + epilogue from now on.
      fused_ok_ = false;
    }
    if (!use_graph_conv(p.graph, h.get(), "Conv") ||
        !graph_conv(p.graph, h.get(), xin, c.data(1), y->data, c.workspace(p.graph->workspace(h.get())), "Conv")) {
      void* ws = c.workspace(p.ws);
      check_dnn(cudnnConvolutionForward(h.get(), &one, p.xd.get(), xin, p.wd.get(), c.data(1), p.cd.get(), p.algo, ws,
                                        p.ws, &zero, p.yd.get(), y->data),
                "cudnnConvolutionForward", shapes);
    }
    const FusedAct act = fused_ ? static_cast<FusedAct>(act_.kind) : FusedAct::kNone;
    if (has_b || has_z || act != FusedAct::kNone) {
      int64_t inner = 1;
      for (size_t i = 2; i < p.y.size(); ++i) inner *= p.y[i];
      check_cuda(launch_bias_act(dt_, y->data, has_b ? c.data(2) : nullptr, has_z ? c.data(3) : nullptr, numel(p.y),
                                 inner, M, act, act_.a, act_.b, c.stream()),
                 ("Conv epilogue, " + shapes).c_str());
    }
  }

 private:
  struct Plan {
    Dims x, w, y;                         // the shapes this plan is for (as the node sees them)
    Dims x_lifted, x_padded, pad_before;  // 1-D lifted to 2-D; explicitly padded input (when pads are asymmetric)
    bool explicit_pad = false;
    bool empty = false;  // a zero-sized operand: no descriptors (cuDNN takes no empty tensors)
    TensorDesc xd, yd, bd;
    FilterDesc wd;
    ConvDesc cd;
    ActDesc ad;
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    size_t ws = 0;
    std::unique_ptr<GraphConv> graph;  // KEEL_CUDNN_GRAPH=1: the graph API's plan (cuda_dnn_graph.h), else unset
  };

  void build(Ctx& c, const Dims& x, const Dims& w) {
    auto p = std::make_unique<Plan>();
    p->x = x;
    p->w = w;
    const Dims in(x.begin() + 2, x.end()), kernel(w.begin() + 2, w.end());
    if (!attrs_.kernel_shape.empty() && attrs_.kernel_shape != kernel)
      throw invalid("Conv kernel_shape " + dims_str(attrs_.kernel_shape) + " differs from W " + dims_str(w));
    const Geom g = make_geom(attrs_, in, kernel, "Conv");
    const size_t r = in.size();
    p->y = {x[0], w[0]};
    p->y.insert(p->y.end(), g.out.begin(), g.out.end());
    if (numel(x) == 0 || numel(w) == 0 || numel(p->y) == 0) {
      p->empty = true;
      plan_ = std::move(p);
      return;
    }
    // Symmetric pads for cuDNN; the difference, if any, padded explicitly at the front / back of the input.
    Dims sym(r), before(r), after(r);
    for (size_t i = 0; i < r; ++i) {
      sym[i] = std::min(g.pads[i], g.pads[i + r]);
      before[i] = g.pads[i] - sym[i];
      after[i] = g.pads[i + r] - sym[i];
      if (before[i] || after[i]) p->explicit_pad = true;
    }
    p->x_lifted = lift(x, 1);
    const Dims y4 = lift(p->y, 1), w4 = lift(w, 1);
    const Dims sym4 = lift_spatial(sym, 0), strides4 = lift_spatial(g.strides, 1), dil4 = lift_spatial(g.dilations, 1),
               before4 = lift_spatial(before, 0), after4 = lift_spatial(after, 0);
    p->x_padded = p->x_lifted;
    p->pad_before.assign(p->x_lifted.size(), 0);
    for (size_t i = 0; i < before4.size(); ++i) {
      p->x_padded[i + 2] += before4[i] + after4[i];
      p->pad_before[i + 2] = before4[i];
    }
    const std::string shapes = shapes3(x, w, p->y) + ", pads " + dims_str(g.pads);
    p->xd.set(dt_, p->x_padded, "X");
    p->yd.set(dt_, y4, "Y");
    p->wd.set(dt_, w4);
    p->cd.set(sym4, strides4, dil4, group_, shapes);
    // cuDNN's own output shape must be ours.
    std::vector<int> od(y4.size());
    check_dnn(cudnnGetConvolutionNdForwardOutputDim(p->cd.get(), p->xd.get(), p->wd.get(), static_cast<int>(od.size()),
                                                    od.data()),
              "cudnnGetConvolutionNdForwardOutputDim", shapes);
    for (size_t i = 0; i < od.size(); ++i)
      if (od[i] != y4[i])
        throw Failure{KEEL_STATUS_INTERNAL, "cuda: cuDNN's Conv output shape differs (" + shapes + ")"};
    if (fused_) {
      Dims bshape(y4.size(), 1);
      bshape[1] = w[0];
      p->bd.set(dt_, bshape, "B");
      check_dnn(cudnnSetActivationDescriptor(p->ad.get(), CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
                "cudnnSetActivationDescriptor", shapes);
    }
    DnnHandle h(c.device(), c.stream());
    p->cd.math(math_for(dt_), shapes);
    int max = 0;
    check_dnn(cudnnGetConvolutionForwardAlgorithmMaxCount(h.get(), &max), "cudnnGetConvolutionForwardAlgorithmMaxCount",
              shapes);
    std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(std::max(max, 1)));
    int got = 0;
    check_dnn(cudnnGetConvolutionForwardAlgorithm_v7(h.get(), p->xd.get(), p->wd.get(), p->cd.get(), p->yd.get(),
                                                     static_cast<int>(perf.size()), &got, perf.data()),
              "cudnnGetConvolutionForwardAlgorithm_v7", shapes);
    p->algo = pick_conv_algo(perf, got, dt_, p->cd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, shapes);
    check_dnn(cudnnGetConvolutionForwardWorkspaceSize(h.get(), p->xd.get(), p->wd.get(), p->cd.get(), p->yd.get(),
                                                      p->algo, &p->ws),
              "cudnnGetConvolutionForwardWorkspaceSize", shapes);
    if (graph_api_enabled())
      p->graph = std::make_unique<GraphConv>(
          ConvProblem{ConvDirection::kForward, dt_, p->x_padded, w4, y4, sym4, strides4, dil4, shapes});
    plan_ = std::move(p);
  }

  bool fused_;
  bool fused_ok_ = true;
  int32_t dt_ = KEEL_DTYPE_F32;
  SpatialAttrs attrs_;
  int64_t group_ = 1;
  FusedActivation act_;
  std::unique_ptr<Plan> plan_;
};

// ---------------------------------------------------------------------------------------------------------------
// ConvTranspose: the data gradient of the convolution from Y's shape to X's
// ---------------------------------------------------------------------------------------------------------------

class ConvTransposeK : public Kernel {
 public:
  void setup(Ctx& c) override {
    dt_ = c.dtype(0);
    if (!is_float(dt_)) throw Reject{"X dtype " + std::to_string(dt_) + " (only f32, f16, bf16)"};
    for (int i = 1; i < 3 && i < c.input_count(); ++i)
      if (c.has_input(i) && c.dtype(i) != dt_) throw Reject{"inputs of different dtypes"};
    for (int i : {0, 1})
      if (c.rank_known(i) && (c.dims(i).size() < 3 || c.dims(i).size() > 5))
        throw Reject{"rank " + std::to_string(c.dims(i).size()) + " (only 1-D, 2-D and 3-D)"};
    group_ = c.attr_i("group", 1);
    if (group_ <= 0 || group_ > INT_MAX) throw Reject{"group " + std::to_string(group_)};
    kernel_shape_ = c.attr_ints("kernel_shape", {});
    strides_ = c.attr_ints("strides", {});
    dilations_ = c.attr_ints("dilations", {});
    out_pad_ = c.attr_ints("output_padding", {});
    pads_ = c.attr_ints("pads", {});
    has_out_shape_ = c.has_attr_ints("output_shape");
    out_shape_ = c.attr_ints("output_shape", {});
    auto_pad_ = c.attr_s("auto_pad", "NOTSET");
    if (auto_pad_.empty()) auto_pad_ = "NOTSET";
    if (sdk::auto_pad_of(auto_pad_) == sdk::AutoPad::kUnknown) throw Reject{"unknown auto_pad '" + auto_pad_ + "'"};
    if (shape_known(c, 0) && shape_known(c, 1)) {
      const Dims x = c.dims(0), w = c.dims(1);
      if (x.size() == w.size() && x.size() >= 3 && x.size() <= 5 && numel(x) > 0 && numel(w) > 0)
        reject_unsupported([&] { check_supported(geometry(x, w), x, w); });
    }
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0), w = c.dims(1);
    if (x.size() < 3 || x.size() > 5 || w.size() != x.size())
      throw invalid("ConvTranspose X " + dims_str(x) + " and W " + dims_str(w) + " need one rank in 3..5");
    if (w[0] != x[1] || x[1] % group_ != 0)
      throw invalid("ConvTranspose channels do not match: X " + dims_str(x) + ", W " + dims_str(w) + ", group " +
                    std::to_string(group_));
    if (!plan_ || plan_->x != x || plan_->w != w) build(c, x, w);
    Plan& p = *plan_;
    const int64_t M = p.y[1];
    const bool has_b = c.input_count() > 2 && c.has_input(2);
    if (has_b && numel(c.dims(2)) != M)
      throw invalid("ConvTranspose B " + dims_str(c.dims(2)) + " needs " + std::to_string(M) + " entries");
    keel_tensor_t* y = c.output(0, p.y);
    const int64_t n = numel(p.y);
    if (n == 0) return;
    const std::string shapes = shapes3(x, w, p.y);
    if (p.empty) {  // no input contributions: Y = bias
      check_cuda(cudaMemsetAsync(y->data, 0, static_cast<size_t>(n * dtype_size(dt_)), c.stream()), "memset");
    } else {
      DnnHandle h(c.device(), c.stream());
      // Asymmetric pads: cuDNN computes the larger Y of the smaller pads, the crop copies Y out of it.
      void* full = p.crop ? c.workspace(static_cast<uint64_t>(numel(p.y_full) * dtype_size(dt_))) : y->data;
      void* ws = c.workspace(p.ws);
      const float one = 1.f, zero = 0.f;
      check_dnn(cudnnConvolutionBackwardData(h.get(), &one, p.wd.get(), c.data(1), p.xd.get(), c.data(0), p.cd.get(),
                                             p.algo, ws, p.ws, &zero, p.yd.get(), full),
                "cudnnConvolutionBackwardData", shapes);
      if (p.crop)
        check_cuda(launch_pad(dt_, full, p.y_full.data(), y->data, p.y.data(), p.crop_before.data(),
                              static_cast<int>(p.y.size()), 0.f, c.stream()),
                   ("ConvTranspose crop, " + shapes).c_str());
    }
    if (has_b) {
      int64_t inner = 1;
      for (size_t i = 2; i < p.y.size(); ++i) inner *= p.y[i];
      check_cuda(launch_bias_act(dt_, y->data, c.data(2), nullptr, n, inner, M, FusedAct::kNone, 0.f, 0.f, c.stream()),
                 ("ConvTranspose bias, " + shapes).c_str());
    }
  }

 private:
  struct Plan {
    Dims x, w, y;
    bool empty = false;        // a zero-sized operand: no descriptors
    bool crop = false;         // asymmetric pads: cuDNN writes y_full (pads min(begin, end)), Y is cropped out of it
    Dims y_full, crop_before;  // crop_before: minus the offset of Y in y_full (launch_pad's convention)
    TensorDesc xd, yd;
    FilterDesc wd;
    ConvDesc cd;
    cudnnConvolutionBwdDataAlgo_t algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    size_t ws = 0;
  };

  struct TGeom {
    Dims y, pads, strides, dilations;
  };

  // Output shape and pads as ONNX defines them (output_shape, auto_pad, pads, output_padding); throws Failure.
  TGeom geometry(const Dims& x, const Dims& w) const {
    const size_t r = x.size() - 2;
    const Dims in(x.begin() + 2, x.end()), kernel(w.begin() + 2, w.end());
    if (!kernel_shape_.empty() && kernel_shape_ != kernel)
      throw invalid("ConvTranspose kernel_shape " + dims_str(kernel_shape_) + " differs from W " + dims_str(w));
    TGeom t;
    t.strides = strides_.empty() ? Dims(r, 1) : strides_;
    t.dilations = dilations_.empty() ? Dims(r, 1) : dilations_;
    const Dims& strides = t.strides;
    const Dims& dil = t.dilations;
    const Dims opad = out_pad_.empty() ? Dims(r, 0) : out_pad_;
    if (strides.size() != r || dil.size() != r || opad.size() != r)
      throw invalid("ConvTranspose strides, dilations and output_padding need " + std::to_string(r) + " entries");
    for (size_t i = 0; i < r; ++i)
      if (strides[i] <= 0 || dil[i] <= 0) throw invalid("ConvTranspose strides and dilations must be positive");
    Dims pads(2 * r, 0), out(r);
    const sdk::AutoPad ap = sdk::auto_pad_of(auto_pad_);
    if (has_out_shape_ || sdk::is_same(ap)) {
      Dims target(r);
      if (has_out_shape_) {
        Dims os = out_shape_;
        if (os.size() == r + 2) os.erase(os.begin(), os.begin() + 2);
        if (os.size() != r) throw invalid("ConvTranspose output_shape " + dims_str(out_shape_) + " does not fit");
        target = os;
      } else {
        for (size_t i = 0; i < r; ++i) target[i] = in[i] * strides[i];
      }
      for (size_t i = 0; i < r; ++i) {
        const int64_t full = sdk::transposed_extent(in[i], strides[i], opad[i], sdk::dilated_extent(kernel[i], dil[i]));
        sdk::transposed_pads(ap, full - target[i], &pads[i], &pads[i + r]);
        out[i] = target[i];
      }
    } else {
      if (auto_pad_ != "VALID" && !pads_.empty()) pads = pads_;
      if (pads.size() != 2 * r)
        throw invalid("ConvTranspose pads " + dims_str(pads) + " need " + std::to_string(2 * r) + " entries");
      for (size_t i = 0; i < r; ++i) {
        out[i] = sdk::transposed_extent(in[i], strides[i], opad[i], sdk::dilated_extent(kernel[i], dil[i])) - pads[i] -
                 pads[i + r];
        if (out[i] <= 0) throw invalid("ConvTranspose output size " + std::to_string(out[i]) + " is not positive");
      }
    }
    t.y = {x[0], w[1] * group_};
    t.y.insert(t.y.end(), out.begin(), out.end());
    t.pads = pads;
    return t;
  }

  // The output cuDNN computes: Y grown by the difference of asymmetric pads (symmetric pads min(begin, end)).
  static Dims full_output(const TGeom& t) {
    const size_t r = t.y.size() - 2;
    Dims full = t.y;
    for (size_t i = 0; i < r; ++i)
      full[i + 2] += std::max(t.pads[i], t.pads[i + r]) - std::min(t.pads[i], t.pads[i + r]);
    return full;
  }

  // What cuDNN's data gradient cannot express: negative pads, and an output whose forward convolution does not give
  // X's shape back (output_padding >= stride). Throws Failure UNIMPLEMENTED.
  static void check_supported(const TGeom& t, const Dims& x, const Dims& w) {
    const size_t r = x.size() - 2;
    const std::string shapes = shapes3(x, w, t.y) + ", pads " + dims_str(t.pads);
    const Dims full = full_output(t);
    for (size_t i = 0; i < r; ++i) {
      if (t.pads[i] < 0 || t.pads[i + r] < 0) throw unimplemented("ConvTranspose with negative pads (" + shapes + ")");
      const int64_t sym = std::min(t.pads[i], t.pads[i + r]);
      const int64_t eff = (w[i + 2] - 1) * t.dilations[i] + 1, span = full[i + 2] + 2 * sym - eff;
      if (span < 0 || span / t.strides[i] + 1 != x[i + 2])
        throw unimplemented("ConvTranspose output padding beyond the stride (" + shapes + ")");
    }
  }

  void build(Ctx& c, const Dims& x, const Dims& w) {
    auto p = std::make_unique<Plan>();
    p->x = x;
    p->w = w;
    const TGeom t = geometry(x, w);
    p->y = t.y;
    const std::string shapes = shapes3(x, w, p->y) + ", pads " + dims_str(t.pads);
    if (numel(x) == 0 || numel(w) == 0 || numel(p->y) == 0) {
      p->empty = true;
      plan_ = std::move(p);
      return;
    }
    check_supported(t, x, w);
    const size_t r = x.size() - 2;
    Dims sym(r);
    p->y_full = full_output(t);
    p->crop_before.assign(p->y.size(), 0);
    for (size_t i = 0; i < r; ++i) {
      sym[i] = std::min(t.pads[i], t.pads[i + r]);
      p->crop_before[i + 2] = -(t.pads[i] - sym[i]);  // Y[o] = y_full[o + (pad_begin - sym)]
    }
    p->crop = p->y_full != p->y;
    const Dims& strides = t.strides;
    const Dims& dil = t.dilations;
    const Dims x4 = lift(x, 1), y4 = lift(p->y_full, 1), w4 = lift(w, 1);
    p->xd.set(dt_, x4, "X");
    p->yd.set(dt_, y4, "Y");
    p->wd.set(dt_, w4);
    p->cd.set(lift_spatial(sym, 0), lift_spatial(strides, 1), lift_spatial(dil, 1), group_, shapes);
    // The forward convolution of Y must give X's shape (it does not when output_padding >= stride).
    std::vector<int> od(x4.size());
    check_dnn(cudnnGetConvolutionNdForwardOutputDim(p->cd.get(), p->yd.get(), p->wd.get(), static_cast<int>(od.size()),
                                                    od.data()),
              "cudnnGetConvolutionNdForwardOutputDim", shapes);
    for (size_t i = 0; i < od.size(); ++i)
      if (od[i] != x4[i]) throw unimplemented("ConvTranspose output padding beyond the stride (" + shapes + ")");
    DnnHandle h(c.device(), c.stream());
    p->cd.math(math_for(dt_), shapes);
    int max = 0;
    check_dnn(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h.get(), &max),
              "cudnnGetConvolutionBackwardDataAlgorithmMaxCount", shapes);
    std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(std::max(max, 1)));
    int got = 0;
    check_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(h.get(), p->wd.get(), p->xd.get(), p->cd.get(), p->yd.get(),
                                                          static_cast<int>(perf.size()), &got, perf.data()),
              "cudnnGetConvolutionBackwardDataAlgorithm_v7", shapes);
    p->algo = pick_conv_algo(perf, got, dt_, p->cd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, shapes);
    check_dnn(cudnnGetConvolutionBackwardDataWorkspaceSize(h.get(), p->wd.get(), p->xd.get(), p->cd.get(), p->yd.get(),
                                                           p->algo, &p->ws),
              "cudnnGetConvolutionBackwardDataWorkspaceSize", shapes);
    plan_ = std::move(p);
  }

  int32_t dt_ = KEEL_DTYPE_F32;
  int64_t group_ = 1;
  Dims kernel_shape_, strides_, dilations_, out_pad_, pads_, out_shape_;
  bool has_out_shape_ = false;
  std::string auto_pad_;
  std::unique_ptr<Plan> plan_;
};

// ---------------------------------------------------------------------------------------------------------------
// Pooling
// ---------------------------------------------------------------------------------------------------------------

enum class PoolOp { kMax, kAverage, kGlobalAverage, kGlobalMax };

class PoolK : public Kernel {
 public:
  explicit PoolK(PoolOp op) : op_(op) {}

  void setup(Ctx& c) override {
    dt_ = c.dtype(0);
    if (!is_float(dt_)) throw Reject{"X dtype " + std::to_string(dt_) + " (only f32, f16, bf16)"};
    if (c.rank_known(0) && (c.dims(0).size() < 3 || c.dims(0).size() > 5))
      throw Reject{"rank " + std::to_string(c.dims(0).size()) + " (only 1-D, 2-D and 3-D pooling)"};
    for (int i = 1; i < c.output_count(); ++i)
      if (c.output_dtype(i) != KEEL_DTYPE_UNDEFINED) throw Reject{"the Indices output"};
    if (op_ == PoolOp::kMax || op_ == PoolOp::kAverage) {
      attrs_.read(c, true);
      if (attrs_.kernel_shape.empty()) throw Reject{"no kernel_shape"};
      for (int64_t d : attrs_.dilations)
        if (d != 1) throw Reject{"dilations " + dims_str(attrs_.dilations) + " (cuDNN pools without dilation)"};
      include_pad_ = op_ == PoolOp::kAverage && c.attr_i("count_include_pad", 0) != 0;
    }
    if (shape_known(c, 0)) {
      const Dims x = c.dims(0);
      if (x.size() >= 3 && x.size() <= 5)
        reject_unsupported([&] {
          const Geom g = pool_geom(x);
          check_supported(g, pool_shapes(x, g));
        });
    }
  }

  void run(Ctx& c) override {
    const Dims x = c.dims(0);
    if (x.size() < 3 || x.size() > 5) throw invalid("pooling X " + dims_str(x) + " needs rank 3..5");
    if (!plan_ || plan_->x != x) build(x);
    Plan& p = *plan_;
    keel_tensor_t* y = c.output(0, p.y);
    if (numel(p.y) == 0) return;
    const std::string shapes = "X " + dims_str(x) + ", Y " + dims_str(p.y);
    const void* xin = c.data(0);
    if (p.explicit_pad) {
      void* padded = c.workspace(static_cast<uint64_t>(numel(p.x_padded) * dtype_size(dt_)));
      const float fill = op_ == PoolOp::kMax ? -INFINITY : 0.f;
      check_cuda(launch_pad(dt_, xin, p.x_lifted.data(), padded, p.x_padded.data(), p.pad_before.data(),
                            static_cast<int>(p.x_padded.size()), fill, c.stream()),
                 ("pooling input padding, " + shapes).c_str());
      xin = padded;
    }
    DnnHandle h(c.device(), c.stream());
    const float one = 1.f, zero = 0.f;
    check_dnn(cudnnPoolingForward(h.get(), p.pd.get(), &one, p.xd.get(), xin, &zero, p.yd.get(), y->data),
              "cudnnPoolingForward", shapes);
  }

 private:
  struct Plan {
    Dims x, y, x_lifted, x_padded, pad_before;
    bool explicit_pad = false;
    TensorDesc xd, yd;
    PoolDesc pd;
  };

  // The pooling geometry of X (ONNX's pads, auto_pad, ceil_mode); throws Failure on a malformed shape.
  Geom pool_geom(const Dims& x) const {
    const size_t r = x.size() - 2;
    const Dims in(x.begin() + 2, x.end());
    for (int64_t v : in)
      if (v <= 0) throw invalid("pooling over an empty spatial dimension: X " + dims_str(x));
    if (op_ == PoolOp::kGlobalAverage || op_ == PoolOp::kGlobalMax) {
      Geom g;
      g.r = static_cast<int>(r);
      g.in = in;
      g.kernel = in;
      g.strides.assign(r, 1);
      g.dilations.assign(r, 1);
      g.pads.assign(2 * r, 0);
      g.out.assign(r, 1);
      return g;
    }
    return make_geom(attrs_, in, attrs_.kernel_shape, "pooling");
  }

  // What cuDNN's pooling cannot express (throws Failure UNIMPLEMENTED): a ceil_mode that changes the output, pads as
  // large as the window, asymmetric pads of an AveragePool that excludes the padding.
  void check_supported(const Geom& g, const std::string& shapes) const {
    const size_t r = g.kernel.size();
    if (g.ceil_changes) {
      // MaxPool: the extra windows of ceil_mode read -inf padding past the end; each must still see an input
      // element (a window entirely past the input is 0 in the reference, -inf here). AveragePool: the divisor of
      // those windows differs from cuDNN's.
      if (op_ != PoolOp::kMax)
        throw unimplemented("AveragePool with a ceil_mode that changes the output (" + shapes + ")");
      for (size_t i = 0; i < r; ++i)
        if ((g.out[i] - 1) * g.strides[i] - g.pads[i] >= g.in[i])
          throw unimplemented("MaxPool with ceil_mode windows past the input (" + shapes + ")");
    }
    bool asymmetric = false;
    for (size_t i = 0; i < r; ++i) {
      if (g.pads[i] >= g.kernel[i] || g.pads[i + r] >= g.kernel[i])
        throw unimplemented("pooling with pads as large as the window (" + shapes + ")");
      if (g.pads[i] != g.pads[i + r]) asymmetric = true;
    }
    if (asymmetric && op_ == PoolOp::kAverage && !include_pad_)
      throw unimplemented("AveragePool with asymmetric pads and count_include_pad = 0 (" + shapes + ")");
  }

  static std::string pool_shapes(const Dims& x, const Geom& g) {
    Dims y = {x[0], x[1]};
    y.insert(y.end(), g.out.begin(), g.out.end());
    return "X " + dims_str(x) + ", Y " + dims_str(y) + ", pads " + dims_str(g.pads);
  }

  void build(const Dims& x) {
    auto p = std::make_unique<Plan>();
    p->x = x;
    const size_t r = x.size() - 2;
    const Geom g = pool_geom(x);
    p->y = {x[0], x[1]};
    p->y.insert(p->y.end(), g.out.begin(), g.out.end());
    const std::string shapes = pool_shapes(x, g);
    check_supported(g, shapes);
    if (numel(p->y) == 0) {  // N or C is 0: nothing to compute, no descriptors
      plan_ = std::move(p);
      return;
    }
    Dims sym(r), before(r), after(r);
    for (size_t i = 0; i < r; ++i) {
      sym[i] = std::min(g.pads[i], g.pads[i + r]);
      before[i] = g.pads[i] - sym[i];
      after[i] = g.pads[i + r] - sym[i];
      // ceil_mode (MaxPool only, see check_supported): enough -inf at the end for the last window to fit.
      const int64_t need = (g.out[i] - 1) * g.strides[i] + g.kernel[i] - (g.in[i] + g.pads[i] + g.pads[i + r]);
      if (need > 0) after[i] += need;
      if (before[i] || after[i]) p->explicit_pad = true;
    }
    const bool avg = op_ == PoolOp::kAverage || op_ == PoolOp::kGlobalAverage;
    p->x_lifted = lift(x, 1);
    const Dims before4 = lift_spatial(before, 0), after4 = lift_spatial(after, 0);
    p->x_padded = p->x_lifted;
    p->pad_before.assign(p->x_lifted.size(), 0);
    for (size_t i = 0; i < before4.size(); ++i) {
      p->x_padded[i + 2] += before4[i] + after4[i];
      p->pad_before[i + 2] = before4[i];
    }
    const Dims y4 = lift(p->y, 1);
    p->xd.set(dt_, p->x_padded, "X");
    p->yd.set(dt_, y4, "Y");
    const std::vector<int> win = to_int(lift_spatial(g.kernel, 1), "kernel_shape"),
                           pad = to_int(lift_spatial(sym, 0), "pads"),
                           str = to_int(lift_spatial(g.strides, 1), "strides");
    cudnnPoolingMode_t mode = CUDNN_POOLING_MAX;
    if (avg)
      mode = include_pad_ ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    check_dnn(cudnnSetPoolingNdDescriptor(p->pd.get(), mode, CUDNN_PROPAGATE_NAN, static_cast<int>(win.size()),
                                          win.data(), pad.data(), str.data()),
              "cudnnSetPoolingNdDescriptor", shapes);
    std::vector<int> od(y4.size());
    check_dnn(cudnnGetPoolingNdForwardOutputDim(p->pd.get(), p->xd.get(), static_cast<int>(od.size()), od.data()),
              "cudnnGetPoolingNdForwardOutputDim", shapes);
    for (size_t i = 0; i < od.size(); ++i)
      if (od[i] != y4[i]) throw unimplemented("cuDNN's pooling output shape differs (" + shapes + ")");
    plan_ = std::move(p);
  }

  PoolOp op_;
  int32_t dt_ = KEEL_DTYPE_F32;
  SpatialAttrs attrs_;
  bool include_pad_ = false;
  std::unique_ptr<Plan> plan_;
};

#endif  // KEEL_CUDA_HAVE_CUDNN

}  // namespace

FusedActivation read_fused_activation(const Ctx& c) {
  const std::string s = c.attr_s("activation", "");
  const std::vector<float> p = c.attr_floats("activation_params");
  FusedAct kind = FusedAct::kNone;
  FusedActivation act;
  if (s.empty()) kind = FusedAct::kNone;
  else if (s == "Relu") kind = FusedAct::kRelu;
  else if (s == "Sigmoid") kind = FusedAct::kSigmoid;
  else if (s == "Tanh") kind = FusedAct::kTanh;
  else if (s == "HardSwish") kind = FusedAct::kHardSwish;
  else if (s == "Gelu") kind = FusedAct::kGelu;
  else if (s == "LeakyRelu") {
    kind = FusedAct::kLeakyRelu;
    act.a = p.empty() ? 0.01f : p[0];
  } else if (s == "Clip") {
    if (p.size() != 2) throw Reject{"activation Clip needs activation_params {min, max}"};
    kind = FusedAct::kClip;
    act.a = p[0];
    act.b = p[1];
  } else {
    throw Reject{"unknown activation '" + s + "'"};
  }
  act.kind = static_cast<int32_t>(kind);
  return act;
}

std::vector<KernelInfo> dnn_kernels() {
  std::vector<KernelInfo> v = {
      {"BatchNormalization", 7, 0, "cuda_batch_norm", []() -> Kernel* { return new BatchNormK; }},
  };
#if KEEL_CUDA_HAVE_CUDNN
  const std::vector<KernelInfo> dnn = {
      {"Conv", 1, 0, "cuda_cudnn_conv", []() -> Kernel* { return new ConvK(false); }},
      {"FusedConv", 1, 0, "cuda_cudnn_fused_conv", []() -> Kernel* { return new ConvK(true); }, "keel"},
      {"ConvTranspose", 1, 0, "cuda_cudnn_conv_transpose", []() -> Kernel* { return new ConvTransposeK; }},
      {"MaxPool", 1, 0, "cuda_cudnn_max_pool", []() -> Kernel* { return new PoolK(PoolOp::kMax); }},
      {"AveragePool", 1, 0, "cuda_cudnn_average_pool", []() -> Kernel* { return new PoolK(PoolOp::kAverage); }},
      {"GlobalAveragePool", 1, 0, "cuda_cudnn_global_average_pool",
       []() -> Kernel* { return new PoolK(PoolOp::kGlobalAverage); }},
      {"GlobalMaxPool", 1, 0, "cuda_cudnn_global_max_pool", []() -> Kernel* { return new PoolK(PoolOp::kGlobalMax); }},
  };
  v.insert(v.end(), dnn.begin(), dnn.end());
#endif
  return v;
}

void dnn_shutdown() {
#if KEEL_CUDA_HAVE_CUDNN
  std::lock_guard<std::mutex> lock(dnn::g_dnn_mu);
  for (auto& [dev, h] : dnn::g_free_dnn) {
    cudaSetDevice(dev);
    cudnnDestroy(h);
  }
  dnn::g_free_dnn.clear();
  (void)cudaGetLastError();
#endif
}

}  // namespace keel::cuda
