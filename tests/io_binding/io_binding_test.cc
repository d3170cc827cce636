// I/O binding (keel_io_binding_t, keel::api::IoBinding) and the stream contract (plugin.h), through the host C and
// C++ APIs:
//  - on the CPU: outputs bound to caller memory are written in place (the same pointer, no copy counted), bindings
//    are reused across runs, wrong dtypes / shapes / names fail naming the output, a binding belongs to one run at a
//    time, concurrent runs each with their own binding agree with sequential runs, an output left "on the device"
//    (host memory) feeds the next session without a copy;
//  - on `streamdev` (stream_device.c: an asynchronous device simulated with queues, whose work only happens when a
//    stream is synchronised or waited for): kernels get a non-NULL stream, copies are stream-ordered, the host
//    synchronises only where a result leaves the device (one stream sync per run with host outputs, none for a run
//    that leaves its output on the device, no device sync ever), and a chain of two sessions keeps the tensor on the
//    device (no device-to-host copy) with the consumer waiting for the producer's event. A core breaking the contract
//    reads stale bytes there, so the values checked fail. Eager on streamdev: copies into the device never wait for
//    it; data-parallel training over streamdev's collective backend, which (as NCCL) takes device memory only.
//  - with CUDA: the same chain on cuda:0 when a GPU is present; skipped with a message otherwise.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <keel/keel.h>
#include <keel/keel.hpp>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/dist/process_group.h"
#include "core/runtime/eager.h"
#include "core/runtime/environment.h"
#include "core/runtime/onnx_io.h"
#include "core/train/data_parallel.h"

namespace {

std::string take(keel_status_t s) {
  if (s == nullptr) return "";
  std::string out = std::string(keel_status_code_name(s->code)) + ": " + (s->message ? s->message : "");
  keel_status_release(s);
  return out;
}
#define ASSERT_KEEL_OK(expr) ASSERT_EQ(take(expr), "")
#define EXPECT_KEEL_OK(expr) EXPECT_EQ(take(expr), "")

// y = Relu(x) + x on f32[dims] (a dim of -1: symbolic "N").
// y = Relu(x) + x, or with `weight` y = Relu(x) + w, w = {0.5, 1.5, ...} an initializer of the model (a weight).
std::string model_bytes(const std::vector<int64_t>& dims, bool weight = false) {
  keel::GraphBuilder g(weight ? "relu_add_weight" : "relu_add", 17);
  keel::Shape shape(dims.begin(), dims.end());
  auto x = g.input("x", keel::DType::kF32, shape);
  std::string second = x;
  if (weight) {
    keel::Tensor w = keel::Tensor::host(keel::DType::kF32, shape).value();
    for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = 0.5f + static_cast<float>(i);
    second = g.constant("w", w);
  }
  auto r = g.op1("Relu", {x});
  keel::Node add;
  add.name = "add";
  add.op_type = "Add";
  add.inputs = {r, second};
  add.outputs = {"y"};
  g.graph().add_node(std::move(add));
  g.graph().value_info["y"] = keel::ValueInfo{keel::DType::kF32, shape};
  g.output("y");
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : std::string();
}

std::vector<float> expected(const std::vector<float>& x, int times = 1) {
  std::vector<float> y = x;
  for (int t = 0; t < times; ++t)
    for (auto& v : y) v = (v > 0 ? v : 0) + v;
  return y;
}

struct CEnv {
  keel_environment_t env = nullptr;
  // Without discovery (the reference CPU device only), plus `library` loaded by path; with discovery, the plugins of
  // the build tree.
  explicit CEnv(const char* library = nullptr, bool discover = false) {
    keel_environment_options_t o = nullptr;
    EXPECT_KEEL_OK(keel_environment_options_create(&o));
    EXPECT_KEEL_OK(keel_environment_options_set_discover_plugins(o, discover ? 1 : 0));
    if (discover) {
      EXPECT_KEEL_OK(keel_environment_options_add_plugin_path(o, KEEL_PLUGIN_DIR_DEFAULT));
    }
    if (library) {
      EXPECT_KEEL_OK(keel_environment_options_add_plugin_library(o, library));
    }
    EXPECT_KEEL_OK(keel_environment_create(o, &env));
    keel_environment_options_release(o);
  }
  ~CEnv() { keel_environment_release(env); }
};

keel_session_t make_session(keel_environment_t env, const std::string& bytes, const char* device = nullptr) {
  keel_model_t m = nullptr;
  EXPECT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &m));
  keel_session_options_t o = nullptr;
  EXPECT_KEEL_OK(keel_session_options_create(&o));
  EXPECT_KEEL_OK(keel_session_options_set_pipeline(o, "none"));
  if (device) {
    EXPECT_KEEL_OK(keel_session_options_add_device(o, device));
  }
  keel_session_t s = nullptr;
  EXPECT_KEEL_OK(keel_session_create(env, m, o, &s));
  keel_session_options_release(o);
  keel_model_release(m);
  return s;
}

keel_session_copy_stats_t copies(keel_session_t s) {
  keel_session_copy_stats_t c{};
  c.struct_size = sizeof c;
  EXPECT_KEEL_OK(keel_session_copy_stats(s, &c));
  return c;
}

keel_host_tensor_t wrap(std::vector<float>& v, const std::vector<int64_t>& dims) {
  keel_host_tensor_t t = nullptr;
  EXPECT_KEEL_OK(keel_host_tensor_wrap(KEEL_DTYPE_F32, dims.data(), static_cast<int32_t>(dims.size()), v.data(),
                                       v.size() * sizeof(float), &t));
  return t;
}

TEST(IoBinding, OutputBoundToCallerMemoryIsWrittenInPlaceAcrossRuns) {
  CEnv e;
  keel_session_t s = make_session(e.env, model_bytes({2, 3}));
  ASSERT_NE(s, nullptr);
  std::vector<float> x = {-1, 2, -3, 4, -5, 6};
  std::vector<float> y(6, -99.f);
  keel_host_tensor_t xt = wrap(x, {2, 3});
  keel_host_tensor_t yt = wrap(y, {2, 3});
  keel_io_binding_t b = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(s, &b));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(b, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(b, "y", yt));
  // The binding holds its own references: the handles may go (the memory stays ours).
  keel_host_tensor_release(xt);
  keel_host_tensor_release(yt);
  for (int run = 0; run < 5; ++run) {
    for (auto& v : x) v += 0.5f * static_cast<float>(run);
    ASSERT_KEEL_OK(keel_session_run_with_binding(s, nullptr, b));
    EXPECT_EQ(y, expected(x)) << "run " << run;
    keel_device_tensor_t out = nullptr;
    ASSERT_KEEL_OK(keel_io_binding_output(b, "y", &out));
    EXPECT_EQ(keel_device_tensor_data(out), static_cast<void*>(y.data())) << "the result is the bound memory";
    EXPECT_STREQ(keel_device_tensor_device_type(out), "cpu");
    keel_device_tensor_release(out);
  }
  const auto c = copies(s);
  EXPECT_EQ(c.host_to_host + c.host_to_device + c.device_to_host + c.device_to_device, 0u)
      << "the Add kernel wrote y into the bound memory: no copy (" << c.bytes << " bytes copied)";
  // The plain run API on the same session copies nothing either, and allocates its outputs.
  keel_io_binding_release(b);
  keel_session_release(s);
}

