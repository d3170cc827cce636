#include "core/base/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/base/tensor.h"

namespace keel {
namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_EQ(dtype_size(DType::kU64), 8u);
  EXPECT_STREQ(dtype_name(DType::kF16), "f16");
  EXPECT_EQ(dtype_from_name("float16"), DType::kF16);
  EXPECT_EQ(dtype_from_name("i64"), DType::kI64);
  EXPECT_FALSE(dtype_from_name("complex64").has_value());
  EXPECT_TRUE(dtype_is_valid(16));
  EXPECT_FALSE(dtype_is_valid(14));
}

TEST(DType, HalfRoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t x = static_cast<uint16_t>(h);
    float f = f16_to_f32(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), x) << "half 0x" << std::hex << h;
  }
}

TEST(DType, HalfRoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);                // overflow -> inf
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // halfway, rounds to even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  EXPECT_EQ(f32_to_f16(5.96e-8f), 0x0001);  // smallest subnormal
}

TEST(DType, BFloat16) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Tensor, CheckedByteSizeRefusesHugeAndNegativeShapes) {
  EXPECT_EQ(checked_byte_size(DType::kF32, {2, 3}).value(), 24u);
  EXPECT_FALSE(checked_byte_size(DType::kF32, {-1, 3}).is_ok());
  EXPECT_FALSE(checked_byte_size(DType::kF32, {1000000, 1000000, 1000000}).is_ok());
  EXPECT_FALSE(checked_byte_size(DType::kF64, {int64_t{1} << 62, 4}).is_ok());
}

TEST(Tensor, HostCloneReshape) {
  Tensor t = Tensor::f32({2, 2}, {1, 2, 3, 4});
  auto c = t.clone().value();
  c.data<float>()[0] = 9;
  EXPECT_EQ(t.data<float>()[0], 1);
  auto r = t.reshaped({4}).value();
  EXPECT_EQ(r.data<float>()[3], 4);
  EXPECT_FALSE(t.reshaped({3}).is_ok());
  EXPECT_EQ(t.describe(), "f32[2, 2] on cpu:0");
}

}  // namespace
}  // namespace keel
