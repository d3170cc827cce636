// Session: placement, kernel instances, copies at device boundaries, liveness-planned memory, run().
#include "core/runtime/session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/base/log.h"
#include "core/base/pass_manager.h"
#include "core/base/thread_pool.h"
#include "core/runtime/control_flow.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/kernel_dispatch.h"
#include "core/runtime/onnx_io.h"
#include "hal/device.h"

namespace keel {

StatusOr<Graph> extract_subgraph(const Graph& graph, const std::vector<std::pair<std::string, Tensor>>& feeds,
                                 const std::vector<std::string>& outputs) {
  Graph sub;
  sub.name = graph.name + "_sub";
  sub.opsets = graph.opsets;
  std::unordered_set<std::string> fed;
  for (const auto& [name, t] : feeds) {
    fed.insert(name);
    sub.inputs.push_back(name);
    sub.value_info[name] = ValueInfo{t.dtype(), t.shape()};
  }
  KEEL_ASSIGN_OR_RETURN(auto order, graph.topological_order(), "extract_subgraph");
  std::unordered_set<std::string> needed(outputs.begin(), outputs.end());
  std::vector<NodeId> keep;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Node* n = graph.node(*it);
    bool wanted = false;
    for (const auto& o : n->outputs) wanted = wanted || (needed.count(o) && !fed.count(o));
    if (!wanted) continue;
    keep.push_back(*it);
    for (const auto& in : n->inputs)
      if (!in.empty() && !fed.count(in)) needed.insert(in);
  }
  for (const auto& v : needed) {
    if (fed.count(v)) continue;
    auto init = graph.initializers.find(v);
    if (init != graph.initializers.end()) sub.initializers[v] = init->second;
    else if (graph.is_graph_input(v) && !graph.producer(v))
      return invalid_argument("evaluate needs a value for graph input '" + v + "'");
  }
  for (auto it = keep.rbegin(); it != keep.rend(); ++it) sub.add_node(*graph.node(*it));
  for (const auto& [k, vi] : graph.value_info)
    if (needed.count(k) && !fed.count(k)) sub.value_info[k] = vi;
  sub.outputs = outputs;
  KEEL_RETURN_IF_ERROR(sub.validate(), "extract_subgraph");
  return sub;
}

namespace {

// One kernel instance of a step: its entry points and state. A step's slot is replaced (not edited) when its kernel
// rejects a case at run time and the next alternative takes over; the old slot stays alive (a concurrent run may
// still be computing on it) until the build goes.
struct KernelSlot {
  std::string name;
  keel_status_t (*compute)(void*, keel_kernel_context_t*) = nullptr;
  void (*release)(void*) = nullptr;
  void* state = nullptr;
  bool reentrant = false;  // KEEL_KERNEL_FLAG_REENTRANT, or no per-node state (no create)
  std::mutex mu;           // serialises compute on `state` when it is not re-entrant
  KernelSlot() = default;
  KernelSlot(const KernelSlot&) = delete;
  KernelSlot& operator=(const KernelSlot&) = delete;
  ~KernelSlot() {
    if (release && state) release(state);
  }
};

// An atomic pointer that a Step (moved around while the build is assembled, before any run) can hold.
template <class T>
struct MovableAtomic {
  std::atomic<T*> p{nullptr};
  MovableAtomic() = default;
  MovableAtomic(MovableAtomic&& o) noexcept : p(o.p.load()) {}
  MovableAtomic& operator=(MovableAtomic&& o) noexcept {
    p.store(o.p.load());
    return *this;
  }
  T* load() const { return p.load(std::memory_order_acquire); }
  void store(T* v) { p.store(v, std::memory_order_release); }
};

struct Step {
  enum class Kind { kKernel, kSubgraph, kCopy, kNative } kind = Kind::kKernel;
  std::string name, op_type, kernel_name;  // kernel_name: for kKernel/kSubgraph see kernel()->name
  const Node* node = nullptr;              // kKernel: the node (owned by Impl::graph); kSubgraph: nullptr
  int32_t opset = 0;
  const DeviceEntry* device = nullptr;  // nullptr = host
  std::string device_type = "cpu";
  int32_t device_index = 0;  // which device of device_type (the session's index for that type)
  // Kernel or subgraph: the slot in use (the last of `slots`, which owns every slot the step has had).
  MovableAtomic<KernelSlot> kernel;
  std::vector<std::unique_ptr<KernelSlot>> slots;
  // Guards `alternatives` and the switch to one; serialises a kNative step (a NativeOp runs one run at a time).
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
  // Copy: from -> to device
  const DeviceEntry* copy_from = nullptr;
  std::vector<int> inputs;   // value indices, -1 = absent
  std::vector<int> outputs;  // value indices, -1 = unused
  std::vector<DType> output_dtypes;
  std::vector<int> free_after;  // values whose last use is this step
  // Lower-ranked kernels of the same device for this node, tried in order when the chosen one rejects a case at
  // run time (UNIMPLEMENTED from compute, e.g. a broadcast it cannot do): rejection is not an error. Under *mu.
  std::vector<const KernelEntry*> alternatives;
  std::shared_ptr<NativeOp> native;       // kNative: an op the executor runs itself (control_flow.h), on the host
  std::string memory_type = "cpu";        // where its outputs live: "cpu" for host-memory devices
  int32_t memory_index = 0;               // and which device of memory_type (0 for the host)
  CachingAllocator* allocator = nullptr;  // that memory's pool (resolved once at build)
  // Profile (under Built::stats_mu).
  double total_ms = 0;
  int64_t calls = 0;
  // Profiling: a claimed subgraph's nodes (name, op type), and the steps its kernel reported (ABI 1.3), found by key.
  std::vector<std::pair<std::string, std::string>> members;
  std::vector<ProfileStep> reported;
  std::unordered_map<std::string, size_t> reported_index;
};

// Installs a kernel instance as the step's current one (at build, or when an alternative takes over).
KernelSlot* install_kernel(Step& s, std::string name, keel_status_t (*compute)(void*, keel_kernel_context_t*),
                           void (*release)(void*), void* state, bool reentrant) {
  auto slot = std::make_unique<KernelSlot>();
  slot->name = std::move(name);
  slot->compute = compute;
  slot->release = release;
  slot->state = state;
  slot->reentrant = reentrant;
  KernelSlot* raw = slot.get();
  s.slots.push_back(std::move(slot));
  s.kernel.store(raw);
  return raw;
}

// The name of the kernel a step runs now (a copy or executor step: its fixed name).
const std::string& kernel_name_of(const Step& s) {
  const KernelSlot* k = s.kernel.load();
  return k != nullptr ? k->name : s.kernel_name;
}

// Adds a step the kernel of `s` reported (ABI 1.3 profile_step) to its accumulated profile. Reads only the members
// the record's struct_size covers.
void record_reported_step(Step& s, const keel_profile_step_t* r) {
  auto str = [](const char* p) { return p != nullptr ? std::string(p) : std::string(); };
  ProfileStep step;
  step.kind = str(r->kind);
  if (KEEL_HAS_MEMBER(r, keel_profile_step_t, implementation)) step.implementation = str(r->implementation);
  if (KEEL_HAS_MEMBER(r, keel_profile_step_t, op_type)) step.op_type = str(r->op_type);
  if (KEEL_HAS_MEMBER(r, keel_profile_step_t, node_count) && r->node_names != nullptr)
    for (size_t k = 0; k < r->node_count; ++k) step.nodes.push_back(str(r->node_names[k]));
  const double ms = KEEL_HAS_MEMBER(r, keel_profile_step_t, time_ms) && r->time_ms > 0 ? r->time_ms : 0;
  std::string key = step.kind + '\x1f' + step.implementation + '\x1f' + step.op_type;
  for (const auto& n : step.nodes) key += '\x1f' + n;
  auto [it, fresh] = s.reported_index.emplace(std::move(key), s.reported.size());
  if (fresh) s.reported.push_back(std::move(step));
  ProfileStep& acc = s.reported[it->second];
  acc.total_ms += ms;
  acc.calls++;
}

// The copies a session made (Session::copy_stats), counted by the runs.
struct CopyCounters {
  std::atomic<uint64_t> h2d{0}, d2h{0}, d2d{0}, h2h{0}, bytes{0};
};

// The streams of one run slot (the stream contract of plugin.h): one per device (type and index) that declares
// KEEL_DEVICE_CAP_STREAMS and whose memory is not host memory, made on first use with the table's stream_create; NULL
// for other devices (or when making one failed: logged), whose work is complete when each call returns.
// A slot serves one run at a time; it goes with the run's activation arena set (Built::Plan), so that arena memory is
// reused only on the streams that used it last. Tensors a run read from another run's device outputs are held until
// the slot is next taken (then that run's own fence is waited for first), so that their memory does not go back to
// the pool while this slot's streams may still read it.
class RunStreams {
 public:
  RunStreams() = default;
  RunStreams(const RunStreams&) = delete;
  RunStreams& operator=(const RunStreams&) = delete;
  ~RunStreams() {
    for (auto& e : entries_)
      if (e->stream.get() != nullptr) (void)e->stream.synchronize();
    held_.clear();
  }

  // The stream of device `index` of `d` (nullptr for the host, or a device whose memory is host memory: their work is
  // complete when it returns). Marks the device as having work in flight when `work` is set.
  keel_stream_t get(const DeviceEntry* d, int32_t index, bool work = true) {
    if (d == nullptr) return nullptr;
    Entry& e = entry(d, index);
    if (work && e.stream.get() != nullptr) e.in_flight = true;
    return e.stream.get();
  }
  // The host waits for the work of device `index` of `d` on this slot (a result leaves that device for the host).
  Status synchronize(const DeviceEntry* d, int32_t index) {
    if (d == nullptr) return Status::ok();
    Entry& e = entry(d, index);
    if (e.stream.get() == nullptr) return Status::ok();
    e.in_flight = false;
    return e.stream.synchronize();
  }
  Status synchronize_all() {
    for (auto& e : entries_) KEEL_RETURN_IF_ERROR(synchronize(e->device, e->index), "");
    return Status::ok();
  }
  // Makes this slot's stream of each device in `fence` wait for it (the host waits where the device cannot).
  Status order_after(const RunFence& fence) {
    for (const auto& m : fence.marks()) {
      keel_stream_t s = get(m.device, m.index, false);
      const hal::Device dev(m.device, m.index);
      if (s != nullptr && dev.can_wait_on_events()) {
        KEEL_RETURN_IF_ERROR(dev.wait_event(s, m.event), "stream wait for an input's producer");
      } else {
        KEEL_RETURN_IF_ERROR(m.event.synchronize(), "wait for an input's producer");
      }
    }
    return Status::ok();
  }
  // The work in flight on this slot's streams, as a fence (an event recorded on each); empty when none. A device
  // without events is synchronised instead.
  StatusOr<std::shared_ptr<RunFence>> fence() {
    auto f = std::make_shared<RunFence>();
    for (auto& e : entries_) {
      if (!e->in_flight) continue;
      hal::Device dev(e->device, e->index);
      auto ev = dev.create_event();
      if (!ev.is_ok()) {
        KEEL_RETURN_IF_ERROR(synchronize(e->device, e->index), "");
        continue;
      }
      KEEL_RETURN_IF_ERROR(ev.value().record(e->stream), dev.name() + ": event after the run");
      e->in_flight = false;
      f->add(RunFence::Mark{e->device, e->index, std::move(ev).value()});
    }
    return f;
  }
  // Keeps `tensors` (device inputs of the run that just ended, with work in flight that reads them) until `fence` has
  // passed: released when the slot is next taken (release_held) or goes.
  void hold(std::vector<Tensor> tensors, std::shared_ptr<const RunFence> fence) {
    held_ = std::move(tensors);
    held_fence_ = std::move(fence);
  }
  Status release_held() {
    if (held_.empty()) return Status::ok();
    if (held_fence_) KEEL_RETURN_IF_ERROR(held_fence_->wait(), "");
    held_.clear();
    held_fence_.reset();
    return Status::ok();
  }

