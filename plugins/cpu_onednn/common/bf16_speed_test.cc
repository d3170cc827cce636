// plugins/cpu_onednn/common/bf16_speed_test.cc — the bf16 warning (common/bf16_speed.h): what it says for which rates,
// that this CPU's rates are measured where its instructions exist, and that it is logged once per process whatever
// the threads that plan bf16 layers at once. The plugin's host_log is replaced here by one that keeps the messages.
#include "common/bf16_speed.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/common.h"

namespace keel::onednn {

namespace {
std::mutex g_log_mu;
std::vector<std::pair<int32_t, std::string>> g_logged;
}  // namespace

void host_log(int32_t level, const std::string& msg) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_logged.emplace_back(level, msg);
}

namespace {

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Bf16Speed, WarnsWhereBf16CannotBeFaster) {
  Bf16Speed intel_vm;  // the Intel Xeon VM of the header: vdpbf16ps on one port, no AMX
  intel_vm.avx512_bf16 = true, intel_vm.bf16_gflops = 86, intel_vm.fp32_gflops = 175;
  const std::string w = bf16_speed_warning(intel_vm);
  EXPECT_TRUE(has(w, "slower than fp32")) << w;
  EXPECT_TRUE(has(w, "86 GFLOP/s")) << w;
  EXPECT_TRUE(has(w, "175 for fp32")) << w;

  Bf16Speed level = intel_vm;  // within a fifth of the FMAs: no faster
  level.bf16_gflops = 190;
  EXPECT_TRUE(has(bf16_speed_warning(level), "no faster than fp32")) << bf16_speed_warning(level);

  Bf16Speed zen4 = intel_vm;  // twice the FMAs' FLOPs: nothing to say
  zen4.bf16_gflops = 350;
  EXPECT_EQ(bf16_speed_warning(zen4), "");

  Bf16Speed amx = intel_vm;  // AMX: faster, whatever vdpbf16ps does
  amx.amx_bf16 = true;
  EXPECT_EQ(bf16_speed_warning(amx), "");

  Bf16Speed emulated;  // neither AMX nor AVX-512 BF16 (AVX2 hosts, Cascade Lake)
  emulated.fp32_gflops = 100;
  EXPECT_TRUE(has(bf16_speed_warning(emulated), "neither AMX nor AVX-512 BF16")) << bf16_speed_warning(emulated);
}

TEST(Bf16Speed, MeasuresThisCpuOnceWhereItsInstructionsExist) {
  __builtin_cpu_init();
  const Bf16Speed& s = bf16_speed();
  EXPECT_EQ(&s, &bf16_speed());  // remembered
  if (!__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(s.fp32_gflops, 0.0);
    GTEST_SKIP() << "no AVX-512 here: nothing measured";
  }
  EXPECT_GT(s.fp32_gflops, 1.0);  // any AVX-512 core: tens of GFLOP/s at least
  EXPECT_EQ(s.avx512_bf16, static_cast<bool>(__builtin_cpu_supports("avx512bf16")));
  if (s.avx512_bf16) EXPECT_GT(s.bf16_gflops, 1.0);
  else EXPECT_EQ(s.bf16_gflops, 0.0);
  std::cout << "this CPU: fp32 FMAs " << s.fp32_gflops << " GFLOP/s, bf16 dot products " << s.bf16_gflops
            << " GFLOP/s, AMX bf16 " << s.amx_bf16 << "\n";
}

// (Once per process: under --gtest_repeat the later repetitions log nothing.)
TEST(Bf16Speed, WarnsOncePerProcessFromAnyThread) {
  static int repetition = 0;
  const bool first = repetition++ == 0;
  {
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_logged.clear();
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([] {
      for (int k = 0; k < 3; ++k) warn_if_bf16_slow();
    });
  for (auto& th : threads) th.join();
  const std::string expected = bf16_speed_warning(bf16_speed());
  std::lock_guard<std::mutex> lock(g_log_mu);
  if (expected.empty() || !first) {
    EXPECT_TRUE(g_logged.empty());
  } else {
    ASSERT_EQ(g_logged.size(), 1u);
    EXPECT_EQ(g_logged[0].first, KEEL_LOG_WARN);
    EXPECT_EQ(g_logged[0].second, expected);
  }
}

}  // namespace
}  // namespace keel::onednn
