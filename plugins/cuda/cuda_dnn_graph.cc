// plugins/cuda/cuda_dnn_graph.cc — convolutions through cuDNN's backend (graph) API with cached execution plans; see
// cuda_dnn_graph.h.
#include "cuda_dnn_graph.h"

#if KEEL_CUDA_HAVE_CUDNN

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace keel::cuda::dnn {
namespace {

// The execution-plan and operation-graph handle attributes are deprecated in recent cuDNN 9 releases (plans no
// longer need one) but required by the older 9.x libraries a card's host may carry (PyTorch's wheels): set both.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

constexpr int64_t kAlignment = 16;  // bytes, declared for every tensor (checked before each execution)
constexpr int64_t kUidX = 'x', kUidW = 'w', kUidY = 'y';

// A backend descriptor, destroyed with the object.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check_dnn(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor", "");
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* ptr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// Set one attribute; throws Failure naming it.
void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void* value, const char* what, const std::string& shapes) {
  check_dnn(cudnnBackendSetAttribute(d, name, type, count, value), what, shapes);
}
void finalize(cudnnBackendDescriptor_t d, const char* what, const std::string& shapes) {
  check_dnn(cudnnBackendFinalize(d), what, shapes);
}

std::unique_ptr<Desc> tensor_desc(int64_t uid, int32_t dtype, const Dims& dims, const std::string& shapes) {
  auto t = std::make_unique<Desc>(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  Dims strides(dims.size(), 1);
  for (size_t i = dims.size() - 1; i-- > 0;) strides[i] = strides[i + 1] * std::max<int64_t>(dims[i + 1], 1);
  const cudnnDataType_t dt = dnn_type(dtype);
  set(t->get(), CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type", shapes);
  set(t->get(), CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()), dims.data(),
      "tensor dimensions", shapes);
  set(t->get(), CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()), strides.data(),
      "tensor strides", shapes);
  set(t->get(), CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id", shapes);
  set(t->get(), CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment, "tensor alignment", shapes);
  finalize(t->get(), "cudnnBackendFinalize(tensor)", shapes);
  return t;
}

// The engine config's numerical notes that the math policy excludes: down-converted inputs always; tensor cores
// (TF32) for f32 unless TF32 is opted in.
bool excluded_by_policy(cudnnBackendDescriptor_t cfg, int32_t dtype) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, engine.ptr()) !=
      CUDNN_STATUS_SUCCESS)
    return true;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) != CUDNN_STATUS_SUCCESS)
    return true;
  for (int64_t i = 0; i < count && i < CUDNN_NUMERICAL_NOTE_TYPE_COUNT; ++i) {
    if (notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return true;
    if (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE && dtype == KEEL_DTYPE_F32 && !tf32_allowed()) return true;
  }
  return false;
}

}  // namespace

bool graph_api_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KEEL_CUDNN_GRAPH");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

struct GraphConv::Plan {
  std::unique_ptr<Desc> plan;  // finalized execution plan
  int64_t workspace = 0;
  // The descriptors the plan was built from (tensors, convolution, operation, graph, heuristics, engine configs),
  // kept alive with it: the backend API does not say that a plan copies what it refers to.
  std::vector<std::unique_ptr<Desc>> sources;
};

GraphConv::GraphConv(ConvProblem p) : p_(std::move(p)) {}
GraphConv::~GraphConv() = default;

GraphConv::Plan* GraphConv::plan_of(cudnnHandle_t h) const {
  for (const auto& [handle, plan] : plans_)
    if (handle == h) return plan.get();
  return nullptr;
}

