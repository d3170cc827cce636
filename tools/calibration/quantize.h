// keel/tools/calibration/quantize.h — INT8 post-training quantization: calibration, QDQ rewrite, per-layer error
// report.
//
// quantize_graph() is what `keel quantize` (cmd_quantize.cc) and `keel train` (to quantize the model it trained) call:
//
//   1. prepares the fp32 graph: fold_constants, remove_identity, eliminate_dead_code, fuse_conv_bn (the pass plugins
//      that are installed; fusing BN first makes one quantized Conv per Conv+BN);
//   2. calibrates: runs Keel sessions on the fp32 graph with every quantizable activation (input 0 of each Conv,
//      MatMul, Gemm with an f32 constant weight) exposed as an extra output, over the calibration batches, and picks a
//      range per activation — minmax (observed min/max), percentile (the `percentile`-th percentile of each tail),
//      entropy (TensorRT's KL-divergence threshold search over a 2048-bin histogram of |x|), mse (the range, shrunk
//      from min-max towards 0, with the least expected squared quantization error: rounding plus clipping);
//   3. rewrites with the `quantize_int8` pass plugin: standard QDQ ONNX, per-channel symmetric s8 weights, u8
//      (asymmetric) or s8 (symmetric) activations; with weight_rounding = gptq the s8 weights are then rounded
//      against each layer's input Hessian from the calibration batches (gptq.h); then (bias_correction) subtracts from
//      each quantized layer's f32 bias the mean shift its rounded weights cause, dW . E[x], with E[x] per input channel
//      from the calibration batches (Nagel et al. 2019, "Data-Free Quantization", empirical form);
//   4. measures on held-out batches (the last fifth of `calibration`, at least one; with a single batch it is also
//      the calibration batch): each quantized layer's own error (cosine and relative L2 error of its output, with its
//      quantized inputs computed from the fp32 activations, against fp32) and the error of the graph outputs;
//   5. with a tolerance (and an output error above it), fallback = sensitivity measures each layer's sensitivity —
//      the outputs' relative L2 error with only that layer quantized — and keeps the most sensitive layers in fp32,
//      one at a time, until the relative L2 error of every float graph output on the held-out batches is at most
//      `tolerance` (or nothing is left). Small own errors can still add up through a deep network; sensitivity sees
//      where they do.
//      fallback = prefix keeps the fewest leading layers in fp32 instead (see QuantizeOptions::fallback).
//
// The calibration batches must bind every graph input (by name). Sessions run on `options.device` (fallback cpu).
// Thread-safety: quantize_graph uses only its arguments; concurrent calls on one Environment are fine.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/tensor.h"
#include "core/runtime/environment.h"

