// plugins/cpu_onednn/steps/silu.h — (internal) SiLU, x * sigmoid(x), in place over f32 memory: the chains'
// replacement for oneDNN 2.6's swish post-op.
//
// oneDNN's swish (post-op or eltwise primitive: the same jit code) computes exp with a range reduction, a
// polynomial and a division per vector; measured here (AMD EPYC, AVX-512, 1 thread) it costs more than the 1x1
// convolution it follows: EfficientNet-B0's 24->144 expansion at 56x56 took 134-148 us plain and 240-266 us with
// the swish post-op; this pass costs 1.75 ns per 16 floats (about 50 us over that output). See
// docs/ONEDNN_PERFORMANCE.md.
#pragma once

#include <cstddef>

namespace keel::onednn {

// True when this CPU has AVX-512F: silu_inplace (and the chains' other own AVX-512 steps, e.g. the folded weight
// scaling) run their vector code; otherwise a scalar loop, and callers should prefer oneDNN's swish.
bool has_avx512f();

// p[i] = p[i] / (1 + exp(-p[i])) for i < n, in place. Relative error below 1e-6 against the exact function where
// |result| > 1e-30 (below x = -87 the result is 0, the exact one under 1e-35); NaN stays NaN, +inf gives +inf,
// -inf gives 0. Thread-safe (touches only p); runs on the calling thread. p needs no alignment.
void silu_inplace(float* p, size_t n);

// SiLU in place over one 16-channel block of nChw16c memory (hw pixels of 16 floats each, at p) and the mean of
// each of its 16 channels over those pixels, after SiLU, into mean[0..15]: a SiLU followed by the global average
// pooling of squeeze-excite in one pass. Thread-safe as silu_inplace; p needs no alignment.
void silu_inplace_mean16(float* p, size_t hw, float* mean);

// silu_inplace by the straightforward scalar formula (the reference the fast path is tested against, and the
// fallback).
void silu_inplace_scalar(float* p, size_t n);

}  // namespace keel::onednn
