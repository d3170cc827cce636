// The arithmetic a model does per run, counted from its shapes: what `keel bench` divides by the run time (GFLOP/s)
// and compares with the host's peak (keel-host-limits), and what `keel prune` reports before and after.
//
// Counted: the multiply-adds of Conv, ConvTranspose, Gemm and MatMul and of their quantized forms (QLinearConv,
// ConvInteger, QLinearMatMul, MatMulInteger), two operations each. Everything else (element-wise ops, pooling,
// normalisation, data movement) is left out: in the models Keel runs it is a few percent of the operations, and it is
// bound by memory rather than arithmetic. Quantized forms, and float Conv/Gemm/MatMul whose data or weight input comes
// straight from a DequantizeLinear (a QDQ model, which Keel runs on int8 kernels), count as int8 work.
//
// Pure functions of the graph; thread-safe on distinct graphs.
#pragma once

#include <cstdint>

#include "core/base/graph.h"

namespace keel::cli {

struct ModelWork {
  int64_t flops = 0;       // 2 x multiply-adds of every counted node whose shapes are known
  int64_t int8_flops = 0;  // the part of `flops` that runs on int8 kernels
  int64_t nodes = 0;       // counted nodes
  int64_t unknown = 0;     // Conv/Gemm/MatMul-like nodes whose shapes are not known (their work is missing)
};

// Counts `g`'s work from its value_info and initializer shapes (run infer_shapes first for a graph whose shapes
// changed).
ModelWork model_work(const Graph& g);

}  // namespace keel::cli
