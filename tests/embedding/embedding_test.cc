// Embedding Keel in a host application (issue 26, items 4, 6, 7), through keel.h / keel.hpp:
//  - two environments in one process, each loading the same plugins, created and released in both orders; each
//    environment gets its own instance of a plugin with instances, and a plugin with global state is shut down once,
//    with the last environment (the valgrind variant runs these tests under memcheck);
//  - per-environment logging: a callback gets its environment's messages only, and no spdlog logger sees them;
//  - per-plugin options from the host, plugin libraries loaded by path, device properties;
//  - model metadata, the "auto" / "none" pipelines, the optimised graph saved to ONNX and loaded back;
//  - the type-constraint header (old layout without it, new layout with it, a bad header refused).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <keel/keel.h>
#include <onnx/onnx_pb.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <keel/keel.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/graph.h"
#include "core/base/registry.h"
#include "core/runtime/kernel_dispatch.h"
#include "core/runtime/onnx_io.h"

namespace {

namespace fs = std::filesystem;
using keel::DType;
using keel::GraphBuilder;

std::string take(keel_status_t s) {
  if (s == nullptr) return "";
  std::string out = std::string(keel_status_code_name(s->code)) + ": " + (s->message ? s->message : "");
  keel_status_release(s);
  return out;
}
#define ASSERT_KEEL_OK(expr) ASSERT_EQ(take(expr), "")
#define EXPECT_KEEL_OK(expr) EXPECT_EQ(take(expr), "")

bool under_valgrind() { return std::getenv("KEEL_EMBEDDING_VALGRIND") != nullptr; }
std::string plugin_dir() { return KEEL_PLUGIN_DIR_DEFAULT; }
std::string fixture_dir() { return KEEL_EMBEDDING_DIR; }

// x: f32[1,3,6,6] -> Conv(4 filters, 3x3, pad 1) -> BatchNormalization -> Relu -> y. The default pipeline folds the
// BatchNormalization into the Conv and fuses the Relu where the pass plugins are loaded.
keel::Graph conv_bn_relu_graph() {
  GraphBuilder g("conv_bn_relu", 17);
  auto x = g.input("x", DType::kF32, {1, 3, 6, 6});
  std::vector<float> w(4 * 3 * 3 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.05f * static_cast<float>(static_cast<int>(i % 7) - 3);
  auto conv = g.op1("Conv",
                    {x, g.constant("w", keel::Tensor::f32({4, 3, 3, 3}, w)),
                     g.constant("b", keel::Tensor::f32({4}, {0.1f, -0.2f, 0.3f, 0.f}))},
                    {{"pads", keel::Attribute::of_ints({1, 1, 1, 1})}});
  auto bn = g.op1("BatchNormalization", {conv, g.constant("scale", keel::Tensor::f32({4}, {1.f, 0.5f, 2.f, 1.5f})),
                                         g.constant("bias", keel::Tensor::f32({4}, {0.f, 0.1f, -0.1f, 0.2f})),
                                         g.constant("mean", keel::Tensor::f32({4}, {0.05f, 0.f, -0.05f, 0.1f})),
                                         g.constant("var", keel::Tensor::f32({4}, {1.f, 0.8f, 1.2f, 0.9f}))});
  auto y = g.op1("Relu", {bn});
  g.graph().node(g.graph().producer(y).value())->outputs[0] = "y";
  g.output("y");
  return g.take();
}

// The model's bytes, with metadata set as an exporter (PyTorch) would.
std::string model_bytes(bool with_metadata = true) {
  onnx::ModelProto proto;
  keel::Status st = keel::graph_to_model_proto(conv_bn_relu_graph(), proto);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  if (with_metadata) {
    proto.set_producer_name("pytorch");
    proto.set_producer_version("2.1.0");
    proto.set_domain("org.example");
    proto.set_doc_string("a small test model");
    proto.set_model_version(42);
    auto* p = proto.add_metadata_props();
    p->set_key("license");
    p->set_value("MIT");
    p = proto.add_metadata_props();
    p->set_key("author");
    p->set_value("keel tests");
  } else {
    proto.clear_producer_name();
    proto.clear_producer_version();
  }
  return proto.SerializeAsString();
}

std::vector<float> input_values() {
  std::vector<float> v(1 * 3 * 6 * 6);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.3f * static_cast<float>(i));
  return v;
}

// Collects one environment's log messages.
struct LogSink {
  std::mutex mu;
  std::vector<std::string> lines;
  static void callback(void* user_data, int32_t level, const char* message) {
    auto* self = static_cast<LogSink*>(user_data);
    std::lock_guard<std::mutex> lock(self->mu);
    self->lines.push_back(std::to_string(level) + " " + message);
  }
  bool contains(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.find(what) != std::string::npos; });
  }
  // The numbers N of "embedding_instance N: <what>" messages.
  std::vector<int> instances(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<int> out;
    std::regex re("embedding_instance ([0-9]+): " + what);
    for (const auto& l : lines) {
      std::smatch m;
      if (std::regex_search(l, m, re)) out.push_back(std::stoi(m[1]));
    }
    return out;
  }
};

// A sink on spdlog's default logger: what the host's own logging sees.
class HostSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> lines;

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    lines.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush_() override {}
};

