// keel-host-limits: what this host's CPUs can do at best, measured, so that a model's speed can be read as a
// fraction of it (`keel bench` reads the file this writes and reports "fraction_of_peak").
//
// Measured, each on one core and on every core this process may use (one pinned thread per CPU, all at once):
//   - fp32 FMA peak: independent chains of fused multiply-adds on the widest vectors the CPU has (AVX-512 or AVX2),
//     enough chains to hide the FMA latency; 2 FLOPs per lane per FMA;
//   - int8 peak: u8 x s8 dot products into i32 (AVX-512 VNNI vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd + vpaddd where
//     VNNI is missing; what oneDNN's int8 convolutions use); 2 ops per multiply-add;
//   - bf16 peak: bf16 dot products into fp32 (AVX-512 BF16 vdpbf16ps, where the CPU has it; what oneDNN's bf16
//     convolutions use without AMX); 2 FLOPs per product. Whether the CPU has AMX (not measured) is saved beside it:
//     on an Intel core without AMX vdpbf16ps reaches half the fp32 FMAs' FLOPs, and bf16 models run slower;
//   - memory bandwidth: STREAM's triad a = b + s * c over arrays much larger than the caches, counting the three
//     arrays' bytes as STREAM does (the write-allocate read is not counted).
// Each figure is the best of several timed repetitions, since interference only ever slows a run down.
//
//   keel-host-limits                    # measure, print a table, save to ~/.cache/keel/host_limits.json
//   keel-host-limits --json out.json    # and write the JSON there instead
//   keel-host-limits --quick            # short runs and small arrays (tests; bandwidth may then hit the caches)
// Under an affinity mask (taskset) it measures those CPUs, and does not overwrite a default file measured on more
// (--json saves it anyway).
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "host_limits_file.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- compute loops: each returns a value that depends on every accumulator, so nothing is optimised away ----

constexpr int kChains = 12;  // independent accumulators: FMA latency (4-5 cycles) x 2 ports, with room

// The 12 chains are written out (CHAINS below) so that they live in registers: as an array, GCC kept them in memory
// and each FMA waited for a store and a load.
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f"))) float fma_avx512(int64_t iters) {
#define INIT(k) __m512 a##k = _mm512_set1_ps(0.001f * k);
#define STEP(k) a##k = _mm512_fmadd_ps(a##k, b, c);
#define FOLD(k) s = _mm512_add_ps(s, a##k);
  CHAINS(INIT)
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i) {
    CHAINS(STEP)
  }
  __m512 s = _mm512_setzero_ps();
  CHAINS(FOLD)
#undef INIT
#undef STEP
#undef FOLD
  alignas(64) float out[16];  // (not _mm512_reduce_add_ps: GCC 12's header warns of an uninitialised value in it)
  _mm512_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
#define INIT(k) __m256 a##k = _mm256_set1_ps(0.001f * k);
#define STEP(k) a##k = _mm256_fmadd_ps(a##k, b, c);
#define FOLD(k) s = _mm256_add_ps(s, a##k);
  CHAINS(INIT)
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < iters; ++i) {
    CHAINS(STEP)
  }
  __m256 s = _mm256_setzero_ps();
  CHAINS(FOLD)
#undef INIT
#undef STEP
#undef FOLD
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}

__attribute__((target("avx512f,avx512vnni"))) float int8_vnni(int64_t iters) {
#define INIT(k) __m512i a##k = _mm512_set1_epi32(k);
#define STEP(k) a##k = _mm512_dpbusd_epi32(a##k, u, v);
#define FOLD(k) s = _mm512_add_epi32(s, a##k);
  CHAINS(INIT)
  const __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
  for (int64_t i = 0; i < iters; ++i) {
    CHAINS(STEP)
  }
  __m512i s = _mm512_setzero_si512();
  CHAINS(FOLD)
#undef INIT
#undef STEP
#undef FOLD
  alignas(64) int32_t out[16];
  _mm512_store_si512(out, s);
  int64_t r = 0;
  for (int32_t v : out) r += v;
  return static_cast<float>(r);
}

