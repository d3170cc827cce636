// The host C API (keel.h), called from C++ as a host application would: models built with GraphBuilder and
// serialised to ONNX bytes, loaded through keel_model_load_from_memory; errors, wrap vs copy, concurrency.
// Run under valgrind (ctest -R c_api_valgrind) or a KEEL_SANITIZE build for leaks.
#include <keel/keel.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

namespace {

using keel::Attribute;
using keel::DType;
using keel::GraphBuilder;

// y = Relu(x) + b,  z = MatMul(x, w);  x: f32[N, 3] with a dynamic batch.
std::string relu_add_model() {
  GraphBuilder g("relu_add", 17);
  auto x = g.input("x", DType::kF32, {-1, 3});
  auto b = g.constant("b", keel::Tensor::f32({3}, {1.f, 2.f, 3.f}));
  auto w = g.constant("w", keel::Tensor::f32({3, 2}, {1.f, 0.f, 0.f, 1.f, 1.f, 1.f}));
  auto r = g.op1("Relu", {x});
  auto y = g.op("Add", {r, b}, {}, 1)[0];
  auto z = g.op1("MatMul", {x, w});
  g.graph().node(g.graph().producer(y).value())->outputs[0] = "y";
  g.graph().node(g.graph().producer(z).value())->outputs[0] = "z";
  g.output("y");
  g.output("z");
  auto bytes = keel::serialize_onnx(g.take());
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? bytes.value() : std::string();
}

// Takes a status: returns "" for OK, "CODE: message" otherwise (and releases it).
std::string take(keel_status_t s) {
  if (s == nullptr) return "";
  std::string out = std::string(keel_status_code_name(s->code)) + ": " + (s->message ? s->message : "");
  keel_status_release(s);
  return out;
}

#define ASSERT_KEEL_OK(expr) ASSERT_EQ(take(expr), "")
#define EXPECT_KEEL_OK(expr) EXPECT_EQ(take(expr), "")

// An environment with only the built-in reference CPU device, and a session of relu_add_model on it.
class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    keel_environment_options_t o = nullptr;
    ASSERT_KEEL_OK(keel_environment_options_create(&o));
    ASSERT_KEEL_OK(keel_environment_options_set_discover_plugins(o, 0));
    ASSERT_KEEL_OK(keel_environment_options_set_threads(o, 2));
    ASSERT_KEEL_OK(keel_environment_create(o, &env_));
    keel_environment_options_release(o);
    std::string bytes = relu_add_model();
    ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model_));
    ASSERT_KEEL_OK(keel_session_create(env_, model_, nullptr, &session_));
  }
  void TearDown() override {
    keel_session_release(session_);
    keel_model_release(model_);
    keel_environment_release(env_);
  }

  keel_host_tensor_t f32(std::vector<int64_t> dims, const std::vector<float>& v) {
    keel_host_tensor_t t = nullptr;
    EXPECT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_F32, dims.data(), static_cast<int32_t>(dims.size()), v.data(),
                                           v.size() * sizeof(float), &t));
    return t;
  }
  static std::vector<float> values(keel_host_tensor_t t) {
    const float* p = static_cast<const float*>(keel_host_tensor_data(t));
    return std::vector<float>(p, p + keel_host_tensor_element_count(t));
  }

  keel_environment_t env_ = nullptr;
  keel_model_t model_ = nullptr;
  keel_session_t session_ = nullptr;
};

TEST(CApiVersion, MatchesHeaderAndProject) {
  EXPECT_STREQ(keel_version_string(), KEEL_VERSION_STRING);
  EXPECT_STREQ(keel_version_string(), KEEL_VERSION);  // the project's version (CMake)
  int32_t major = -1, minor = -1, patch = -1;
  keel_version_get(&major, &minor, &patch);
  EXPECT_EQ(major, KEEL_VERSION_MAJOR);
  EXPECT_EQ(minor, KEEL_VERSION_MINOR);
  EXPECT_EQ(patch, KEEL_VERSION_PATCH);
  keel_version_get(nullptr, nullptr, nullptr);
  keel_plugin_abi_version_get(&major, &minor);
  EXPECT_EQ(major, KEEL_PLUGIN_ABI_MAJOR);
  EXPECT_EQ(minor, KEEL_PLUGIN_ABI_MINOR);
  EXPECT_STREQ(keel_status_code_name(KEEL_STATUS_NOT_FOUND), "NOT_FOUND");
  EXPECT_STREQ(keel_status_code_name(999), "UNKNOWN");
  EXPECT_STREQ(keel_dtype_name(KEEL_DTYPE_F32), "f32");
  EXPECT_EQ(keel_dtype_size(KEEL_DTYPE_I64), 8u);
  EXPECT_EQ(keel_dtype_size(12345), 0u);
}

