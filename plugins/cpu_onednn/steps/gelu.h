// plugins/cpu_onednn/steps/gelu.h — (internal) GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), in place over f32
// memory: the chains' replacement for oneDNN 2.6's gelu_erf post-op after a matrix product.
//
// oneDNN 2.6's gelu_erf (post-op or eltwise primitive: the same jit code) evaluates erf by Abramowitz-Stegun 7.1.26,
// an exp and a division per vector; measured here (Intel Xeon, AVX-512, 1 thread) it costs half as much again as
// the product it follows: ConvNeXt-Tiny's 96 -> 384 MLP at 56x56 took 1.44 ms plain and 2.14 ms with the post-op, 1.82
// ms with this pass after it. See docs/ONEDNN_PERFORMANCE.md.
#pragma once

#include <cstddef>

namespace keel::onednn {

// p[i] = 0.5 p[i] (1 + erf(p[i] / sqrt 2)) for i < n, in place. Absolute error at most 2.5e-7 + 1.5e-7 |x| against
// the exact function (measured by steps/gelu_test.cc: about the f32 rounding of x itself above 1, and of erf's value
// on the way, times x/2, below -1, where 1 + erf cancels; the same class as oneDNN's gelu_erf and PyTorch's erf-based
// CPU kernel). Below x = -4 sqrt 2 (where the exact value is above -5e-8) the result is 0; NaN stays NaN, +inf gives
// +inf, -inf gives 0. Vector code needs AVX-512F (steps/silu.h: has_avx512f()), else the scalar loop. Thread-safe
// (touches only p); runs on the calling thread. p needs no alignment.
void gelu_inplace(float* p, size_t n);

// gelu_inplace by the straightforward scalar formula with std::erf (the reference the fast path is tested against,
// and the fallback).
void gelu_inplace_scalar(float* p, size_t n);

// GELU's tanh approximation (GPT-2's gelu_new; keel.Gelu approximate = "tanh"), in place:
// p[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). tanh by the rational approximation of degrees 13 / 6 that
// Eigen uses for f32 (argument clamped to +-7.90531, where it reaches 1 in f32). Absolute error at most
// 2.5e-7 + 1.5e-7 |x| against the exact function (steps/gelu_test.cc); NaN stays NaN, +inf gives +inf, -inf gives 0.
// oneDNN 2.6's gelu_tanh post-op costs as much as its gelu_erf (the header above). Same threading and alignment
// rules as gelu_inplace.
void gelu_tanh_inplace(float* p, size_t n);
void gelu_tanh_inplace_scalar(float* p, size_t n);

}  // namespace keel::onednn
