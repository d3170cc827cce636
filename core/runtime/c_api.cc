// keel/core/runtime/c_api.cc — the host C API (sdk/include/keel/keel.h) over Environment, Session and Tensor.
//
// Every entry catches every exception and turns it into a status (bad_alloc → OUT_OF_MEMORY, anything else →
// INTERNAL): nothing C++ leaves the library. Handles are plain structs that own the C++ objects and the strings the
// API hands out, so every `const char*` we return lives as long as the handle it came from.
#include <keel/keel.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/base/log.h"
#include "core/base/thread_pool.h"
#include "core/runtime/environment.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/pipelines.h"
#include "core/runtime/session.h"
#include "hal/device.h"

using keel::DType;
using keel::Status;
using keel::StatusCode;

// ---------------------------------------------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------------------------------------------

struct keel_environment_options_s {
  keel::EnvironmentOptions options;
  keel_log_callback_t log_callback = nullptr;
  void* log_user_data = nullptr;
  int32_t log_min_level = KEEL_LOG_INFO;
};

struct keel_environment_s {
  std::unique_ptr<keel::Environment> env;
  struct PluginRow {
    std::string name, kind, version, vendor, reason, manifest, library;
    int32_t state = 0, priority = 0;
  };
  struct DeviceRow {
    std::string device_type, plugin, name;
    int32_t index = 0;
    uint64_t total_memory = 0, capabilities = 0, free_memory = 0;
    int32_t compute_major = 0, compute_minor = 0, multiprocessors = 0;
  };
  std::vector<PluginRow> plugins;
  std::vector<DeviceRow> devices;
};

// A model's metadata (keel_model_metadata), shared by the model and the sessions created from it.
struct KeelModelMeta {
  keel::OnnxModelMeta onnx;
  std::string graph_name;
  std::vector<std::pair<std::string, std::string>> custom;  // sorted by key
};

struct keel_model_s {
  keel::Graph graph;
  std::shared_ptr<const KeelModelMeta> meta;
};

struct keel_host_tensor_s {
  keel::Tensor tensor;
};

struct keel_session_options_s {
  keel::SessionOptions options;
  std::string pipeline = "auto";        // keel_session_options_set_pipeline; runs before options.passes
  keel_session_t share_with = nullptr;  // keel_session_options_share_weights_with
};

struct keel_run_options_s {
  std::atomic<bool> terminate{false};
  int64_t timeout_us = 0;
  std::string tag;
};

struct keel_device_tensor_s {
  keel::DeviceTensor value;
  keel::Environment* env = nullptr;  // for copies (null for tensors of a run: then the session's environment)
};

struct keel_session_s {
  std::unique_ptr<keel::Session> session;
  keel::Environment* env = nullptr;
  const keel::log::Target* log_target = nullptr;  // the environment's log (it outlives the session)
  std::shared_ptr<const KeelModelMeta> meta;
  struct ValueRow {
    std::string name;
    int32_t dtype = 0, ndim = -1;
    std::vector<int64_t> dims;
  };
  struct PlacementRow {
    std::string node, op_type, device_type, kernel;
  };
  struct FallbackRow {
    std::string node, op_type, from, to, reason;
  };
  std::vector<ValueRow> inputs, outputs;
  std::map<std::string, size_t> output_index;
  std::vector<FallbackRow> fallbacks;
  // The placement of each build the session ran ("" = the generic build; else its shape variant), taken when first
  // asked for and kept, so that the strings handed out live as long as the session. Guarded by placement_mu.
  std::mutex placement_mu;
  std::map<std::string, std::vector<PlacementRow>> placements;
  // The placement of the build the most recent run used (Session::placement()).
  const std::vector<PlacementRow>& placement() {
    std::string variant;
    auto rows = session->placement(&variant);
    std::lock_guard<std::mutex> lock(placement_mu);
    auto it = placements.find(variant);
    if (it == placements.end()) {
      std::vector<PlacementRow> out;
      for (const auto& [node, op, dev, kernel] : rows) out.push_back({node, op, dev, kernel});
      it = placements.emplace(variant, std::move(out)).first;
    }
    return it->second;
  }
  // The profile as the last keel_session_profile_info saw it (keel_session_profile_step_info reads it), with the
  // node-name arrays its steps hand out.
  std::vector<keel::NodeProfile> profile;
  std::vector<std::vector<std::vector<const char*>>> profile_step_nodes;
};

struct keel_io_binding_s {
  keel_session_t session = nullptr;
  std::atomic<bool> in_use{false};  // a run (or a bind call) holds the binding
  std::vector<keel::BoundInput> inputs;
  std::vector<keel::BoundOutput> outputs;
  std::vector<keel::DeviceTensor> results;  // per output, of the last successful run (empty: none since binding)
  ~keel_io_binding_s() {
    // Device work may still write the outputs' memory: wait before letting it go back to the pool.
    for (const auto& r : results)
      if (r.ready) (void)r.ready->wait();
  }
};

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The exception edge
// ---------------------------------------------------------------------------------------------------------------

// Handed out when even a status object cannot be allocated. release = NULL, so keel_status_release leaves it be.
keel_status_s g_oom_status = {sizeof(keel_status_s), KEEL_STATUS_OUT_OF_MEMORY,
                              "out of memory (while reporting an error)", nullptr};

keel_status_t to_c(const Status& st) {
  if (st.is_ok()) return nullptr;
  keel_status_t s = st.to_c();
  return s != nullptr ? s : &g_oom_status;
}

keel_status_t make_status(StatusCode code, const std::string& message) { return to_c(Status(code, message)); }

// Runs `body` (returning Status) with every exception turned into a status naming the entry point.
template <typename F>
keel_status_t guarded(const char* fn, F&& body) noexcept {
  try {
    return to_c(body());
  } catch (const std::bad_alloc&) {
    keel_status_t s = keel::make_c_status(KEEL_STATUS_OUT_OF_MEMORY, (std::string(fn) + ": out of memory").c_str());
    return s != nullptr ? s : &g_oom_status;
  } catch (const std::exception& e) {
    try {
      return make_status(StatusCode::kInternal, std::string(fn) + ": unexpected exception: " + e.what());
    } catch (...) {
      return &g_oom_status;
    }
  } catch (...) {
    keel_status_t s = keel::make_c_status(KEEL_STATUS_INTERNAL, "unexpected exception of unknown type");
    return s != nullptr ? s : &g_oom_status;
  }
}

Status null_arg(const char* fn, const char* what) {
  return keel::invalid_argument(std::string(fn) + ": " + what + " is NULL");
}

Status check_index(const char* fn, size_t index, size_t count, const char* what) {
  if (index < count) return Status::ok();
  return Status(StatusCode::kOutOfRange, std::string(fn) + ": " + what + " index " + std::to_string(index) +
                                             " out of range (" + std::to_string(count) + " present)");
}

// Writes `value` into out->member when the caller's struct_size covers it.
#define KEEL_C_SET(out, type, member, value)                         \
  do {                                                               \
    if (KEEL_HAS_MEMBER(out, type, member)) (out)->member = (value); \
  } while (0)

