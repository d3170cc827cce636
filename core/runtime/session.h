// keel/core/runtime/session.h — a prepared graph that runs: placement, kernel instances, memory plan, run().
//
// Session::create takes ownership of a Graph, runs shape inference and the session's pass pipeline, places every
// node (preferred devices in order; nodes the preferred device cannot run fall back to the CPU or fail, per
// `fallback`; every fallback is reported once with its reason), inserts copies at device boundaries, creates one
// kernel instance per node, and plans activation memory from value liveness.
//
// Shape specialisation. When inputs of the graph (after the passes) have dims that are not fixed (a symbolic batch
// "N" or sequence length, as torch exports with dynamic_axes), create() still builds the graph as it is — the
// generic build, which validates everything and runs any shape — and a run whose dynamic inputs have shapes not
// seen before builds a shape variant: a copy of the graph with those dims fixed, shapes inferred again, then the
// same placement, claims, kernel creation and memory planning. Devices and claimers that only take static shapes
// (the oneDNN chains) see static shapes there. Variants are kept by the dynamic inputs' shapes, up to
// SessionOptions::shape_variants; a graph whose inputs are all static has none (nothing changes for it).
//
// Concurrency. run() is thread-safe, and concurrent runs on one session proceed in parallel: each run has its own
// kernel context, its own activation arena set (taken from the plan's pool of sets, allocated when none is free, given
// back when the run ends: as many sets as runs were ever in progress at once) and its own workspaces. A kernel that
// declares itself re-entrant (plugin ABI 1.4, KEEL_KERNEL_FLAG_REENTRANT; or one without per-node state) runs for
// several runs at once; any other kernel, and a control-flow node, is serialised alone: one run at a time computes
// on its state while the other runs go on with their other nodes. A shape variant is built under a lock inside the
// first run that needs it (other runs that need a build wait for it; runs already going are not stopped).
//
// Shared builds. SessionOptions::share_weights_with makes a session that shares another's build (placement, kernel
// instances with the weights they prepacked, shape variants, activation plans): one copy of the weights for both.
// Its own are its thread pool and its profile flag; the profile counters are the build's, so sessions that share a
// build and both profile see each other's runs. Either session may be released first (the build goes with the last).
//
// Streams (the stream contract of plugin.h). Each run works on streams of its own, one per device it uses (made with
// the device table's stream_create and pooled with the run's activation arena set, so memory a run reuses is always
// reused on the stream that last used it; NULL for a device without streams, which then completes everything before
// returning). Kernels get that stream in their context; copies at device boundaries are ordered on it; blocks the run
// takes from the pools (outputs, workspace, values not planned yet) are keyed by it. The host waits only where a
// result leaves a device for the host: a copy step that feeds a host kernel, and outputs returned in host memory.
// Outputs left on a device (I/O binding, run_bound) come back with a RunFence that a later run (of any session of the
// environment) orders its own streams after.
//
// The Session must not outlive its Environment.
#pragma once

#include <atomic>
#include <chrono>
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
#include "hal/device.h"