 private:
  struct Entry {
    const DeviceEntry* device = nullptr;
    int32_t index = 0;
    hal::Stream stream;
    bool in_flight = false;  // work was queued since the host last waited for the stream
  };
  Entry& entry(const DeviceEntry* d, int32_t index) {
    for (auto& e : entries_)
      if (e->device == d && e->index == index) return *e;
    auto e = std::make_unique<Entry>();
    e->device = d;
    e->index = index;
    hal::Device dev(d, index);
    auto props = dev.properties();
    const bool streams = props.is_ok() && (props.value().capabilities & KEEL_DEVICE_CAP_STREAMS) != 0 &&
                         (props.value().capabilities & KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY) == 0 &&
                         dev.can_synchronize_streams();
    if (streams && !dev.host_memory()) {
      auto st = dev.create_stream();
      if (st.is_ok()) {
        e->stream = std::move(st).value();
      } else if (st.status().code() != StatusCode::kUnimplemented) {
        log::debug("{}: no stream of its own for a run ({}); its default stream orders the run's work", dev.name(),
                   st.status().message());
      }
    }
    entries_.push_back(std::move(e));
    return *entries_.back();
  }
  std::vector<std::unique_ptr<Entry>> entries_;
  std::vector<Tensor> held_;
  std::shared_ptr<const RunFence> held_fence_;
};

// What run_bound adds to a run: the inputs' fences, the outputs wanted and where, and what the run returns for them.
struct RunIo {
  std::vector<std::shared_ptr<const RunFence>> fences;
  const std::vector<BoundOutput>* bound = nullptr;  // null: every output, as host values (run_values)
  std::vector<Location> bound_at;                   // per bound output without a buffer: where it is left
  std::vector<DeviceTensor>* results = nullptr;     // per bound output
  CopyCounters* copies = nullptr;
};

struct Value {
  std::string name;
  DType dtype = DType::kUndefined;
  Location location;
  const DeviceEntry* device = nullptr;
  bool is_const = false, is_input = false, is_output = false;
  Tensor constant;  // for initializers (on their device)
};

// Subgraphs that devices and claim hooks claimed for one build (keel_subgraph_def_t, ONNX Runtime's GetCapability),
// and which node went to which claim.
struct Claim {
  keel_subgraph_def_t def;
  std::string name;
  std::vector<NodeId> nodes;
  const DeviceEntry* dev;
  bool user_data_done = false;  // release_user_data called (or not owed)
};
struct Claims {
  std::vector<Claim> list;
  std::unordered_map<NodeId, size_t> of_node;   // node -> claim index, accepted claims only
  std::unordered_map<size_t, size_t> last_pos;  // claim -> position of its last node in the step order
  Claims() = default;
  Claims(const Claims&) = delete;
  Claims& operator=(const Claims&) = delete;
  // Every claim's user_data is released once: after its create, or here when it never got that far.
  ~Claims() {
    for (auto& c : list)
      if (!c.user_data_done && c.def.release_user_data) c.def.release_user_data(c.def.user_data);
  }
};

// Initializers uploaded to device memory, once per (host tensor, memory): a device step reads its weights from here
// on every run instead of a copy step per run. Shared by a session's generic build and its shape variants (and by
// sessions that share weights), so that each weight is on a device once. Thread-safe: a variant may be built while
// other runs are in flight. The device tensors live until the last build holding this goes.
struct DeviceConstants {
  std::mutex mu;
  struct Upload {
    Tensor host;    // held: its address stays this weight's while the entry exists
    Tensor device;  // the copy in the device's memory
  };
  std::map<std::pair<const void*, std::string>, Upload> uploaded;  // (host data, "type:index") -> upload
};

// The built state of one graph: its values, placement, kernel instances, copy steps, liveness, memory plan and
// profile counters. A session holds the generic build (the graph as created, shapes possibly symbolic) and, for
// graphs with dynamic inputs, shape variants (the same graph with the inputs' dims fixed), each one a Built.
// Steps point into `graph`: a Built is never moved once built (held by unique_ptr).
struct Built {
  Environment* env = nullptr;
  SessionOptions options;
  std::shared_ptr<DeviceConstants> device_constants;  // the session's weights on its devices (never null once built)
  // The device index the session uses for each device type it places on (SessionOptions::devices; 0 by default).
  std::map<std::string, int32_t> device_index;
  int32_t index_of(const std::string& type) const {
    auto it = device_index.find(type);
    return it != device_index.end() ? it->second : 0;
  }
  // "" for the generic build; a shape variant's key (the input shapes it is specialised to).
  std::string variant;
  Graph graph;
  std::vector<Value> values;
  std::unordered_map<std::string, int> value_index;
  std::vector<Step> steps;
  std::vector<FallbackReport> fallbacks;
  std::vector<int> input_values, output_values;
  std::vector<std::string> input_names, output_names;
  // The liveness plan of activation memory, made from the sizes the first run of a shape signature saw: an offset
  // per planned value in one arena per device pool. Every run in progress holds an arena set of its own (one arena
  // per pool), taken from the plan's free sets or allocated when none is free, and gives it back when it ends, so
  // concurrent runs never share activation memory and the steady state allocates nothing. A new signature replaces
  // the plan; runs still holding the old one keep it (shared_ptr) until they end, and its arenas go with it.
  struct Plan {
    std::string signature;
    std::vector<std::string> keys;          // "type:index" of each arena
    std::vector<uint64_t> bytes;            // per key
    std::vector<CachingAllocator*> allocs;  // per key
    std::vector<int> key_of;                // per value: its arena key, -1 = not planned
    std::vector<uint64_t> offset, size;     // per value
    std::mutex mu;
    // An arena set: one arena per key, and the run slot (streams) that works in it: arena memory is only ever reused
    // on the streams that used it last.
    struct ArenaSet {
      std::vector<void*> arenas;
      std::unique_ptr<RunStreams> streams;
    };
    std::vector<ArenaSet> free_sets;  // arena sets not in use (under mu)
    size_t sets = 0;                  // arena sets made (under mu)
    ~Plan() {
      for (auto& set : free_sets) {
        set.streams.reset();  // waits for the work still in flight in the arenas
        for (size_t k = 0; k < set.arenas.size(); ++k) allocs[k]->free(set.arenas[k]);
      }
    }
    // An arena set for one run: a free one, else a new one; arenas empty when the memory could not be had.
    ArenaSet acquire() {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!free_sets.empty()) {
          ArenaSet set = std::move(free_sets.back());
          free_sets.pop_back();
          return set;
        }
      }
      ArenaSet set;
      for (size_t k = 0; k < keys.size(); ++k) {
        auto p = allocs[k]->allocate(bytes[k]);
        if (!p.is_ok()) {
          for (size_t j = 0; j < set.arenas.size(); ++j) allocs[j]->free(set.arenas[j]);
          return {};
        }
        set.arenas.push_back(p.value());
      }
      set.streams = std::make_unique<RunStreams>();
      std::lock_guard<std::mutex> lock(mu);
      ++sets;
      return set;
    }
    void give_back(ArenaSet set) {
      std::lock_guard<std::mutex> lock(mu);
      free_sets.push_back(std::move(set));
    }
  };
  // Run slots of runs without an arena set (the first run of a signature, which records the sizes for the plan).
  std::mutex slots_mu;
  std::vector<std::unique_ptr<RunStreams>> free_slots;  // under slots_mu
  std::unique_ptr<RunStreams> take_slot() {
    std::lock_guard<std::mutex> lock(slots_mu);
    if (free_slots.empty()) return std::make_unique<RunStreams>();
    auto slot = std::move(free_slots.back());
    free_slots.pop_back();
    return slot;
  }
  void give_slot(std::unique_ptr<RunStreams> slot) {
    std::lock_guard<std::mutex> lock(slots_mu);
    free_slots.push_back(std::move(slot));
  }
  mutable std::mutex plan_mu;
  std::shared_ptr<Plan> plan;  // under plan_mu
  // Profile counters of the steps and the largest kernel workspace one step took (claimed subgraphs keep their
  // internal values there), per "type:index".
  mutable std::mutex stats_mu;
  std::map<std::string, uint64_t> workspace_peak;

  ~Built() {
    free_slots.clear();  // waits for work still in flight on the run slots' streams
    steps.clear();       // kernel states first (they may hold memory of the pools), then the arenas
    plan.reset();
  }

  // Whether a device's memory is host memory (asked once per device: it is a plugin call).
  std::unordered_map<const DeviceEntry*, bool> host_memory_cache;
  bool is_host_memory(const DeviceEntry* d) {
    if (d == nullptr) return true;
    auto it = host_memory_cache.find(d);
    if (it == host_memory_cache.end()) it = host_memory_cache.emplace(d, hal::Device(d, 0).host_memory()).first;
    return it->second;
  }

  int add_value(const std::string& name) {
    auto it = value_index.find(name);
    if (it != value_index.end()) return it->second;
    Value v;
    v.name = name;
    if (auto* vi = graph.info(name)) v.dtype = vi->tensor_dtype();
    values.push_back(std::move(v));
    value_index[name] = static_cast<int>(values.size()) - 1;
    return static_cast<int>(values.size()) - 1;
  }

  // Builds the steps of `graph` for devices in `device_order` (most preferred first); the phases below, in order.
  Status build(const std::vector<std::string>& device_order);
  // Build phases (each reads what the ones before it produced):
  void number_values();
  void collect_claims(const std::vector<std::string>& device_order, Claims& claims);
  std::vector<NodeId> order_steps(const std::vector<NodeId>& order, Claims& claims);
  Status make_steps(const std::vector<NodeId>& order, const std::vector<std::string>& device_order, Claims& claims);
  Status make_claim_step(const std::vector<NodeId>& order, Claim& claim);
  Status make_node_step(const Node& node, const std::vector<std::string>& device_order);
  Status place_node(const Node& node, const std::vector<std::string>& device_order, Step& step);
  Status mark_outputs();
  Status make_copy_steps();
  Status bind_memory();
  void plan_frees();
  // Replaces a step's kernel `failed` by its next alternative that accepts the node (after `why` rejected it) and
  // returns it; when another run switched already, the slot it installed; `why` when none is left.
  StatusOr<KernelSlot*> switch_to_alternative(Step& s, KernelSlot* failed, const Status& why);
  // Checks the inputs against the graph's declared types and binds them into `live` (sized to the values);
  // `signature` receives every input's name and shape (what the memory plan is keyed by).
  Status bind_inputs(const std::vector<std::pair<std::string, RunValue>>& inputs, std::vector<RunValue>& live,
                     std::string& signature);
  Status run(const std::vector<std::pair<std::string, RunValue>>& inputs, std::vector<RunValue>& outputs,
             const RunOptions& run_options, ThreadPool* run_pool, bool profile, RunIo& io);
  // Copies `src` into `dst` (equal byte sizes, any memory) on the slot's streams; the host waits for the source
  // device when `dst` is host memory (a result leaving the device). Counted in `copies`.
  Status copy_into(const Tensor& src, const Tensor& dst, RunStreams& rs, CopyCounters* copies);
  // A new tensor of `like`'s dtype and shape at `at`, from that memory's pool (keyed by the slot's stream there).
  StatusOr<Tensor> allocate_at(const Tensor& like, const Location& at, RunStreams& rs);
  // Constant `v` (host memory) in the memory of `dev`: uploaded at the first ask, then the same device tensor.
  StatusOr<Tensor> device_constant(int v, const DeviceEntry* dev);
  // The device entry of a location (nullptr for the host).
  const DeviceEntry* device_at(const Location& at) const {
    return at.is_host() ? nullptr : env->registry().device(at.device_type);
  }
  std::shared_ptr<Plan> make_plan(const std::string& signature, const std::unordered_map<int, uint64_t>& observed);
  void reset_profile() {
    std::lock_guard<std::mutex> lock(stats_mu);
    for (auto& s : steps) {
      s.total_ms = 0;
      s.calls = 0;
      s.reported.clear();
      s.reported_index.clear();
    }
  }
};

}  // namespace

// The prepared model: the generic build and the shape variants, with their kernels (and the weights they prepacked)
// and activation plans. One session owns it, or several share it (SessionOptions::share_weights_with).
struct Session::Impl {
  Environment* env = nullptr;
  SessionOptions options;  // of the session that created it (what shapes a build: devices, passes, claims, ...)
  std::vector<std::string> device_order;        // device types, most preferred first
  std::map<std::string, int32_t> device_index;  // type -> the index this session uses
  uint64_t fingerprint = 0;  // of the model as given to create (model_fingerprint), before the passes
  std::mutex variants_mu;    // guards variants and cap_logged (a variant is built under it)
  std::unique_ptr<Built> generic;
  // Shape specialisation (only for graphs with dynamic tensor inputs and options.shape_variants > 0): the graph as
  // it was before placement (after the passes), which each variant copies; the dynamic inputs; the variants by
  // key (nullptr: shapes whose variant failed to build, which run on the generic build). Variants are never evicted
  // (see SessionOptions::shape_variants).
  Graph base;
  std::vector<std::string> dynamic_inputs;
  std::unordered_map<std::string, std::unique_ptr<Built>> variants;
  bool cap_logged = false;
  std::shared_ptr<DeviceConstants> device_constants = std::make_shared<DeviceConstants>();

  std::unique_ptr<Built> make_built() const {
    auto b = std::make_unique<Built>();
    b->env = env;
    b->options = options;
    b->device_constants = device_constants;
    b->device_index = device_index;
    return b;
  }
  // The build to run `inputs` on: a shape variant (found or built now), or the generic build.
  StatusOr<Built*> pick(const std::vector<std::pair<std::string, RunValue>>& inputs);
  StatusOr<std::unique_ptr<Built>> build_variant(const std::string& key,
                                                 const std::map<std::string, const Tensor*>& dynamic);
};

