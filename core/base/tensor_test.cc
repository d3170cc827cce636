// keel/core/base/tensor_test.cc — host storage: alignment, zero fill, and the huge-page path of large allocations
// (core/base/tensor.h, Storage::allocate_host).
#include "core/base/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "tests/common/huge_pages.h"

namespace keel {
namespace {

bool all_zero(const void* p, uint64_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (uint64_t i = 0; i < n; ++i)
    if (b[i] != 0) return false;
  return true;
}

TEST(HostStorage, SmallAllocationsAre64ByteAlignedAndZeroed) {
  for (uint64_t n : {uint64_t{1}, uint64_t{63}, uint64_t{4096}, Storage::kHugePagesFrom - 64}) {
    auto s = Storage::allocate_host(n);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>((*s)->data()) % 64, 0u) << n;
    EXPECT_EQ((*s)->bytes(), n);
    EXPECT_TRUE(all_zero((*s)->data(), n)) << n;
  }
}

TEST(HostStorage, LargeAllocationsStartOnA2MiBBoundaryAndAreAdvisedAsHugePages) {
  const uint64_t n = Storage::kHugePagesFrom + 3 * 4096 + 8;  // not a multiple of anything in particular
  auto s = Storage::allocate_host(n);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const uintptr_t at = reinterpret_cast<uintptr_t>((*s)->data());
  EXPECT_EQ(at % (uintptr_t{2} << 20), 0u);
  EXPECT_TRUE(all_zero((*s)->data(), n));
  // Uninitialised large storage is writable end to end (the tail past the last whole 2 MiB page included).
  auto u = Storage::allocate_host(n, /*zero=*/false);
  ASSERT_TRUE(u.is_ok());
  std::memset((*u)->data(), 0x5a, n);
  EXPECT_EQ(static_cast<unsigned char*>((*u)->data())[n - 1], 0x5a);
  // Where the kernel has transparent huge pages, the range carries the advice (smaps' "hg" flag on its mapping).
  const bool advised = testing_util::huge_page_advised(at);
  const std::string mode = testing_util::thp_mode();
  if (testing_util::thp_off(mode))
    GTEST_SKIP() << "transparent huge pages are off here (" << mode << "): the advice is not visible";
  EXPECT_TRUE(advised) << "the 2 MiB-aligned storage's mapping lacks MADV_HUGEPAGE's flag";
}

}  // namespace
}  // namespace keel