TEST_F(CApi, InspectsInputsAndOutputs) {
  size_t n = 0;
  ASSERT_KEEL_OK(keel_session_input_count(session_, &n));
  ASSERT_EQ(n, 1u);
  keel_value_info_t v{};
  v.struct_size = sizeof v;
  ASSERT_KEEL_OK(keel_session_input_info(session_, 0, &v));
  EXPECT_STREQ(v.name, "x");
  EXPECT_EQ(v.dtype, KEEL_DTYPE_F32);
  ASSERT_EQ(v.ndim, 2);
  EXPECT_EQ(v.dims[0], -1);
  EXPECT_EQ(v.dims[1], 3);
  ASSERT_KEEL_OK(keel_session_output_count(session_, &n));
  ASSERT_EQ(n, 2u);
  ASSERT_KEEL_OK(keel_session_output_info(session_, 1, &v));
  EXPECT_STREQ(v.name, "z");
  EXPECT_EQ(v.dtype, KEEL_DTYPE_F32);
  EXPECT_EQ(take(keel_session_output_info(session_, 2, &v)).rfind("OUT_OF_RANGE", 0), 0u);

  // An older caller's smaller struct: only the members it covers are written.
  struct {
    keel_value_info_t v;
    uint64_t guard;
  } small{};
  small.v.struct_size = offsetof(keel_value_info_t, dtype) + sizeof(int32_t);
  small.v.ndim = 77;
  ASSERT_KEEL_OK(keel_session_input_info(session_, 0, &small.v));
  EXPECT_STREQ(small.v.name, "x");
  EXPECT_EQ(small.v.ndim, 77);
  // struct_size unset: a clear error, not a silent no-op.
  keel_value_info_t unset{};
  EXPECT_NE(take(keel_session_input_info(session_, 0, &unset)).find("struct_size"), std::string::npos);
}

TEST_F(CApi, RunsWithCopiedInputs) {
  keel_host_tensor_t x = f32({2, 3}, {-1, 2, -3, 4, -5, 6});
  const char* in_names[] = {"x"};
  keel_host_tensor_t outs[2] = {nullptr, nullptr};
  ASSERT_KEEL_OK(keel_session_run(session_, in_names, &x, 1, nullptr, outs, 2));
  EXPECT_EQ(values(outs[0]), (std::vector<float>{1, 4, 3, 5, 2, 9}));
  EXPECT_EQ(values(outs[1]), (std::vector<float>{-4, -1, 10, 1}));
  EXPECT_EQ(keel_host_tensor_dtype(outs[1]), KEEL_DTYPE_F32);
  ASSERT_EQ(keel_host_tensor_ndim(outs[1]), 2);
  EXPECT_EQ(keel_host_tensor_dims(outs[1])[0], 2);
  EXPECT_EQ(keel_host_tensor_dims(outs[1])[1], 2);
  EXPECT_EQ(keel_host_tensor_byte_size(outs[1]), 16u);
  for (auto* o : outs) keel_host_tensor_release(o);

  // Outputs by name, in the caller's order, a subset.
  const char* out_names[] = {"z"};
  keel_host_tensor_t z = nullptr;
  ASSERT_KEEL_OK(keel_session_run(session_, in_names, &x, 1, out_names, &z, 1));
  EXPECT_EQ(values(z), (std::vector<float>{-4, -1, 10, 1}));
  keel_host_tensor_release(z);
  keel_host_tensor_release(x);
}

