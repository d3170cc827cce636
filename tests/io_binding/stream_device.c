/*
 * streamdev: a device plugin for io_binding_test that behaves like an asynchronous accelerator without one. Its
 * memory is host memory (malloc) that it does not declare as such, so the core treats it as device memory (copies at
 * its boundaries). It declares KEEL_DEVICE_CAP_STREAMS: every stream is a queue, and work on a stream (its Relu and
 * Add kernels, copies to and from the device) is only queued, and done when the stream is synchronised, an event
 * recorded on it is waited for, or another stream waits for such an event. A core that breaks the stream contract
 * (reads a device-to-host copy before synchronising, orders a consumer before its producer, reuses memory across
 * streams too early) therefore reads stale bytes, and the test sees wrong values. Host-to-device copies read their
 * source when called (the contract), into a staging buffer that the queued write consumes.
 *
 * The test reads what the core did through one exported function, streamdev_stats (counters: copies by kind, copies
 * and computes given a NULL stream, stream syncs, device syncs, event records, stream waits).
 */
#include <keel/plugin.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct streamdev_stats_s {
  int64_t copies[4];          /* by keel_copy_kind_t */
  int64_t null_stream_copies; /* copies given a NULL stream */
  int64_t computes;
  int64_t null_stream_computes;
  int64_t streams_created;
  int64_t stream_syncs;
  int64_t device_syncs;
  int64_t event_records;
  int64_t stream_waits;
} streamdev_stats_t;

enum { OP_COPY = 0, OP_RELU = 1, OP_ADD = 2 };
typedef struct op_s {
  int kind;
  void* dst;
  const void* a;
  const void* b;
  uint64_t n;    /* bytes for OP_COPY, elements otherwise */
  void* to_free; /* a staging buffer freed once the op ran */
} op_t;

typedef struct stream_s {
  pthread_mutex_t mu;
  op_t* ops;
  size_t count, capacity;
} stream_t;

typedef struct event_s {
  stream_t* stream; /* the stream it was recorded on (NULL: never recorded) */
} event_t;

static const keel_core_api_t* g_host = NULL;
static pthread_mutex_t g_stats_mu = PTHREAD_MUTEX_INITIALIZER;
static streamdev_stats_t g_stats;

#define COUNT(member)                  \
  do {                                 \
    pthread_mutex_lock(&g_stats_mu);   \
    ++g_stats.member;                  \
    pthread_mutex_unlock(&g_stats_mu); \
  } while (0)

KEEL_PLUGIN_EXPORT void streamdev_stats(streamdev_stats_t* out) {
  pthread_mutex_lock(&g_stats_mu);
  *out = g_stats;
  pthread_mutex_unlock(&g_stats_mu);
}

static void run_op(const op_t* op) {
  uint64_t i;
  switch (op->kind) {
    case OP_COPY: memcpy(op->dst, op->a, op->n); break;
    case OP_RELU:
      for (i = 0; i < op->n; ++i) {
        float x = ((const float*)op->a)[i];
        ((float*)op->dst)[i] = x > 0.f ? x : 0.f;
      }
      break;
    case OP_ADD:
      for (i = 0; i < op->n; ++i) ((float*)op->dst)[i] = ((const float*)op->a)[i] + ((const float*)op->b)[i];
      break;
  }
  free(op->to_free);
}

/* Runs everything queued on `s`, in order. */
static void drain(stream_t* s) {
  size_t i;
  pthread_mutex_lock(&s->mu);
  for (i = 0; i < s->count; ++i) run_op(&s->ops[i]);
  s->count = 0;
  pthread_mutex_unlock(&s->mu);
}

