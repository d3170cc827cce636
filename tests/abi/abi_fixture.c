/*
 * ABI-compatibility fixtures: one device plugin ("abi_old" / "abi_new", device type ABI_DEVICE_TYPE) with a Relu
 * kernel, compiled two ways.
 *
 * ABI_OLD_MINOR: as if built against an older minor of the SDK — every struct it hands over says abi_minor 0 and a
 * struct_size that ends before the members the older layout did not have yet (the descriptor without `shutdown`,
 * the device table without `claim_subgraphs`, the kernel without `release`). The members past struct_size are
 * filled with a poison pointer: a core that reads beyond struct_size calls it and crashes, so the test fails loudly.
 *
 * ABI_NEW_MINOR: as if built against a newer minor — abi_minor = ours + 1 and every struct larger than ours, with
 * members the core does not know (which it must ignore).
 */
#include <keel/plugin.h>

#include <stdlib.h>
#include <string.h>

#ifndef ABI_DEVICE_TYPE
#error define ABI_DEVICE_TYPE
#endif

static const keel_core_api_t* g_host = NULL;

static void poison_fn(void) { abort(); } /* never called when the core honours struct_size */
#define POISON(type) ((type)(void (*)(void))poison_fn)

static keel_status_t dev_count(void* u, int32_t* n) {
  (void)u;
  *n = 1;
  return NULL;
}
static keel_status_t dev_alloc(void* u, int32_t d, uint64_t bytes, uint64_t align, void** out) {
  (void)u, (void)d, (void)align;
  *out = malloc(bytes ? bytes : 1);
  return *out ? NULL : g_host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "abi fixture: malloc failed");
}
static void dev_free(void* u, int32_t d, void* p) {
  (void)u, (void)d;
  free(p);
}
static keel_status_t dev_copy(void* u, int32_t kind, int32_t dd, void* dst, int32_t sd, const void* src, uint64_t n,
                              keel_stream_t s) {
  (void)u, (void)kind, (void)dd, (void)sd, (void)s;
  memcpy(dst, src, n);
  return NULL;
}
static keel_status_t relu(void* state, keel_kernel_context_t* ctx) {
  const keel_kernel_api_t* k = g_host->kernel;
  const keel_tensor_t* x = k->input(ctx, 0);
  keel_tensor_t* y = NULL;
  keel_status_t st;
  uint64_t i;
  (void)state;
  if ((st = k->output(ctx, 0, x->ndim, x->dims, &y)) != NULL) return st;
  for (i = 0; i < x->byte_size / 4; ++i) {
    float v = ((const float*)x->data)[i];
    ((float*)y->data)[i] = v > 0 ? v : 0;
  }
#if defined(ABI_NEW_MINOR)
  /* A newer plugin reports a profile step (ABI 1.3) in a larger record than the core knows. */
  if (KEEL_HAS_MEMBER(k, keel_kernel_api_t, profile_step) && k->profiling(ctx)) {
    struct {
      keel_profile_step_t base;
      void* future_entry;
    } step;
    const char* node = k->node_name(ctx);
    memset(&step, 0, sizeof step);
    step.base.struct_size = (uint32_t)sizeof step;
    step.base.kind = "relu_loop";
    step.base.op_type = "Relu";
    step.base.node_names = &node;
    step.base.node_count = 1;
    step.base.time_ms = 0.001;
    step.future_entry = (void*)poison_fn;
    if ((st = k->profile_step(ctx, &step.base)) != NULL) return st;
  }
#endif
  return NULL;
}

static const int32_t kF32[] = {KEEL_DTYPE_F32};
#if defined(ABI_OLD_MINOR)
/* Before ABI 1.5 a type constraint had no header: the old layout, which the core reads for abi_minor < 5. */
static const keel_type_constraint_v0_t kT[] = {{"T", kF32, 1}};
#define CONSTRAINTS ((const keel_type_constraint_t*)(const void*)kT)
#else
/* A newer plugin's constraint is larger than ours (a member the core does not know): the core steps by its size. */
typedef struct {
  keel_type_constraint_t base;
  void* future_member;
} constraint_t;
static const constraint_t kT[] = {
    {{(uint32_t)sizeof(constraint_t), KEEL_PLUGIN_ABI_MAJOR, KEEL_PLUGIN_ABI_MINOR + 1, "T", kF32, 1}, NULL}};
#define CONSTRAINTS (&kT[0].base)
#endif