TEST(IoBinding, AnOutputNotProducedInPlaceIsCopiedAndCounted) {
  // y = Identity(x) on the reference kernels: Identity returns its input, so y is copied into the bound memory.
  keel::GraphBuilder g("ident", 17);
  auto x = g.input("x", keel::DType::kF32, {4});
  auto r = g.op1("Identity", {x});
  g.output(r);
  auto bytes = keel::serialize_onnx(g.take());
  ASSERT_TRUE(bytes.is_ok());
  CEnv e;
  keel_session_t s = make_session(e.env, bytes.value());
  std::vector<float> xv = {1, 2, 3, 4}, yv(4, 0.f);
  keel_host_tensor_t xt = wrap(xv, {4}), yt = wrap(yv, {4});
  size_t n = 0;
  ASSERT_KEEL_OK(keel_session_output_count(s, &n));
  keel_value_info_t info{};
  info.struct_size = sizeof info;
  ASSERT_KEEL_OK(keel_session_output_info(s, 0, &info));
  keel_io_binding_t b = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(s, &b));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(b, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(b, info.name, yt));
  ASSERT_KEEL_OK(keel_session_run_with_binding(s, nullptr, b));
  EXPECT_EQ(yv, xv);
  const auto c = copies(s);
  EXPECT_LE(c.host_to_host, 1u);
  EXPECT_EQ(c.bytes, c.host_to_host * 16u);
  keel_io_binding_release(b);
  keel_host_tensor_release(xt);
  keel_host_tensor_release(yt);
  keel_session_release(s);
}

TEST(IoBinding, WrongBindingsNameTheOutput) {
  CEnv e;
  keel_session_t s = make_session(e.env, model_bytes({2, 3}));
  keel_io_binding_t b = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(s, &b));
  std::vector<float> buf(6);
  std::vector<int32_t> ibuf(6);
  keel_host_tensor_t wrong_shape = wrap(buf, {3, 2});
  keel_host_tensor_t wrong_rank = wrap(buf, {6});
  keel_host_tensor_t wrong_dtype = nullptr;
  const int64_t d23[] = {2, 3};
  ASSERT_KEEL_OK(keel_host_tensor_wrap(KEEL_DTYPE_I32, d23, 2, ibuf.data(), ibuf.size() * 4, &wrong_dtype));

  std::string m = take(keel_io_binding_bind_output(b, "y", wrong_shape));
  EXPECT_NE(m.find("INVALID_ARGUMENT"), std::string::npos) << m;
  EXPECT_NE(m.find("output 'y'"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("[3, 2]"), std::string::npos) << m;
  m = take(keel_io_binding_bind_output(b, "y", wrong_rank));
  EXPECT_NE(m.find("output 'y'"), std::string::npos) << m;
  m = take(keel_io_binding_bind_output(b, "y", wrong_dtype));
  EXPECT_NE(m.find("output 'y'"), std::string::npos) << m;
  EXPECT_NE(m.find("i32"), std::string::npos) << m;
  m = take(keel_io_binding_bind_output(b, "nope", wrong_shape));
  EXPECT_NE(m.find("unknown output 'nope'"), std::string::npos) << m;
  EXPECT_NE(m.find("y"), std::string::npos) << m;
  m = take(keel_io_binding_bind_input(b, "x", wrong_shape));
  EXPECT_NE(m.find("input 'x'"), std::string::npos) << m;
  m = take(keel_io_binding_bind_output_to_device(b, "y", "warp:0"));
  EXPECT_NE(m.find("NOT_FOUND"), std::string::npos) << m;
  // No input bound: the run names it.
  keel_host_tensor_t ok = wrap(buf, {2, 3});
  ASSERT_KEEL_OK(keel_io_binding_bind_output(b, "y", ok));
  m = take(keel_session_run_with_binding(s, nullptr, b));
  EXPECT_NE(m.find("missing input 'x'"), std::string::npos) << m;
  // A binding of another session.
  keel_session_t other = make_session(e.env, model_bytes({2, 3}));
  m = take(keel_session_run_with_binding(other, nullptr, b));
  EXPECT_NE(m.find("another session"), std::string::npos) << m;
  keel_device_tensor_t none = nullptr;
  m = take(keel_io_binding_output(b, "y", &none));
  EXPECT_NE(m.find("NOT_FOUND"), std::string::npos) << m;
  EXPECT_EQ(none, nullptr);
  for (auto t : {wrong_shape, wrong_rank, wrong_dtype, ok}) keel_host_tensor_release(t);
  keel_io_binding_release(b);
  keel_session_release(other);
  keel_session_release(s);
}

TEST(IoBinding, ADynamicOutputThatDoesNotFitItsMemoryFailsNamingIt) {
  CEnv e;
  keel_session_t s = make_session(e.env, model_bytes({-1, 3}));
  std::vector<float> x(12, 1.f), y(6, 0.f);
  keel_host_tensor_t xt = wrap(x, {4, 3}), yt = wrap(y, {2, 3});
  keel_io_binding_t b = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(s, &b));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(b, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(b, "y", yt));  // [N, 3] accepts [2, 3]
  std::string m = take(keel_session_run_with_binding(s, nullptr, b));
  EXPECT_NE(m.find("INVALID_ARGUMENT"), std::string::npos) << m;
  EXPECT_NE(m.find("output 'y' is f32[4, 3]"), std::string::npos) << m;
  EXPECT_NE(m.find("f32[2, 3]"), std::string::npos) << m;
  EXPECT_EQ(y, std::vector<float>(6, 0.f)) << "the bound memory was not written";
  // A fitting input: fine, in place.
  std::vector<float> x6(6, 1.f);
  keel_host_tensor_t x2 = wrap(x6, {2, 3});
  ASSERT_KEEL_OK(keel_io_binding_bind_input(b, "x", x2));
  ASSERT_KEEL_OK(keel_session_run_with_binding(s, nullptr, b));
  EXPECT_EQ(y, std::vector<float>(6, 2.f));
  for (auto t : {xt, yt, x2}) keel_host_tensor_release(t);
  keel_io_binding_release(b);
  keel_session_release(s);
}

// A binding belongs to one run at a time: while a run holds it (held inside the run by the log callback, which the
// run calls when it finishes), another run and the bind calls on it fail with FAILED_PRECONDITION.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, done = false;
};
void gate_log(void* user, int32_t, const char* message) {
  auto* g = static_cast<Gate*>(user);
  if (std::strstr(message, "run 'held' (bound) finished") == nullptr) return;
  std::unique_lock<std::mutex> lock(g->mu);
  g->inside = true;
  g->cv.notify_all();
  g->cv.wait_for(lock, std::chrono::seconds(20), [&] { return g->done; });
}

