// keel/tools/calibration/gptq.h — error-compensating rounding of INT8 weights (GPTQ: Frantar et al. 2022, "GPTQ:
// Accurate Post-Training Quantization for Generative Pre-trained Transformers", the Optimal Brain Quantization
// update of Frantar & Alistarh 2022 applied column by column).
//
// Rounding each weight to its nearest level (what the quantize_int8 pass does) makes every weight's error as small
// as it can be, but the layer's output error, (W − Q)·x, is what matters. GPTQ quantizes a weight row one column at
// a time and moves the rounding error of each column onto the columns not yet quantized, weighted by how the inputs
// correlate (the Hessian H = Σ x·xᵀ of the layer's input patches on calibration data): the expected output error
// ‖(W − Q)·X‖² falls, most where inputs are correlated (images, neighbouring taps of a convolution). The quantization
// grid (per-row scale, symmetric s8 in [−127, 127]) is the caller's and stays the same.
//
// quantize_graph (quantize.h, QuantizeOptions::weight_rounding = "gptq") collects the Hessians of the quantized
// layers' inputs over the calibration batches (HessianAccumulator) and then rounds each layer's weight with
// gptq_round. Thread-safety: plain values and functions; an accumulator is used by one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/base/tensor.h"

namespace keel::cli {

// How a layer's weight reads its input: `groups` independent blocks, each with `rows` output channels whose weight
// rows hold `cols` values and are multiplied with the same input patch of `cols` values.
//   Conv (2-D, weight [Cout, Cin/g, kh, kw]): a patch is the Cin/g × kh × kw window of one group's input channels
//     at one output position (zeros where it covers padding), in the weight's (channel, ky, kx) order;
//   Gemm / MatMul (weight [K, N], or [N, K] for Gemm transB): a patch is one row of A's last axis (K values).
struct LayerGeometry {
  bool conv = false;
  int64_t groups = 1, rows = 0, cols = 0;  // rows per group
  // Conv only.
  int64_t cin_g = 0, kh = 1, kw = 1, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  // Gemm/MatMul: the weight is stored [K, N] (a row of the layer is a column of the tensor).
  bool weight_k_major = false;
};

// Σ x·xᵀ over the input patches of one layer, per group, over the input tensors of `batches` calibration batches.
// At most about `max_patches` patches in all are used: when a layer has more (large feature maps × many batches),
// every k-th is taken, k chosen at the first batch so that the sample spans every batch.
class HessianAccumulator {
 public:
  HessianAccumulator(const LayerGeometry& g, int64_t batches, int64_t max_patches);
  // Adds the patches of one input tensor (f32 on the host: [N, C, H, W] for Conv, [..., K] for Gemm/MatMul).
  // INVALID_ARGUMENT when its shape does not fit the geometry.
  Status add(const Tensor& x);
  int64_t patches() const { return patches_; }
  // Group g's d × d matrix (d = cols), both triangles filled, row-major.
  std::vector<double> hessian(int64_t g);
  size_t bytes() const { return h_.size() * sizeof(float); }

 private:
  // Patches are gathered per group into a block of kBlock and added to H together (flush), so that each row of H
  // is read once per block rather than once per patch (a 2304-column H is 21 MB).
  static constexpr int64_t kBlock = 64;
  float* slot(int64_t g) { return block_.data() + (g * kBlock + filled_) * geo_.cols; }
  void flush();
  void first_batch(int64_t patches_in_batch);
  LayerGeometry geo_;
  int64_t batches_, max_patches_;
  int64_t step_ = 0, next_ = 0, index_ = 0, patches_ = 0;
  std::vector<float> h_;      // groups × d × d, upper triangle accumulated
  std::vector<float> block_;  // groups × kBlock × d patches not yet added
  int64_t filled_ = 0;        // patches in block_ (per group)
};

// Nearest rounding of `rows` weight rows of `cols` values (row-major), as the quantize_int8 pass rounds: round(w /
// scale[row]) in f32, clamped to [−127, 127], NaN to 0. What GPTQ is compared with, and its fallback.
std::vector<int8_t> nearest_round(const std::vector<float>& w, int64_t rows, int64_t cols,
                                  const std::vector<float>& row_scales);

// GPTQ over `rows` weight rows of `cols` values each (row-major `w`), quantized to round(w / scale[row]) clamped to
// [−127, 127], with the input Hessian `h` (cols × cols, symmetric). `damp` is added to the diagonal as a fraction of
// its mean (GPTQ's 0.01), which keeps the update stable when the calibration patches do not span every direction.
// Columns whose input was always zero (h[i][i] == 0) are quantized as zeros. Returns the int8 rows, row-major.
std::vector<int8_t> gptq_round(const std::vector<float>& w, int64_t rows, int64_t cols,
                               const std::vector<float>& row_scales, std::vector<double> h, double damp = 0.01);

// The weight-rounding part of a layer's output error on a patch set: ‖(W − Q)·X‖² summed over rows, for tests and
// reports (Q dequantized with the row scales), with X given by its Hessian h = X·Xᵀ: Σ_rows eᵀ·h·e.
double output_error(const std::vector<float>& w, const std::vector<int8_t>& q, int64_t rows, int64_t cols,
                    const std::vector<float>& row_scales, const std::vector<double>& h);

}  // namespace keel::cli
