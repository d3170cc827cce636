/*
 * keel/keel.h — the C API for host applications that embed Keel.
 *
 * A host application creates one environment (plugin discovery, logging, threads), loads models (ONNX, from a file
 * or from memory), creates sessions from them (preferred devices, fallback, passes) and runs those with named host
 * tensors. Nothing here is C++: the header needs only <stdint.h> and <stddef.h> (through <keel/plugin.h>, whose
 * status, dtype and log-level definitions it shares, so that one status type exists on both sides of Keel).
 *
 * Rules that hold for every function here:
 *  - Handles are opaque pointers. Each `*_create` / `*_load_*` / `*_wrap` has a matching `*_release`; releasing NULL
 *    is a no-op. A handle must not be used after its release.
 *  - Functions that can fail return a keel_status_t: NULL means OK; otherwise the caller owns the status object and
 *    releases it exactly once with keel_status_release (it carries `code`, a keel_status_code_t, and `message`).
 *    On failure every `out_` parameter is left NULL / 0, and nothing else changed. No exception, abort or longjmp
 *    leaves the library on bad input.
 *  - Strings passed in are NUL-terminated UTF-8 and are copied when they must outlive the call. Strings handed out
 *    (`const char*` results and struct members) are owned by the object they came from and stay valid until that
 *    object is released, unless stated otherwise.
 *  - Structs filled by the library (`keel_*_info_t`, `keel_memory_stats_t`) start with `struct_size`: the caller
 *    sets it to sizeof as it compiled the struct, and the library writes only the members that size covers, so an
 *    older application keeps working with a newer library.
 *  - Thread-safety is stated per function. In short: an environment, a model and a session may be shared between
 *    threads (keel_session_run may be called concurrently on one session, and such runs proceed in parallel);
 *    option objects and tensors are thread-compatible (concurrent reads are fine, a write needs exclusive access),
 *    except a run options object's terminate flag, which any thread may set at any time.
 *  - Speed across threads: the CPU kernels run on GNU OpenMP (Debian's oneDNN). Every thread that runs a session of
 *    more than one thread keeps a team of OpenMP threads for the rest of its life, and once a process holds more of
 *    them than cores, every parallel region sleeps and wakes instead of spinning (a served MobileNetV2 ran at half
 *    speed that way). Run a multi-threaded session from one thread, or a fixed few (as `keel serve` does: one worker
 *    thread per instance); callers from a large pool are better served by sessions of one thread each.
 *  - Lifetimes: sessions must be released before the environment they were created in; models and tensors are
 *    independent of both.
 */
#ifndef KEEL_KEEL_H_
#define KEEL_KEEL_H_

#include <keel/plugin.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header. keel_version_get gives the library's (they may differ: a newer library of the same
 * major runs applications built against an older header). */
#define KEEL_VERSION_MAJOR 0
#define KEEL_VERSION_MINOR 1
#define KEEL_VERSION_PATCH 0
#define KEEL_VERSION_STRING "0.1.0"

/* Every function of this API is exported from libkeel (also when the library is built with hidden visibility). */
#if defined(_WIN32)
#if defined(KEEL_BUILDING_LIBRARY)
#define KEEL_API __declspec(dllexport)
#else
#define KEEL_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define KEEL_API __attribute__((visibility("default")))
#else
#define KEEL_API
#endif

/* ------------------------------------------------------------------------------------------------------------ */
/* Versions and status helpers                                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */

/* The library's version, "MAJOR.MINOR.PATCH". Static storage; thread-safe. */
KEEL_API const char* keel_version_string(void);
/* The library's version numbers; any out pointer may be NULL. Thread-safe. */
KEEL_API void keel_version_get(int32_t* out_major, int32_t* out_minor, int32_t* out_patch);
/* The plugin ABI (KEEL_PLUGIN_ABI_MAJOR/MINOR) the library was built with; any out pointer may be NULL. */
KEEL_API void keel_plugin_abi_version_get(int32_t* out_major, int32_t* out_minor);
/* "OK", "INVALID_ARGUMENT", ... for a keel_status_code_t; "UNKNOWN" otherwise. Static storage; thread-safe. */
KEEL_API const char* keel_status_code_name(int32_t code);
/* "f32", "i64", ... for a keel_dtype_t; "undefined" for unknown values. Static storage; thread-safe. */
KEEL_API const char* keel_dtype_name(int32_t dtype);
/* Bytes per element of a keel_dtype_t; 0 for undefined, string and unknown values. Thread-safe. */
KEEL_API size_t keel_dtype_size(int32_t dtype);

/* ------------------------------------------------------------------------------------------------------------ */
/* Environment                                                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_environment_s* keel_environment_t;
typedef struct keel_environment_options_s* keel_environment_options_t;

/*
 * Receives Keel's log messages (plugin discovery, fallbacks, pass reports, warnings, plugins' messages) at
 * `min_level` and above. `level` is a keel_log_level_t; `message` is valid during the call only. Called from
 * whichever thread logs, one call at a time per environment; it must not call back into Keel.
 * The log is per environment: an environment's callback receives the messages of that environment (its plugin
 * loading, the sessions created in it, their runs, its plugins' messages) and no other; those messages go nowhere
 * else (not to the console, not to any spdlog logger of the process), and Keel neither adds sinks to nor changes
 * any logger of the host's. An environment without a callback logs to the console (spdlog's default logger).
 */