// An environment that loads the build tree's plugins (or, under valgrind, a few of them by path) and the fixtures,
// with a log callback.
keel_environment_t make_env(LogSink* log, const std::vector<std::pair<std::string, std::string>>& options = {}) {
  keel_environment_options_t o = nullptr;
  EXPECT_KEEL_OK(keel_environment_options_create(&o));
  if (under_valgrind()) {
    EXPECT_KEEL_OK(keel_environment_options_set_discover_plugins(o, 0));
    for (const char* lib : {"libkeel_null.so", "libkeel_pass_canonicalize.so", "libkeel_pass_fusion.so"}) {
      if (fs::exists(fs::path(plugin_dir()) / lib)) {
        EXPECT_KEEL_OK(keel_environment_options_add_plugin_library(o, (fs::path(plugin_dir()) / lib).c_str()));
      }
    }
    for (const char* lib : {"libkeel_embedding_instance.so", "libkeel_embedding_legacy.so"}) {
      EXPECT_KEEL_OK(keel_environment_options_add_plugin_library(o, (fs::path(fixture_dir()) / lib).c_str()));
    }
  } else {
    EXPECT_KEEL_OK(keel_environment_options_add_plugin_path(o, plugin_dir().c_str()));
    EXPECT_KEEL_OK(keel_environment_options_add_plugin_path(o, fixture_dir().c_str()));
  }
  for (const auto& [k, v] : options)
    EXPECT_KEEL_OK(keel_environment_options_set_plugin_option(o, "embedding_instance", k.c_str(), v.c_str()));
  if (log) {
    EXPECT_KEEL_OK(keel_environment_options_set_log_callback(o, LogSink::callback, log, KEEL_LOG_DEBUG));
  }
  keel_environment_t env = nullptr;
  EXPECT_KEEL_OK(keel_environment_create(o, &env));
  keel_environment_options_release(o);
  return env;
}

const keel_plugin_info_t* find_plugin(keel_environment_t env, const std::string& name, keel_plugin_info_t* info) {
  size_t n = 0;
  EXPECT_KEEL_OK(keel_environment_plugin_count(env, &n));
  for (size_t i = 0; i < n; ++i) {
    info->struct_size = sizeof *info;
    EXPECT_KEEL_OK(keel_environment_plugin_info(env, i, info));
    if (info->name == name) return info;
  }
  return nullptr;
}

// Creates a session (auto pipeline + both fixture passes), runs it once, returns y.
std::vector<float> run_once(keel_environment_t env, keel_model_t model) {
  keel_session_options_t so = nullptr;
  EXPECT_KEEL_OK(keel_session_options_create(&so));
  EXPECT_KEEL_OK(keel_session_options_add_pass(so, "embedding_probe"));
  EXPECT_KEEL_OK(keel_session_options_add_pass(so, "embedding_legacy"));
  keel_session_t s = nullptr;
  EXPECT_KEEL_OK(keel_session_create(env, model, so, &s));
  keel_session_options_release(so);
  if (s == nullptr) return {};
  auto x = input_values();
  int64_t dims[] = {1, 3, 6, 6};
  keel_host_tensor_t in = nullptr;
  EXPECT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_F32, dims, 4, x.data(), x.size() * 4, &in));
  const char* names[] = {"x"};
  keel_host_tensor_t out = nullptr;
  EXPECT_KEEL_OK(keel_session_run(s, names, &in, 1, nullptr, &out, 1));
  std::vector<float> y;
  if (out) {
    auto* p = static_cast<const float*>(keel_host_tensor_data(out));
    y.assign(p, p + keel_host_tensor_element_count(out));
  }
  keel_host_tensor_release(out);
  keel_host_tensor_release(in);
  keel_session_release(s);
  return y;
}

int legacy_shutdowns() {
  void* h = dlopen((fs::path(fixture_dir()) / "libkeel_embedding_legacy.so").c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return -1;
  auto fn = reinterpret_cast<int (*)()>(dlsym(h, "embedding_legacy_shutdowns"));
  int n = fn ? fn() : -2;
  dlclose(h);
  return n;
}

void expect_near(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f) << "at " << i;
}

// ------------------------------------------------------------------------------------------------------------------