TEST(IoBinding, ABindingBelongsToOneRunAtATime) {
  Gate gate;
  keel_environment_options_t eo = nullptr;
  ASSERT_KEEL_OK(keel_environment_options_create(&eo));
  ASSERT_KEEL_OK(keel_environment_options_set_discover_plugins(eo, 0));
  ASSERT_KEEL_OK(keel_environment_options_set_log_callback(eo, gate_log, &gate, KEEL_LOG_DEBUG));
  keel_environment_t env = nullptr;
  ASSERT_KEEL_OK(keel_environment_create(eo, &env));
  keel_environment_options_release(eo);
  keel_session_t s = make_session(env, model_bytes({2, 3}));
  std::vector<float> x(6, 1.f), y(6, 0.f), y2(6, 0.f);
  keel_host_tensor_t xt = wrap(x, {2, 3}), yt = wrap(y, {2, 3}), y2t = wrap(y2, {2, 3});
  keel_io_binding_t b = nullptr, b2 = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(s, &b));
  ASSERT_KEEL_OK(keel_io_binding_create(s, &b2));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(b, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(b, "y", yt));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(b2, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(b2, "y", y2t));
  keel_run_options_t ro = nullptr;
  ASSERT_KEEL_OK(keel_run_options_create(&ro));
  ASSERT_KEEL_OK(keel_run_options_set_log_tag(ro, "held"));
  std::string first;
  std::thread runner([&] { first = take(keel_session_run_with_binding(s, ro, b)); });
  {
    std::unique_lock<std::mutex> lock(gate.mu);
    ASSERT_TRUE(gate.cv.wait_for(lock, std::chrono::seconds(20), [&] { return gate.inside; }));
  }
  std::string second = take(keel_session_run_with_binding(s, nullptr, b));
  std::string rebind = take(keel_io_binding_bind_output(b, "y", yt));
  std::string other = take(keel_session_run_with_binding(s, nullptr, b2));  // its own binding: runs alongside
  {
    std::lock_guard<std::mutex> lock(gate.mu);
    gate.done = true;
    gate.cv.notify_all();
  }
  runner.join();
  EXPECT_EQ(first, "");
  EXPECT_NE(second.find("FAILED_PRECONDITION"), std::string::npos) << second;
  EXPECT_NE(second.find("in use by another run"), std::string::npos) << second;
  EXPECT_NE(rebind.find("FAILED_PRECONDITION"), std::string::npos) << rebind;
  EXPECT_EQ(other, "");
  EXPECT_EQ(y, std::vector<float>(6, 2.f));
  EXPECT_EQ(y2, std::vector<float>(6, 2.f));
  ASSERT_KEEL_OK(keel_session_run_with_binding(s, nullptr, b));  // free again
  for (auto t : {xt, yt, y2t}) keel_host_tensor_release(t);
  keel_run_options_release(ro);
  keel_io_binding_release(b);
  keel_io_binding_release(b2);
  keel_session_release(s);
  keel_environment_release(env);
}

TEST(IoBinding, ConcurrentRunsEachWithTheirOwnBinding) {
  CEnv e;
  keel_session_t s = make_session(e.env, model_bytes({-1, 3}));
  constexpr int kThreads = 4, kRuns = 100;
  std::atomic<int> bad{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int64_t rows = 1 + t;  // other shapes per thread: shape variants built concurrently too
      std::vector<float> x(static_cast<size_t>(rows * 3)), y(x.size());
      keel_host_tensor_t xt = wrap(x, {rows, 3}), yt = wrap(y, {rows, 3});
      keel_io_binding_t b = nullptr;
      errors[t] = take(keel_io_binding_create(s, &b));
      if (errors[t].empty()) errors[t] = take(keel_io_binding_bind_input(b, "x", xt));
      if (errors[t].empty()) errors[t] = take(keel_io_binding_bind_output(b, "y", yt));
      for (int r = 0; r < kRuns && errors[t].empty(); ++r) {
        for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((t * 7 + r + static_cast<int>(i)) % 11) - 5;
        errors[t] = take(keel_session_run_with_binding(s, nullptr, b));
        if (y != expected(x)) ++bad;
      }
      keel_io_binding_release(b);
      keel_host_tensor_release(xt);
      keel_host_tensor_release(yt);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(bad.load(), 0);
  const auto c = copies(s);
  EXPECT_EQ(c.bytes, 0u) << "every run wrote its output in place";
  keel_session_release(s);
}

TEST(IoBinding, AnOutputLeftInDeviceMemoryFeedsTheNextSessionWithoutACopy) {
  // On the CPU "the device" is host memory: the chain still shows the API, and that nothing is copied.
  CEnv e;
  keel_session_t a = make_session(e.env, model_bytes({2, 3}));
  keel_session_t bsess = make_session(e.env, model_bytes({2, 3}));
  std::vector<float> x = {-1, 2, -3, 4, -5, 6}, z(6, 0.f);
  keel_host_tensor_t xt = wrap(x, {2, 3}), zt = wrap(z, {2, 3});
  keel_io_binding_t ba = nullptr, bb = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(a, &ba));
  ASSERT_KEEL_OK(keel_io_binding_create(bsess, &bb));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(ba, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output_to_device(ba, "y", "cpu"));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(bb, "y", zt));
  for (int run = 0; run < 3; ++run) {
    x[0] = static_cast<float>(run);
    ASSERT_KEEL_OK(keel_session_run_with_binding(a, nullptr, ba));
    keel_device_tensor_t mid = nullptr;
    ASSERT_KEEL_OK(keel_io_binding_output(ba, "y", &mid));
    ASSERT_KEEL_OK(keel_io_binding_bind_input_device(bb, "x", mid));
    ASSERT_KEEL_OK(keel_session_run_with_binding(bsess, nullptr, bb));
    EXPECT_EQ(z, expected(x, 2));
    std::vector<float> back(6);
    ASSERT_KEEL_OK(keel_device_tensor_copy_to_host(mid, back.data(), back.size() * sizeof(float)));
    EXPECT_EQ(back, expected(x));
    keel_device_tensor_release(mid);
  }
  EXPECT_EQ(copies(a).bytes, 0u);
  EXPECT_EQ(copies(bsess).bytes, 0u);
  // A device tensor made by the caller, bound as an output.
  keel_device_tensor_t pre = nullptr;
  const int64_t d23[] = {2, 3};
  ASSERT_KEEL_OK(keel_device_tensor_create(e.env, "cpu", KEEL_DTYPE_F32, d23, 2, &pre));
  ASSERT_KEEL_OK(keel_io_binding_bind_output_device(ba, "y", pre));
  ASSERT_KEEL_OK(keel_session_run_with_binding(a, nullptr, ba));
  std::vector<float> back(6);
  ASSERT_KEEL_OK(keel_device_tensor_copy_to_host(pre, back.data(), back.size() * sizeof(float)));
  EXPECT_EQ(back, expected(x));
  EXPECT_EQ(copies(a).bytes, 0u) << "written into the preallocated tensor in place";
  std::string m = take(keel_device_tensor_copy_to_host(pre, back.data(), 4));
  EXPECT_NE(m.find("byte_size is 4"), std::string::npos) << m;
  keel_device_tensor_release(pre);
  for (auto t : {xt, zt}) keel_host_tensor_release(t);
  keel_io_binding_release(ba);
  keel_io_binding_release(bb);
  keel_session_release(a);
  keel_session_release(bsess);
}

