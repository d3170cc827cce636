// keel/ops/reference/reference_kernels.h — the portable reference CPU kernels ("cpu" device, domain "" = ai.onnx).
//
// The reference kernels are written against the C kernel ABI (keel/plugin.h) only, exactly like a plugin's, and are
// the oracle every other device is tested against. They favour clarity and exact ONNX semantics over speed, but use
// the core's thread pool (parallel_for) for the heavy ops.
#pragma once

#include <keel/plugin.h>

namespace keel::ops {

// Registers every reference kernel with device_type "cpu" through host->register_kernel(plugin, &def), in the
// order of the list in reference_kernels.cc. Called from the built-in reference plugin's init, once per process
// (it stores host->kernel for the kernels to use; the pointer must stay valid while any kernel may run).
// Returns NULL or the first error (the caller releases it).
keel_status_t register_reference_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin);

// Number of kernel definitions register_reference_kernels registers (for tests and `keel plugins`).
size_t reference_kernel_count();

}  // namespace keel::ops
