// keel/ops/reference/fused_kernels.h — reference CPU kernels of the "keel" domain's fused ops, the ops that the
// fusion pass plugin (passes/fusion) produces. Their semantics are documented in passes/fusion/fusion.cc and
// ops/reference/fused.cc: FusedConv, FusedMatMul, FusedGemm, Gelu, LayerNormalization, Attention (keel opset 1).
#pragma once

#include <keel/plugin.h>

#include <cstddef>

namespace keel::ops {

// Registers the keel-domain reference kernels (device_type "cpu", domain "keel", since_version 1) through
// host->register_kernel. Call it from the reference device's init after register_reference_kernels (which sets the
// kernel API the kernels use; this function sets it too when it is not set yet). Returns NULL or the first error.
keel_status_t register_fused_reference_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin);

// Number of kernel definitions register_fused_reference_kernels registers.
size_t fused_reference_kernel_count();

}  // namespace keel::ops