// What is this session's own: its options (threads, profile), its thread pool, and the build its most recent run used.
struct Session::Local {
  SessionOptions options;
  std::unique_ptr<ThreadPool> own_pool;  // when options.threads asks for other than the environment's count
  ThreadPool* pool = nullptr;
  // The build the most recent run used (placement(), profile(), ... report it); nullptr before the first run.
  std::atomic<Built*> current{nullptr};
  CopyCounters copies;
  Built* last(const Impl& impl) const {
    Built* b = current.load(std::memory_order_acquire);
    return b != nullptr ? b : impl.generic.get();
  }
};

namespace {

// Fills a create-phase context for `node`: dtypes/shapes from value info, data for constants.
void fill_create_context(keel_kernel_context_t& ctx, const Node& node, const Graph& g, int32_t opset,
                         int32_t device_index) {
  ctx.phase = keel_kernel_context_t::Phase::kCreate;
  ctx.device_index = device_index;
  ctx.node = &node;
  ctx.opset = opset;
  ctx.input_shapes.resize(node.inputs.size());
  ctx.input_views.resize(node.inputs.size());
  ctx.inputs.assign(node.inputs.size(), nullptr);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const std::string& v = node.inputs[i];
    if (v.empty()) continue;
    keel_tensor_t view{};
    view.struct_size = sizeof view;
    if (auto it = g.initializers.find(v); it != g.initializers.end()) {
      view = it->second.c_view();
    } else if (const ValueInfo* vi = g.info(v)) {
      view.dtype = static_cast<int32_t>(vi->dtype);
      if (vi->shape) {
        ctx.input_shapes[i] = *vi->shape;
        view.ndim = static_cast<int32_t>(vi->shape->size());
        view.dims = ctx.input_shapes[i].data();
      } else {
        view.ndim = -1;
      }
    }
    ctx.input_views[i] = view;
    ctx.inputs[i] = &ctx.input_views[i];
  }
  ctx.output_dtypes.clear();
  for (const auto& o : node.outputs) {
    const ValueInfo* vi = o.empty() ? nullptr : g.info(o);
    ctx.output_dtypes.push_back(vi ? vi->dtype : DType::kUndefined);
  }
}

}  // namespace

Status Built::place_node(const Node& node, const std::vector<std::string>& device_order, Step& step) {
  const Registry& reg = env->registry();
  int32_t opset = 0;
  if (auto it = graph.opsets.find(node.domain); it != graph.opsets.end()) opset = it->second;
  step.opset = opset;
  const dispatch::CallTypes types = dispatch::call_types(node, graph);
  const std::string who = "node '" + node.name + "' (" + node.op_type + ")";
  std::string reasons;
  for (size_t d = 0; d < device_order.size(); ++d) {
    const std::string& dev = device_order[d];
    std::vector<const KernelEntry*> kernels = dispatch::ranked_kernels(reg, node, opset, dev);
    std::vector<std::string> rejections;
    KEEL_ASSIGN_OR_RETURN(
        dispatch::KernelChoice choice,
        dispatch::take_kernel(
            kernels, node, opset, types,
            [&](keel_kernel_context_t& ctx) { fill_create_context(ctx, node, graph, opset, index_of(dev)); }, who,
            &rejections),
        "");
    if (choice) {
      step.kind = Step::Kind::kKernel;
      step.kernel_name = choice.kernel->name;
      install_kernel(step, choice.kernel->name, choice.kernel->def.compute, choice.release(), choice.state,
                     choice.reentrant());
      step.device_type = dev;
      step.device_index = index_of(dev);
      step.device = reg.device(dev);
      step.alternatives = std::move(kernels);  // what take_kernel did not try: the ones ranked below
      if (d > 0) {
        FallbackReport fr{node.name, node.op_type, device_order[0], dev, reasons};
        fallbacks.push_back(fr);
        // A shape variant repeats what the generic build reported at create time: not again at info level.
        log::log(variant.empty() ? spdlog::level::info : spdlog::level::debug,
                 "node '{}' ({}) falls back from {} to {}: {}", node.name, node.op_type, device_order[0], dev, reasons);
      }
      return Status::ok();
    }
    // A device's reason is its last kernel's rejection.
    std::string dev_reason = rejections.empty() ? std::string() : rejections.back();
    if (dev_reason.empty()) {
      dev_reason = "no kernel for " + (node.domain.empty() ? std::string() : node.domain + ".") + node.op_type +
                   " (opset " + std::to_string(opset) + ") on " + dev;
    }
    reasons += (reasons.empty() ? "" : "; ") + dev_reason;
  }
  if (options.fallback == Fallback::kError && !device_order.empty()) {
    fallbacks.push_back(FallbackReport{node.name, node.op_type, device_order[0], "", reasons});
  }
  return unimplemented("node '" + node.name + "' (" + node.op_type + "): " + reasons);
}

// The build, phase by phase. Each phase's comment says what it reads and what it produces.
Status Built::build(const std::vector<std::string>& device_order) {
  KEEL_ASSIGN_OR_RETURN(auto order, graph.topological_order(), "session");
  number_values();
  Claims claims;
  if (options.claims && (options.fallback == Fallback::kCpu || !device_order.empty()))
    collect_claims(device_order, claims);
  const std::vector<NodeId> step_order = order_steps(order, claims);
  KEEL_RETURN_IF_ERROR(make_steps(step_order, device_order, claims), "");
  KEEL_RETURN_IF_ERROR(mark_outputs(), "");
  KEEL_RETURN_IF_ERROR(make_copy_steps(), "session");
  KEEL_RETURN_IF_ERROR(bind_memory(), "");
  plan_frees();
  return Status::ok();
}

// Phase 1, value numbering: reads the graph's inputs and initializers; numbers them as the first values (inputs,
// then constants); node outputs get their numbers as the steps are made.
void Built::number_values() {
  for (const auto& in : graph.inputs) {
    int v = add_value(in);
    values[v].is_input = true;
    input_values.push_back(v);
    input_names.push_back(in);
  }
  for (auto& [name, t] : graph.initializers) {
    int v = add_value(name);
    values[v].is_const = true;
    values[v].constant = t;
    values[v].dtype = t.dtype();
  }
}

namespace {

// The sink a claim_subgraphs entry reports its claims to: copies each definition into `claims` (checked: size, ABI,
// nodes, compute).
struct ClaimSink {
  keel_subgraph_sink_t c;
  std::vector<Claim>* claims;
  const DeviceEntry* dev;
};

keel_status_t sink_claim(keel_subgraph_sink_t* self, const keel_subgraph_def_t* def) {
  auto* s = reinterpret_cast<ClaimSink*>(self);
  if (!def || def->struct_size < offsetof(keel_subgraph_def_t, release) + sizeof(def->release))
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "claim: NULL or too small subgraph definition");
  // (0: a definition zero-filled by a plugin that does not set the version; no ABI has major 0.)
  if (KEEL_HAS_MEMBER(def, keel_subgraph_def_t, abi_major) && def->abi_major != 0 &&
      def->abi_major != KEEL_PLUGIN_ABI_MAJOR) {
    if (KEEL_HAS_MEMBER(def, keel_subgraph_def_t, release_user_data) && def->release_user_data)
      def->release_user_data(def->user_data);
    return make_c_status(
        KEEL_STATUS_ABI_MISMATCH,
        ("claim: subgraph definition built for plugin ABI " + std::to_string(def->abi_major) + ".x").c_str());
  }
  keel_subgraph_def_t copy{};
  std::memcpy(&copy, def, std::min<size_t>(def->struct_size, sizeof copy));
  copy.struct_size = sizeof copy;
  if (!copy.compute || copy.node_count == 0 || !copy.node_ids) {
    if (copy.release_user_data) copy.release_user_data(copy.user_data);
    return make_c_status(KEEL_STATUS_INVALID_ARGUMENT, "claim: empty subgraph or no compute");
  }
  Claim c{copy, def->name ? def->name : "subgraph", {def->node_ids, def->node_ids + def->node_count}, s->dev};
  c.def.name = nullptr;
  c.def.node_ids = nullptr;
  s->claims->push_back(std::move(c));
  return nullptr;
}

}  // namespace

// Phase 2, claims: reads the graph and the registry; devices that can take whole subgraphs get first pick (their
// tables' claim_subgraphs, in device order), then the claim hooks that kernel plugins registered for the preferred
// device type (by priority). Produces claims.list and claims.of_node (a claim naming an unknown, repeated or
// already claimed node is dropped whole).
void Built::collect_claims(const std::vector<std::string>& device_order, Claims& claims) {
  const Registry& reg = env->registry();
  auto ask = [&](const DeviceEntry* dev, const std::string& who, auto&& claim_fn, void* user_data) {
    keel_graph_s view;
    view.graph = &graph;
    view.env = env;
    ClaimSink sink;
    sink.c.struct_size = sizeof(keel_subgraph_sink_t);
    sink.c.core_data = nullptr;
    sink.c.claim = sink_claim;
    sink.claims = &claims.list;
    sink.dev = dev;
    Status st = Status::from_c(claim_fn(user_data, &view, graph_api(), &sink.c));
    if (!st.is_ok()) {
      auto level = st.code() == StatusCode::kUnimplemented ? spdlog::level::debug : spdlog::level::warn;
      log::log(level, "{} claimed no subgraphs: {}", who, st.message());
    }
  };
  for (const auto& dev_type : device_order) {
    const DeviceEntry* dev = reg.device(dev_type);
    if (!dev || !dev->table.claim_subgraphs) continue;
    ask(dev, "device " + dev_type, dev->table.claim_subgraphs, dev->table.user_data);
  }
  if (!device_order.empty()) {
    if (const DeviceEntry* dev = reg.device(device_order[0])) {
      for (const ClaimerEntry* ce : reg.claimers_for(device_order[0]))
        ask(dev, "claimer " + ce->name, ce->def.claim_subgraphs, ce->def.user_data);
    }
  }
  for (size_t ci = 0; ci < claims.list.size(); ++ci) {
    bool ok = true;
    std::unordered_set<NodeId> seen;
    for (NodeId id : claims.list[ci].nodes)
      ok = ok && graph.node(id) && !claims.of_node.count(id) && seen.insert(id).second;
    if (!ok) {
      log::warn("claim '{}' rejected: unknown, repeated or already claimed node", claims.list[ci].name);
      continue;
    }
    for (NodeId id : claims.list[ci].nodes) claims.of_node[id] = ci;
  }
}