typedef void (*keel_log_callback_t)(void* user_data, int32_t level, const char* message);

/* New environment options with the defaults: discover plugins, no extra plugin paths, all cores, no callback.
 * The caller owns *out_options (keel_environment_options_release). Thread-compatible. */
KEEL_API keel_status_t keel_environment_options_create(keel_environment_options_t* out_options);
KEEL_API void keel_environment_options_release(keel_environment_options_t options);
/* Adds a directory searched for *.keel-plugin.toml before $KEEL_PLUGIN_PATH, ~/.local/lib/keel/plugins and
 * <prefix>/lib/keel/plugins (the path is copied; directories are searched in the order added). */
KEEL_API keel_status_t keel_environment_options_add_plugin_path(keel_environment_options_t options, const char* path);
/* 0: load no plugin at all, only the built-in reference CPU device. Default 1. */
KEEL_API keel_status_t keel_environment_options_set_discover_plugins(keel_environment_options_t options,
                                                                     int32_t discover);
/* Kernel worker threads, the caller included; 0 (default) = every core. Negative: INVALID_ARGUMENT. */
KEEL_API keel_status_t keel_environment_options_set_threads(keel_environment_options_t options, int32_t threads);
/* Sets (or, with callback NULL, clears) the log callback and the lowest level it receives (keel_log_level_t).
 * `user_data` is passed back unchanged and must stay valid until the environment is released. */
KEEL_API keel_status_t keel_environment_options_set_log_callback(keel_environment_options_t options,
                                                                 keel_log_callback_t callback, void* user_data,
                                                                 int32_t min_level);

/* Creates an environment: the reference CPU device, then every plugin found (a plugin that cannot be used is
 * recorded with its reason, never fatal). `options` may be NULL (defaults) and may be released right after.
 * The caller owns *out_env (keel_environment_release). Thread-safe. */
KEEL_API keel_status_t keel_environment_create(keel_environment_options_t options, keel_environment_t* out_env);
/* Releases the environment: its memory pools, then its plugins. Every session created in it must have been
 * released. Not concurrently with any other use of `env`. */
KEEL_API void keel_environment_release(keel_environment_t env);

typedef enum keel_plugin_state_e {
  KEEL_PLUGIN_STATE_LOADED = 0,  /* in use */
  KEEL_PLUGIN_STATE_SKIPPED = 1, /* not used, for a reason that is not a bug of the plugin (no device, duplicate) */
  KEEL_PLUGIN_STATE_FAILED = 2,  /* the plugin or its manifest is broken; `reason` says how */
} keel_plugin_state_t;

typedef struct keel_plugin_info_s {
  uint32_t struct_size; /* set by the caller: sizeof(keel_plugin_info_t) */
  const char* name;
  const char* kind; /* "device", "collective", "pass" ("" when unknown) */
  const char* version;
  const char* vendor;
  int32_t state;        /* keel_plugin_state_t */
  const char* reason;   /* "" when loaded */
  const char* manifest; /* absolute path; "" for built-ins */
  const char* library;  /* absolute path; "(built-in)" for built-ins */
  int32_t priority;
} keel_plugin_info_t;

typedef struct keel_device_info_s {
  uint32_t struct_size;    /* set by the caller: sizeof(keel_device_info_t) */
  const char* device_type; /* "cpu", "cuda", ... */
  int32_t device_index;
  const char* plugin;    /* the plugin that provides the device type */
  const char* name;      /* from the device's properties, e.g. "NVIDIA H200" ("" when unknown) */
  uint64_t total_memory; /* bytes; 0 when unknown */
  uint64_t capabilities; /* KEEL_DEVICE_CAP_* bits */
  /* (appended) The rest of the device's properties, as its plugin reports them when the environment is created. */
  uint64_t free_memory;  /* bytes free when the environment was created; 0 when unknown */
  int32_t compute_major; /* vendor-defined version, e.g. the CUDA compute capability 9.0; 0 when unknown */
  int32_t compute_minor;
  int32_t multiprocessors; /* cores or SMs; 0 when unknown */
} keel_device_info_t;

/* Plugins found by the environment, in search order (the reference CPU device first). Strings live as long as
 * `env`. Thread-safe. INVALID_ARGUMENT for a bad handle, OUT_OF_RANGE for index >= count. */
KEEL_API keel_status_t keel_environment_plugin_count(keel_environment_t env, size_t* out_count);
KEEL_API keel_status_t keel_environment_plugin_info(keel_environment_t env, size_t index, keel_plugin_info_t* out_info);
/* Devices (one entry per device type and index), best device type first. Same rules as the plugin list. */
KEEL_API keel_status_t keel_environment_device_count(keel_environment_t env, size_t* out_count);
KEEL_API keel_status_t keel_environment_device_info(keel_environment_t env, size_t index, keel_device_info_t* out_info);

/* Memory of one device's pool, in bytes. */
typedef struct keel_memory_stats_s {
  uint32_t struct_size;    /* set by the caller: sizeof(keel_memory_stats_t) */
  uint64_t in_use_bytes;   /* handed out and not yet freed */
  uint64_t reserved_bytes; /* held from the device (in use + cached) */
  uint64_t peak_in_use_bytes;
  uint64_t peak_reserved_bytes;
  uint64_t allocations; /* successful allocations */
  uint64_t cache_hits;  /* of those, served from the cache */
} keel_memory_stats_t;

