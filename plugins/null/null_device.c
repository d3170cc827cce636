/*
 * plugins/null/null_device.c — a device plugin skeleton for vendors to copy (see README.md beside it).
 *
 * Plain C against <keel/plugin.h> only: no core header, no C++ symbol of libkeel_core. Every entry of the device
 * table is present and returns an UNIMPLEMENTED status, except:
 *   - device_count, which reports 1 so that the plugin "loads" and `keel plugins` shows it;
 *   - get_properties, which fills in a name so that `keel plugins` has something to show;
 *   - the entries that return void (free, free_pinned_host, stream_release, event_release), which do nothing.
 * It registers one device type, "null", and one example kernel (ONNX Relu) whose compute returns UNIMPLEMENTED.
 *
 * To start a real backend: rename "null" everywhere, replace each UNIMPLEMENTED body with the real work, and delete
 * the optional entries you do not need (set them to NULL: the core then treats the device as synchronous).
 */
#include <keel/plugin.h>

#include <stdatomic.h>
#include <string.h>

/* The host's tables, kept from init until shutdown (the pointer stays valid until shutdown returns). Atomic: a
 * process may create environments on several threads, and each environment's init stores its table here while
 * sessions of the others read it (the status and kernel functions are the same in every table; a plugin with
 * per-environment state sets init_instance instead, see README.md). */
static _Atomic(const keel_core_api_t*) g_host = NULL;

static const keel_core_api_t* host_api(void) { return atomic_load_explicit(&g_host, memory_order_acquire); }