TEST_F(CApi, CreateCopiesWrapDoesNot) {
  std::vector<float> buf = {1, 1, 1};
  int64_t dims[] = {1, 3};
  keel_host_tensor_t copied = nullptr, wrapped = nullptr;
  ASSERT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_F32, dims, 2, buf.data(), 12, &copied));
  ASSERT_KEEL_OK(keel_host_tensor_wrap(KEEL_DTYPE_F32, dims, 2, buf.data(), 12, &wrapped));
  EXPECT_NE(keel_host_tensor_data(copied), buf.data());
  EXPECT_EQ(keel_host_tensor_data(wrapped), buf.data());
  buf = {5, 5, 5};  // same storage (3 floats), new values
  const char* name = "x";
  const char* y_name = "y";
  keel_host_tensor_t y = nullptr;
  ASSERT_KEEL_OK(keel_session_run(session_, &name, &copied, 1, &y_name, &y, 1));
  EXPECT_EQ(values(y), (std::vector<float>{2, 3, 4}));  // the copy kept 1s
  keel_host_tensor_release(y);
  ASSERT_KEEL_OK(keel_session_run(session_, &name, &wrapped, 1, &y_name, &y, 1));
  EXPECT_EQ(values(y), (std::vector<float>{6, 7, 8}));  // the wrap reads the caller's 5s
  keel_host_tensor_release(y);
  keel_host_tensor_release(wrapped);
  EXPECT_EQ(buf[0], 5.f);  // releasing a wrap leaves the caller's memory alone
  keel_host_tensor_release(copied);

  // Zero-filled creation.
  keel_host_tensor_t zeros = nullptr;
  ASSERT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_I64, dims, 2, nullptr, 0, &zeros));
  const int64_t* z = static_cast<const int64_t*>(keel_host_tensor_data(zeros));
  EXPECT_EQ(z[0] + z[1] + z[2], 0);
  keel_host_tensor_release(zeros);
  // A scalar.
  float one = 1;
  keel_host_tensor_t scalar = nullptr;
  ASSERT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_F32, nullptr, 0, &one, 4, &scalar));
  EXPECT_EQ(keel_host_tensor_ndim(scalar), 0);
  EXPECT_EQ(keel_host_tensor_dims(scalar), nullptr);
  EXPECT_EQ(keel_host_tensor_element_count(scalar), 1);
  keel_host_tensor_release(scalar);
}

TEST_F(CApi, OutputThatIsAnInputDoesNotKeepWrappedMemory) {
  GraphBuilder g("passthrough", 17);
  auto x = g.input("x", DType::kF32, {2});
  g.output(x);
  auto y = g.op1("Relu", {x});
  g.output(y);
  auto bytes = keel::serialize_onnx(g.take());
  ASSERT_TRUE(bytes.is_ok());
  keel_model_t m = nullptr;
  ASSERT_KEEL_OK(keel_model_load_from_memory(bytes->data(), bytes->size(), &m));
  keel_session_t s = nullptr;
  std::string err = take(keel_session_create(env_, m, nullptr, &s));
  keel_model_release(m);
  if (!err.empty()) GTEST_SKIP() << "a graph output that is a graph input is refused: " << err;
  float buf[2] = {-1, 2};
  int64_t dims[] = {2};
  keel_host_tensor_t in = nullptr;
  ASSERT_KEEL_OK(keel_host_tensor_wrap(KEEL_DTYPE_F32, dims, 1, buf, sizeof buf, &in));
  const char* name = "x";
  keel_host_tensor_t outs[2] = {};
  ASSERT_KEEL_OK(keel_session_run(s, &name, &in, 1, nullptr, outs, 2));
  EXPECT_NE(keel_host_tensor_data(outs[0]), static_cast<void*>(buf));
  buf[0] = 42;
  EXPECT_EQ(values(outs[0]), (std::vector<float>{-1, 2}));
  EXPECT_EQ(values(outs[1]), (std::vector<float>{0, 2}));
  for (auto* o : outs) keel_host_tensor_release(o);
  keel_host_tensor_release(in);
  keel_session_release(s);
}

TEST_F(CApi, BadModelBytesGiveAnErrorWithAMessage) {
  const char junk[] = "this is not an ONNX model";
  keel_model_t m = reinterpret_cast<keel_model_t>(0x1);
  keel_status_t s = keel_model_load_from_memory(junk, sizeof junk, &m);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->code, KEEL_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(s->message), "");
  EXPECT_EQ(m, nullptr);
  keel_status_release(s);
  // Truncated real model.
  std::string bytes = relu_add_model();
  EXPECT_NE(take(keel_model_load_from_memory(bytes.data(), bytes.size() / 2, &m)), "");
  EXPECT_EQ(m, nullptr);
  // Missing file.
  s = keel_model_load_from_file("/nonexistent/model.onnx", &m);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->code, KEEL_STATUS_NOT_FOUND);
  EXPECT_NE(std::string(s->message).find("/nonexistent/model.onnx"), std::string::npos);
  keel_status_release(s);
  EXPECT_NE(take(keel_model_load_from_memory(nullptr, 10, &m)), "");
}