// Phase 3, step order: reads the topological order and the claims. A claim runs as one step, so the steps follow
// the graph with every claim contracted to one unit: Kahn's algorithm over units (an unclaimed node, or a claim),
// taking among the ready units the one whose last node comes first in `order`. Where no outside node reads a claim's
// value before the claim's last node, that is `order` itself; a node that does (a side output of a chain: a
// decomposed LayerNormalization's Mean read by an unclaimed op) moves after the claim instead of costing the claim.
// A claim on a cycle of units (a path leaves it and comes back, directly or through another claim) cannot run as one
// step: the latest such claim is dropped, with a warning (a claimer's bug), until there is none. Returns the step
// order (each claim's nodes together, in their order in `order`); produces claims.last_pos (a claim's step is at its
// last node's position there).
std::vector<NodeId> Built::order_steps(const std::vector<NodeId>& order, Claims& claims) {
  const size_t n = order.size();
  std::unordered_map<NodeId, size_t> pos_of;
  std::unordered_map<std::string, size_t> producer_pos;  // value -> its producer's position (Graph::producer scans)
  for (size_t p = 0; p < n; ++p) {
    pos_of[order[p]] = p;
    for (const auto& o : graph.node(order[p])->outputs)
      if (!o.empty()) producer_pos[o] = p;
  }
  for (;;) {
    // Units 0..n-1: the unclaimed node at that position (unused when claimed); n + c: claim c.
    const size_t units = n + claims.list.size();
    auto unit_of = [&](NodeId id) {
      auto c = claims.of_node.find(id);
      return c == claims.of_node.end() ? pos_of.at(id) : n + c->second;
    };
    std::vector<size_t> key(units, 0);  // position of the unit's last node
    std::vector<char> present(units, 0);
    size_t present_units = 0;
    std::vector<std::vector<size_t>> succ(units);
    std::vector<size_t> pending(units, 0);
    for (size_t p = 0; p < n; ++p) {
      const size_t u = unit_of(order[p]);
      present_units += present[u] == 0;
      present[u] = 1;
      key[u] = p;
    }
    for (size_t p = 0; p < n; ++p) {
      const Node* node = graph.node(order[p]);
      const size_t u = unit_of(node->id);
      auto depend = [&](const std::string& in) {
        auto prod = in.empty() ? producer_pos.end() : producer_pos.find(in);
        if (prod == producer_pos.end()) return;
        const size_t v = unit_of(order[prod->second]);
        if (v == u || std::find(succ[v].begin(), succ[v].end(), u) != succ[v].end()) return;
        succ[v].push_back(u);
        ++pending[u];
      };
      for (const auto& in : node->inputs) depend(in);
      for (const auto& in : implicit_inputs(*node)) depend(in);
    }
    using Ready = std::pair<size_t, size_t>;  // (key, unit)
    std::priority_queue<Ready, std::vector<Ready>, std::greater<>> ready;
    for (size_t u = 0; u < units; ++u)
      if (present[u] && pending[u] == 0) ready.push({key[u], u});
    std::vector<size_t> emitted;
    while (!ready.empty()) {
      const size_t u = ready.top().second;
      ready.pop();
      emitted.push_back(u);
      for (size_t w : succ[u])
        if (--pending[w] == 0) ready.push({key[w], w});
    }
    if (emitted.size() == present_units) {
      std::vector<NodeId> steps_order;
      steps_order.reserve(n);
      std::vector<std::vector<NodeId>> members(claims.list.size());
      for (size_t p = 0; p < n; ++p)
        if (auto c = claims.of_node.find(order[p]); c != claims.of_node.end()) members[c->second].push_back(order[p]);
      claims.last_pos.clear();
      for (size_t u : emitted) {
        if (u < n) {
          steps_order.push_back(order[u]);
          continue;
        }
        for (NodeId id : members[u - n]) steps_order.push_back(id);
        claims.last_pos[u - n] = steps_order.size() - 1;
      }
      return steps_order;
    }
    // A cycle: every unit left waits on another one left. Drop the latest claim that reaches itself.
    std::vector<char> left(units, 0);
    for (size_t u = 0; u < units; ++u) left[u] = present[u] && pending[u] > 0;
    auto on_cycle = [&](size_t c) {
      std::vector<char> seen(units, 0);
      std::vector<size_t> stack = succ[c];
      while (!stack.empty()) {
        const size_t x = stack.back();
        stack.pop_back();
        if (x == c) return true;
        if (!left[x] || seen[x]) continue;
        seen[x] = 1;
        stack.insert(stack.end(), succ[x].begin(), succ[x].end());
      }
      return false;
    };
    size_t drop = units;
    for (size_t u = n; u < units; ++u)
      if (left[u] && on_cycle(u) && (drop == units || key[u] > key[drop])) drop = u;
    if (drop == units) {  // not expected (unclaimed nodes alone follow `order`): every node on its own then
      log::error("session: no step order for the claimed subgraphs; running every node on its own");
      claims.of_node.clear();
      continue;
    }
    log::warn("claim '{}' rejected: not convex (a path leaves it and comes back)", claims.list[drop - n].name);
    for (NodeId id : claims.list[drop - n].nodes) claims.of_node.erase(id);
  }
}

// Phase 4, steps and placement: reads the step order and the claims; makes the steps in that order, one per
// claim (at its last node's position) and one per other node: placed on the first device in `device_order` with a
// kernel that accepts it (place_node), or run by the executor (control flow). Numbers the values the steps read and
// write, and records each node's device in the graph.
Status Built::make_steps(const std::vector<NodeId>& order, const std::vector<std::string>& device_order,
                         Claims& claims) {
  for (size_t pos = 0; pos < order.size(); ++pos) {
    const Node* node = graph.node(order[pos]);
    if (auto cit = claims.of_node.find(node->id); cit != claims.of_node.end()) {
      const size_t ci = cit->second;
      if (claims.last_pos[ci] == pos) KEEL_RETURN_IF_ERROR(make_claim_step(order, claims.list[ci]), "");
      continue;
    }
    KEEL_RETURN_IF_ERROR(make_node_step(*node, device_order), "");
  }
  for (auto& s : steps) {
    if (s.node) const_cast<Node*>(s.node)->device_type = s.device_type;
  }
  return Status::ok();
}

// The step of a claimed subgraph: its boundary values (read from outside; used outside or graph outputs) and the
// kernel its create made.
Status Built::make_claim_step(const std::vector<NodeId>& order, Claim& c) {
  std::unordered_set<std::string> graph_outputs(graph.outputs.begin(), graph.outputs.end());
  std::unordered_set<NodeId> members(c.nodes.begin(), c.nodes.end());
  std::unordered_set<std::string> produced;
  for (NodeId id : c.nodes)
    for (const auto& o : graph.node(id)->outputs) produced.insert(o);
  Step step;
  step.kind = Step::Kind::kSubgraph;
  step.name = c.name;
  step.op_type = "Subgraph";
  step.kernel_name = c.name;
  step.device = c.dev;
  step.device_type = c.dev->device_type;
  step.device_index = index_of(step.device_type);
  std::vector<std::string> ins, outs;
  for (NodeId id : order) {
    if (!members.count(id)) continue;
    const Node* m = graph.node(id);
    step.members.emplace_back(m->name, m->op_type);
    for (const auto& in : m->inputs)
      if (!in.empty() && !produced.count(in) && std::find(ins.begin(), ins.end(), in) == ins.end()) ins.push_back(in);
    for (const auto& o : m->outputs) {
      if (o.empty()) continue;
      bool outside = graph_outputs.count(o) > 0;
      for (NodeId u : graph.consumers(o)) outside = outside || !members.count(u);
      if (outside) outs.push_back(o);
    }
  }
  for (const auto& in : ins) step.inputs.push_back(add_value(in));
  for (const auto& o : outs) {
    int v = add_value(o);
    step.outputs.push_back(v);
    step.output_dtypes.push_back(values[v].dtype);
  }
  void* state = c.def.user_data;
  if (c.def.create) {
    keel_kernel_context_t ctx;
    Node pseudo;
    pseudo.name = c.name;
    pseudo.inputs = ins;
    pseudo.outputs = outs;
    fill_create_context(ctx, pseudo, graph, 0, step.device_index);
    ctx.node = nullptr;
    Status st = Status::from_c(c.def.create(c.def.user_data, &ctx, &state));
    c.user_data_done = true;
    if (c.def.release_user_data) c.def.release_user_data(c.def.user_data);
    KEEL_RETURN_IF_ERROR(st, "subgraph '" + c.name + "' create");
  } else {
    c.user_data_done = true;  // user_data is the state: release frees it
  }
  install_kernel(step, c.name, c.def.compute, c.def.release, state, (c.def.flags & KEEL_KERNEL_FLAG_REENTRANT) != 0);
  steps.push_back(std::move(step));
  return Status::ok();
}