TEST(IoBinding, CxxWrapper) {
  keel::api::EnvironmentOptions eo;
  eo.discover_plugins = false;
  keel::api::Environment env(eo);
  const std::string bytes = model_bytes({2, 3});
  auto model = keel::api::Model::from_memory(bytes.data(), bytes.size());
  keel::api::SessionOptions so;
  so.pipeline = "none";
  keel::api::Session a(env, model, so), b(env, model, so);
  std::vector<float> x = {-1, 2, -3, 4, -5, 6}, z(6, 0.f);
  auto xt = keel::api::Tensor::wrap(KEEL_DTYPE_F32, {2, 3}, x.data(), x.size() * 4);
  auto zt = keel::api::Tensor::wrap(KEEL_DTYPE_F32, {2, 3}, z.data(), z.size() * 4);
  keel::api::IoBinding ba(a), bb(b);
  ba.bind_input("x", xt).bind_output_to_device("y", "cpu");
  bb.bind_output("y", zt);
  a.run(ba);
  bb.bind_input("x", ba.output("y"));
  b.run(bb);
  EXPECT_EQ(z, expected(x, 2));
  EXPECT_EQ(ba.output("y").to_vector<float>(), expected(x));
  EXPECT_EQ(bb.output("y").data(), static_cast<void*>(z.data()));
  EXPECT_EQ(a.copy_stats().bytes + b.copy_stats().bytes, 0u);
  try {
    auto wrong = keel::api::Tensor::zeros(KEEL_DTYPE_F32, {3, 3});
    bb.bind_output("y", wrong);
    FAIL() << "a [3, 3] buffer for a [2, 3] output was accepted";
  } catch (const keel::api::Error& err) {
    EXPECT_EQ(err.code(), KEEL_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err.what()).find("output 'y'"), std::string::npos) << err.what();
  }
}

// ---- The stream contract on streamdev ------------------------------------------------------------------------------

struct StreamdevStats {
  int64_t copies[4];
  int64_t null_stream_copies, computes, null_stream_computes, streams_created, stream_syncs, device_syncs,
      event_records, stream_waits, collectives, null_stream_collectives;
};
using StatsFn = void (*)(StreamdevStats*);

// A function the streamdev library exports. The environment loaded the library; this finds the same copy (and keeps
// it loaded until the process ends).
template <class Fn>
Fn streamdev_function(const char* name) {
  void* h = dlopen(KEEL_IO_BINDING_DIR "/libkeel_streamdev.so", RTLD_NOW | RTLD_LOCAL);
  return h ? reinterpret_cast<Fn>(dlsym(h, name)) : nullptr;
}
StatsFn streamdev_stats() { return streamdev_function<StatsFn>("streamdev_stats"); }

StreamdevStats operator-(const StreamdevStats& a, const StreamdevStats& b) {
  StreamdevStats d;
  for (int k = 0; k < 4; ++k) d.copies[k] = a.copies[k] - b.copies[k];
  d.null_stream_copies = a.null_stream_copies - b.null_stream_copies;
  d.computes = a.computes - b.computes;
  d.null_stream_computes = a.null_stream_computes - b.null_stream_computes;
  d.streams_created = a.streams_created - b.streams_created;
  d.stream_syncs = a.stream_syncs - b.stream_syncs;
  d.device_syncs = a.device_syncs - b.device_syncs;
  d.event_records = a.event_records - b.event_records;
  d.stream_waits = a.stream_waits - b.stream_waits;
  d.collectives = a.collectives - b.collectives;
  d.null_stream_collectives = a.null_stream_collectives - b.null_stream_collectives;
  return d;
}

class Streams : public ::testing::Test {
 protected:
  void SetUp() override {
    env_ = std::make_unique<CEnv>(KEEL_IO_BINDING_DIR "/streamdev.keel-plugin.toml");
    stats_ = streamdev_stats();
    ASSERT_NE(stats_, nullptr) << dlerror();
    size_t n = 0;
    ASSERT_KEEL_OK(keel_environment_device_count(env_->env, &n));
    bool found = false;
    for (size_t i = 0; i < n; ++i) {
      keel_device_info_t d{};
      d.struct_size = sizeof d;
      ASSERT_KEEL_OK(keel_environment_device_info(env_->env, i, &d));
      found = found || std::string(d.device_type) == "streamdev";
    }
    ASSERT_TRUE(found) << "the streamdev fixture did not load";
  }
  StreamdevStats now() const {
    StreamdevStats s;
    stats_(&s);
    return s;
  }
  std::unique_ptr<CEnv> env_;
  StatsFn stats_ = nullptr;
};

TEST_F(Streams, KernelsAndCopiesRunOnTheRunsStreamAndTheHostWaitsOnlyForOutputs) {
  keel_session_t s = make_session(env_->env, model_bytes({2, 3}), "streamdev");
  ASSERT_NE(s, nullptr);
  const auto before = now();
  std::vector<float> x = {-1, 2, -3, 4, -5, 6};
  for (int run = 0; run < 4; ++run) {
    x[1] = static_cast<float>(run);
    keel_host_tensor_t xt = wrap(x, {2, 3});
    const char* in = "x";
    keel_host_tensor_t out = nullptr;
    ASSERT_KEEL_OK(keel_session_run(s, &in, &xt, 1, nullptr, &out, 1));
    const float* y = static_cast<const float*>(keel_host_tensor_data(out));
    EXPECT_EQ(std::vector<float>(y, y + 6), expected(x)) << "run " << run << ": stale bytes (an unordered read)";
    keel_host_tensor_release(out);
    keel_host_tensor_release(xt);
  }
  const auto d = now() - before;
  EXPECT_EQ(d.computes, 8);  // Relu and Add, 4 runs
  EXPECT_EQ(d.null_stream_computes, 0) << "the kernel context carries the run's stream";
  EXPECT_EQ(d.copies[KEEL_COPY_HOST_TO_DEVICE], 4);
  EXPECT_EQ(d.copies[KEEL_COPY_DEVICE_TO_HOST], 4);
  EXPECT_EQ(d.null_stream_copies, 0) << "copies are ordered on the run's stream";
  EXPECT_EQ(d.stream_syncs, 4) << "one wait per run, where the output leaves the device";
  EXPECT_EQ(d.device_syncs, 0);
  EXPECT_LE(d.streams_created, 2) << "streams are kept with the run slot";
  const auto c = copies(s);
  EXPECT_EQ(c.host_to_device, 4u);
  EXPECT_EQ(c.device_to_host, 4u);
  keel_session_release(s);
}

