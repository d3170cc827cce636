/*
 * keel/plugin.h — the C ABI between the Keel core and its plugins.
 *
 * A plugin is one shared library plus one manifest (NAME.keel-plugin.toml). The library exports exactly one
 * symbol, KEEL_PLUGIN_ENTRY_SYMBOL, returning a static descriptor. The core checks the descriptor's ABI major
 * (must equal KEEL_PLUGIN_ABI_MAJOR) before calling anything else, then calls `init` with the core API
 * (keel_core_api_t); inside `init` the plugin registers its devices, kernels, passes and collectives.
 *
 * Rules that hold for every struct and function here:
 *  - Self-contained: this header needs only <stdint.h> and <stddef.h>.
 *  - Every struct that crosses the boundary starts with `struct_size` (sizeof as the producer compiled it) and,
 *    where it is a table or definition, the ABI version it was compiled against. Tables are append-only within a
 *    major: a consumer reads a member only when `struct_size` covers it (KEEL_HAS_MEMBER).
 *  - Members marked (optional) may be NULL.
 *  - Errors are keel_status_t objects: NULL means OK; otherwise the object carries a code and a message and is
 *    released exactly once by whoever receives it (keel_status_release). No exception, C++ type or RTTI crosses.
 *  - Memory handed across is owned by its producer unless a comment says otherwise. Strings are NUL-terminated
 *    UTF-8 and live at least as long as the call they are passed to, unless stated otherwise.
 *  - Device memory is addressed by explicit device indices; there is no hidden "current device".
 */
#ifndef KEEL_PLUGIN_H_
#define KEEL_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_PLUGIN_ABI_MAJOR 1
#define KEEL_PLUGIN_ABI_MINOR 5
#define KEEL_PLUGIN_ENTRY_SYMBOL "keel_plugin_entry"

#if defined(_WIN32)
#define KEEL_PLUGIN_EXPORT __declspec(dllexport)
#else
#define KEEL_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* True when a struct produced by the other side is large enough to hold MEMBER. */
#define KEEL_HAS_MEMBER(ptr, type, member) \
  ((ptr) != NULL && (size_t)(ptr)->struct_size >= offsetof(type, member) + sizeof(((type*)0)->member))

/* ------------------------------------------------------------------------------------------------------------ */
/* Status                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

typedef enum keel_status_code_e {
  KEEL_STATUS_OK = 0,
  KEEL_STATUS_INVALID_ARGUMENT = 1, /* the caller passed something wrong (shape, dtype, attribute, file) */
  KEEL_STATUS_NOT_FOUND = 2,        /* a named thing does not exist (file, symbol, plugin, value) */
  KEEL_STATUS_UNIMPLEMENTED = 3,    /* this entry or this case is not implemented */
  KEEL_STATUS_OUT_OF_MEMORY = 4,    /* an allocation failed */
  KEEL_STATUS_FAILED_PRECONDITION = 5,
  KEEL_STATUS_UNAVAILABLE = 6,       /* e.g. no device present, driver missing */
  KEEL_STATUS_DEADLINE_EXCEEDED = 7, /* a timeout, e.g. a peer that never arrived */
  KEEL_STATUS_ABI_MISMATCH = 8,
  KEEL_STATUS_INTERNAL = 9, /* a bug: an invariant did not hold */
  KEEL_STATUS_ALREADY_EXISTS = 10,
  KEEL_STATUS_OUT_OF_RANGE = 11,
  KEEL_STATUS_CANCELLED = 12, /* (ABI 1.4) the caller asked the operation to stop (a run's terminate flag) */
} keel_status_code_t;

/* A status object. Whoever creates one sets `release`; whoever receives one releases it exactly once. */
typedef struct keel_status_s {
  uint32_t struct_size;
  int32_t code;                                /* keel_status_code_t */
  const char* message;                         /* owned by the object */
  void (*release)(struct keel_status_s* self); /* frees the object and its message */
} keel_status_s;
typedef keel_status_s* keel_status_t; /* NULL = OK */

