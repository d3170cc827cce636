// Sessions run from threads other than the one that created them, through the C API, on the plugins of the build
// tree (oneDNN when built): the outputs equal the creating thread's, bit for bit. Regression test for the SIGSEGV in
// oneDNN's jit_wino_4x3 when keel_session_run came from another thread (Debian's oneDNN keeps the scratchpad of a
// primitive created in "library" mode in a buffer of the creating thread: plugins/cpu_onednn/common/scratchpad.h).
//
// Models, generated here with random weights (no files in git), each shaped like a model of the peer set:
//   resnet       ResNet-18's first stages: 3x3 convolutions of 64 and 128 channels at 56x56 and 28x28 (where oneDNN
//                picks Winograd F(4,3) / F(2,3)), residual Adds, a strided stage, global pooling and a classifier.
//   mobilenet    an inverted residual: 1x1 expansion, depthwise 3x3, Clip(0, 6), 1x1 projection, residual Add.
//   transformer  one attention-like block: projections, scaled Q.K^T, Softmax, .V, residual, LayerNormalization.
//   int8         a QDQ convolution stack (QuantizeLinear/DequantizeLinear around 3x3 convolutions) run with
//                fuse_qdq when the quantize_int8 pass plugin is built, so that int8 kernels run it.
//   int8cnn      SimpleCNN in QDQ form (1-channel image -> Conv -> Relu -> MaxPool -> Flatten -> Q/DQ -> Gemm), batch
//                4, with fuse_qdq: the QuantizeLinear moves to the Conv, whose int8 stem step pools on the fly (the
//                oneDNN chain's own steps/int8_stem), then byte views and the QGemm.
#include <gtest/gtest.h>
#include <keel/keel.h>
#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/onnx_io.h"

// Under ThreadSanitizer (the -DKEEL_SANITIZE=thread build; GCC defines __SANITIZE_THREAD__, clang has the feature)
// every instrumented loop runs 5-15x slower: the ResNet-like model did not finish in 400 s. There the model takes a
// 28x28 input instead of 56x56 (the same convolutions, a quarter of the work) and each thread runs once instead of
// three times: the thread hand-offs that TSan checks are all still there.
#if defined(__SANITIZE_THREAD__)
#define KEEL_TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KEEL_TEST_UNDER_TSAN 1
#endif
#endif
#ifdef KEEL_TEST_UNDER_TSAN
constexpr int64_t kResnetSide = 28;
constexpr int kRunsPerThread = 1;
#else
constexpr int64_t kResnetSide = 56;
constexpr int kRunsPerThread = 3;
#endif

