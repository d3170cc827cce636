/*
 * host_app — a host application that embeds Keel through its C API (keel.h) and nothing else.
 *
 *   host_app MODEL.onnx [--device TYPE]... [--fallback cpu|error] [--input NAME=FILE]... [--seed N] [--print N]
 *            [--plugin-path DIR]... [--verbose]
 *
 * Loads the model, creates a session (preferred devices in the order given; default: every device by priority),
 * prints where each node runs and which nodes fell back, runs it once on the given inputs (raw little-endian files
 * of exactly the input's size) or on random ones (uniform in [-1, 1), dynamic dims = 1), and prints the outputs.
 * Exit status: 0 ok, 1 a Keel error (printed with its code and message), 2 usage.
 */
#include <keel/keel.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LIST 16

static int fail(keel_status_t status, const char* what) {
  fprintf(stderr, "host_app: %s: %s: %s\n", what, keel_status_code_name(status->code), status->message);
  keel_status_release(status);
  return 1;
}

/* Keel's log goes to stderr, so stdout carries only the results. */
static void log_to_stderr(void* user_data, int32_t level, const char* message) {
  static const char* names[] = {"trace", "debug", "info", "warn", "error"};
  (void)user_data;
  fprintf(stderr, "[keel %s] %s\n", names[level >= 0 && level <= 4 ? level : 4], message);
}

