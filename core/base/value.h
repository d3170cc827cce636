// keel/core/base/value.h — what a graph value holds while a graph runs: a tensor, a sequence of tensors, or an
// optional without element.
//
// ONNX has tensor, sequence and optional values. An optional that holds an element is represented by the element
// itself (a tensor or a sequence); an optional without one is Kind::kNone. Kernels only ever see tensors: the
// executor handles the ops that build, take apart or route the other kinds (core/runtime/control_flow.h).
// Copying a RunValue copies tensor references, not bytes. Thread-compatible like Tensor.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/base/tensor.h"

namespace keel {

struct RunValue {
  enum class Kind { kUnset, kTensor, kSequence, kNone };
  Kind kind = Kind::kUnset;
  Tensor tensor;                             // kTensor
  std::vector<Tensor> sequence;              // kSequence
  DType sequence_dtype = DType::kUndefined;  // kSequence: the element type (known even when it is empty)

  RunValue() = default;
  RunValue(Tensor t) : kind(t.defined() ? Kind::kTensor : Kind::kUnset), tensor(std::move(t)) {}  // NOLINT: implicit
  static RunValue of_sequence(std::vector<Tensor> items, DType dtype) {
    RunValue v;
    v.kind = Kind::kSequence;
    v.sequence = std::move(items);
    v.sequence_dtype = dtype;
    return v;
  }
  static RunValue none() {
    RunValue v;
    v.kind = Kind::kNone;
    return v;
  }

  bool defined() const { return kind != Kind::kUnset; }
  bool is_tensor() const { return kind == Kind::kTensor; }
  bool is_sequence() const { return kind == Kind::kSequence; }
  bool is_none() const { return kind == Kind::kNone; }
  // "f32[2, 3] on cpu:0", "seq(3 x f32)", "none"
  std::string describe() const {
    switch (kind) {
      case Kind::kTensor: return tensor.describe();
      case Kind::kSequence: return "seq(" + std::to_string(sequence.size()) + " x " + dtype_name(sequence_dtype) + ")";
      case Kind::kNone: return "none";
      default: return "unset";
    }
  }
};

}  // namespace keel