// A weight read by a device kernel is uploaded once, when the session is created, not copied by every run (which cost
// a GPU two thirds of a ResNet-18 run: 43 weight copies of 4.5 ms). A second session sharing the weights uploads
// nothing.
TEST_F(Streams, WeightsAreUploadedOnceWhenTheSessionIsCreated) {
  const auto start = now();
  keel_session_t s = make_session(env_->env, model_bytes({2, 3}, true), "streamdev");
  ASSERT_NE(s, nullptr);
  const auto created = now();
  EXPECT_EQ((created - start).copies[KEEL_COPY_HOST_TO_DEVICE], 1) << "the weight, once";
  std::vector<float> x = {-1, 2, -3, 4, -5, 6};
  for (int run = 0; run < 4; ++run) {
    x[0] = static_cast<float>(run);
    keel_host_tensor_t xt = wrap(x, {2, 3});
    const char* in = "x";
    keel_host_tensor_t out = nullptr;
    ASSERT_KEEL_OK(keel_session_run(s, &in, &xt, 1, nullptr, &out, 1));
    const float* y = static_cast<const float*>(keel_host_tensor_data(out));
    for (size_t i = 0; i < 6; ++i)
      EXPECT_EQ(y[i], std::max(x[i], 0.f) + 0.5f + static_cast<float>(i)) << "run " << run << ", element " << i;
    keel_host_tensor_release(out);
    keel_host_tensor_release(xt);
  }
  const auto d = now() - created;
  EXPECT_EQ(d.copies[KEEL_COPY_HOST_TO_DEVICE], 4) << "the input of each run, no weight";
  EXPECT_EQ(d.copies[KEEL_COPY_DEVICE_TO_HOST], 4);
  EXPECT_EQ(copies(s).host_to_device, 4u);
  keel_session_release(s);
}

TEST_F(Streams, AChainOfTwoSessionsKeepsTheTensorOnTheDevice) {
  keel_session_t a = make_session(env_->env, model_bytes({2, 3}), "streamdev");
  keel_session_t b = make_session(env_->env, model_bytes({2, 3}), "streamdev");
  std::vector<float> x = {-1, 2, -3, 4, -5, 6}, z(6, 0.f);
  keel_host_tensor_t xt = wrap(x, {2, 3}), zt = wrap(z, {2, 3});
  keel_io_binding_t ba = nullptr, bb = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(a, &ba));
  ASSERT_KEEL_OK(keel_io_binding_create(b, &bb));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(ba, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output_to_device(ba, "y", "streamdev"));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(bb, "y", zt));
  const auto before = now();
  for (int run = 0; run < 3; ++run) {
    x[0] = static_cast<float>(run + 1);
    const auto step = now();
    ASSERT_KEEL_OK(keel_session_run_with_binding(a, nullptr, ba));
    const auto after_a = now() - step;
    EXPECT_EQ(after_a.stream_syncs, 0) << "the output stays on the device: the host does not wait";
    EXPECT_EQ(after_a.copies[KEEL_COPY_DEVICE_TO_HOST], 0);
    EXPECT_GE(after_a.event_records, 1) << "work in flight gets an event";
    keel_device_tensor_t mid = nullptr;
    ASSERT_KEEL_OK(keel_io_binding_output(ba, "y", &mid));
    EXPECT_STREQ(keel_device_tensor_device_type(mid), "streamdev");
    ASSERT_KEEL_OK(keel_io_binding_bind_input_device(bb, "x", mid));
    keel_device_tensor_release(mid);  // the binding keeps it
    ASSERT_KEEL_OK(keel_session_run_with_binding(b, nullptr, bb));
    EXPECT_EQ(z, expected(x, 2)) << "run " << run << ": the consumer was not ordered after the producer";
  }
  const auto d = now() - before;
  EXPECT_EQ(d.copies[KEEL_COPY_HOST_TO_DEVICE], 3) << "x goes to the device once per chain";
  EXPECT_EQ(d.copies[KEEL_COPY_DEVICE_TO_HOST], 3) << "z leaves the device once per chain; y never does";
  EXPECT_EQ(d.copies[KEEL_COPY_DEVICE_TO_DEVICE], 0);
  EXPECT_GE(d.stream_waits, 3) << "the consumer's stream waits for the producer's event";
  EXPECT_EQ(d.stream_syncs, 3);
  EXPECT_EQ(d.device_syncs, 0);
  EXPECT_EQ(d.null_stream_computes + d.null_stream_copies, 0);
  EXPECT_EQ(copies(a).device_to_host, 0u);
  EXPECT_EQ(copies(b).host_to_device, 0u);
  for (auto t : {xt, zt}) keel_host_tensor_release(t);
  keel_io_binding_release(ba);
  keel_io_binding_release(bb);
  keel_session_release(a);
  keel_session_release(b);
}

TEST_F(Streams, ConcurrentRunsOnOneSessionUseTheirOwnStreams) {
  keel_session_t s = make_session(env_->env, model_bytes({2, 3}), "streamdev");
  constexpr int kThreads = 4, kRuns = 60;
  std::atomic<int> bad{0};
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> x(6), y(6);
      keel_host_tensor_t xt = wrap(x, {2, 3}), yt = wrap(y, {2, 3});
      keel_io_binding_t b = nullptr;
      errors[t] = take(keel_io_binding_create(s, &b));
      if (errors[t].empty()) errors[t] = take(keel_io_binding_bind_input(b, "x", xt));
      if (errors[t].empty()) errors[t] = take(keel_io_binding_bind_output(b, "y", yt));
      for (int r = 0; r < kRuns && errors[t].empty(); ++r) {
        for (size_t i = 0; i < 6; ++i) x[i] = static_cast<float>((t * 5 + r + static_cast<int>(i)) % 9) - 4;
        errors[t] = take(keel_session_run_with_binding(s, nullptr, b));
        if (y != expected(x)) ++bad;
      }
      keel_io_binding_release(b);
      keel_host_tensor_release(xt);
      keel_host_tensor_release(yt);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(bad.load(), 0) << "a run read another run's bytes, or bytes not yet written";
  keel_session_release(s);
}

// Eager over an environment with streamdev alone (keel::eager::init(nullptr) at the test's end).
void init_eager_on_streamdev() {
  keel::EnvironmentOptions o;
  o.discover_plugins = false;
  o.manifests = {KEEL_IO_BINDING_DIR "/streamdev.keel-plugin.toml"};
  o.threads = 1;
  auto env = keel::Environment::create(o);
  ASSERT_TRUE(env.is_ok()) << env.status().to_string();
  keel::eager::init(std::shared_ptr<keel::Environment>(std::move(env).value()));
}