namespace {

using keel::Attribute;
using keel::DType;
using keel::GraphBuilder;

std::string take(keel_status_t s) {
  if (s == nullptr) return "";
  std::string out = std::string(keel_status_code_name(s->code)) + ": " + (s->message ? s->message : "");
  keel_status_release(s);
  return out;
}
#define ASSERT_KEEL_OK(expr) ASSERT_EQ(take(expr), "")

std::vector<float> random_values(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct ModelBuilder {
  GraphBuilder g;
  uint32_t seed = 1;
  explicit ModelBuilder(const char* name) : g(name, 17) {}

  std::string weights(const std::string& name, keel::Shape shape, float scale) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return g.constant(name, keel::Tensor::f32(std::move(shape), random_values(n, scale, seed++)));
  }
  std::string conv(const std::string& x, int64_t cin, int64_t cout, int64_t k, int64_t stride, int64_t group = 1) {
    const std::string id = "conv" + std::to_string(seed);
    const float scale = std::sqrt(2.f / static_cast<float>(cin / group * k * k));
    auto w = weights(id + ".w", {cout, cin / group, k, k}, scale);
    auto b = weights(id + ".b", {cout}, 0.05f);
    const int64_t p = k / 2;
    return g.op1("Conv", {x, w, b},
                 {{"kernel_shape", Attribute::of_ints({k, k})},
                  {"strides", Attribute::of_ints({stride, stride})},
                  {"pads", Attribute::of_ints({p, p, p, p})},
                  {"group", Attribute::of_int(group)}});
  }
  std::string bytes(const std::string& out) {
    g.output(out);
    auto s = keel::serialize_onnx(g.take());
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    return s.is_ok() ? s.value() : std::string();
  }
};

std::string resnet_model() {
  ModelBuilder m("resnet_like");
  auto x = m.g.input("x", DType::kF32, {1, 64, kResnetSide, kResnetSide});
  auto h = m.g.op1("Relu", {m.conv(x, 64, 64, 3, 1)});
  h = m.g.op1("Relu", {m.g.op1("Add", {m.conv(h, 64, 64, 3, 1), x})});
  auto y = m.g.op1("Relu", {m.conv(h, 64, 128, 3, 2)});
  y = m.conv(y, 128, 128, 3, 1);
  y = m.g.op1("Relu", {m.g.op1("Add", {y, m.conv(h, 64, 128, 1, 2)})});
  auto z = m.g.op1("Relu", {m.conv(y, 128, 128, 3, 1)});
  z = m.g.op1("Relu", {m.g.op1("Add", {m.conv(z, 128, 128, 3, 1), y})});
  auto pooled = m.g.op1("Flatten", {m.g.op1("GlobalAveragePool", {z})});
  auto fc = m.weights("fc.w", {10, 128}, 0.1f);
  auto fb = m.weights("fc.b", {10}, 0.1f);
  return m.bytes(m.g.op1("Gemm", {pooled, fc, fb}, {{"transB", Attribute::of_int(1)}}));
}

std::string mobilenet_model() {
  ModelBuilder m("mobilenet_like");
  auto x = m.g.input("x", DType::kF32, {2, 32, 28, 28});
  auto lo = m.g.constant("lo", keel::Tensor::f32({}, {0.f}));
  auto hi = m.g.constant("hi", keel::Tensor::f32({}, {6.f}));
  auto e = m.g.op1("Clip", {m.conv(x, 32, 192, 1, 1), lo, hi});
  auto d = m.g.op1("Clip", {m.conv(e, 192, 192, 3, 1, 192), lo, hi});
  auto p = m.conv(d, 192, 32, 1, 1);
  auto r = m.g.op1("Add", {p, x});
  auto d2 = m.g.op1("Clip", {m.conv(m.conv(r, 32, 96, 1, 1), 96, 96, 3, 2, 96), lo, hi});
  return m.bytes(m.conv(d2, 96, 48, 1, 1));
}

std::string transformer_model() {
  ModelBuilder m("transformer_like");
  constexpr int64_t T = 64, D = 128;
  auto x = m.g.input("x", DType::kF32, {1, T, D});
  auto q = m.g.op1("MatMul", {x, m.weights("wq", {D, D}, 0.09f)});
  auto k = m.g.op1("MatMul", {x, m.weights("wk", {D, D}, 0.09f)});
  auto v = m.g.op1("MatMul", {x, m.weights("wv", {D, D}, 0.09f)});
  auto kt = m.g.op1("Transpose", {k}, {{"perm", Attribute::of_ints({0, 2, 1})}});
  auto s = m.g.op1("Mul", {m.g.op1("MatMul", {q, kt}), m.g.constant("scale", keel::Tensor::f32({}, {0.088f}))});
  auto a = m.g.op1("MatMul", {m.g.op1("Softmax", {s}, {{"axis", Attribute::of_int(-1)}}), v});
  auto o = m.g.op1("Add", {m.g.op1("MatMul", {a, m.weights("wo", {D, D}, 0.09f)}), x});
  auto gamma = m.g.constant("gamma", keel::Tensor::f32({D}, std::vector<float>(D, 1.f)));
  auto beta = m.g.constant("beta", keel::Tensor::f32({D}, std::vector<float>(D, 0.f)));
  auto n = m.g.op1("LayerNormalization", {o, gamma, beta}, {{"axis", Attribute::of_int(-1)}});
  auto f = m.g.op1("Relu", {m.g.op1("MatMul", {n, m.weights("w1", {D, 2 * D}, 0.09f)})});
  return m.bytes(m.g.op1("Add", {m.g.op1("MatMul", {f, m.weights("w2", {2 * D, D}, 0.06f)}), n}));
}

// QuantizeLinear -> DequantizeLinear around every activation, weights as int8 constants behind DequantizeLinear.
std::string int8_model() {
  ModelBuilder m("int8_like");
  auto qdq = [&](const std::string& v, float scale) {
    auto s = m.g.constant("s" + std::to_string(m.seed++), keel::Tensor::f32({}, {scale}));
    auto z = m.g.constant("z" + std::to_string(m.seed++), keel::Tensor::from_vector<uint8_t>(DType::kU8, {}, {128}));
    return m.g.op1("DequantizeLinear", {m.g.op1("QuantizeLinear", {v, s, z}), s, z});
  };
  auto qconv = [&](const std::string& x, int64_t cin, int64_t cout) {
    const std::string id = "q" + std::to_string(m.seed++);
    std::vector<float> wf = random_values(static_cast<size_t>(cout * cin * 9), 40.f, m.seed++);
    std::vector<int8_t> wq(wf.size());
    for (size_t i = 0; i < wf.size(); ++i)
      wq[i] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, std::round(wf[i]))));
    auto w = m.g.constant(id + ".w", keel::Tensor::from_vector<int8_t>(DType::kI8, {cout, cin, 3, 3}, wq));
    auto ws = m.g.constant(id + ".ws", keel::Tensor::f32({}, {0.002f}));
    auto wz = m.g.constant(id + ".wz", keel::Tensor::from_vector<int8_t>(DType::kI8, {}, {0}));
    auto wd = m.g.op1("DequantizeLinear", {w, ws, wz});
    auto b = m.weights(id + ".b", {cout}, 0.05f);
    return m.g.op1(
        "Relu", {m.g.op1("Conv", {x, wd, b},
                         {{"kernel_shape", Attribute::of_ints({3, 3})}, {"pads", Attribute::of_ints({1, 1, 1, 1})}})});
  };
  auto x = m.g.input("x", DType::kF32, {1, 32, 28, 28});
  auto h = qconv(qdq(x, 0.02f), 32, 64);
  h = qconv(qdq(h, 0.02f), 64, 64);
  return m.bytes(qdq(h, 0.02f));
}

