// plugins/cpu_onednn/common/bf16_speed.cc — the bf16 and fp32 rates of this CPU's core (common/bf16_speed.h).
#include "common/bf16_speed.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <sstream>

#include "common/common.h"

namespace keel::onednn {
namespace {

// Twelve independent accumulators (enough to cover either instruction's latency on two ports), written out so that
// they stay in registers; each loop returns a value that depends on all of them, so nothing is optimised away.
#define KEEL_BF16_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
constexpr int kChains = 12;

// The sum of a vector's 16 lanes (each loop's result, so that it depends on every accumulator).
__attribute__((target("avx512f"), always_inline)) inline float lanes_sum(__m512 s) {
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}

__attribute__((target("avx512f,avx512bf16"), noinline)) float bf16_loop(int64_t iters) {
#define KEEL_INIT(k) __m512 a##k = _mm512_set1_ps(0.001f * k);
#define KEEL_STEP(k) a##k = _mm512_dpbf16_ps(a##k, u, v);
#define KEEL_FOLD(k) s = _mm512_add_ps(s, a##k);
  KEEL_BF16_CHAINS(KEEL_INIT)
  const __m512bh u = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh v = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3a83));  // about 1e-3
  for (int64_t i = 0; i < iters; ++i) {
    KEEL_BF16_CHAINS(KEEL_STEP)
  }
  __m512 s = _mm512_setzero_ps();
  KEEL_BF16_CHAINS(KEEL_FOLD)
#undef KEEL_STEP
  return lanes_sum(s);
}

__attribute__((target("avx512f"), noinline)) float fp32_loop(int64_t iters) {
#define KEEL_STEP(k) a##k = _mm512_fmadd_ps(a##k, b, c);
  KEEL_BF16_CHAINS(KEEL_INIT)
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i) {
    KEEL_BF16_CHAINS(KEEL_STEP)
  }
  __m512 s = _mm512_setzero_ps();
  KEEL_BF16_CHAINS(KEEL_FOLD)
#undef KEEL_STEP
#undef KEEL_INIT
#undef KEEL_FOLD
  return lanes_sum(s);
}
#undef KEEL_BF16_CHAINS

std::atomic<float> g_sink{0};  // the loops' results, so that the compiler keeps them

// FLOP/s of `loop` (flops_per_iter each iteration): the best of 5 runs after a first that warms the core (interference
// only slows a run).
double rate(float (*loop)(int64_t), double flops_per_iter) {
  constexpr int64_t kIters = 1 << 16;  // 12 x 64K instructions: 0.1-0.3 ms at one or two per cycle
  double best = 0;
  for (int r = 0; r < 6; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const float v = loop(kIters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    g_sink.store(g_sink.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
    if (r > 0 && s > 0) best = std::max(best, flops_per_iter * static_cast<double>(kIters) / s);  // the first warms
  }
  return best;
}

Bf16Speed measure() {
  Bf16Speed s;
  __builtin_cpu_init();
  s.amx_bf16 = __builtin_cpu_supports("amx-bf16");
  const bool avx512 = __builtin_cpu_supports("avx512f");
  s.avx512_bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (avx512) s.fp32_gflops = rate(fp32_loop, 2.0 * 16 * kChains) / 1e9;
  if (s.avx512_bf16) s.bf16_gflops = rate(bf16_loop, 2.0 * 32 * kChains) / 1e9;
  return s;
}

}  // namespace

const Bf16Speed& bf16_speed() {
  static const Bf16Speed s = measure();
  return s;
}

std::string bf16_speed_warning(const Bf16Speed& s) {
  if (s.amx_bf16) return "";
  std::ostringstream m;
  m.precision(0);
  m << std::fixed;
  if (!s.avx512_bf16) {
    m << "bf16 layers will run slower than fp32 ones on this CPU: it has neither AMX nor AVX-512 BF16, so oneDNN "
         "converts bf16 to fp32 in software; bf16 (--precision bf16) saves activation memory here, not time";
    return m.str();
  }
  if (s.bf16_gflops >= 1.2 * s.fp32_gflops) return "";
  m << "bf16 layers will likely run " << (s.bf16_gflops < s.fp32_gflops ? "slower than" : "no faster than")
    << " fp32 ones on this CPU: its bf16 dot products (AVX-512 BF16, no AMX) reach " << s.bf16_gflops
    << " GFLOP/s on a core against " << s.fp32_gflops
    << " for fp32 FMAs; bf16 (--precision bf16) saves activation memory here, not time";
  return m.str();
}

void warn_if_bf16_slow() {
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string w = bf16_speed_warning(bf16_speed());
    if (!w.empty()) host_log(KEEL_LOG_WARN, w);
  });
}

}  // namespace keel::onednn
