// plugins/cpu_onednn/chain/const_alloc_test.cc — the chains' constant allocator (chain/const_alloc.h): small copies
// ordinary, large ones on a 2 MiB boundary with the huge-page advice, both usable end to end.
#include "chain/const_alloc.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/common/huge_pages.h"

namespace keel::onednn::chain {
namespace {

TEST(ConstAlloc, SmallCopiesAreOrdinaryAndLargeOnesHugePageAligned) {
  std::vector<char, ConstAlloc<char>> small(1000, 'a');
  EXPECT_EQ(small.back(), 'a');
  const size_t n = (size_t{4} << 20) + 12345;
  std::vector<char, ConstAlloc<char>> large(n, 'b');
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ(large[n - 1], 'b');
  std::vector<char, ConstAlloc<char>> copy = large;  // copies and grows through the same allocator
  copy.resize(n * 2, 'c');
  EXPECT_EQ(copy[n - 1], 'b');
  EXPECT_EQ(copy[2 * n - 1], 'c');
  const std::string mode = testing_util::thp_mode();
  if (testing_util::thp_off(mode)) GTEST_SKIP() << "transparent huge pages are off here (" << mode << ")";
  EXPECT_TRUE(testing_util::huge_page_advised(reinterpret_cast<uintptr_t>(large.data())));
}

}  // namespace
}  // namespace keel::onednn::chain