/* Statistics of the pool of (device_type, device_index); all zero when nothing was allocated there yet.
 * NOT_FOUND for an unknown device type, OUT_OF_RANGE for an index past the devices present. Thread-safe. */
KEEL_API keel_status_t keel_environment_memory_stats(keel_environment_t env, const char* device_type,
                                                     int32_t device_index, keel_memory_stats_t* out_stats);
/* Gives cached, unused memory of every pool back to its device; *out_released_bytes (may be NULL) gets how much.
 * Thread-safe. */
KEEL_API keel_status_t keel_environment_memory_trim(keel_environment_t env, uint64_t* out_released_bytes);

/* ------------------------------------------------------------------------------------------------------------ */
/* Tensors (dense, row-major, in host memory)                                                                    */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_host_tensor_s* keel_host_tensor_t;

/* A new tensor owning a copy of `data` (`byte_size` must equal the element count times the dtype's size; `data`
 * NULL: zero-filled, byte_size ignored). `dims` holds `ndim` non-negative entries (ndim 0: a scalar; dims may then
 * be NULL). The caller owns *out_tensor. Thread-safe. */
KEEL_API keel_status_t keel_host_tensor_create(int32_t dtype, const int64_t* dims, int32_t ndim, const void* data,
                                               size_t byte_size, keel_host_tensor_t* out_tensor);
/* A tensor over caller memory, without a copy. The caller keeps `data` alive and unchanged until the tensor is
 * released and every keel_session_run that received it has returned (runs never keep it: outputs that would alias
 * it are copied). `data` must be aligned to the dtype's size. The caller owns *out_tensor. Thread-safe. */
KEEL_API keel_status_t keel_host_tensor_wrap(int32_t dtype, const int64_t* dims, int32_t ndim, void* data,
                                             size_t byte_size, keel_host_tensor_t* out_tensor);
/* Releases the handle (and the bytes of a created tensor; a wrapped tensor's memory stays the caller's).
 * Not concurrently with other uses of `tensor`. */
KEEL_API void keel_host_tensor_release(keel_host_tensor_t tensor);

/* Inspection (0 / NULL for a NULL handle). `dims` and `data` stay valid until the tensor is released. Concurrent
 * calls are safe. */
KEEL_API int32_t keel_host_tensor_dtype(keel_host_tensor_t tensor); /* keel_dtype_t */
KEEL_API int32_t keel_host_tensor_ndim(keel_host_tensor_t tensor);
KEEL_API const int64_t* keel_host_tensor_dims(keel_host_tensor_t tensor); /* ndim entries (NULL for a scalar) */
KEEL_API int64_t keel_host_tensor_element_count(keel_host_tensor_t tensor);
KEEL_API void* keel_host_tensor_data(keel_host_tensor_t tensor);
KEEL_API uint64_t keel_host_tensor_byte_size(keel_host_tensor_t tensor);

/* ------------------------------------------------------------------------------------------------------------ */
/* Models                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_model_s* keel_model_t;

/* Loads an ONNX model (validated, older opsets upgraded, shapes inferred). External data resolves against the
 * file's directory. NOT_FOUND for a missing file, INVALID_ARGUMENT (naming the file and node) for a malformed
 * model, UNIMPLEMENTED for content Keel cannot hold. The caller owns *out_model. Thread-safe. */
KEEL_API keel_status_t keel_model_load_from_file(const char* path, keel_model_t* out_model);
/* The same from `size` bytes at `data` (copied as needed; the caller may free them after the call). External data
 * is refused. Thread-safe. */
KEEL_API keel_status_t keel_model_load_from_memory(const void* data, size_t size, keel_model_t* out_model);
/* Releases the model. Sessions created from it do not need it (they hold their own copy). */
KEEL_API void keel_model_release(keel_model_t model);

/* ------------------------------------------------------------------------------------------------------------ */
/* Sessions                                                                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_session_s* keel_session_t;
typedef struct keel_session_options_s* keel_session_options_t;

typedef enum keel_fallback_e {
  KEEL_FALLBACK_CPU = 0,   /* nodes the preferred devices cannot run go to the CPU (each reported once) */
  KEEL_FALLBACK_ERROR = 1, /* such a node fails session creation, naming the node and the reason */
} keel_fallback_t;

/* New session options with the defaults: every device by priority, fallback to the CPU, the "auto" pipeline (see
 * keel_session_options_set_pipeline) and no further passes, no profile, up to 8 shape variants.
 * The caller owns *out_options. Thread-compatible. */
KEEL_API keel_status_t keel_session_options_create(keel_session_options_t* out_options);
KEEL_API void keel_session_options_release(keel_session_options_t options);
/* Appends a preferred device, the first added the most preferred: a type ("cuda", "cpu": index 0) or TYPE:INDEX
 * ("cuda:1"). A session uses one device of each type. INVALID_ARGUMENT for a malformed spec ("cuda:x", "cuda:-1");
 * whether the device exists is checked by keel_session_create (NOT_FOUND for an unknown type, OUT_OF_RANGE for an
 * index past the devices of that type). Thread-compatible (one options object per thread at a time). */
KEEL_API keel_status_t keel_session_options_add_device(keel_session_options_t options, const char* device_type);
/* KEEL_FALLBACK_CPU (default) or KEEL_FALLBACK_ERROR; anything else: INVALID_ARGUMENT. */
KEEL_API keel_status_t keel_session_options_set_fallback(keel_session_options_t options, int32_t fallback);
/* Appends a graph pass to run before placement, by name ("fold_constants", ...), in order, after the pipeline's
 * (keel_session_options_set_pipeline "none" runs exactly the passes added here). */