TEST_F(CApi, WrongInputsGiveClearErrors) {
  keel_host_tensor_t x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  keel_host_tensor_t outs[2] = {};
  const char* wrong_name = "nope";
  std::string err = take(keel_session_run(session_, &wrong_name, &x, 1, nullptr, outs, 2));
  EXPECT_NE(err.find("INVALID_ARGUMENT"), std::string::npos) << err;
  EXPECT_NE(err.find("unknown input 'nope'"), std::string::npos) << err;
  EXPECT_NE(err.find("x"), std::string::npos) << err;
  EXPECT_EQ(outs[0], nullptr);

  int32_t ints[6] = {};
  int64_t dims[] = {2, 3};
  keel_host_tensor_t xi = nullptr;
  ASSERT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_I32, dims, 2, ints, sizeof ints, &xi));
  const char* name = "x";
  err = take(keel_session_run(session_, &name, &xi, 1, nullptr, outs, 2));
  EXPECT_NE(err.find("dtype i32"), std::string::npos) << err;
  EXPECT_NE(err.find("expects f32"), std::string::npos) << err;
  keel_host_tensor_release(xi);

  keel_host_tensor_t bad_shape = f32({2, 2}, {1, 2, 3, 4});
  err = take(keel_session_run(session_, &name, &bad_shape, 1, nullptr, outs, 2));
  EXPECT_NE(err.find("shape"), std::string::npos) << err;
  keel_host_tensor_release(bad_shape);

  err = take(keel_session_run(session_, nullptr, nullptr, 0, nullptr, outs, 2));
  EXPECT_NE(err.find("missing input 'x'"), std::string::npos) << err;
  const char* twice[] = {"x", "x"};
  keel_host_tensor_t both[] = {x, x};
  err = take(keel_session_run(session_, twice, both, 2, nullptr, outs, 2));
  EXPECT_NE(err.find("given twice"), std::string::npos) << err;
  const char* bad_out = "w";
  err = take(keel_session_run(session_, &name, &x, 1, &bad_out, outs, 1));
  EXPECT_NE(err.find("unknown output 'w'"), std::string::npos) << err;
  err = take(keel_session_run(session_, &name, &x, 1, nullptr, outs, 1));
  EXPECT_NE(err.find("output_count"), std::string::npos) << err;
  keel_host_tensor_t null_tensor = nullptr;
  err = take(keel_session_run(session_, &name, &null_tensor, 1, nullptr, outs, 2));
  EXPECT_NE(err.find("NULL"), std::string::npos) << err;
  EXPECT_EQ(outs[0], nullptr);
  EXPECT_EQ(outs[1], nullptr);
  keel_host_tensor_release(x);
}

TEST(CApiTensor, BadArgumentsAreRefused) {
  keel_host_tensor_t t = nullptr;
  int64_t dims[] = {2, -1};
  float data[2] = {};
  EXPECT_NE(take(keel_host_tensor_create(KEEL_DTYPE_F32, dims, 2, nullptr, 0, &t)).find("negative"), std::string::npos);
  int64_t ok_dims[] = {2};
  EXPECT_NE(take(keel_host_tensor_create(KEEL_DTYPE_F32, ok_dims, 1, data, 7, &t)).find("byte_size"),
            std::string::npos);
  EXPECT_NE(take(keel_host_tensor_create(12345, ok_dims, 1, data, 8, &t)).find("dtype"), std::string::npos);
  EXPECT_NE(take(keel_host_tensor_create(KEEL_DTYPE_STRING, ok_dims, 1, data, 8, &t)), "");
  EXPECT_NE(take(keel_host_tensor_create(KEEL_DTYPE_F32, nullptr, 1, data, 8, &t)).find("dims"), std::string::npos);
  EXPECT_NE(take(keel_host_tensor_wrap(KEEL_DTYPE_F32, ok_dims, 1, nullptr, 8, &t)).find("data"), std::string::npos);
  EXPECT_NE(
      take(keel_host_tensor_wrap(KEEL_DTYPE_F32, ok_dims, 1, reinterpret_cast<char*>(data) + 1, 8, &t)).find("aligned"),
      std::string::npos);
  int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 40};
  EXPECT_NE(take(keel_host_tensor_create(KEEL_DTYPE_F32, huge, 2, nullptr, 0, &t)), "");
  EXPECT_EQ(t, nullptr);
  EXPECT_NE(take(keel_host_tensor_create(KEEL_DTYPE_F32, ok_dims, 1, data, 8, nullptr)), "");
  // NULL handles: zeros, no crash.
  EXPECT_EQ(keel_host_tensor_dtype(nullptr), KEEL_DTYPE_UNDEFINED);
  EXPECT_EQ(keel_host_tensor_data(nullptr), nullptr);
  EXPECT_EQ(keel_host_tensor_byte_size(nullptr), 0u);
  keel_host_tensor_release(nullptr);
}