bool GraphConv::prepare(cudnnHandle_t h, std::string* why) {
  if (plan_of(h)) return true;
  const std::string& shapes = p_.shapes;
  try {
    auto x = tensor_desc(kUidX, p_.dtype, p_.x, shapes);
    auto w = tensor_desc(kUidW, p_.dtype, p_.w, shapes);
    auto y = tensor_desc(kUidY, p_.dtype, p_.y, shapes);

    auto conv_d = std::make_unique<Desc>(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    Desc& conv = *conv_d;
    const int64_t spatial = static_cast<int64_t>(p_.pads.size());
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial, "conv spatial dims", shapes);
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "conv compute type", shapes);
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "conv mode", shapes);
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, spatial, p_.pads.data(), "conv pads",
        shapes);
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, spatial, p_.pads.data(), "conv pads",
        shapes);
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, spatial, p_.strides.data(), "conv strides",
        shapes);
    set(conv.get(), CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, spatial, p_.dilations.data(), "conv dilations",
        shapes);
    finalize(conv.get(), "cudnnBackendFinalize(convolution)", shapes);

    // The operation: alpha 1, beta 0 (the output is overwritten), as floats for every non-double data type.
    const float alpha = 1.f, beta = 0.f;
    cudnnBackendDescriptorType_t op_type = CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR;
    cudnnBackendAttributeName_t a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA;
    if (p_.dir == ConvDirection::kBackwardData) {
      op_type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR;
      a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA;
    } else if (p_.dir == ConvDirection::kBackwardFilter) {
      op_type = CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
      a_x = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, a_w = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      a_y = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      a_conv = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      a_alpha = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      a_beta = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA;
    }
    auto op_d = std::make_unique<Desc>(op_type);
    Desc& op = *op_d;
    set(op.get(), a_x, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, x->ptr(), "operation X", shapes);
    set(op.get(), a_w, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, w->ptr(), "operation W", shapes);
    set(op.get(), a_y, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, y->ptr(), "operation Y", shapes);
    set(op.get(), a_conv, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, conv.ptr(), "operation convolution", shapes);
    set(op.get(), a_alpha, CUDNN_TYPE_FLOAT, 1, &alpha, "operation alpha", shapes);
    set(op.get(), a_beta, CUDNN_TYPE_FLOAT, 1, &beta, "operation beta", shapes);
    finalize(op.get(), "cudnnBackendFinalize(operation)", shapes);

    auto graph_d = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    Desc& graph = *graph_d;
    set(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, op.ptr(), "graph operations",
        shapes);
    set(graph.get(), kGraphHandle, CUDNN_TYPE_HANDLE, 1, &h, "graph handle", shapes);
    finalize(graph.get(), "cudnnBackendFinalize(operation graph)", shapes);

    // Engine configurations, best first: heuristics mode A, then the fallback list; the first that passes the math
    // policy, finalizes as a plan and fits the workspace bound is kept.
    for (cudnnBackendHeurMode_t mode_h : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      auto heur_d = std::make_unique<Desc>(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      Desc& heur = *heur_d;
      set(heur.get(), CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, graph.ptr(),
          "heuristics graph", shapes);
      set(heur.get(), CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode_h, "heuristics mode", shapes);
      if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) continue;
      int64_t count = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                   nullptr) != CUDNN_STATUS_SUCCESS ||
          count <= 0)
        continue;
      std::vector<std::unique_ptr<Desc>> cfgs;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < count; ++i) {
        cfgs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(cfgs.back()->get());
      }
      int64_t got = 0;
      if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                                   &got, raw.data()) != CUDNN_STATUS_SUCCESS)
        continue;
      for (int64_t i = 0; i < got && i < count; ++i) {
        if (excluded_by_policy(raw[static_cast<size_t>(i)], p_.dtype)) continue;
        auto plan = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        if (cudnnBackendSetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                     &raw[static_cast<size_t>(i)]) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendSetAttribute(plan->get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &h) != CUDNN_STATUS_SUCCESS ||
            cudnnBackendFinalize(plan->get()) != CUDNN_STATUS_SUCCESS)
          continue;
        int64_t ws = 0, n = 0;
        if (cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                                     &ws) != CUDNN_STATUS_SUCCESS ||
            ws < 0 || static_cast<size_t>(ws) > kMaxWorkspace)
          continue;
        auto p = std::make_unique<Plan>();
        p->plan = std::move(plan);
        p->workspace = ws;
        for (auto* d : {&x, &w, &y, &conv_d, &op_d, &graph_d, &heur_d}) p->sources.push_back(std::move(*d));
        for (auto& cfg : cfgs) p->sources.push_back(std::move(cfg));
        plans_.emplace_back(h, std::move(p));
        return true;
      }
    }
    if (why) *why = "no cuDNN engine takes the problem under the math policy (" + shapes + ")";
    return false;
  } catch (const Failure& f) {
    if (why) *why = f.message;
    return false;
  }
}

size_t GraphConv::workspace(cudnnHandle_t h) const {
  const Plan* p = plan_of(h);
  return p ? static_cast<size_t>(p->workspace) : 0;
}

bool GraphConv::run(cudnnHandle_t h, const void* x, const void* w, const void* y, void* workspace, std::string* why) {
  Plan* p = plan_of(h);
  if (!p) {
    if (why) *why = "no plan prepared for this handle";
    return false;
  }
  for (const void* ptr : {x, w, y})
    if (reinterpret_cast<uintptr_t>(ptr) % kAlignment != 0) {
      if (why) *why = "a tensor is not 16-byte aligned (" + p_.shapes + ")";
      return false;
    }
  void* ptrs[3] = {const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)};
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  cudnnStatus_t s = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(pack.get());
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(h, p->plan->get(), pack.get());
  if (s != CUDNN_STATUS_SUCCESS) {
    if (why) *why = std::string("cudnnBackendExecute: ") + cudnnGetErrorString(s) + " (" + p_.shapes + ")";
    return false;
  }
  return true;
}

namespace {
void give_up(std::unique_ptr<GraphConv>& g, const char* kernel, const std::string& why) {
  log_line(KEEL_LOG_WARN,
           std::string("cuda: ") + kernel + ": the cuDNN graph API is not used, legacy call instead: " + why);
  g.reset();
}
}  // namespace

bool use_graph_conv(std::unique_ptr<GraphConv>& g, cudnnHandle_t h, const char* kernel) {
  if (!g) return false;
  std::string why;
  if (g->prepare(h, &why)) return true;
  give_up(g, kernel, why);
  return false;
}

bool graph_conv(std::unique_ptr<GraphConv>& g, cudnnHandle_t h, const void* x, const void* w, const void* y,
                void* workspace, const char* kernel) {
  if (!g) return false;
  std::string why;
  if (g->run(h, x, w, y, workspace, &why)) return true;
  give_up(g, kernel, why);
  return false;
}

}  // namespace keel::cuda::dnn

#endif  // KEEL_CUDA_HAVE_CUDNN
