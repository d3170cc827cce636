// plugins/cuda/cuda_dnn_graph.h — (internal) one convolution through cuDNN's graph API (the backend descriptors)
// with its execution plan built once and reused for every run, as PyTorch and the cuDNN frontend do.
//
// Why: cuDNN 9's legacy convolution calls (cudnnConvolutionForward / BackwardData / BackwardFilter) cost 0.1–0.2 ms of
// host CPU each on the H200 host (2026-12-04, `KEEL_EAGER_PROFILE=1 keel train --device cuda`: Conv 0.15–0.17 ms,
// ConvGrad 0.08–0.30 ms per call against 0.01–0.04 ms for the plugin's other ops), which bounds small training steps
// and batch-1 inference. A cached plan's execution costs a variant pack and one cudnnBackendExecute.
//
// Opt-in while it has not run on a card: KEEL_CUDNN_GRAPH=1 (read once) makes Conv, keel.FusedConv (its convolution;
// the epilogue kernel then adds bias, Z and the activation) and keel.ConvGrad try it; anything it cannot do (no engine
// for the problem under the math policy, a pointer that breaks the declared 16-byte alignment, a failed execution)
// falls back to the legacy call for that kernel, with one log line saying why. The math policy is the legacy path's:
// f32 runs in true f32 (engines with the tensor-core numerical note are skipped) unless KEEL_CUDA_TF32=1; engines that
// down-convert inputs are always skipped; the workspace stays within kMaxWorkspace.
//
// Thread-safety: a GraphConv is used by one caller at a time (the kernel that owns it); plans are cached per cuDNN
// handle (a handle of the per-device pool, bound to the caller's stream for the call).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_dnn_util.h"

#if KEEL_CUDA_HAVE_CUDNN

namespace keel::cuda::dnn {

// Whether the environment opts into the graph API (KEEL_CUDNN_GRAPH=1; read once).
bool graph_api_enabled();

enum class ConvDirection { kForward, kBackwardData, kBackwardFilter };

// One convolution problem: packed NCHW / NCDHW tensors of rank 4 or 5 (1-D problems lifted as the legacy path lifts
// them), symmetric pads, groups given by x[1] / w[1].
struct ConvProblem {
  ConvDirection dir = ConvDirection::kForward;
  int32_t dtype = KEEL_DTYPE_F32;
  Dims x, w, y;                   // y: the convolution's output (dY for the backward directions)
  Dims pads, strides, dilations;  // spatial: rank - 2 entries each
  std::string shapes;             // for messages
};

class GraphConv {
 public:
  explicit GraphConv(ConvProblem p);
  ~GraphConv();
  GraphConv(const GraphConv&) = delete;
  GraphConv& operator=(const GraphConv&) = delete;

  // Builds (once per handle) the plan for `h`'s device. False when no engine takes the problem under the math policy
  // or a build step fails; `why` then says what (the caller uses the legacy call from then on).
  bool prepare(cudnnHandle_t h, std::string* why);
  // The workspace the prepared plan of `h` needs (bytes).
  size_t workspace(cudnnHandle_t h) const;
  // Runs the prepared plan of `h` on its stream: x, w, y as in ConvProblem (the direction's output is written,
  // the other two are read). False (nothing ran) when a pointer is not 16-byte aligned or cuDNN refuses the
  // execution; `why` says what.
  bool run(cudnnHandle_t h, const void* x, const void* w, const void* y, void* workspace, std::string* why);

 private:
  struct Plan;
  Plan* plan_of(cudnnHandle_t h) const;
  ConvProblem p_;
  std::vector<std::pair<cudnnHandle_t, std::unique_ptr<Plan>>> plans_;
};

// What a kernel calls in place of a legacy cuDNN call, in two steps so that it can size one workspace for all its
// calls: use_graph_conv prepares `g` (when set) for `h`; graph_conv runs it with `workspace` (at least
// g->workspace(h) bytes). Each returns false when the legacy call must run instead: g unset, or g failed to prepare
// or run (g is then reset, and one line naming `kernel` and the reason goes to the host's log).
bool use_graph_conv(std::unique_ptr<GraphConv>& g, cudnnHandle_t h, const char* kernel);
bool graph_conv(std::unique_ptr<GraphConv>& g, cudnnHandle_t h, const void* x, const void* w, const void* y,
                void* workspace, const char* kernel);

}  // namespace keel::cuda::dnn

#endif  // KEEL_CUDA_HAVE_CUDNN