void two_environments(bool release_first_created_first) {
  std::string bytes = model_bytes();
  keel_model_t model = nullptr;
  ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model));
  // The reference: one environment alone.
  LogSink ref_log;
  keel_environment_t ref_env = make_env(&ref_log);
  ASSERT_NE(ref_env, nullptr);
  std::vector<float> expected = run_once(ref_env, model);
  ASSERT_FALSE(expected.empty());
  keel_environment_release(ref_env);
  const int shutdowns0 = legacy_shutdowns();
  ASSERT_GE(shutdowns0, 1);  // the reference environment was the only one: shut down at its release

  LogSink log_a, log_b;
  keel_environment_t a = make_env(&log_a);
  keel_environment_t b = make_env(&log_b);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  keel_plugin_info_t info{};
  for (keel_environment_t env : {a, b}) {
    for (const char* name : {"embedding_instance", "embedding_legacy"}) {
      ASSERT_NE(find_plugin(env, name, &info), nullptr) << name;
      EXPECT_EQ(info.state, KEEL_PLUGIN_STATE_LOADED) << name << ": " << info.reason;
    }
  }
  expect_near(run_once(a, model), expected);
  expect_near(run_once(b, model), expected);
  // Each environment has its own instance, and ran its passes on it.
  auto created_a = log_a.instances("created"), created_b = log_b.instances("created");
  ASSERT_EQ(created_a.size(), 1u);
  ASSERT_EQ(created_b.size(), 1u);
  EXPECT_NE(created_a[0], created_b[0]);
  EXPECT_EQ(log_a.instances("pass run"), std::vector<int>{created_a[0]});
  EXPECT_EQ(log_b.instances("pass run"), std::vector<int>{created_b[0]});

  keel_environment_t first = release_first_created_first ? a : b;
  keel_environment_t second = release_first_created_first ? b : a;
  LogSink& first_log = release_first_created_first ? log_a : log_b;
  LogSink& second_log = release_first_created_first ? log_b : log_a;
  int first_id = release_first_created_first ? created_a[0] : created_b[0];
  keel_environment_release(first);
  EXPECT_EQ(first_log.instances("shut down"), std::vector<int>{first_id});
  EXPECT_TRUE(second_log.instances("shut down").empty());
  EXPECT_EQ(legacy_shutdowns(), shutdowns0);  // the other environment still uses the plugin's globals

  // The remaining environment keeps working: new sessions, the passes of both fixtures, the oneDNN plugin.
  expect_near(run_once(second, model), expected);
  expect_near(run_once(second, model), expected);
  keel_environment_release(second);
  EXPECT_EQ(second_log.instances("shut down").size(), 1u);
  EXPECT_EQ(legacy_shutdowns(), shutdowns0 + 1);
  keel_model_release(model);
}

TEST(Embedding, TwoEnvironmentsReleasedInCreationOrder) { two_environments(true); }
TEST(Embedding, TwoEnvironmentsReleasedInReverseOrder) { two_environments(false); }

TEST(Embedding, TwoEnvironmentsInterleavedWithCppApi) {
  // keel.hpp: environments as scoped objects, created and destroyed interleaved with sessions of the other.
  keel::api::EnvironmentOptions eo;
  eo.plugin_paths = {plugin_dir(), fixture_dir()};
  if (under_valgrind()) {
    eo.discover_plugins = false;
    eo.plugin_paths.clear();
    eo.plugin_libraries = {fixture_dir() + "/libkeel_embedding_instance.so",
                           fixture_dir() + "/libkeel_embedding_legacy.so"};
  }
  std::string bytes = model_bytes();
  auto model = keel::api::Model::from_memory(bytes.data(), bytes.size());
  keel::api::SessionOptions so;
  so.passes = {"embedding_probe", "embedding_legacy"};
  auto x = keel::api::Tensor::f32({1, 3, 6, 6}, input_values());
  std::vector<float> y1, y2;
  {
    auto env1 = std::make_unique<keel::api::Environment>(eo);
    keel::api::Session s1(*env1, model, so);
    auto env2 = std::make_unique<keel::api::Environment>(eo);
    {
      keel::api::Session s2(*env2, model, so);
      y2 = s2.run({{"x", &x}})[0].to_vector<float>();
    }
    env2.reset();  // the environment created last goes first, while a session of the other lives
    y1 = s1.run({{"x", &x}})[0].to_vector<float>();
  }
  expect_near(y1, y2);
}

// x: f32[1,8,16,16] -> Conv(16 filters, 3x3, pad 1) -> y * Sigmoid(y) (SiLU as torch exports it) -> z.
std::string conv_silu_bytes() {
  GraphBuilder g("conv_silu", 17);
  auto x = g.input("x", DType::kF32, {1, 8, 16, 16});
  std::vector<float> w(16 * 8 * 3 * 3), b(16);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * static_cast<float>(static_cast<int>(i % 11) - 5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.01f * static_cast<float>(i);
  auto y = g.op1("Conv",
                 {x, g.constant("w", keel::Tensor::f32({16, 8, 3, 3}, w)), g.constant("b", keel::Tensor::f32({16}, b))},
                 {{"pads", keel::Attribute::of_ints({1, 1, 1, 1})}});
  auto z = g.op1("Mul", {y, g.op1("Sigmoid", {y})});
  g.graph().node(g.graph().producer(z).value())->outputs[0] = "z";
  g.output("z");
  onnx::ModelProto proto;
  keel::Status st = keel::graph_to_model_proto(g.take(), proto);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return proto.SerializeAsString();
}

// What one profiled run of a session shows: its output, whether a node ran as a oneDNN chain, the chains' steps.
struct ProfiledRun {
  std::vector<float> z;
  bool chained = false;
  size_t chain_steps = 0;
};

ProfiledRun profiled_run(keel_environment_t env, keel_model_t model) {
  ProfiledRun r;
  keel_session_options_t so = nullptr;
  EXPECT_KEEL_OK(keel_session_options_create(&so));
  EXPECT_KEEL_OK(keel_session_options_set_profile(so, 1));
  keel_session_t s = nullptr;
  EXPECT_KEEL_OK(keel_session_create(env, model, so, &s));
  keel_session_options_release(so);
  if (s == nullptr) return r;
  std::vector<float> x(8 * 16 * 16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
  int64_t dims[] = {1, 8, 16, 16};
  keel_host_tensor_t in = nullptr, out = nullptr;
  EXPECT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_F32, dims, 4, x.data(), x.size() * 4, &in));
  const char* names[] = {"x"};
  EXPECT_KEEL_OK(keel_session_run(s, names, &in, 1, nullptr, &out, 1));
  if (out) {
    auto* p = static_cast<const float*>(keel_host_tensor_data(out));
    r.z.assign(p, p + keel_host_tensor_element_count(out));
  }
  size_t n = 0;
  EXPECT_KEEL_OK(keel_session_placement_count(s, &n));
  for (size_t i = 0; i < n; ++i) {
    keel_node_placement_t pl{};
    pl.struct_size = sizeof pl;
    EXPECT_KEEL_OK(keel_session_placement_info(s, i, &pl));
    if (std::string(pl.kernel).find("onednn_chain") == std::string::npos) continue;
    r.chained = true;
    keel_node_profile_t np{};
    np.struct_size = sizeof np;
    EXPECT_KEEL_OK(keel_session_profile_info(s, i, &np));
    r.chain_steps += np.step_count;
  }
  keel_host_tensor_release(out);
  keel_host_tensor_release(in);
  keel_session_release(s);
  return r;
}