KEEL_API keel_status_t keel_session_options_add_pass(keel_session_options_t options, const char* pass_name);
/* Threads for this session's kernels: 0 (default) shares the environment's pool; another count gives the session
 * a pool of its own, created with the session and joined when it is released. Negative: INVALID_ARGUMENT. */
KEEL_API keel_status_t keel_session_options_set_threads(keel_session_options_t options, int32_t threads);
/* 1: collect per-node timings (keel_session_profile_info). Default 0. */
KEEL_API keel_status_t keel_session_options_set_profile(keel_session_options_t options, int32_t profile);
/* Shape specialisation for models whose inputs have dynamic dims (a symbolic batch or sequence length): a run whose
 * dynamic inputs have shapes not seen before builds the graph again with those dims fixed (placement, claims,
 * kernels, memory plan), so that devices which only fuse static shapes (the oneDNN chains) take it; later runs with
 * those shapes reuse it. At most `count` such variants are kept (default 8; each holds its own kernels and arena);
 * runs with further shapes use the graph as created. 0 turns it off. Models with static inputs are not affected.
 * Negative: INVALID_ARGUMENT. */
KEEL_API keel_status_t keel_session_options_set_shape_variants(keel_session_options_t options, int32_t count);

/* Creates a session: passes, placement, kernel instances, memory plan. `model` is copied (it may be released right
 * after), `options` may be NULL (defaults) and may be released right after. NOT_FOUND for an unavailable device
 * type; with KEEL_FALLBACK_ERROR, UNIMPLEMENTED naming the first node the devices cannot run. The caller owns
 * *out_session; release it before `env`. Thread-safe. */
KEEL_API keel_status_t keel_session_create(keel_environment_t env, keel_model_t model, keel_session_options_t options,
                                           keel_session_t* out_session);
/* Not concurrently with any other use of `session` (in particular no run may be in progress). */
KEEL_API void keel_session_release(keel_session_t session);

/* A graph input or output as the model declares it. */
typedef struct keel_value_info_s {
  uint32_t struct_size; /* set by the caller: sizeof(keel_value_info_t) */
  const char* name;
  int32_t dtype;       /* keel_dtype_t; KEEL_DTYPE_UNDEFINED when unknown */
  int32_t ndim;        /* -1 when the rank is unknown */
  const int64_t* dims; /* ndim entries, -1 for a dynamic dim (NULL when ndim <= 0) */
} keel_value_info_t;

/* The session's inputs and outputs, in the model's order. Strings and dims live as long as the session.
 * Thread-safe. OUT_OF_RANGE for index >= count. */
KEEL_API keel_status_t keel_session_input_count(keel_session_t session, size_t* out_count);
KEEL_API keel_status_t keel_session_input_info(keel_session_t session, size_t index, keel_value_info_t* out_info);
KEEL_API keel_status_t keel_session_output_count(keel_session_t session, size_t* out_count);
KEEL_API keel_status_t keel_session_output_info(keel_session_t session, size_t index, keel_value_info_t* out_info);

/*
 * Runs the session. Inputs are bound by name (`input_count` pairs; every model input must be given; the tensors are
 * only read). Outputs: `output_names` lists the outputs wanted, in the order wanted (NULL: every output, in model
 * order, and then `output_count` must equal keel_session_output_count). On success out_outputs[i] are new tensors
 * owned by the caller (release each); on failure they are all NULL. INVALID_ARGUMENT names a missing, unknown or
 * mis-typed input, or an unknown output.
 * Thread-safe: concurrent calls on one session are allowed and proceed in parallel, each with its own activation
 * memory (a kernel that a plugin does not declare re-entrant is run by one of them at a time, the others going on
 * with other nodes meanwhile; see plugin.h, KEEL_KERNEL_FLAG_REENTRANT). Outputs are equal to those of the same runs
 * made one at a time. The input tensors must not be written while a run reads them.
 */
KEEL_API keel_status_t keel_session_run(keel_session_t session, const char* const* input_names,
                                        const keel_host_tensor_t* inputs, size_t input_count,
                                        const char* const* output_names, keel_host_tensor_t* out_outputs,
                                        size_t output_count);

/* Where one node runs, in execution order (copies the core inserted between devices appear as op "Copy"). */
typedef struct keel_node_placement_s {
  uint32_t struct_size; /* set by the caller: sizeof(keel_node_placement_t) */
  const char* node;
  const char* op_type;
  const char* device_type; /* "cpu", "cuda", ... */
  const char* kernel;      /* the kernel's name */
} keel_node_placement_t;

/* A node that could not run on the preferred device, and why (reported once per node). */
typedef struct keel_fallback_info_s {
  uint32_t struct_size; /* set by the caller: sizeof(keel_fallback_info_t) */
  const char* node;
  const char* op_type;
  const char* from_device; /* the preferred device type */
  const char* to_device;   /* where it went */
  const char* reason;
} keel_fallback_info_t;

/* Placement: that of the most recent run (for a model with dynamic input dims, the shape variant it ran; before
 * the first run, and for static models, as decided at creation). Fallbacks: as decided at creation. Strings live as
 * long as the session. Thread-safe (a run on another thread may change which placement the next call sees). */