// SimpleCNN as `keel quantize` leaves it: the image and the classifier's input quantized, weights int8.
std::string int8_cnn_model() {
  ModelBuilder m("int8_cnn");
  auto qdq = [&](const std::string& v, float scale, uint8_t zero) {
    auto s = m.g.constant("s" + std::to_string(m.seed++), keel::Tensor::f32({}, {scale}));
    auto z = m.g.constant("z" + std::to_string(m.seed++), keel::Tensor::from_vector<uint8_t>(DType::kU8, {}, {zero}));
    return m.g.op1("DequantizeLinear", {m.g.op1("QuantizeLinear", {v, s, z}), s, z});
  };
  auto wq = [&](const std::string& id, keel::Shape shape, float ws) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    std::vector<float> wf = random_values(n, 60.f, m.seed++);
    std::vector<int8_t> q(n);
    for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::max(-127.f, std::min(127.f, std::round(wf[i]))));
    auto w = m.g.constant(id + ".w", keel::Tensor::from_vector<int8_t>(DType::kI8, shape, q));
    auto s = m.g.constant(id + ".ws", keel::Tensor::f32({}, {ws}));
    auto z = m.g.constant(id + ".wz", keel::Tensor::from_vector<int8_t>(DType::kI8, {}, {0}));
    return m.g.op1("DequantizeLinear", {w, s, z});
  };
  auto x = m.g.input("x", DType::kF32, {4, 1, 28, 28});
  auto h = m.g.op1(
      "Relu", {m.g.op1("Conv", {qdq(x, 0.02f, 128), wq("c", {32, 1, 3, 3}, 0.004f), m.weights("c.b", {32}, 0.05f)})});
  h = m.g.op1("MaxPool", {h}, {{"kernel_shape", Attribute::of_ints({2, 2})}, {"strides", Attribute::of_ints({2, 2})}});
  h = m.g.op1("Flatten", {h});
  return m.bytes(m.g.op1("Gemm", {qdq(h, 0.01f, 0), wq("g", {10, 32 * 13 * 13}, 0.001f), m.weights("g.b", {10}, 0.1f)},
                         {{"transB", Attribute::of_int(1)}}));
}