__attribute__((target("avx512f,avx512bf16"))) float bf16_dot(int64_t iters) {
#define INIT(k) __m512 a##k = _mm512_set1_ps(0.001f * k);
#define STEP(k) a##k = _mm512_dpbf16_ps(a##k, u, v);
#define FOLD(k) s = _mm512_add_ps(s, a##k);
  CHAINS(INIT)
  const __m512bh u = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh v = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3a83));  // about 1e-3
  for (int64_t i = 0; i < iters; ++i) {
    CHAINS(STEP)
  }
  __m512 s = _mm512_setzero_ps();
  CHAINS(FOLD)
#undef INIT
#undef STEP
#undef FOLD
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float r = 0;
  for (float v : out) r += v;
  return r;
}

__attribute__((target("avx2"))) float int8_avx2(int64_t iters) {
  // Each chain's u8 operand is its own accumulator, so that no product is shared between chains or iterations.
#define INIT(k) __m256i a##k = _mm256_set1_epi32(k);
#define STEP(k) a##k = _mm256_add_epi32(a##k, _mm256_madd_epi16(_mm256_maddubs_epi16(a##k, v), ones));
#define FOLD(k) s = _mm256_add_epi32(s, a##k);
  CHAINS(INIT)
  const __m256i v = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
    CHAINS(STEP)
  }
  __m256i s = _mm256_setzero_si256();
  CHAINS(FOLD)
#undef INIT
#undef STEP
#undef FOLD
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  int64_t r = 0;
  for (int32_t v : out) r += v;
  return static_cast<float>(r);
}

// One compute kernel: its name, the loop, and the operations one iteration performs.
struct Kernel {
  std::string name;
  std::function<float(int64_t)> loop;
  double ops_per_iter = 0;
};

Kernel fp32_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"avx512 fma", fma_avx512, 2.0 * 16 * kChains};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {"avx2 fma", fma_avx2, 2.0 * 8 * kChains};
  return {};
}

Kernel int8_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni"))
    return {"avx512 vnni (vpdpbusd)", int8_vnni, 2.0 * 64 * kChains};
  if (__builtin_cpu_supports("avx2")) return {"avx2 (vpmaddubsw+vpmaddwd)", int8_avx2, 2.0 * 32 * kChains};
  return {};
}

// bf16 dot products into fp32 (two products per lane: what oneDNN's bf16 convolutions use without AMX). AMX tiles,
// where the CPU has them, are far faster and not measured here (the JSON says whether it has them).
Kernel bf16_kernel() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
    return {"avx512 bf16 (vdpbf16ps)", bf16_dot, 2.0 * 32 * kChains};
  return {};
}

// ---- running on pinned threads ----

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // best effort: an unpinned run only measures lower
}

// Runs `work(thread_index)` on one thread per CPU of `cpus`, all released at once; returns the wall time from the
// release until the last one finished.
double run_together(const std::vector<int>& cpus, const std::function<void(size_t)>& work) {
  std::atomic<size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < cpus.size(); ++t)
    threads.emplace_back([&, t] {
      pin_to(cpus[t]);
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      work(t);
    });
  while (ready.load() < cpus.size()) std::this_thread::yield();
  const auto t0 = Clock::now();
  go.store(true, std::memory_order_release);
  for (auto& th : threads) th.join();
  return seconds_since(t0);
}

std::atomic<float> g_sink{0};  // what the loops return goes here, so the compiler keeps them