static inline void keel_status_release(keel_status_t status) {
  if (status != NULL && status->release != NULL) status->release(status);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Data types and tensors                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

/* Values equal ONNX TensorProto.DataType, so models map without a table. */
typedef enum keel_dtype_e {
  KEEL_DTYPE_UNDEFINED = 0,
  KEEL_DTYPE_F32 = 1,
  KEEL_DTYPE_U8 = 2,
  KEEL_DTYPE_I8 = 3,
  KEEL_DTYPE_U16 = 4,
  KEEL_DTYPE_I16 = 5,
  KEEL_DTYPE_I32 = 6,
  KEEL_DTYPE_I64 = 7,
  KEEL_DTYPE_STRING = 8, /* recognised in models; no kernels operate on it */
  KEEL_DTYPE_BOOL = 9,   /* one byte per element, 0 or 1 */
  KEEL_DTYPE_F16 = 10,
  KEEL_DTYPE_F64 = 11,
  KEEL_DTYPE_U32 = 12,
  KEEL_DTYPE_U64 = 13,
  KEEL_DTYPE_BF16 = 16,
} keel_dtype_t;

typedef enum keel_memory_kind_e {
  KEEL_MEMORY_HOST = 0,        /* ordinary host memory */
  KEEL_MEMORY_HOST_PINNED = 1, /* page-locked host memory from a device plugin */
  KEEL_MEMORY_DEVICE = 2,      /* memory of a device, addressed with device_index */
} keel_memory_kind_t;

/* A dense, row-major tensor view. The view does not own `data`. */
typedef struct keel_tensor_s {
  uint32_t struct_size;
  int32_t dtype;        /* keel_dtype_t */
  int32_t ndim;         /* 0 for a scalar */
  const int64_t* dims;  /* ndim entries; a dim of -1 means unknown (only at kernel-create time) */
  void* data;           /* NULL when the tensor has no data yet (kernel-create time, non-constant inputs) */
  uint64_t byte_size;   /* bytes at `data` */
  int32_t memory_kind;  /* keel_memory_kind_t */
  int32_t device_index; /* which device of the owning device type holds `data` */
} keel_tensor_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Streams, events and devices                                                                                   */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_stream_s* keel_stream_t; /* opaque, created by a device table; NULL = the device's default */
typedef struct keel_event_s* keel_event_t;   /* opaque, created by a device table */

typedef enum keel_copy_kind_e {
  KEEL_COPY_HOST_TO_DEVICE = 0,
  KEEL_COPY_DEVICE_TO_HOST = 1,
  KEEL_COPY_DEVICE_TO_DEVICE = 2, /* src and dst device indices may differ (peer copy) */
  KEEL_COPY_HOST_TO_HOST = 3,
} keel_copy_kind_t;

/* Capability bits of a device. */
#define KEEL_DEVICE_CAP_F16 (1ull << 0)
#define KEEL_DEVICE_CAP_BF16 (1ull << 1)
#define KEEL_DEVICE_CAP_INT8 (1ull << 2)
#define KEEL_DEVICE_CAP_F64 (1ull << 3)
#define KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY (1ull << 4) /* device memory is host memory (CPU-like devices) */
#define KEEL_DEVICE_CAP_ASYNC_COPY (1ull << 5)
#define KEEL_DEVICE_CAP_PEER_COPY (1ull << 6)
/* The device follows the stream contract below with streams of its own (stream_create and the event entries set):
 * the core gives each run of a session its own stream of the device. Without it the core passes NULL everywhere and
 * every compute and copy must be complete when it returns (what cores before the contract assumed of every device). */
#define KEEL_DEVICE_CAP_STREAMS (1ull << 7)

/*
 * The stream contract (how work on a device is ordered, and when the host waits).
 *
 *  1. One stream per run and device. A session gives each run in progress its own stream of every device it runs on
 *     (made with stream_create, kept for later runs: a stream serves one run at a time, so it is never used from two
 *     threads at once) when the device sets KEEL_DEVICE_CAP_STREAMS; otherwise NULL, the device's default stream.
 *     A device whose memory is host memory (KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY, the CPU) always gets NULL.
 *  2. Everything in order on that stream. The kernel context carries it (keel_kernel_api_t.stream); a kernel
 *     enqueues all of its device work there, or orders any other stream it uses (a library's own) back onto it
 *     with an event before compute returns. The copies the core makes for the run (inputs to the device, values
 *     between devices, outputs back) are issued on it too, so a kernel's inputs are ready in stream order.
 *  3. After compute returns, the kernel's work may still be running on the device (stream non-NULL). Its inputs stay
 *     valid and unchanged until every piece of work ordered after it on the stream has run, and nothing reads its
 *     outputs except work ordered after it (the core's copies on the stream; events for other streams, see 6). With a
 *     NULL stream the work must be complete when compute returns.
 *  4. Workspace (keel_kernel_api_t.workspace) and memory the run frees go back to the core's pool when compute
 *     returns, and the pool hands a block out again only for work on the same stream (blocks are keyed by stream):
 *     work that compute left queued on the context's stream may still use its workspace; work on any other stream
 *     must not (order it back first, rule 2). A kernel that reads device memory on the host inside compute (a shape
 *     input computed on the device) synchronises the context's stream first (stream_synchronize).
 *  5. Copies. `copy` is ordered on its stream. A *_TO_DEVICE copy has read its host source when it returns (the host
 *     may reuse that memory at once; the device side completes in stream order). A *_TO_HOST copy's host bytes are
 *     valid after stream_synchronize on its stream. A copy on the NULL stream is complete when it returns. Copies
 *     between two devices of one table are issued on the source device's stream; the core orders the destination's
 *     stream after them with an event.
 *  6. The host waits only where a result leaves the device: after a device-to-host copy whose bytes the host reads
 *     (a host kernel's input, an output returned in host memory), when a caller reads a device tensor on the host, and
 *     when the core releases memory or streams that work may still use. Never per node: a run never calls
 *     device_synchronize. A run that leaves outputs on the device (I/O binding) records an event on its stream
 *     (event_record); a later run that reads them makes its own stream wait for it (stream_wait_event; the host waits
 *     with event_synchronize where that entry is missing).
 */

typedef struct keel_device_properties_s {
  uint32_t struct_size;
  char name[128];        /* e.g. "NVIDIA H200" */
  uint64_t total_memory; /* bytes; 0 when unknown */
  uint64_t free_memory;  /* bytes; 0 when unknown */
  uint64_t capabilities; /* KEEL_DEVICE_CAP_* bits */
  int32_t compute_major; /* vendor-defined, e.g. CUDA compute capability */
  int32_t compute_minor;
  int32_t multiprocessors; /* cores or SMs; 0 when unknown */
} keel_device_properties_t;

struct keel_graph_s;
struct keel_graph_api_s;
struct keel_kernel_context_s;
struct keel_subgraph_sink_s;

/*
 * A device table: one per device type a plugin provides ("cpu", "cuda", ...). All entries take the table's
 * `user_data` first. Unless marked otherwise, entries may be called from any thread; the plugin synchronises.
 */
typedef struct keel_device_table_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* device_type; /* "cpu", "cuda", ...; lowercase; static storage */
  void* user_data;

  /* Number of devices present. A plugin with 0 devices is recorded as "no device present" and not used. */
  keel_status_t (*device_count)(void* user_data, int32_t* out_count);
  keel_status_t (*get_properties)(void* user_data, int32_t device, keel_device_properties_t* out_props);

  /* Raw device memory. The core pools on top of these; they may be slow. `alignment` is a power of two. */
  keel_status_t (*allocate)(void* user_data, int32_t device, uint64_t bytes, uint64_t alignment, void** out_ptr);
  void (*free)(void* user_data, int32_t device, void* ptr);
  /* (optional) Page-locked host memory for fast transfers. */
  keel_status_t (*allocate_pinned_host)(void* user_data, uint64_t bytes, void** out_ptr);
  void (*free_pinned_host)(void* user_data, void* ptr); /* (optional, required with allocate_pinned_host) */

  /* Copies `bytes` bytes. Ordered on `stream` (NULL = the default stream of the device doing the work), as the stream
   * contract above says: a *_TO_DEVICE copy has read its host source when it returns; a *_TO_HOST copy is complete
   * after stream_synchronize (on return for a NULL stream). Host pointers may be pageable or pinned. */
  keel_status_t (*copy)(void* user_data, int32_t kind /* keel_copy_kind_t */, int32_t dst_device, void* dst,
                        int32_t src_device, const void* src, uint64_t bytes, keel_stream_t stream);

  /* Streams and events (optional: a synchronous device leaves them NULL and runs everything in order). */
  keel_status_t (*stream_create)(void* user_data, int32_t device, keel_stream_t* out_stream);
  void (*stream_release)(void* user_data, keel_stream_t stream);
  keel_status_t (*stream_synchronize)(void* user_data, keel_stream_t stream);
  keel_status_t (*event_create)(void* user_data, int32_t device, keel_event_t* out_event);
  void (*event_release)(void* user_data, keel_event_t event);
  keel_status_t (*event_record)(void* user_data, keel_event_t event, keel_stream_t stream);
  keel_status_t (*stream_wait_event)(void* user_data, keel_stream_t stream, keel_event_t event);
  keel_status_t (*event_synchronize)(void* user_data, keel_event_t event);
  keel_status_t (*device_synchronize)(void* user_data, int32_t device);

  /* (optional) Capability: inspect a graph (read-only through `api`) and claim connected subgraphs to run as one,
   * by calling sink->claim for each. The core checks every claim (connected, no cycle through unclaimed nodes),
   * runs it as one step where all it reads is ready (an outside node that reads one of its values runs after it),
   * inserts copies at its boundaries and calls the claimed subgraph's compute with the boundary values. */
  keel_status_t (*claim_subgraphs)(void* user_data, const struct keel_graph_s* graph,
                                   const struct keel_graph_api_s* api, struct keel_subgraph_sink_s* sink);
} keel_device_table_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Kernels                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_kernel_context_s keel_kernel_context_t; /* opaque, owned by the core */