TEST(CApiHandles, NullHandlesGiveInvalidArgument) {
  size_t n = 0;
  EXPECT_EQ(take(keel_environment_plugin_count(nullptr, &n)).rfind("INVALID_ARGUMENT", 0), 0u);
  EXPECT_EQ(take(keel_session_input_count(nullptr, &n)).rfind("INVALID_ARGUMENT", 0), 0u);
  keel_session_t s = nullptr;
  EXPECT_EQ(take(keel_session_create(nullptr, nullptr, nullptr, &s)).rfind("INVALID_ARGUMENT", 0), 0u);
  EXPECT_EQ(take(keel_session_run(nullptr, nullptr, nullptr, 0, nullptr, nullptr, 0)).rfind("INVALID_ARGUMENT", 0), 0u);
  EXPECT_NE(take(keel_environment_create(nullptr, nullptr)), "");
  EXPECT_NE(take(keel_session_options_set_fallback(nullptr, 0)), "");
  keel_session_options_t o = nullptr;
  ASSERT_KEEL_OK(keel_session_options_create(&o));
  EXPECT_NE(take(keel_session_options_set_fallback(o, 7)).find("KEEL_FALLBACK"), std::string::npos);
  EXPECT_NE(take(keel_session_options_add_device(o, nullptr)), "");
  keel_session_options_release(o);
  keel_environment_release(nullptr);
  keel_session_release(nullptr);
  keel_model_release(nullptr);
  keel_environment_options_release(nullptr);
  keel_session_options_release(nullptr);
}