static uint32_t g_rng = 12345u;
static float next_uniform(void) { /* xorshift32: deterministic across platforms */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 17;
  g_rng ^= g_rng << 5;
  return (float)(g_rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* Fills `bytes` bytes of dtype `dtype` with random values. */
static void fill_random(int32_t dtype, void* data, uint64_t count) {
  uint64_t i;
  for (i = 0; i < count; ++i) {
    float v = next_uniform();
    switch (dtype) {
      case KEEL_DTYPE_F32: ((float*)data)[i] = v; break;
      case KEEL_DTYPE_F64: ((double*)data)[i] = v; break;
      case KEEL_DTYPE_I64: ((int64_t*)data)[i] = (int64_t)(v * 10); break;
      case KEEL_DTYPE_I32: ((int32_t*)data)[i] = (int32_t)(v * 10); break;
      case KEEL_DTYPE_BOOL: ((uint8_t*)data)[i] = v > 0; break;
      default: memset((char*)data + i * keel_dtype_size(dtype), 0, keel_dtype_size(dtype)); break;
    }
  }
}

static int read_file(const char* path, void* data, uint64_t bytes) {
  FILE* f = fopen(path, "rb");
  long size;
  if (f == NULL) {
    fprintf(stderr, "host_app: cannot open %s\n", path);
    return 0;
  }
  fseek(f, 0, SEEK_END);
  size = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (size < 0 || (uint64_t)size != bytes || fread(data, 1, bytes, f) != bytes) {
    fprintf(stderr, "host_app: %s has %ld bytes, the input needs %llu\n", path, size, (unsigned long long)bytes);
    fclose(f);
    return 0;
  }
  fclose(f);
  return 1;
}

static void print_tensor(const char* name, keel_host_tensor_t t, int max_values) {
  int32_t ndim = keel_host_tensor_ndim(t), dtype = keel_host_tensor_dtype(t), i;
  const int64_t* dims = keel_host_tensor_dims(t);
  int64_t n = keel_host_tensor_element_count(t), k;
  const void* data = keel_host_tensor_data(t);
  printf("output %s: %s[", name, keel_dtype_name(dtype));
  for (i = 0; i < ndim; ++i) printf("%s%lld", i ? ", " : "", (long long)dims[i]);
  printf("] =");
  for (k = 0; k < n && k < max_values; ++k) {
    switch (dtype) {
      case KEEL_DTYPE_F32: printf(" %.6g", ((const float*)data)[k]); break;
      case KEEL_DTYPE_F64: printf(" %.6g", ((const double*)data)[k]); break;
      case KEEL_DTYPE_I64: printf(" %lld", (long long)((const int64_t*)data)[k]); break;
      case KEEL_DTYPE_I32: printf(" %d", ((const int32_t*)data)[k]); break;
      case KEEL_DTYPE_BOOL:
      case KEEL_DTYPE_U8: printf(" %u", ((const uint8_t*)data)[k]); break;
      default: printf(" ?"); break;
    }
  }
  printf("%s\n", n > max_values ? " ..." : "");
}

int main(int argc, char** argv) {
  const char* model_path = NULL;
  const char* devices[MAX_LIST];
  const char* plugin_paths[MAX_LIST];
  const char* input_files[MAX_LIST]; /* "NAME=FILE" */
  int device_count = 0, plugin_path_count = 0, input_file_count = 0, print_count = 8, verbose = 0, i;
  int32_t fallback = KEEL_FALLBACK_CPU;
  keel_environment_options_t env_options = NULL;
  keel_environment_t env = NULL;
  keel_model_t model = NULL;
  keel_session_options_t session_options = NULL;
  keel_session_t session = NULL;
  keel_status_t status = NULL;
  size_t n_in = 0, n_out = 0, n, k;
  keel_host_tensor_t inputs[MAX_LIST], outputs[MAX_LIST];
  const char* input_names[MAX_LIST];
  int rc = 1;

  memset(inputs, 0, sizeof inputs);
  memset(outputs, 0, sizeof outputs);
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    int has_value = i + 1 < argc;
    if (strcmp(a, "--device") == 0 && has_value && device_count < MAX_LIST) {
      devices[device_count++] = argv[++i];
    } else if (strcmp(a, "--plugin-path") == 0 && has_value && plugin_path_count < MAX_LIST) {
      plugin_paths[plugin_path_count++] = argv[++i];
    } else if (strcmp(a, "--input") == 0 && has_value && input_file_count < MAX_LIST) {
      input_files[input_file_count++] = argv[++i];
    } else if (strcmp(a, "--fallback") == 0 && has_value) {
      const char* v = argv[++i];
      fallback = strcmp(v, "error") == 0 ? KEEL_FALLBACK_ERROR : KEEL_FALLBACK_CPU;
    } else if (strcmp(a, "--seed") == 0 && has_value) {
      g_rng = (uint32_t)strtoul(argv[++i], NULL, 10) | 1u;
    } else if (strcmp(a, "--print") == 0 && has_value) {
      print_count = atoi(argv[++i]);
    } else if (strcmp(a, "--verbose") == 0) {
      verbose = 1;
    } else if (a[0] != '-' && model_path == NULL) {
      model_path = a;
    } else {
      fprintf(stderr,
              "usage: %s MODEL.onnx [--device TYPE]... [--fallback cpu|error] [--input NAME=FILE]... "
              "[--seed N] [--print N] [--plugin-path DIR]... [--verbose]\n",
              argv[0]);
      return 2;
    }
  }
  if (model_path == NULL) {
    fprintf(stderr, "usage: %s MODEL.onnx [options] (see the comment at the top of host_app.c)\n", argv[0]);
    return 2;
  }
  printf("keel %s (plugin ABI %d.%d)\n", keel_version_string(), KEEL_PLUGIN_ABI_MAJOR, KEEL_PLUGIN_ABI_MINOR);

  /* The environment: plugins from --plugin-path, $KEEL_PLUGIN_PATH and the install's lib/keel/plugins. */
  if ((status = keel_environment_options_create(&env_options)) != NULL) return fail(status, "options");
  for (i = 0; i < plugin_path_count && status == NULL; ++i)
    status = keel_environment_options_add_plugin_path(env_options, plugin_paths[i]);
  if (status == NULL)
    status = keel_environment_options_set_log_callback(env_options, log_to_stderr, NULL,
                                                       verbose ? KEEL_LOG_DEBUG : KEEL_LOG_WARN);
  if (status == NULL) status = keel_environment_create(env_options, &env);
  keel_environment_options_release(env_options);
  if (status != NULL) return fail(status, "environment");

  if ((status = keel_environment_plugin_count(env, &n)) != NULL) goto done;
  for (k = 0; k < n; ++k) {
    keel_plugin_info_t p;
    static const char* states[] = {"loaded", "skipped", "failed"};
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    if ((status = keel_environment_plugin_info(env, k, &p)) != NULL) goto done;
    printf("plugin %s: %s%s%s\n", p.name, states[p.state], p.reason[0] ? ": " : "", p.reason);
  }

  if ((status = keel_model_load_from_file(model_path, &model)) != NULL) goto done;
  if ((status = keel_session_options_create(&session_options)) != NULL) goto done;
  for (i = 0; i < device_count && status == NULL; ++i)
    status = keel_session_options_add_device(session_options, devices[i]);
  if (status == NULL) status = keel_session_options_set_fallback(session_options, fallback);
  if (status == NULL) status = keel_session_create(env, model, session_options, &session);
  keel_session_options_release(session_options);
  keel_model_release(model); /* the session keeps its own copy */
  if (status != NULL) goto done;

  /* Where the nodes run. */
  if ((status = keel_session_placement_count(session, &n)) != NULL) goto done;
  for (k = 0; k < n; ++k) {
    keel_node_placement_t p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    if ((status = keel_session_placement_info(session, k, &p)) != NULL) goto done;
    printf("node %s (%s) on %s [%s]\n", p.node, p.op_type, p.device_type, p.kernel);
  }
  if ((status = keel_session_fallback_count(session, &n)) != NULL) goto done;
  for (k = 0; k < n; ++k) {
    keel_fallback_info_t f;
    memset(&f, 0, sizeof f);
    f.struct_size = sizeof f;
    if ((status = keel_session_fallback_info(session, k, &f)) != NULL) goto done;
    printf("fallback %s (%s): %s -> %s: %s\n", f.node, f.op_type, f.from_device, f.to_device, f.reason);
  }

  /* Inputs: from files, or random. */
  if ((status = keel_session_input_count(session, &n_in)) != NULL) goto done;
  if ((status = keel_session_output_count(session, &n_out)) != NULL) goto done;
  if (n_in > MAX_LIST || n_out > MAX_LIST) {
    fprintf(stderr, "host_app: more than %d inputs or outputs\n", MAX_LIST);
    goto done;
  }
  for (k = 0; k < n_in; ++k) {
    keel_value_info_t v;
    int64_t dims[16];
    int32_t d, ndim;
    const char* file = NULL;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    if ((status = keel_session_input_info(session, k, &v)) != NULL) goto done;
    ndim = v.ndim < 0 ? 1 : v.ndim; /* unknown rank: a vector of one */
    if (ndim > 16) {
      fprintf(stderr, "host_app: input %s has rank %d\n", v.name, ndim);
      goto done;
    }
    for (d = 0; d < ndim; ++d) dims[d] = v.ndim < 0 || v.dims[d] < 0 ? 1 : v.dims[d];
    if ((status = keel_host_tensor_create(v.dtype, dims, ndim, NULL, 0, &inputs[k])) != NULL) goto done;
    input_names[k] = v.name;
    for (i = 0; i < input_file_count; ++i) {
      size_t len = strlen(v.name);
      if (strncmp(input_files[i], v.name, len) == 0 && input_files[i][len] == '=') file = input_files[i] + len + 1;
    }
    if (file != NULL) {
      if (!read_file(file, keel_host_tensor_data(inputs[k]), keel_host_tensor_byte_size(inputs[k]))) goto done;
    } else {
      fill_random(v.dtype, keel_host_tensor_data(inputs[k]), (uint64_t)keel_host_tensor_element_count(inputs[k]));
    }
  }

  if ((status = keel_session_run(session, input_names, inputs, n_in, NULL, outputs, n_out)) != NULL) goto done;
  for (k = 0; k < n_out; ++k) {
    keel_value_info_t v;
    memset(&v, 0, sizeof v);
    v.struct_size = sizeof v;
    if ((status = keel_session_output_info(session, k, &v)) != NULL) goto done;
    print_tensor(v.name, outputs[k], print_count);
  }
  rc = 0;

done:
  if (status != NULL) rc = fail(status, "error");
  for (k = 0; k < n_in && k < MAX_LIST; ++k) keel_host_tensor_release(inputs[k]);
  for (k = 0; k < n_out && k < MAX_LIST; ++k) keel_host_tensor_release(outputs[k]);
  keel_session_release(session);
  keel_environment_release(env);
  return rc;
}