/*
 * The dtypes a named type parameter of the op's schema ("T", "T1", ...) may take for this kernel.
 *
 * (ABI 1.5) The struct starts with its size and ABI version, as every struct that crosses does; fill the header with
 * KEEL_TYPE_CONSTRAINT_HEADER: {KEEL_TYPE_CONSTRAINT_HEADER, "T", dtypes, count}. Which layout a kernel definition's
 * `constraints` array has follows from that definition's abi_minor: below 5 the core reads the older layout without
 * a header (keel_type_constraint_v0_t), so plugins built against an older SDK keep loading; from 5 on it reads this
 * one, stepping through the array by the first element's struct_size (every element of one array has the same) and
 * refusing the kernel (INVALID_ARGUMENT naming it) for a struct_size too small or another abi_major.
 */
typedef struct keel_type_constraint_s {
  uint32_t struct_size; /* (ABI 1.5) sizeof(keel_type_constraint_t) as the plugin compiled it */
  uint16_t abi_major;   /* (ABI 1.5) KEEL_PLUGIN_ABI_MAJOR */
  uint16_t abi_minor;   /* (ABI 1.5) KEEL_PLUGIN_ABI_MINOR */
  const char* name;
  const int32_t* dtypes; /* keel_dtype_t values */
  size_t dtype_count;
} keel_type_constraint_t;
#define KEEL_TYPE_CONSTRAINT_HEADER \
  (uint32_t)sizeof(keel_type_constraint_t), (uint16_t)KEEL_PLUGIN_ABI_MAJOR, (uint16_t)KEEL_PLUGIN_ABI_MINOR

/* The layout of a type constraint before ABI 1.5 (no header): what `constraints` of a kernel definition whose
 * abi_minor is below 5 points at. Only the core (and tests of old plugins) need it. */
typedef struct keel_type_constraint_v0_s {
  const char* name;
  const int32_t* dtypes;
  size_t dtype_count;
} keel_type_constraint_v0_t;

/*
 * One kernel: an implementation of (domain, op_type, opset range) for a device type and some dtypes.
 * The core calls `create` once per graph node that it places on this kernel (at session creation), `compute`
 * for every run, and `release` when the session goes.
 *
 * Concurrency (ABI 1.4). Runs on one session may proceed in parallel (each with its own kernel context, activation
 * memory and workspace). Unless the kernel declares KEEL_KERNEL_FLAG_REENTRANT in `flags`, the core never calls
 * `compute` on the same state from two threads at once: such a kernel is serialised alone (other nodes of the
 * concurrent runs go on in parallel), which is what every kernel of an older plugin gets. A kernel that declares it
 * lets `compute` run on one state from several threads at once: the state is then read-only during compute (or
 * guarded by the kernel), and everything a run writes lives in that run's outputs and workspace. A kernel without
 * `create` has no per-node state (user_data is shared by every node and session, which already run it
 * concurrently) and counts as re-entrant. Separate sessions have separate states, except sessions that share one
 * build (keel_session_options_share_weights_with), which share everything, states included.
 */
typedef struct keel_kernel_def_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* name;                          /* for logs and profiles, e.g. "ref_f32_conv2d" */
  const char* domain;                        /* "" or "ai.onnx" for ONNX, "keel" for Keel's own ops */
  const char* op_type;                       /* "Conv" */
  int32_t since_version;                     /* first opset this kernel implements */
  int32_t end_version;                       /* last opset (inclusive); 0 = open-ended */
  const char* device_type;                   /* must match a registered device table's type */
  const keel_type_constraint_t* constraints; /* (optional) no entries = any dtype */
  size_t constraint_count;
  void* user_data;

  /* (optional) Decide whether this kernel can run this node (attributes, ranks, constant inputs), and prepare
   * per-node state (e.g. prepacked weights). `ctx` gives attributes and input shapes/dtypes; inputs that are
   * constants have `data`. Return UNIMPLEMENTED with a reason to reject the node: the core tries the next kernel
   * and logs the reason at debug level. *out_state defaults to user_data. */
  keel_status_t (*create)(void* user_data, keel_kernel_context_t* ctx, void** out_state);
  /* Runs the node: read inputs, attributes; allocate and write outputs through `ctx`. Device work goes on the
   * context's stream and may still run after compute returns (the stream contract above). */
  keel_status_t (*compute)(void* state, keel_kernel_context_t* ctx);
  /* (optional) Frees what create made. */
  void (*release)(void* state);
  /* (ABI 1.4) KEEL_KERNEL_FLAG_* bits; read only when struct_size covers it (0 for older plugins). */
  uint32_t flags;
} keel_kernel_def_t;