// The step of one unclaimed node: an executor op (control flow, sequences, optionals) or a kernel placed by
// place_node.
Status Built::make_node_step(const Node& node, const std::vector<std::string>& device_order) {
  Step step;
  step.node = &node;
  step.name = node.name;
  step.op_type = node.op_type;
  if (is_native_op(node, graph)) {
    // Control flow, sequences, optionals: the executor runs them; nested graphs get the same device order.
    SessionOptions nested = options;
    nested.devices.clear();
    for (const auto& t : device_order) nested.devices.push_back(t + ":" + std::to_string(index_of(t)));
    nested.passes.clear();
    // No shape variants inside: loop bodies see new shapes on many iterations (a build each would cost more than
    // it saves); a variant of this graph builds its control-flow nodes again, with the shapes it fixed.
    nested.shape_variants = 0;
    KEEL_ASSIGN_OR_RETURN(step.native, make_native_op(node, graph, *env, nested), "node '" + node.name + "'");
    step.kind = Step::Kind::kNative;
    step.kernel_name = "executor";
  } else {
    KEEL_RETURN_IF_ERROR(place_node(node, device_order, step), "placement");
  }
  for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : add_value(in));
  if (step.native)  // what its subgraphs read from this graph: inputs too (liveness, copies to the host)
    for (const auto& in : implicit_inputs(node)) step.inputs.push_back(add_value(in));
  for (const auto& o : node.outputs) {
    int v = o.empty() ? -1 : add_value(o);
    step.outputs.push_back(v);
    DType dt = v >= 0 ? values[v].dtype : DType::kUndefined;
    step.output_dtypes.push_back(dt);
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

// Phase 5, outputs: reads the graph's outputs and the values the steps produced; marks them as outputs (in graph
// order). An output no step produces is an error.
Status Built::mark_outputs() {
  for (const auto& o : graph.outputs) {
    auto it = value_index.find(o);
    if (it == value_index.end()) return invalid_argument("graph output '" + o + "' is not produced");
    values[it->second].is_output = true;
    output_values.push_back(it->second);
    output_names.push_back(o);
  }
  return Status::ok();
}

// Phase 7, memory: reads each step's device; sets where its outputs live (the device's memory, or the host for
// host-memory devices) and that memory's pool.
Status Built::bind_memory() {
  for (auto& s : steps) {
    const bool on_device = s.device && !is_host_memory(s.device);
    s.memory_type = on_device ? s.device_type : "cpu";
    s.memory_index = on_device ? s.device_index : 0;
    KEEL_ASSIGN_OR_RETURN(s.allocator, env->allocator(s.memory_type, s.memory_index), "step '" + s.name + "'");
  }
  return Status::ok();
}

// Phase 8, liveness: reads the final step list; each step frees the values whose last reader it is (and outputs no
// step reads); graph inputs, constants and outputs are never freed. The activation memory plan itself is made per
// input signature at the first run (make_plan).
void Built::plan_frees() {
  std::vector<int> last_use(values.size(), -1);
  for (size_t i = 0; i < steps.size(); ++i)
    for (int v : steps[i].inputs)
      if (v >= 0) last_use[v] = static_cast<int>(i);
  for (size_t v = 0; v < values.size(); ++v) {
    if (values[v].is_output || values[v].is_const || values[v].is_input) continue;
    if (last_use[v] >= 0) steps[last_use[v]].free_after.push_back(static_cast<int>(v));
  }
  // Producers of unused outputs free them right away.
  for (size_t i = 0; i < steps.size(); ++i)
    for (int v : steps[i].outputs)
      if (v >= 0 && last_use[v] < 0 && !values[v].is_output) steps[i].free_after.push_back(v);
}

StatusOr<KernelSlot*> Built::switch_to_alternative(Step& s, KernelSlot* failed, const Status& why) {
  std::lock_guard<std::mutex> lock(*s.mu);
  if (KernelSlot* now = s.kernel.load(); now != failed) return now;  // another run switched already
  if (s.alternatives.empty()) return why;
  log::info("kernel {} rejected node '{}' at run time ({}); trying the next kernel", failed->name, s.name,
            why.message());
  KEEL_ASSIGN_OR_RETURN(
      dispatch::KernelChoice choice,
      dispatch::take_kernel(
          s.alternatives, *s.node, s.opset, dispatch::call_types(*s.node, graph),
          [&](keel_kernel_context_t& ctx) { fill_create_context(ctx, *s.node, graph, s.opset, s.device_index); },
          "node '" + s.name + "' (" + s.op_type + ")", nullptr),
      "");
  if (!choice) return why;
  // The rejected slot stays (a concurrent run may still compute on it); the build releases it.
  return install_kernel(s, choice.kernel->name, choice.kernel->def.compute, choice.release(), choice.state,
                        choice.reentrant());
}

StatusOr<Tensor> Built::device_constant(int v, const DeviceEntry* dev) {
  const Tensor& host = values[v].constant;
  const Location at{dev->device_type, index_of(dev->device_type)};
  auto key = std::make_pair(host.raw_data(), at.to_string());
  std::lock_guard<std::mutex> lock(device_constants->mu);
  if (auto it = device_constants->uploaded.find(key); it != device_constants->uploaded.end()) {
    if (it->second.host.shape() == host.shape() && it->second.host.dtype() == host.dtype()) return it->second.device;
  }
  const std::string what = "upload of weight '" + values[v].name + "' (" + host.describe() + ") to " + at.to_string();
  // A slot of its own, waited for before it goes: every run (on any stream) reads the weight after this.
  RunStreams rs;
  KEEL_ASSIGN_OR_RETURN(Tensor dst, allocate_at(host, at, rs), what);
  KEEL_RETURN_IF_ERROR(copy_into(host, dst, rs, nullptr), what);
  KEEL_RETURN_IF_ERROR(rs.synchronize_all(), what);
  device_constants->uploaded[key] = DeviceConstants::Upload{host, dst};
  return dst;
}

// Phase 6, copies: reads the steps' devices; inserts a copy step before each step that reads a value living in other
// memory (one copy per value and destination), and points the reader at the copy. A weight (a constant in host
// memory) read on a device is uploaded there now, once, and read from there by every run: a constant value of its
// own, no step.
Status Built::make_copy_steps() {
  // Where each value lives: the device of its producer (host for inputs and constants).
  std::vector<const DeviceEntry*> home(values.size(), nullptr);
  for (const auto& s : steps)
    for (int v : s.outputs)
      if (v >= 0) home[v] = is_host_memory(s.device) ? nullptr : s.device;
  std::vector<Step> with_copies;
  std::map<std::pair<int, const DeviceEntry*>, int> copied;  // (value, device) -> copy value
  for (auto& s : steps) {
    const DeviceEntry* want = is_host_memory(s.device) ? nullptr : s.device;
    for (int& v : s.inputs) {
      if (v < 0 || home[v] == want) continue;
      auto key = std::make_pair(v, want);
      auto it = copied.find(key);
      if (it == copied.end() && values[v].is_const && home[v] == nullptr && want != nullptr) {
        KEEL_ASSIGN_OR_RETURN(Tensor on_device, device_constant(v, want), "");
        const int nv = add_value(values[v].name + "@" + want->device_type);
        values[nv].is_const = true;
        values[nv].dtype = values[v].dtype;
        values[nv].constant = std::move(on_device);
        home.push_back(want);
        it = copied.emplace(key, nv).first;
      }
      if (it == copied.end()) {
        Step c;
        c.kind = Step::Kind::kCopy;
        c.name = values[v].name + "@" + (want ? want->device_type : std::string("cpu"));
        c.op_type = "Copy";
        c.kernel_name = "copy";
        c.copy_from = home[v];
        c.device = want;
        c.device_type = want ? want->device_type : "cpu";
        c.device_index = want ? index_of(c.device_type) : 0;
        c.inputs = {v};
        int nv = add_value(c.name);
        values[nv].dtype = values[v].dtype;
        home.push_back(want);
        c.outputs = {nv};
        c.output_dtypes = {values[v].dtype};
        with_copies.push_back(std::move(c));
        it = copied.emplace(key, nv).first;
      }
      v = it->second;
    }
    with_copies.push_back(std::move(s));
  }
  // Graph outputs produced off the host are copied back by run().
  steps = std::move(with_copies);
  return Status::ok();
}

std::shared_ptr<Built::Plan> Built::make_plan(const std::string& signature,
                                              const std::unordered_map<int, uint64_t>& observed) {
  auto plan = std::make_shared<Plan>();
  plan->signature = signature;
  plan->key_of.assign(values.size(), -1);
  plan->offset.assign(values.size(), 0);
  plan->size.assign(values.size(), 0);
  // Lifetimes [first step, last step] of planned values (intermediates, not graph outputs).
  struct Interval {
    int v;
    int begin, end;
    uint64_t size;
    int key;
  };
  std::vector<Interval> iv;
  std::vector<int> first(values.size(), -1), last(values.size(), -1);
  for (size_t i = 0; i < steps.size(); ++i) {
    for (int v : steps[i].outputs)
      if (v >= 0 && first[v] < 0) first[v] = static_cast<int>(i);
    for (int v : steps[i].inputs)
      if (v >= 0) last[v] = static_cast<int>(i);
    for (int v : steps[i].outputs)
      if (v >= 0) last[v] = std::max(last[v], static_cast<int>(i));
  }
  auto key_index = [&](const Step& s) {
    std::string key = s.memory_type + ":" + std::to_string(s.memory_index);
    for (size_t k = 0; k < plan->keys.size(); ++k)
      if (plan->keys[k] == key) return static_cast<int>(k);
    plan->keys.push_back(key);
    plan->bytes.push_back(0);
    plan->allocs.push_back(s.allocator);
    return static_cast<int>(plan->keys.size()) - 1;
  };
  for (size_t i = 0; i < steps.size(); ++i)
    for (int v : steps[i].outputs) {
      if (v < 0 || values[v].is_output || first[v] != static_cast<int>(i)) continue;
      auto sz = observed.find(v);
      if (sz == observed.end()) continue;
      iv.push_back({v, first[v], last[v], (sz->second + 255) / 256 * 256, key_index(steps[i])});
    }
  // Greedy: biggest first, lowest offset that does not overlap a live neighbour.
  std::sort(iv.begin(), iv.end(), [](const Interval& a, const Interval& b) { return a.size > b.size; });
  std::vector<std::tuple<int, int, uint64_t, uint64_t, int>> placed;  // begin, end, off, size, key
  for (const auto& x : iv) {
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (const auto& [b, e, off, size, key] : placed)
      if (key == x.key && !(e < x.begin || x.end < b)) busy.emplace_back(off, size);
    std::sort(busy.begin(), busy.end());
    uint64_t off = 0;
    for (const auto& [bo, bs] : busy) {
      if (off + x.size <= bo) break;
      off = std::max(off, bo + bs);
    }
    placed.emplace_back(x.begin, x.end, off, x.size, x.key);
    plan->key_of[x.v] = x.key;
    plan->offset[x.v] = off;
    plan->size[x.v] = x.size;
    plan->bytes[x.key] = std::max(plan->bytes[x.key], off + x.size);
  }
  return plan;
}

Status Built::bind_inputs(const std::vector<std::pair<std::string, RunValue>>& inputs, std::vector<RunValue>& live,
                          std::string& signature) {
  live.assign(values.size(), RunValue());
  signature.clear();
  for (auto& [name, value] : inputs) {
    auto it = value_index.find(name);
    if (it == value_index.end() || !values[it->second].is_input) {
      std::string known;
      for (auto& n : input_names) known += (known.empty() ? "" : ", ") + n;
      return invalid_argument("unknown input '" + name + "' (inputs: " + known + ")");
    }
    if (const ValueInfo* vi = graph.info(name); !value.is_tensor() || (vi && !vi->is_tensor())) {
      KEEL_RETURN_IF_ERROR(check_input_kind(name, value, vi), "");
      live[it->second] = value;
      signature += name + value.describe() + ";";
      continue;
    }
    const Tensor& t = value.tensor;
    const Value& v = values[it->second];
    if (v.dtype != DType::kUndefined && t.dtype() != v.dtype) {
      return invalid_argument("input '" + name + "' has dtype " + dtype_name(t.dtype()) + ", the model expects " +
                              dtype_name(v.dtype));
    }
    if (const ValueInfo* vi = graph.info(name); vi && vi->shape) {
      const Shape& want = *vi->shape;
      bool ok = want.size() == t.shape().size();
      for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || want[i] == t.shape()[i];
      if (!ok) {
        return invalid_argument("input '" + name + "' has shape " + shape_to_string(t.shape()) +
                                ", the model expects " + shape_to_string(want));
      }
    }
    if (!t.location().is_host() && device_at(t.location()) == nullptr) {
      return invalid_argument("input '" + name + "' is in the memory of " + t.location().to_string() +
                              ", a device this environment does not have");
    }
    live[it->second] = value;
    signature += name + shape_to_string(t.shape()) + ";";
  }
  for (int v : input_values)
    if (!live[v].defined()) return invalid_argument("missing input '" + values[v].name + "'");
  return Status::ok();
}

StatusOr<Tensor> Built::allocate_at(const Tensor& like, const Location& at, RunStreams& rs) {
  KEEL_ASSIGN_OR_RETURN(CachingAllocator * alloc, env->allocator(at.device_type, at.device_index), "");
  const uint64_t bytes = like.byte_size();
  const auto key = reinterpret_cast<CachingAllocator::StreamKey>(rs.get(device_at(at), at.device_index, false));
  KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes, key), "");
  return Tensor(like.dtype(), like.shape(),
                std::make_shared<Storage>(p, bytes, at, [alloc](void* q) { alloc->free(q); }));
}

Status Built::copy_into(const Tensor& src, const Tensor& dst, RunStreams& rs, CopyCounters* copies) {
  const uint64_t bytes = src.byte_size();
  if (bytes != dst.byte_size()) {
    return internal_error("copy of " + src.describe() + " into " + dst.describe() + ": the sizes differ");
  }
  const Location& from = src.location();
  const Location& to = dst.location();
  if (bytes == 0) return Status::ok();
  auto count = [&](std::atomic<uint64_t> CopyCounters::*which) {
    if (copies == nullptr) return;
    (copies->*which).fetch_add(1, std::memory_order_relaxed);
    copies->bytes.fetch_add(bytes, std::memory_order_relaxed);
  };
  const std::string what =
      "copy " + std::to_string(bytes) + " bytes from " + from.to_string() + " to " + to.to_string();
  if (from.is_host() && to.is_host()) {
    std::memcpy(dst.raw_data(), src.raw_data(), bytes);
    count(&CopyCounters::h2h);
    return Status::ok();
  }
  const DeviceEntry* src_dev = device_at(from);
  const DeviceEntry* dst_dev = device_at(to);
  if ((!from.is_host() && src_dev == nullptr) || (!to.is_host() && dst_dev == nullptr)) {
    return not_found(what + ": no such device type");
  }
  if (from.is_host()) {  // the copy has read the host source when it returns (plugin.h, the stream contract)
    hal::Device d(dst_dev, to.device_index);
    count(&CopyCounters::h2d);
    return d
        .copy(KEEL_COPY_HOST_TO_DEVICE, dst.raw_data(), to.device_index, src.raw_data(), 0, bytes,
              rs.get(dst_dev, to.device_index))
        .with_context(what);
  }
  if (to.is_host()) {  // a result leaves the device: the host waits for it
    hal::Device d(src_dev, from.device_index);
    count(&CopyCounters::d2h);
    KEEL_RETURN_IF_ERROR(d.copy(KEEL_COPY_DEVICE_TO_HOST, dst.raw_data(), 0, src.raw_data(), from.device_index, bytes,
                                rs.get(src_dev, from.device_index)),
                         what);
    return rs.synchronize(src_dev, from.device_index).with_context(what);
  }
  hal::Device sd(src_dev, from.device_index);
  if (src_dev == dst_dev) {
    bool peer = from.device_index == to.device_index;
    if (!peer) {
      auto props = sd.properties();
      peer = props.is_ok() && (props.value().capabilities & KEEL_DEVICE_CAP_PEER_COPY) != 0;
    }
    if (peer) {
      count(&CopyCounters::d2d);
      keel_stream_t s = rs.get(src_dev, from.device_index);
      keel_stream_t ds = from.device_index == to.device_index ? nullptr : rs.get(dst_dev, to.device_index, false);
      const hal::Device dd(dst_dev, to.device_index);
      // The destination block comes from the pool of the destination's stream, whose queued work may still read what
      // the block held before: the copy, queued on the source's stream, waits for that stream first (an event; the
      // host waits where there is none). Without it a kernel queued on the other card could read bytes the copy had
      // already overwritten.
      if (ds != nullptr) {
        auto before = dd.create_event();
        if (before.is_ok() && sd.can_wait_on_events()) {
          KEEL_RETURN_IF_ERROR(dd.record_event(before.value(), ds), what);
          KEEL_RETURN_IF_ERROR(sd.wait_event(s, before.value()), what);
        } else {
          KEEL_RETURN_IF_ERROR(rs.synchronize(dst_dev, to.device_index), what);
        }
      }
      KEEL_RETURN_IF_ERROR(sd.copy(KEEL_COPY_DEVICE_TO_DEVICE, dst.raw_data(), to.device_index, src.raw_data(),
                                   from.device_index, bytes, s),
                           what);
      if (from.device_index == to.device_index) return Status::ok();
      // Another device's stream reads it next: order it after the copy (an event; the host waits where there is none).
      auto ev = sd.create_event();
      if (ev.is_ok() && ds != nullptr && dd.can_wait_on_events()) {
        KEEL_RETURN_IF_ERROR(sd.record_event(ev.value(), s), what);
        return dd.wait_event(ds, ev.value()).with_context(what);
      }
      return rs.synchronize(src_dev, from.device_index).with_context(what);
    }
  }
  // Between device types, or devices without peer copies: staged through host memory.
  count(&CopyCounters::d2h);
  count(&CopyCounters::h2d);
  std::unique_ptr<char[]> staging(new (std::nothrow) char[bytes]);
  if (!staging) return out_of_memory(what + ": no host staging buffer");
  KEEL_RETURN_IF_ERROR(sd.copy(KEEL_COPY_DEVICE_TO_HOST, staging.get(), 0, src.raw_data(), from.device_index, bytes,
                               rs.get(src_dev, from.device_index)),
                       what);
  KEEL_RETURN_IF_ERROR(rs.synchronize(src_dev, from.device_index), what);
  hal::Device dd(dst_dev, to.device_index);
  return dd
      .copy(KEEL_COPY_HOST_TO_DEVICE, dst.raw_data(), to.device_index, staging.get(), 0, bytes,
            rs.get(dst_dev, to.device_index))
      .with_context(what);
}

