// keel/core/runtime/kernel_context.h — (internal) what a keel_kernel_context_t and a keel_graph_t are on the host
// side. Only the core's executors (session.cc, the eager_*.cc files, shape_values.cc) and host_api.cc look inside.
#pragma once

#include <keel/plugin.h>

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/tensor.h"
#include "core/base/thread_pool.h"

namespace keel {
class Environment;
}

struct keel_kernel_context_s {
  enum class Phase { kCreate, kCompute };
  Phase phase = Phase::kCreate;
  const keel::Node* node = nullptr;
  int32_t opset = 0;
  int32_t device_index = 0;
  keel_stream_t stream = nullptr;
  keel::ThreadPool* pool = nullptr;

  // Inputs: views of the bound tensors (create phase: shapes from value info, data only for constants).
  std::vector<const keel_tensor_t*> inputs;  // nullptr = absent
  std::vector<keel_tensor_t> input_views;
  std::vector<keel::Shape> input_shapes;  // backing store for create-phase dims
  // Binds `tensors` as the inputs (an undefined tensor is an absent input); they must outlive the call it serves.
  void bind_inputs(const std::vector<keel::Tensor>& tensors) {
    input_views.assign(tensors.size(), keel_tensor_t{});
    inputs.assign(tensors.size(), nullptr);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!tensors[i].defined()) continue;
      input_views[i] = tensors[i].c_view();
      inputs[i] = &input_views[i];
    }
  }

  // Outputs: expected dtypes, and what the kernel allocated.
  std::vector<keel::DType> output_dtypes;
  std::vector<keel::Tensor> outputs;
  std::vector<keel_tensor_t> output_views;
  // Allocates memory for output i (set by the executor: arena or pool).
  std::function<keel::StatusOr<keel::Tensor>(int32_t, keel::DType, const keel::Shape&)> allocate_output;
  // Allocates workspace bytes valid until compute returns.
  std::function<keel::StatusOr<void*>(uint64_t)> allocate_workspace;

  // Profiling (ABI 1.3 profiling/profile_step): set by the executor for a compute of a profiling session; the steps
  // a kernel reports go to `report_step` (the record is only valid during the call).
  bool profiling = false;
  std::function<void(const keel_profile_step_t&)> report_step;

  // Caches for attribute views handed out as C pointers.
  std::map<std::string, keel_tensor_t> attr_tensor_views;
  std::map<std::string, std::vector<const char*>> attr_string_lists;
};

struct keel_graph_s {
  keel::Graph* graph = nullptr;           // edited in place by passes
  keel::Environment* env = nullptr;       // for evaluate
  std::vector<keel::NodeId> order_cache;  // topological order; cleared on edit
  std::deque<std::string> strings;        // backing store for returned strings
  // Initializer views handed out, each with the tensor it shows (kept alive with it): views stay valid for the
  // life of this graph view, even after edits replace the initializer (passes often read, then edit).
  std::deque<std::pair<keel::Tensor, keel_tensor_t>> initializer_views;
  // Per node with subgraphs: what they read from this graph (listed as inputs after the node's own); cleared on edit.
  std::map<keel::NodeId, std::vector<std::string>> implicit_cache;
  const std::vector<std::string>& implicit(const keel::Node& n) {
    auto it = implicit_cache.find(n.id);
    if (it == implicit_cache.end()) it = implicit_cache.emplace(n.id, keel::implicit_inputs(n)).first;
    return it->second;
  }
  void touched() {
    order_cache.clear();
    implicit_cache.clear();
  }
};
