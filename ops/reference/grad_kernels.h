// keel/ops/reference/grad_kernels.h — reference CPU kernels of the keel-domain backward (training) ops that the
// gradient rules (ops/gradients.h) emit: ConvGrad, MaxPoolGrad, AveragePoolGrad, ReluGrad, SigmoidGrad, TanhGrad,
// GeluGrad, LeakyReluGrad, SoftmaxCrossEntropyLossGrad, BatchNormTraining, BatchNormGrad, LayerNormGrad, GatherGrad
// (schemas in ops/schemas.cc; keel opset 1).
#pragma once

#include <keel/plugin.h>

#include <cstddef>

namespace keel::ops {

// Registers them (device_type "cpu", domain "keel") through host->register_kernel. Call from the reference device's
// init after register_reference_kernels. Returns NULL or the first error.
keel_status_t register_grad_reference_kernels(const keel_core_api_t* host, keel_plugin_handle_t* plugin);

// Number of kernel definitions register_grad_reference_kernels registers.
size_t grad_reference_kernel_count();

}  // namespace keel::ops