KEEL_API keel_status_t keel_session_placement_count(keel_session_t session, size_t* out_count);
KEEL_API keel_status_t keel_session_placement_info(keel_session_t session, size_t index,
                                                   keel_node_placement_t* out_info);
KEEL_API keel_status_t keel_session_fallback_count(keel_session_t session, size_t* out_count);
KEEL_API keel_status_t keel_session_fallback_info(keel_session_t session, size_t index, keel_fallback_info_t* out_info);

/* Per-node timings collected so far (only with keel_session_options_set_profile). Indices are those of the
 * placement list (the most recent run's); the node strings are the placement's. Safe while runs are in progress (the
 * counters are read under the session's lock; runs still going are not counted yet); not concurrently with another
 * keel_session_profile_info or keel_session_profile_step_info call on the session (they share its snapshot). */
typedef struct keel_node_profile_s {
  uint32_t struct_size; /* set by the caller: sizeof(keel_node_profile_t) */
  const char* node;
  double total_ms;
  int64_t calls;
  /* (plugin ABI 1.3) Steps the node's kernel reported inside it (a claimed subgraph: one per oneDNN primitive),
   * read with keel_session_profile_step_info; 0 when it reports none. */
  size_t step_count;
} keel_node_profile_t;
KEEL_API keel_status_t keel_session_profile_info(keel_session_t session, size_t index, keel_node_profile_t* out_info);

/* (plugin ABI 1.3) One step reported inside placement entry `index` (step < its step_count), summed over the runs
 * like the node's total. Reads the profile as the last keel_session_profile_info call on this session saw it; the
 * strings live until the next keel_session_profile_info call or the session's release. Safe while runs are in
 * progress; not concurrently with keel_session_profile_info on the session. */
typedef struct keel_profile_step_info_s {
  uint32_t struct_size;          /* set by the caller: sizeof(keel_profile_step_info_t) */
  const char* kind;              /* what ran, e.g. "convolution", "reorder" */
  const char* implementation;    /* e.g. "brg:avx512_core"; "" when not reported */
  const char* op_type;           /* the ONNX op type it computes; "" for the kernel's own work (a layout reorder) */
  const char* const* node_names; /* the graph nodes it computes: the op_type node first, nodes fused into it after */
  size_t node_count;
  double total_ms;
  int64_t calls;
} keel_profile_step_info_t;
KEEL_API keel_status_t keel_session_profile_step_info(keel_session_t session, size_t index, size_t step,
                                                      keel_profile_step_info_t* out_info);

/* ---- Device indices (appended) ---------------------------------------------------------------------------- */

/* Appends a preferred device by type and index (device_type "cuda", device_index 1 = "cuda:1"), like
 * keel_session_options_add_device. INVALID_ARGUMENT for a NULL or malformed type (it must not contain ':') or a
 * negative index; keel_session_create checks that the device exists (NOT_FOUND / OUT_OF_RANGE naming the device and
 * how many of that type there are). The options keep a copy of the string. Thread-compatible. */
KEEL_API keel_status_t keel_session_options_add_device_index(keel_session_options_t options, const char* device_type,
                                                             int32_t device_index);

/* ---- Run options, shared weights (appended) --------------------------------------------------------------- */

typedef struct keel_run_options_s* keel_run_options_t;

/* New run options: no terminate flag set, no timeout, no log tag. One object may serve many runs, also concurrent
 * ones. The caller owns *out_options (keel_run_options_release, once no run uses it). Thread-safe. */
KEEL_API keel_status_t keel_run_options_create(keel_run_options_t* out_options);
KEEL_API void keel_run_options_release(keel_run_options_t options);
/* Sets (1) or clears (0) the terminate flag. While it is set, every run using these options stops before its next
 * node (within about one node's time: a subgraph that a device claimed counts as one node, and so does a control-flow
 * node, whose body is not interrupted) with KEEL_STATUS_CANCELLED, and a run started with it set stops before its
 * first node; the session stays usable (clear the flag, or use other options, for the next run). Thread-safe: any
 * thread may call it at any time, also while runs using the options are in progress (as ORT's RunOptionsSetTerminate).
 */
KEEL_API keel_status_t keel_run_options_set_terminate(keel_run_options_t options, int32_t terminate);
/* A deadline for each run using these options, `timeout_us` microseconds after the run starts: a run still going
 * then stops before its next node with KEEL_STATUS_DEADLINE_EXCEEDED. 0 (default) = none; negative:
 * INVALID_ARGUMENT. Thread-compatible (not while a run uses the options). */
KEEL_API keel_status_t keel_run_options_set_timeout_us(keel_run_options_t options, int64_t timeout_us);
/* A tag naming the runs in their error messages ("run 'TAG': ...") and in Keel's log (debug: each run's time or
 * failure). NULL or "" = none. The string is copied. Thread-compatible (not while a run uses the options). */
KEEL_API keel_status_t keel_run_options_set_log_tag(keel_run_options_t options, const char* tag);

/* keel_session_run with run options (`run_options` NULL: as keel_session_run). The run reads the timeout and tag
 * when it starts and the terminate flag before every node. KEEL_STATUS_CANCELLED / KEEL_STATUS_DEADLINE_EXCEEDED
 * when the options stopped it (every out_outputs[i] NULL, nothing else changed). Thread-safe, as keel_session_run. */