/* Queues `op` on `s`, or runs it now for the NULL stream. */
static keel_status_t submit(stream_t* s, op_t op) {
  if (s == NULL) {
    run_op(&op);
    return NULL;
  }
  pthread_mutex_lock(&s->mu);
  if (s->count == s->capacity) {
    size_t cap = s->capacity ? s->capacity * 2 : 16;
    op_t* grown = (op_t*)realloc(s->ops, cap * sizeof(op_t));
    if (grown == NULL) {
      pthread_mutex_unlock(&s->mu);
      free(op.to_free);
      return g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: queue");
    }
    s->ops = grown;
    s->capacity = cap;
  }
  s->ops[s->count++] = op;
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static keel_status_t sd_count(void* ud, int32_t* out) {
  (void)ud;
  *out = 1;
  return NULL;
}

static keel_status_t sd_props(void* ud, int32_t device, keel_device_properties_t* p) {
  (void)ud, (void)device;
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, name)) strcpy(p->name, "streamdev (queues, host memory)");
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, capabilities))
    p->capabilities = KEEL_DEVICE_CAP_ASYNC_COPY | KEEL_DEVICE_CAP_STREAMS;
  return NULL;
}

static keel_status_t sd_alloc(void* ud, int32_t device, uint64_t bytes, uint64_t alignment, void** out) {
  (void)ud, (void)device;
  if (alignment < 64) alignment = 64;
  *out = aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment + alignment);
  return *out ? NULL : g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: allocate");
}
static void sd_free(void* ud, int32_t device, void* p) {
  (void)ud, (void)device;
  free(p);
}

static keel_status_t sd_copy(void* ud, int32_t kind, int32_t dst_device, void* dst, int32_t src_device, const void* src,
                             uint64_t bytes, keel_stream_t stream) {
  op_t op;
  (void)ud, (void)dst_device, (void)src_device;
  if (kind < 0 || kind > 3) return g_host->status_create(KEEL_STATUS_INVALID_ARGUMENT, "streamdev: copy kind");
  pthread_mutex_lock(&g_stats_mu);
  ++g_stats.copies[kind];
  if (stream == NULL) ++g_stats.null_stream_copies;
  pthread_mutex_unlock(&g_stats_mu);
  memset(&op, 0, sizeof op);
  op.kind = OP_COPY;
  op.dst = dst;
  op.a = src;
  op.n = bytes;
  if (kind == KEEL_COPY_HOST_TO_DEVICE && stream != NULL) {
    /* The contract: the host source has been read when the call returns. */
    op.to_free = malloc(bytes ? bytes : 1);
    if (op.to_free == NULL) return g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: staging");
    memcpy(op.to_free, src, bytes);
    op.a = op.to_free;
  }
  return submit((stream_t*)stream, op);
}

static keel_status_t sd_stream_create(void* ud, int32_t device, keel_stream_t* out) {
  stream_t* s = (stream_t*)calloc(1, sizeof(stream_t));
  (void)ud, (void)device;
  if (s == NULL) return g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: stream");
  pthread_mutex_init(&s->mu, NULL);
  COUNT(streams_created);
  *out = (keel_stream_t)s;
  return NULL;
}
static void sd_stream_release(void* ud, keel_stream_t stream) {
  stream_t* s = (stream_t*)stream;
  (void)ud;
  if (s == NULL) return;
  drain(s);
  pthread_mutex_destroy(&s->mu);
  free(s->ops);
  free(s);
}
static keel_status_t sd_stream_sync(void* ud, keel_stream_t stream) {
  (void)ud;
  COUNT(stream_syncs);
  if (stream) drain((stream_t*)stream);
  return NULL;
}
static keel_status_t sd_event_create(void* ud, int32_t device, keel_event_t* out) {
  (void)ud, (void)device;
  *out = (keel_event_t)calloc(1, sizeof(event_t));
  return *out ? NULL : g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: event");
}
static void sd_event_release(void* ud, keel_event_t ev) {
  (void)ud;
  free(ev);
}
static keel_status_t sd_event_record(void* ud, keel_event_t ev, keel_stream_t stream) {
  (void)ud;
  COUNT(event_records);
  ((event_t*)ev)->stream = (stream_t*)stream;
  return NULL;
}
/* Waiting for an event: the work recorded before it runs now (a real device would order it without the host). */
static keel_status_t sd_stream_wait_event(void* ud, keel_stream_t stream, keel_event_t ev) {
  event_t* e = (event_t*)ev;
  (void)ud, (void)stream;
  COUNT(stream_waits);
  if (e->stream) drain(e->stream);
  return NULL;
}
static keel_status_t sd_event_sync(void* ud, keel_event_t ev) {
  event_t* e = (event_t*)ev;
  (void)ud;
  if (e->stream) drain(e->stream);
  return NULL;
}
static keel_status_t sd_device_sync(void* ud, int32_t device) {
  (void)ud, (void)device;
  COUNT(device_syncs);
  return NULL;
}