namespace keel {

enum class Fallback { kCpu, kError };

class Session;

// Per-run options (Session::run). The caller keeps `terminate` alive until the run returns.
struct RunOptions {
  // Checked before every node (step) of the run: once true, the run stops there with CANCELLED naming the node it
  // did not start; the session stays usable (the next run starts afresh). Set it from any thread. A claimed subgraph
  // is one step, and so is a control-flow node (its body is not interrupted).
  const std::atomic<bool>* terminate = nullptr;
  // Checked at the same boundaries: past it, the run stops with DEADLINE_EXCEEDED. max() = none.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Names the run in its errors ("run 'TAG': ...") and in Keel's log (debug: the run's time or failure).
  std::string tag;
};

// What a session holds in memory (Session::memory_info).
struct SessionMemoryInfo {
  uint64_t build_id = 0;          // equal for sessions that share one build
  uint64_t sessions_sharing = 0;  // sessions holding the build (1 = this one alone)
  uint64_t constant_bytes = 0;    // the initializers the build holds (each storage once; a weight uploaded to a
                                  // device counts there too)
  uint64_t arena_sets = 0;        // activation arena sets made (at most the runs ever in progress at once)
  uint64_t arena_bytes = 0;       // their bytes, all sets
};

// Copies a session made (Session::copy_stats): the copies inserted at device boundaries, inputs moved to the device
// that reads them, outputs brought back to the host or into memory bound for them. A value already where it is
// needed, or an output that a kernel wrote into its bound memory, counts nothing.
struct SessionCopyStats {
  uint64_t host_to_device = 0;
  uint64_t device_to_host = 0;
  uint64_t device_to_device = 0;
  uint64_t host_to_host = 0;
  uint64_t bytes = 0;  // all of them
};

// The device work a run left in flight on its streams when it returned outputs in device memory: one event per
// stream. Immutable once made; shared by the tensors of that run. A run that reads such a tensor makes its own stream
// of that device wait for the event (stream_wait_event; the host waits instead where the device has no such entry),
// and wait() blocks the host until the work is done (before reading the bytes on the host). Empty when the devices
// have no streams or events: the work was complete when the run returned.
class RunFence {
 public:
  struct Mark {
    const DeviceEntry* device = nullptr;
    int32_t index = 0;
    hal::Event event;
  };
  // Blocks until every event has completed. Thread-safe.
  Status wait() const;
  bool empty() const { return marks_.empty(); }
  const std::vector<Mark>& marks() const { return marks_; }
  void add(Mark m) { marks_.push_back(std::move(m)); }

 private:
  std::vector<Mark> marks_;
};

// A tensor in any memory (the host's or a device's) with the fence of the run that produced it (null: ready).
struct DeviceTensor {
  Tensor tensor;
  std::shared_ptr<const RunFence> ready;
};

// One input of Session::run_bound: read where it is (a host kernel reads host memory in place; a tensor already on
// the device of the kernel that reads it is not copied).
struct BoundInput {
  std::string name;
  DeviceTensor value;
};

// One output of Session::run_bound. With `buffer` defined, the output is written into that memory (host or device):
// its dtype, shape and byte size must equal the output's, else the run fails with INVALID_ARGUMENT naming the output;
// the kernel that produces the output writes there directly when the buffer is in the memory of its device (no copy),
// else the output is copied in. Without a buffer, the output is left in the memory of `device` ("cuda:0"; "cpu" =
// host memory): where it was produced when that is the device (no copy), else copied there.
struct BoundOutput {
  std::string name;
  Tensor buffer;
  std::string device = "cpu";
};

struct SessionOptions {
  // Devices to place on, most preferred first, each "TYPE" or "TYPE:INDEX" (DeviceSpec: "cuda:1"; "cuda" = index
  // 0). A session uses one device of each type: its kernels get that index in their context, its memory comes from
  // that device's pool, and the copies it inserts go there. create() fails with INVALID_ARGUMENT for a malformed
  // spec or two indices of one type, NOT_FOUND for an unknown type, OUT_OF_RANGE for an index past the devices of
  // that type. Empty = every available device type by priority, index 0.
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
  // Shape variants (see the top of this file) kept at most: 0 = off (every run uses the generic build). Once this
  // many are built, runs with further input shapes use the generic build (logged once at info level). Variants are
  // not evicted: under an LRU, a workload cycling through more shapes than the cap would rebuild (claims, kernels,
  // weight reorders: milliseconds to seconds) on most runs; this way a run costs at most one build per new shape
  // until the cap, and never afterwards. Each variant holds its own kernels and arena (oneDNN chains keep
  // reordered weights per variant), so the cap bounds the memory. Sessions of control-flow bodies (If, Loop, Scan)
  // build none (their shapes often change from iteration to iteration).
  int32_t shape_variants = 8;
  // Share this session's build (see the top of this file) instead of building again: the graph given to create()
  // must be the same model (structure, attributes and weights, compared by a digest; INVALID_ARGUMENT otherwise), and
  // devices, fallback, passes, claims and shape_variants must equal that session's (INVALID_ARGUMENT naming the
  // first that differs); threads and profile are this session's own. Read only during create().
  const Session* share_weights_with = nullptr;
};

struct FallbackReport {
  std::string node;  // node name
  std::string op_type;
  std::string from;  // the preferred device type
  std::string to;    // where it went ("" when fallback = error)
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
  double ms = 0;    // per run (each step's total over its calls)
  int nodes = 0;    // graph nodes of this op type (own steps, or inside claimed subgraphs)
  int fused = 0;    // of those, fused into a step of another node (a post-op): their time is in that node's row
  int no_step = 0;  // of those, inside a claimed subgraph without a step of their own or a fusion (views, constants)
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
  // outputs in graph-output order, as host tensors. INVALID_ARGUMENT names a missing, unknown or mis-typed input;
  // CANCELLED / DEADLINE_EXCEEDED when `run_options` stopped it. Thread-safe; concurrent runs proceed in parallel.
  StatusOr<std::vector<Tensor>> run(const std::vector<std::pair<std::string, Tensor>>& inputs,
                                    const RunOptions& run_options = {});
  // The same for graphs with sequence or optional inputs or outputs (run() refuses a non-tensor output). Tensors
  // inside the returned values are host tensors that the caller owns (no view of session memory).
  StatusOr<std::vector<RunValue>> run_values(const std::vector<std::pair<std::string, RunValue>>& inputs,
                                             const RunOptions& run_options = {});