TEST_F(CApi, ConcurrentRunsOnOneSession) {
  constexpr int kThreads = 4, kRuns = 50;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRuns; ++i) {
        // Each thread uses its own batch size, so runs also alternate memory plans.
        int64_t batch = 1 + t;
        std::vector<float> v(static_cast<size_t>(batch * 3));
        for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(t * 100 + i) * (k % 2 ? 1.f : -1.f);
        int64_t dims[] = {batch, 3};
        keel_host_tensor_t x = nullptr;
        keel_status_t st = keel_host_tensor_wrap(KEEL_DTYPE_F32, dims, 2, v.data(), v.size() * 4, &x);
        const char* name = "x";
        keel_host_tensor_t outs[2] = {};
        if (st == nullptr) st = keel_session_run(session_, &name, &x, 1, nullptr, outs, 2);
        if (st != nullptr) {
          keel_status_release(st);
          ++failures;
        } else {
          const float* y = static_cast<const float*>(keel_host_tensor_data(outs[0]));
          for (size_t k = 0; k < v.size(); ++k) {
            float want = std::max(v[k], 0.f) + static_cast<float>(k % 3 + 1);
            if (y[k] != want) ++failures;
          }
        }
        for (auto* o : outs) keel_host_tensor_release(o);
        keel_host_tensor_release(x);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(CApi, MemoryStatisticsAndTrim) {
  keel_host_tensor_t x = f32({4, 3}, std::vector<float>(12, 1.f));
  const char* name = "x";
  keel_host_tensor_t outs[2] = {};
  ASSERT_KEEL_OK(keel_session_run(session_, &name, &x, 1, nullptr, outs, 2));
  keel_memory_stats_t s{};
  s.struct_size = sizeof s;
  ASSERT_KEEL_OK(keel_environment_memory_stats(env_, "cpu", 0, &s));
  EXPECT_GT(s.allocations, 0u);
  EXPECT_GT(s.peak_in_use_bytes, 0u);
  EXPECT_GE(s.reserved_bytes, s.in_use_bytes);
  for (auto* o : outs) keel_host_tensor_release(o);
  keel_host_tensor_release(x);
  uint64_t released = 0;
  ASSERT_KEEL_OK(keel_environment_memory_trim(env_, &released));
  ASSERT_KEEL_OK(keel_environment_memory_trim(env_, nullptr));
  EXPECT_EQ(take(keel_environment_memory_stats(env_, "nodev", 0, &s)).rfind("NOT_FOUND", 0), 0u);
  EXPECT_EQ(take(keel_environment_memory_stats(env_, "cpu", 5, &s)).rfind("OUT_OF_RANGE", 0), 0u);
}

TEST_F(CApi, SessionOptions) {
  keel_session_options_t o = nullptr;
  ASSERT_KEEL_OK(keel_session_options_create(&o));
  ASSERT_KEEL_OK(keel_session_options_add_device(o, "nodev"));
  keel_session_t s = nullptr;
  std::string err = take(keel_session_create(env_, model_, o, &s));
  EXPECT_NE(err.find("NOT_FOUND"), std::string::npos) << err;
  EXPECT_NE(err.find("nodev"), std::string::npos) << err;
  EXPECT_EQ(s, nullptr);
  keel_session_options_release(o);

  ASSERT_KEEL_OK(keel_session_options_create(&o));
  ASSERT_KEEL_OK(keel_session_options_add_device(o, "cpu"));
  ASSERT_KEEL_OK(keel_session_options_set_threads(o, 3));  // the environment has 2: the session gets its own pool
  ASSERT_KEEL_OK(keel_session_create(env_, model_, o, &s));
  keel_session_release(s);
  s = nullptr;
  EXPECT_NE(take(keel_session_options_set_threads(o, -1)), "");
  ASSERT_KEEL_OK(keel_session_options_set_threads(o, 2));
  ASSERT_KEEL_OK(keel_session_options_set_profile(o, 1));
  ASSERT_KEEL_OK(keel_session_options_add_pass(o, "no_such_pass"));
  err = take(keel_session_create(env_, model_, o, &s));
  EXPECT_NE(err.find("no_such_pass"), std::string::npos) << err;
  keel_session_options_release(o);

  ASSERT_KEEL_OK(keel_session_options_create(&o));
  ASSERT_KEEL_OK(keel_session_options_set_profile(o, 1));
  ASSERT_KEEL_OK(keel_session_create(env_, model_, o, &s));
  keel_session_options_release(o);
  keel_host_tensor_t x = f32({1, 3}, {1, 2, 3});
  const char* name = "x";
  keel_host_tensor_t outs[2] = {};
  for (int i = 0; i < 3; ++i) {
    ASSERT_KEEL_OK(keel_session_run(s, &name, &x, 1, nullptr, outs, 2));
    for (auto*& t : outs) keel_host_tensor_release(t);
  }
  size_t n = 0;
  ASSERT_KEEL_OK(keel_session_placement_count(s, &n));
  ASSERT_EQ(n, 3u);
  keel_node_placement_t p{};
  p.struct_size = sizeof p;
  keel_node_profile_t prof{};
  prof.struct_size = sizeof prof;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_KEEL_OK(keel_session_placement_info(s, i, &p));
    EXPECT_STREQ(p.device_type, "cpu");
    EXPECT_NE(std::string(p.kernel), "");
    ASSERT_KEEL_OK(keel_session_profile_info(s, i, &prof));
    EXPECT_STREQ(prof.node, p.node);
    EXPECT_EQ(prof.calls, 3);
    // Steps a kernel reported inside its node (ABI 1.3): each one readable, and none past step_count.
    for (size_t k = 0; k < prof.step_count; ++k) {
      keel_profile_step_info_t st{};
      st.struct_size = sizeof st;
      ASSERT_KEEL_OK(keel_session_profile_step_info(s, i, k, &st));
      EXPECT_NE(std::string(st.kind), "");
      EXPECT_GE(st.total_ms, 0);
    }
    keel_profile_step_info_t past{};
    past.struct_size = sizeof past;
    EXPECT_NE(take(keel_session_profile_step_info(s, i, prof.step_count, &past)), "");
  }
  ASSERT_KEEL_OK(keel_session_fallback_count(s, &n));
  EXPECT_EQ(n, 0u);
  keel_host_tensor_release(x);
  keel_session_release(s);
}