keel_environment_t onednn_env(const std::vector<std::pair<std::string, std::string>>& onednn_options) {
  keel_environment_options_t o = nullptr;
  EXPECT_KEEL_OK(keel_environment_options_create(&o));
  EXPECT_KEEL_OK(keel_environment_options_add_plugin_path(o, plugin_dir().c_str()));
  for (const auto& [k, v] : onednn_options)
    EXPECT_KEEL_OK(keel_environment_options_set_plugin_option(o, "cpu_onednn", k.c_str(), v.c_str()));
  keel_environment_t env = nullptr;
  EXPECT_KEEL_OK(keel_environment_create(o, &env));
  keel_environment_options_release(o);
  return env;
}

// The oneDNN plugin has one instance per environment (ABI 1.5): each environment runs it with the options it was
// given, whatever the environments created after it were given (the options were process-wide before: the last
// environment's applied to every session created after it, in every environment).
TEST(Embedding, EachEnvironmentRunsTheOneDnnPluginWithItsOwnOptions) {
  if (under_valgrind()) GTEST_SKIP() << "the oneDNN plugin is not loaded under valgrind";
  if (!fs::exists(fs::path(plugin_dir()) / "libkeel_cpu_onednn.so")) GTEST_SKIP() << "no oneDNN plugin in this build";
  std::string bytes = conv_silu_bytes();
  keel_model_t model = nullptr;
  ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model));
  keel_environment_t a = onednn_env({});                        // the defaults
  keel_environment_t b = onednn_env({{"claims", "false"}});     // node kernels only
  keel_environment_t c = onednn_env({{"silu_pass", "false"}});  // SiLU as oneDNN's post-op
  ASSERT_TRUE(a && b && c);
  keel_plugin_info_t info{};
  for (keel_environment_t env : {a, b, c}) {
    ASSERT_NE(find_plugin(env, "cpu_onednn", &info), nullptr);
    ASSERT_EQ(info.state, KEEL_PLUGIN_STATE_LOADED) << info.reason;
  }
  const ProfiledRun ra = profiled_run(a, model), rb = profiled_run(b, model), rc = profiled_run(c, model);
  EXPECT_TRUE(ra.chained);
  EXPECT_FALSE(rb.chained);
  EXPECT_TRUE(rc.chained);
  // With AVX-512 the chain runs a trailing SiLU as its own step after the convolution (steps/silu.h) unless
  // silu_pass is off; without AVX-512 it always uses the post-op.
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(ra.chain_steps, rc.chain_steps + 1) << "silu_pass of another environment applied to this one";
  } else {
    EXPECT_EQ(ra.chain_steps, rc.chain_steps);
  }
  expect_near(ra.z, rb.z);
  expect_near(ra.z, rc.z);
  // Released in another order than created; the remaining environment keeps its options.
  keel_environment_release(b);
  keel_environment_release(a);
  const ProfiledRun rc2 = profiled_run(c, model);
  EXPECT_TRUE(rc2.chained);
  EXPECT_EQ(rc2.chain_steps, rc.chain_steps);
  expect_near(rc2.z, rc.z);
  keel_environment_release(c);
  keel_model_release(model);
}

// Environments created, run and released on several threads at once, each with its own oneDNN options: every
// plugin's init_instance / shutdown_instance run concurrently with other environments' sessions; every run gives the
// reference output, and each environment keeps its own options throughout.
TEST(Embedding, EnvironmentsWithTheirOwnOptionsOnSeveralThreadsAtOnce) {
  if (under_valgrind()) GTEST_SKIP() << "the oneDNN plugin is not loaded under valgrind";
  if (!fs::exists(fs::path(plugin_dir()) / "libkeel_cpu_onednn.so")) GTEST_SKIP() << "no oneDNN plugin in this build";
  std::string bytes = conv_silu_bytes();
  keel_model_t model = nullptr;
  ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model));
  const std::vector<std::vector<std::pair<std::string, std::string>>> options = {
      {}, {{"claims", "false"}}, {{"silu_pass", "false"}}};
  std::vector<ProfiledRun> reference;
  for (const auto& o : options) {
    keel_environment_t env = onednn_env(o);
    ASSERT_NE(env, nullptr);
    reference.push_back(profiled_run(env, model));
    keel_environment_release(env);
  }
  std::vector<std::string> failures(options.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < options.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 4 && failures[t].empty(); ++k) {
        keel_environment_t env = onednn_env(options[t]);
        if (env == nullptr) {
          failures[t] = "no environment";
          break;
        }
        const ProfiledRun r = profiled_run(env, model);
        keel_environment_release(env);
        if (r.chained != reference[t].chained || r.chain_steps != reference[t].chain_steps)
          failures[t] = "round " + std::to_string(k) + ": chained " + std::to_string(r.chained) + ", steps " +
                        std::to_string(r.chain_steps) + " (alone: " + std::to_string(reference[t].chained) + ", " +
                        std::to_string(reference[t].chain_steps) + ")";
        else if (r.z != reference[t].z)
          failures[t] = "round " + std::to_string(k) + ": the output differs from the same options' run alone";
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < options.size(); ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  keel_model_release(model);
}

