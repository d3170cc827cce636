/*
 * sim_device.c — an out-of-tree Keel device plugin: a simulated accelerator, "sim".
 *
 * Built against the installed SDK alone (find_package(Keel) → keel::sdk: <keel/plugin.h>, nothing to link). It is
 * the null skeleton (plugins/null in Keel's tree) filled in:
 *  - device memory is one malloc'd arena per process, carved by a first-fit allocator. The capability bits do NOT
 *    say KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY, so the core treats it as device memory: it allocates activations of
 *    sim nodes here and inserts copies (through `copy`) wherever a value crosses between the CPU and sim;
 *  - three f32 kernels: Relu, Add (with ONNX multidirectional broadcasting) and MatMul (A of rank >= 2 times a 2-D
 *    B), written in C++ over the SDK's kernel layer <keel/kernel.hpp> (sim_kernels.cc). Every other op, and every
 *    case these reject in `create`, falls back to the CPU.
 * The manifest's [options] may set `arena_mb` (default 64).
 *
 * The entries check what they are given (pointers inside the arena, shapes), so a bug in the core's copies shows up
 * as an error status naming the problem rather than as memory corruption.
 */
#include <keel/plugin.h>

#include "sim_device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const keel_core_api_t* g_host = NULL;
static keel_plugin_handle_t* g_plugin = NULL;

static keel_status_t sim_error(int32_t code, const char* message) { return g_host->status_create(code, message); }

/* ------------------------------------------------------------------------------------------------------------ */
/* The arena: first-fit over a sorted list of allocated blocks                                                   */
/* ------------------------------------------------------------------------------------------------------------ */

typedef struct sim_block_s {
  uint64_t offset, size;
  struct sim_block_s* next;
} sim_block_t;

typedef struct sim_state_s {
  pthread_mutex_t mu;
  unsigned char* arena;
  uint64_t arena_bytes;
  uint64_t in_use;
  sim_block_t* blocks; /* sorted by offset */
} sim_state_t;

static sim_state_t g_sim = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, NULL};

int sim_owns(const void* p, uint64_t bytes) {
  const unsigned char* c = (const unsigned char*)p;
  return c >= g_sim.arena && bytes <= g_sim.arena_bytes && c - g_sim.arena <= (ptrdiff_t)(g_sim.arena_bytes - bytes);
}

static keel_status_t sim_device_count(void* user_data, int32_t* out_count) {
  (void)user_data;
  *out_count = 1;
  return NULL;
}

static keel_status_t sim_get_properties(void* user_data, int32_t device, keel_device_properties_t* out_props) {
  (void)user_data;
  if (device != 0) return sim_error(KEEL_STATUS_OUT_OF_RANGE, "sim: there is only device 0");
  if (KEEL_HAS_MEMBER(out_props, keel_device_properties_t, name))
    snprintf(out_props->name, sizeof out_props->name, "Keel simulated accelerator (%llu MiB arena)",
             (unsigned long long)(g_sim.arena_bytes >> 20));
  if (KEEL_HAS_MEMBER(out_props, keel_device_properties_t, total_memory)) out_props->total_memory = g_sim.arena_bytes;
  if (KEEL_HAS_MEMBER(out_props, keel_device_properties_t, free_memory)) {
    pthread_mutex_lock(&g_sim.mu);
    out_props->free_memory = g_sim.arena_bytes - g_sim.in_use;
    pthread_mutex_unlock(&g_sim.mu);
  }
  if (KEEL_HAS_MEMBER(out_props, keel_device_properties_t, capabilities)) out_props->capabilities = 0;
  return NULL;
}

static keel_status_t sim_allocate(void* user_data, int32_t device, uint64_t bytes, uint64_t alignment, void** out_ptr) {
  sim_block_t **link, *b;
  uint64_t start = 0;
  (void)user_data;
  *out_ptr = NULL;
  if (device != 0) return sim_error(KEEL_STATUS_OUT_OF_RANGE, "sim: there is only device 0");
  if (alignment < 64) alignment = 64;
  if (bytes == 0) bytes = 1;
  pthread_mutex_lock(&g_sim.mu);
  for (link = &g_sim.blocks;; link = &(*link)->next) {
    uint64_t aligned = (start + alignment - 1) & ~(alignment - 1);
    uint64_t end = *link ? (*link)->offset : g_sim.arena_bytes;
    if (aligned <= end && end - aligned >= bytes) {
      b = (sim_block_t*)malloc(sizeof *b);
      if (b == NULL) break;
      b->offset = aligned;
      b->size = bytes;
      b->next = *link;
      *link = b;
      g_sim.in_use += bytes;
      *out_ptr = g_sim.arena + aligned;
      pthread_mutex_unlock(&g_sim.mu);
      return NULL;
    }
    if (*link == NULL) break;
    start = (*link)->offset + (*link)->size;
  }
  pthread_mutex_unlock(&g_sim.mu);
  return sim_error(KEEL_STATUS_OUT_OF_MEMORY, "sim: the arena is full (raise [options] arena_mb in the manifest)");
}

