// plugins/cpu_onednn/common/bf16_speed.h — (internal) whether bf16 layers can be faster than fp32 ones on this CPU,
// and the warning when they cannot.
//
// A bf16 convolution or matmul is faster than its fp32 form only where the CPU multiplies bf16 faster than it does
// fp32: AMX tiles, or AVX-512 BF16 dot products (vdpbf16ps, two products per fp32 lane) where they issue as often as
// FMAs (AMD Zen 4: twice the FMAs' FLOPs). On Intel cores without AMX (a cloud VM that does not expose it) vdpbf16ps
// issues on one port where FMAs issue on two: measured on an Intel Xeon VM (family 6 model 207), 86 GFLOP/s on a core
// against 175 for fp32 FMAs, and MobileNetV2's bf16 layers ran 1.7-1.9x slower than in fp32. Without AVX-512 BF16
// oneDNN converts bf16 to fp32 in software. So the first bf16 layer a process plans measures the two rates on its
// core (about 10 ms) and warns once where bf16 cannot win: `--precision bf16` then saves activation memory, not time.
//
// Thread-safety: every function may be called from any thread; the measurement runs once per process.
#pragma once

#include <string>

namespace keel::onednn {

struct Bf16Speed {
  bool avx512_bf16 = false;  // vdpbf16ps
  bool amx_bf16 = false;     // AMX tiles with bf16 (not measured: far faster than fp32 FMAs wherever present)
  double bf16_gflops = 0;    // vdpbf16ps on the calling core (0 without AVX-512 BF16 or AVX-512)
  double fp32_gflops = 0;    // AVX-512 FMAs on the same core (0 without AVX-512)
};

// This CPU's bf16 and fp32 rates, measured on the first call (on the calling thread's core), then remembered.
const Bf16Speed& bf16_speed();

// The warning `s` calls for, or "" where bf16 layers can run faster than fp32 ones (AMX, or bf16 dot products at
// least 1.2x the fp32 FMAs' FLOPs). Pure: for tests.
std::string bf16_speed_warning(const Bf16Speed& s);

// Logs bf16_speed_warning(bf16_speed()) at warn level to the current instance's environment, once per process (the
// first call measures). Called where a bf16 layer is planned (chain/builder.cc, plugin.cc create_kernel).
void warn_if_bf16_slow();

}  // namespace keel::onednn
