// Device indices end to end: DeviceSpec parsing, sessions on TYPE:INDEX (kernels get the index, memory comes from
// that device's pool), copies between two devices of one type (peer copy or through the host), eager to("x:1"),
// and the C API's keel_session_options_add_device_index. A test plugin exposes two devices of type "duo" whose memory
// the core treats as device memory; no GPU is needed (the CUDA case skips with a message when none is present).
#include <gtest/gtest.h>
#include <keel/keel.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "core/base/device_spec.h"
#include "core/runtime/eager.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tests/common/fake_device.h"

namespace keel {
namespace {

// ---- A fake accelerator with two devices (tests/common/fake_device.h) -------------------------------------------
testkit::FakeDevice g_duo;  // type "duo", 2 devices; capabilities say whether it reports KEEL_DEVICE_CAP_PEER_COPY

keel_status_t duo_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  g_duo.type = "duo";
  g_duo.count = 2;
  g_duo.host = host;
  const keel_device_table_t t = g_duo.table();
  if (keel_status_t st = host->register_device(plugin, &t)) return st;
  keel_kernel_def_t k = testkit::kernel_def("duo_relu", "Relu", 1, "duo", testkit::fake_relu);
  k.user_data = &g_duo;
  return host->register_kernel(plugin, &k);
}
const keel_plugin_t kDuoPlugin = testkit::device_plugin("duo", duo_init);

std::unique_ptr<Environment> make_env() {
  EnvironmentOptions o;
  o.discover_plugins = false;
  o.threads = 1;
  o.builtin_plugins.push_back({&kDuoPlugin, 10, "two fake devices"});
  auto env = Environment::create(o);
  EXPECT_TRUE(env.is_ok()) << env.status().to_string();
  return std::move(env).value();
}

// x -> Relu -> Neg -> y (Neg has no duo kernel: it falls back to the CPU, so copies go both ways)
Graph relu_neg() {
  GraphBuilder b("rn");
  auto x = b.input("x", DType::kF32, {2, 3});
  auto r = b.op1("Relu", {x});
  auto n = b.op1("Neg", {r});
  b.output(n);
  return b.take();
}

// ---- DeviceSpec -------------------------------------------------------------------------------------------------

TEST(DeviceSpec, ParsesTypeAndIndex) {
  auto a = DeviceSpec::parse("cuda:1");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a.value().type, "cuda");
  EXPECT_EQ(a.value().index, 1);
  EXPECT_TRUE(a.value().explicit_index);
  EXPECT_EQ(a.value().to_string(), "cuda:1");
  auto b = DeviceSpec::parse("cuda");
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b.value().index, 0);
  EXPECT_FALSE(b.value().explicit_index);
  EXPECT_EQ(b.value().to_string(), "cuda:0");
  auto c = DeviceSpec::parse(" CPU:0 ");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c.value().type, "cpu");
  EXPECT_EQ(c.value().index, 0);
  EXPECT_EQ(DeviceSpec::parse("cuda:12").value().index, 12);
}

TEST(DeviceSpec, RejectsMalformedSpecsNamingThem) {
  for (const char* bad : {"cuda:x", "cuda:-1", "cuda:", ":1", "", "cu da", "1cuda", "cuda:1:2", "cuda:99999999999"}) {
    auto r = DeviceSpec::parse(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    if (*bad != '\0') {
      EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos) << r.status().to_string();
    }
  }
  EXPECT_NE(DeviceSpec::parse("cuda:-1").status().message().find(">= 0"), std::string::npos);
  EXPECT_NE(DeviceSpec::parse("cuda:x").status().message().find("not a number"), std::string::npos);
}

TEST(DeviceSpec, ResolveChecksTypeAndCount) {
  auto env = make_env();
  EXPECT_TRUE(env->device("cpu:0").is_ok());
  EXPECT_TRUE(env->device("duo:1").is_ok());
  auto past = env->device("duo:2");
  ASSERT_FALSE(past.is_ok());
  EXPECT_EQ(past.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("'duo:2'"), std::string::npos) << past.status().to_string();
  EXPECT_NE(past.status().message().find("2 duo devices"), std::string::npos) << past.status().to_string();
  auto cpu1 = env->device("cpu:1");
  ASSERT_FALSE(cpu1.is_ok());
  EXPECT_NE(cpu1.status().message().find("1 cpu device"), std::string::npos) << cpu1.status().to_string();
  auto unknown = env->device("tpu:0");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("tpu"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("duo"), std::string::npos) << "lists the known types";
}