Status Built::run(const std::vector<std::pair<std::string, RunValue>>& inputs, std::vector<RunValue>& outputs,
                  const RunOptions& run_options, ThreadPool* run_pool, bool profile, RunIo& io) {
  std::vector<RunValue> live;
  std::string signature;
  KEEL_RETURN_IF_ERROR(bind_inputs(inputs, live, signature), "");
  for (size_t v = 0; v < values.size(); ++v)
    if (values[v].is_const) live[v] = values[v].constant;

  // Activation memory: an arena set of this run's own from the plan of this signature, or (a new signature) every
  // value from the pool while the sizes are recorded for the plan the end of the run makes. The run's streams (its
  // slot) come with the arena set, or from the build's free slots.
  std::shared_ptr<Plan> plan_now;
  {
    std::lock_guard<std::mutex> lock(plan_mu);
    plan_now = plan;
  }
  const bool known = plan_now && plan_now->signature == signature && !signature.empty();
  Plan::ArenaSet set;
  if (known) set = plan_now->acquire();
  const bool planned = known && set.streams != nullptr && set.arenas.size() == plan_now->keys.size();
  std::unique_ptr<RunStreams> own_slot;
  if (!planned) own_slot = take_slot();
  RunStreams& rs = planned ? *set.streams : *own_slot;
  const std::vector<void*>& arenas = set.arenas;
  struct GiveBack {
    Built* built;
    Plan* plan;
    Plan::ArenaSet& set;
    std::unique_ptr<RunStreams>& slot;
    bool planned;
    ~GiveBack() {
      if (planned) plan->give_back(std::move(set));
      if (slot) built->give_slot(std::move(slot));
    }
  } give_back{this, plan_now.get(), set, own_slot, planned};
  const bool record = !known;
  std::unordered_map<int, uint64_t> observed_sizes;
  // The tensors the previous run of this slot held for its work in flight, then this run's inputs' producers.
  KEEL_RETURN_IF_ERROR(rs.release_held(), "");
  for (const auto& f : io.fences)
    if (f) KEEL_RETURN_IF_ERROR(rs.order_after(*f), "");

  // Memory bound for graph outputs (run_bound with buffers): the kernel producing such an output writes into it.
  std::unordered_map<int, const Tensor*> bound_buffer;
  if (io.bound != nullptr) {
    for (const auto& b : *io.bound) {
      if (!b.buffer.defined()) continue;
      auto it = value_index.find(b.name);
      if (it != value_index.end()) bound_buffer[it->second] = &b.buffer;
    }
  }

  const auto deadline = run_options.deadline;
  const bool has_deadline = deadline != std::chrono::steady_clock::time_point::max();
  auto stop_reason = [&](const Step& s, size_t si) -> Status {
    const std::string where = "before node '" + s.name + "' (" + s.op_type + ", step " + std::to_string(si + 1) +
                              " of " + std::to_string(steps.size()) + ")";
    if (run_options.terminate != nullptr && run_options.terminate->load(std::memory_order_relaxed)) {
      return Status(StatusCode::kCancelled, "cancelled " + where);
    }
    if (has_deadline && std::chrono::steady_clock::now() >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, "deadline passed " + where);
    }
    return Status::ok();
  };

  // A tensor bound as an input in memory other than where a step reads it (a device tensor read by a host kernel, a
  // host tensor read by a device kernel without a copy step): moved there once per run and memory.
  std::map<std::pair<int, std::string>, Tensor> moved;
  auto tensor_at = [&](int v, const Location& at, const std::string& who) -> StatusOr<const Tensor*> {
    const Tensor& t = live[v].tensor;
    if (t.location() == at) return &t;
    auto key = std::make_pair(v, at.to_string());
    auto it = moved.find(key);
    if (it == moved.end()) {
      KEEL_ASSIGN_OR_RETURN(Tensor dst, allocate_at(t, at, rs), who);
      KEEL_RETURN_IF_ERROR(copy_into(t, dst, rs, io.copies), who);
      it = moved.emplace(key, std::move(dst)).first;
    }
    return &it->second;
  };

  keel_kernel_context_t ctx;
  ctx.pool = run_pool;
  Step* profiled = nullptr;  // the step whose kernel is computing (its reported steps land there)
  if (profile) {
    ctx.profiling = true;
    ctx.report_step = [this, &profiled](const keel_profile_step_t& r) {
      if (profiled == nullptr) return;
      std::lock_guard<std::mutex> lock(stats_mu);
      record_reported_step(*profiled, &r);
    };
  }
  std::vector<std::pair<CachingAllocator*, void*>> workspace;
  for (size_t si = 0; si < steps.size(); ++si) {
    Step& s = steps[si];
    KEEL_RETURN_IF_ERROR(stop_reason(s, si), "");
    profiled = &s;
    auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const std::string& dev_type = s.memory_type;
    CachingAllocator* alloc = s.allocator;
    const Location here{dev_type, s.memory_index};
    // The step's stream: its device's stream of this run (NULL on the host and on host-memory devices).
    const DeviceEntry* stream_dev = dev_type == "cpu" ? nullptr : s.device;
    const auto stream_key = reinterpret_cast<CachingAllocator::StreamKey>(rs.get(stream_dev, s.memory_index, false));
    if (s.kind == Step::Kind::kCopy) {
      const Tensor& src = live[s.inputs[0]].tensor;
      if (src.location() == here) {
        live[s.outputs[0]] = src;  // already there (an input bound in this memory): no copy
      } else {
        KEEL_ASSIGN_OR_RETURN(void* dst, alloc->allocate(src.byte_size(), stream_key), "copy " + s.name);
        auto storage = std::make_shared<Storage>(dst, src.byte_size(), here, [alloc](void* p) { alloc->free(p); });
        Tensor out(src.dtype(), src.shape(), storage);
        // Ordered on the run's streams: host -> device on the device's, device -> host on the device's and then
        // waited for (a host step reads it next), between devices of one type a peer copy where the table has one,
        // else staged through the host.
        KEEL_RETURN_IF_ERROR(copy_into(src, out, rs, io.copies), "copy " + s.name);
        live[s.outputs[0]] = std::move(out);
      }
    } else if (s.kind == Step::Kind::kNative) {
      for (int v : s.inputs) {
        if (v < 0 || !live[v].is_tensor() || live[v].tensor.location().is_host()) continue;
        KEEL_ASSIGN_OR_RETURN(const Tensor* t, tensor_at(v, Location{}, "node '" + s.name + "'"), "");
        live[v] = *t;
      }
      std::lock_guard<std::mutex> lock(*s.mu);  // a NativeOp runs for one run at a time
      KEEL_RETURN_IF_ERROR(run_native_step(*s.native, s.inputs, s.outputs, live),
                           "node '" + s.name + "' (" + s.op_type + ")");
    } else {
      // Bind inputs.
      ctx.phase = keel_kernel_context_t::Phase::kCompute;
      ctx.node = s.node;
      ctx.opset = s.opset;
      ctx.device_index = s.device_index;
      ctx.stream = rs.get(stream_dev, s.memory_index);
      ctx.input_views.assign(s.inputs.size(), keel_tensor_t{});
      ctx.inputs.assign(s.inputs.size(), nullptr);
      for (size_t i = 0; i < s.inputs.size(); ++i) {
        int v = s.inputs[i];
        if (v < 0) continue;
        if (!live[v].defined()) {
          return internal_error("step '" + s.name + "' reads '" + values[v].name + "', which was never produced");
        }
        if (!live[v].is_tensor()) {
          return invalid_argument("node '" + s.name + "' (" + s.op_type + ") reads '" + values[v].name +
                                  "', which is " + live[v].describe() + ", not a tensor");
        }
        const Tensor* t = &live[v].tensor;
        if (t->location() != here && values[v].is_input) {
          KEEL_ASSIGN_OR_RETURN(t, tensor_at(v, here, "input '" + values[v].name + "' of node '" + s.name + "'"), "");
        }
        ctx.input_views[i] = t->c_view();
        ctx.inputs[i] = &ctx.input_views[i];
      }
      ctx.output_dtypes = s.output_dtypes;
      ctx.outputs.assign(s.outputs.size(), Tensor());
      ctx.output_views.assign(s.outputs.size(), keel_tensor_t{});
      ctx.attr_tensor_views.clear();
      ctx.attr_string_lists.clear();
      ctx.allocate_output = [&](int32_t i, DType dtype, const Shape& shape) -> StatusOr<Tensor> {
        if (dtype == DType::kUndefined) {
          return invalid_argument("output " + std::to_string(i) + " of '" + s.name + "' has no known dtype");
        }
        KEEL_ASSIGN_OR_RETURN(uint64_t bytes, checked_byte_size(dtype, shape), "output of '" + s.name + "'");
        int v = s.outputs[i];
        if (v >= 0 && record) observed_sizes[v] = bytes;
        if (v >= 0 && !bound_buffer.empty()) {
          // A graph output bound to memory of this step's device, of this dtype and shape: written in place.
          auto b = bound_buffer.find(v);
          if (b != bound_buffer.end() && b->second->location() == here && b->second->dtype() == dtype &&
              b->second->shape() == shape) {
            return *b->second;
          }
        }
        if (v >= 0 && planned) {
          const int key = plan_now->key_of[v];
          if (key >= 0 && plan_now->size[v] >= bytes) {
            char* base = static_cast<char*>(arenas[key]) + plan_now->offset[v];
            return Tensor(dtype, shape, Storage::borrow(base, bytes, here));
          }
        }
        KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes, stream_key), "output of '" + s.name + "'");
        return Tensor(dtype, shape, std::make_shared<Storage>(p, bytes, here, [alloc](void* q) { alloc->free(q); }));
      };
      uint64_t step_workspace = 0;
      ctx.allocate_workspace = [&](uint64_t bytes) -> StatusOr<void*> {
        // Keyed by the step's stream: the block goes back to the pool when compute returns, and is handed out again
        // only for work on that stream, which runs after the work that may still be using it.
        KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes, stream_key), "workspace of '" + s.name + "'");
        workspace.emplace_back(alloc, p);
        step_workspace += bytes;
        return p;
      };
      KernelSlot* k = s.kernel.load();
      if (k == nullptr) return internal_error("step '" + s.name + "' has no kernel");
      auto compute = [&](KernelSlot* slot) {
        if (slot->reentrant) return Status::from_c(slot->compute(slot->state, &ctx));
        std::lock_guard<std::mutex> lock(slot->mu);  // serialised alone: other steps of other runs go on
        return Status::from_c(slot->compute(slot->state, &ctx));
      };
      Status st = compute(k);
      while (st.code() == StatusCode::kUnimplemented && s.node) {
        for (auto& [a, p] : workspace) a->free(p);
        workspace.clear();
        step_workspace = 0;
        auto next = switch_to_alternative(s, k, st);
        if (!next.is_ok()) {
          st = next.status();
          break;
        }
        k = next.value();
        ctx.node = s.node;
        ctx.phase = keel_kernel_context_t::Phase::kCompute;
        ctx.outputs.assign(s.outputs.size(), Tensor());
        ctx.output_views.assign(s.outputs.size(), keel_tensor_t{});
        st = compute(k);
      }
      for (auto& [a, p] : workspace) a->free(p);
      workspace.clear();
      if (step_workspace > 0) {
        std::string key = s.memory_type + ":" + std::to_string(s.memory_index);
        std::lock_guard<std::mutex> lock(stats_mu);
        workspace_peak[key] = std::max(workspace_peak[key], step_workspace);
      }
      if (!st.is_ok()) {
        return st.with_context("node '" + s.name + "' (" + s.op_type + ", kernel " + k->name + ")");
      }
      for (size_t i = 0; i < s.outputs.size(); ++i) {
        int v = s.outputs[i];
        if (v < 0) continue;
        if (!ctx.outputs[i].defined()) {
          // Optional outputs nobody reads may be left unwritten.
          bool read = values[v].is_output;
          for (size_t sj = si + 1; sj < steps.size() && !read; ++sj)
            for (int x : steps[sj].inputs) read = read || x == v;
          if (read)
            return internal_error("kernel " + k->name + " did not write output " + std::to_string(i) + " of '" +
                                  s.name + "'");
          continue;
        }
        live[v] = std::move(ctx.outputs[i]);
      }
    }
    for (int v : s.free_after) live[v] = RunValue();
    if (profile) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard<std::mutex> lock(stats_mu);
      s.total_ms += ms;
      ++s.calls;
    }
  }
  // Outputs. Every output (run_values) comes back as a host value; a bound output goes into its buffer or is left in
  // the memory it was bound to. The host waits only for results copied to host memory (copy_into).
  outputs.clear();
  if (io.bound == nullptr) {
    for (int v : output_values) {
      if (!live[v].is_tensor() || live[v].tensor.location().is_host()) {
        outputs.push_back(live[v]);
        continue;
      }
      const Tensor& t = live[v].tensor;
      KEEL_ASSIGN_OR_RETURN(Tensor host, Tensor::host(t.dtype(), t.shape()), "output '" + values[v].name + "'");
      KEEL_RETURN_IF_ERROR(copy_into(t, host, rs, io.copies), "copy output '" + values[v].name + "' to host");
      outputs.push_back(std::move(host));
    }
  } else {
    io.results->assign(io.bound->size(), DeviceTensor{});
    for (size_t i = 0; i < io.bound->size(); ++i) {
      const BoundOutput& b = (*io.bound)[i];
      const int v = value_index.at(b.name);
      if (!live[v].is_tensor()) {
        return invalid_argument("output '" + b.name + "' is " + live[v].describe() +
                                ", not a tensor: only tensor outputs can be bound");
      }
      const Tensor& t = live[v].tensor;
      if (b.buffer.defined()) {
        if (b.buffer.dtype() != t.dtype() || b.buffer.shape() != t.shape()) {
          return invalid_argument("output '" + b.name + "' is " + dtype_name(t.dtype()) + shape_to_string(t.shape()) +
                                  ", but the memory bound to it is for " + dtype_name(b.buffer.dtype()) +
                                  shape_to_string(b.buffer.shape()));
        }
        if (t.raw_data() != b.buffer.raw_data() || t.location() != b.buffer.location()) {
          KEEL_RETURN_IF_ERROR(copy_into(t, b.buffer, rs, io.copies), "output '" + b.name + "' into its bound memory");
        }
        (*io.results)[i].tensor = b.buffer;
      } else if (t.location() == io.bound_at[i]) {
        (*io.results)[i].tensor = t;
      } else {
        KEEL_ASSIGN_OR_RETURN(Tensor dst, allocate_at(t, io.bound_at[i], rs), "output '" + b.name + "'");
        KEEL_RETURN_IF_ERROR(copy_into(t, dst, rs, io.copies),
                             "output '" + b.name + "' to " + io.bound_at[i].to_string());
        (*io.results)[i].tensor = std::move(dst);
      }
    }
  }
  // Work still in flight on the run's streams (outputs left on a device): a fence for the outputs there, and the
  // device inputs it may still read are held by the slot until that fence has passed.
  KEEL_ASSIGN_OR_RETURN(std::shared_ptr<RunFence> fence, rs.fence(), "");
  if (!fence->empty()) {
    if (io.results != nullptr)
      for (auto& r : *io.results)
        if (!r.tensor.location().is_host()) r.ready = fence;
    std::vector<Tensor> device_inputs;
    for (int v : input_values)
      if (live[v].is_tensor() && !live[v].tensor.location().is_host()) device_inputs.push_back(live[v].tensor);
    for (auto& [key, t] : moved)
      if (!t.location().is_host()) device_inputs.push_back(t);
    rs.hold(std::move(device_inputs), fence);
  }
  live.clear();
  if (record) {
    auto fresh = make_plan(signature, observed_sizes);
    std::lock_guard<std::mutex> lock(plan_mu);
    // A concurrent run of the same new signature may have planned first: keep one plan per signature.
    if (!plan || plan->signature != signature) plan = std::move(fresh);
  }
  return Status::ok();
}

