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
 * and computes given a NULL stream, stream syncs, device syncs, event records, stream waits, collectives and those
 * given a NULL stream).
 *
 * It also registers a collective backend "streamdev" for ranks that are threads of one process (their communicators
 * meet through the rendezvous store): like NCCL, every buffer must be streamdev memory (a host pointer is an
 * INVALID_ARGUMENT error naming the entry), and the result is stream-ordered: the inputs are read when the entry is
 * called (the stream's queued work first), and the output is written by an op queued on the given stream, so a
 * consumer that does not wait for that stream reads stale bytes. all_reduce (sum, avg, min, max on f32 / f64 / i64),
 * broadcast, all_gather and barrier; the others are UNIMPLEMENTED. streamdev_fail_all_reduce(1) makes every
 * all_reduce fail until streamdev_fail_all_reduce(0) (a test of the error path); streamdev_fail_event_record_after(k)
 * makes the calling thread's event record after k more fail, once.
 */
#include <keel/plugin.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  int64_t collectives; /* data entries of the collective backend */
  int64_t null_stream_collectives;
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

/* Set by a test (streamdev_fail_all_reduce): every all_reduce fails (INTERNAL) until cleared. */
static int g_fail_all_reduce = 0;
KEEL_PLUGIN_EXPORT void streamdev_fail_all_reduce(int on) {
  pthread_mutex_lock(&g_stats_mu);
  g_fail_all_reduce = on;
  pthread_mutex_unlock(&g_stats_mu);
}

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

/* One device, or STREAMDEV_DEVICES of them (a test of device indices; all share the one host memory). */
static keel_status_t sd_count(void* ud, int32_t* out) {
  const char* n = getenv("STREAMDEV_DEVICES");
  (void)ud;
  *out = n && atoi(n) > 1 ? atoi(n) : 1;
  return NULL;
}

/* get_properties calls, for a test that the core does not ask on every eager op (streamdev_property_queries). */
static int64_t g_property_queries = 0;
KEEL_PLUGIN_EXPORT int64_t streamdev_property_queries(void) {
  int64_t n;
  pthread_mutex_lock(&g_stats_mu);
  n = g_property_queries;
  pthread_mutex_unlock(&g_stats_mu);
  return n;
}

static keel_status_t sd_props(void* ud, int32_t device, keel_device_properties_t* p) {
  (void)ud, (void)device;
  pthread_mutex_lock(&g_stats_mu);
  ++g_property_queries;
  pthread_mutex_unlock(&g_stats_mu);
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, name)) strcpy(p->name, "streamdev (queues, host memory)");
  if (KEEL_HAS_MEMBER(p, keel_device_properties_t, capabilities))
    p->capabilities = KEEL_DEVICE_CAP_ASYNC_COPY | KEEL_DEVICE_CAP_STREAMS;
  return NULL;
}

/* Every live allocation, so that the collectives can tell device memory from host memory (as NCCL does). */
typedef struct block_s {
  char* at;
  uint64_t bytes;
} block_t;
static pthread_mutex_t g_blocks_mu = PTHREAD_MUTEX_INITIALIZER;
static block_t* g_blocks = NULL;
static size_t g_block_count = 0, g_block_capacity = 0;

