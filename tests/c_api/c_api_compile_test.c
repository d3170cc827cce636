/* keel.h must compile as strict C99 (-std=c99 -Wall -Wextra -Werror -pedantic) and link against libkeel: a host
 * application in C needs nothing else. Running it checks a few calls that need no model. */
#include <keel/keel.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  keel_environment_options_t options = NULL;
  keel_environment_t env = NULL;
  keel_status_t status;
  size_t devices = 0;
  int32_t major = -1;
  int64_t dims[2] = {2, 2};
  float data[4] = {1.f, 2.f, 3.f, 4.f};
  keel_host_tensor_t tensor = NULL;
  keel_model_t model = NULL;

  keel_version_get(&major, NULL, NULL);
  if (major != KEEL_VERSION_MAJOR || strcmp(keel_version_string(), KEEL_VERSION_STRING) != 0) {
    fprintf(stderr, "version mismatch: header %s, library %s\n", KEEL_VERSION_STRING, keel_version_string());
    return 1;
  }
  status = keel_environment_options_create(&options);
  if (status == NULL) status = keel_environment_options_set_discover_plugins(options, 0);
  if (status == NULL) status = keel_environment_create(options, &env);
  keel_environment_options_release(options);
  if (status == NULL) status = keel_environment_device_count(env, &devices);
  if (status == NULL) status = keel_host_tensor_create(KEEL_DTYPE_F32, dims, 2, data, sizeof data, &tensor);
  if (status != NULL) {
    fprintf(stderr, "%s: %s\n", keel_status_code_name(status->code), status->message);
    keel_status_release(status);
    return 1;
  }
  if (devices < 1 || keel_host_tensor_element_count(tensor) != 4) return 1;
  status = keel_model_load_from_memory("junk", 4, &model);
  if (status == NULL || model != NULL) return 1;
  printf("C API from C99: %s, %u device(s), bad model -> %s\n", keel_version_string(), (unsigned)devices,
         keel_status_code_name(status->code));
  keel_status_release(status);
  keel_host_tensor_release(tensor);
  keel_environment_release(env);
  return 0;
}