// ------------------------------------------------------------------------------------------------------------------

TEST(Embedding, LogCallbackGetsOnlyItsEnvironmentsMessagesAndNoLoggerSeesThem) {
  auto host_sink = std::make_shared<HostSink>();
  auto logger = spdlog::default_logger();
  logger->sinks().push_back(host_sink);
  auto level = logger->level();
  logger->set_level(spdlog::level::trace);
  {
    LogSink log_a, log_b;
    keel_environment_t a = make_env(&log_a);
    keel_environment_t b = make_env(&log_b);
    std::string bytes = model_bytes();
    keel_model_t model = nullptr;
    ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model));
    run_once(a, model);
    spdlog::info("a message of the host's own");
    keel_environment_release(a);
    keel_environment_release(b);
    keel_model_release(model);
    // Each callback heard its own environment: plugin messages (the instance), and the session's pass report.
    auto ca = log_a.instances("created"), cb = log_b.instances("created");
    ASSERT_EQ(ca.size(), 1u);
    ASSERT_EQ(cb.size(), 1u);
    EXPECT_TRUE(log_a.contains("pass ")) << "the session's pass report";
    EXPECT_FALSE(log_b.contains("pass run")) << "b ran nothing";
    EXPECT_TRUE(log_b.instances("pass run").empty());
    EXPECT_FALSE(log_a.contains("a message of the host's own"));
    EXPECT_FALSE(log_b.contains("a message of the host's own"));
  }
  // The host's logger saw its own message and none of Keel's.
  logger->set_level(level);
  auto& sinks = logger->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), std::static_pointer_cast<spdlog::sinks::sink>(host_sink)),
              sinks.end());
  ASSERT_EQ(host_sink->lines.size(), 1u) << (host_sink->lines.empty() ? "" : host_sink->lines.back());
  EXPECT_EQ(host_sink->lines[0], "a message of the host's own");
}

// ------------------------------------------------------------------------------------------------------------------

TEST(Embedding, PluginOptionsFromTheHostOverTheManifest) {
  {
    LogSink log;
    keel_environment_t env = make_env(&log);  // the manifest's options
    EXPECT_TRUE(log.contains("threads=2 greeting=manifest"));
    keel_environment_release(env);
  }
  {
    LogSink log;
    keel_environment_t env = make_env(&log, {{"threads", "7"}, {"greeting", "host"}});
    EXPECT_TRUE(log.contains("threads=7 greeting=host"));
    keel_environment_release(env);
  }
  {
    LogSink log;
    keel_environment_t env = make_env(&log, {{"threads", "seven"}});
    keel_plugin_info_t info{};
    ASSERT_NE(find_plugin(env, "embedding_instance", &info), nullptr);
    EXPECT_EQ(info.state, KEEL_PLUGIN_STATE_FAILED);
    EXPECT_NE(std::string(info.reason).find("option 'threads'"), std::string::npos) << info.reason;
    EXPECT_NE(std::string(info.reason).find("not an integer"), std::string::npos) << info.reason;
    keel_environment_release(env);
  }
  {
    // Options for a plugin that is not there: a warning, not an error.
    keel_environment_options_t o = nullptr;
    ASSERT_KEEL_OK(keel_environment_options_create(&o));
    ASSERT_KEEL_OK(keel_environment_options_set_discover_plugins(o, 0));
    ASSERT_KEEL_OK(keel_environment_options_set_plugin_option(o, "no_such_plugin", "k", "v"));
    LogSink log;
    ASSERT_KEEL_OK(keel_environment_options_set_log_callback(o, LogSink::callback, &log, KEEL_LOG_WARN));
    keel_environment_t env = nullptr;
    ASSERT_KEEL_OK(keel_environment_create(o, &env));
    EXPECT_TRUE(log.contains("no_such_plugin"));
    keel_environment_release(env);
    EXPECT_NE(take(keel_environment_options_set_plugin_option(o, "", "k", "v")), "");
    EXPECT_NE(take(keel_environment_options_set_plugin_option(o, "p", nullptr, "v")), "");
    keel_environment_options_release(o);
  }
}