Status check_out_struct(const char* fn, const void* out, uint32_t struct_size) {
  if (out == nullptr) return null_arg(fn, "the out struct");
  if (struct_size < sizeof(uint32_t)) {
    return keel::invalid_argument(std::string(fn) + ": set struct_size of the out struct (got " +
                                  std::to_string(struct_size) + ")");
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------------------------

Status make_shape(const char* fn, const int64_t* dims, int32_t ndim, keel::Shape& shape) {
  if (ndim < 0) return keel::invalid_argument(std::string(fn) + ": ndim is negative (" + std::to_string(ndim) + ")");
  if (ndim > 0 && dims == nullptr) return null_arg(fn, "dims");
  shape.assign(dims, dims + ndim);
  for (int32_t i = 0; i < ndim; ++i) {
    if (shape[i] < 0) {
      return keel::invalid_argument(std::string(fn) + ": dim " + std::to_string(i) + " is negative (" +
                                    std::to_string(shape[i]) + ")");
    }
  }
  return Status::ok();
}

Status check_dtype(const char* fn, int32_t dtype) {
  if (!keel::dtype_is_valid(dtype) || keel::dtype_size(static_cast<DType>(dtype)) == 0) {
    return keel::invalid_argument(std::string(fn) + ": dtype " + std::to_string(dtype) +
                                  " is not a numeric keel_dtype_t");
  }
  return Status::ok();
}

keel_session_s::ValueRow value_row(const keel::Graph& g, const std::string& name) {
  keel_session_s::ValueRow row;
  row.name = name;
  if (const keel::ValueInfo* vi = g.info(name)) {
    row.dtype = static_cast<int32_t>(vi->dtype);
    if (vi->shape) {
      row.dims = *vi->shape;
      row.ndim = static_cast<int32_t>(row.dims.size());
    }
  }
  return row;
}

void fill_value_info(const keel_session_s::ValueRow& row, keel_value_info_t* out) {
  KEEL_C_SET(out, keel_value_info_t, name, row.name.c_str());
  KEEL_C_SET(out, keel_value_info_t, dtype, row.dtype);
  KEEL_C_SET(out, keel_value_info_t, ndim, row.ndim);
  KEEL_C_SET(out, keel_value_info_t, dims, row.dims.empty() ? nullptr : row.dims.data());
}

std::shared_ptr<const KeelModelMeta> make_model_meta(keel::OnnxModelMeta onnx, const keel::Graph& g) {
  auto m = std::make_shared<KeelModelMeta>();
  m->onnx = std::move(onnx);
  m->graph_name = g.name;
  for (const auto& kv : m->onnx.metadata_props) m->custom.emplace_back(kv);  // a std::map: sorted by key
  return m;
}

Status fill_model_meta(const char* fn, const KeelModelMeta* m, keel_model_metadata_t* out) {
  KEEL_RETURN_IF_ERROR(check_out_struct(fn, out, out ? out->struct_size : 0), "");
  static const KeelModelMeta empty;
  if (m == nullptr) m = &empty;
  KEEL_C_SET(out, keel_model_metadata_t, producer_name, m->onnx.producer_name.c_str());
  KEEL_C_SET(out, keel_model_metadata_t, producer_version, m->onnx.producer_version.c_str());
  KEEL_C_SET(out, keel_model_metadata_t, domain, m->onnx.domain.c_str());
  KEEL_C_SET(out, keel_model_metadata_t, description, m->onnx.doc_string.c_str());
  KEEL_C_SET(out, keel_model_metadata_t, graph_name, m->graph_name.c_str());
  KEEL_C_SET(out, keel_model_metadata_t, model_version, m->onnx.model_version);
  KEEL_C_SET(out, keel_model_metadata_t, ir_version, m->onnx.ir_version);
  KEEL_C_SET(out, keel_model_metadata_t, custom_count, m->custom.size());
  return Status::ok();
}

Status custom_meta(const char* fn, const KeelModelMeta* m, size_t index, const char** out_key, const char** out_value) {
  if (out_key) *out_key = nullptr;
  if (out_value) *out_value = nullptr;
  KEEL_RETURN_IF_ERROR(check_index(fn, index, m ? m->custom.size() : 0, "custom metadata"), "");
  if (out_key) *out_key = m->custom[index].first.c_str();
  if (out_value) *out_value = m->custom[index].second.c_str();
  return Status::ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Versions and status helpers
// ---------------------------------------------------------------------------------------------------------------

extern "C" {

KEEL_API const char* keel_version_string(void) { return KEEL_VERSION; }

KEEL_API void keel_version_get(int32_t* out_major, int32_t* out_minor, int32_t* out_patch) {
  // KEEL_VERSION is the project's version (CMake); parse it once so header and library cannot disagree silently.
  static const std::array<int32_t, 3> v = [] {
    std::array<int32_t, 3> r{0, 0, 0};
    const char* p = KEEL_VERSION;
    for (int i = 0; i < 3 && *p; ++i) {
      r[i] = static_cast<int32_t>(std::strtol(p, const_cast<char**>(&p), 10));
      if (*p == '.') ++p;
    }
    return r;
  }();
  if (out_major) *out_major = v[0];
  if (out_minor) *out_minor = v[1];
  if (out_patch) *out_patch = v[2];
}

KEEL_API void keel_plugin_abi_version_get(int32_t* out_major, int32_t* out_minor) {
  if (out_major) *out_major = KEEL_PLUGIN_ABI_MAJOR;
  if (out_minor) *out_minor = KEEL_PLUGIN_ABI_MINOR;
}

KEEL_API const char* keel_status_code_name(int32_t code) {
  if (code < KEEL_STATUS_OK || code > KEEL_STATUS_CANCELLED) return "UNKNOWN";
  return keel::status_code_name(static_cast<StatusCode>(code));
}

KEEL_API const char* keel_dtype_name(int32_t dtype) {
  if (!keel::dtype_is_valid(dtype)) return "undefined";
  return keel::dtype_name(static_cast<DType>(dtype));
}

KEEL_API size_t keel_dtype_size(int32_t dtype) {
  if (!keel::dtype_is_valid(dtype)) return 0;
  return keel::dtype_size(static_cast<DType>(dtype));
}

// ---------------------------------------------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------------------------------------------

KEEL_API keel_status_t keel_environment_options_create(keel_environment_options_t* out_options) {
  return guarded(__func__, [&]() -> Status {
    if (out_options == nullptr) return null_arg(__func__, "out_options");
    *out_options = nullptr;
    *out_options = new keel_environment_options_s();
    return Status::ok();
  });
}

KEEL_API void keel_environment_options_release(keel_environment_options_t options) { delete options; }

KEEL_API keel_status_t keel_environment_options_add_plugin_path(keel_environment_options_t options, const char* path) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (path == nullptr) return null_arg(__func__, "path");
    options->options.plugin_paths.emplace_back(path);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_options_set_discover_plugins(keel_environment_options_t options,
                                                                     int32_t discover) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    options->options.discover_plugins = discover != 0;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_options_set_threads(keel_environment_options_t options, int32_t threads) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (threads < 0) return keel::invalid_argument(std::string(__func__) + ": threads is negative");
    options->options.threads = threads;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_options_set_log_callback(keel_environment_options_t options,
                                                                 keel_log_callback_t callback, void* user_data,
                                                                 int32_t min_level) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (min_level < KEEL_LOG_TRACE || min_level > KEEL_LOG_ERROR) {
      return keel::invalid_argument(std::string(__func__) + ": min_level " + std::to_string(min_level) +
                                    " is not a keel_log_level_t");
    }
    options->log_callback = callback;
    options->log_user_data = user_data;
    options->log_min_level = min_level;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_create(keel_environment_options_t options, keel_environment_t* out_env) {
  return guarded(__func__, [&]() -> Status {
    if (out_env == nullptr) return null_arg(__func__, "out_env");
    *out_env = nullptr;
    keel_environment_options_s defaults;
    const keel_environment_options_s& o = options ? *options : defaults;
    auto handle = std::make_unique<keel_environment_s>();
    keel::EnvironmentOptions env_options = o.options;
    if (o.log_callback) {
      // The environment's own log target: it hears this environment's messages (plugin discovery included).
      env_options.log_callback = [fn = o.log_callback, user_data = o.log_user_data](int32_t level,
                                                                                    const std::string& message) {
        fn(user_data, level, message.c_str());
      };
      env_options.log_min_level = o.log_min_level;
    }
    auto env = keel::Environment::create(std::move(env_options));
    if (!env.is_ok()) return env.status().with_context("keel_environment_create");
    handle->env = std::move(env).value();

    for (const auto& p : handle->env->plugins()) {
      keel_environment_s::PluginRow row;
      row.name = p.name;
      row.kind = p.kind;
      row.version = p.version;
      row.vendor = p.vendor;
      row.reason = p.reason;
      row.manifest = p.manifest.string();
      row.library = p.library.string();
      row.priority = p.priority;
      row.state = p.state == keel::PluginState::kLoaded    ? KEEL_PLUGIN_STATE_LOADED
                  : p.state == keel::PluginState::kSkipped ? KEEL_PLUGIN_STATE_SKIPPED
                                                           : KEEL_PLUGIN_STATE_FAILED;
      handle->plugins.push_back(std::move(row));
    }
    const keel::Registry& reg = handle->env->registry();
    for (const auto& type : reg.device_types()) {
      const keel::DeviceEntry* dev = reg.device(type);
      if (dev == nullptr) continue;
      for (int32_t i = 0; i < dev->device_count; ++i) {
        keel_environment_s::DeviceRow row;
        row.device_type = type;
        row.index = i;
        const auto& recs = handle->env->plugins();
        for (const auto& r : recs)
          if (r.id == dev->plugin) row.plugin = r.name;
        if (dev->table.get_properties) {
          auto got = keel::hal::Device(dev, i).properties();
          if (got.is_ok()) {
            const keel_device_properties_t& props = got.value();
            row.name = props.name;
            row.total_memory = props.total_memory;
            row.capabilities = props.capabilities;
            row.free_memory = props.free_memory;
            row.compute_major = props.compute_major;
            row.compute_minor = props.compute_minor;
            row.multiprocessors = props.multiprocessors;
          }
        }
        handle->devices.push_back(std::move(row));
      }
    }
    *out_env = handle.release();
    return Status::ok();
  });
}

KEEL_API void keel_environment_release(keel_environment_t env) {
  if (env == nullptr) return;
  try {
    env->env.reset();
  } catch (...) {
    // Nothing may leave; the environment is gone either way.
  }
  delete env;
}

KEEL_API keel_status_t keel_environment_plugin_count(keel_environment_t env, size_t* out_count) {
  return guarded(__func__, [&]() -> Status {
    if (env == nullptr) return null_arg(__func__, "env");
    if (out_count == nullptr) return null_arg(__func__, "out_count");
    *out_count = env->plugins.size();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_plugin_info(keel_environment_t env, size_t index, keel_plugin_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (env == nullptr) return null_arg(__func__, "env");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, env->plugins.size(), "plugin"), "");
    const auto& r = env->plugins[index];
    KEEL_C_SET(out, keel_plugin_info_t, name, r.name.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, kind, r.kind.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, version, r.version.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, vendor, r.vendor.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, state, r.state);
    KEEL_C_SET(out, keel_plugin_info_t, reason, r.reason.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, manifest, r.manifest.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, library, r.library.c_str());
    KEEL_C_SET(out, keel_plugin_info_t, priority, r.priority);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_device_count(keel_environment_t env, size_t* out_count) {
  return guarded(__func__, [&]() -> Status {
    if (env == nullptr) return null_arg(__func__, "env");
    if (out_count == nullptr) return null_arg(__func__, "out_count");
    *out_count = env->devices.size();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_device_info(keel_environment_t env, size_t index, keel_device_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (env == nullptr) return null_arg(__func__, "env");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, env->devices.size(), "device"), "");
    const auto& d = env->devices[index];
    KEEL_C_SET(out, keel_device_info_t, device_type, d.device_type.c_str());
    KEEL_C_SET(out, keel_device_info_t, device_index, d.index);
    KEEL_C_SET(out, keel_device_info_t, plugin, d.plugin.c_str());
    KEEL_C_SET(out, keel_device_info_t, name, d.name.c_str());
    KEEL_C_SET(out, keel_device_info_t, total_memory, d.total_memory);
    KEEL_C_SET(out, keel_device_info_t, capabilities, d.capabilities);
    KEEL_C_SET(out, keel_device_info_t, free_memory, d.free_memory);
    KEEL_C_SET(out, keel_device_info_t, compute_major, d.compute_major);
    KEEL_C_SET(out, keel_device_info_t, compute_minor, d.compute_minor);
    KEEL_C_SET(out, keel_device_info_t, multiprocessors, d.multiprocessors);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_memory_stats(keel_environment_t env, const char* device_type,
                                                     int32_t device_index, keel_memory_stats_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (env == nullptr) return null_arg(__func__, "env");
    if (device_type == nullptr) return null_arg(__func__, "device_type");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    const keel::DeviceEntry* dev = env->env->registry().device(device_type);
    if (dev == nullptr) return keel::not_found(std::string(__func__) + ": no device type '" + device_type + "'");
    if (device_index < 0 || device_index >= dev->device_count) {
      return Status(StatusCode::kOutOfRange, std::string(__func__) + ": " + device_type + ":" +
                                                 std::to_string(device_index) + " does not exist (" +
                                                 std::to_string(dev->device_count) + " present)");
    }
    keel::AllocatorStats s;
    auto all = env->env->memory_stats();
    if (auto it = all.find(std::string(device_type) + ":" + std::to_string(device_index)); it != all.end()) {
      s = it->second;
    }
    KEEL_C_SET(out, keel_memory_stats_t, in_use_bytes, s.in_use_bytes);
    KEEL_C_SET(out, keel_memory_stats_t, reserved_bytes, s.reserved_bytes);
    KEEL_C_SET(out, keel_memory_stats_t, peak_in_use_bytes, s.peak_in_use_bytes);
    KEEL_C_SET(out, keel_memory_stats_t, peak_reserved_bytes, s.peak_reserved_bytes);
    KEEL_C_SET(out, keel_memory_stats_t, allocations, s.allocations);
    KEEL_C_SET(out, keel_memory_stats_t, cache_hits, s.cache_hits);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_memory_trim(keel_environment_t env, uint64_t* out_released_bytes) {
  return guarded(__func__, [&]() -> Status {
    if (env == nullptr) return null_arg(__func__, "env");
    uint64_t n = env->env->trim_memory();
    if (out_released_bytes) *out_released_bytes = n;
    return Status::ok();
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Tensors
// ---------------------------------------------------------------------------------------------------------------

KEEL_API keel_status_t keel_host_tensor_create(int32_t dtype, const int64_t* dims, int32_t ndim, const void* data,
                                               size_t byte_size, keel_host_tensor_t* out_tensor) {
  return guarded(__func__, [&]() -> Status {
    if (out_tensor == nullptr) return null_arg(__func__, "out_tensor");
    *out_tensor = nullptr;
    KEEL_RETURN_IF_ERROR(check_dtype(__func__, dtype), "");
    keel::Shape shape;
    KEEL_RETURN_IF_ERROR(make_shape(__func__, dims, ndim, shape), "");
    KEEL_ASSIGN_OR_RETURN(uint64_t bytes, keel::checked_byte_size(static_cast<DType>(dtype), shape), __func__);
    if (data != nullptr && byte_size != bytes) {
      return keel::invalid_argument(std::string(__func__) + ": byte_size is " + std::to_string(byte_size) + ", a " +
                                    keel::dtype_name(static_cast<DType>(dtype)) + keel::shape_to_string(shape) +
                                    " tensor has " + std::to_string(bytes));
    }
    KEEL_ASSIGN_OR_RETURN(keel::Tensor t, keel::Tensor::host(static_cast<DType>(dtype), shape), __func__);
    if (data != nullptr && bytes > 0) std::memcpy(t.raw_data(), data, bytes);
    *out_tensor = new keel_host_tensor_s{std::move(t)};
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_host_tensor_wrap(int32_t dtype, const int64_t* dims, int32_t ndim, void* data,
                                             size_t byte_size, keel_host_tensor_t* out_tensor) {
  return guarded(__func__, [&]() -> Status {
    if (out_tensor == nullptr) return null_arg(__func__, "out_tensor");
    *out_tensor = nullptr;
    KEEL_RETURN_IF_ERROR(check_dtype(__func__, dtype), "");
    keel::Shape shape;
    KEEL_RETURN_IF_ERROR(make_shape(__func__, dims, ndim, shape), "");
    DType dt = static_cast<DType>(dtype);
    KEEL_ASSIGN_OR_RETURN(uint64_t bytes, keel::checked_byte_size(dt, shape), __func__);
    if (byte_size != bytes) {
      return keel::invalid_argument(std::string(__func__) + ": byte_size is " + std::to_string(byte_size) + ", a " +
                                    keel::dtype_name(dt) + keel::shape_to_string(shape) + " tensor has " +
                                    std::to_string(bytes));
    }
    if (data == nullptr && bytes > 0) return null_arg(__func__, "data");
    if (reinterpret_cast<uintptr_t>(data) % keel::dtype_size(dt) != 0) {
      return keel::invalid_argument(std::string(__func__) + ": data is not aligned to " +
                                    std::to_string(keel::dtype_size(dt)) + " bytes");
    }
    keel::Tensor t(dt, shape, keel::Storage::borrow(data, bytes, keel::Location{}));
    *out_tensor = new keel_host_tensor_s{std::move(t)};
    return Status::ok();
  });
}

KEEL_API void keel_host_tensor_release(keel_host_tensor_t tensor) { delete tensor; }

KEEL_API int32_t keel_host_tensor_dtype(keel_host_tensor_t t) {
  return t ? static_cast<int32_t>(t->tensor.dtype()) : KEEL_DTYPE_UNDEFINED;
}
KEEL_API int32_t keel_host_tensor_ndim(keel_host_tensor_t t) { return t ? static_cast<int32_t>(t->tensor.rank()) : 0; }
KEEL_API const int64_t* keel_host_tensor_dims(keel_host_tensor_t t) {
  return t && t->tensor.rank() > 0 ? t->tensor.shape().data() : nullptr;
}
KEEL_API int64_t keel_host_tensor_element_count(keel_host_tensor_t t) { return t ? t->tensor.numel() : 0; }
KEEL_API void* keel_host_tensor_data(keel_host_tensor_t t) { return t ? t->tensor.raw_data() : nullptr; }
KEEL_API uint64_t keel_host_tensor_byte_size(keel_host_tensor_t t) { return t ? t->tensor.byte_size() : 0; }

// ---------------------------------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------------------------------

KEEL_API keel_status_t keel_model_load_from_file(const char* path, keel_model_t* out_model) {
  return guarded(__func__, [&]() -> Status {
    if (out_model == nullptr) return null_arg(__func__, "out_model");
    *out_model = nullptr;
    if (path == nullptr) return null_arg(__func__, "path");
    keel::OnnxLoadOptions lo;
    keel::OnnxModelMeta meta;
    lo.meta = &meta;
    KEEL_ASSIGN_OR_RETURN(keel::Graph g, keel::load_onnx(path, lo), __func__);
    auto m = make_model_meta(std::move(meta), g);
    *out_model = new keel_model_s{std::move(g), std::move(m)};
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_model_load_from_memory(const void* data, size_t size, keel_model_t* out_model) {
  return guarded(__func__, [&]() -> Status {
    if (out_model == nullptr) return null_arg(__func__, "out_model");
    *out_model = nullptr;
    if (data == nullptr && size > 0) return null_arg(__func__, "data");
    keel::OnnxLoadOptions lo;
    keel::OnnxModelMeta meta;
    lo.meta = &meta;
    KEEL_ASSIGN_OR_RETURN(keel::Graph g, keel::load_onnx_from_memory(data, size, {}, lo), __func__);
    auto m = make_model_meta(std::move(meta), g);
    *out_model = new keel_model_s{std::move(g), std::move(m)};
    return Status::ok();
  });
}

KEEL_API void keel_model_release(keel_model_t model) { delete model; }

// ---------------------------------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------------------------------

KEEL_API keel_status_t keel_session_options_create(keel_session_options_t* out_options) {
  return guarded(__func__, [&]() -> Status {
    if (out_options == nullptr) return null_arg(__func__, "out_options");
    *out_options = nullptr;
    *out_options = new keel_session_options_s();
    return Status::ok();
  });
}

KEEL_API void keel_session_options_release(keel_session_options_t options) { delete options; }

KEEL_API keel_status_t keel_session_options_add_device(keel_session_options_t options, const char* device_type) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (device_type == nullptr || *device_type == '\0') return null_arg(__func__, "device_type");
    KEEL_ASSIGN_OR_RETURN(keel::DeviceSpec spec, keel::DeviceSpec::parse(device_type), __func__);
    options->options.devices.push_back(spec.explicit_index ? spec.to_string() : spec.type);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_add_device_index(keel_session_options_t options, const char* device_type,
                                                             int32_t device_index) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (device_type == nullptr || *device_type == '\0') return null_arg(__func__, "device_type");
    if (std::strchr(device_type, ':') != nullptr) {
      return keel::invalid_argument(std::string(__func__) + ": device type '" + device_type +
                                    "' must not contain ':' (the index is its own argument)");
    }
    if (device_index < 0) {
      return keel::invalid_argument(std::string(__func__) + ": device index " + std::to_string(device_index) + " of '" +
                                    device_type + "' must be >= 0");
    }
    KEEL_ASSIGN_OR_RETURN(keel::DeviceSpec spec,
                          keel::DeviceSpec::parse(std::string(device_type) + ":" + std::to_string(device_index)),
                          __func__);
    options->options.devices.push_back(spec.to_string());
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_set_fallback(keel_session_options_t options, int32_t fallback) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (fallback != KEEL_FALLBACK_CPU && fallback != KEEL_FALLBACK_ERROR) {
      return keel::invalid_argument(std::string(__func__) + ": fallback " + std::to_string(fallback) +
                                    " is neither KEEL_FALLBACK_CPU nor KEEL_FALLBACK_ERROR");
    }
    options->options.fallback = fallback == KEEL_FALLBACK_CPU ? keel::Fallback::kCpu : keel::Fallback::kError;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_add_pass(keel_session_options_t options, const char* pass_name) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (pass_name == nullptr || *pass_name == '\0') return null_arg(__func__, "pass_name");
    options->options.passes.emplace_back(pass_name);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_set_threads(keel_session_options_t options, int32_t threads) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (threads < 0) return keel::invalid_argument(std::string(__func__) + ": threads is negative");
    options->options.threads = threads;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_set_profile(keel_session_options_t options, int32_t profile) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    options->options.profile = profile != 0;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_set_shape_variants(keel_session_options_t options, int32_t count) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (count < 0) return keel::invalid_argument(std::string(__func__) + ": count is negative");
    options->options.shape_variants = count;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_create(keel_environment_t env, keel_model_t model, keel_session_options_t options,
                                           keel_session_t* out_session) {
  return guarded(__func__, [&]() -> Status {
    if (out_session == nullptr) return null_arg(__func__, "out_session");
    *out_session = nullptr;
    if (env == nullptr) return null_arg(__func__, "env");
    if (model == nullptr) return null_arg(__func__, "model");
    keel_session_options_s defaults;
    const keel_session_options_s& o = options ? *options : defaults;
    keel::log::Scope log_scope(env->env->log_target());
    keel::SessionOptions so = o.options;
    KEEL_ASSIGN_OR_RETURN(std::vector<std::string> pipeline,
                          keel::named_pass_pipeline(o.pipeline, model->graph, env->env->registry()), __func__);
    so.passes.insert(so.passes.begin(), pipeline.begin(), pipeline.end());
    if (o.share_with != nullptr) so.share_weights_with = o.share_with->session.get();
    KEEL_ASSIGN_OR_RETURN(auto session, keel::Session::create(*env->env, model->graph, so), __func__);
    auto handle = std::make_unique<keel_session_s>();
    handle->log_target = env->env->log_target();
    handle->env = env->env.get();
    handle->meta = model->meta;
    const keel::Graph& g = session->graph();
    for (const auto& n : session->input_names()) handle->inputs.push_back(value_row(g, n));
    for (const auto& n : session->output_names()) {
      handle->output_index.emplace(n, handle->outputs.size());
      handle->outputs.push_back(value_row(g, n));
    }
    for (const auto& f : session->fallbacks()) handle->fallbacks.push_back({f.node, f.op_type, f.from, f.to, f.reason});
    handle->session = std::move(session);
    handle->placement();  // the generic build's, as created
    *out_session = handle.release();
    return Status::ok();
  });
}

KEEL_API void keel_session_release(keel_session_t session) {
  if (session == nullptr) return;
  keel::log::Scope log_scope(session->log_target);
  delete session;
}

KEEL_API keel_status_t keel_session_input_count(keel_session_t session, size_t* out_count) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    if (out_count == nullptr) return null_arg(__func__, "out_count");
    *out_count = session->inputs.size();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_input_info(keel_session_t session, size_t index, keel_value_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, session->inputs.size(), "input"), "");
    fill_value_info(session->inputs[index], out);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_output_count(keel_session_t session, size_t* out_count) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    if (out_count == nullptr) return null_arg(__func__, "out_count");
    *out_count = session->outputs.size();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_output_info(keel_session_t session, size_t index, keel_value_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, session->outputs.size(), "output"), "");
    fill_value_info(session->outputs[index], out);
    return Status::ok();
  });
}

namespace {

keel_status_t session_run(const char* fn, keel_session_t session, keel_run_options_t run_options,
                          const char* const* input_names, const keel_host_tensor_t* inputs, size_t input_count,
                          const char* const* output_names, keel_host_tensor_t* out_outputs, size_t output_count) {
  // The outputs are handed over only when everything succeeded.
  std::vector<std::unique_ptr<keel_host_tensor_s>> results;
  keel::log::Scope log_scope(session != nullptr ? session->log_target : nullptr);
  keel_status_t status = guarded(fn, [&]() -> Status {
    if (out_outputs != nullptr)
      for (size_t i = 0; i < output_count; ++i) out_outputs[i] = nullptr;
    if (session == nullptr) return null_arg(fn, "session");
    if (input_count > 0 && input_names == nullptr) return null_arg(fn, "input_names");
    if (input_count > 0 && inputs == nullptr) return null_arg(fn, "inputs");
    if (output_count > 0 && out_outputs == nullptr) return null_arg(fn, "out_outputs");

    std::vector<std::pair<std::string, keel::Tensor>> feeds;
    std::set<std::string> seen;
    std::set<const keel::Storage*> input_storage;
    for (size_t i = 0; i < input_count; ++i) {
      if (input_names[i] == nullptr) return null_arg(fn, ("input_names[" + std::to_string(i) + "]").c_str());
      if (inputs[i] == nullptr) {
        return keel::invalid_argument(std::string(fn) + ": the tensor of input '" + input_names[i] + "' is NULL");
      }
      if (!seen.insert(input_names[i]).second) {
        return keel::invalid_argument(std::string(fn) + ": input '" + input_names[i] + "' is given twice");
      }
      feeds.emplace_back(input_names[i], inputs[i]->tensor);
      input_storage.insert(inputs[i]->tensor.storage().get());
    }

    // Which graph outputs the caller wants, resolved before running.
    std::vector<size_t> pick;
    if (output_names == nullptr) {
      if (output_count != session->outputs.size()) {
        return keel::invalid_argument(std::string(fn) + ": output_names is NULL, so output_count must be " +
                                      std::to_string(session->outputs.size()) + " (every output), not " +
                                      std::to_string(output_count));
      }
      for (size_t i = 0; i < output_count; ++i) pick.push_back(i);
    } else {
      for (size_t i = 0; i < output_count; ++i) {
        if (output_names[i] == nullptr) {
          return null_arg(fn, ("output_names[" + std::to_string(i) + "]").c_str());
        }
        auto it = session->output_index.find(output_names[i]);
        if (it == session->output_index.end()) {
          std::string known;
          for (const auto& o : session->outputs) known += (known.empty() ? "" : ", ") + o.name;
          return keel::invalid_argument(std::string(fn) + ": unknown output '" + output_names[i] +
                                        "' (outputs: " + known + ")");
        }
        pick.push_back(it->second);
      }
    }

    keel::RunOptions ro;
    if (run_options != nullptr) {
      ro.terminate = &run_options->terminate;
      if (run_options->timeout_us > 0)
        ro.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(run_options->timeout_us);
      ro.tag = run_options->tag;
    }
    KEEL_ASSIGN_OR_RETURN(std::vector<keel::Tensor> outs, session->session->run(feeds, ro), fn);
    if (outs.size() != session->outputs.size()) {
      return keel::internal_error(std::string(fn) + ": the session returned " + std::to_string(outs.size()) +
                                  " outputs, expected " + std::to_string(session->outputs.size()));
    }
    for (size_t idx : pick) {
      keel::Tensor t = outs[idx];
      // An output that shares bytes with an input (the graph passes an input through) must not keep the caller's
      // wrapped memory, nor let a write to the output change the input: copy it.
      if (t.storage() && input_storage.count(t.storage().get())) {
        KEEL_ASSIGN_OR_RETURN(t, t.clone(), fn);
      }
      results.push_back(std::make_unique<keel_host_tensor_s>(keel_host_tensor_s{std::move(t)}));
    }
    return Status::ok();
  });
  if (status == nullptr) {
    for (size_t i = 0; i < results.size(); ++i) out_outputs[i] = results[i].release();
  }
  return status;
}

}  // namespace

KEEL_API keel_status_t keel_session_run(keel_session_t session, const char* const* input_names,
                                        const keel_host_tensor_t* inputs, size_t input_count,
                                        const char* const* output_names, keel_host_tensor_t* out_outputs,
                                        size_t output_count) {
  return session_run(__func__, session, nullptr, input_names, inputs, input_count, output_names, out_outputs,
                     output_count);
}

KEEL_API keel_status_t keel_session_run_with_options(keel_session_t session, keel_run_options_t run_options,
                                                     const char* const* input_names, const keel_host_tensor_t* inputs,
                                                     size_t input_count, const char* const* output_names,
                                                     keel_host_tensor_t* out_outputs, size_t output_count) {
  return session_run(__func__, session, run_options, input_names, inputs, input_count, output_names, out_outputs,
                     output_count);
}

KEEL_API keel_status_t keel_run_options_create(keel_run_options_t* out_options) {
  return guarded(__func__, [&]() -> Status {
    if (out_options == nullptr) return null_arg(__func__, "out_options");
    *out_options = nullptr;
    *out_options = new keel_run_options_s();
    return Status::ok();
  });
}

KEEL_API void keel_run_options_release(keel_run_options_t options) { delete options; }

KEEL_API keel_status_t keel_run_options_set_terminate(keel_run_options_t options, int32_t terminate) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    options->terminate.store(terminate != 0, std::memory_order_relaxed);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_run_options_set_timeout_us(keel_run_options_t options, int64_t timeout_us) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (timeout_us < 0) {
      return keel::invalid_argument(std::string(__func__) + ": timeout_us is negative (" + std::to_string(timeout_us) +
                                    ")");
    }
    options->timeout_us = timeout_us;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_run_options_set_log_tag(keel_run_options_t options, const char* tag) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    options->tag = tag != nullptr ? tag : "";
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_options_share_weights_with(keel_session_options_t options, keel_session_t other) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    options->share_with = other;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_memory_info(keel_session_t session, keel_session_memory_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    keel::SessionMemoryInfo m = session->session->memory_info();
    KEEL_C_SET(out, keel_session_memory_info_t, build_id, m.build_id);
    KEEL_C_SET(out, keel_session_memory_info_t, sessions_sharing, m.sessions_sharing);
    KEEL_C_SET(out, keel_session_memory_info_t, constant_bytes, m.constant_bytes);
    KEEL_C_SET(out, keel_session_memory_info_t, arena_sets, m.arena_sets);
    KEEL_C_SET(out, keel_session_memory_info_t, arena_bytes, m.arena_bytes);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_placement_count(keel_session_t session, size_t* out_count) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    if (out_count == nullptr) return null_arg(__func__, "out_count");
    *out_count = session->placement().size();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_placement_info(keel_session_t session, size_t index, keel_node_placement_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    const auto& rows = session->placement();
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, rows.size(), "placement"), "");
    const auto& p = rows[index];
    KEEL_C_SET(out, keel_node_placement_t, node, p.node.c_str());
    KEEL_C_SET(out, keel_node_placement_t, op_type, p.op_type.c_str());
    KEEL_C_SET(out, keel_node_placement_t, device_type, p.device_type.c_str());
    KEEL_C_SET(out, keel_node_placement_t, kernel, p.kernel.c_str());
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_fallback_count(keel_session_t session, size_t* out_count) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    if (out_count == nullptr) return null_arg(__func__, "out_count");
    *out_count = session->fallbacks.size();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_fallback_info(keel_session_t session, size_t index, keel_fallback_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, session->fallbacks.size(), "fallback"), "");
    const auto& f = session->fallbacks[index];
    KEEL_C_SET(out, keel_fallback_info_t, node, f.node.c_str());
    KEEL_C_SET(out, keel_fallback_info_t, op_type, f.op_type.c_str());
    KEEL_C_SET(out, keel_fallback_info_t, from_device, f.from.c_str());
    KEEL_C_SET(out, keel_fallback_info_t, to_device, f.to.c_str());
    KEEL_C_SET(out, keel_fallback_info_t, reason, f.reason.c_str());
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_profile_info(keel_session_t session, size_t index, keel_node_profile_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    auto prof = session->session->profile();
    const auto& rows = session->placement();
    KEEL_RETURN_IF_ERROR(check_index(__func__, index, std::min(prof.size(), rows.size()), "profile"), "");
    KEEL_C_SET(out, keel_node_profile_t, node, rows[index].node.c_str());
    KEEL_C_SET(out, keel_node_profile_t, total_ms, prof[index].total_ms);
    KEEL_C_SET(out, keel_node_profile_t, calls, prof[index].calls);
    KEEL_C_SET(out, keel_node_profile_t, step_count, prof[index].steps.size());
    session->profile = std::move(prof);
    session->profile_step_nodes.clear();
    for (const auto& p : session->profile) {
      auto& per_node = session->profile_step_nodes.emplace_back();
      for (const auto& st : p.steps) {
        auto& names = per_node.emplace_back();
        for (const auto& n : st.nodes) names.push_back(n.c_str());
      }
    }
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_profile_step_info(keel_session_t session, size_t index, size_t step,
                                                      keel_profile_step_info_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    KEEL_RETURN_IF_ERROR(
        check_index(__func__, index, session->profile.size(), "profile (call keel_session_profile_info first)"), "");
    const auto& steps = session->profile[index].steps;
    KEEL_RETURN_IF_ERROR(check_index(__func__, step, steps.size(), "profile step"), "");
    const auto& st = steps[step];
    const auto& names = session->profile_step_nodes[index][step];
    KEEL_C_SET(out, keel_profile_step_info_t, kind, st.kind.c_str());
    KEEL_C_SET(out, keel_profile_step_info_t, implementation, st.implementation.c_str());
    KEEL_C_SET(out, keel_profile_step_info_t, op_type, st.op_type.c_str());
    KEEL_C_SET(out, keel_profile_step_info_t, node_names, names.empty() ? nullptr : names.data());
    KEEL_C_SET(out, keel_profile_step_info_t, node_count, names.size());
    KEEL_C_SET(out, keel_profile_step_info_t, total_ms, st.total_ms);
    KEEL_C_SET(out, keel_profile_step_info_t, calls, st.calls);
    return Status::ok();
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Devices, plugins and logging from the host; model metadata; pipelines; the optimised graph
// ---------------------------------------------------------------------------------------------------------------

KEEL_API keel_status_t keel_environment_options_set_plugin_option(keel_environment_options_t options,
                                                                  const char* plugin, const char* key,
                                                                  const char* value) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (plugin == nullptr || *plugin == '\0') return null_arg(__func__, "plugin (or it is empty)");
    if (key == nullptr || *key == '\0') return null_arg(__func__, "key (or it is empty)");
    if (value == nullptr) return null_arg(__func__, "value");
    options->options.plugin_options[plugin][key] = value;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_environment_options_add_plugin_library(keel_environment_options_t options,
                                                                   const char* path) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (path == nullptr || *path == '\0') return null_arg(__func__, "path (or it is empty)");
    options->options.libraries.emplace_back(path);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_model_metadata(keel_model_t model, keel_model_metadata_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (model == nullptr) return null_arg(__func__, "model");
    return fill_model_meta(__func__, model->meta.get(), out);
  });
}

KEEL_API keel_status_t keel_model_custom_metadata(keel_model_t model, size_t index, const char** out_key,
                                                  const char** out_value) {
  return guarded(__func__, [&]() -> Status {
    if (model == nullptr) return null_arg(__func__, "model");
    return custom_meta(__func__, model->meta.get(), index, out_key, out_value);
  });
}

KEEL_API keel_status_t keel_model_custom_metadata_lookup(keel_model_t model, const char* key, const char** out_value) {
  return guarded(__func__, [&]() -> Status {
    if (out_value == nullptr) return null_arg(__func__, "out_value");
    *out_value = nullptr;
    if (model == nullptr) return null_arg(__func__, "model");
    if (key == nullptr) return null_arg(__func__, "key");
    if (model->meta) {
      for (const auto& [k, v] : model->meta->custom) {
        if (k == key) {
          *out_value = v.c_str();
          return Status::ok();
        }
      }
    }
    return keel::not_found(std::string(__func__) + ": the model has no custom metadata property '" + key + "'");
  });
}

KEEL_API keel_status_t keel_session_model_metadata(keel_session_t session, keel_model_metadata_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    return fill_model_meta(__func__, session->meta.get(), out);
  });
}

KEEL_API keel_status_t keel_session_custom_metadata(keel_session_t session, size_t index, const char** out_key,
                                                    const char** out_value) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    return custom_meta(__func__, session->meta.get(), index, out_key, out_value);
  });
}

KEEL_API keel_status_t keel_session_options_set_pipeline(keel_session_options_t options, const char* pipeline) {
  return guarded(__func__, [&]() -> Status {
    if (options == nullptr) return null_arg(__func__, "options");
    if (pipeline == nullptr) return null_arg(__func__, "pipeline");
    std::string p = pipeline;
    if (p != "auto" && p != "none") {
      return keel::invalid_argument(std::string(__func__) + ": pipeline '" + p + "' is neither \"auto\" nor \"none\"");
    }
    options->pipeline = p;
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_save_optimized_model(keel_session_t session, const char* path) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    if (path == nullptr || *path == '\0') return null_arg(__func__, "path (or it is empty)");
    keel::log::Scope log_scope(session->log_target);
    return keel::save_onnx(session->session->graph(), path).with_context(std::string(__func__) + " '" + path + "'");
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Device tensors and I/O binding
// ---------------------------------------------------------------------------------------------------------------

}  // extern "C"

namespace {

// Waits for the device work that produces `t` (a no-op when there is none).
Status wait_ready(const keel::DeviceTensor& t) { return t.ready ? t.ready->wait() : Status::ok(); }

// Copies between a device tensor and host memory, after the work that produces it.
Status device_host_copy(const char* fn, keel_device_tensor_t tensor, void* host, size_t byte_size, bool to_host) {
  if (tensor == nullptr) return null_arg(fn, "tensor");
  if (host == nullptr && byte_size > 0) return null_arg(fn, "data");
  const keel::Tensor& t = tensor->value.tensor;
  if (byte_size != t.byte_size()) {
    return keel::invalid_argument(std::string(fn) + ": byte_size is " + std::to_string(byte_size) + ", the tensor (" +
                                  t.describe() + ") has " + std::to_string(t.byte_size()));
  }
  KEEL_RETURN_IF_ERROR(wait_ready(tensor->value), fn);
  keel::Location at_host;
  if (to_host) return tensor->env->copy(host, at_host, t.raw_data(), t.location(), byte_size).with_context(fn);
  return tensor->env->copy(t.raw_data(), t.location(), host, at_host, byte_size).with_context(fn);
}

// Checks a tensor bound to input or output `name` of the session against the model's declaration.
Status check_binding(const char* fn, keel_session_t session, bool input, const std::string& name,
                     const keel::Tensor& t) {
  const auto& rows = input ? session->inputs : session->outputs;
  const char* what = input ? "input" : "output";
  auto it = std::find_if(rows.begin(), rows.end(), [&](const keel_session_s::ValueRow& r) { return r.name == name; });
  if (it == rows.end()) {
    std::string known;
    for (const auto& r : rows) known += (known.empty() ? "" : ", ") + r.name;
    return keel::invalid_argument(std::string(fn) + ": unknown " + what + " '" + name + "' (" + what + "s: " + known +
                                  ")");
  }
  if (it->dtype != KEEL_DTYPE_UNDEFINED && it->dtype != static_cast<int32_t>(t.dtype())) {
    return keel::invalid_argument(std::string(fn) + ": " + what + " '" + name + "' is " +
                                  keel::dtype_name(static_cast<DType>(it->dtype)) + ", the tensor bound to it is " +
                                  t.describe());
  }
  if (it->ndim >= 0) {
    bool ok = static_cast<size_t>(it->ndim) == t.shape().size();
    for (size_t i = 0; ok && i < t.shape().size(); ++i) ok = it->dims[i] < 0 || it->dims[i] == t.shape()[i];
    if (!ok) {
      return keel::invalid_argument(std::string(fn) + ": " + what + " '" + name + "' has shape " +
                                    keel::shape_to_string(it->dims) + ", the tensor bound to it is " + t.describe());
    }
  }
  return Status::ok();
}

// Holds a binding for one call (FAILED_PRECONDITION while a run uses it); released on scope exit.
class BindingUse {
 public:
  BindingUse(keel_io_binding_t b) : b_(b) { owned_ = b_ != nullptr && !b_->in_use.exchange(true); }
  ~BindingUse() {
    if (owned_) b_->in_use.store(false);
  }
  Status check(const char* fn) const {
    if (b_ == nullptr) return null_arg(fn, "binding");
    if (!owned_) {
      return Status(StatusCode::kFailedPrecondition,
                    std::string(fn) +
                        ": the binding is in use by another run (a binding belongs to one run at a "
                        "time: give each thread its own)");
    }
    return Status::ok();
  }

 private:
  keel_io_binding_t b_;
  bool owned_ = false;
};

// Replaces (or adds) the entry named `name` in `list`; forgets the last run's results (they describe other memory).
template <typename T>
void put(std::vector<T>& list, T entry) {
  for (auto& e : list) {
    if (e.name == entry.name) {
      e = std::move(entry);
      return;
    }
  }
  list.push_back(std::move(entry));
}

Status bind_output(const char* fn, keel_io_binding_t binding, const char* name, keel::BoundOutput out) {
  BindingUse use(binding);
  KEEL_RETURN_IF_ERROR(use.check(fn), "");
  if (name == nullptr) return null_arg(fn, "name");
  if (out.buffer.defined()) {
    KEEL_RETURN_IF_ERROR(check_binding(fn, binding->session, false, name, out.buffer), "");
  } else if (std::find_if(binding->session->outputs.begin(), binding->session->outputs.end(),
                          [&](const auto& r) { return r.name == name; }) == binding->session->outputs.end()) {
    return check_binding(fn, binding->session, false, name, keel::Tensor());
  }
  for (const auto& r : binding->results)
    if (r.ready) KEEL_RETURN_IF_ERROR(r.ready->wait(), fn);
  binding->results.clear();
  out.name = name;
  put(binding->outputs, std::move(out));
  return Status::ok();
}

Status bind_input(const char* fn, keel_io_binding_t binding, const char* name, keel::DeviceTensor value) {
  BindingUse use(binding);
  KEEL_RETURN_IF_ERROR(use.check(fn), "");
  if (name == nullptr) return null_arg(fn, "name");
  KEEL_RETURN_IF_ERROR(check_binding(fn, binding->session, true, name, value.tensor), "");
  put(binding->inputs, keel::BoundInput{name, std::move(value)});
  return Status::ok();
}

}  // namespace

extern "C" {

KEEL_API keel_status_t keel_device_tensor_create(keel_environment_t env, const char* device, int32_t dtype,
                                                 const int64_t* dims, int32_t ndim, keel_device_tensor_t* out_tensor) {
  return guarded(__func__, [&]() -> Status {
    if (out_tensor == nullptr) return null_arg(__func__, "out_tensor");
    *out_tensor = nullptr;
    if (env == nullptr) return null_arg(__func__, "env");
    if (device == nullptr) return null_arg(__func__, "device");
    KEEL_RETURN_IF_ERROR(check_dtype(__func__, dtype), "");
    keel::Shape shape;
    KEEL_RETURN_IF_ERROR(make_shape(__func__, dims, ndim, shape), "");
    const DType dt = static_cast<DType>(dtype);
    KEEL_ASSIGN_OR_RETURN(uint64_t bytes, keel::checked_byte_size(dt, shape), __func__);
    KEEL_ASSIGN_OR_RETURN(keel::DeviceSpec spec, env->env->device(device), __func__);
    // A device whose memory is host memory (the CPU, unified-memory devices) keeps its tensors in the host pool.
    keel::Location at{spec.type, spec.index};
    if (const keel::DeviceEntry* d = env->env->registry().device(spec.type);
        d == nullptr || keel::hal::Device(d, spec.index).host_memory()) {
      at = keel::Location{};
    }
    KEEL_ASSIGN_OR_RETURN(keel::CachingAllocator * alloc, env->env->allocator(at.device_type, at.device_index),
                          __func__);
    KEEL_ASSIGN_OR_RETURN(void* p, alloc->allocate(bytes), std::string(__func__) + " on " + spec.to_string());
    auto storage = std::make_shared<keel::Storage>(p, bytes, at, [alloc](void* q) { alloc->free(q); });
    auto handle = std::make_unique<keel_device_tensor_s>();
    handle->value.tensor = keel::Tensor(dt, shape, std::move(storage));
    handle->env = env->env.get();
    *out_tensor = handle.release();
    return Status::ok();
  });
}

KEEL_API void keel_device_tensor_release(keel_device_tensor_t tensor) {
  if (tensor == nullptr) return;
  try {
    (void)wait_ready(tensor->value);
  } catch (...) {
    // Nothing may leave.
  }
  delete tensor;
}

KEEL_API keel_status_t keel_device_tensor_copy_from_host(keel_device_tensor_t tensor, const void* data,
                                                         size_t byte_size) {
  return guarded(__func__, [&]() -> Status {
    return device_host_copy(__func__, tensor, const_cast<void*>(data), byte_size, false);
  });
}

KEEL_API keel_status_t keel_device_tensor_copy_to_host(keel_device_tensor_t tensor, void* data, size_t byte_size) {
  return guarded(__func__, [&]() -> Status { return device_host_copy(__func__, tensor, data, byte_size, true); });
}

KEEL_API keel_status_t keel_device_tensor_synchronize(keel_device_tensor_t tensor) {
  return guarded(__func__, [&]() -> Status {
    if (tensor == nullptr) return null_arg(__func__, "tensor");
    return wait_ready(tensor->value).with_context(__func__);
  });
}

KEEL_API int32_t keel_device_tensor_dtype(keel_device_tensor_t t) {
  return t ? static_cast<int32_t>(t->value.tensor.dtype()) : KEEL_DTYPE_UNDEFINED;
}
KEEL_API int32_t keel_device_tensor_ndim(keel_device_tensor_t t) {
  return t ? static_cast<int32_t>(t->value.tensor.rank()) : 0;
}
KEEL_API const int64_t* keel_device_tensor_dims(keel_device_tensor_t t) {
  return t && t->value.tensor.rank() > 0 ? t->value.tensor.shape().data() : nullptr;
}
KEEL_API uint64_t keel_device_tensor_byte_size(keel_device_tensor_t t) { return t ? t->value.tensor.byte_size() : 0; }
KEEL_API void* keel_device_tensor_data(keel_device_tensor_t t) { return t ? t->value.tensor.raw_data() : nullptr; }
KEEL_API const char* keel_device_tensor_device_type(keel_device_tensor_t t) {
  return t ? t->value.tensor.location().device_type.c_str() : nullptr;
}
KEEL_API int32_t keel_device_tensor_device_index(keel_device_tensor_t t) {
  return t ? t->value.tensor.location().device_index : 0;
}

KEEL_API keel_status_t keel_io_binding_create(keel_session_t session, keel_io_binding_t* out_binding) {
  return guarded(__func__, [&]() -> Status {
    if (out_binding == nullptr) return null_arg(__func__, "out_binding");
    *out_binding = nullptr;
    if (session == nullptr) return null_arg(__func__, "session");
    auto b = std::make_unique<keel_io_binding_s>();
    b->session = session;
    *out_binding = b.release();
    return Status::ok();
  });
}

KEEL_API void keel_io_binding_release(keel_io_binding_t binding) {
  if (binding == nullptr) return;
  try {
    delete binding;
  } catch (...) {
    // Nothing may leave.
  }
}

KEEL_API keel_status_t keel_io_binding_bind_input(keel_io_binding_t binding, const char* name,
                                                  keel_host_tensor_t tensor) {
  return guarded(__func__, [&]() -> Status {
    if (tensor == nullptr) return null_arg(__func__, "tensor");
    return bind_input(__func__, binding, name, keel::DeviceTensor{tensor->tensor, nullptr});
  });
}

KEEL_API keel_status_t keel_io_binding_bind_input_device(keel_io_binding_t binding, const char* name,
                                                         keel_device_tensor_t tensor) {
  return guarded(__func__, [&]() -> Status {
    if (tensor == nullptr) return null_arg(__func__, "tensor");
    return bind_input(__func__, binding, name, tensor->value);
  });
}

KEEL_API keel_status_t keel_io_binding_bind_output(keel_io_binding_t binding, const char* name,
                                                   keel_host_tensor_t tensor) {
  return guarded(__func__, [&]() -> Status {
    if (tensor == nullptr) return null_arg(__func__, "tensor");
    keel::BoundOutput out;
    out.buffer = tensor->tensor;
    return bind_output(__func__, binding, name, std::move(out));
  });
}

KEEL_API keel_status_t keel_io_binding_bind_output_device(keel_io_binding_t binding, const char* name,
                                                          keel_device_tensor_t tensor) {
  return guarded(__func__, [&]() -> Status {
    if (tensor == nullptr) return null_arg(__func__, "tensor");
    // The memory may still be written by the run that produced it: wait before another run writes it.
    KEEL_RETURN_IF_ERROR(wait_ready(tensor->value), __func__);
    keel::BoundOutput out;
    out.buffer = tensor->value.tensor;
    return bind_output(__func__, binding, name, std::move(out));
  });
}

KEEL_API keel_status_t keel_io_binding_bind_output_to_device(keel_io_binding_t binding, const char* name,
                                                             const char* device) {
  return guarded(__func__, [&]() -> Status {
    if (device == nullptr) return null_arg(__func__, "device");
    if (binding == nullptr) return null_arg(__func__, "binding");
    KEEL_ASSIGN_OR_RETURN(keel::DeviceSpec spec, binding->session->env->device(device),
                          std::string(__func__) + ": output '" + (name ? name : "") + "'");
    keel::BoundOutput out;
    out.device = spec.to_string();
    return bind_output(__func__, binding, name, std::move(out));
  });
}

KEEL_API keel_status_t keel_io_binding_clear(keel_io_binding_t binding) {
  return guarded(__func__, [&]() -> Status {
    BindingUse use(binding);
    KEEL_RETURN_IF_ERROR(use.check(__func__), "");
    for (const auto& r : binding->results)
      if (r.ready) KEEL_RETURN_IF_ERROR(r.ready->wait(), __func__);
    binding->results.clear();
    binding->inputs.clear();
    binding->outputs.clear();
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_session_run_with_binding(keel_session_t session, keel_run_options_t run_options,
                                                     keel_io_binding_t binding) {
  keel::log::Scope log_scope(session != nullptr ? session->log_target : nullptr);
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    BindingUse use(binding);
    KEEL_RETURN_IF_ERROR(use.check(__func__), "");
    if (binding->session != session) {
      return keel::invalid_argument(std::string(__func__) + ": the binding was made for another session");
    }
    keel::RunOptions ro;
    if (run_options != nullptr) {
      ro.terminate = &run_options->terminate;
      if (run_options->timeout_us > 0)
        ro.deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(run_options->timeout_us);
      ro.tag = run_options->tag;
    }
    // Preallocated memory is written again by this run, maybe on other streams (another run slot): the previous
    // run's device work on it must be done. Memory a run allocated for an output left on a device is not reused
    // before the work on it is (the pools hand it out again only on the stream that wrote it): no wait for that.
    for (size_t i = 0; i < binding->results.size() && i < binding->outputs.size(); ++i)
      if (binding->results[i].ready && binding->outputs[i].buffer.defined())
        KEEL_RETURN_IF_ERROR(binding->results[i].ready->wait(), __func__);
    binding->results.clear();
    KEEL_ASSIGN_OR_RETURN(binding->results, session->session->run_bound(binding->inputs, binding->outputs, ro),
                          __func__);
    return Status::ok();
  });
}

KEEL_API keel_status_t keel_io_binding_output(keel_io_binding_t binding, const char* name,
                                              keel_device_tensor_t* out_tensor) {
  return guarded(__func__, [&]() -> Status {
    if (out_tensor == nullptr) return null_arg(__func__, "out_tensor");
    *out_tensor = nullptr;
    BindingUse use(binding);
    KEEL_RETURN_IF_ERROR(use.check(__func__), "");
    if (name == nullptr) return null_arg(__func__, "name");
    for (size_t i = 0; i < binding->outputs.size() && i < binding->results.size(); ++i) {
      if (binding->outputs[i].name != name) continue;
      auto handle = std::make_unique<keel_device_tensor_s>();
      handle->value = binding->results[i];
      handle->env = binding->session->env;
      *out_tensor = handle.release();
      return Status::ok();
    }
    return keel::not_found(std::string(__func__) + ": output '" + name +
                           "' has no result (not bound, or no run has succeeded since it was bound)");
  });
}

KEEL_API keel_status_t keel_session_copy_stats(keel_session_t session, keel_session_copy_stats_t* out) {
  return guarded(__func__, [&]() -> Status {
    if (session == nullptr) return null_arg(__func__, "session");
    KEEL_RETURN_IF_ERROR(check_out_struct(__func__, out, out ? out->struct_size : 0), "");
    keel::SessionCopyStats c = session->session->copy_stats();
    KEEL_C_SET(out, keel_session_copy_stats_t, host_to_device, c.host_to_device);
    KEEL_C_SET(out, keel_session_copy_stats_t, device_to_host, c.device_to_host);
    KEEL_C_SET(out, keel_session_copy_stats_t, device_to_device, c.device_to_device);
    KEEL_C_SET(out, keel_session_copy_stats_t, host_to_host, c.host_to_host);
    KEEL_C_SET(out, keel_session_copy_stats_t, bytes, c.bytes);
    return Status::ok();
  });
}

}  // extern "C"
