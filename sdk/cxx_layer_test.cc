// sdk/cxx_layer_test.cc — the SDK's header-only C++ layer for plugins (keel/kernel.hpp, keel/shape.hpp,
// keel/graph.hpp), built as C++17 against the SDK alone (sdk/CMakeLists.txt): the geometry against ONNX's
// definitions, saturating counts, the kernel context over a fake kernel API, and guard()'s statuses.
#include <keel/graph.hpp>
#include <keel/kernel.hpp>
#include <keel/shape.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#if __cplusplus != 201703L
#error "this test checks that the SDK's C++ layer compiles as C++17"
#endif

namespace {

using keel::sdk::AutoPad;
using keel::sdk::Dims;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(SdkShape, NumelSaturatesAndZeroWins) {
  EXPECT_EQ(keel::sdk::numel(Dims{}), 1);
  EXPECT_EQ(keel::sdk::numel(Dims{2, 3, 4}), 24);
  EXPECT_EQ(keel::sdk::numel(Dims{kMax / 2, 3}), kMax);
  EXPECT_EQ(keel::sdk::numel(Dims{kMax, kMax, 0}), 0);  // a zero anywhere: empty, even past an overflow
  EXPECT_EQ(keel::sdk::mul_sat(-kMax, 2), kMax);
  EXPECT_EQ(keel::sdk::mul_sat(-3, 4), -12);
  const int64_t dims[] = {2, 5};
  keel_tensor_t t{};
  t.ndim = 2;
  t.dims = dims;
  EXPECT_EQ(keel::sdk::numel(t), 10);
  t.ndim = -1;
  EXPECT_EQ(keel::sdk::numel(t), 0);
}

TEST(SdkShape, DtypeSizeAndDimsStr) {
  EXPECT_EQ(keel::sdk::dtype_size(KEEL_DTYPE_F32), 4u);
  EXPECT_EQ(keel::sdk::dtype_size(KEEL_DTYPE_BF16), 2u);
  EXPECT_EQ(keel::sdk::dtype_size(KEEL_DTYPE_I64), 8u);
  EXPECT_EQ(keel::sdk::dtype_size(KEEL_DTYPE_BOOL), 1u);
  EXPECT_EQ(keel::sdk::dtype_size(KEEL_DTYPE_STRING), 0u);
  EXPECT_EQ(keel::sdk::dims_str({1, 3, 224}), "[1,3,224]");
  EXPECT_EQ(keel::sdk::dims_str({}), "[]");
}

TEST(SdkShape, AutoPadNames) {
  EXPECT_EQ(keel::sdk::auto_pad_of(""), AutoPad::kNotSet);
  EXPECT_EQ(keel::sdk::auto_pad_of("NOTSET"), AutoPad::kNotSet);
  EXPECT_EQ(keel::sdk::auto_pad_of("VALID"), AutoPad::kValid);
  EXPECT_EQ(keel::sdk::auto_pad_of("SAME_UPPER"), AutoPad::kSameUpper);
  EXPECT_EQ(keel::sdk::auto_pad_of("SAME_LOWER"), AutoPad::kSameLower);
  EXPECT_EQ(keel::sdk::auto_pad_of("same_upper"), AutoPad::kUnknown);
}

// ONNX: with SAME_*, the output has ceil(in / stride) positions, and the odd pad goes to the end (UPPER) or the
// begin (LOWER).
TEST(SdkShape, SamePadsKeepCeilInOverStride) {
  for (AutoPad a : {AutoPad::kSameUpper, AutoPad::kSameLower})
    for (int64_t in = 1; in <= 20; ++in)
      for (int64_t k = 1; k <= 5; ++k)
        for (int64_t d = 1; d <= 3; ++d)
          for (int64_t s = 1; s <= 4; ++s) {
            const int64_t eff = keel::sdk::dilated_extent(k, d);
            int64_t b = -1, e = -1;
            keel::sdk::same_pads(a, in, eff, s, &b, &e);
            ASSERT_GE(b, 0);
            ASSERT_GE(e, 0);
            ASSERT_EQ(a == AutoPad::kSameUpper ? e - b : b - e, (b + e) % 2) << in << " " << k << " " << s;
            ASSERT_EQ(keel::sdk::window_output(in, b + e, eff, s), (in + s - 1) / s) << in << " " << k << " " << s;
          }
  int64_t b = -1, e = -1;
  keel::sdk::same_pads(AutoPad::kSameUpper, 6, 4, 1, &b, &e);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(e, 2);
  keel::sdk::same_pads(AutoPad::kSameLower, 6, 4, 1, &b, &e);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(e, 1);
  keel::sdk::same_pads(AutoPad::kValid, 6, 4, 1, &b, &e);
  EXPECT_EQ(b + e, 0);
}

TEST(SdkShape, WindowOutput) {
  EXPECT_EQ(keel::sdk::window_output(5, 0, 3, 1), 3);
  EXPECT_EQ(keel::sdk::window_output(7, 0, 2, 2), 3);
  EXPECT_EQ(keel::sdk::window_output(7, 0, 2, 2, true), 4);  // ceil_mode
  EXPECT_EQ(keel::sdk::window_output(2, 0, 3, 1), -1);       // the window does not fit
  EXPECT_EQ(keel::sdk::window_output(2, 1, 3, 1), 1);
}

TEST(SdkShape, TransposedGeometry) {
  // ConvTranspose in 3, stride 2, kernel 3: the full output is 7.
  EXPECT_EQ(keel::sdk::transposed_extent(3, 2, 0, 3), 7);
  EXPECT_EQ(keel::sdk::transposed_extent(3, 2, 1, keel::sdk::dilated_extent(3, 2)), 10);
  int64_t b = 0, e = 0;
  keel::sdk::transposed_pads(AutoPad::kSameUpper, 3, &b, &e);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(e, 2);
  keel::sdk::transposed_pads(AutoPad::kSameLower, 3, &b, &e);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(e, 1);
  keel::sdk::transposed_pads(AutoPad::kNotSet, -3, &b, &e);  // output_shape larger than the full output
  EXPECT_EQ(b, -1);
  EXPECT_EQ(e, -2);
}

// ------------------------------------------------------------------------------------------------ a fake core

struct FakeStatus : keel_status_s {
  std::string text;
};
keel_status_t fake_status_create(int32_t code, const char* message) {
  auto* s = new FakeStatus;
  s->struct_size = sizeof(keel_status_s);
  s->code = code;
  s->text = message ? message : "";
  s->message = s->text.c_str();
  s->release = [](keel_status_s* self) { delete static_cast<FakeStatus*>(self); };
  return s;
}

struct FakeCtx {
  std::vector<keel_tensor_t> inputs;
  std::map<std::string, int64_t> ints;
  std::vector<int64_t> pads{1, 2, 3, 4};
  bool fail_output = false;
};
FakeCtx* fake(const keel_kernel_context_t* c) {
  return reinterpret_cast<FakeCtx*>(const_cast<keel_kernel_context_t*>(c));
}

keel_kernel_api_t fake_kernel_api() {
  keel_kernel_api_t api{};
  api.struct_size = sizeof api;
  api.input_count = [](const keel_kernel_context_t* c) { return static_cast<int32_t>(fake(c)->inputs.size()); };
  api.input = [](const keel_kernel_context_t* c, int32_t i) -> const keel_tensor_t* {
    auto& in = fake(c)->inputs;
    return i >= 0 && i < static_cast<int32_t>(in.size()) && in[i].struct_size ? &in[i] : nullptr;
  };
  api.output_count = [](const keel_kernel_context_t*) { return 1; };
  api.output = [](keel_kernel_context_t* c, int32_t, int32_t, const int64_t*, keel_tensor_t**) -> keel_status_t {
    return fake(c)->fail_output ? fake_status_create(KEEL_STATUS_OUT_OF_MEMORY, "no room") : nullptr;
  };
  api.output_dtype = [](const keel_kernel_context_t*, int32_t) { return static_cast<int32_t>(KEEL_DTYPE_F32); };
  api.attr_int = [](const keel_kernel_context_t* c, const char* n, int64_t* v) {
    auto it = fake(c)->ints.find(n);
    if (it == fake(c)->ints.end()) return 0;
    *v = it->second;
    return 1;
  };
  api.attr_float = [](const keel_kernel_context_t*, const char*, float*) { return 0; };
  api.attr_string = [](const keel_kernel_context_t*, const char* n, const char** v) {
    if (std::strcmp(n, "auto_pad") != 0) return 0;
    *v = "SAME_LOWER";
    return 1;
  };
  api.attr_ints = [](const keel_kernel_context_t* c, const char* n, const int64_t** v, size_t* count) {
    if (std::strcmp(n, "pads") != 0) return 0;
    *v = fake(c)->pads.data();
    *count = fake(c)->pads.size();
    return 1;
  };
  api.attr_floats = [](const keel_kernel_context_t*, const char*, const float**, size_t*) { return 0; };
  return api;
}

TEST(SdkKernel, ContextReadsThroughTheApi) {
  const keel_kernel_api_t api = fake_kernel_api();
  FakeCtx f;
  const int64_t dims[] = {2, -1};
  float value = 1.5f;
  keel_tensor_t x{};
  x.struct_size = sizeof x;
  x.dtype = KEEL_DTYPE_F32;
  x.ndim = 2;
  x.dims = dims;
  x.data = &value;
  f.inputs = {x, keel_tensor_t{}};
  f.ints["group"] = 4;
  keel::sdk::KernelContext c(reinterpret_cast<keel_kernel_context_t*>(&f), &api);
  EXPECT_EQ(c.input_count(), 2);
  EXPECT_TRUE(c.has_input(0));
  EXPECT_FALSE(c.has_input(1));  // absent optional input
  EXPECT_FALSE(c.has_input(7));  // out of range
  EXPECT_EQ(c.dims(0), (Dims{2, -1}));
  EXPECT_TRUE(c.rank_known(0));
  EXPECT_FALSE(c.dims_known(0));
  EXPECT_TRUE(c.is_constant(0));
  EXPECT_EQ(*c.data<float>(0), 1.5f);
  EXPECT_EQ(c.dtype(1), KEEL_DTYPE_UNDEFINED);
  EXPECT_EQ(c.attr_i("group", 1), 4);
  EXPECT_EQ(c.attr_i("axis", -1), -1);
  EXPECT_FALSE(c.attr_i_opt("axis").has_value());
  EXPECT_EQ(c.attr_s("auto_pad", "NOTSET"), "SAME_LOWER");
  EXPECT_EQ(c.attr_ints("pads", {}), (Dims{1, 2, 3, 4}));
  EXPECT_EQ(c.attr_ints("strides", {1, 1}), (Dims{1, 1}));
  EXPECT_TRUE(c.has_attr("pads"));
  EXPECT_FALSE(c.has_attr("strides"));
  EXPECT_TRUE(c.attr_floats("scales").empty());
  EXPECT_EQ(c.attr_tensor("value"), nullptr);  // attr_tensor is NULL in this table
  EXPECT_EQ(c.opset(), 0);                     // so is opset
  EXPECT_STREQ(c.node_name(), "");
  f.fail_output = true;
  try {
    c.output(0, {2});
    FAIL() << "output should have thrown";
  } catch (const keel::sdk::Failure& e) {
    EXPECT_EQ(e.code, KEEL_STATUS_OUT_OF_MEMORY);
    EXPECT_EQ(e.message, "no room");
  }
}

TEST(SdkKernel, ParallelForRunsSeriallyWithoutAPoolAndRethrows) {
  const keel_kernel_api_t api = fake_kernel_api();  // parallel_for NULL: runs in one chunk
  FakeCtx f;
  keel::sdk::KernelContext c(reinterpret_cast<keel_kernel_context_t*>(&f), &api);
  int64_t seen = 0;
  c.parallel_for(100, 1, [&](int64_t b, int64_t e) { seen += e - b; });
  EXPECT_EQ(seen, 100);
  EXPECT_THROW(c.parallel_for(10, 1, [](int64_t, int64_t) { throw keel::sdk::Reject{"no"}; }), keel::sdk::Reject);
}

std::pair<int32_t, std::string> run_guard(keel::sdk::Stage stage, void (*body)()) {
  keel_core_api_t host{};
  host.struct_size = sizeof host;
  host.status_create = fake_status_create;
  keel_status_t st = keel::sdk::guard(&host, stage, body, "k: ");
  if (st == nullptr) return {KEEL_STATUS_OK, ""};
  std::pair<int32_t, std::string> r{st->code, st->message};
  keel_status_release(st);
  return r;
}

TEST(SdkKernel, GuardTurnsExceptionsIntoStatuses) {
  using keel::sdk::Stage;
  using R = std::pair<int32_t, std::string>;
  EXPECT_EQ(run_guard(Stage::kCompute, [] {}), (R{KEEL_STATUS_OK, ""}));
  EXPECT_EQ(run_guard(Stage::kCompute, [] { throw keel::sdk::Reject{"rank 7"}; }),
            (R{KEEL_STATUS_UNIMPLEMENTED, "k: rank 7"}));
  EXPECT_EQ(run_guard(Stage::kCompute,
                      [] {
                        throw keel::sdk::Failure{KEEL_STATUS_INVALID_ARGUMENT, "bad"};
                      }),
            (R{KEEL_STATUS_INVALID_ARGUMENT, "k: bad"}));
  EXPECT_EQ(run_guard(Stage::kCreate,
                      [] {
                        throw keel::sdk::Failure{KEEL_STATUS_INVALID_ARGUMENT, "bad"};
                      }),
            (R{KEEL_STATUS_UNIMPLEMENTED, "k: bad"}));  // at create everything is a rejection
  EXPECT_EQ(run_guard(Stage::kCompute, [] { throw std::runtime_error("boom"); }), (R{KEEL_STATUS_INTERNAL, "k: boom"}));
  EXPECT_EQ(run_guard(Stage::kCreate, [] { throw std::runtime_error("boom"); }),
            (R{KEEL_STATUS_UNIMPLEMENTED, "k: create failed: boom"}));
  EXPECT_EQ(run_guard(Stage::kCompute, [] { throw std::bad_alloc(); }),
            (R{KEEL_STATUS_OUT_OF_MEMORY, "k: host allocation failed"}));
  EXPECT_EQ(run_guard(Stage::kCompute, [] { throw 42; }), (R{KEEL_STATUS_INTERNAL, "k: unknown exception"}));
  EXPECT_EQ(run_guard(Stage::kCreate, [] { throw 42; }),
            (R{KEEL_STATUS_UNIMPLEMENTED, "k: create failed: unknown exception"}));
}

TEST(SdkKernel, GuardTranslatesLibraryExceptions) {
  keel_core_api_t host{};
  host.status_create = fake_status_create;
  auto translate = [](keel::sdk::Stage, keel::sdk::Outcome* o) {
    try {
      throw;
    } catch (const std::out_of_range& e) {
      *o = {KEEL_STATUS_OUT_OF_RANGE, std::string("lib: ") + e.what()};
      return true;
    } catch (...) {
      return false;
    }
  };
  keel_status_t st = keel::sdk::guard(
      &host, keel::sdk::Stage::kCompute, [] { throw std::out_of_range("index"); }, std::string(), translate);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->code, KEEL_STATUS_OUT_OF_RANGE);
  EXPECT_STREQ(st->message, "lib: index");
  keel_status_release(st);
  st = keel::sdk::guard(
      &host, keel::sdk::Stage::kCompute, [] { throw std::runtime_error("other"); }, std::string(), translate);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->code, KEEL_STATUS_INTERNAL);
  keel_status_release(st);
}

}  // namespace
