// libFuzzer target: arbitrary bytes through the ONNX model loader (parse, checker, version converter, shape
// inference, conversion to the graph IR) and, when they load, back out through the exporter. Must never crash.
#include <cstddef>
#include <cstdint>

#include "core/runtime/onnx_io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  keel::OnnxLoadOptions options;
  options.warn = [](const std::string&) {};
  options.max_tensor_bytes = uint64_t{1} << 28;  // keep the fuzzer's memory bounded
  auto graph = keel::load_onnx_from_memory(data, size, {}, options, "fuzz");
  if (graph.is_ok()) {
    auto bytes = keel::serialize_onnx(*graph);
    (void)bytes;
  }
  return 0;
}