// Shape variants (keel_session_options_set_shape_variants): relu_add_model's batch is dynamic, so each batch gets
// a build of its own up to the cap; the placement and the profile are those of the most recent run's build (the
// per-build call counts show which one ran), and outputs are right on every build.
TEST_F(CApi, ShapeVariantsOption) {
  keel_session_options_t o = nullptr;
  ASSERT_KEEL_OK(keel_session_options_create(&o));
  EXPECT_NE(take(keel_session_options_set_shape_variants(o, -1)), "");
  EXPECT_NE(take(keel_session_options_set_shape_variants(nullptr, 2)), "");
  ASSERT_KEEL_OK(keel_session_options_set_shape_variants(o, 1));
  ASSERT_KEEL_OK(keel_session_options_set_profile(o, 1));
  keel_session_t s = nullptr;
  ASSERT_KEEL_OK(keel_session_create(env_, model_, o, &s));
  keel_session_options_release(o);
  const char* name = "x";
  // Runs batch `n` (x = 1..3n), checks y = relu(x) + b, and returns the profile's call count of the first step.
  auto run = [&](int64_t n) -> int64_t {
    std::vector<float> v(static_cast<size_t>(n * 3));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) - 2.f;
    keel_host_tensor_t x = f32({n, 3}, v);
    keel_host_tensor_t outs[2] = {};
    EXPECT_KEEL_OK(keel_session_run(s, &name, &x, 1, nullptr, outs, 2));
    if (outs[0] != nullptr) {
      std::vector<float> y = values(outs[0]);
      EXPECT_EQ(y.size(), v.size());
      for (size_t i = 0; i < y.size() && i < v.size(); ++i)
        EXPECT_FLOAT_EQ(y[i], std::max(v[i], 0.f) + static_cast<float>(i % 3 + 1)) << "batch " << n << " " << i;
    }
    for (auto*& t : outs) keel_host_tensor_release(t);
    keel_host_tensor_release(x);
    size_t count = 0;
    EXPECT_KEEL_OK(keel_session_placement_count(s, &count));
    EXPECT_EQ(count, 3u);
    keel_node_placement_t p{};
    p.struct_size = sizeof p;
    keel_node_profile_t prof{};
    prof.struct_size = sizeof prof;
    for (size_t i = 0; i < count; ++i) {
      EXPECT_KEEL_OK(keel_session_placement_info(s, i, &p));
      EXPECT_KEEL_OK(keel_session_profile_info(s, i, &prof));
      EXPECT_STREQ(prof.node, p.node);
    }
    EXPECT_KEEL_OK(keel_session_profile_info(s, 0, &prof));
    return prof.calls;
  };
  EXPECT_EQ(run(1), 1);  // batch 1: the one variant the cap allows
  EXPECT_EQ(run(1), 2);
  EXPECT_EQ(run(2), 1);  // past the cap: the generic build, which had not run yet
  EXPECT_EQ(run(3), 2);
  EXPECT_EQ(run(1), 3);  // back on the variant
  keel_session_release(s);

  // 0: every run on the generic build.
  ASSERT_KEEL_OK(keel_session_options_create(&o));
  ASSERT_KEEL_OK(keel_session_options_set_shape_variants(o, 0));
  ASSERT_KEEL_OK(keel_session_options_set_profile(o, 1));
  ASSERT_KEEL_OK(keel_session_create(env_, model_, o, &s));
  keel_session_options_release(o);
  EXPECT_EQ(run(1), 1);
  EXPECT_EQ(run(2), 2);
  EXPECT_EQ(run(1), 3);
  keel_session_release(s);
}

struct LogSink {
  std::mutex mu;
  std::vector<std::pair<int32_t, std::string>> lines;
  static void callback(void* ud, int32_t level, const char* msg) {
    auto* self = static_cast<LogSink*>(ud);
    std::lock_guard<std::mutex> lock(self->mu);
    self->lines.emplace_back(level, msg);
  }
  bool saw(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [l, m] : lines)
      if (m.find(what) != std::string::npos) return true;
    return false;
  }
};

