/*
 * A pass plugin with per-environment instances (plugin ABI 1.5: init_instance / shutdown_instance), for
 * embedding_test. Each environment that loads it gets its own instance (a number, its host table and handle, the
 * options it was given); the instance logs its creation and its shutdown through its own environment's log, so the
 * test sees which environment got which instance, and that every instance is shut down exactly once.
 */
#include <keel/plugin.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct instance_s {
  const keel_core_api_t* host;
  keel_plugin_handle_t* handle;
  int id;
  int64_t runs;
} instance_t;

static int g_next_id = 0; /* instances are numbered in creation order (the test creates environments one at a time) */

static keel_status_t probe_run(void* user_data, keel_graph_t* graph, const keel_graph_api_t* api,
                               const keel_options_t* options, const char* target_device, keel_pass_report_t* report) {
  instance_t* inst = (instance_t*)user_data;
  char text[96];
  (void)graph, (void)api, (void)options, (void)target_device, (void)report;
  ++inst->runs;
  snprintf(text, sizeof text, "embedding_instance %d: pass run %lld", inst->id, (long long)inst->runs);
  inst->host->log(inst->handle, KEEL_LOG_INFO, text);
  return NULL;
}

static keel_status_t instance_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  instance_t* inst = (instance_t*)calloc(1, sizeof(instance_t));
  keel_pass_def_t def;
  keel_status_t st;
  int64_t threads = -1;
  const char* greeting = "(none)";
  char text[160];
  if (inst == NULL) return host->status_create(KEEL_STATUS_OUT_OF_MEMORY, "embedding_instance: calloc failed");
  inst->host = host;
  inst->handle = plugin;
  inst->id = ++g_next_id;
  host->options->get_int(host->plugin_options, "threads", &threads);
  host->options->get_string(host->plugin_options, "greeting", &greeting);

  def.struct_size = sizeof def;
  def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  def.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  def.name = "embedding_probe";
  def.description = "logs which plugin instance ran it";
  def.user_data = inst;
  def.run = probe_run;
  if ((st = host->register_pass(plugin, &def)) != NULL) {
    free(inst);
    return st;
  }
  snprintf(text, sizeof text, "embedding_instance %d: created (threads=%lld greeting=%s)", inst->id, (long long)threads,
           greeting);
  host->log(plugin, KEEL_LOG_INFO, text);
  *out_instance = inst;
  return NULL;
}

static void instance_shutdown(void* instance) {
  instance_t* inst = (instance_t*)instance;
  char text[96];
  snprintf(text, sizeof text, "embedding_instance %d: shut down", inst->id);
  inst->host->log(inst->handle, KEEL_LOG_INFO, text); /* the host table stays valid until shutdown returns */
  free(inst);
}

static const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                                      .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                      .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                      .name = "embedding_instance",
                                      .version = "0.1.0",
                                      .kind = KEEL_PLUGIN_KIND_PASS,
                                      .init = NULL,
                                      .shutdown = NULL,
                                      .init_instance = instance_init,
                                      .shutdown_instance = instance_shutdown};

KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kPlugin; }