// Best operations per second of `k` over `reps` repetitions of about `seconds` each, on the CPUs given.
double compute_peak(const Kernel& k, const std::vector<int>& cpus, double seconds, int reps) {
  // Calibrate the iteration count on one core so that a repetition takes about `seconds`.
  int64_t iters = 1 << 14;
  for (;;) {
    const double s = run_together({cpus[0]}, [&](size_t) { g_sink = g_sink + k.loop(iters); });
    if (s >= seconds / 4 || iters > (int64_t{1} << 40)) {
      iters = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(iters) * seconds / std::max(s, 1e-9)));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double s = run_together(cpus, [&](size_t) { g_sink = g_sink + k.loop(iters); });
    best = std::max(best, k.ops_per_iter * static_cast<double>(iters) * static_cast<double>(cpus.size()) / s);
  }
  return best;
}

// STREAM triad over three arrays of `floats` elements split among the CPUs; bytes per second, best of `reps`.
double triad_bandwidth(const std::vector<int>& cpus, size_t floats, int reps) {
  const size_t n_threads = cpus.size();
  auto chunk = [&](size_t t) {
    return std::pair<size_t, size_t>{floats * t / n_threads, floats * (t + 1) / n_threads};
  };
  std::unique_ptr<float[]> a(new float[floats]), b(new float[floats]), c(new float[floats]);
  // First touch on the thread that will use each part (memory lands near it).
  run_together(cpus, [&](size_t t) {
    auto [lo, hi] = chunk(t);
    for (size_t i = lo; i < hi; ++i) a[i] = 0.f, b[i] = 1.f, c[i] = 2.f;
  });
  const float s = 0.5f;
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    const double sec = run_together(cpus, [&](size_t t) {
      auto [lo, hi] = chunk(t);
      float* __restrict pa = a.get();
      const float* __restrict pb = b.get();
      const float* __restrict pc = c.get();
      for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
    });
    best = std::max(best, 3.0 * sizeof(float) * static_cast<double>(floats) / sec);
  }
  g_sink = g_sink + a[floats / 2];
  return best;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto value = line.find_first_not_of(" \t", line.find(':') == std::string::npos ? 0 : line.find(':') + 1);
      return value == std::string::npos ? "unknown" : line.substr(value);
    }
  return "unknown";
}