/* (ABI 1.4) keel_kernel_def_t.flags / keel_subgraph_def_t.flags: `compute` may run on one state from several
 * threads at once (concurrent runs of one session); see "Concurrency" above. */
#define KEEL_KERNEL_FLAG_REENTRANT 0x1u
/* keel_kernel_def_t.flags: the kernel ranks one below its plugin's priority, under the plugin's other kernels for the
 * same op. It serves what they, and the plugin's claimed chains, leave over, and calls from outside sessions (eager
 * ops); a fusion pass, which compares kernel_priority, then does not rewrite a graph toward it and away from the
 * plugin's chains. E.g. the oneDNN plugin's f32 keel.FusedConv: eager's conv2d_relu runs on it, while sessions keep
 * Conv + Relu for the chains that fuse them themselves. A later addition to ABI 1.5 (no layout change): a core that
 * does not know the bit ignores it, and the kernel then ranks as its plugin. */
#define KEEL_KERNEL_FLAG_SECONDARY 0x2u

/*
 * A subgraph claimed by a device (see keel_device_table_t.claim_subgraphs). The node ids are those of the graph
 * given to claim_subgraphs. Inputs of the subgraph are the values its nodes read that are produced outside it (in
 * first-use order); outputs are values produced inside and used outside or by the graph's outputs (in node order).
 * `create`/`compute`/`release` behave as for kernels; ctx inputs/outputs are those boundary values.
 */
typedef struct keel_subgraph_def_s {
  uint32_t struct_size;
  const char* name; /* for logs and profiles */
  const uint64_t* node_ids;
  size_t node_count;
  void* user_data;
  keel_status_t (*create)(void* user_data, keel_kernel_context_t* ctx, void** out_state); /* (optional) */
  keel_status_t (*compute)(void* state, keel_kernel_context_t* ctx);
  void (*release)(void* state); /* (optional) */
  /* (optional; ABI 1.1) Frees user_data. The core calls it exactly once per claim it recorded: right after
   * `create` returned (whatever it returned), or when it rejects the claim or never gets to create it (another
   * claim took a node, the claim is not convex, session creation failed). Not called for an accepted claim
   * without `create`: there user_data is the state, which `release` frees. */
  void (*release_user_data)(void* user_data);
  /* (ABI 1.4) KEEL_KERNEL_FLAG_* bits, as for keel_kernel_def_t (0 or absent: computes on one state serialised). */
  uint32_t flags;
  /* (ABI 1.5) The ABI version the definition was compiled against (KEEL_PLUGIN_ABI_MAJOR / _MINOR): the version
   * header this struct lacked, appended so that the layout of older definitions is unchanged. The core reads them
   * when struct_size covers them (an older plugin's claims carry none) and refuses a claim of another abi_major
   * (0 counts as not set). */
  uint16_t abi_major;
  uint16_t abi_minor;
} keel_subgraph_def_t;

/*
 * (ABI 1.1) A claim hook for a plugin that serves a device type with kernels but has no device table of its own
 * (e.g. oneDNN kernels for the reference "cpu" device): like keel_device_table_t.claim_subgraphs, it may claim
 * connected subgraphs of nodes it can run as one (to keep its own memory layouts between ops, or fuse ops) by
 * calling sink->claim. The core calls it when a session places a graph whose preferred device type (the first
 * of the session's device order) is `device_type`, after that device's own claim_subgraphs and before the
 * claimers of lower-priority plugins; a node claimed first stays with that claim. The core checks every claim
 * as it does a device's (connected, convex) and runs the claimed subgraph on `device_type` (its memory). The graph
 * and its strings are valid only during the call: copy what the subgraph's create/compute need into user_data.
 */
typedef struct keel_claimer_def_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* name;        /* for logs, e.g. "onednn_chains" */
  const char* device_type; /* the device type whose graphs it inspects */
  void* user_data;
  keel_status_t (*claim_subgraphs)(void* user_data, const struct keel_graph_s* graph,
                                   const struct keel_graph_api_s* api, struct keel_subgraph_sink_s* sink);
} keel_claimer_def_t;

typedef struct keel_subgraph_sink_s {
  uint32_t struct_size;
  void* core_data;
  /* Records a claim; the definition is copied. A rejected claim returns a status naming why. */
  keel_status_t (*claim)(struct keel_subgraph_sink_s* self, const keel_subgraph_def_t* def);
} keel_subgraph_sink_t;

/*
 * (ABI 1.3) One step inside a kernel's or a claimed subgraph's compute, reported to the session profiler through
 * keel_kernel_api_t.profile_step while the session profiles (e.g. one oneDNN primitive of a claimed chain). The core
 * attributes the step's time to `op_type` (or, when that is empty, to the kernel's own work named by `kind`) and
 * shows the nodes it covers. A consumer reads a member only when struct_size covers it (KEEL_HAS_MEMBER).
 */
typedef struct keel_profile_step_s {
  uint32_t struct_size;          /* sizeof(keel_profile_step_t) as the plugin compiled it */
  const char* kind;              /* what ran, e.g. "convolution", "reorder" (a oneDNN primitive kind) */
  const char* implementation;    /* (optional) e.g. "brg:avx512_core", "jit:uni" */
  const char* op_type;           /* (optional) the ONNX op type of the node the step computes ("Conv"); NULL or ""
                                  * for work of the kernel's own that no node asked for (a layout reorder) */
  const char* const* node_names; /* (optional) graph nodes the step computes: the op_type node first, then the
                                  * nodes fused into it (post-ops); for a kernel's own work, the node it serves */
  size_t node_count;
  double time_ms; /* wall time of the step, finished (the kernel waits for it before timing) */
} keel_profile_step_t;