TEST(Embedding, PluginLibrariesLoadedByPath) {
  keel_environment_options_t o = nullptr;
  ASSERT_KEEL_OK(keel_environment_options_create(&o));
  ASSERT_KEEL_OK(keel_environment_options_set_discover_plugins(o, 0));
  // No manifest beside it: a minimal one from the descriptor.
  std::string bare = std::string(KEEL_EMBEDDING_BARE_DIR) + "/libkeel_embedding_bare.so";
  ASSERT_KEEL_OK(keel_environment_options_add_plugin_library(o, bare.c_str()));
  // With its manifest beside it: the manifest is used (name, [options]).
  std::string legacy = fixture_dir() + "/libkeel_embedding_legacy.so";
  ASSERT_KEEL_OK(keel_environment_options_add_plugin_library(o, legacy.c_str()));
  ASSERT_KEEL_OK(keel_environment_options_add_plugin_library(o, "/nonexistent/libnothing.so"));
  ASSERT_KEEL_OK(keel_environment_options_set_plugin_option(o, "embedding_instance", "greeting", "bare"));
  LogSink log;
  ASSERT_KEEL_OK(keel_environment_options_set_log_callback(o, LogSink::callback, &log, KEEL_LOG_INFO));
  keel_environment_t env = nullptr;
  ASSERT_KEEL_OK(keel_environment_create(o, &env));
  keel_environment_options_release(o);

  keel_plugin_info_t info{};
  ASSERT_NE(find_plugin(env, "embedding_instance", &info), nullptr);
  EXPECT_EQ(info.state, KEEL_PLUGIN_STATE_LOADED) << info.reason;
  EXPECT_STREQ(info.manifest, "");
  EXPECT_EQ(fs::path(info.library).filename(), "libkeel_embedding_bare.so");
  EXPECT_STREQ(info.kind, "pass");
  EXPECT_TRUE(log.contains("threads=-1 greeting=bare")) << "no manifest options; the host's";
  ASSERT_NE(find_plugin(env, "embedding_legacy", &info), nullptr);
  EXPECT_EQ(info.state, KEEL_PLUGIN_STATE_LOADED) << info.reason;
  EXPECT_EQ(fs::path(info.manifest).filename(), "embedding_legacy.keel-plugin.toml");
  ASSERT_NE(find_plugin(env, "libnothing", &info), nullptr);
  EXPECT_EQ(info.state, KEEL_PLUGIN_STATE_FAILED);
  EXPECT_NE(std::string(info.reason).find("library not found"), std::string::npos) << info.reason;
  keel_environment_release(env);
}

TEST(Embedding, DevicesWithPropertiesAndCapabilities) {
  keel_environment_t env = nullptr;
  ASSERT_KEEL_OK(keel_environment_create(nullptr, &env));
  size_t n = 0;
  ASSERT_KEEL_OK(keel_environment_device_count(env, &n));
  ASSERT_GE(n, 1u);
  bool cpu = false;
  for (size_t i = 0; i < n; ++i) {
    keel_device_info_t d{};
    d.struct_size = sizeof d;
    ASSERT_KEEL_OK(keel_environment_device_info(env, i, &d));
    if (std::string(d.device_type) == "cpu") {
      cpu = true;
      EXPECT_EQ(d.device_index, 0);
      EXPECT_NE(d.capabilities & KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY, 0u);
    }
  }
  EXPECT_TRUE(cpu);
  // An application built against the older struct (ending at `capabilities`) gets nothing written past it.
  struct {
    keel_device_info_t info;
  } old{};
  std::memset(&old, 0x5a, sizeof old);
  old.info.struct_size = static_cast<uint32_t>(offsetof(keel_device_info_t, free_memory));
  ASSERT_KEEL_OK(keel_environment_device_info(env, 0, &old.info));
  EXPECT_EQ(old.info.compute_major, 0x5a5a5a5a);
  EXPECT_EQ(old.info.multiprocessors, 0x5a5a5a5a);
  EXPECT_NE(take(keel_environment_device_info(env, n, &old.info)).find("OUT_OF_RANGE"), std::string::npos);
  keel_environment_release(env);

  keel::api::Environment cpp;
  auto devices = cpp.devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0].spec(), devices[0].device_type + ":0");
  bool unified = false;
  for (const auto& d : devices)
    unified = unified || (d.device_type == "cpu" && d.has(KEEL_DEVICE_CAP_UNIFIED_HOST_MEMORY));
  EXPECT_TRUE(unified);
  // A session on a device chosen by index, from the list.
  std::string bytes = model_bytes();
  auto model = keel::api::Model::from_memory(bytes.data(), bytes.size());
  keel::api::SessionOptions so;
  so.add_device("cpu", 0);
  keel::api::Session s(cpp, model, so);
  auto x = keel::api::Tensor::f32({1, 3, 6, 6}, input_values());
  EXPECT_EQ(s.run({{"x", &x}})[0].element_count(), 4 * 6 * 6);
  keel::api::SessionOptions bad;
  bad.add_device("cpu", 5);
  try {
    keel::api::Session s2(cpp, model, bad);
    ADD_FAILURE() << "cpu:5 accepted";
  } catch (const keel::api::Error& e) {
    EXPECT_EQ(e.code(), KEEL_STATUS_OUT_OF_RANGE) << e.what();
  }
}

// ------------------------------------------------------------------------------------------------------------------