// ---- Sessions ---------------------------------------------------------------------------------------------------

TEST(DeviceIndexSession, CpuZeroRunsAndCpuOneIsAClearError) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"cpu:0"};
  auto s = Session::create(*env, relu_neg(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out.value()[0].data<float>()[1], -2.f);
  opts.devices = {"cpu:1"};
  auto bad = Session::create(*env, relu_neg(), opts);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(bad.status().message().find("cpu:1"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("there is 1 cpu device"), std::string::npos) << bad.status().to_string();
  opts.devices = {"cpu:x"};
  EXPECT_EQ(Session::create(*env, relu_neg(), opts).status().code(), StatusCode::kInvalidArgument);
}

TEST(DeviceIndexSession, KernelsGetTheIndexAndMemoryComesFromItsPool) {
  auto env = make_env();
  for (int32_t index : {1, 0}) {
    g_duo.reset_counts();
    SessionOptions opts;
    opts.devices = {"duo:" + std::to_string(index)};
    auto s = Session::create(*env, relu_neg(), opts);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const float want[] = {0, -2, 0, -4, 0, -6};
    for (int i = 0; i < 6; ++i) EXPECT_EQ(out.value()[0].data<float>()[i], want[i]);
    std::lock_guard<std::mutex> lock(g_duo.mu);
    EXPECT_EQ(g_duo.relu_runs.size(), 1u);
    EXPECT_EQ(g_duo.relu_runs[index], 1) << "the kernel context reported another device index";
    EXPECT_EQ(g_duo.allocations.size(), 1u);
    EXPECT_GT(g_duo.allocations[index], 0) << "no memory from duo:" << index;
    // host -> duo:index (input), duo:index -> host (for Neg on the CPU)
    ASSERT_EQ(g_duo.copy_log.size(), 2u);
    EXPECT_EQ(g_duo.copy_log[0], "H2D 0->" + std::to_string(index));
    EXPECT_EQ(g_duo.copy_log[1], "D2H " + std::to_string(index) + "->0");
  }
  auto stats = env->memory_stats();
  EXPECT_TRUE(stats.count("duo:1")) << "no pool for duo:1";
  EXPECT_TRUE(stats.count("duo:0"));
}

TEST(DeviceIndexSession, TwoIndicesOfOneTypeAreAnError) {
  auto env = make_env();
  SessionOptions opts;
  opts.devices = {"duo:0", "duo:1"};
  auto s = Session::create(*env, relu_neg(), opts);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("one device of each type"), std::string::npos) << s.status().to_string();
  opts.devices = {"duo:2"};
  auto past = Session::create(*env, relu_neg(), opts);
  ASSERT_FALSE(past.is_ok());
  EXPECT_NE(past.status().message().find("2 duo devices"), std::string::npos) << past.status().to_string();
}

// ---- Copies between two devices of one type ---------------------------------------------------------------------