namespace {

// Whether a graph input's declared type leaves its shape open (unknown rank, or some dim not fixed): what a shape
// variant fixes. Non-tensor inputs (sequences, optionals) are never specialised.
bool is_dynamic_input(const Graph& g, const std::string& name) {
  const ValueInfo* vi = g.info(name);
  if (vi == nullptr) return true;
  if (!vi->is_tensor()) return false;
  if (!vi->shape) return true;
  for (int64_t d : *vi->shape)
    if (d < 0) return true;
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<Built>> Session::Impl::build_variant(const std::string& key,
                                                              const std::map<std::string, const Tensor*>& dynamic) {
  const auto t0 = std::chrono::steady_clock::now();
  auto b = make_built();
  b->variant = key;
  b->graph = base;
  for (const auto& [name, t] : dynamic) {
    ValueInfo& vi = b->graph.value_info[name];
    vi.dtype = t->dtype();
    vi.shape = t->shape();
  }
  // Every dim that follows from the inputs' is fixed now (data propagation included: Shape -> Reshape targets).
  KEEL_RETURN_IF_ERROR(infer_shapes(b->graph), "shape inference");
  KEEL_RETURN_IF_ERROR(b->build(device_order), "");
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  log::debug("session '{}': built shape variant {} of {} for {} in {:.1f} ms ({} steps)", base.name,
             variants.size() + 1, options.shape_variants, key, ms, b->steps.size());
  return b;
}

// Called under variants_mu.
StatusOr<Built*> Session::Impl::pick(const std::vector<std::pair<std::string, RunValue>>& inputs) {
  if (dynamic_inputs.empty() || options.shape_variants <= 0) return generic.get();
  // The key: the shapes of the dynamic inputs (later bindings of one name win, as in bind_inputs).
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, value] : inputs)
    if (value.is_tensor()) given[name] = &value.tensor;
  std::map<std::string, const Tensor*> dynamic;
  std::string key;
  for (const auto& name : dynamic_inputs) {
    auto it = given.find(name);
    if (it == given.end()) return generic.get();  // missing, or not a tensor: the generic build names the problem
    dynamic.emplace(name, it->second);
    key += (key.empty() ? "" : ", ") + name + shape_to_string(it->second->shape());
  }
  if (auto it = variants.find(key); it != variants.end()) return it->second ? it->second.get() : generic.get();
  // Nothing is built for inputs the generic graph refuses (unknown names, dtypes, ranks, fixed dims).
  {
    std::vector<RunValue> live;
    std::string signature;
    KEEL_RETURN_IF_ERROR(generic->bind_inputs(inputs, live, signature), "");
  }
  if (variants.size() >= static_cast<size_t>(options.shape_variants)) {
    if (!cap_logged) {
      cap_logged = true;
      log::info(
          "session '{}': {} shape variant(s) built, the cap (SessionOptions::shape_variants); further "
          "input shapes (first: {}) run on the generic build",
          base.name, variants.size(), key);
    }
    return generic.get();
  }
  auto built = build_variant(key, dynamic);
  // A variant is an optimisation: when it cannot be built (a device or claimer refuses these shapes), the run goes
  // on with the generic build, which runs any shape the graph allows or names what is wrong. The failure takes a
  // slot (nullptr), so these shapes are not tried again and failures count against the cap like variants.
  if (!built.is_ok()) {
    log::warn(
        "session '{}': the shape variant for input shapes {} could not be built ({}); runs with these "
        "shapes use the generic build",
        base.name, key, built.status().to_string());
    variants.emplace(key, nullptr);
    return generic.get();
  }
  Built* b = built.value().get();
  variants.emplace(key, std::move(built).value());
  return b;
}

namespace {

// A digest of a model as given to Session::create (structure, attributes' presence, and every initializer's bytes):
// what share_weights_with compares, so that a session shares the build only of the same model.
uint64_t model_fingerprint(const Graph& g) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  };
  auto mix_str = [&](const std::string& s) { mix(std::hash<std::string>{}(s)); };
  mix_str(g.name);
  // Inputs and outputs with their declared types (a build is specialised to them).
  auto mix_value = [&](const std::string& v) {
    mix_str(v);
    if (const ValueInfo* vi = g.info(v)) {
      mix(static_cast<uint64_t>(vi->dtype) + 1);
      if (vi->shape)
        for (int64_t d : *vi->shape) mix(static_cast<uint64_t>(d));
    }
  };
  for (const auto& i : g.inputs) mix_value(i);
  for (const auto& o : g.outputs) mix_value(o);
  for (const auto& [d, v] : g.opsets) mix_str(d), mix(static_cast<uint64_t>(v));
  auto order = g.topological_order();
  if (order.is_ok())
    for (NodeId id : order.value()) {
      const Node* n = g.node(id);
      mix_str(n->domain + "." + n->op_type + "/" + n->name);
      for (const auto& i : n->inputs) mix_str(i);
      for (const auto& o : n->outputs) mix_str(o);
      for (const auto& [an, a] : n->attrs) {
        mix_str(an);
        mix(static_cast<uint64_t>(a.kind));
        mix(static_cast<uint64_t>(a.i));
        uint32_t fb;
        std::memcpy(&fb, &a.f, 4);
        mix(fb);
        mix_str(a.s);
        for (int64_t v : a.ints) mix(static_cast<uint64_t>(v));
        for (float v : a.floats) std::memcpy(&fb, &v, 4), mix(fb);
        for (const auto& v : a.strings) mix_str(v);
        if (a.g) mix(model_fingerprint(*a.g));
        if (a.t.defined()) mix(a.t.byte_size());
      }
    }
  for (const auto& [name, t] : g.initializers) {
    mix_str(name);
    mix(static_cast<uint64_t>(t.dtype()));
    for (int64_t d : t.shape()) mix(static_cast<uint64_t>(d));
    if (!t.location().is_host() || t.raw_data() == nullptr) continue;
    // Eight bytes at a time (a 45 MB model takes a few milliseconds).
    const auto* p = static_cast<const unsigned char*>(t.raw_data());
    const uint64_t n = t.byte_size();
    uint64_t acc = n, i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      acc = (acc ^ w) * 0x100000001b3ull;
    }
    for (; i < n; ++i) acc = (acc ^ p[i]) * 0x100000001b3ull;
    mix(acc);
  }
  return h;
}

}  // namespace

Session::Session(std::shared_ptr<Impl> impl, std::unique_ptr<Local> local)
    : impl_(std::move(impl)), local_(std::move(local)) {}
Session::~Session() = default;

StatusOr<std::unique_ptr<Session>> Session::create(Environment& env, Graph graph, SessionOptions options) {
  if (options.threads < 0) return invalid_argument("session threads must be >= 0");
  if (options.shape_variants < 0) return invalid_argument("session shape_variants must be >= 0");
  auto local = std::make_unique<Local>();
  local->options = options;
  local->options.share_weights_with = nullptr;
  if (options.threads > 0 && options.threads != env.thread_pool().thread_count()) {
    local->own_pool = std::make_unique<ThreadPool>(options.threads);
    local->pool = local->own_pool.get();
  } else {
    local->pool = &env.thread_pool();
  }
  if (const Session* other = options.share_weights_with) {
    // Share the other session's build: the same model, and the same options where they shape the build.
    const Impl& o = *other->impl_;
    const std::string who = "share_weights_with (session of '" + o.generic->graph.name + "')";
    if (o.env != &env) return invalid_argument(who + ": that session belongs to another environment");
    KEEL_RETURN_IF_ERROR(graph.validate(), "invalid graph '" + graph.name + "'");
    if (model_fingerprint(graph) != o.fingerprint) {
      return invalid_argument(who + ": that session was created from another model (structure or weights differ)");
    }
    auto differs = [&](const char* what) {
      return invalid_argument(who + ": its " + what + " differ from these options'");
    };
    if (options.devices != o.options.devices) return differs("devices");
    if (options.fallback != o.options.fallback) return differs("fallback");
    if (options.passes != o.options.passes) return differs("passes");
    if (options.claims != o.options.claims) return differs("claims");
    if (options.shape_variants != o.options.shape_variants) return differs("shape_variants");
    return std::unique_ptr<Session>(new Session(other->impl_, std::move(local)));
  }
  auto impl = std::make_shared<Impl>();
  impl->env = &env;
  impl->options = options;
  impl->options.share_weights_with = nullptr;
  KEEL_RETURN_IF_ERROR(graph.validate(), "invalid graph '" + graph.name + "'");
  impl->fingerprint = model_fingerprint(graph);
  KEEL_RETURN_IF_ERROR(infer_shapes(graph), "shape inference");
  // Device order: the requested ones ("cuda:1", "cpu"; one index per type), then (fallback = cpu) the CPU.
  std::vector<std::string> order;
  if (options.devices.empty()) {
    order = env.registry().device_types();
  } else {
    for (const auto& d : options.devices) {
      KEEL_ASSIGN_OR_RETURN(DeviceSpec spec, env.device(d), "session");
      auto [it, fresh] = impl->device_index.emplace(spec.type, spec.index);
      if (!fresh && it->second != spec.index) {
        return invalid_argument("session: devices '" + spec.type + ":" + std::to_string(it->second) + "' and '" +
                                spec.to_string() + "' are both requested; a session uses one device of each type");
      }
      if (fresh) order.push_back(spec.type);
    }
  }
  if (options.fallback == Fallback::kCpu && std::find(order.begin(), order.end(), "cpu") == order.end()) {
    order.push_back("cpu");
  }
  if (!options.passes.empty()) {
    KEEL_ASSIGN_OR_RETURN(auto pipeline, parse_pipeline_list([&] {
                            std::string s;
                            for (const auto& p : options.passes) s += (s.empty() ? "" : ",") + p;
                            return s;
                          }()),
                          "passes");
    keel_graph_s view;
    view.graph = &graph;
    view.env = &env;
    PassManager pm(env.registry(), graph_api());
    KEEL_ASSIGN_OR_RETURN(auto reports, pm.run(graph, &view, pipeline, order.front()), "passes");
    for (const auto& r : reports) log::info("pass {}: {} -> {} nodes", r.pass, r.nodes_before, r.nodes_after);
    KEEL_RETURN_IF_ERROR(infer_shapes(graph), "shape inference after passes");
  }
  impl->device_order = order;
  for (const auto& in : graph.inputs)
    if (is_dynamic_input(graph, in)) impl->dynamic_inputs.push_back(in);
  if (!impl->dynamic_inputs.empty() && options.shape_variants > 0) impl->base = graph;
  impl->generic = impl->make_built();
  impl->generic->graph = std::move(graph);
  KEEL_RETURN_IF_ERROR(impl->generic->build(order), "");
  return std::unique_ptr<Session>(new Session(std::move(impl), std::move(local)));
}