// With plugins discovered: the null skeleton device (built beside the tests) is listed; preferring it sends Relu
// there (it has a Relu kernel) and Add/MatMul back to the CPU, with a fallback report and a log line each.
TEST(CApiPlugins, ListsPluginsDevicesAndReportsFallbacks) {
  LogSink log;
  keel_environment_options_t o = nullptr;
  ASSERT_KEEL_OK(keel_environment_options_create(&o));
#ifdef KEEL_NULL_PLUGIN_DIR
  ASSERT_KEEL_OK(keel_environment_options_add_plugin_path(o, KEEL_NULL_PLUGIN_DIR));
#endif
  EXPECT_NE(take(keel_environment_options_set_log_callback(o, LogSink::callback, &log, 9)), "");
  ASSERT_KEEL_OK(keel_environment_options_set_log_callback(o, LogSink::callback, &log, KEEL_LOG_INFO));
  keel_environment_t env = nullptr;
  ASSERT_KEEL_OK(keel_environment_create(o, &env));
  keel_environment_options_release(o);

  size_t n = 0;
  ASSERT_KEEL_OK(keel_environment_plugin_count(env, &n));
  ASSERT_GE(n, 1u);
  keel_plugin_info_t p{};
  p.struct_size = sizeof p;
  bool have_null = false;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_KEEL_OK(keel_environment_plugin_info(env, i, &p));
    if (std::string(p.name) == "null" && p.state == KEEL_PLUGIN_STATE_LOADED) have_null = true;
    if (p.state == KEEL_PLUGIN_STATE_LOADED) {
      EXPECT_STREQ(p.reason, "");
    }
  }
  EXPECT_EQ(take(keel_environment_plugin_info(env, n, &p)).rfind("OUT_OF_RANGE", 0), 0u);
  ASSERT_KEEL_OK(keel_environment_device_count(env, &n));
  keel_device_info_t d{};
  d.struct_size = sizeof d;
  bool have_cpu = false;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_KEEL_OK(keel_environment_device_info(env, i, &d));
    if (std::string(d.device_type) == "cpu") have_cpu = true;
  }
  EXPECT_TRUE(have_cpu);
  if (!have_null) {
    keel_environment_release(env);
    GTEST_SKIP() << "the null plugin is not built beside this test";
  }

  std::string bytes = relu_add_model();
  keel_model_t model = nullptr;
  ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model));
  keel_session_options_t so = nullptr;
  ASSERT_KEEL_OK(keel_session_options_create(&so));
  ASSERT_KEEL_OK(keel_session_options_add_device(so, "null"));
  ASSERT_KEEL_OK(keel_session_options_set_fallback(so, KEEL_FALLBACK_ERROR));
  keel_session_t s = nullptr;
  std::string err = take(keel_session_create(env, model, so, &s));
  EXPECT_NE(err, "");  // Add has no kernel on "null"
  EXPECT_EQ(s, nullptr);
  ASSERT_KEEL_OK(keel_session_options_set_fallback(so, KEEL_FALLBACK_CPU));
  ASSERT_KEEL_OK(keel_session_create(env, model, so, &s));
  keel_session_options_release(so);
  keel_model_release(model);

  ASSERT_KEEL_OK(keel_session_fallback_count(s, &n));
  EXPECT_EQ(n, 2u);
  keel_fallback_info_t f{};
  f.struct_size = sizeof f;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_KEEL_OK(keel_session_fallback_info(s, i, &f));
    EXPECT_STREQ(f.from_device, "null");
    EXPECT_STREQ(f.to_device, "cpu");
    EXPECT_NE(std::string(f.op_type), "Relu");
    EXPECT_NE(std::string(f.reason), "");
  }
  EXPECT_TRUE(log.saw("falls back")) << "the log callback did not hear about the fallback";
  ASSERT_KEEL_OK(keel_session_placement_count(s, &n));
  bool relu_on_null = false;
  keel_node_placement_t pl{};
  pl.struct_size = sizeof pl;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_KEEL_OK(keel_session_placement_info(s, i, &pl));
    if (std::string(pl.op_type) == "Relu") relu_on_null = std::string(pl.device_type) == "null";
  }
  EXPECT_TRUE(relu_on_null);
  // Running fails inside the null device (every entry is UNIMPLEMENTED): an error, not a crash.
  float v[3] = {1, 2, 3};
  int64_t dims[] = {1, 3};
  keel_host_tensor_t x = nullptr;
  ASSERT_KEEL_OK(keel_host_tensor_wrap(KEEL_DTYPE_F32, dims, 2, v, sizeof v, &x));
  const char* name = "x";
  keel_host_tensor_t outs[2] = {};
  err = take(keel_session_run(s, &name, &x, 1, nullptr, outs, 2));
  EXPECT_NE(err, "");
  EXPECT_EQ(outs[0], nullptr);
  keel_host_tensor_release(x);
  keel_session_release(s);
  keel_environment_release(env);
  // After release the callback is gone: logging more must not reach it.
  size_t before = log.lines.size();
  keel_environment_t env2 = nullptr;
  ASSERT_KEEL_OK(keel_environment_create(nullptr, &env2));
  keel_environment_release(env2);
  EXPECT_EQ(log.lines.size(), before);
}

}  // namespace

// For c_api_hpp_test.cc, which sees keel.hpp only.
std::string keel_c_api_test_model() { return relu_add_model(); }