// Eager uploads (x.to(device): a training batch, a factory's values) leave the host free on a device with streams:
// the copy goes on an upload stream ordered after the default stream's queued work and before what is queued next,
// with events waited for on the device; no stream or device synchronisation, and the values are there for the next
// op. Downloads still complete before they return.
TEST_F(Streams, EagerUploadsDoNotWaitForTheDevice) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  const auto before = now();
  for (int step = 0; step < 3; ++step) {
    std::vector<float> v = {-1.f, 2.f, -3.f, static_cast<float>(step)};
    keel::eager::Tensor x = keel::eager::from_vector(v, {4}).to("streamdev");
    ASSERT_EQ(x.device(), "streamdev");
    keel::eager::Tensor y = keel::eager::relu(x);  // streamdev's Relu, on the default stream
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.f, 2.f, 0.f, static_cast<float>(step)})) << "step " << step;
  }
  const auto d = now() - before;
  EXPECT_EQ(d.copies[KEEL_COPY_HOST_TO_DEVICE], 3);
  EXPECT_EQ(d.copies[KEEL_COPY_DEVICE_TO_HOST], 3);
  EXPECT_EQ(d.null_stream_copies, 3) << "the downloads only: uploads go on the upload stream";
  EXPECT_EQ(d.stream_syncs, 0);
  EXPECT_EQ(d.device_syncs, 0);
  EXPECT_EQ(d.stream_waits, 6) << "per upload: the upload stream waits for the default one, then the reverse";
  EXPECT_LE(d.streams_created, 1) << "one upload stream for the device, kept";
  keel::eager::init(nullptr);
}

// Whether a device's memory is host memory is asked of its table once, not on every eager op: a scalar operand (x *
// 0.5f) needs the memory type of its device, and on CUDA each query was cudaGetDeviceProperties plus a device switch
// (one that also made a context on device 0 in a process working on device 1).
TEST_F(Streams, EagerAsksADevicesPropertiesOncePerDeviceNotPerOp) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  auto queries = streamdev_function<int64_t (*)()>("streamdev_property_queries");
  ASSERT_NE(queries, nullptr) << dlerror();
  {
    keel::eager::Tensor x = keel::eager::from_vector(std::vector<float>{1.f, 2.f, 3.f, 4.f}, {4}).to("streamdev");
    keel::eager::Tensor y = x * 0.5f;  // the first scalar op may ask
    const int64_t before = queries();
    for (int k = 0; k < 50; ++k) y = keel::eager::relu(y * 2.f) * 0.5f;
    EXPECT_EQ(queries() - before, 0) << "get_properties asked again for 100 scalar ops";
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));
  }
  keel::eager::init(nullptr);
}

// A data-parallel model whose parameters are on another card than the communicator's (streamdev with two devices:
// parameters on streamdev:0, the group's communicator on streamdev:1) is refused at create, naming both, before any
// collective runs on the wrong card's buffers.
TEST_F(Streams, DataParallelRefusesParametersOnAnotherCardThanTheCommunicators) {
  ASSERT_EQ(setenv("STREAMDEV_DEVICES", "2", 1), 0);
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  {
    auto store = std::make_shared<keel::dist::InProcessStore>();
    auto pg =
        keel::dist::ProcessGroup::create_with_store(keel::eager::environment(), store, 0, 1, "streamdev", 1, 5000);
    ASSERT_TRUE(pg.is_ok()) << pg.status().to_string();
    keel::train::nn::Linear model(3, 2);
    model.to("streamdev:0");
    auto dp = keel::train::DataParallel::create(model, (*pg)->comm());
    ASSERT_FALSE(dp.is_ok());
    const std::string msg = dp.status().to_string();
    EXPECT_NE(msg.find("is on streamdev:0 but the communicator works on streamdev:1"), std::string::npos) << msg;
    model.to("streamdev:1");  // on the communicator's card: accepted
    EXPECT_TRUE(keel::train::DataParallel::create(model, (*pg)->comm()).is_ok());
  }
  keel::eager::init(nullptr);
  unsetenv("STREAMDEV_DEVICES");
}

// An eager upload whose ordering fails after the copy was queued (streamdev_fail_event_record_after: the copy stream's
// event record fails): the error names it, and the host waited for the copy first (one stream sync), so the
// destination goes back to the pool with nothing still writing it; the next upload works.
TEST_F(Streams, AnEagerUploadThatFailsAfterItsCopyWaitsForTheCopyFirst) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  auto fail_record_after = streamdev_function<void (*)(int64_t)>("streamdev_fail_event_record_after");
  ASSERT_NE(fail_record_after, nullptr) << dlerror();
  {
    const std::vector<float> v = {1.f, -2.f, 3.f, -4.f};
    (void)keel::eager::from_vector(v, {4}).to("streamdev");  // the copy stream exists from here
    const auto before = now();
    fail_record_after(1);  // the upload's records: the default stream's, then the copy stream's (this one fails)
    try {
      (void)keel::eager::from_vector(v, {4}).to("streamdev");
      ADD_FAILURE() << "the upload did not report the failed event record";
    } catch (const keel::eager::Error& e) {
      EXPECT_NE(std::string(e.what()).find("failed on purpose"), std::string::npos) << e.what();
    }
    fail_record_after(-1);
    EXPECT_EQ((now() - before).stream_syncs, 1) << "the host waits for the queued copy before the error";
    keel::eager::Tensor ok = keel::eager::from_vector(v, {4}).to("streamdev");
    EXPECT_EQ(ok.to_vector<float>(), v);
  }
  keel::eager::init(nullptr);
}

// copy_ into device memory (an optimizer's state, BatchNorm's running statistics, a data-parallel bucket): from the
// same device or from the host, queued on the copy stream, never a wait for the device; what eager runs next, and a
// read on the host, see the copied values (streamdev runs a queued copy only when a stream waits for it, so a missing
// order reads stale bytes).
TEST_F(Streams, EagerCopiesIntoADeviceDoNotWaitForIt) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  {  // the tensors go before the environment does
    keel::eager::Tensor acc = keel::eager::from_vector(std::vector<float>{0.f, 0.f, 0.f, 0.f}, {4}).to("streamdev");
    keel::eager::Tensor whole = keel::eager::from_vector(std::vector<float>(8, 0.f), {8}).to("streamdev");
    const auto before = now();
    for (int step = 0; step < 3; ++step) {
      std::vector<float> v = {-1.f, 2.f, -3.f, static_cast<float>(step)};
      keel::eager::Tensor x = keel::eager::from_vector(v, {4}).to("streamdev");
      acc.copy_(keel::eager::relu(x));                 // within the device
      keel::eager::Tensor y = keel::eager::relu(acc);  // reads the copy on the default stream
      EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.f, 2.f, 0.f, static_cast<float>(step)})) << "step " << step;
    }
    // Into a slice of a larger buffer (a data-parallel bucket), then from the host.
    const keel::Tensor& w = whole.data();
    keel::eager::Tensor(keel::Tensor(w.dtype(), {4}, w.storage(), w.byte_offset() + 4 * sizeof(float))).copy_(acc);
    acc.copy_(keel::eager::from_vector(std::vector<float>{5.f, 6.f, 7.f, 8.f}, {4}));
    EXPECT_EQ(whole.to_vector<float>(), (std::vector<float>{0.f, 0.f, 0.f, 0.f, 0.f, 2.f, 0.f, 2.f}));
    EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{5.f, 6.f, 7.f, 8.f}));
    keel::eager::Tensor host = keel::eager::from_vector(std::vector<float>(4, 0.f), {4});
    host.copy_(acc);  // into the host: straight from the device, complete on return
    EXPECT_EQ(host.to_vector<float>(), (std::vector<float>{5.f, 6.f, 7.f, 8.f}));
    const auto d = now() - before;
    EXPECT_EQ(d.copies[KEEL_COPY_DEVICE_TO_DEVICE], 4);
    EXPECT_EQ(d.copies[KEEL_COPY_HOST_TO_DEVICE], 4);
    EXPECT_EQ(d.null_stream_copies, d.copies[KEEL_COPY_DEVICE_TO_HOST]) << "only the reads on the host wait";
    EXPECT_EQ(d.stream_syncs, 0);
    EXPECT_EQ(d.device_syncs, 0);
  }
  keel::eager::init(nullptr);
}

