// keel/core/train/export.cc — see export.h.
#include "core/train/export.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"

namespace keel::train {
namespace {

// Restores the module's training mode however the trace ends.
class EvalScope {
 public:
  explicit EvalScope(nn::Module& m) : m_(m), was_(m.is_training()) { m_.eval(); }
  ~EvalScope() { m_.train(was_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  nn::Module& m_;
  bool was_;
};

StatusOr<Graph> trace_raw(nn::Module& model, const eager::Tensor& example, const ExportOptions& o) {
  try {
    eager::NoGradGuard ng;
    eager::Tracer tracer(o.graph_name, o.opset);
    tracer.input(example, o.input_name);
    for (const auto& [n, p] : model.named_parameters()) tracer.name_parameter(p, n);
    for (const auto& [n, b] : model.named_buffers()) tracer.name_parameter(b, n);
    tracer.output(model(example), o.output_name);
    return tracer.graph();
  } catch (const eager::Error& e) {
    return e.status();
  }
}

// The graph with a dynamic first dimension, or the reason it cannot have one.
StatusOr<Graph> make_batch_dynamic(Graph g, const eager::Tensor& example, const ExportOptions& o) {
  const int64_t traced_batch = example.dim(0);
  auto in = g.value_info.find(o.input_name);
  if (in == g.value_info.end() || !in->second.shape || in->second.shape->empty())
    return Status(StatusCode::kInvalidArgument, "the traced input '" + o.input_name + "' has no shape");
  (*in->second.shape)[0] = -1;
  // Intermediate shapes are re-inferred from the dynamic input; only the outputs' declared shapes stay (batch freed).
  for (auto v = g.value_info.begin(); v != g.value_info.end();) {
    if (v->first != o.input_name && !g.is_graph_output(v->first)) v = g.value_info.erase(v);
    else ++v;
  }
  for (const auto& out : g.outputs)
    if (auto oi = g.value_info.find(out); oi != g.value_info.end() && oi->second.shape && !oi->second.shape->empty())
      (*oi->second.shape)[0] = -1;
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->op_type != "Reshape" || n->inputs.size() < 2 || !g.is_initializer(n->inputs[1])) continue;
    const keel::Tensor& shape = g.initializers.at(n->inputs[1]);
    if (shape.dtype() != DType::kI64 || shape.numel() < 1 || shape.data<int64_t>()[0] != traced_batch) continue;
    KEEL_ASSIGN_OR_RETURN(keel::Tensor copy, shape.clone(), "dynamic batch");
    copy.data<int64_t>()[0] = 0;
    g.initializers[n->inputs[1]] = copy;
  }
  KEEL_RETURN_IF_ERROR(infer_shapes(g), "dynamic batch: shape inference");
  KEEL_RETURN_IF_ERROR(g.validate(), "dynamic batch");
  // Probe: run at traced_batch + 1 (zeros) on the CPU.
  Shape probe_shape = example.shape();
  probe_shape[0] = traced_batch + 1;
  KEEL_ASSIGN_OR_RETURN(keel::Tensor probe, keel::Tensor::host(example.dtype(), probe_shape), "dynamic batch probe");
  std::memset(probe.raw_data(), 0, probe.byte_size());
  SessionOptions so;
  so.devices = {"cpu"};
  KEEL_ASSIGN_OR_RETURN(auto session, Session::create(eager::environment(), g, so), "dynamic batch: session");
  KEEL_ASSIGN_OR_RETURN(auto outs, session->run({{o.input_name, probe}}),
                        "dynamic batch: a run at batch " + std::to_string(traced_batch + 1));
  if (outs.empty() || outs[0].rank() < 1 || outs[0].shape()[0] != traced_batch + 1)
    return Status(StatusCode::kInvalidArgument,
                  "dynamic batch: the output's first dimension does not follow the input's");
  return g;
}

}  // namespace

StatusOr<Graph> trace_module(nn::Module& model, const eager::Tensor& example, const ExportOptions& options) {
  const std::string who = "export of " + model.type_name();
  if (!example.defined() || example.rank() < 1)
    return Status(StatusCode::kInvalidArgument, who + ": the example input must be a tensor with a batch dimension");
  if (eager::autocast_dtype() != DType::kUndefined)
    return Status(StatusCode::kFailedPrecondition,
                  who + ": called inside an autocast scope; export traces in fp32, end the AutocastGuard first");
  eager::Tensor x = example.device() == "cpu" ? example.detach() : example.detach().to("cpu");
  EvalScope eval(model);
  KEEL_ASSIGN_OR_RETURN(Graph g, trace_raw(model, x, options), who + ": tracing");
  if (!options.dynamic_batch) return g;
  auto dynamic = make_batch_dynamic(std::move(g), x, options);
  if (!dynamic.is_ok()) return dynamic.status().with_context(who);
  return dynamic;
}

StatusOr<int64_t> export_onnx(nn::Module& model, const eager::Tensor& example, const std::filesystem::path& path,
                              const ExportOptions& options) {
  auto traced = trace_module(model, example, options);
  if (!traced.is_ok()) return traced.status();
  const Graph& g = *traced;
  KEEL_RETURN_IF_ERROR(save_onnx(g, path), "export of " + model.type_name() + " to " + path.string());
  return static_cast<int64_t>(g.node_count());
}

StatusOr<std::shared_ptr<Environment>> init_runtime(int32_t threads) {
  if (threads < 0)
    return Status(StatusCode::kInvalidArgument, "init_runtime: threads must be >= 0, got " + std::to_string(threads));
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  EnvironmentOptions eo;
  eo.threads = threads;
  KEEL_ASSIGN_OR_RETURN(std::unique_ptr<Environment> env, Environment::create(eo), "init_runtime");
  std::shared_ptr<Environment> shared(std::move(env));
  try {
    eager::init(shared, 0);
  } catch (const eager::Error& e) {
    return e.status();
  }
  return shared;
}

}  // namespace keel::train