StatusOr<std::vector<Tensor>> Session::run(const std::vector<std::pair<std::string, Tensor>>& inputs,
                                           const RunOptions& run_options) {
  std::vector<std::pair<std::string, RunValue>> values(inputs.begin(), inputs.end());
  KEEL_ASSIGN_OR_RETURN(std::vector<RunValue> outputs, run_values(values, run_options), "");
  std::vector<Tensor> tensors;
  tensors.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].is_tensor() && outputs[i].defined()) {
      return invalid_argument("run: output '" + impl_->generic->output_names[i] + "' is " + outputs[i].describe() +
                              ", not a tensor (use run_values)");
    }
    tensors.push_back(std::move(outputs[i].tensor));
  }
  return tensors;
}

StatusOr<std::vector<RunValue>> Session::run_values(const std::vector<std::pair<std::string, RunValue>>& inputs,
                                                    const RunOptions& run_options) {
  const std::string what = run_options.tag.empty() ? std::string("run") : "run '" + run_options.tag + "'";
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<RunValue> outputs;
  Built* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->variants_mu);
    KEEL_ASSIGN_OR_RETURN(b, impl_->pick(inputs), what);
  }
  local_->current.store(b, std::memory_order_release);
  RunIo io;
  io.copies = &local_->copies;
  Status st = b->run(inputs, outputs, run_options, local_->pool, local_->options.profile, io);
  if (!run_options.tag.empty()) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (st.is_ok()) log::debug("session '{}': {} finished in {:.3f} ms", impl_->generic->graph.name, what, ms);
    else
      log::debug("session '{}': {} failed after {:.3f} ms: {}", impl_->generic->graph.name, what, ms, st.to_string());
  }
  KEEL_RETURN_IF_ERROR(st, what);
  return outputs;
}

Status RunFence::wait() const {
  for (const auto& m : marks_) KEEL_RETURN_IF_ERROR(m.event.synchronize(), "wait for a run's device work");
  return Status::ok();
}

StatusOr<std::vector<DeviceTensor>> Session::run_bound(const std::vector<BoundInput>& inputs,
                                                       const std::vector<BoundOutput>& outputs,
                                                       const RunOptions& run_options) {
  const std::string what = run_options.tag.empty() ? std::string("run") : "run '" + run_options.tag + "'";
  const auto t0 = std::chrono::steady_clock::now();
  const Built& g = *impl_->generic;
  RunIo io;
  io.copies = &local_->copies;
  std::vector<std::pair<std::string, RunValue>> feeds;
  feeds.reserve(inputs.size());
  for (const auto& in : inputs) {
    if (!in.value.tensor.defined()) return invalid_argument(what + ": input '" + in.name + "' is bound to no tensor");
    feeds.emplace_back(in.name, in.value.tensor);
    if (in.value.ready && !in.value.ready->empty()) io.fences.push_back(in.value.ready);
  }
  // The outputs: known names, each once; where those without a buffer go.
  std::set<std::string> seen;
  for (const auto& o : outputs) {
    if (std::find(g.output_names.begin(), g.output_names.end(), o.name) == g.output_names.end()) {
      std::string known;
      for (const auto& n : g.output_names) known += (known.empty() ? "" : ", ") + n;
      return invalid_argument(what + ": unknown output '" + o.name + "' (outputs: " + known + ")");
    }
    if (!seen.insert(o.name).second) return invalid_argument(what + ": output '" + o.name + "' is bound twice");
    Location at;
    if (o.buffer.defined()) {
      const ValueInfo* vi = g.graph.info(o.name);
      if (vi != nullptr && vi->dtype != DType::kUndefined && vi->dtype != o.buffer.dtype()) {
        return invalid_argument(what + ": output '" + o.name + "' is " + dtype_name(vi->dtype) +
                                ", but the memory bound to it is for " + dtype_name(o.buffer.dtype()));
      }
      if (vi != nullptr && vi->shape) {
        const Shape& want = *vi->shape;
        bool ok = want.size() == o.buffer.shape().size();
        for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || want[i] == o.buffer.shape()[i];
        if (!ok) {
          return invalid_argument(what + ": output '" + o.name + "' has shape " + shape_to_string(want) +
                                  ", but the memory bound to it is for " + shape_to_string(o.buffer.shape()));
        }
      }
      if (o.buffer.raw_data() == nullptr && o.buffer.byte_size() > 0) {
        return invalid_argument(what + ": the memory bound to output '" + o.name + "' has no data");
      }
    } else {
      KEEL_ASSIGN_OR_RETURN(DeviceSpec spec, impl_->env->device(o.device.empty() ? "cpu" : o.device),
                            what + ": output '" + o.name + "'");
      const DeviceEntry* d = impl_->env->registry().device(spec.type);
      if (d != nullptr && !hal::Device(d, spec.index).host_memory()) at = Location{spec.type, spec.index};
    }
    io.bound_at.push_back(at);
  }
  std::vector<DeviceTensor> results;
  io.bound = &outputs;
  io.results = &results;
  Built* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(impl_->variants_mu);
    KEEL_ASSIGN_OR_RETURN(b, impl_->pick(feeds), what);
  }
  local_->current.store(b, std::memory_order_release);
  std::vector<RunValue> unused;
  Status st = b->run(feeds, unused, run_options, local_->pool, local_->options.profile, io);
  if (!run_options.tag.empty()) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (st.is_ok()) log::debug("session '{}': {} (bound) finished in {:.3f} ms", g.graph.name, what, ms);
    else log::debug("session '{}': {} (bound) failed after {:.3f} ms: {}", g.graph.name, what, ms, st.to_string());
  }
  KEEL_RETURN_IF_ERROR(st, what);
  return results;
}

SessionCopyStats Session::copy_stats() const {
  SessionCopyStats out;
  const CopyCounters& c = local_->copies;
  out.host_to_device = c.h2d.load(std::memory_order_relaxed);
  out.device_to_host = c.d2h.load(std::memory_order_relaxed);
  out.device_to_device = c.d2d.load(std::memory_order_relaxed);
  out.host_to_host = c.h2h.load(std::memory_order_relaxed);
  out.bytes = c.bytes.load(std::memory_order_relaxed);
  return out;
}

const Graph& Session::graph() const { return impl_->generic->graph; }
const std::vector<std::string>& Session::input_names() const { return impl_->generic->input_names; }
const std::vector<std::string>& Session::output_names() const { return impl_->generic->output_names; }
const std::vector<FallbackReport>& Session::fallbacks() const { return impl_->generic->fallbacks; }

std::vector<std::tuple<std::string, std::string, std::string, std::string>> Session::placement(
    std::string* shape_variant) const {
  const Built* b = local_->last(*impl_);
  if (shape_variant != nullptr) *shape_variant = b->variant;
  std::vector<std::tuple<std::string, std::string, std::string, std::string>> out;
  for (const auto& s : b->steps) out.emplace_back(s.name, s.op_type, s.device_type, kernel_name_of(s));
  return out;
}

std::string Session::shape_variant() const { return local_->last(*impl_)->variant; }

size_t Session::shape_variant_count() const {
  std::lock_guard<std::mutex> lock(impl_->variants_mu);
  size_t n = 0;
  for (const auto& [key, b] : impl_->variants) n += b != nullptr;
  return n;
}

std::vector<NodeProfile> Session::profile() const {
  const Built* b = local_->last(*impl_);
  std::vector<NodeProfile> out;
  std::lock_guard<std::mutex> lock(b->stats_mu);
  for (const auto& s : b->steps)
    out.push_back({s.name, s.op_type, s.device_type, kernel_name_of(s), s.total_ms, s.calls, s.members, s.reported});
  return out;
}

void Session::reset_profile() {
  std::lock_guard<std::mutex> lock(impl_->variants_mu);
  impl_->generic->reset_profile();
  for (auto& [key, b] : impl_->variants)
    if (b) b->reset_profile();
}

SessionMemoryInfo Session::memory_info() const {
  SessionMemoryInfo info;
  info.build_id = reinterpret_cast<uint64_t>(impl_.get());
  info.sessions_sharing = static_cast<uint64_t>(impl_.use_count());
  std::vector<const Built*> builds{impl_->generic.get()};
  {
    std::lock_guard<std::mutex> lock(impl_->variants_mu);
    for (const auto& [key, b] : impl_->variants)
      if (b) builds.push_back(b.get());
  }
  std::set<const void*> seen;
  for (const Built* b : builds) {
    for (const auto& v : b->values) {
      if (!v.is_const || !v.constant.storage()) continue;
      if (seen.insert(v.constant.storage().get()).second) info.constant_bytes += v.constant.storage()->bytes();
    }
    std::lock_guard<std::mutex> lock(b->plan_mu);
    if (!b->plan) continue;
    uint64_t per_set = 0;
    for (uint64_t x : b->plan->bytes) per_set += x;
    std::lock_guard<std::mutex> plock(b->plan->mu);
    info.arena_sets += b->plan->sets;
    info.arena_bytes += per_set * b->plan->sets;
  }
  return info;
}

std::vector<OpTypeProfile> profile_by_op_type(const std::vector<NodeProfile>& profile) {
  std::map<std::string, OpTypeProfile> rows;
  std::map<std::string, std::set<std::string>> where;
  auto row = [&](const std::string& op) -> OpTypeProfile& {
    OpTypeProfile& r = rows[op];
    r.op_type = op;
    return r;
  };
  for (const auto& p : profile) {
    if (p.calls == 0) continue;
    const std::string at = p.device_type + ":" + p.kernel;
    const double per_run = p.total_ms / static_cast<double>(p.calls);
    if (p.steps.empty()) {
      OpTypeProfile& r = row(p.op_type);
      r.ms += per_run;
      r.nodes++;
      where[p.op_type].insert(at);
      continue;
    }
    // Op types of the nodes it covers (a kernel may name nodes outside `members`: a plain kernel names its own).
    std::map<std::string, std::string> op_of(p.members.begin(), p.members.end());
    if (p.members.empty()) op_of[p.node] = p.op_type;
    std::set<std::string> anchored, fused;
    double covered = 0;
    for (const auto& st : p.steps) {
      const double ms = st.total_ms / static_cast<double>(p.calls);
      covered += ms;
      const std::string op =
          st.op_type.empty() ? "(" + (st.kind.empty() ? std::string("kernel") : st.kind) + ")" : st.op_type;
      OpTypeProfile& r = row(op);
      r.ms += ms;
      where[op].insert(at);
      if (st.op_type.empty() || st.nodes.empty()) continue;
      anchored.insert(st.nodes[0]);
      for (size_t k = 1; k < st.nodes.size(); ++k)
        if (fused.insert(st.nodes[k]).second) {
          auto it = op_of.find(st.nodes[k]);
          r.fused_in[it != op_of.end() ? it->second : std::string("?")]++;
        }
    }
    if (per_run > covered) {
      const std::string op = "(" + (p.op_type == "Subgraph" ? std::string("subgraph") : p.op_type) + " overhead)";
      row(op).ms += per_run - covered;
      where[op].insert(at);
    }
    // Node counts: every node the step ran, under its own op type.
    for (const auto& [name, op] : op_of) {
      OpTypeProfile& r = row(op);
      r.nodes++;
      where[op].insert(at);
      if (anchored.count(name)) continue;
      if (fused.count(name)) r.fused++;
      else r.no_step++;
    }
  }
  std::vector<OpTypeProfile> out;
  for (auto& [op, r] : rows) {
    r.where.assign(where[op].begin(), where[op].end());
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.ms > b.ms; });
  return out;
}

std::map<std::string, uint64_t> Session::planned_arena_bytes() const {
  const Built* b = local_->last(*impl_);
  std::map<std::string, uint64_t> out;
  std::lock_guard<std::mutex> lock(b->plan_mu);
  if (b->plan)
    for (size_t k = 0; k < b->plan->keys.size(); ++k) out[b->plan->keys[k]] = b->plan->bytes[k];
  return out;
}
std::map<std::string, uint64_t> Session::workspace_bytes() const {
  const Built* b = local_->last(*impl_);
  std::lock_guard<std::mutex> lock(b->stats_mu);
  return b->workspace_peak;
}

}  // namespace keel
