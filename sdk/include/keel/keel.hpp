// keel/keel.hpp — a header-only C++17 wrapper over the C API (keel.h), for host applications.
//
// Each class owns one C handle (move-only, released in the destructor) and turns an error status into a
// keel::api::Error exception. Exceptions exist only here, on the caller's side: the library below is plain C and
// never throws. The classes live in keel::api, not keel::, because the runtime's own C++ classes (keel::Session,
// keel::Environment, ...) live in keel:: inside libkeel, and two different classes of one name in one program would
// break the one-definition rule.
//
// Thread-safety is that of the C API: Environment and Session may be shared between threads (Session::run may be
// called concurrently); options and tensors are thread-compatible.
#pragma once

#include <keel/keel.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace keel::api {

// An error from the C API: its keel_status_code_t and message.
class Error : public std::runtime_error {
 public:
  Error(int32_t code, const std::string& message)
      : std::runtime_error(std::string(keel_status_code_name(code)) + ": " + message), code_(code) {}
  int32_t code() const noexcept { return code_; }

 private:
  int32_t code_;
};

// Throws Error for a failed status (releasing it); nothing for OK.
inline void check(keel_status_t status) {
  if (status == nullptr) return;
  int32_t code = status->code;
  std::string message = status->message ? status->message : "";
  keel_status_release(status);
  throw Error(code, message);
}

namespace detail {
// A move-only owner of one C handle.
template <typename H, void (*Release)(H)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(H h) : h_(h) {}
  ~Handle() { reset(); }
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  H get() const noexcept { return h_; }
  H release() noexcept { return std::exchange(h_, nullptr); }
  void reset() noexcept {
    if (h_) Release(h_);
    h_ = nullptr;
  }
  explicit operator bool() const noexcept { return h_ != nullptr; }

 private:
  H h_ = nullptr;
};
}  // namespace detail

inline std::string version() { return keel_version_string(); }

// A dense host tensor (owned bytes, or caller memory with Tensor::wrap).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(keel_host_tensor_t h) : h_(h) {}

  // A copy of `values` with shape `dims`.
  template <typename T>
  static Tensor from_data(int32_t dtype, const std::vector<int64_t>& dims, const std::vector<T>& values) {
    keel_host_tensor_t t = nullptr;
    check(keel_host_tensor_create(dtype, dims.data(), static_cast<int32_t>(dims.size()), values.data(),
                                  values.size() * sizeof(T), &t));
    return Tensor(t);
  }
  static Tensor f32(const std::vector<int64_t>& dims, const std::vector<float>& values) {
    return from_data(KEEL_DTYPE_F32, dims, values);
  }
  // Zero-filled.
  static Tensor zeros(int32_t dtype, const std::vector<int64_t>& dims) {
    keel_host_tensor_t t = nullptr;
    check(keel_host_tensor_create(dtype, dims.data(), static_cast<int32_t>(dims.size()), nullptr, 0, &t));
    return Tensor(t);
  }
  // Over caller memory, no copy: `data` must outlive the Tensor and every run that reads it.
  static Tensor wrap(int32_t dtype, const std::vector<int64_t>& dims, void* data, size_t byte_size) {
    keel_host_tensor_t t = nullptr;
    check(keel_host_tensor_wrap(dtype, dims.data(), static_cast<int32_t>(dims.size()), data, byte_size, &t));
    return Tensor(t);
  }

  int32_t dtype() const { return keel_host_tensor_dtype(h_.get()); }
  std::vector<int64_t> shape() const {
    const int64_t* d = keel_host_tensor_dims(h_.get());
    return d ? std::vector<int64_t>(d, d + keel_host_tensor_ndim(h_.get())) : std::vector<int64_t>{};
  }
  int64_t element_count() const { return keel_host_tensor_element_count(h_.get()); }
  uint64_t byte_size() const { return keel_host_tensor_byte_size(h_.get()); }
  void* data() const { return keel_host_tensor_data(h_.get()); }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data());
  }
  template <typename T>
  std::vector<T> to_vector() const {
    const T* p = data_as<T>();
    return p ? std::vector<T>(p, p + byte_size() / sizeof(T)) : std::vector<T>{};
  }
  keel_host_tensor_t get() const { return h_.get(); }

 private:
  detail::Handle<keel_host_tensor_t, keel_host_tensor_release> h_;
};