  // Runs with bound inputs and outputs (I/O binding): inputs in any memory (a DeviceTensor from an earlier run, or
  // caller memory), outputs written into preallocated memory or left on a device (see BoundOutput). Returns, per entry
  // of `outputs`, the output's tensor (for a buffer: a tensor over the buffer's memory) and the fence of the work in
  // flight for it (null when none: host memory, or devices without streams). Outputs the caller did not name are
  // computed and dropped. An output named twice, or an unknown name: INVALID_ARGUMENT. Thread-safe, as run(): each
  // call has its own streams and activation memory; buffers of concurrent runs must not overlap.
  StatusOr<std::vector<DeviceTensor>> run_bound(const std::vector<BoundInput>& inputs,
                                                const std::vector<BoundOutput>& outputs,
                                                const RunOptions& run_options = {});
  // The copies this session made so far (its runs; sessions that share a build count their own). Thread-safe.
  SessionCopyStats copy_stats() const;

  // The graph as created (after the passes and placement), shapes as declared: the generic build's.
  const Graph& graph() const;
  const std::vector<std::string>& input_names() const;
  const std::vector<std::string>& output_names() const;
  // The generic build's fallbacks, as decided at creation (a shape variant logs its own at debug level only).
  const std::vector<FallbackReport>& fallbacks() const;

  // placement(), profile(), planned_arena_bytes() and workspace_bytes() describe the build the most recent run used:
  // its shape variant, or the generic build (before the first run, for static graphs, past the cap, or with
  // shape_variants = 0). Each is read at once, not in step with a run in progress on another thread.
  //
  // Where each node went: (node name, op type, device type, kernel name), in execution order. `shape_variant`, when
  // given, receives shape_variant() of the same build.
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> placement(
      std::string* shape_variant = nullptr) const;
  std::vector<NodeProfile> profile() const;
  // Forgets the timings collected so far, of every build (e.g. after warm-up runs, whose first run may build plans
  // or a shape variant). Thread-safe.
  void reset_profile();
  // Bytes of the planned activation arena per device ("cpu:0" -> bytes).
  std::map<std::string, uint64_t> planned_arena_bytes() const;
  // Largest kernel workspace a single step has taken so far ("cpu:0" -> bytes): claimed subgraphs keep their internal
  // values there, outside the planned arena (taken from the same pool each run). Not synchronised with run().
  std::map<std::string, uint64_t> workspace_bytes() const;
  // The input shapes the most recent run's build is specialised to ("x[3,3,224,224]", dynamic inputs only, ", "
  // between them), or "" for the generic build.
  std::string shape_variant() const;
  // Shape variants built so far (at most SessionOptions::shape_variants). Thread-safe.
  size_t shape_variant_count() const;
  // The build's memory (every build: generic and variants) and whether it is shared. Thread-safe.
  SessionMemoryInfo memory_info() const;

 private:
  struct Impl;   // the build, shared by sessions that share weights
  struct Local;  // this session's own: options, thread pool, the build its most recent run used
  Session(std::shared_ptr<Impl> impl, std::unique_ptr<Local> local);
  std::shared_ptr<Impl> impl_;
  std::unique_ptr<Local> local_;
};

}  // namespace keel