// Runs `body` on `world` threads, each a rank of a streamdev process group (streamdev's collective backend) training a
// Linear(3, 2) on streamdev wrapped in a DataParallel (each rank starts from its own random weights: create()
// broadcasts rank 0's). Returns each rank's error ("" when none): a failed set-up, what body returns, or an
// eager::Error it throws. The DataParallel goes before its group (its communication thread uses the communicator).
std::vector<std::string> run_streamdev_dp_ranks(
    int world, const std::function<std::string(int, keel::dist::ProcessGroup&, keel::train::nn::Linear&,
                                               keel::train::DataParallel&)>& body) {
  auto store = std::make_shared<keel::dist::InProcessStore>();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::mutex generator_mu;  // the eager generator is not synchronised
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      std::string& error = errors[static_cast<size_t>(r)];
      auto pg = keel::dist::ProcessGroup::create_with_store(keel::eager::environment(), store, r, world, "streamdev", 0,
                                                            20000);
      if (!pg.is_ok()) return void(error = "group: " + pg.status().to_string());
      std::unique_lock<std::mutex> init(generator_mu);
      keel::train::nn::Linear model(3, 2);
      init.unlock();
      model.to("streamdev");
      auto dp = keel::train::DataParallel::create(model, (*pg)->comm());
      if (!dp.is_ok()) return void(error = "create: " + dp.status().to_string());
      try {
        error = body(r, **pg, model, **dp);
      } catch (const keel::eager::Error& e) {
        error = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}

// Rank r's batch for the Linear(3, 2) of run_streamdev_dp_ranks: x[n][i] = (r + 1) * (n + 1) + i, 2 rows of 3
// features (each rank's own gradient is not the average).
std::vector<float> dp_batch(int r) {
  std::vector<float> x;
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i) x.push_back(static_cast<float>((r + 1) * (n + 1) + i));
  return x;
}

// loss = sum(x W^T + b): dW[o][i] = sum_n x[n][i] (and dB[o] = 2), averaged over `world` ranks' dp_batch.
std::vector<float> dp_averaged_dw(int world) {
  std::vector<float> want;
  for (int o = 0; o < 2; ++o)
    for (int i = 0; i < 3; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r)
        for (int n = 0; n < 2; ++n) sum += dp_batch(r)[static_cast<size_t>(n * 3 + i)];
      want.push_back(sum / static_cast<float>(world));
    }
  return want;
}

// Data-parallel training over a communicator whose buffers must be device memory (NCCL's rule, which streamdev's
// collective backend enforces; its results land on the stream given, so a consumer that does not wait reads stale
// bytes): DataParallel's own exchanges of host values (the parameters' descriptions, the bucket order) and the
// metrics helper go through the device, the gradient buckets are all-reduced on a communication stream, and each
// rank ends every step (three: the buckets are rebuilt after the second) with the gradients averaged over both
// without the host waiting for the device. Two ranks are two
// threads. With host pointers handed to the communicator, create() fails ("not streamdev memory"); without the
// default stream's wait for the communication stream in finish(), the gradients are stale.
TEST_F(Streams, DataParallelOverADeviceMemoryCommunicator) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  constexpr int kWorld = 2;
  const auto batch = dp_batch;
  const std::vector<float> want_dw = dp_averaged_dw(kWorld);
  std::vector<std::vector<float>> weights(kWorld), dw(kWorld), db(kWorld);
  std::vector<double> metric(kWorld);
  const auto before = now();
  const auto failures = run_streamdev_dp_ranks(
      kWorld, [&](int r, keel::dist::ProcessGroup& pg, keel::train::nn::Linear& model, keel::train::DataParallel& dp) {
        // Three steps: after the second the buckets are rebuilt from the observed order (new events).
        for (int step = 0; step < 3; ++step) {
          keel::eager::Tensor x = keel::eager::from_vector(batch(r), {2, 3}).to("streamdev");
          keel::eager::sum(dp(x)).backward();
          if (keel::Status st = dp.finish(); !st.is_ok()) return st.to_string();
          const auto got = model.weight().grad().to_vector<float>();
          if (step < 2 && got != want_dw) return "step " + std::to_string(step) + ": wrong weight gradient";
          weights[static_cast<size_t>(r)] = model.weight().to_vector<float>();
          dw[static_cast<size_t>(r)] = got;
          db[static_cast<size_t>(r)] = model.bias().grad().to_vector<float>();
          model.zero_grad();
        }
        if (!dp.buckets_rebuilt()) return std::string("the buckets were not rebuilt");
        auto m = keel::train::all_reduce_sum(pg.comm(), {static_cast<double>(r + 1)});
        if (!m.is_ok()) return m.status().to_string();
        metric[static_cast<size_t>(r)] = (*m)[0];
        return std::string();
      });
  const auto d = now() - before;
  // One bucket a rank (weight and bias) a step, all-reduced on that rank's communication stream; the host values'
  // exchanges on the default stream; the host never waits for the device.
  EXPECT_EQ(d.collectives - d.null_stream_collectives, 3 * kWorld);
  EXPECT_GE(d.streams_created, kWorld);
  EXPECT_EQ(d.stream_syncs, 0);
  EXPECT_EQ(d.device_syncs, 0);
  for (int r = 0; r < kWorld; ++r) {
    const auto k = static_cast<size_t>(r);
    ASSERT_EQ(failures[k], "") << "rank " << r;
    EXPECT_EQ(weights[k], weights[0]) << "rank " << r << ": the parameters come from rank 0";
    EXPECT_EQ(dw[k], want_dw) << "rank " << r;
    EXPECT_EQ(db[k], (std::vector<float>{2.f, 2.f})) << "rank " << r;
    EXPECT_EQ(metric[k], 3.0) << "rank " << r;
  }
  keel::eager::init(nullptr);
}