// What an ONNX model says about itself (keel_model_metadata_t, with its custom metadata_props).
struct ModelMetadata {
  std::string producer_name, producer_version, domain, description, graph_name;
  int64_t model_version = 0;
  int64_t ir_version = 0;
  std::map<std::string, std::string> custom;
};

namespace detail {
template <typename Get, typename Custom>
ModelMetadata read_metadata(Get get, Custom custom) {
  keel_model_metadata_t m{};
  m.struct_size = sizeof m;
  check(get(&m));
  ModelMetadata out{m.producer_name, m.producer_version, m.domain,     m.description,
                    m.graph_name,    m.model_version,    m.ir_version, {}};
  for (size_t i = 0; i < m.custom_count; ++i) {
    const char* k = nullptr;
    const char* v = nullptr;
    check(custom(i, &k, &v));
    out.custom[k] = v;
  }
  return out;
}
}  // namespace detail

class Model {
 public:
  static Model from_file(const std::string& path) {
    keel_model_t m = nullptr;
    check(keel_model_load_from_file(path.c_str(), &m));
    return Model(m);
  }
  static Model from_memory(const void* data, size_t size) {
    keel_model_t m = nullptr;
    check(keel_model_load_from_memory(data, size, &m));
    return Model(m);
  }
  // Producer, version, description and custom metadata properties. Thread-safe.
  ModelMetadata metadata() const {
    return detail::read_metadata(
        [&](keel_model_metadata_t* m) { return keel_model_metadata(h_.get(), m); },
        [&](size_t i, const char** k, const char** v) { return keel_model_custom_metadata(h_.get(), i, k, v); });
  }
  keel_model_t get() const { return h_.get(); }

 private:
  explicit Model(keel_model_t m) : h_(m) {}
  detail::Handle<keel_model_t, keel_model_release> h_;
};

struct EnvironmentOptions {
  std::vector<std::string> plugin_paths;
  bool discover_plugins = true;
  int32_t threads = 0;
  keel_log_callback_t log_callback = nullptr;  // see keel_environment_options_set_log_callback
  void* log_user_data = nullptr;
  int32_t log_level = KEEL_LOG_INFO;
  // keel_environment_options_set_plugin_option: plugin name -> key -> value, over the manifest's [options].
  std::map<std::string, std::map<std::string, std::string>> plugin_options;
  // keel_environment_options_add_plugin_library: libraries (or manifests) loaded by path, in order.
  std::vector<std::string> plugin_libraries;
};

struct PluginInfo {
  std::string name, kind, version, vendor, reason, manifest, library;
  keel_plugin_state_t state = KEEL_PLUGIN_STATE_FAILED;
  int32_t priority = 0;
};

struct DeviceInfo {
  std::string device_type, plugin, name;
  int32_t index = 0;
  uint64_t total_memory = 0;
  uint64_t capabilities = 0;  // KEEL_DEVICE_CAP_* bits
  uint64_t free_memory = 0;
  int32_t compute_major = 0, compute_minor = 0;
  int32_t multiprocessors = 0;
  std::string spec() const { return device_type + ":" + std::to_string(index); }  // for SessionOptions::devices
  bool has(uint64_t capability) const { return (capabilities & capability) == capability; }
};