namespace keel::cli {

struct QuantizeOptions {
  std::string method = "mse";          // minmax | percentile | entropy | mse
  double percentile = 99.99;           // percentile method: kept fraction of each tail, in percent (50, 100]
  std::vector<std::string> exclude;    // node names kept in fp32
  double tolerance = 0;                /* 0 = off */
  bool per_channel = true;             // weights per output channel (else per tensor)
  std::string device = "cpu";          // where the calibration and evaluation sessions run
  bool progress = true;                // progress bar over calibration batches (stderr)
  std::string activation_type = "u8";  // u8 (asymmetric) | s8 (symmetric)
  // How the tolerance picks the layers kept in fp32:
  //   sensitivity  each layer's sensitivity is measured (one session per layer), the most sensitive go first;
  //   prefix       the fewest leading layers (topological order) that reach the tolerance, found by bisection
  //                (assumes the error falls as the prefix grows), then moved up to two layers further where the
  //                activation that crosses into int8 there is smaller: one fp32 -> int8 boundary, placed where its
  //                QuantizeLinear is cheapest. For networks whose early layers amplify noise the most (MobileNetV2).
  std::string fallback = "sensitivity";
  // The precision the layers kept in fp32 will run in: fp32, or bf16 (the model then runs with `--precision bf16`:
  // fuse_qdq, then convert_bf16 converts what stayed fp32). The output error (report and tolerance search) is measured
  // so: the evaluation sessions run those two passes, on the int8 kernels, where fp32 evaluates the QDQ graph as is.
  std::string fallback_precision = "fp32";
  // Subtract each quantized layer's weight-rounding shift dW . E[x] (input means from the calibration batches) from
  // its f32 bias (see quantize.cc, correct_biases).
  bool bias_correction = true;
  // How weights are rounded to their int8 levels (the levels themselves, per-channel scales, are the same):
  //   nearest  each weight to its nearest level (the quantize_int8 pass);
  //   gptq     each layer's weight rows column by column, the rounding error of each column moved onto the columns
  //            not yet rounded as the layer's inputs on the calibration batches correlate (gptq.h), so that the
  //            layer's output error falls. Layers whose rows are longer than gptq_max_columns keep nearest rounding.
  std::string weight_rounding = "nearest";
  int64_t gptq_max_columns = 2304;   // the Hessian is d × d per group: memory d², time d³
  int64_t gptq_max_patches = 16384;  // input patches per layer over all calibration batches (evenly sampled)
};

struct LayerReport {
  std::string node, op_type;
  double cosine = 1, rel_error = 0;  // the layer's own error (see above); 1 / 0 for a layer excluded by the user
  bool kept_fp32 = false;
  // The outputs' relative L2 error when only this layer is quantized (its sensitivity), measured when the tolerance
  // search runs (a tolerance below the all-int8 error); else 0.
  double sensitivity = 0;
  // The calibrated range of the layer's input activation (what its QuantizeLinear uses) and the min/max observed on
  // the calibration batches; all 0 for a layer excluded by the user.
  double range_lo = 0, range_hi = 0, observed_lo = 0, observed_hi = 0;
};

struct QuantizeResult {
  Graph graph;                      // the QDQ graph
  std::vector<LayerReport> layers;  // every quantizable layer, in graph order
  // Error of the graph's float outputs on the held-out batches (the worst output): cosine and relative L2 error.
  double output_cosine = 1, output_rel_error = 0;
  size_t heldout_batches = 0;
  std::vector<std::string> notes;  // what was skipped and why
};

using Feeds = std::vector<std::pair<std::string, Tensor>>;

StatusOr<QuantizeResult> quantize_graph(Environment& env, const Graph& fp32, const std::vector<Feeds>& calibration,
                                        const QuantizeOptions& options);

// ---- The calibration math (exposed for tests) ----

// A histogram of values over [lo, hi] with equal bins; values outside go to the end bins.
struct Histogram {
  double lo = 0, hi = 0;
  std::vector<double> bins;
  void init(double lo_, double hi_, size_t n);
  void add(const float* v, size_t n, bool absolute);
};

// The range the percentile method keeps: the (100 - p) and p percentiles of a histogram of the signed values.
std::pair<double, double> percentile_range(const Histogram& h, double percentile);
// TensorRT's entropy calibration: the threshold t in (0, hi] minimising KL(P || Q) where P is the histogram of |x|
// over [0, t] (outliers folded into the last bin) and Q is P quantized to `levels` levels. `h` is a histogram of |x|
// over [0, max|x|], `zeros` of its first bin's values are exact zeros (left out of P). Two departures from TensorRT,
// each of which made the method clip whole activations (ResNet-18's fc input to 26% of its range: output cosine
// 0.971 instead of 0.9996): the exact zeros are left out, and no threshold clips more than 1% of the other values.
double entropy_threshold(const Histogram& h, int levels, double zeros = 0);
// The MSE-optimal range (TensorRT's "mse" / ORT's "distribution" idea): of the min-max bounds each shrunk towards 0
// independently (512 steps each), the range minimising the expected squared error of quantizing the histogram's
// values — step^2 / 12 for a value inside (none for the `zeros` exact zeros, which are on the grid), (x - bound)^2
// for one clipped. u8: asymmetric over [lo, hi] (255 steps); s8: symmetric over [-a, a] (127 steps a side). `h` is a
// histogram of the signed values.
std::pair<double, double> mse_range(const Histogram& h, double zeros, bool s8);

// Reads calibration batches from `dir` for a graph with these inputs. Layouts (documented in README.md):
//   - one subfolder per batch (sorted by name), holding one file per graph input: NAME.npy / NAME.pb, or ONNX test
//     data input_K.pb (K = the input's position), or a .pb whose TensorProto name is the input's name;
//   - for a single-input graph, also a flat folder of .npy / .pb files, one batch per file (sorted by name).
StatusOr<std::vector<Feeds>> read_calibration_dir(const std::string& dir, const std::vector<std::string>& inputs);

}  // namespace keel::cli