KEEL_API keel_status_t keel_session_run_with_options(keel_session_t session, keel_run_options_t run_options,
                                                     const char* const* input_names, const keel_host_tensor_t* inputs,
                                                     size_t input_count, const char* const* output_names,
                                                     keel_host_tensor_t* out_outputs, size_t output_count);

/* Makes keel_session_create share `other`'s prepared model (placement, kernel instances with the weights they
 * prepacked, shape variants, activation plans) instead of preparing it again: one copy of the weights for every
 * session sharing it (as ONNX Runtime's prepacked-weights container), each run still with activation memory of its
 * own. keel_session_create then checks that its model is the same as other's (structure, attributes and weights,
 * by a digest) and that the options which shape the build (devices, fallback, passes, shape variants) equal other's
 * (INVALID_ARGUMENT naming what differs); threads and profile stay this session's own (profile counters are the
 * shared build's). `other` (NULL: no sharing) must stay alive until keel_session_create returns; afterwards the two
 * sessions are released independently, in any order. Thread-compatible. */
KEEL_API keel_status_t keel_session_options_share_weights_with(keel_session_options_t options, keel_session_t other);

/* What a session holds in memory. */
typedef struct keel_session_memory_info_s {
  uint32_t struct_size;      /* set by the caller: sizeof(keel_session_memory_info_t) */
  uint64_t build_id;         /* equal for sessions that share one prepared model */
  uint64_t sessions_sharing; /* sessions holding that prepared model (1: this one alone) */
  uint64_t constant_bytes;   /* the model's initializers the prepared model holds (each buffer counted once) */
  uint64_t arena_sets;       /* activation arena sets made: at most the runs ever in progress at once */
  uint64_t arena_bytes; /* their bytes, all sets (they come from the device pools: keel_environment_memory_stats) */
} keel_session_memory_info_t;
/* Fills `out_info` (members its struct_size covers). Thread-safe. */
KEEL_API keel_status_t keel_session_memory_info(keel_session_t session, keel_session_memory_info_t* out_info);

/* ---- Devices, plugins and logging from the host (appended) ----------------------------------------------- */

/* Sets option `key` of plugin `plugin` (its manifest's name) to `value`, merged over the manifest's [options] (the
 * host's value wins). The text is converted to the type the manifest gives the key (integer, float, boolean as
 * true/false/1/0/yes/no/on/off, string, or a comma-separated list of strings); a key the manifest lacks becomes an
 * integer, a float, a boolean or a string, whichever the text reads as. A value that does not convert makes that
 * plugin fail to load, with a reason naming the option (keel_environment_plugin_info); options for a plugin that is
 * not found are logged as a warning. Setting a key again replaces it. Strings are copied. INVALID_ARGUMENT for NULL or
 * empty plugin / key, NULL value. Thread-compatible. */
KEEL_API keel_status_t keel_environment_options_set_plugin_option(keel_environment_options_t options,
                                                                  const char* plugin, const char* key,
                                                                  const char* value);
/* Loads one plugin library by path when the environment is created, before the search directories (so it wins
 * over a discovered plugin of the same name): with the manifest beside it that names it, if there is one, else with
 * a minimal manifest made from its descriptor (the descriptor's name, kind and version; priority 0; no options but
 * the host's). A path to a *.keel-plugin.toml loads that manifest. Libraries load in the order added; a library that
 * cannot be used is recorded with its reason, as a discovered one (never fatal). Also with discovery off
 * (keel_environment_options_set_discover_plugins 0). The path is copied. Thread-compatible. */
KEEL_API keel_status_t keel_environment_options_add_plugin_library(keel_environment_options_t options,
                                                                   const char* path);

/* ---- Model metadata (appended) ---------------------------------------------------------------------------- */

/* What an ONNX model says about itself. Strings are "" when the model does not set them. */
typedef struct keel_model_metadata_s {
  uint32_t struct_size;         /* set by the caller: sizeof(keel_model_metadata_t) */
  const char* producer_name;    /* e.g. "pytorch" */
  const char* producer_version; /* e.g. "2.1.0" */
  const char* domain;           /* the model's domain, e.g. "ai.onnx" or a reverse DNS name */
  const char* description;      /* the model's doc_string */
  const char* graph_name;
  int64_t model_version;
  int64_t ir_version;
  size_t custom_count; /* entries of metadata_props: keel_model_custom_metadata */
} keel_model_metadata_t;

/* Fills `out_metadata` (the members its struct_size covers). Strings live as long as `model`. Thread-safe. */
KEEL_API keel_status_t keel_model_metadata(keel_model_t model, keel_model_metadata_t* out_metadata);
/* The index-th custom metadata property (ONNX metadata_props, sorted by key): *out_key and *out_value (either may be
 * NULL) live as long as `model`. OUT_OF_RANGE for index >= custom_count. Thread-safe. */
KEEL_API keel_status_t keel_model_custom_metadata(keel_model_t model, size_t index, const char** out_key,
                                                  const char** out_value);
/* The value of custom metadata property `key`; NOT_FOUND naming the key when the model has none. Thread-safe. */
KEEL_API keel_status_t keel_model_custom_metadata_lookup(keel_model_t model, const char* key, const char** out_value);
/* The same for the model a session was created from (the session keeps a copy; strings live as long as the
 * session). Thread-safe. */