class Environment {
 public:
  Environment() : Environment(EnvironmentOptions{}) {}
  explicit Environment(const EnvironmentOptions& o) {
    keel_environment_options_t opts = nullptr;
    check(keel_environment_options_create(&opts));
    detail::Handle<keel_environment_options_t, keel_environment_options_release> owner(opts);
    for (const auto& p : o.plugin_paths) check(keel_environment_options_add_plugin_path(opts, p.c_str()));
    check(keel_environment_options_set_discover_plugins(opts, o.discover_plugins ? 1 : 0));
    check(keel_environment_options_set_threads(opts, o.threads));
    if (o.log_callback) {
      check(keel_environment_options_set_log_callback(opts, o.log_callback, o.log_user_data, o.log_level));
    }
    for (const auto& [plugin, kv] : o.plugin_options)
      for (const auto& [k, v] : kv)
        check(keel_environment_options_set_plugin_option(opts, plugin.c_str(), k.c_str(), v.c_str()));
    for (const auto& l : o.plugin_libraries) check(keel_environment_options_add_plugin_library(opts, l.c_str()));
    keel_environment_t env = nullptr;
    check(keel_environment_create(opts, &env));
    h_ = decltype(h_)(env);
  }

  std::vector<PluginInfo> plugins() const {
    size_t n = 0;
    check(keel_environment_plugin_count(h_.get(), &n));
    std::vector<PluginInfo> out;
    for (size_t i = 0; i < n; ++i) {
      keel_plugin_info_t p{};
      p.struct_size = sizeof p;
      check(keel_environment_plugin_info(h_.get(), i, &p));
      out.push_back({p.name, p.kind, p.version, p.vendor, p.reason, p.manifest, p.library,
                     static_cast<keel_plugin_state_t>(p.state), p.priority});
    }
    return out;
  }
  std::vector<DeviceInfo> devices() const {
    size_t n = 0;
    check(keel_environment_device_count(h_.get(), &n));
    std::vector<DeviceInfo> out;
    for (size_t i = 0; i < n; ++i) {
      keel_device_info_t d{};
      d.struct_size = sizeof d;
      check(keel_environment_device_info(h_.get(), i, &d));
      out.push_back({d.device_type, d.plugin, d.name, d.device_index, d.total_memory, d.capabilities, d.free_memory,
                     d.compute_major, d.compute_minor, d.multiprocessors});
    }
    return out;
  }
  keel_memory_stats_t memory_stats(const std::string& device_type, int32_t index = 0) const {
    keel_memory_stats_t s{};
    s.struct_size = sizeof s;
    check(keel_environment_memory_stats(h_.get(), device_type.c_str(), index, &s));
    return s;
  }
  uint64_t trim_memory() {
    uint64_t n = 0;
    check(keel_environment_memory_trim(h_.get(), &n));
    return n;
  }
  keel_environment_t get() const { return h_.get(); }

 private:
  detail::Handle<keel_environment_t, keel_environment_release> h_;
};

class Session;

struct SessionOptions {
  // Most preferred first, each "TYPE" (index 0) or "TYPE:INDEX" ("cuda:1"); one device of each type per session;
  // empty = every device by priority.
  std::vector<std::string> devices;
  keel_fallback_t fallback = KEEL_FALLBACK_CPU;
  // keel_session_options_set_pipeline: "auto" (default: as `keel run`) or "none"; `passes` run after it.
  std::string pipeline = "auto";
  std::vector<std::string> passes;
  bool profile = false;
  int32_t shape_variants = 8;  // keel_session_options_set_shape_variants; 0 = off
  int32_t threads = 0;         // keel_session_options_set_threads; 0 = the environment's pool
  // keel_session_options_share_weights_with: share this session's prepared model (one copy of the weights). It must
  // be alive while the new session is constructed; afterwards the two are destroyed in any order.
  const Session* share_weights_with = nullptr;

  // Appends device `index` of `type` ("cuda", 1 = "cuda:1"). Checked when the session is created.
  SessionOptions& add_device(const std::string& type, int32_t index) {
    devices.push_back(type + ":" + std::to_string(index));
    return *this;
  }
};

