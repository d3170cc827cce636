/*
 * A pass plugin in the style of ABI < 1.5 (init / shutdown, state in globals), for embedding_test: it keeps the host
 * table and handle its last init received, as older plugins do, and its pass asks the host through that handle.
 * The core must neither call its shutdown while another environment still uses it, nor free a handle its globals
 * may point at. The test reads the shutdown count through embedding_legacy_shutdowns (a test-only export).
 */
#include <keel/plugin.h>

#include <stddef.h>

static const keel_core_api_t* g_host = NULL;
static keel_plugin_handle_t* g_plugin = NULL;
static int g_shutdowns = 0;

KEEL_PLUGIN_EXPORT int embedding_legacy_shutdowns(void) { return g_shutdowns; }

static keel_status_t legacy_run(void* user_data, keel_graph_t* graph, const keel_graph_api_t* api,
                                const keel_options_t* options, const char* target_device, keel_pass_report_t* report) {
  (void)user_data, (void)graph, (void)api, (void)options, (void)report;
  /* Through whichever handle the last init left here (possibly another environment's, possibly released). */
  if (g_host == NULL) return NULL;
  g_host->kernel_exists(g_plugin, "", "Relu", 17, target_device ? target_device : "cpu", NULL, 0);
  g_host->log(g_plugin, KEEL_LOG_DEBUG, "embedding_legacy: pass ran");
  return NULL;
}

static keel_status_t legacy_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  keel_pass_def_t def;
  g_host = host;
  g_plugin = plugin;
  def.struct_size = sizeof def;
  def.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  def.abi_minor = 4; /* as built against ABI 1.4 */
  def.name = "embedding_legacy";
  def.description = "a pass of a plugin with global state";
  def.user_data = NULL;
  def.run = legacy_run;
  return host->register_pass(plugin, &def);
}

static void legacy_shutdown(void) {
  ++g_shutdowns;
  g_host = NULL;
  g_plugin = NULL;
}

/* The descriptor as ABI 1.4 had it: it ends after `shutdown`. */
static const keel_plugin_t kPlugin = {.struct_size = (uint32_t)offsetof(keel_plugin_t, init_instance),
                                      .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                      .abi_minor = 4,
                                      .name = "embedding_legacy",
                                      .version = "0.1.0",
                                      .kind = KEEL_PLUGIN_KIND_PASS,
                                      .init = legacy_init,
                                      .shutdown = legacy_shutdown,
                                      .init_instance = NULL,
                                      .shutdown_instance = NULL};

KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &kPlugin; }