KEEL_API keel_status_t keel_session_model_metadata(keel_session_t session, keel_model_metadata_t* out_metadata);
KEEL_API keel_status_t keel_session_custom_metadata(keel_session_t session, size_t index, const char** out_key,
                                                    const char** out_value);

/* ---- Pipeline and the optimised graph (appended) ---------------------------------------------------------- */

/* The graph passes a session runs before placement, as the `keel` command line's --passes: "auto" (the default)
 * runs fuse_qdq on a quantised (QDQ) model, else the default pipeline (canonicalise, fold BatchNormalization, fuse,
 * clean up) — each only where its pass plugin is loaded; "none" runs none. Passes added with
 * keel_session_options_add_pass run after these. INVALID_ARGUMENT for another value. Thread-compatible. */
KEEL_API keel_status_t keel_session_options_set_pipeline(keel_session_options_t options, const char* pipeline);

/* Writes the session's optimised graph (after its passes, as placed; the generic build's, shapes as declared) to an
 * ONNX file at `path` (overwritten); weights past protobuf's 2 GiB limit go to an
 * external data file beside it. The file loads with keel_model_load_from_file (nodes of Keel's fused ops use the
 * "keel" domain, which other ONNX runtimes do not know). NOT_FOUND / INVALID_ARGUMENT naming the path when it cannot
 * be written. Thread-safe (also while runs are in progress). */
KEEL_API keel_status_t keel_session_save_optimized_model(keel_session_t session, const char* path);

/* ---- Device tensors and I/O binding (appended) ------------------------------------------------------------ */

/*
 * A tensor in the memory of a device of an environment ("cuda:0"), or in host memory ("cpu"): what a run leaves on a
 * device for the next run to read without a copy (keel_io_binding_bind_output_to_device), or memory the caller
 * prepares there (keel_device_tensor_create). Device work in flight: a tensor that a run wrote may still be being
 * written by the device when the run returns (the stream contract of plugin.h: the host waits only where a result
 * leaves the device); a run that reads it orders its own work after that (on the device, without the host waiting),
 * and the copy and synchronize functions below wait for it. A device tensor holds memory of its environment's pool:
 * release it before the environment.
 */
typedef struct keel_device_tensor_s* keel_device_tensor_t;

/* A new tensor of `dtype` and shape `dims` (ndim entries, none negative) in the memory of `device` ("TYPE" or
 * "TYPE:INDEX"; "cpu" = host memory), from that device's pool (counted by keel_environment_memory_stats); its
 * contents are undefined. INVALID_ARGUMENT for a malformed spec, dtype or dims, NOT_FOUND / OUT_OF_RANGE naming an
 * unknown device, OUT_OF_MEMORY naming the device. The caller owns *out_tensor (keel_device_tensor_release, before
 * `env`). Thread-safe. */
KEEL_API keel_status_t keel_device_tensor_create(keel_environment_t env, const char* device, int32_t dtype,
                                                 const int64_t* dims, int32_t ndim, keel_device_tensor_t* out_tensor);
/* Releases the handle, after waiting for device work in flight on its memory from the run that produced it; the
 * memory goes back to the pool when no binding and no run holds it any more. Not concurrently with other uses of
 * `tensor`. */
KEEL_API void keel_device_tensor_release(keel_device_tensor_t tensor);
/* Copies `byte_size` bytes (exactly the tensor's) from host memory `data` into the tensor, or from the tensor into
 * host memory `data`, after the device work that writes it; returns when the copy is complete. INVALID_ARGUMENT for
 * another size or NULL data. Not concurrently with a run that writes `tensor`; concurrent reads are fine. */
KEEL_API keel_status_t keel_device_tensor_copy_from_host(keel_device_tensor_t tensor, const void* data,
                                                         size_t byte_size);
KEEL_API keel_status_t keel_device_tensor_copy_to_host(keel_device_tensor_t tensor, void* data, size_t byte_size);
/* Waits until the device work of the run that produced the tensor is complete (then its memory may be read by other
 * means, e.g. a CUDA library on keel_device_tensor_data). Thread-safe. */
KEEL_API keel_status_t keel_device_tensor_synchronize(keel_device_tensor_t tensor);
/* Inspection (0 / NULL for a NULL handle). `dims`, `device_type` and `data` stay valid until the tensor is released.
 * `data` is an address in the device's memory (a host address for "cpu"); do not dereference it on the host for
 * another device. Concurrent calls are safe. */
KEEL_API int32_t keel_device_tensor_dtype(keel_device_tensor_t tensor);
KEEL_API int32_t keel_device_tensor_ndim(keel_device_tensor_t tensor);
KEEL_API const int64_t* keel_device_tensor_dims(keel_device_tensor_t tensor); /* NULL for a scalar */
KEEL_API uint64_t keel_device_tensor_byte_size(keel_device_tensor_t tensor);
KEEL_API void* keel_device_tensor_data(keel_device_tensor_t tensor);
KEEL_API const char* keel_device_tensor_device_type(keel_device_tensor_t tensor); /* "cpu" for host memory */
KEEL_API int32_t keel_device_tensor_device_index(keel_device_tensor_t tensor);

