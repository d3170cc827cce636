// keel/core/runtime/session.h — a prepared graph that runs: placement, kernel instances, memory plan, run().
//
// Session::create takes ownership of a Graph, runs shape inference and the session's pass pipeline, places every
// node (preferred devices in order; nodes the preferred device cannot run fall back to the CPU or fail, per
// `fallback`; every fallback is reported once with its reason), inserts copies at device boundaries, creates one
// kernel instance per node, and plans activation memory from value liveness.
//
// run() is thread-safe: concurrent calls on one session are serialised (kernel states are not shared between
// threads at once, as the plugin ABI promises); use one session per thread for parallel runs.
// The Session must not outlive its Environment.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/base/value.h"
#include "core/runtime/environment.h"

namespace keel {

enum class Fallback { kCpu, kError };

struct SessionOptions {
  // Device types to place on, most preferred first. Empty = every available device type by priority.
  std::vector<std::string> devices;
  Fallback fallback = Fallback::kCpu;
  // Graph passes to run before placement, by name, in order, each optionally with options ("name:key=value", see
  // parse_pipeline_list). Empty = none.
  std::vector<std::string> passes;
  bool profile = false;  // collect per-node timings (Session::profile())
  // Kernel threads for this session: 0 = the environment's pool; otherwise the session owns a pool of its own.
  int32_t threads = 0;
  // Let devices (claim_subgraphs) and kernel plugins' claim hooks (register_claimer) take subgraphs. Off: every
  // node runs on its own kernel (graph evaluation for constant folding turns it off).
  bool claims = true;
};

struct FallbackReport {
  std::string node;      // node name
  std::string op_type;
  std::string from;      // the preferred device type
  std::string to;        // where it went ("" when fallback = error)
  std::string reason;
};

// One step a kernel reported inside its compute (plugin ABI 1.3, keel_kernel_api_t.profile_step), e.g. one oneDNN
// primitive of a claimed subgraph; summed over the runs like its NodeProfile.
struct ProfileStep {
  std::string kind, implementation;  // what ran ("convolution", "brg:avx512_core")
  std::string op_type;               // the ONNX op type it computes; "" = the kernel's own work (a layout reorder)
  std::vector<std::string> nodes;    // graph nodes it computes: the op_type node first, nodes fused into it after
  double total_ms = 0;
  int64_t calls = 0;
};

struct NodeProfile {
  std::string node, op_type, device_type, kernel;
  double total_ms = 0;
  int64_t calls = 0;
  // A claimed subgraph (op_type "Subgraph"): its graph nodes as (name, op type), in execution order; else empty.
  std::vector<std::pair<std::string, std::string>> members;
  // What the kernel reported inside the step, in first-report order (empty: it reports nothing).
  std::vector<ProfileStep> steps;
};

// The session profile per ONNX op type (what `keel bench --profile` prints). A step whose kernel reported steps
// (a claimed subgraph) is split into them: each step's time goes to its op type (a layout reorder of the kernel's
// own to "(reorder)", named by its kind), the step time no reported step covers to "(subgraph overhead)", and
// every graph node of the subgraph is counted under its op type. A step that reports nothing counts as one node
// of its op type ("Subgraph" for a claimed subgraph), as before ABI 1.3. Sorted by time, largest first.
struct OpTypeProfile {
  std::string op_type;
  double ms = 0;     // per run (each step's total over its calls)
  int nodes = 0;     // graph nodes of this op type (own steps, or inside claimed subgraphs)
  int fused = 0;     // of those, fused into a step of another node (a post-op): their time is in that node's row
  int no_step = 0;   // of those, inside a claimed subgraph without a step of their own or a fusion (views, constants)
  std::map<std::string, int> fused_in;  // nodes of other op types fused into this op type's steps: op type -> count
  std::vector<std::string> where;       // "device:kernel" of what ran them, sorted, unique
};
std::vector<OpTypeProfile> profile_by_op_type(const std::vector<NodeProfile>& profile);

// The part of `graph` that computes `outputs` when the values named in `feeds` are given (they become graph
// inputs, cutting off whatever produced them). Used by constant folding and calibration.
StatusOr<Graph> extract_subgraph(const Graph& graph, const std::vector<std::pair<std::string, Tensor>>& feeds,
                                 const std::vector<std::string>& outputs);

class Session {
 public:
  static StatusOr<std::unique_ptr<Session>> create(Environment& env, Graph graph, SessionOptions options = {});
  ~Session();

  // Runs with inputs bound by name (host or device tensors; copied to where they are needed). Returns the graph
  // outputs in graph-output order, as host tensors. INVALID_ARGUMENT names a missing, unknown or mis-typed input.
  StatusOr<std::vector<Tensor>> run(const std::vector<std::pair<std::string, Tensor>>& inputs);
  // The same for graphs with sequence or optional inputs or outputs (run() refuses a non-tensor output). Tensors
  // inside the returned values are host tensors that the caller owns (no view of session memory).
  StatusOr<std::vector<RunValue>> run_values(const std::vector<std::pair<std::string, RunValue>>& inputs);

  const Graph& graph() const;
  const std::vector<std::string>& input_names() const;
  const std::vector<std::string>& output_names() const;
  const std::vector<FallbackReport>& fallbacks() const;
  // Where each node went: (node name, op type, device type, kernel name), in execution order.
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> placement() const;
  std::vector<NodeProfile> profile() const;
  // Forgets the timings collected so far (e.g. after warm-up runs, whose first run may build plans). Thread-safe.
  void reset_profile();
  // Bytes of the planned activation arena per device ("cpu:0" -> bytes).
  std::map<std::string, uint64_t> planned_arena_bytes() const;
  // Largest kernel workspace a single step has taken so far ("cpu:0" -> bytes): claimed subgraphs keep their internal
  // values there, outside the planned arena (taken from the same pool each run). Not synchronised with run().
  std::map<std::string, uint64_t> workspace_bytes() const;

 private:
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace keel