struct ValueInfo {
  std::string name;
  int32_t dtype = 0;
  std::vector<int64_t> dims;  // -1 = dynamic
  bool rank_known = false;
};

// Per-run options (keel_run_options_t): a terminate flag any thread may set while runs use the options, a timeout
// per run, a log tag. One object may serve many runs at once. Move-only.
class RunOptions {
 public:
  RunOptions() {
    keel_run_options_t o = nullptr;
    check(keel_run_options_create(&o));
    h_ = decltype(h_)(o);
  }
  // Stops every run using these options before its next node (CANCELLED) until cleared. Thread-safe.
  RunOptions& set_terminate(bool terminate = true) {
    check(keel_run_options_set_terminate(h_.get(), terminate ? 1 : 0));
    return *this;
  }
  // Each run stops before its next node once this long has passed since it started (DEADLINE_EXCEEDED); 0 = none.
  RunOptions& set_timeout(std::chrono::microseconds timeout) {
    check(keel_run_options_set_timeout_us(h_.get(), static_cast<int64_t>(timeout.count())));
    return *this;
  }
  RunOptions& set_log_tag(const std::string& tag) {
    check(keel_run_options_set_log_tag(h_.get(), tag.c_str()));
    return *this;
  }
  keel_run_options_t get() const { return h_.get(); }

 private:
  detail::Handle<keel_run_options_t, keel_run_options_release> h_;
};

// A tensor in a device's memory or in host memory (keel_device_tensor_t): an output a run left on a device, or memory
// prepared there. Move-only; destroy it before its Environment. Reads (shape, data pointer) are thread-safe.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  explicit DeviceTensor(keel_device_tensor_t h) : h_(h) {}
  // Uninitialised memory for a dtype[dims] tensor on `device` ("cuda:0"; "cpu" = host memory).
  static DeviceTensor create(const Environment& env, const std::string& device, int32_t dtype,
                             const std::vector<int64_t>& dims) {
    keel_device_tensor_t t = nullptr;
    check(keel_device_tensor_create(env.get(), device.c_str(), dtype, dims.data(), static_cast<int32_t>(dims.size()),
                                    &t));
    return DeviceTensor(t);
  }
  int32_t dtype() const { return keel_device_tensor_dtype(h_.get()); }
  std::vector<int64_t> shape() const {
    const int64_t* d = keel_device_tensor_dims(h_.get());
    return d ? std::vector<int64_t>(d, d + keel_device_tensor_ndim(h_.get())) : std::vector<int64_t>{};
  }
  uint64_t byte_size() const { return keel_device_tensor_byte_size(h_.get()); }
  void* data() const { return keel_device_tensor_data(h_.get()); }  // an address in the device's memory
  std::string device() const {
    return std::string(keel_device_tensor_device_type(h_.get())) + ":" +
           std::to_string(keel_device_tensor_device_index(h_.get()));
  }
  // Waits for the device work that produces it.
  void synchronize() const { check(keel_device_tensor_synchronize(h_.get())); }
  template <typename T>
  std::vector<T> to_vector() const {
    std::vector<T> out(byte_size() / sizeof(T));
    check(keel_device_tensor_copy_to_host(h_.get(), out.data(), out.size() * sizeof(T)));
    return out;
  }
  template <typename T>
  void copy_from(const std::vector<T>& values) {
    check(keel_device_tensor_copy_from_host(h_.get(), values.data(), values.size() * sizeof(T)));
  }
  keel_device_tensor_t get() const { return h_.get(); }

 private:
  detail::Handle<keel_device_tensor_t, keel_device_tensor_release> h_;
};