/* What a kernel reads and writes through. Obtain it from keel_core_api_t.kernel. */
typedef struct keel_kernel_api_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;

  int32_t (*input_count)(const keel_kernel_context_t* ctx);
  /* NULL when input i is absent (an omitted optional input) or out of range. */
  const keel_tensor_t* (*input)(const keel_kernel_context_t* ctx, int32_t i);
  int32_t (*output_count)(const keel_kernel_context_t* ctx);
  /* Allocates (or binds planned memory to) output i with this shape and the dtype the graph expects, and returns
   * a view valid until compute returns. Only during compute. */
  keel_status_t (*output)(keel_kernel_context_t* ctx, int32_t i, int32_t ndim, const int64_t* dims,
                          keel_tensor_t** out_tensor);
  /* The dtype the graph expects for output i (known before compute). */
  int32_t (*output_dtype)(const keel_kernel_context_t* ctx, int32_t i);

  /* Attributes. Each returns 1 and sets the out values when the attribute is present with that type, else 0. */
  int (*attr_int)(const keel_kernel_context_t* ctx, const char* name, int64_t* out_value);
  int (*attr_float)(const keel_kernel_context_t* ctx, const char* name, float* out_value);
  int (*attr_string)(const keel_kernel_context_t* ctx, const char* name, const char** out_value);
  int (*attr_ints)(const keel_kernel_context_t* ctx, const char* name, const int64_t** out_values, size_t* out_count);
  int (*attr_floats)(const keel_kernel_context_t* ctx, const char* name, const float** out_values, size_t* out_count);
  int (*attr_tensor)(const keel_kernel_context_t* ctx, const char* name, const keel_tensor_t** out_tensor);
  int (*attr_strings)(const keel_kernel_context_t* ctx, const char* name, const char* const** out_values,
                      size_t* out_count);

  const char* (*node_name)(const keel_kernel_context_t* ctx);
  int32_t (*opset)(const keel_kernel_context_t* ctx); /* the opset version the node was imported at */
  int32_t (*device_index)(const keel_kernel_context_t* ctx);
  /* The run's stream of the kernel's device (the stream contract above); NULL for a device without
   * KEEL_DEVICE_CAP_STREAMS (then the work must be complete when compute returns) and at create time. */
  keel_stream_t (*stream)(const keel_kernel_context_t* ctx);
  /* Scratch memory on the kernel's device for work on the context's stream: the host may no longer touch it after
   * compute returns, while work queued on the stream may still use it (rule 4 of the stream contract). */
  keel_status_t (*workspace)(keel_kernel_context_t* ctx, uint64_t bytes, void** out_ptr);
  /* Runs fn(arg, begin, end) over [0, n) in chunks on the core's thread pool; returns when all are done. */
  void (*parallel_for)(const keel_kernel_context_t* ctx, int64_t n, int64_t min_chunk,
                       void (*fn)(void* arg, int64_t begin, int64_t end), void* arg);
  int32_t (*thread_count)(const keel_kernel_context_t* ctx);

  /* (ABI 1.3) 1 when the session profiles this compute (SessionOptions::profile, keel_session_options_set_profile),
   * else 0. Only then should a kernel that runs several steps time them and report each with profile_step: when it
   * returns 0, time nothing (profiling costs nothing when off). A kernel that reports nothing shows as one step.
   * Check KEEL_HAS_MEMBER(host->kernel, keel_kernel_api_t, profiling) first: an older core does not have it. */
  int32_t (*profiling)(const keel_kernel_context_t* ctx);
  /* (ABI 1.3) Reports one step of the current compute (only during compute; the record and its strings are copied).
   * Ignored (OK) when the session does not profile; INVALID_ARGUMENT for a NULL or too small record. */
  keel_status_t (*profile_step)(keel_kernel_context_t* ctx, const keel_profile_step_t* step);
} keel_kernel_api_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Graph view and edit API (passes, device capability)                                                           */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_graph_s keel_graph_t; /* opaque, owned by the core */
typedef uint64_t keel_node_id_t;          /* stable while the node exists; never reused within one graph */

/* Attribute kinds (values equal ONNX AttributeProto.AttributeType). */
typedef enum keel_attr_kind_e {
  KEEL_ATTR_UNDEFINED = 0,
  KEEL_ATTR_FLOAT = 1,
  KEEL_ATTR_INT = 2,
  KEEL_ATTR_STRING = 3,
  KEEL_ATTR_TENSOR = 4,
  KEEL_ATTR_GRAPH = 5,
  KEEL_ATTR_FLOATS = 6,
  KEEL_ATTR_INTS = 7,
  KEEL_ATTR_STRINGS = 8,
} keel_attr_kind_t;

/*
 * Values are named by strings (as in ONNX). "" names an absent optional input. Strings returned by the API live
 * until the graph is next modified. A node with subgraph attributes (If, Loop, Scan, SequenceMap) lists, after its
 * own inputs, the values its subgraphs read from the enclosing graph; set_node_input refuses those positions
 * (replace_uses renames inside the subgraphs too). Sequence and optional values have no tensor type
 * (value_info: KEEL_DTYPE_UNDEFINED, ndim -1). Node lists are in topological order. Edit functions are for passes only;
 * the graph given to claim_subgraphs is read-only. A graph is not thread-safe: one pass at a time.
 */