TEST(Embedding, ModelMetadataInCAndCpp) {
  std::string bytes = model_bytes();
  keel_model_t model = nullptr;
  ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model));
  keel_model_metadata_t m{};
  m.struct_size = sizeof m;
  ASSERT_KEEL_OK(keel_model_metadata(model, &m));
  EXPECT_STREQ(m.producer_name, "pytorch");
  EXPECT_STREQ(m.producer_version, "2.1.0");
  EXPECT_STREQ(m.domain, "org.example");
  EXPECT_STREQ(m.description, "a small test model");
  EXPECT_STREQ(m.graph_name, "conv_bn_relu");
  EXPECT_EQ(m.model_version, 42);
  ASSERT_EQ(m.custom_count, 2u);
  const char* k = nullptr;
  const char* v = nullptr;
  ASSERT_KEEL_OK(keel_model_custom_metadata(model, 0, &k, &v));
  EXPECT_STREQ(k, "author");  // sorted by key
  EXPECT_STREQ(v, "keel tests");
  EXPECT_NE(take(keel_model_custom_metadata(model, 2, &k, &v)).find("OUT_OF_RANGE"), std::string::npos);
  ASSERT_KEEL_OK(keel_model_custom_metadata_lookup(model, "license", &v));
  EXPECT_STREQ(v, "MIT");
  EXPECT_NE(take(keel_model_custom_metadata_lookup(model, "nope", &v)).find("NOT_FOUND"), std::string::npos);
  EXPECT_EQ(v, nullptr);

  keel_environment_t env = nullptr;
  ASSERT_KEEL_OK(keel_environment_create(nullptr, &env));
  keel_session_t s = nullptr;
  ASSERT_KEEL_OK(keel_session_create(env, model, nullptr, &s));
  keel_model_release(model);  // the session keeps its own copy
  keel_model_metadata_t sm{};
  sm.struct_size = sizeof sm;
  ASSERT_KEEL_OK(keel_session_model_metadata(s, &sm));
  EXPECT_STREQ(sm.producer_name, "pytorch");
  EXPECT_EQ(sm.custom_count, 2u);
  ASSERT_KEEL_OK(keel_session_custom_metadata(s, 1, &k, &v));
  EXPECT_STREQ(k, "license");
  keel_session_release(s);
  keel_environment_release(env);

  auto cm = keel::api::Model::from_memory(bytes.data(), bytes.size()).metadata();
  EXPECT_EQ(cm.producer_name, "pytorch");
  EXPECT_EQ(cm.model_version, 42);
  EXPECT_EQ(cm.custom.at("license"), "MIT");
  // A model without metadata: empty strings, no properties.
  std::string plain = model_bytes(false);
  auto pm = keel::api::Model::from_memory(plain.data(), plain.size()).metadata();
  EXPECT_EQ(pm.producer_name, "");
  EXPECT_TRUE(pm.custom.empty());
}

// ------------------------------------------------------------------------------------------------------------------

size_t placement_count(const keel::api::Session& s) { return s.placement().size(); }