// Inputs and outputs bound once for many runs of one session (keel_io_binding_t; see keel.h). Move-only; destroy it
// before its session. One run at a time uses a binding: give each thread its own.
class IoBinding {
 public:
  explicit IoBinding(const Session& session);
  // Host memory (read in place) or a device tensor (read in place by kernels of its device).
  IoBinding& bind_input(const std::string& name, const Tensor& tensor) {
    check(keel_io_binding_bind_input(h_.get(), name.c_str(), tensor.get()));
    return *this;
  }
  IoBinding& bind_input(const std::string& name, const DeviceTensor& tensor) {
    check(keel_io_binding_bind_input_device(h_.get(), name.c_str(), tensor.get()));
    return *this;
  }
  // Preallocated memory of the output's dtype and shape, written in place where the producing kernel's device has it.
  IoBinding& bind_output(const std::string& name, const Tensor& tensor) {
    check(keel_io_binding_bind_output(h_.get(), name.c_str(), tensor.get()));
    return *this;
  }
  IoBinding& bind_output(const std::string& name, const DeviceTensor& tensor) {
    check(keel_io_binding_bind_output_device(h_.get(), name.c_str(), tensor.get()));
    return *this;
  }
  // Each run leaves the output in `device`'s memory ("cuda:0"; "cpu" = host memory); read it with output().
  IoBinding& bind_output_to_device(const std::string& name, const std::string& device) {
    check(keel_io_binding_bind_output_to_device(h_.get(), name.c_str(), device.c_str()));
    return *this;
  }
  void clear() { check(keel_io_binding_clear(h_.get())); }
  // The last run's result of bound output `name` (the same memory, no copy).
  DeviceTensor output(const std::string& name) const {
    keel_device_tensor_t t = nullptr;
    check(keel_io_binding_output(h_.get(), name.c_str(), &t));
    return DeviceTensor(t);
  }
  keel_io_binding_t get() const { return h_.get(); }

 private:
  detail::Handle<keel_io_binding_t, keel_io_binding_release> h_;
};

class Session {
 public:
  // The session must be destroyed before `env`. Thread-safety: run() may be called from several threads at once
  // (the runs proceed in parallel); construction, assignment and destruction need exclusive access.
  Session(const Environment& env, const Model& model, const SessionOptions& o = {}) {
    keel_session_options_t opts = nullptr;
    check(keel_session_options_create(&opts));
    detail::Handle<keel_session_options_t, keel_session_options_release> owner(opts);
    for (const auto& d : o.devices) check(keel_session_options_add_device(opts, d.c_str()));
    check(keel_session_options_set_fallback(opts, o.fallback));
    check(keel_session_options_set_pipeline(opts, o.pipeline.c_str()));
    for (const auto& p : o.passes) check(keel_session_options_add_pass(opts, p.c_str()));
    check(keel_session_options_set_profile(opts, o.profile ? 1 : 0));
    check(keel_session_options_set_shape_variants(opts, o.shape_variants));
    check(keel_session_options_set_threads(opts, o.threads));
    if (o.share_weights_with != nullptr)
      check(keel_session_options_share_weights_with(opts, o.share_weights_with->get()));
    keel_session_t s = nullptr;
    check(keel_session_create(env.get(), model.get(), opts, &s));
    h_ = decltype(h_)(s);
  }

  std::vector<ValueInfo> inputs() const { return infos(true); }
  std::vector<ValueInfo> outputs() const { return infos(false); }

  // Runs with named inputs; returns the outputs named in `output_names` (empty: every output, in model order).
  // Thread-safe. `run_options` (may be null) can stop it: then an Error with CANCELLED or DEADLINE_EXCEEDED.
  std::vector<Tensor> run(const std::vector<std::pair<std::string, const Tensor*>>& inputs,
                          const std::vector<std::string>& output_names = {},
                          const RunOptions* run_options = nullptr) const {
    std::vector<const char*> names;
    std::vector<keel_host_tensor_t> handles;
    for (const auto& [n, t] : inputs) {
      names.push_back(n.c_str());
      handles.push_back(t ? t->get() : nullptr);
    }
    std::vector<const char*> onames;
    for (const auto& n : output_names) onames.push_back(n.c_str());
    size_t count = output_names.size();
    if (count == 0) check(keel_session_output_count(h_.get(), &count));
    std::vector<keel_host_tensor_t> outs(count, nullptr);
    check(keel_session_run_with_options(h_.get(), run_options ? run_options->get() : nullptr, names.data(),
                                        handles.data(), handles.size(), output_names.empty() ? nullptr : onames.data(),
                                        outs.data(), count));
    std::vector<Tensor> result;
    result.reserve(count);
    for (auto h : outs) result.emplace_back(h);
    return result;
  }