/* Relu and Add on f32: queued on the context's stream. */
static keel_status_t elementwise(void* state, keel_kernel_context_t* ctx, int kind) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* a = k->input(ctx, 0);
  const keel_tensor_t* b = kind == OP_ADD ? k->input(ctx, 1) : NULL;
  keel_tensor_t* y = NULL;
  keel_stream_t stream = k->stream(ctx);
  keel_status_t st;
  op_t op;
  (void)state;
  if (a == NULL || a->dtype != KEEL_DTYPE_F32 || (kind == OP_ADD && (b == NULL || b->byte_size != a->byte_size)))
    return g_host->status_create(KEEL_STATUS_UNIMPLEMENTED, "streamdev: f32 of one shape only");
  pthread_mutex_lock(&g_stats_mu);
  ++g_stats.computes;
  if (stream == NULL) ++g_stats.null_stream_computes;
  pthread_mutex_unlock(&g_stats_mu);
  if ((st = k->output(ctx, 0, a->ndim, a->dims, &y)) != NULL) return st;
  memset(&op, 0, sizeof op);
  op.kind = kind;
  op.dst = y->data;
  op.a = a->data;
  op.b = b ? b->data : NULL;
  op.n = a->byte_size / sizeof(float);
  return submit((stream_t*)stream, op);
}
static keel_status_t relu_compute(void* state, keel_kernel_context_t* ctx) { return elementwise(state, ctx, OP_RELU); }
static keel_status_t add_compute(void* state, keel_kernel_context_t* ctx) { return elementwise(state, ctx, OP_ADD); }

static keel_status_t sd_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  static const int32_t f32[] = {KEEL_DTYPE_F32};
  keel_type_constraint_t t = {KEEL_TYPE_CONSTRAINT_HEADER, "T", f32, 1};
  keel_device_table_t table;
  keel_kernel_def_t def;
  keel_status_t st;
  g_host = host;
  memset(&table, 0, sizeof table);
  table.struct_size = sizeof table;
  table.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  table.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  table.device_type = "streamdev";
  table.device_count = sd_count;
  table.get_properties = sd_props;
  table.allocate = sd_alloc;
  table.free = sd_free;
  table.copy = sd_copy;
  table.stream_create = sd_stream_create;
  table.stream_release = sd_stream_release;
  table.stream_synchronize = sd_stream_sync;
  table.event_create = sd_event_create;
  table.event_release = sd_event_release;
  table.event_record = sd_event_record;
  table.stream_wait_event = sd_stream_wait_event;
  table.event_synchronize = sd_event_sync;
  table.device_synchronize = sd_device_sync;
  if ((st = host->register_device(plugin, &table)) != NULL) return st;

  memset(&def, 0, sizeof def);
  def.struct_size = sizeof def;
  def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  def.domain = "";
  def.since_version = 1;
  def.device_type = "streamdev";
  def.constraints = &t;
  def.constraint_count = 1;
  def.flags = KEEL_KERNEL_FLAG_REENTRANT;
  def.name = "streamdev_relu";
  def.op_type = "Relu";
  def.compute = relu_compute;
  if ((st = host->register_kernel(plugin, &def)) != NULL) return st;
  def.name = "streamdev_add";
  def.op_type = "Add";
  def.compute = add_compute;
  return host->register_kernel(plugin, &def);
}

static const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                                      .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                      .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                      .name = "streamdev",
                                      .version = "0.1.0",
                                      .kind = KEEL_PLUGIN_KIND_DEVICE,
                                      .init = sd_init,
                                      .shutdown = NULL,
                                      .init_instance = NULL,
                                      .shutdown_instance = NULL};

KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kPlugin; }