/* Every failure crosses the boundary as a status object created by the host (the host releases it). */
static keel_status_t null_unimplemented(const char* what) {
  return host_api()->status_create(KEEL_STATUS_UNIMPLEMENTED, what);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* The device table                                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */

/* user_data of the device table: whatever state the backend needs (a driver context, a device list, ...). */
typedef struct null_device_state_s {
  int32_t count;
} null_device_state_t;

static null_device_state_t g_state = {1};

/* Required. Report how many devices are present; 0 makes the core skip the plugin ("no device present"). */
static keel_status_t null_device_count(void* user_data, int32_t* out_count) {
  const null_device_state_t* state = (const null_device_state_t*)user_data;
  *out_count = state->count;
  return NULL;
}

/* Fill in what is known; leave the rest 0. `out_props->struct_size` is set by the core: write no further. */
static keel_status_t null_get_properties(void* user_data, int32_t device, keel_device_properties_t* out_props) {
  (void)user_data;
  if (device != 0) return host_api()->status_create(KEEL_STATUS_OUT_OF_RANGE, "null: device index out of range");
  if (KEEL_HAS_MEMBER(out_props, keel_device_properties_t, name)) {
    strncpy(out_props->name, "Keel null device (does nothing)", sizeof(out_props->name) - 1);
    out_props->name[sizeof(out_props->name) - 1] = '\0';
  }
  return NULL;
}

/* Required. Raw device memory; the core pools on top of it, so this may be slow. */
static keel_status_t null_allocate(void* user_data, int32_t device, uint64_t bytes, uint64_t alignment,
                                   void** out_ptr) {
  (void)user_data, (void)device, (void)bytes, (void)alignment;
  *out_ptr = NULL;
  return null_unimplemented("null: allocate is not implemented");
}

/* Required. Frees what allocate returned. Returns nothing: it must not fail. */
static void null_free(void* user_data, int32_t device, void* ptr) { (void)user_data, (void)device, (void)ptr; }

/* Optional (set both to NULL when the device has no page-locked host memory). */
static keel_status_t null_allocate_pinned_host(void* user_data, uint64_t bytes, void** out_ptr) {
  (void)user_data, (void)bytes;
  *out_ptr = NULL;
  return null_unimplemented("null: allocate_pinned_host is not implemented");
}
static void null_free_pinned_host(void* user_data, void* ptr) { (void)user_data, (void)ptr; }

/* Required. Copies between host and device or between devices, ordered on `stream` (NULL = default stream). */
static keel_status_t null_copy(void* user_data, int32_t kind, int32_t dst_device, void* dst, int32_t src_device,
                               const void* src, uint64_t bytes, keel_stream_t stream) {
  (void)user_data, (void)kind, (void)dst_device, (void)dst, (void)src_device, (void)src, (void)bytes, (void)stream;
  return null_unimplemented("null: copy is not implemented");
}

/* Streams and events: optional as a group (NULL = a synchronous device that runs everything in order). */
static keel_status_t null_stream_create(void* user_data, int32_t device, keel_stream_t* out_stream) {
  (void)user_data, (void)device;
  *out_stream = NULL;
  return null_unimplemented("null: stream_create is not implemented");
}
static void null_stream_release(void* user_data, keel_stream_t stream) { (void)user_data, (void)stream; }
static keel_status_t null_stream_synchronize(void* user_data, keel_stream_t stream) {
  (void)user_data, (void)stream;
  return null_unimplemented("null: stream_synchronize is not implemented");
}
static keel_status_t null_event_create(void* user_data, int32_t device, keel_event_t* out_event) {
  (void)user_data, (void)device;
  *out_event = NULL;
  return null_unimplemented("null: event_create is not implemented");
}
static void null_event_release(void* user_data, keel_event_t event) { (void)user_data, (void)event; }
static keel_status_t null_event_record(void* user_data, keel_event_t event, keel_stream_t stream) {
  (void)user_data, (void)event, (void)stream;
  return null_unimplemented("null: event_record is not implemented");
}
static keel_status_t null_stream_wait_event(void* user_data, keel_stream_t stream, keel_event_t event) {
  (void)user_data, (void)stream, (void)event;
  return null_unimplemented("null: stream_wait_event is not implemented");
}
static keel_status_t null_event_synchronize(void* user_data, keel_event_t event) {
  (void)user_data, (void)event;
  return null_unimplemented("null: event_synchronize is not implemented");
}
static keel_status_t null_device_synchronize(void* user_data, int32_t device) {
  (void)user_data, (void)device;
  return null_unimplemented("null: device_synchronize is not implemented");
}

/* Optional capability: claim connected subgraphs to run as one (leave NULL to be offered single nodes only). */
static keel_status_t null_claim_subgraphs(void* user_data, const struct keel_graph_s* graph,
                                          const struct keel_graph_api_s* api, struct keel_subgraph_sink_s* sink) {
  (void)user_data, (void)graph, (void)api, (void)sink;
  return null_unimplemented("null: claim_subgraphs is not implemented");
}

/* ------------------------------------------------------------------------------------------------------------ */
/* An example kernel: ONNX Relu (opset 6 and later) on "null", for f32                                           */
/* ------------------------------------------------------------------------------------------------------------ */

/* Optional. Decide whether this kernel can run this node and prepare per-node state. Returning UNIMPLEMENTED with
 * a reason is a rejection, not an error: the core tries the next kernel. */
static keel_status_t null_relu_create(void* user_data, keel_kernel_context_t* ctx, void** out_state) {
  (void)ctx;
  *out_state = user_data;
  return NULL;
}

/* Required. Read inputs through host_api()->kernel, allocate outputs with host_api()->kernel->output, write them. */
static keel_status_t null_relu_compute(void* state, keel_kernel_context_t* ctx) {
  (void)state, (void)ctx;
  return null_unimplemented("null: Relu compute is not implemented");
}

static const int32_t kNullReluDtypes[] = {KEEL_DTYPE_F32};
static const keel_type_constraint_t kNullReluConstraints[] = {
    {KEEL_TYPE_CONSTRAINT_HEADER, "T", kNullReluDtypes, sizeof(kNullReluDtypes) / sizeof(kNullReluDtypes[0])},
};

/* ------------------------------------------------------------------------------------------------------------ */
/* Registration                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */

static keel_status_t null_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  keel_device_table_t table;
  keel_kernel_def_t relu;
  keel_status_t status;

  /* A newer core may hand a larger table; an older one a smaller one. Check what you use. */
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_kernel)) return NULL; /* cannot even report: skip quietly */
  atomic_store_explicit(&g_host, host, memory_order_release);

  /* The table is copied by the core; user_data and the function pointers must stay valid until shutdown. */
  memset(&table, 0, sizeof(table));
  table.struct_size = sizeof(table);
  table.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  table.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  table.device_type = "null";
  table.user_data = &g_state;
  table.device_count = null_device_count;
  table.get_properties = null_get_properties;
  table.allocate = null_allocate;
  table.free = null_free;
  table.allocate_pinned_host = null_allocate_pinned_host;
  table.free_pinned_host = null_free_pinned_host;
  table.copy = null_copy;
  table.stream_create = null_stream_create;
  table.stream_release = null_stream_release;
  table.stream_synchronize = null_stream_synchronize;
  table.event_create = null_event_create;
  table.event_release = null_event_release;
  table.event_record = null_event_record;
  table.stream_wait_event = null_stream_wait_event;
  table.event_synchronize = null_event_synchronize;
  table.device_synchronize = null_device_synchronize;
  table.claim_subgraphs = null_claim_subgraphs;
  /* On error (e.g. UNAVAILABLE when device_count reports 0) return the status: the core undoes the registrations
   * and records the reason. */
  status = host->register_device(plugin, &table);
  if (status != NULL) return status;

  memset(&relu, 0, sizeof(relu));
  relu.struct_size = sizeof(relu);
  relu.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  relu.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  relu.name = "null_f32_relu";
  relu.domain = "";
  relu.op_type = "Relu";
  relu.since_version = 6;
  relu.end_version = 0;
  relu.device_type = "null";
  relu.constraints = kNullReluConstraints;
  relu.constraint_count = sizeof(kNullReluConstraints) / sizeof(kNullReluConstraints[0]);
  relu.user_data = NULL;
  relu.create = null_relu_create;
  relu.compute = null_relu_compute;
  relu.release = NULL;
  status = host->register_kernel(plugin, &relu);
  if (status != NULL) return status;

  host->log(plugin, KEEL_LOG_DEBUG, "null: registered device type 'null' and kernel null_f32_relu");
  return NULL;
}

/* Optional. Called once before the library is unloaded, after every session using it is gone. */
static void null_shutdown(void) { atomic_store_explicit(&g_host, NULL, memory_order_release); }

static const keel_plugin_t kNullPlugin = {
    .struct_size = sizeof(keel_plugin_t),
    .abi_major = KEEL_PLUGIN_ABI_MAJOR,
    .abi_minor = KEEL_PLUGIN_ABI_MINOR,
    .name = "null", /* must equal the manifest's name */
    .version = "0.1.0",
    .kind = KEEL_PLUGIN_KIND_DEVICE,
    .init = null_init,
    .shutdown = null_shutdown,
    /* init_instance/shutdown_instance (per-environment state) stay NULL: this plugin keeps none. */
};

/* The one exported symbol. */
KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kNullPlugin; }
