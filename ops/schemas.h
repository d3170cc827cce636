// keel/ops/schemas.h — operator schemas of the `keel` domain (fused and internal ops), registered into ONNX's
// schema registry, so that one registry answers for every op Keel knows: names, attributes, type constraints and
// shape inference (ai.onnx's schemas come with libonnx). Semantics are documented in passes/fusion/fusion.cc and
// implemented by the reference kernels in ops/reference/fused.cc.
#pragma once

namespace keel::ops {
// Registers the keel-domain schemas (opset 1) once per process; later calls do nothing. Thread-safe.
void register_keel_schemas();
}  // namespace keel::ops
