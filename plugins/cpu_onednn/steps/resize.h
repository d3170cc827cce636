// plugins/cpu_onednn/steps/resize.h — (internal) bilinear resizing of 2-D images, the chains' own step for ONNX
// Resize with mode linear over [N,C,H,W] in any of the chains' dense f32 layouts.
//
// oneDNN 2.6's resampling knows only half_pixel coordinates (no align_corners, no asymmetric) and, over plain
// memory, takes about 1.1 ms to upsample DeepLabV3's [2,21,10,10] class map to [2,21,160,160] on the development
// host (AMD EPYC, AVX-512, 2 threads). This step is separable: each source row a block of output rows needs is
// interpolated horizontally once into a small buffer, then every output row is one blend of two such rows
// (a + w * (b - a) over the whole row, vectorised), written once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace keel::onednn {

// How an output coordinate maps to an input one (ONNX Resize's coordinate_transformation_mode):
//   kHalfPixel          (x + 0.5) / scale - 0.5                 (torch align_corners=False)
//   kPytorchHalfPixel   the same, but 0 where the output axis has length 1
//   kAlignCorners       x * (in - 1) / (out - 1), 0 where out is 1   (torch align_corners=True)
//   kAsymmetric         x / scale
// The source coordinate is then clamped to [0, in - 1] (ONNX's edge padding of the neighbours), so the two
// neighbours are floor(src) and floor(src) + 1 clamped, weighted 1 - frac and frac.
enum class ResizeCoords { kHalfPixel, kPytorchHalfPixel, kAlignCorners, kAsymmetric };

// Parses an ONNX coordinate_transformation_mode; false for the modes this step does not compute
// (tf_crop_and_resize, tf_half_pixel_for_nn, anything else).
bool resize_coords_of(const std::string& mode, ResizeCoords* out);

// One axis: for every output coordinate, its two source indices and the weight of the second.
struct ResizeAxis {
  std::vector<int32_t> i0, i1;
  std::vector<float> w1;
};
// `scale` is ONNX's (output length / input length, or the scales input); in, out >= 1.
ResizeAxis resize_axis(int64_t in, int64_t out, double scale, ResizeCoords coords);

// The memory the step works on: `planes` images of h x w pixels (source) or oh x ow (destination), each pixel
// `vec` consecutive floats, images and rows dense. Plain NCHW: planes N*C, vec 1; nChw16c: planes N*ceil(C/16),
// vec 16 (padding channels stay 0); nhwc: planes N, vec C.
struct BilinearShape {
  int64_t planes = 1, h = 1, w = 1, oh = 1, ow = 1, vec = 1;
  ResizeAxis y, x;  // oh and ow entries
};

// dst = the bilinear resize of src. src and dst must not overlap. `team` > 1 splits the (image, block of output
// rows) pairs over that many OpenMP threads (0 or 1: the calling thread only). Each thread uses a buffer of its own
// (thread_local, grown once: (rows a block reads) * ow * vec floats). AVX-512 when the CPU has it (steps/silu.h's
// has_avx512f) and `vector` is true, else scalar code (vector = false: for tests). Thread-safe for distinct dst.
void bilinear_resize(const BilinearShape& s, const float* src, float* dst, int team, bool vector = true);

}  // namespace keel::onednn