static keel_status_t sd_alloc(void* ud, int32_t device, uint64_t bytes, uint64_t alignment, void** out) {
  uint64_t size;
  (void)ud, (void)device;
  if (alignment < 64) alignment = 64;
  size = (bytes + alignment - 1) / alignment * alignment + alignment;
  *out = aligned_alloc(alignment, size);
  if (*out == NULL) return g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: allocate");
  pthread_mutex_lock(&g_blocks_mu);
  if (g_block_count == g_block_capacity) {
    size_t cap = g_block_capacity ? g_block_capacity * 2 : 64;
    block_t* grown = (block_t*)realloc(g_blocks, cap * sizeof(block_t));
    if (grown == NULL) {
      pthread_mutex_unlock(&g_blocks_mu);
      free(*out);
      *out = NULL;
      return g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "streamdev: allocate");
    }
    g_blocks = grown;
    g_block_capacity = cap;
  }
  g_blocks[g_block_count].at = (char*)*out;
  g_blocks[g_block_count].bytes = size;
  ++g_block_count;
  pthread_mutex_unlock(&g_blocks_mu);
  return NULL;
}
static void sd_free(void* ud, int32_t device, void* p) {
  size_t i;
  (void)ud, (void)device;
  pthread_mutex_lock(&g_blocks_mu);
  for (i = 0; i < g_block_count; ++i)
    if (g_blocks[i].at == (char*)p) {
      g_blocks[i] = g_blocks[--g_block_count];
      break;
    }
  pthread_mutex_unlock(&g_blocks_mu);
  free(p);
}
/* 1 when [p, p + bytes) lies inside one live allocation. */
static int is_device_memory(const void* p, uint64_t bytes) {
  size_t i;
  int found = 0;
  pthread_mutex_lock(&g_blocks_mu);
  for (i = 0; i < g_block_count && !found; ++i)
    found = (const char*)p >= g_blocks[i].at && (const char*)p + bytes <= g_blocks[i].at + g_blocks[i].bytes;
  pthread_mutex_unlock(&g_blocks_mu);
  return found;
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
/* Set by a test on a rank's thread (streamdev_fail_event_record_after(k)): that thread's event record after k more
 * fails (INTERNAL), once; -1, the default, never. streamdev_thread_event_records counts the calling thread's records.
 * Thread-local, so that each rank (a thread) fails its own. */
static __thread int64_t t_records_left = -1;
static __thread int64_t t_records = 0;
KEEL_PLUGIN_EXPORT void streamdev_fail_event_record_after(int64_t k) { t_records_left = k; }
KEEL_PLUGIN_EXPORT int64_t streamdev_thread_event_records(void) { return t_records; }

static keel_status_t sd_event_record(void* ud, keel_event_t ev, keel_stream_t stream) {
  (void)ud;
  COUNT(event_records);
  ++t_records;
  if (t_records_left == 0) {
    t_records_left = -1;
    return g_host->status_create(KEEL_STATUS_INTERNAL,
                                 "streamdev event_record: failed on purpose (streamdev_fail_event_record_after)");
  }
  if (t_records_left > 0) --t_records_left;
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

/* ------------------------------------------------------------------------------------------------------------ */
/* The "streamdev" collective backend: ranks are threads of this process.                                        */

/* What the ranks of one communicator share: rank 0 makes it and publishes its address in the store. */
typedef struct group_s {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int32_t size, arrived, released;
  uint64_t generation;
  const void** inputs; /* each rank's input of the collective in progress */
} group_t;

typedef struct comm_s {
  group_t* group;
  int32_t rank, size;
  int64_t timeout_ms;
} comm_t;

static keel_status_t error(int32_t code, const char* entry, const char* what) {
  char m[256];
  snprintf(m, sizeof m, "streamdev %s: %s", entry, what);
  return g_host->status_create(code, m);
}

/* Every rank of the group reaches this before any leaves it, within the timeout. */
static keel_status_t group_barrier(comm_t* c, const char* entry) {
  group_t* g = c->group;
  struct timespec until;
  uint64_t gen;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += c->timeout_ms / 1000;
  until.tv_nsec += (c->timeout_ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec += 1;
    until.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&g->mu);
  gen = g->generation;
  if (++g->arrived == g->size) {
    g->arrived = 0;
    ++g->generation;
    pthread_cond_broadcast(&g->cv);
  }
  while (g->generation == gen) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &until) == ETIMEDOUT && g->generation == gen) {
      --g->arrived;
      pthread_mutex_unlock(&g->mu);
      return error(KEEL_STATUS_DEADLINE_EXCEEDED, entry, "a peer did not arrive within the timeout");
    }
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

static keel_status_t sc_create(void* ud, keel_kv_store_t* store, int32_t rank, int32_t size, int32_t device,
                               int64_t timeout_ms, keel_communicator_t* out) {
  comm_t* c;
  group_t* g = NULL;
  keel_status_t st;
  (void)ud, (void)device;
  *out = NULL;
  if (rank == 0) {
    g = (group_t*)calloc(1, sizeof(group_t));
    if (g == NULL || (g->inputs = (const void**)calloc((size_t)size, sizeof(void*))) == NULL) {
      free(g);
      return error(KEEL_STATUS_OUT_OF_MEMORY, "communicator_create", "group");
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->size = size;
    if ((st = store->set(store, "streamdev_group", &g, sizeof g)) != NULL) return st;
  } else {
    const void* value = NULL;
    size_t bytes = 0;
    if ((st = store->get(store, "streamdev_group", timeout_ms, &value, &bytes)) != NULL) return st;
    if (bytes != sizeof g) return error(KEEL_STATUS_INTERNAL, "communicator_create", "bad group record");
    memcpy(&g, value, sizeof g);
  }
  c = (comm_t*)calloc(1, sizeof(comm_t));
  if (c == NULL) return error(KEEL_STATUS_OUT_OF_MEMORY, "communicator_create", "communicator");
  c->group = g;
  c->rank = rank;
  c->size = size;
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : 60000;
  if ((st = group_barrier(c, "communicator_create")) != NULL) {
    free(c);
    return st;
  }
  *out = (keel_communicator_t)c;
  return NULL;
}
static void sc_release(void* ud, keel_communicator_t comm) {
  comm_t* c = (comm_t*)comm;
  int last;
  (void)ud;
  if (c == NULL) return;
  pthread_mutex_lock(&c->group->mu);
  last = ++c->group->released == c->group->size;
  pthread_mutex_unlock(&c->group->mu);
  if (last) {
    pthread_mutex_destroy(&c->group->mu);
    pthread_cond_destroy(&c->group->cv);
    free(c->group->inputs);
    free(c->group);
  }
  free(c);
}
static int32_t sc_rank(void* ud, keel_communicator_t comm) {
  (void)ud;
  return ((comm_t*)comm)->rank;
}
static int32_t sc_size(void* ud, keel_communicator_t comm) {
  (void)ud;
  return ((comm_t*)comm)->size;
}

static size_t esize_of(int32_t dtype) {
  switch (dtype) {
    case KEEL_DTYPE_F32: return 4;
    case KEEL_DTYPE_F64:
    case KEEL_DTYPE_I64: return 8;
  }
  return 0;
}

/* The body of every data entry: checks the buffers, runs what the stream has queued (the inputs' producers), shares
 * this rank's input, lets `combine` write the result into a staging buffer once every input is there, and queues the
 * staging buffer's copy into `out` on the stream. */
typedef void (*combine_fn)(comm_t* c, char* staged, const void* const* inputs, uint64_t count, int32_t dtype,
                           int32_t arg);
static keel_status_t run_collective(comm_t* c, const char* entry, const void* in, uint64_t in_bytes, void* out,
                                    uint64_t out_bytes, uint64_t count, int32_t dtype, int32_t arg, combine_fn combine,
                                    keel_stream_t stream) {
  char* staged;
  keel_status_t st;
  op_t op;
  if (c == NULL) return error(KEEL_STATUS_INVALID_ARGUMENT, entry, "NULL communicator");
  if (esize_of(dtype) == 0) return error(KEEL_STATUS_UNIMPLEMENTED, entry, "f32, f64 and i64 only");
  if ((in_bytes && !is_device_memory(in, in_bytes)) || (out_bytes && !is_device_memory(out, out_bytes)))
    return error(KEEL_STATUS_INVALID_ARGUMENT, entry, "a buffer is not streamdev memory (a host pointer?)");
  pthread_mutex_lock(&g_stats_mu);
  ++g_stats.collectives;
  if (stream == NULL) ++g_stats.null_stream_collectives;
  pthread_mutex_unlock(&g_stats_mu);
  if (stream) drain((stream_t*)stream);
  staged = (char*)malloc(out_bytes ? out_bytes : 1);
  if (staged == NULL) return error(KEEL_STATUS_OUT_OF_MEMORY, entry, "staging");
  c->group->inputs[c->rank] = in;
  if ((st = group_barrier(c, entry)) != NULL) {
    free(staged);
    return st;
  }
  combine(c, staged, c->group->inputs, count, dtype, arg);
  if ((st = group_barrier(c, entry)) != NULL) { /* every rank has read every input */
    free(staged);
    return st;
  }
  memset(&op, 0, sizeof op);
  op.kind = OP_COPY;
  op.dst = out;
  op.a = staged;
  op.n = out_bytes;
  op.to_free = staged;
  return submit((stream_t*)stream, op);
}

#define REDUCE_LOOP(T)                                             \
  do {                                                             \
    T* o = (T*)staged;                                             \
    for (i = 0; i < count; ++i) {                                  \
      T acc = ((const T*)inputs[0])[i];                            \
      for (r = 1; r < c->size; ++r) {                              \
        T v = ((const T*)inputs[r])[i];                            \
        if (arg == KEEL_REDUCE_MIN) acc = v < acc ? v : acc;       \
        else if (arg == KEEL_REDUCE_MAX) acc = v > acc ? v : acc;  \
        else acc += v;                                             \
      }                                                            \
      o[i] = arg == KEEL_REDUCE_AVG ? (T)(acc / (T)c->size) : acc; \
    }                                                              \
  } while (0)
static void combine_reduce(comm_t* c, char* staged, const void* const* inputs, uint64_t count, int32_t dtype,
                           int32_t arg) {
  uint64_t i;
  int32_t r;
  if (dtype == KEEL_DTYPE_F32) REDUCE_LOOP(float);
  else if (dtype == KEEL_DTYPE_F64) REDUCE_LOOP(double);
  else REDUCE_LOOP(int64_t);
}
static void combine_broadcast(comm_t* c, char* staged, const void* const* inputs, uint64_t count, int32_t dtype,
                              int32_t root) {
  (void)c;
  memcpy(staged, inputs[root], count * esize_of(dtype));
}
static void combine_gather(comm_t* c, char* staged, const void* const* inputs, uint64_t count, int32_t dtype,
                           int32_t arg) {
  const size_t bytes = count * esize_of(dtype);
  int32_t r;
  (void)arg;
  for (r = 0; r < c->size; ++r) memcpy(staged + (size_t)r * bytes, inputs[r], bytes);
}

static keel_status_t sc_all_reduce(void* ud, keel_communicator_t comm, const void* send, void* recv, uint64_t count,
                                   int32_t dtype, int32_t op, keel_stream_t stream) {
  const uint64_t bytes = count * esize_of(dtype);
  int fail;
  (void)ud;
  pthread_mutex_lock(&g_stats_mu);
  fail = g_fail_all_reduce;
  pthread_mutex_unlock(&g_stats_mu);
  if (fail) return error(KEEL_STATUS_INTERNAL, "all_reduce", "failed on purpose (streamdev_fail_all_reduce)");
  if (op != KEEL_REDUCE_SUM && op != KEEL_REDUCE_AVG && op != KEEL_REDUCE_MIN && op != KEEL_REDUCE_MAX)
    return error(KEEL_STATUS_UNIMPLEMENTED, "all_reduce", "sum, avg, min and max only");
  return run_collective((comm_t*)comm, "all_reduce", send, bytes, recv, bytes, count, dtype, op, combine_reduce,
                        stream);
}
static keel_status_t sc_broadcast(void* ud, keel_communicator_t comm, const void* send, void* recv, uint64_t count,
                                  int32_t dtype, int32_t root, keel_stream_t stream) {
  const uint64_t bytes = count * esize_of(dtype);
  comm_t* c = (comm_t*)comm;
  (void)ud;
  if (c && (root < 0 || root >= c->size)) return error(KEEL_STATUS_INVALID_ARGUMENT, "broadcast", "root out of range");
  return run_collective(c, "broadcast", send, bytes, recv, bytes, count, dtype, root, combine_broadcast, stream);
}
static keel_status_t sc_all_gather(void* ud, keel_communicator_t comm, const void* send, void* recv,
                                   uint64_t send_count, int32_t dtype, keel_stream_t stream) {
  const uint64_t bytes = send_count * esize_of(dtype);
  comm_t* c = (comm_t*)comm;
  (void)ud;
  return run_collective(c, "all_gather", send, bytes, recv, c ? bytes * (uint64_t)c->size : 0, send_count, dtype, 0,
                        combine_gather, stream);
}
static keel_status_t sc_barrier(void* ud, keel_communicator_t comm, keel_stream_t stream) {
  (void)ud;
  if (stream) drain((stream_t*)stream);
  return group_barrier((comm_t*)comm, "barrier");
}

static keel_status_t sd_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  static const int32_t f32[] = {KEEL_DTYPE_F32};
  keel_type_constraint_t t = {KEEL_TYPE_CONSTRAINT_HEADER, "T", f32, 1};
  keel_device_table_t table;
  keel_kernel_def_t def;
  keel_collective_table_t coll;
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
  if ((st = host->register_kernel(plugin, &def)) != NULL) return st;

  memset(&coll, 0, sizeof coll);
  coll.struct_size = sizeof coll;
  coll.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  coll.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  coll.backend = "streamdev";
  coll.device_type = "streamdev";
  coll.communicator_create = sc_create;
  coll.communicator_release = sc_release;
  coll.rank = sc_rank;
  coll.size = sc_size;
  coll.all_reduce = sc_all_reduce;
  coll.broadcast = sc_broadcast;
  coll.all_gather = sc_all_gather;
  coll.barrier = sc_barrier;
  return host->register_collective(plugin, &coll);
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