TEST(DeviceIndexCopy, PeerCopyWhenTheDeviceHasOneElseThroughTheHost) {
  auto env = make_env();
  float src_host[4] = {1, 2, 3, 4};
  auto a0 = env->allocator("duo", 0);
  auto a1 = env->allocator("duo", 1);
  ASSERT_TRUE(a0.is_ok() && a1.is_ok());
  void* d0 = a0.value()->allocate(16).value();
  void* d1 = a1.value()->allocate(16).value();
  const Location at0{"duo", 0}, at1{"duo", 1}, host{"cpu", 0};
  for (bool peer : {true, false}) {
    g_duo.capabilities = peer ? KEEL_DEVICE_CAP_PEER_COPY : 0;
    g_duo.reset_counts();
    ASSERT_TRUE(env->copy(d0, at0, src_host, host, 16).is_ok());
    ASSERT_TRUE(env->copy(d1, at1, d0, at0, 16).is_ok());
    float back[4] = {};
    ASSERT_TRUE(env->copy(back, host, d1, at1, 16).is_ok());
    for (int i = 0; i < 4; ++i) EXPECT_EQ(back[i], src_host[i]);
    std::lock_guard<std::mutex> lock(g_duo.mu);
    std::vector<std::string> want = peer ? std::vector<std::string>{"H2D 0->0", "D2D 0->1", "D2H 1->0"}
                                         : std::vector<std::string>{"H2D 0->0", "D2H 0->0", "H2D 0->1", "D2H 1->0"};
    EXPECT_EQ(g_duo.copy_log, want) << (peer ? "peer" : "staged");
  }
  g_duo.capabilities = 0;
  auto bad = env->copy(d1, Location{"duo", 5}, d0, at0, 16);
  EXPECT_EQ(bad.code(), StatusCode::kOutOfRange) << bad.to_string();
  a0.value()->free(d0);
  a1.value()->free(d1);
}

// ---- Eager ------------------------------------------------------------------------------------------------------

TEST(DeviceIndexEager, ToMovesBetweenIndicesAndOpsRunThere) {
  std::shared_ptr<Environment> env = make_env();
  eager::init(env);
  g_duo.reset_counts();
  eager::Tensor x(Tensor::f32({2, 2}, {-1, 2, -3, 4}));
  eager::Tensor on1 = x.to("duo:1");
  EXPECT_EQ(on1.device(), "duo:1");
  EXPECT_EQ(on1.data().location().device_index, 1);
  eager::Tensor y = eager::relu(on1);
  EXPECT_EQ(y.data().location().to_string(), "duo:1");
  eager::Tensor z = y.to("duo:0");
  EXPECT_EQ(z.data().location().to_string(), "duo:0");
  EXPECT_EQ(z.to("cpu").to_vector<float>(), (std::vector<float>{0, 2, 0, 4}));
  {
    std::lock_guard<std::mutex> lock(g_duo.mu);
    EXPECT_EQ(g_duo.relu_runs[1], 1);
    EXPECT_EQ(g_duo.relu_runs.count(0), 0u);
    EXPECT_GT(g_duo.allocations[1], 0);
  }
  // Same device: *this; a device that does not exist: an Error naming it.
  EXPECT_EQ(on1.to("duo:1").impl(), on1.impl());
  try {
    (void)x.to("duo:7");
    ADD_FAILURE() << "duo:7 accepted";
  } catch (const eager::Error& e) {
    EXPECT_NE(std::string(e.what()).find("duo:7"), std::string::npos) << e.what();
  }
  // Ops on tensors of two indices of one type: an error naming both.
  try {
    (void)(on1 + z);
    ADD_FAILURE() << "mixed devices accepted";
  } catch (const eager::Error& e) {
    EXPECT_NE(std::string(e.what()).find("duo:1"), std::string::npos) << e.what();
  }
  // Factories take the names Tensor::device() gives (DataParallel makes its buckets with zeros(..., p.device())).
  for (const std::string dev : {"duo:1", "duo:0", "duo", "cpu:0"}) {
    eager::Tensor f = eager::zeros({3}, DType::kF32, dev);
    EXPECT_EQ(f.device(), eager::Tensor(Tensor::f32({1}, {0})).to(dev).device()) << dev;
    EXPECT_EQ(eager::empty({2}, DType::kF32, dev).device(), f.device()) << dev;
    EXPECT_EQ(f.to("cpu").to_vector<float>(), (std::vector<float>{0, 0, 0})) << dev;
  }
  EXPECT_EQ(eager::zeros({1}, DType::kF32, "duo:1").data().location().device_index, 1);
  for (const std::string dev : {"duo:7", "nope", "duo:x"}) {
    try {
      (void)eager::zeros({3}, DType::kF32, dev);
      ADD_FAILURE() << dev << " accepted";
    } catch (const eager::Error& e) {
      EXPECT_NE(std::string(e.what()).find(dev), std::string::npos) << e.what();
    }
  }
  eager::init(nullptr);
}

// ---- C API ------------------------------------------------------------------------------------------------------

