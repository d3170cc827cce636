// plugins/cpu_onednn/steps/se.h — (internal) squeeze-excite's excitation, s = gate(W2 act(W1 p + b1) + b2) over
// one image's pooled channels p, as one step of the chains' own (gate: Sigmoid, or MobileNet-V3's HardSigmoid).
//
// EfficientNet-B0 ran each of its 16 excitations as four steps: a 1x1 convolution over [1,C,1,1] (oneDNN), a SiLU
// pass over its few outputs, a second 1x1 convolution or a matmul with a logistic post-op (oneDNN): 0.15 ms of
// fastest runs in all at 1 thread, each step a few microseconds of dispatch and a pass over weights of at most
// 221 KB. Here both products run from weights packed at plan time (W1 as [C][Cs16], W2 as [Cs][C2p]: rows of 16
// floats, the axpy form, so each input value is one broadcast) with the activations in registers. See
// docs/ONEDNN_PERFORMANCE.md, "(sq2)". MobileNet-V3's excitations (Relu, then HardSigmoid) ran as two 1x1 convolutions
// on the whole team: at 2 threads 7-10 µs each against 2-4 on one (a team's start and the data moving between
// cores cost more than the product), in MobileNet-V3-Small 18 of its 74 steps.
#pragma once

#include <cstddef>
#include <cstdint>

namespace keel::onednn {

// c pooled channels -> cs squeezed (act: SiLU or Relu) -> c2 excitation outputs (gate: Sigmoid or HardSigmoid).
struct SeShape {
  int64_t c = 0, cs = 0, c2 = 0;
  bool silu = true;        // the squeeze's activation: SiLU (x * sigmoid(x)); else Relu
  bool hard_gate = false;  // the gate: HardSigmoid, max(0, min(1, gate_alpha * x + gate_beta)); else Sigmoid
  float gate_alpha = 0.2f, gate_beta = 0.5f;  // ONNX HardSigmoid's defaults (torch exports 1/6 and 0.5)
};

// Floats of the packed weights and biases: W1 [c][cs16], b1 [cs16], W2 [cs][c2p], b2 [c2p] (cs16, c2p: cs and c2
// rounded up to 16).
size_t se_packed_floats(const SeShape& s);
// Packs w1 [cs][c], b1 [cs] (null: 0), w2 [c2][cs], b2 [c2] (null: 0) into packed (se_packed_floats(s) floats).
void se_pack(const SeShape& s, const float* w1, const float* b1, const float* w2, const float* b2, float* packed);

// out[0..c2) = gate(W2 act(W1 p + b1) + b2), p [c]. Runs on the calling thread; AVX-512 when the CPU has it
// (steps/silu.h's has_avx512f) and `vector` is true, else scalar code (vector = false: for tests). Thread-safe
// (reads packed and p, writes out).
void se_excite(const SeShape& s, const float* packed, const float* p, float* out, bool vector = true);

// The same by straightforward loops over the unpacked weights in double precision (the reference for tests).
void se_excite_reference(const SeShape& s, const float* w1, const float* b1, const float* w2, const float* b2,
                         const float* p, float* out);

}  // namespace keel::onednn