/*
 * I/O binding (as ONNX Runtime's OrtIoBinding): the inputs and outputs of a session's runs, bound once and reused by
 * many runs, without a copy where the memory is already where the kernels need it.
 *  - Inputs: a host tensor (caller memory with keel_host_tensor_wrap) is read in place by host kernels; a device
 *    tensor (an earlier run's output left on the device, or keel_device_tensor_create) is read in place by kernels
 *    of its device, after the device work that produces it.
 *  - Outputs: bound to memory the caller preallocated (a host tensor, a device tensor): its dtype and shape must be
 *    the output's; the kernel that produces the output writes into it directly when it is in the memory of that
 *    kernel's device (no copy: keel_session_copy_stats counts none), else the output is copied in. Or bound to a
 *    device (keel_io_binding_bind_output_to_device): the run leaves the output in that device's memory (where it was
 *    produced, when that is the device: no copy). Outputs not bound are computed and dropped.
 * The binding holds a reference to every tensor bound (the handles may be released after binding; memory wrapped
 * with keel_host_tensor_wrap stays the caller's to keep alive) until it is bound again, cleared or released.
 * Ownership and threads: the caller owns the binding and releases it before its session. A binding belongs to one
 * run at a time: keel_session_run_with_binding fails with FAILED_PRECONDITION while another run uses the same
 * binding, and so do the bind, clear and output functions; give each thread that runs the session its own binding
 * (and its own output memory: two concurrent runs must not write one buffer). Between runs, a binding may pass from
 * thread to thread.
 */
typedef struct keel_io_binding_s* keel_io_binding_t;

/* A new, empty binding for `session`'s inputs and outputs. The caller owns *out_binding. Thread-safe. */
KEEL_API keel_status_t keel_io_binding_create(keel_session_t session, keel_io_binding_t* out_binding);
/* Releases the binding and its references, after waiting for device work in flight on its outputs. Not while a run
 * uses it. */
KEEL_API void keel_io_binding_release(keel_io_binding_t binding);
/* Binds input `name` to a host tensor / a device tensor (replacing an earlier binding of that name). INVALID_ARGUMENT
 * naming the input for an unknown name, another dtype, or a shape the model does not accept (a fixed dim differs or
 * the rank does). */
KEEL_API keel_status_t keel_io_binding_bind_input(keel_io_binding_t binding, const char* name,
                                                  keel_host_tensor_t tensor);
KEEL_API keel_status_t keel_io_binding_bind_input_device(keel_io_binding_t binding, const char* name,
                                                         keel_device_tensor_t tensor);
/* Binds output `name` to preallocated memory: a host tensor (e.g. keel_host_tensor_wrap over caller memory) or a
 * device tensor, of the output's dtype and shape. INVALID_ARGUMENT naming the output for an unknown name, another
 * dtype, or another shape where the model fixes it; a run whose output comes out with another shape (a dynamic dim)
 * fails with INVALID_ARGUMENT naming the output, its shape and the bound one. */
KEEL_API keel_status_t keel_io_binding_bind_output(keel_io_binding_t binding, const char* name,
                                                   keel_host_tensor_t tensor);
KEEL_API keel_status_t keel_io_binding_bind_output_device(keel_io_binding_t binding, const char* name,
                                                          keel_device_tensor_t tensor);
/* Binds output `name` to a device ("cuda:0"; "cpu" = host memory): each run leaves the output there, in memory the
 * run allocates; read it with keel_io_binding_output. INVALID_ARGUMENT for an unknown output or a malformed spec,
 * NOT_FOUND / OUT_OF_RANGE for an unknown device. */
KEEL_API keel_status_t keel_io_binding_bind_output_to_device(keel_io_binding_t binding, const char* name,
                                                             const char* device);
/* Removes every input and output binding (and the outputs of the last run). */
KEEL_API keel_status_t keel_io_binding_clear(keel_io_binding_t binding);

/* Runs `session` with the binding's inputs and outputs (every model input must be bound). `run_options` may be NULL.
 * On success the bound outputs hold the run's results (keel_io_binding_output); on failure the statuses of
 * keel_session_run_with_options, INVALID_ARGUMENT naming an output whose result does not fit the memory bound to it,
 * FAILED_PRECONDITION when another run is using the binding; preallocated output memory may then have been partly
 * written. Thread-safe as keel_session_run, with one binding per concurrent run. */
KEEL_API keel_status_t keel_session_run_with_binding(keel_session_t session, keel_run_options_t run_options,
                                                     keel_io_binding_t binding);
/* The result of bound output `name` of the binding's last successful run, as a new device tensor handle the caller
 * owns (over the same memory: the preallocated tensor's, or the memory the run left on the device; no copy).
 * NOT_FOUND naming the output when it is not bound or no run has succeeded since it was bound. */
KEEL_API keel_status_t keel_io_binding_output(keel_io_binding_t binding, const char* name,
                                              keel_device_tensor_t* out_tensor);

/* The copies a session's runs made so far: those inserted between devices, inputs moved to the device that reads
 * them, outputs brought to the host or into memory bound for them. Reads in place and outputs written into their
 * bound memory count nothing. */
typedef struct keel_session_copy_stats_s {
  uint32_t struct_size; /* set by the caller: sizeof(keel_session_copy_stats_t) */
  uint64_t host_to_device;
  uint64_t device_to_host;
  uint64_t device_to_device;
  uint64_t host_to_host;
  uint64_t bytes; /* of all of them */
} keel_session_copy_stats_t;
/* Fills `out_stats` (the members its struct_size covers). Thread-safe. */
KEEL_API keel_status_t keel_session_copy_stats(keel_session_t session, keel_session_copy_stats_t* out_stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KEEL_KEEL_H_ */