typedef struct keel_graph_api_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;

  /* --- reading --- */
  /* Writes up to `capacity` node ids in topological order into out_ids and returns the number of nodes. */
  size_t (*nodes)(const keel_graph_t* g, keel_node_id_t* out_ids, size_t capacity);
  int (*node_exists)(const keel_graph_t* g, keel_node_id_t node);
  const char* (*node_op_type)(const keel_graph_t* g, keel_node_id_t node);
  const char* (*node_domain)(const keel_graph_t* g, keel_node_id_t node);
  const char* (*node_name)(const keel_graph_t* g, keel_node_id_t node);
  size_t (*node_input_count)(const keel_graph_t* g, keel_node_id_t node);
  const char* (*node_input)(const keel_graph_t* g, keel_node_id_t node, size_t i);
  size_t (*node_output_count)(const keel_graph_t* g, keel_node_id_t node);
  const char* (*node_output)(const keel_graph_t* g, keel_node_id_t node, size_t i);
  /* Attribute kind, or KEEL_ATTR_UNDEFINED when absent. */
  int32_t (*node_attr_kind)(const keel_graph_t* g, keel_node_id_t node, const char* name);
  int (*node_attr_int)(const keel_graph_t* g, keel_node_id_t node, const char* name, int64_t* out_value);
  int (*node_attr_float)(const keel_graph_t* g, keel_node_id_t node, const char* name, float* out_value);
  int (*node_attr_string)(const keel_graph_t* g, keel_node_id_t node, const char* name, const char** out_value);
  int (*node_attr_ints)(const keel_graph_t* g, keel_node_id_t node, const char* name, const int64_t** out_values,
                        size_t* out_count);
  int (*node_attr_floats)(const keel_graph_t* g, keel_node_id_t node, const char* name, const float** out_values,
                          size_t* out_count);
  /* Number of attributes, and the name of the i-th. */
  size_t (*node_attr_count)(const keel_graph_t* g, keel_node_id_t node);
  const char* (*node_attr_name)(const keel_graph_t* g, keel_node_id_t node, size_t i);
  /* The device type the node is placed on ("" before placement). */
  const char* (*node_device_type)(const keel_graph_t* g, keel_node_id_t node);

  /* Value information: dtype and shape as inferred (ndim -1 when the rank is unknown, dims -1 when unknown).
   * Writes up to `capacity` dims. Returns 0 when the value does not exist. */
  int (*value_info)(const keel_graph_t* g, const char* value, int32_t* out_dtype, int32_t* out_ndim, int64_t* out_dims,
                    size_t capacity);
  /* Producer node of a value; returns 0 when it is a graph input or an initializer. */
  int (*value_producer)(const keel_graph_t* g, const char* value, keel_node_id_t* out_node);
  /* Consumers of a value (nodes reading it, each once); returns the count. */
  size_t (*value_consumers)(const keel_graph_t* g, const char* value, keel_node_id_t* out_ids, size_t capacity);
  int (*value_is_graph_output)(const keel_graph_t* g, const char* value);
  /* A constant (initializer). The view is host memory, valid for as long as this graph handle is (edits do not
   * invalidate it: it keeps showing the tensor it showed). */
  int (*initializer)(const keel_graph_t* g, const char* value, const keel_tensor_t** out_tensor);
  size_t (*graph_input_count)(const keel_graph_t* g);
  const char* (*graph_input)(const keel_graph_t* g, size_t i);
  size_t (*graph_output_count)(const keel_graph_t* g);
  const char* (*graph_output)(const keel_graph_t* g, size_t i);
  /* The opset imported for a domain ("" = ai.onnx); 0 when not imported. */
  int32_t (*opset)(const keel_graph_t* g, const char* domain);

  /* --- editing (passes only) --- */
  keel_status_t (*add_node)(keel_graph_t* g, const char* domain, const char* op_type, const char* name,
                            const char* const* inputs, size_t input_count, const char* const* outputs,
                            size_t output_count, keel_node_id_t* out_node);
  keel_status_t (*remove_node)(keel_graph_t* g, keel_node_id_t node);
  keel_status_t (*set_node_input)(keel_graph_t* g, keel_node_id_t node, size_t i, const char* value);
  /* Makes every reader of `from` (and the graph outputs) read `to` instead. */
  keel_status_t (*replace_uses)(keel_graph_t* g, const char* from, const char* to);
  keel_status_t (*set_attr_int)(keel_graph_t* g, keel_node_id_t node, const char* name, int64_t value);
  keel_status_t (*set_attr_float)(keel_graph_t* g, keel_node_id_t node, const char* name, float value);
  keel_status_t (*set_attr_string)(keel_graph_t* g, keel_node_id_t node, const char* name, const char* value);
  keel_status_t (*set_attr_ints)(keel_graph_t* g, keel_node_id_t node, const char* name, const int64_t* values,
                                 size_t count);
  keel_status_t (*set_attr_floats)(keel_graph_t* g, keel_node_id_t node, const char* name, const float* values,
                                   size_t count);
  keel_status_t (*remove_attr)(keel_graph_t* g, keel_node_id_t node, const char* name);
  /* Adds or replaces a constant; the data (host memory) is copied. */
  keel_status_t (*set_initializer)(keel_graph_t* g, const char* value, const keel_tensor_t* tensor);
  keel_status_t (*remove_initializer)(keel_graph_t* g, const char* value);
  /* Writes a value name not used in the graph, starting with `prefix`, into buf (NUL-terminated). */
  keel_status_t (*unique_name)(keel_graph_t* g, const char* prefix, char* buf, size_t buf_size);
  /* Re-runs shape and dtype inference after edits. */
  keel_status_t (*infer_shapes)(keel_graph_t* g);

  /* --- evaluation (constant folding, calibration) --- */
  /* Runs the part of the graph needed for `outputs` on the reference CPU device, with `inputs` bound to named
   * values (host memory). On success *out_tensors[i] are new host tensors owned by the caller: free each with
   * release_tensor. */
  keel_status_t (*evaluate)(const keel_graph_t* g, const char* const* input_names, const keel_tensor_t* const* inputs,
                            size_t input_count, const char* const* output_names, size_t output_count,
                            keel_tensor_t** out_tensors);
  void (*release_tensor)(keel_tensor_t* tensor);
} keel_graph_api_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Passes                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