std::filesystem::path default_output() {
  const std::filesystem::path shared = keel::default_host_limits_file();
  return shared.empty() ? std::filesystem::path("host_limits.json") : shared;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "keel-host-limits: this host's fp32 FMA peak, int8 and bf16 peaks and memory bandwidth, per core and on every "
      "core, "
      "measured; saved as JSON for `keel bench` (its fraction_of_peak)"};
  std::string output;
  bool quick = false, no_save = false;
  double seconds = 0.25;
  int reps = 5;
  int64_t mib = 0;
  app.add_option("--json,-o", output, "Write the results here (default: " + default_output().string() + ")");
  app.add_flag("--no-save", no_save, "Print only; write no file");
  app.add_flag("--quick", quick, "Short runs and 16 MiB arrays (bandwidth may then be the caches')");
  app.add_option("--seconds", seconds, "Length of one timed repetition")->check(CLI::Range(0.01, 10.0));
  app.add_option("--reps", reps, "Repetitions; the best counts")->check(CLI::Range(1, 100));
  app.add_option("--array-mib", mib, "Size of each of the triad's three arrays (default 256 MiB, 16 with --quick)")
      ->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    seconds = std::min(seconds, 0.03);
    reps = std::min(reps, 2);
  }
  if (mib == 0) mib = quick ? 16 : 256;

  const std::vector<int> all = allowed_cpus();
  const std::vector<int> one = {all[0]};
  const Kernel fp32 = fp32_kernel(), int8 = int8_kernel(), bf16 = bf16_kernel();
  nlohmann::json j;
  j["cpu"] = cpu_model();
  j["cpus"] = all.size();
  j["quick"] = quick;
  j["fp32_kernel"] = fp32.name.empty() ? "none" : fp32.name;
  j["int8_kernel"] = int8.name.empty() ? "none" : int8.name;
  j["bf16_kernel"] = bf16.name.empty() ? "none" : bf16.name;
  j["amx_bf16"] = static_cast<bool>(__builtin_cpu_supports("amx-bf16"));
  try {
    if (fp32.loop) {
      j["fp32_gflops_per_core"] = compute_peak(fp32, one, seconds, reps) / 1e9;
      j["fp32_gflops_all_cores"] = compute_peak(fp32, all, seconds, reps) / 1e9;
    }
    if (int8.loop) {
      j["int8_gops_per_core"] = compute_peak(int8, one, seconds, reps) / 1e9;
      j["int8_gops_all_cores"] = compute_peak(int8, all, seconds, reps) / 1e9;
    }
    if (bf16.loop) {
      j["bf16_gflops_per_core"] = compute_peak(bf16, one, seconds, reps) / 1e9;
      j["bf16_gflops_all_cores"] = compute_peak(bf16, all, seconds, reps) / 1e9;
    }
    const size_t floats = static_cast<size_t>(mib) * 1024 * 1024 / sizeof(float);
    j["triad_array_mib"] = mib;
    j["memory_gbs_one_core"] = triad_bandwidth(one, floats, reps) / 1e9;
    j["memory_gbs_all_cores"] = triad_bandwidth(all, floats, reps) / 1e9;
  } catch (const std::bad_alloc&) {
    std::cerr << "keel-host-limits: cannot allocate three arrays of " << mib << " MiB (--array-mib)\n";
    return 1;
  }

  auto num = [&](const char* key) { return j.contains(key) ? j[key].get<double>() : 0.0; };
  std::cout << "host      " << j["cpu"].get<std::string>() << ", " << all.size() << " CPU(s)\n"
            << std::fixed << std::setprecision(1);
  std::cout << "                          one core     all " << all.size() << "\n";
  std::cout << "fp32 FMA  GFLOP/s    " << std::setw(12) << num("fp32_gflops_per_core") << std::setw(12)
            << num("fp32_gflops_all_cores") << "   (" << j["fp32_kernel"].get<std::string>() << ")\n";
  std::cout << "int8      GOP/s      " << std::setw(12) << num("int8_gops_per_core") << std::setw(12)
            << num("int8_gops_all_cores") << "   (" << j["int8_kernel"].get<std::string>() << ")\n";
  std::cout << "bf16 dot  GFLOP/s    " << std::setw(12) << num("bf16_gflops_per_core") << std::setw(12)
            << num("bf16_gflops_all_cores") << "   (" << j["bf16_kernel"].get<std::string>()
            << (j["amx_bf16"].get<bool>() ? "; AMX bf16 present, not measured" : "; no AMX") << ")\n";
  std::cout << "memory    GB/s       " << std::setw(12) << num("memory_gbs_one_core") << std::setw(12)
            << num("memory_gbs_all_cores") << "   (triad, 3 x " << mib << " MiB)\n";
  // A run on fewer CPUs than the default file was measured on (under taskset: the process' affinity) does not write
  // over it: `keel bench` reads that file for every thread count (--json FILE saves it anyway).
  if (!no_save && output.empty()) {
    std::ifstream saved(default_output());
    int saved_cpus = 0;
    if (saved) {
      const nlohmann::json old = nlohmann::json::parse(saved, nullptr, false);
      if (old.is_object() && old.contains("cpus") && old["cpus"].is_number_integer())
        saved_cpus = old["cpus"].get<int>();
    }
    if (saved_cpus > static_cast<int>(all.size())) {
      std::cout << "not saved: " << default_output().string() << " was measured on " << saved_cpus
                << " CPUs, this run on " << all.size() << " (the process' affinity); --json FILE saves it\n";
      return 0;
    }
  }
  if (!no_save) {
    const std::filesystem::path out = output.empty() ? default_output() : std::filesystem::path(output);
    std::error_code ec;
    if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path(), ec);
    std::ofstream f(out);
    if (!(f << j.dump(1) << "\n")) {
      std::cerr << "keel-host-limits: cannot write " << out << "\n";
      return 1;
    }
    std::cout << "saved     " << out.string() << "\n";
  }
  return 0;
}
