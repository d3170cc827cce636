// plugins/cuda/cuda_device_probe.h — (internal) whether the CUDA runtime sees a usable device, in the words both the
// loader (cuda_loader.cc, before it loads the plugin proper) and the plugin proper (cuda_plugin.cc: init and the
// device table's device_count) give the core when it does not. Header-only; thread-safe as the runtime is.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace keel::cuda {

// Why there is no usable device ("no CUDA device: ..."), or "" when there is one (its count then in *out_count when
// given).
inline std::string no_device_reason(int32_t* out_count = nullptr) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
  }
  if (n <= 0) return "no CUDA device: cudaGetDeviceCount found 0 devices";
  if (out_count) *out_count = n;
  return "";
}

}  // namespace keel::cuda