/* A pass reports what it did through this sink (shown by `keel optimize`, logged otherwise). */
typedef struct keel_pass_report_s {
  uint32_t struct_size;
  void* core_data;
  /* Adds a counter, e.g. ("nodes_fused", 12) or ("bytes_saved", 4096). Counters with one key add up. */
  void (*count)(struct keel_pass_report_s* self, const char* key, int64_t value);
  /* Adds a free-text note, e.g. why a pattern was skipped. */
  void (*note)(struct keel_pass_report_s* self, const char* text);
} keel_pass_report_t;

/* Opaque options, read through keel_options_api_t: a pass's options (from a pipeline config or CLI flags) and a
 * plugin's options (its manifest's [options] table) alike. */
typedef struct keel_options_s keel_options_t;
/* The earlier name, from when only passes had options; the same type, kept so existing plugins compile. */
typedef keel_options_t keel_pass_options_t;

typedef struct keel_pass_def_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* name;        /* unique, e.g. "fold_constants" */
  const char* description; /* one line */
  void* user_data;
  /* Rewrites `graph` in place. `target_device` names the device type the session prefers ("cpu", "cuda"). */
  keel_status_t (*run)(void* user_data, keel_graph_t* graph, const keel_graph_api_t* api, const keel_options_t* options,
                       const char* target_device, keel_pass_report_t* report);
} keel_pass_def_t;

/* Reading options (a pass's or a plugin's). Each returns 1 when the key is present with that type. */
typedef struct keel_options_api_s {
  uint32_t struct_size;
  int (*get_int)(const keel_options_t* o, const char* key, int64_t* out_value);
  int (*get_float)(const keel_options_t* o, const char* key, double* out_value);
  int (*get_bool)(const keel_options_t* o, const char* key, int* out_value);
  int (*get_string)(const keel_options_t* o, const char* key, const char** out_value);
  /* The i-th string of a string-list option. */
  int (*get_string_at)(const keel_options_t* o, const char* key, size_t i, const char** out_value);
} keel_options_api_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* Collectives (implemented by collective plugins: NCCL, Gloo, ...)                                              */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct keel_communicator_s* keel_communicator_t; /* opaque, created by a collective table */

typedef enum keel_reduce_op_e {
  KEEL_REDUCE_SUM = 0,
  KEEL_REDUCE_PROD = 1,
  KEEL_REDUCE_MIN = 2,
  KEEL_REDUCE_MAX = 3,
  KEEL_REDUCE_AVG = 4
} keel_reduce_op_t;

/* A small key-value store through which ranks rendezvous (the core provides one: file, TCP or in-process). */
typedef struct keel_kv_store_s {
  uint32_t struct_size;
  void* core_data;
  keel_status_t (*set)(struct keel_kv_store_s* self, const char* key, const void* value, size_t size);
  /* Waits up to timeout_ms for the key; DEADLINE_EXCEEDED when it never appears. *out_value is owned by the
   * store and valid until the store is released. */
  keel_status_t (*get)(struct keel_kv_store_s* self, const char* key, int64_t timeout_ms, const void** out_value,
                       size_t* out_size);
} keel_kv_store_t;

/* All data entries are stream-ordered on `stream` of the device that owns the buffers. */
typedef struct keel_collective_table_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;
  const char* backend;     /* "nccl", "gloo" */
  const char* device_type; /* the device type whose memory it works on */
  void* user_data;

  keel_status_t (*communicator_create)(void* user_data, keel_kv_store_t* store, int32_t rank, int32_t size,
                                       int32_t device, int64_t timeout_ms, keel_communicator_t* out_comm);
  void (*communicator_release)(void* user_data, keel_communicator_t comm);
  int32_t (*rank)(void* user_data, keel_communicator_t comm);
  int32_t (*size)(void* user_data, keel_communicator_t comm);
  keel_status_t (*all_reduce)(void* user_data, keel_communicator_t comm, const void* send, void* recv, uint64_t count,
                              int32_t dtype, int32_t op, keel_stream_t stream);
  keel_status_t (*broadcast)(void* user_data, keel_communicator_t comm, const void* send, void* recv, uint64_t count,
                             int32_t dtype, int32_t root, keel_stream_t stream);
  keel_status_t (*all_gather)(void* user_data, keel_communicator_t comm, const void* send, void* recv,
                              uint64_t send_count, int32_t dtype, keel_stream_t stream);
  keel_status_t (*reduce_scatter)(void* user_data, keel_communicator_t comm, const void* send, void* recv,
                                  uint64_t recv_count, int32_t dtype, int32_t op, keel_stream_t stream);
  keel_status_t (*send)(void* user_data, keel_communicator_t comm, const void* buf, uint64_t count, int32_t dtype,
                        int32_t peer, keel_stream_t stream);
  keel_status_t (*recv)(void* user_data, keel_communicator_t comm, void* buf, uint64_t count, int32_t dtype,
                        int32_t peer, keel_stream_t stream);
  keel_status_t (*barrier)(void* user_data, keel_communicator_t comm, keel_stream_t stream);
} keel_collective_table_t;

/* ------------------------------------------------------------------------------------------------------------ */
/* The core API (what the core gives a plugin) and the plugin descriptor                                         */
/* ------------------------------------------------------------------------------------------------------------ */

typedef enum keel_log_level_e {
  KEEL_LOG_TRACE = 0,
  KEEL_LOG_DEBUG = 1,
  KEEL_LOG_INFO = 2,
  KEEL_LOG_WARN = 3,
  KEEL_LOG_ERROR = 4
} keel_log_level_t;

typedef struct keel_plugin_handle_s keel_plugin_handle_t; /* opaque: identifies the plugin to the host */

/*
 * The core API: what the core gives a plugin at init (not to be confused with the application C API of keel.h,
 * which host applications call). The pointer stays valid until the plugin's shutdown returns. register_*
 * may only be called during init; the definitions they receive are copied (strings too), except user_data and
 * function pointers, which must stay valid until shutdown.
 * (ABI 1.5) Each environment gives each plugin its own table and handle (`plugin`). No entry of this table, nor of
 * the kernel, graph and options tables, lets an exception or a longjmp out: a failure inside one is returned as a
 * status (OUT_OF_MEMORY, INTERNAL) by entries that return one, and is logged (the entry then returns 0, "" or NULL)
 * by the others. A call through the handle of an environment that was released (a plugin without instances keeping
 * it in a global) returns FAILED_PRECONDITION / 0 instead of touching the released environment.
 */
