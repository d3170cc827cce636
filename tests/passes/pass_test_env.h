// keel/tests/passes/pass_test_env.h — the environment the pass tests share: one per test binary, with the pass
// plugins found in KEEL_PASSES_PLUGIN_DIR, released in gtest's global tear-down (before static destruction, which
// must not race the thread pool or unload plugins late). Include once per test binary, inside an unnamed namespace.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "core/runtime/environment.h"

namespace keel {
namespace {

std::unique_ptr<Environment>& env_slot() {
  static std::unique_ptr<Environment> e;
  return e;
}
class EnvironmentHolder : public ::testing::Environment {
 public:
  void TearDown() override { env_slot().reset(); }
};
[[maybe_unused]] ::testing::Environment* const kHolder = ::testing::AddGlobalTestEnvironment(new EnvironmentHolder);

Environment& env() {
  auto& e = env_slot();
  if (!e) {
    EnvironmentOptions o;
    const char* dir = std::getenv("KEEL_PASSES_PLUGIN_DIR");
    o.plugin_paths.emplace_back(dir ? dir : KEEL_PASSES_PLUGIN_DIR_DEFAULT);
    auto r = Environment::create(o);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    e = std::move(r).value();
  }
  return *e;
}

}  // namespace
}  // namespace keel