TEST(Embedding, AutoPipelineByDefaultNoneOnRequestAndTheOptimisedGraphSaved) {
  keel::api::EnvironmentOptions eo;
  eo.plugin_paths = {plugin_dir()};
  keel::api::Environment env(eo);
  bool have_passes = false;
  for (const auto& p : env.plugins())
    have_passes = have_passes || (p.name == "fusion" && p.state == KEEL_PLUGIN_STATE_LOADED);
  std::string bytes = model_bytes();
  auto model = keel::api::Model::from_memory(bytes.data(), bytes.size());
  auto x = keel::api::Tensor::f32({1, 3, 6, 6}, input_values());

  keel::api::SessionOptions none;
  none.pipeline = "none";
  keel::api::Session plain(env, model, none);
  keel::api::Session optimised(env, model);  // the default: "auto"
  auto y_plain = plain.run({{"x", &x}})[0].to_vector<float>();
  auto y_opt = optimised.run({{"x", &x}})[0].to_vector<float>();
  expect_near(y_plain, y_opt);

  // Saved, loaded back, run with no passes: the same graph, the same outputs.
  fs::path dir = fs::temp_directory_path() / ("keel_embedding_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path file = dir / "optimised.onnx";
  optimised.save_optimized_model(file.string());
  ASSERT_TRUE(fs::exists(file));
  plain.save_optimized_model((dir / "plain.onnx").string());
  auto saved_opt = keel::load_onnx(file);
  auto saved_plain = keel::load_onnx(dir / "plain.onnx");
  ASSERT_TRUE(saved_opt.is_ok() && saved_plain.is_ok());
  EXPECT_EQ(saved_plain.value().node_count(), 3u);
  if (have_passes) {
    EXPECT_LT(saved_opt.value().node_count(), 3u) << "the default pipeline folds BatchNormalization into the Conv";
  }
  auto reloaded = keel::api::Model::from_file(file.string());
  keel::api::Session again(env, reloaded, none);
  expect_near(again.run({{"x", &x}})[0].to_vector<float>(), y_plain);
  EXPECT_EQ(placement_count(again), placement_count(optimised));
  // Errors name the path.
  keel_status_t st = keel_session_save_optimized_model(optimised.get(), (dir / "no" / "such" / "dir.onnx").c_str());
  std::string msg = take(st);
  EXPECT_NE(msg, "");
  EXPECT_NE(msg.find("dir.onnx"), std::string::npos) << msg;
  EXPECT_NE(take(keel_session_save_optimized_model(optimised.get(), nullptr)).find("INVALID_ARGUMENT"),
            std::string::npos);
  fs::remove_all(dir);

  keel_session_options_t so = nullptr;
  ASSERT_KEEL_OK(keel_session_options_create(&so));
  EXPECT_NE(take(keel_session_options_set_pipeline(so, "fast")).find("INVALID_ARGUMENT"), std::string::npos);
  EXPECT_KEEL_OK(keel_session_options_set_pipeline(so, "none"));
  EXPECT_KEEL_OK(keel_session_options_set_pipeline(so, "auto"));
  keel_session_options_release(so);
}

// ------------------------------------------------------------------------------------------------------------------

keel_status_t noop_compute(void*, keel_kernel_context_t*) { return nullptr; }

keel_kernel_def_t relu_def(uint16_t minor, const void* constraints, size_t count) {
  keel_kernel_def_t d{};
  d.struct_size = sizeof d;
  d.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  d.abi_minor = minor;
  d.name = "test_relu";
  d.op_type = "Relu";
  d.since_version = 6;
  d.device_type = "cpu";
  d.constraints = static_cast<const keel_type_constraint_t*>(constraints);
  d.constraint_count = count;
  d.compute = noop_compute;
  return d;
}

TEST(Embedding, TypeConstraintHeaderOldAndNewLayouts) {
  const int32_t f32_i8[] = {KEEL_DTYPE_F32, KEEL_DTYPE_I8};
  const int32_t f16[] = {KEEL_DTYPE_F16};
  // Built against ABI 1.4: no header.
  const keel_type_constraint_v0_t old_layout[] = {{"T", f32_i8, 2}, {"T1", f16, 1}};
  // Built against 1.5.
  const keel_type_constraint_t new_layout[] = {{KEEL_TYPE_CONSTRAINT_HEADER, "T", f32_i8, 2},
                                               {KEEL_TYPE_CONSTRAINT_HEADER, "T1", f16, 1}};
  // Built against a newer minor: larger elements.
  struct Bigger {
    keel_type_constraint_t c;
    void* future;
  };
  const Bigger bigger[] = {{{(uint32_t)sizeof(Bigger), KEEL_PLUGIN_ABI_MAJOR, 9, "T", f32_i8, 2}, nullptr},
                           {{(uint32_t)sizeof(Bigger), KEEL_PLUGIN_ABI_MAJOR, 9, "T1", f16, 1}, nullptr}};
  struct Case {
    uint16_t minor;
    const void* data;
  };
  for (const Case& c : {Case{4, old_layout}, Case{5, new_layout}, Case{9, bigger}}) {
    keel::Registry reg;
    keel_kernel_def_t d = relu_def(c.minor, c.data, 2);
    keel::Status st = reg.add_kernel(0, 0, &d);
    ASSERT_TRUE(st.is_ok()) << "minor " << c.minor << ": " << st.to_string();
    auto ks = reg.kernels_for("", "Relu", 17, "cpu");
    ASSERT_EQ(ks.size(), 1u);
    const auto* t = ks[0]->allowed("T");
    const auto* t1 = ks[0]->allowed("T1");
    ASSERT_TRUE(t && t1) << "minor " << c.minor;
    EXPECT_EQ(*t, (std::vector<DType>{DType::kF32, DType::kI8}));
    EXPECT_EQ(*t1, std::vector<DType>{DType::kF16});
  }
  // A 1.5 definition whose constraints lack the header (e.g. {"T", dtypes, n} compiled into the old fields) is
  // refused with a message, not misread.
  keel_type_constraint_t no_header{};
  no_header.name = "T";
  no_header.dtypes = f32_i8;
  no_header.dtype_count = 2;
  keel::Registry reg;
  keel_kernel_def_t d = relu_def(5, &no_header, 1);
  keel::Status st = reg.add_kernel(0, 0, &d);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("KEEL_TYPE_CONSTRAINT_HEADER"), std::string::npos) << st.to_string();
  keel_kernel_def_t null_constraints = relu_def(5, nullptr, 1);
  EXPECT_FALSE(reg.add_kernel(0, 0, &null_constraints).is_ok());
}

// KEEL_KERNEL_FLAG_SECONDARY: a kernel ranks one below its plugin's priority, so the plugin's other kernel for the op
// comes first, a lower plugin's kernel still after it; without the flag both rank as their plugins.
TEST(Embedding, SecondaryKernelRanksBelowItsPluginsOthers) {
  keel::Registry reg;
  keel_kernel_def_t main_k = relu_def(5, nullptr, 0), secondary = relu_def(5, nullptr, 0),
                    lower = relu_def(5, nullptr, 0);
  secondary.name = "test_relu_secondary";
  secondary.flags = KEEL_KERNEL_FLAG_SECONDARY;
  lower.name = "test_relu_lower_plugin";
  ASSERT_TRUE(reg.add_kernel(1, 50, &secondary).is_ok());  // registered first: order alone would rank it first
  ASSERT_TRUE(reg.add_kernel(1, 50, &main_k).is_ok());
  ASSERT_TRUE(reg.add_kernel(2, 10, &lower).is_ok());
  keel::Node node;
  node.op_type = "Relu";
  std::vector<std::string> names;
  std::vector<int32_t> priorities;
  for (const keel::KernelEntry* k : keel::dispatch::ranked_kernels(reg, node, 17, "cpu")) {
    names.push_back(k->name);
    priorities.push_back(k->priority);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"test_relu", "test_relu_secondary", "test_relu_lower_plugin"}));
  EXPECT_EQ(priorities, (std::vector<int32_t>{50, 49, 10}));
}

}  // namespace