#if defined(ABI_OLD_MINOR)
#define FIXTURE_NAME "abi_old"
#define FIXTURE_MINOR 0
#define TABLE_SIZE offsetof(keel_device_table_t, claim_subgraphs)
#define KERNEL_SIZE offsetof(keel_kernel_def_t, release)
#define PLUGIN_SIZE offsetof(keel_plugin_t, shutdown)
typedef keel_device_table_t table_t;
typedef keel_kernel_def_t kernel_t;
typedef keel_plugin_t plugin_t;
#define BASE(x) (x)
#elif defined(ABI_NEW_MINOR)
#define FIXTURE_NAME "abi_new"
#define FIXTURE_MINOR (KEEL_PLUGIN_ABI_MINOR + 1)
/* The newer layouts: ours plus members appended by the (imaginary) next minor. */
typedef struct {
  keel_device_table_t base;
  void* future_entry;
  uint64_t future_flags;
} table_t;
typedef struct {
  keel_kernel_def_t base;
  void* future_entry;
} kernel_t;
typedef struct {
  keel_plugin_t base;
  void* future_entry;
} plugin_t;
#define TABLE_SIZE sizeof(table_t)
#define KERNEL_SIZE sizeof(kernel_t)
#define PLUGIN_SIZE sizeof(plugin_t)
#define BASE(x) (x).base
#else
#error define ABI_OLD_MINOR or ABI_NEW_MINOR
#endif

static keel_status_t fixture_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  table_t table;
  kernel_t kernel;
  keel_status_t st;
  g_host = host;
  /* Fill with poison first: whatever the layout leaves past struct_size must never be read. */
  memset(&table, 0xA5, sizeof table);
  memset(&kernel, 0xA5, sizeof kernel);

  BASE(table).struct_size = (uint32_t)TABLE_SIZE;
  BASE(table).abi_major = KEEL_PLUGIN_ABI_MAJOR;
  BASE(table).abi_minor = FIXTURE_MINOR;
  BASE(table).device_type = ABI_DEVICE_TYPE;
  BASE(table).user_data = NULL;
  BASE(table).device_count = dev_count;
  BASE(table).get_properties = NULL;
  BASE(table).allocate = dev_alloc;
  BASE(table).free = dev_free;
  BASE(table).allocate_pinned_host = NULL;
  BASE(table).free_pinned_host = NULL;
  BASE(table).copy = dev_copy;
  BASE(table).stream_create = NULL;
  BASE(table).stream_release = NULL;
  BASE(table).stream_synchronize = NULL;
  BASE(table).event_create = NULL;
  BASE(table).event_release = NULL;
  BASE(table).event_record = NULL;
  BASE(table).stream_wait_event = NULL;
  BASE(table).event_synchronize = NULL;
  BASE(table).device_synchronize = NULL;
#if defined(ABI_OLD_MINOR)
  table.claim_subgraphs = POISON(keel_status_t(*)(void*, const struct keel_graph_s*, const struct keel_graph_api_s*,
                                                  struct keel_subgraph_sink_s*));
#else
  BASE(table).claim_subgraphs = NULL;
  table.future_entry = (void*)poison_fn;
#endif
  if ((st = host->register_device(plugin, &BASE(table))) != NULL) return st;

  BASE(kernel).struct_size = (uint32_t)KERNEL_SIZE;
  BASE(kernel).abi_major = KEEL_PLUGIN_ABI_MAJOR;
  BASE(kernel).abi_minor = FIXTURE_MINOR;
  BASE(kernel).name = FIXTURE_NAME "_f32_relu";
  BASE(kernel).domain = "";
  BASE(kernel).op_type = "Relu";
  BASE(kernel).since_version = 6;
  BASE(kernel).end_version = 0;
  BASE(kernel).device_type = ABI_DEVICE_TYPE;
  BASE(kernel).constraints = CONSTRAINTS;
  BASE(kernel).constraint_count = 1;
  BASE(kernel).user_data = NULL;
  BASE(kernel).create = NULL;
  BASE(kernel).compute = relu;
#if defined(ABI_OLD_MINOR)
  kernel.release = POISON(void (*)(void*));
#else
  BASE(kernel).release = NULL;
  kernel.future_entry = (void*)poison_fn;
#endif
  return host->register_kernel(plugin, &BASE(kernel));
}

#if defined(ABI_OLD_MINOR)
/* Members past PLUGIN_SIZE (shutdown onwards) are poison or zero: the core must not read them. */
static const plugin_t kPlugin = {.struct_size = (uint32_t)PLUGIN_SIZE,
                                 .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                 .abi_minor = FIXTURE_MINOR,
                                 .name = FIXTURE_NAME,
                                 .version = "0.0.1",
                                 .kind = KEEL_PLUGIN_KIND_DEVICE,
                                 .init = fixture_init,
                                 .shutdown = POISON(void (*)(void))};
#define PLUGIN_PTR (&kPlugin)
#else
static const plugin_t kPlugin = {.base = {.struct_size = (uint32_t)PLUGIN_SIZE,
                                          .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                          .abi_minor = FIXTURE_MINOR,
                                          .name = FIXTURE_NAME,
                                          .version = "0.0.1",
                                          .kind = KEEL_PLUGIN_KIND_DEVICE,
                                          .init = fixture_init},
                                 .future_entry = (void*)poison_fn};
#define PLUGIN_PTR (&kPlugin.base)
#endif

KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return PLUGIN_PTR; }