// A bucket all-reduce that fails (streamdev_fail_all_reduce): finish() names it on every rank, the host waits for
// the communication stream before the buckets' memory goes back to the pool, and the ranks end.
TEST_F(Streams, DataParallelReportsAFailedAllReduce) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  constexpr int kWorld = 2;
  auto fail_all_reduce = streamdev_function<void (*)(int)>("streamdev_fail_all_reduce");
  ASSERT_NE(fail_all_reduce, nullptr) << dlerror();
  fail_all_reduce(1);  // DataParallel::create needs broadcasts and all-gathers only
  const auto before = now();
  const auto errors = run_streamdev_dp_ranks(
      kWorld, [](int, keel::dist::ProcessGroup&, keel::train::nn::Linear&, keel::train::DataParallel& dp) {
        keel::eager::Tensor x = keel::eager::from_vector(std::vector<float>(6, 1.f), {2, 3}).to("streamdev");
        keel::eager::sum(dp(x)).backward();
        keel::Status st = dp.finish();
        return st.is_ok() ? std::string("finish() succeeded") : st.to_string();
      });
  fail_all_reduce(0);
  for (int r = 0; r < kWorld; ++r)
    EXPECT_NE(errors[static_cast<size_t>(r)].find("all_reduce: failed on purpose"), std::string::npos)
        << errors[static_cast<size_t>(r)];
  EXPECT_GE((now() - before).stream_syncs, kWorld) << "each rank waits for its communication stream";
  keel::eager::init(nullptr);
}

// A bucket whose launch fails during backward (its event record fails: streamdev_fail_event_record_after on each
// rank's thread): backward reports it, and finish() launches the bucket again and averages it, so every rank ends the
// step with the averaged gradients. Before, the failed bucket counted as launched-and-done in finish(), which handed
// out the rank's own, unaveraged gradients with an OK status.
TEST_F(Streams, DataParallelLaunchesAgainABucketWhoseLaunchFailed) {
  ASSERT_NO_FATAL_FAILURE(init_eager_on_streamdev());
  constexpr int kWorld = 2;
  auto fail_record_after = streamdev_function<void (*)(int64_t)>("streamdev_fail_event_record_after");
  auto thread_records = streamdev_function<int64_t (*)()>("streamdev_thread_event_records");
  ASSERT_NE(fail_record_after, nullptr) << dlerror();
  ASSERT_NE(thread_records, nullptr) << dlerror();
  const auto batch = dp_batch;
  const std::vector<float> want_dw = dp_averaged_dw(kWorld);
  const auto failures = run_streamdev_dp_ranks(
      kWorld, [&](int r, keel::dist::ProcessGroup&, keel::train::nn::Linear& model, keel::train::DataParallel& dp) {
        // A step as usual: how many event records this thread makes in backward (the bucket's launch, the last).
        keel::eager::Tensor x = keel::eager::from_vector(batch(r), {2, 3}).to("streamdev");
        keel::eager::Tensor loss = keel::eager::sum(dp(x));
        const int64_t before = thread_records();
        loss.backward();
        const int64_t in_backward = thread_records() - before;
        if (in_backward < 1) return std::string("no event recorded in backward");
        if (keel::Status st = dp.finish(); !st.is_ok()) return "step 0: " + st.to_string();
        if (model.weight().grad().to_vector<float>() != want_dw) return std::string("step 0: wrong weight gradient");
        model.zero_grad();
        // The same step with the bucket's event record failing.
        loss = keel::eager::sum(dp(x));
        fail_record_after(in_backward - 1);
        try {
          loss.backward();
          fail_record_after(-1);
          return std::string("backward did not report the failed launch");
        } catch (const keel::eager::Error& e) {
          fail_record_after(-1);
          if (std::string(e.what()).find("failed on purpose") == std::string::npos)
            return std::string("backward: ") + e.what();
        }
        if (keel::Status st = dp.finish(); !st.is_ok()) return "step 1: " + st.to_string();
        if (model.weight().grad().to_vector<float>() != want_dw)
          return std::string("step 1: the weight gradient is not the average");
        if (model.bias().grad().to_vector<float>() != std::vector<float>{2.f, 2.f})
          return std::string("step 1: wrong bias gradient");
        return std::string();
      });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
  keel::eager::init(nullptr);
}

TEST(IoBindingCuda, AChainOfTwoSessionsKeepsTheTensorOnTheGpu) {
  CEnv e(nullptr, true);
  size_t n = 0;
  ASSERT_KEEL_OK(keel_environment_device_count(e.env, &n));
  bool cuda = false;
  for (size_t i = 0; i < n; ++i) {
    keel_device_info_t d{};
    d.struct_size = sizeof d;
    ASSERT_KEEL_OK(keel_environment_device_info(e.env, i, &d));
    cuda = cuda || std::string(d.device_type) == "cuda";
  }
  if (!cuda) GTEST_SKIP() << "no CUDA device (the cuda plugin is not built, or no GPU is present)";
  keel_session_t a = make_session(e.env, model_bytes({256, 256}), "cuda:0");
  keel_session_t b = make_session(e.env, model_bytes({256, 256}), "cuda:0");
  std::vector<float> x(256 * 256), z(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 13) - 6);
  keel_host_tensor_t xt = wrap(x, {256, 256}), zt = wrap(z, {256, 256});
  keel_io_binding_t ba = nullptr, bb = nullptr;
  ASSERT_KEEL_OK(keel_io_binding_create(a, &ba));
  ASSERT_KEEL_OK(keel_io_binding_create(b, &bb));
  ASSERT_KEEL_OK(keel_io_binding_bind_input(ba, "x", xt));
  ASSERT_KEEL_OK(keel_io_binding_bind_output_to_device(ba, "y", "cuda:0"));
  ASSERT_KEEL_OK(keel_io_binding_bind_output(bb, "y", zt));
  for (int run = 0; run < 3; ++run) {
    ASSERT_KEEL_OK(keel_session_run_with_binding(a, nullptr, ba));
    keel_device_tensor_t mid = nullptr;
    ASSERT_KEEL_OK(keel_io_binding_output(ba, "y", &mid));
    EXPECT_STREQ(keel_device_tensor_device_type(mid), "cuda");
    ASSERT_KEEL_OK(keel_io_binding_bind_input_device(bb, "x", mid));
    keel_device_tensor_release(mid);
    ASSERT_KEEL_OK(keel_session_run_with_binding(b, nullptr, bb));
    EXPECT_EQ(z, expected(x, 2)) << "run " << run;
  }
  EXPECT_EQ(copies(a).device_to_host, 0u) << "the tensor stayed on the GPU";
  EXPECT_EQ(copies(b).host_to_device, 0u);
  EXPECT_EQ(copies(a).host_to_device, 3u);
  EXPECT_EQ(copies(b).device_to_host, 3u);
  for (auto t : {xt, zt}) keel_host_tensor_release(t);
  keel_io_binding_release(ba);
  keel_io_binding_release(bb);
  keel_session_release(a);
  keel_session_release(b);
}

}  // namespace