class SessionThreads : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    keel_environment_options_t o = nullptr;
    ASSERT_KEEL_OK(keel_environment_options_create(&o));
#ifdef KEEL_PLUGIN_DIR_DEFAULT
    ASSERT_KEEL_OK(keel_environment_options_add_plugin_path(o, KEEL_PLUGIN_DIR_DEFAULT));
#endif
    ASSERT_KEEL_OK(keel_environment_options_set_threads(o, 2));
    ASSERT_KEEL_OK(keel_environment_create(o, &env_));
    keel_environment_options_release(o);
  }
  void TearDown() override {
    if (session_) keel_session_release(session_);
    if (model_) keel_model_release(model_);
    if (env_) keel_environment_release(env_);
    for (auto t : inputs_) keel_host_tensor_release(t);
  }

  bool plugin_loaded(const char* name) {
    size_t n = 0;
    if (!take(keel_environment_plugin_count(env_, &n)).empty()) return false;
    for (size_t i = 0; i < n; ++i) {
      keel_plugin_info_t info{};
      info.struct_size = sizeof(info);
      if (take(keel_environment_plugin_info(env_, i, &info)).empty() && std::strcmp(info.name, name) == 0)
        return info.state == KEEL_PLUGIN_STATE_LOADED;
    }
    return false;
  }

  // Loads `bytes`, creates the session on this thread (session threads: `threads`) and random inputs.
  void create(const std::string& bytes, int32_t threads, bool int8) {
    ASSERT_KEEL_OK(keel_model_load_from_memory(bytes.data(), bytes.size(), &model_));
    keel_session_options_t so = nullptr;
    ASSERT_KEEL_OK(keel_session_options_create(&so));
    if (threads > 0) {
      ASSERT_KEEL_OK(keel_session_options_set_threads(so, threads));
    }
    if (int8 && plugin_loaded("quantize_int8")) {
      ASSERT_KEEL_OK(keel_session_options_add_pass(so, "fuse_qdq"));
    }
    const std::string st = take(keel_session_create(env_, model_, so, &session_));
    keel_session_options_release(so);
    ASSERT_EQ(st, "");
    size_t n = 0;
    ASSERT_KEEL_OK(keel_session_input_count(session_, &n));
    for (size_t i = 0; i < n; ++i) {
      keel_value_info_t vi{};
      vi.struct_size = sizeof(vi);
      ASSERT_KEEL_OK(keel_session_input_info(session_, i, &vi));
      names_.push_back(vi.name);
      std::vector<int64_t> dims(vi.dims, vi.dims + vi.ndim);
      size_t count = 1;
      for (int64_t d : dims) count *= static_cast<size_t>(d);
      auto values = random_values(count, 1.f, 1000 + static_cast<uint32_t>(i));
      keel_host_tensor_t t = nullptr;
      ASSERT_KEEL_OK(keel_host_tensor_create(KEEL_DTYPE_F32, dims.data(), static_cast<int32_t>(dims.size()),
                                             values.data(), values.size() * sizeof(float), &t));
      inputs_.push_back(t);
    }
    ASSERT_KEEL_OK(keel_session_output_count(session_, &outputs_));
  }

  // One run; the outputs' bytes concatenated ("" and a failure message on error).
  std::string run(std::string* error) {
    std::vector<const char*> names;
    for (auto& s : names_) names.push_back(s.c_str());
    std::vector<keel_host_tensor_t> out(outputs_, nullptr);
    *error =
        take(keel_session_run(session_, names.data(), inputs_.data(), inputs_.size(), nullptr, out.data(), out.size()));
    std::string bytes;
    for (auto t : out) {
      if (!t) continue;
      bytes.append(static_cast<const char*>(keel_host_tensor_data(t)), keel_host_tensor_byte_size(t));
      keel_host_tensor_release(t);
    }
    return bytes;
  }

  std::string model_bytes() {
    const std::string which = GetParam();
    if (which == "resnet") return resnet_model();
    if (which == "mobilenet") return mobilenet_model();
    if (which == "transformer") return transformer_model();
    if (which == "int8cnn") return int8_cnn_model();
    return int8_model();
  }

  keel_environment_t env_ = nullptr;
  keel_model_t model_ = nullptr;
  keel_session_t session_ = nullptr;
  std::vector<std::string> names_;
  std::vector<keel_host_tensor_t> inputs_;
  size_t outputs_ = 0;
};