static void sim_free(void* user_data, int32_t device, void* ptr) {
  sim_block_t** link;
  (void)user_data, (void)device;
  if (ptr == NULL) return;
  pthread_mutex_lock(&g_sim.mu);
  for (link = &g_sim.blocks; *link; link = &(*link)->next) {
    if (g_sim.arena + (*link)->offset == (unsigned char*)ptr) {
      sim_block_t* b = *link;
      *link = b->next;
      g_sim.in_use -= b->size;
      free(b);
      break;
    }
  }
  pthread_mutex_unlock(&g_sim.mu);
}

static keel_status_t sim_copy(void* user_data, int32_t kind, int32_t dst_device, void* dst, int32_t src_device,
                              const void* src, uint64_t bytes, keel_stream_t stream) {
  int dst_on_sim = kind == KEEL_COPY_HOST_TO_DEVICE || kind == KEEL_COPY_DEVICE_TO_DEVICE;
  int src_on_sim = kind == KEEL_COPY_DEVICE_TO_HOST || kind == KEEL_COPY_DEVICE_TO_DEVICE;
  (void)user_data, (void)stream;
  if ((dst_on_sim && (dst_device != 0 || !sim_owns(dst, bytes))) ||
      (src_on_sim && (src_device != 0 || !sim_owns(src, bytes)))) {
    return sim_error(KEEL_STATUS_INVALID_ARGUMENT, "sim: copy with a device pointer outside the sim arena");
  }
  if (bytes > 0) memmove(dst, src, bytes);
  return NULL;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Kernels                                                                                                       */
/* ------------------------------------------------------------------------------------------------------------ */

/* In C++ over the SDK's kernel layer: sim_kernels.cc. */

/* ------------------------------------------------------------------------------------------------------------ */
/* Registration                                                                                                  */
/* ------------------------------------------------------------------------------------------------------------ */

static keel_status_t sim_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  keel_device_table_t table;
  keel_status_t st;
  int64_t arena_mb = 64;
  char msg[160];
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, plugin_options)) return NULL;
  g_host = host;
  g_plugin = plugin;
  if (host->options && host->plugin_options) host->options->get_int(host->plugin_options, "arena_mb", &arena_mb);
  if (arena_mb < 1 || arena_mb > 65536)
    return sim_error(KEEL_STATUS_INVALID_ARGUMENT, "sim: arena_mb must be 1..65536");
  g_sim.arena_bytes = (uint64_t)arena_mb << 20;
  g_sim.arena = (unsigned char*)malloc(g_sim.arena_bytes);
  if (g_sim.arena == NULL) return sim_error(KEEL_STATUS_UNAVAILABLE, "sim: cannot allocate the arena");

  memset(&table, 0, sizeof table);
  table.struct_size = sizeof table;
  table.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  table.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  table.device_type = "sim";
  table.device_count = sim_device_count;
  table.get_properties = sim_get_properties;
  table.allocate = sim_allocate;
  table.free = sim_free;
  table.copy = sim_copy;
  /* No streams: a synchronous device. */
  if ((st = host->register_device(plugin, &table)) != NULL) return st;
  if ((st = sim_register_kernels(host, plugin)) != NULL) return st;
  snprintf(msg, sizeof msg, "sim: device 'sim' with a %lld MiB arena; kernels Relu, Add, MatMul (f32)",
           (long long)arena_mb);
  host->log(plugin, KEEL_LOG_INFO, msg);
  return NULL;
}

static void sim_shutdown(void) {
  sim_block_t* b = g_sim.blocks;
  while (b) {
    sim_block_t* next = b->next;
    free(b);
    b = next;
  }
  g_sim.blocks = NULL;
  free(g_sim.arena);
  g_sim.arena = NULL;
  g_host = NULL;
}

static const keel_plugin_t kSimPlugin = {.struct_size = sizeof(keel_plugin_t),
                                         .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                         .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                         .name = "sim",
                                         .version = "0.1.0",
                                         .kind = KEEL_PLUGIN_KIND_DEVICE,
                                         .init = sim_init,
                                         .shutdown = sim_shutdown};

KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kSimPlugin; }
