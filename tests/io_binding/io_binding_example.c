/*
 * io_binding_example MODEL.onnx DEVICE [PLUGIN] — a C host using I/O binding (keel.h): the model's input "x" and
 * output "y" (f32[2, 3]) are bound once, to the host's own arrays, and reused for every run; a second session reads
 * the first one's output where the first left it, in DEVICE's memory ("cuda:0", "streamdev"; "cpu" = host memory),
 * so the value never comes back to the host between the two sessions. PLUGIN (optional) is a plugin library or
 * manifest loaded by path. Prints what it did; exits 0 when the results are right and nothing was copied that did
 * not have to be (the copy counters: one copy to the device and one back per chain for a device, none on the CPU).
 */
#include <keel/keel.h>

#include <stdio.h>
#include <string.h>

static int failed(keel_status_t st, const char* what) {
  if (st == NULL) return 0;
  fprintf(stderr, "%s: %s: %s\n", what, keel_status_code_name(st->code), st->message);
  keel_status_release(st);
  return 1;
}
#define CHECK(expr)                      \
  do {                                   \
    if (failed((expr), #expr)) return 1; \
  } while (0)

static float relu_add(float v) { return (v > 0.f ? v : 0.f) + v; }

int main(int argc, char** argv) {
  const int64_t dims[2] = {2, 3};
  float x[6], y[6];
  keel_environment_options_t eo = NULL;
  keel_environment_t env = NULL;
  keel_model_t model = NULL;
  keel_session_options_t so = NULL;
  keel_session_t first = NULL, second = NULL;
  keel_host_tensor_t xt = NULL, yt = NULL;
  keel_io_binding_t b1 = NULL, b2 = NULL;
  keel_session_copy_stats_t c1, c2;
  const int on_host = argc > 2 && strcmp(argv[2], "cpu") == 0;
  int run, i, bad = 0;
  if (argc < 3) {
    fprintf(stderr, "usage: %s MODEL.onnx DEVICE [PLUGIN]\n", argv[0]);
    return 2;
  }

  CHECK(keel_environment_options_create(&eo));
  if (argc > 3) CHECK(keel_environment_options_add_plugin_library(eo, argv[3]));
  CHECK(keel_environment_create(eo, &env));
  keel_environment_options_release(eo);
  CHECK(keel_model_load_from_file(argv[1], &model));
  CHECK(keel_session_options_create(&so));
  CHECK(keel_session_options_add_device(so, argv[2]));
  CHECK(keel_session_create(env, model, so, &first));
  CHECK(keel_session_create(env, model, so, &second));
  keel_session_options_release(so);
  keel_model_release(model);

  /* The host's arrays, bound once: x read in place, y written in place (the binding keeps its own references). */
  CHECK(keel_host_tensor_wrap(KEEL_DTYPE_F32, dims, 2, x, sizeof x, &xt));
  CHECK(keel_host_tensor_wrap(KEEL_DTYPE_F32, dims, 2, y, sizeof y, &yt));
  CHECK(keel_io_binding_create(first, &b1));
  CHECK(keel_io_binding_create(second, &b2));
  CHECK(keel_io_binding_bind_input(b1, "x", xt));
  CHECK(keel_io_binding_bind_output_to_device(b1, "y", argv[2])); /* left in DEVICE's memory */
  CHECK(keel_io_binding_bind_output(b2, "y", yt));
  keel_host_tensor_release(xt);
  keel_host_tensor_release(yt);

  for (run = 0; run < 3; ++run) {
    keel_device_tensor_t mid = NULL;
    for (i = 0; i < 6; ++i) x[i] = (float)(i - 3 + run);
    CHECK(keel_session_run_with_binding(first, NULL, b1));
    CHECK(keel_io_binding_output(b1, "y", &mid));
    CHECK(keel_io_binding_bind_input_device(b2, "x", mid)); /* read where it is */
    keel_device_tensor_release(mid);
    CHECK(keel_session_run_with_binding(second, NULL, b2));
    for (i = 0; i < 6; ++i) bad += y[i] != relu_add(relu_add(x[i]));
  }

  c1.struct_size = sizeof c1;
  c2.struct_size = sizeof c2;
  CHECK(keel_session_copy_stats(first, &c1));
  CHECK(keel_session_copy_stats(second, &c2));
  printf(
      "%s: 3 chains, %d wrong values; first session: %llu to device, %llu to host; second: %llu to device, "
      "%llu to host\n",
      argv[2], bad, (unsigned long long)c1.host_to_device, (unsigned long long)c1.device_to_host,
      (unsigned long long)c2.host_to_device, (unsigned long long)c2.device_to_host);
  if (c1.device_to_host != 0 || c2.host_to_device != 0) bad++; /* the middle value never visits the host */
  if (on_host && c1.bytes + c2.bytes != 0) bad++;              /* on the CPU nothing is copied at all */

  keel_io_binding_release(b1);
  keel_io_binding_release(b2);
  keel_session_release(first);
  keel_session_release(second);
  keel_environment_release(env);
  return bad == 0 ? 0 : 1;
}