typedef struct keel_core_api_s {
  uint32_t struct_size;
  uint16_t abi_major;
  uint16_t abi_minor;

  /* A new status object (message copied); release it with keel_status_release unless you return it. */
  keel_status_t (*status_create)(int32_t code, const char* message);
  void (*log)(keel_plugin_handle_t* plugin, int32_t level, const char* message);

  keel_status_t (*register_device)(keel_plugin_handle_t* plugin, const keel_device_table_t* table);
  keel_status_t (*register_kernel)(keel_plugin_handle_t* plugin, const keel_kernel_def_t* kernel);
  keel_status_t (*register_pass)(keel_plugin_handle_t* plugin, const keel_pass_def_t* pass);
  keel_status_t (*register_collective)(keel_plugin_handle_t* plugin, const keel_collective_table_t* table);

  /* 1 when some registered kernel implements (domain, op_type) at `opset` on `device_type` for input dtypes
   * `dtypes` (one per input; pass count 0 to ignore dtypes). Passes use it to produce fused ops only where a
   * device can run them. */
  int (*kernel_exists)(keel_plugin_handle_t* plugin, const char* domain, const char* op_type, int32_t opset,
                       const char* device_type, const int32_t* dtypes, size_t count);

  const keel_kernel_api_t* kernel;
  const keel_graph_api_t* graph;
  const keel_options_api_t* options;

  /* The manifest's [options] table, read like pass options (may be empty). */
  const keel_options_t* plugin_options;
  /* The directory holding the plugin's manifest (to find data files beside it). */
  const char* plugin_dir;

  /* (ABI 1.1) Registers a claim hook for a device type (see keel_claimer_def_t); ranked by the plugin's priority.
   * Check KEEL_HAS_MEMBER(host, keel_core_api_t, register_claimer) first: an older core does not have it. */
  keel_status_t (*register_claimer)(keel_plugin_handle_t* plugin, const keel_claimer_def_t* def);

  /* (ABI 1.2) The priority of the kernel a session would pick for (domain, op_type) at `opset` on `device_type`
   * (the highest-ranked registered kernel accepting `dtypes`, as kernel_exists), or INT32_MIN when there is none.
   * Fusion passes compare it with the priority of the ops a fused op would replace, so that a rewrite never moves
   * work from a device's own kernels onto a lower-ranked one (e.g. the reference keel.FusedConv in place of
   * oneDNN's Conv). Check KEEL_HAS_MEMBER(host, keel_core_api_t, kernel_priority) first. */
  int32_t (*kernel_priority)(keel_plugin_handle_t* plugin, const char* domain, const char* op_type, int32_t opset,
                             const char* device_type, const int32_t* dtypes, size_t count);
} keel_core_api_t;

/* The earlier name; the same type, kept so existing plugins compile. */
typedef keel_core_api_t keel_host_api_t;

typedef enum keel_plugin_kind_e {
  KEEL_PLUGIN_KIND_DEVICE = 1,
  KEEL_PLUGIN_KIND_COLLECTIVE = 2,
  KEEL_PLUGIN_KIND_PASS = 3,
} keel_plugin_kind_t;

/* The static descriptor the entry symbol returns. */
typedef struct keel_plugin_s {
  uint32_t struct_size;
  uint16_t abi_major; /* KEEL_PLUGIN_ABI_MAJOR as the plugin was compiled */
  uint16_t abi_minor; /* KEEL_PLUGIN_ABI_MINOR as the plugin was compiled */
  const char* name;   /* must equal the manifest's name */
  const char* version;
  int32_t kind; /* keel_plugin_kind_t */
  /* Registers what the plugin provides. An error status makes the core skip the plugin (and undo what it
   * registered); the reason is recorded. (ABI 1.5) May be NULL when init_instance is set (such a plugin then needs a
   * core of ABI 1.5 or newer). */
  keel_status_t (*init)(const keel_core_api_t* host, keel_plugin_handle_t* plugin);
  /* (optional) Called once before the library is unloaded, after every session using it is gone. */
  void (*shutdown)(void);

  /*
   * (ABI 1.5, optional) Per-environment lifecycle. A process may hold several environments, each loading the same
   * plugin library once: `init`/`shutdown` above have nowhere to keep state but globals, which the environments would
   * share (and the first shutdown would clear under the others). A plugin that sets init_instance gets, for every
   * environment that loads it, one call of init_instance (instead of init) that registers what the plugin provides,
   * as init does, and returns in *out_instance a pointer to that environment's own plugin state (its copy of
   * `host`, options, caches; NULL is allowed). The core hands the instance back to shutdown_instance (instead of
   * shutdown) exactly once, when that environment is released, after every session of the environment is gone; other
   * environments' instances are unaffected. Put the instance in the user_data of the tables and definitions it
   * registers to reach it from their entries. An error status from init_instance: as from init (*out_instance is
   * ignored and shutdown_instance not called). Calls for different environments may come from different threads
   * at the same time. `init` may stay set for cores older than 1.5, which call it instead (and shutdown with it).
   * A plugin without init_instance is initialised by `init` once per environment, and its `shutdown` is called when
   * the last environment that initialised it is released (not at each release: its globals are shared). The core
   * calls such a plugin's `init` for one environment at a time and never beside its `shutdown`, even when
   * environments are created and released on several threads; its entries may still run (for other environments'
   * sessions) while an `init` stores its globals, so a global written there should be atomic.
   */
  keel_status_t (*init_instance)(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance);
  void (*shutdown_instance)(void* instance); /* (ABI 1.5, optional) required with init_instance */
} keel_plugin_t;

typedef const keel_plugin_t* (*keel_plugin_entry_fn)(void);

/* Each plugin library defines exactly this function:
 *   KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &my_plugin; } */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KEEL_PLUGIN_H_ */