TEST(DeviceIndexCApi, AddDeviceIndex) {
  keel_session_options_t opts = nullptr;
  ASSERT_EQ(keel_session_options_create(&opts), nullptr);
  EXPECT_EQ(keel_session_options_add_device_index(opts, "cpu", 0), nullptr);
  auto expect_error = [](keel_status_t st, keel_status_code_t code, const char* needle) {
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->code, code);
    EXPECT_NE(std::string(st->message).find(needle), std::string::npos) << st->message;
    keel_status_release(st);
  };
  expect_error(keel_session_options_add_device_index(opts, "cuda", -1), KEEL_STATUS_INVALID_ARGUMENT, "-1");
  expect_error(keel_session_options_add_device_index(opts, "cuda:1", 1), KEEL_STATUS_INVALID_ARGUMENT, "':'");
  expect_error(keel_session_options_add_device_index(opts, nullptr, 0), KEEL_STATUS_INVALID_ARGUMENT, "device_type");
  expect_error(keel_session_options_add_device_index(nullptr, "cpu", 0), KEEL_STATUS_INVALID_ARGUMENT, "options");
  expect_error(keel_session_options_add_device(opts, "cuda:x"), KEEL_STATUS_INVALID_ARGUMENT, "cuda:x");
  keel_session_options_release(opts);
}

// ---- The command line ------------------------------------------------------------------------------------------

#ifdef KEEL_CLI_BINARY
// Runs `command` (stderr merged); returns the exit status and the output.
std::pair<int, std::string> shell(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, out};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int rc = pclose(p);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

TEST(DeviceIndexCli, RunAndBenchTakeAnIndex) {
  const auto dir = std::filesystem::temp_directory_path() / ("keel_device_index_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto model = dir / "m.onnx";
  ASSERT_TRUE(save_onnx(relu_neg(), model).is_ok());
  const std::string keel = std::string(KEEL_CLI_BINARY) + " ";
  auto [rc, out] = shell(keel + "run " + model.string() + " --device cpu:0");
  EXPECT_EQ(rc, 0) << out;
  auto [rc1, out1] = shell(keel + "run " + model.string() + " --device cpu:1");
  EXPECT_EQ(rc1, 1) << out1;
  EXPECT_NE(out1.find("'cpu:1' does not exist: there is 1 cpu device"), std::string::npos) << out1;
  EXPECT_EQ(out1.find("input "), std::string::npos) << "the device is checked before any input is made:\n" << out1;
  auto [rc2, out2] = shell(keel + "run " + model.string() + " --device cpu:x");
  EXPECT_EQ(rc2, 1) << out2;
  EXPECT_NE(out2.find("not a number"), std::string::npos) << out2;
  auto [rc3, out3] = shell(keel + "bench " + model.string() + " --device cpu:0 --iters 2 --warmup 1");
  EXPECT_EQ(rc3, 0) << out3;
  auto [rc4, out4] = shell(keel + "bench " + model.string() + " --device cpu:3 --iters 2 --warmup 1");
  EXPECT_EQ(rc4, 1) << out4;
  EXPECT_NE(out4.find("cpu:3"), std::string::npos) << out4;
  std::filesystem::remove_all(dir);
}
#endif

// ---- A real second card, where there is one ---------------------------------------------------------------------

TEST(DeviceIndexGpu, CudaOneWhenTwoCardsArePresent) {
  EnvironmentOptions o;
  auto env = Environment::create(o);
  ASSERT_TRUE(env.is_ok()) << env.status().to_string();
  const DeviceEntry* cuda = env.value()->registry().device("cuda");
  if (cuda == nullptr || cuda->device_count < 2) {
    GTEST_SKIP() << "needs the CUDA plugin and two GPUs (" << (cuda ? cuda->device_count : 0) << " present)";
  }
  SessionOptions opts;
  opts.devices = {"cuda:1"};
  auto s = Session::create(*env.value(), relu_neg(), opts);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  auto out = s.value()->run({{"x", Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6})}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(out.value()[0].data<float>()[1], -2.f);
  EXPECT_TRUE(env.value()->memory_stats().count("cuda:1"));
}

}  // namespace
}  // namespace keel
