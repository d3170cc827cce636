// ABI compatibility of plugins, through a whole Environment and Session (see CMakeLists.txt beside this file):
// older and newer minors load and run; another major is refused naming both versions; an init that fails or throws
// is skipped, and the process keeps working.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/base/graph.h"
#include "core/runtime/environment.h"
#include "core/runtime/session.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

fs::path fixture_dir(const std::string& name) {
  const char* env = std::getenv("KEEL_TEST_PLUGIN_DIR");
  return fs::path(env && *env ? env : KEEL_TEST_PLUGIN_DIR_DEFAULT) / name;
}

std::unique_ptr<Environment> env_with(const std::vector<std::string>& dirs) {
  EnvironmentOptions o;
  for (const auto& d : dirs) o.plugin_paths.push_back(fixture_dir(d));
  auto env = Environment::create(o);
  EXPECT_TRUE(env.is_ok()) << env.status().to_string();
  return env.is_ok() ? std::move(env).value() : nullptr;
}

const PluginRecord* find(const Environment& env, const std::string& name) {
  for (const auto& p : env.plugins())
    if (p.name == name) return &p;
  return nullptr;
}

// Runs Relu on `device` and checks the values; fallback = error, so the node must run there. With `profile`, returns
// the profile's steps that the kernel reported (ABI 1.3).
std::vector<ProfileStep> run_relu_on(Environment& env, const std::string& device, bool profile = false) {
  GraphBuilder b("relu", 17);
  auto x = b.input("x", DType::kF32, {4});
  b.output(b.op1("Relu", {x}));
  SessionOptions so;
  so.devices = {device};
  so.fallback = Fallback::kError;
  so.profile = profile;
  std::vector<ProfileStep> steps;
  [&] {
    auto s = Session::create(env, b.take(), so);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    bool on_device = false;
    for (const auto& [node, op, dev, kernel] : (*s)->placement()) on_device |= op == "Relu" && dev == device;
    EXPECT_TRUE(on_device);
    auto out = (*s)->run({{"x", Tensor::f32({4}, {-1, 2, -3, 4})}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const float* y = out->at(0).data<float>();
    EXPECT_EQ(std::vector<float>(y, y + 4), (std::vector<float>{0, 2, 0, 4}));
    for (const auto& p : (*s)->profile()) {
      if (profile) {
        EXPECT_EQ(p.calls, 1);
      }
      steps.insert(steps.end(), p.steps.begin(), p.steps.end());
    }
  }();
  return steps;
}

TEST(AbiCompat, OlderMinorWithTruncatedStructsLoadsAndRuns) {
  auto env = env_with({"abi_old_minor"});
  ASSERT_TRUE(env);
  const PluginRecord* p = find(*env, "abi_old");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->state, PluginState::kLoaded) << p->reason;
  EXPECT_EQ(p->abi, std::to_string(KEEL_PLUGIN_ABI_MAJOR) + ".0");
  run_relu_on(*env, "olddev");
  // A profiling session: the older kernel reports no steps (it knows no profile_step) and shows as one step.
  EXPECT_TRUE(run_relu_on(*env, "olddev", /*profile=*/true).empty());
  // Releasing the session (kernel `release` is past struct_size) and the environment (descriptor `shutdown` is past
  // struct_size) must not call the poison.
  env.reset();
}

TEST(AbiCompat, NewerMinorWithLargerStructsLoadsAndRuns) {
  auto env = env_with({"abi_new_minor"});
  ASSERT_TRUE(env);
  const PluginRecord* p = find(*env, "abi_new");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->state, PluginState::kLoaded) << p->reason;
  run_relu_on(*env, "newdev");
  // Its profile step comes in a record larger than ours: the core reads what it knows.
  auto steps = run_relu_on(*env, "newdev", /*profile=*/true);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].kind, "relu_loop");
  EXPECT_EQ(steps[0].op_type, "Relu");
  ASSERT_EQ(steps[0].nodes.size(), 1u);
  EXPECT_DOUBLE_EQ(steps[0].total_ms, 0.001);
}

// Fixtures of tests/plugins, seen through a whole environment.
TEST(AbiCompat, AnotherMajorIsRefusedNamingBothVersions) {
  auto env = env_with({"abi_major", "abi_descriptor"});
  ASSERT_TRUE(env);
  // (The fixtures name the next major with minor 0 in a manifest, or with this SDK's minor in a descriptor.)
  std::string next = std::to_string(KEEL_PLUGIN_ABI_MAJOR + 1) + ".";
  std::string ours = std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." + std::to_string(KEEL_PLUGIN_ABI_MINOR);
  for (const char* name : {"abi_major", "abi_descriptor"}) {
    const PluginRecord* p = find(*env, name);
    if (p == nullptr) GTEST_SKIP() << "tests/plugins fixtures are not built";
    EXPECT_NE(p->state, PluginState::kLoaded);
    EXPECT_NE(p->reason.find("plugin ABI " + next), std::string::npos) << p->reason;
    EXPECT_NE(p->reason.find("core ABI " + ours), std::string::npos) << p->reason;
  }
  run_relu_on(*env, "cpu");
}

TEST(AbiCompat, FailingOrThrowingInitIsSkippedAndTheProcessKeepsWorking) {
  auto env = env_with({"init_error", "init_throws", "abi_old_minor"});
  ASSERT_TRUE(env);
  const PluginRecord* err = find(*env, "init_error");
  const PluginRecord* thr = find(*env, "init_throws");
  if (err == nullptr || thr == nullptr) GTEST_SKIP() << "tests/plugins fixtures are not built";
  EXPECT_EQ(err->state, PluginState::kFailed);
  EXPECT_NE(err->reason.find("init failed"), std::string::npos) << err->reason;
  EXPECT_EQ(thr->state, PluginState::kFailed);
  EXPECT_NE(thr->reason.find("init threw"), std::string::npos) << thr->reason;
  // Plugins after the broken ones still load and run.
  const PluginRecord* old = find(*env, "abi_old");
  ASSERT_NE(old, nullptr);
  EXPECT_EQ(old->state, PluginState::kLoaded) << old->reason;
  run_relu_on(*env, "olddev");
  run_relu_on(*env, "cpu");
}

}  // namespace
}  // namespace keel
