// The header-only C++ wrapper (keel.hpp): RAII handles and errors as keel::api::Error. This file sees keel.hpp only,
// as a host application would; the model bytes come from c_api_test.cc (which may use the core's GraphBuilder).
#include <keel/keel.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

std::string keel_c_api_test_model();

namespace {

TEST(CApiHpp, RunsAModelAndThrowsOnErrors) {
  keel::api::EnvironmentOptions eo;
  eo.discover_plugins = false;
  keel::api::Environment env(eo);
  ASSERT_FALSE(env.devices().empty());
  EXPECT_EQ(env.devices()[0].device_type, "cpu");
  EXPECT_EQ(env.plugins().at(0).state, KEEL_PLUGIN_STATE_LOADED);

  std::string bytes = keel_c_api_test_model();
  keel::api::Model model = keel::api::Model::from_memory(bytes.data(), bytes.size());
  keel::api::Session session(env, model);
  auto ins = session.inputs();
  ASSERT_EQ(ins.size(), 1u);
  EXPECT_EQ(ins[0].name, "x");
  EXPECT_EQ(ins[0].dims, (std::vector<int64_t>{-1, 3}));

  auto x = keel::api::Tensor::f32({2, 3}, {-1, 2, -3, 4, -5, 6});
  auto outs = session.run({{"x", &x}});
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].to_vector<float>(), (std::vector<float>{1, 4, 3, 5, 2, 9}));
  EXPECT_EQ(outs[1].shape(), (std::vector<int64_t>{2, 2}));
  auto z = session.run({{"x", &x}}, {"z"});
  EXPECT_EQ(z.at(0).to_vector<float>(), (std::vector<float>{-4, -1, 10, 1}));

  std::vector<float> buf(3, -1.f);
  auto wrapped = keel::api::Tensor::wrap(KEEL_DTYPE_F32, {1, 3}, buf.data(), buf.size() * sizeof(float));
  EXPECT_EQ(wrapped.data(), buf.data());
  EXPECT_EQ(session.run({{"x", &wrapped}}, {"y"}).at(0).to_vector<float>(), (std::vector<float>{1, 2, 3}));

  try {
    session.run({{"nope", &x}});
    FAIL() << "no exception";
  } catch (const keel::api::Error& e) {
    EXPECT_EQ(e.code(), KEEL_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("unknown input 'nope'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(keel::api::Model::from_memory("junk", 4), keel::api::Error);
  keel::api::SessionOptions so;
  so.devices = {"nodev"};
  EXPECT_THROW(keel::api::Session(env, model, so), keel::api::Error);
  so.devices.clear();
  so.shape_variants = -1;
  EXPECT_THROW(keel::api::Session(env, model, so), keel::api::Error);

  // Moves transfer ownership; the moved-from handle is empty.
  keel::api::Tensor moved = std::move(x);
  EXPECT_EQ(x.get(), nullptr);
  EXPECT_EQ(moved.element_count(), 6);
  EXPECT_FALSE(keel::api::version().empty());
}

}  // namespace