  // Runs with the inputs and outputs of `binding` (made for this session); results: binding.output(name).
  // Thread-safe with one binding per concurrent run.
  void run(IoBinding& binding, const RunOptions* run_options = nullptr) const {
    check(keel_session_run_with_binding(h_.get(), run_options ? run_options->get() : nullptr, binding.get()));
  }
  // The copies the session's runs made so far (between devices, to the host, into bound memory). Thread-safe.
  keel_session_copy_stats_t copy_stats() const {
    keel_session_copy_stats_t c{};
    c.struct_size = sizeof c;
    check(keel_session_copy_stats(h_.get(), &c));
    return c;
  }

  // (node, op_type, device_type, kernel) in execution order.
  std::vector<keel_node_placement_t> placement() const {
    size_t n = 0;
    check(keel_session_placement_count(h_.get(), &n));
    std::vector<keel_node_placement_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      out[i].struct_size = sizeof out[i];
      check(keel_session_placement_info(h_.get(), i, &out[i]));
    }
    return out;
  }
  std::vector<keel_fallback_info_t> fallbacks() const {
    size_t n = 0;
    check(keel_session_fallback_count(h_.get(), &n));
    std::vector<keel_fallback_info_t> out(n);
    for (size_t i = 0; i < n; ++i) {
      out[i].struct_size = sizeof out[i];
      check(keel_session_fallback_info(h_.get(), i, &out[i]));
    }
    return out;
  }
  // What the session holds in memory, and whether its prepared model is shared. Thread-safe.
  keel_session_memory_info_t memory_info() const {
    keel_session_memory_info_t m{};
    m.struct_size = sizeof m;
    check(keel_session_memory_info(h_.get(), &m));
    return m;
  }
  // Writes the optimised graph (after the passes, as placed) as ONNX (keel_session_save_optimized_model). Thread-safe.
  void save_optimized_model(const std::string& path) const {
    check(keel_session_save_optimized_model(h_.get(), path.c_str()));
  }
  // The metadata of the model the session was created from. Thread-safe.
  ModelMetadata model_metadata() const {
    return detail::read_metadata(
        [&](keel_model_metadata_t* m) { return keel_session_model_metadata(h_.get(), m); },
        [&](size_t i, const char** k, const char** v) { return keel_session_custom_metadata(h_.get(), i, k, v); });
  }
  keel_session_t get() const { return h_.get(); }

 private:
  std::vector<ValueInfo> infos(bool in) const {
    size_t n = 0;
    check(in ? keel_session_input_count(h_.get(), &n) : keel_session_output_count(h_.get(), &n));
    std::vector<ValueInfo> out;
    for (size_t i = 0; i < n; ++i) {
      keel_value_info_t v{};
      v.struct_size = sizeof v;
      check(in ? keel_session_input_info(h_.get(), i, &v) : keel_session_output_info(h_.get(), i, &v));
      ValueInfo info;
      info.name = v.name;
      info.dtype = v.dtype;
      info.rank_known = v.ndim >= 0;
      if (v.ndim > 0) info.dims.assign(v.dims, v.dims + v.ndim);
      out.push_back(std::move(info));
    }
    return out;
  }
  detail::Handle<keel_session_t, keel_session_release> h_;
};

inline IoBinding::IoBinding(const Session& session) {
  keel_io_binding_t b = nullptr;
  check(keel_io_binding_create(session.get(), &b));
  h_ = decltype(h_)(b);
}

}  // namespace keel::api
