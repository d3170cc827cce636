// keel/tests/common/huge_pages.h — what the kernel says of transparent huge pages, for the tests of allocations that
// ask for them (core's Storage::allocate_host, the cpu_onednn plugin's constant copies).
#pragma once

#include <cctype>
#include <cstdint>
#include <fstream>
#include <string>

namespace keel::testing_util {

// Whether the mapping holding address `at` carries MADV_HUGEPAGE's advice ("hg" among /proc/self/smaps' VmFlags).
inline bool huge_page_advised(uintptr_t at) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in_range = false;
  while (std::getline(smaps, line)) {
    const size_t dash = line.find('-'), space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && std::isxdigit(static_cast<unsigned char>(line[0]))) {
      const uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      in_range = lo <= at && at < hi;
    } else if (in_range && line.rfind("VmFlags:", 0) == 0) {
      return line.find(" hg") != std::string::npos;
    }
  }
  return false;
}

// The kernel's transparent huge page mode ("always [madvise] never"); empty when it cannot be read.
inline std::string thp_mode() {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(thp, mode);
  return mode;
}

// Whether the advice cannot show here: transparent huge pages off or unknown.
inline bool thp_off(const std::string& mode) { return mode.empty() || mode.find("[never]") != std::string::npos; }

}  // namespace keel::testing_util