// Created on this thread (default and 1 session thread), run here once, then from other threads one at a time.
TEST_P(SessionThreads, RunFromAnotherThreadEqualsTheCreatingThread) {
  for (int32_t threads : {0, 1}) {
    SCOPED_TRACE("session threads " + std::to_string(threads));
    TearDown();
    session_ = nullptr, model_ = nullptr, env_ = nullptr;
    names_.clear(), inputs_.clear();
    SetUp();
    ASSERT_NO_FATAL_FAILURE(create(model_bytes(), threads, std::string(GetParam()).rfind("int8", 0) == 0));
    std::string error;
    const std::string expected = run(&error);
    ASSERT_EQ(error, "");
    ASSERT_FALSE(expected.empty());
    for (int k = 0; k < kRunsPerThread; ++k) {
      std::string got, err;
      std::thread t([&] { got = run(&err); });
      t.join();
      ASSERT_EQ(err, "") << "run " << k << " from another thread";
      EXPECT_TRUE(got == expected) << "run " << k << " from another thread differs from the creating thread's";
    }
  }
}

// Several threads at once on one session (runs on one session are serialised inside): every output is the same.
TEST_P(SessionThreads, SeveralThreadsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(create(model_bytes(), 1, std::string(GetParam()).rfind("int8", 0) == 0));
  std::string error;
  const std::string expected = run(&error);
  ASSERT_EQ(error, "");
  std::atomic<int> mismatches{0}, failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < kRunsPerThread; ++k) {
        std::string err;
        const std::string got = run(&err);
        if (!err.empty()) failures.fetch_add(1);
        else if (got != expected) mismatches.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
}

// A warm session run from a fresh thread touches next to no memory of that thread's own: the oneDNN chains keep
// their primitives' scratchpads in the run's workspace (chain/builder.cc, bind_scratchpads), not in a thread-local
// buffer that every thread that ever ran the session grew and kept (ResNet-18: ~630 page faults, 2.5 MiB per thread
// in a server's HTTP thread pool). Counted as the thread's own minor page faults (getrusage RUSAGE_THREAD) over its
// first run; a sanitizer's shadow memory makes that count meaningless, so those builds skip.
TEST_P(SessionThreads, AFreshThreadsFirstRunFaultsInNoScratchpadOfItsOwn) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "page faults under a sanitizer count its shadow memory";
#endif
  ASSERT_NO_FATAL_FAILURE(create(model_bytes(), 1, std::string(GetParam()).rfind("int8", 0) == 0));
  std::string error;
  const std::string expected = run(&error);
  ASSERT_EQ(error, "");
  run(&error);  // warm: plans built, the run's workspace allocated and touched
  ASSERT_EQ(error, "");
  for (int k = 0; k < 3; ++k) {
    long faults = -1;
    std::string got, err;
    std::thread t([&] {
      struct rusage before {
      }, after{};
      getrusage(RUSAGE_THREAD, &before);
      got = run(&err);
      getrusage(RUSAGE_THREAD, &after);
      faults = after.ru_minflt - before.ru_minflt;
    });
    t.join();
    ASSERT_EQ(err, "");
    EXPECT_TRUE(got == expected);
    std::printf("[ %s ] fresh thread %d: %ld minor page faults in its first run\n", GetParam(), k, faults);
    EXPECT_LT(faults, 128) << "a fresh thread's first run faulted in " << faults << " pages (" << faults * 4
                           << " KiB) of its own";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, SessionThreads,
                         ::testing::Values("resnet", "mobilenet", "transformer", "int8", "int8cnn"),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

}  // namespace
