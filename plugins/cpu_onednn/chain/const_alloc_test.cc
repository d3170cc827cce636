// plugins/cpu_onednn/chain/const_alloc_test.cc — the chains' constant allocator (chain/const_alloc.h): small copies as
// std::allocator's, large ones on a 2 MiB boundary with the huge-page advice, both usable end to end.
#include "chain/const_alloc.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace keel::onednn::chain {
namespace {

// Whether the mapping holding `at` carries MADV_HUGEPAGE's flag ("hg" among smaps' VmFlags).
bool advised(uintptr_t at) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_range = false;
  while (std::getline(smaps, line)) {
    if (std::isxdigit(static_cast<unsigned char>(line[0])) && line.find('-') != std::string::npos) {
      const size_t dash = line.find('-'), space = line.find(' ');
      const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      in_range = lo <= at && at < hi;
    } else if (in_range && line.rfind("VmFlags:", 0) == 0) {
      return line.find(" hg") != std::string::npos;
    }
  }
  return false;
}

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
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  if (mode.empty() || mode.find("[never]") != std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off here (" << mode << ")";
  EXPECT_TRUE(advised(reinterpret_cast<uintptr_t>(large.data())));
}

}  // namespace
}  // namespace keel::onednn::chain
