// keel/tests/common/mutate.h — the edits the mutation tests make to a valid text input (a plugin manifest, a serve
// config): 1 to 4 of them, each a byte replaced by one of `alphabet`, a span of up to 12 bytes deleted, a line
// duplicated, or the text cut short. Deterministic for a given generator state (tests print their seed).
#pragma once

#include <algorithm>
#include <random>
#include <string>

namespace keel::testing_util {

inline std::string mutated(std::string m, std::mt19937& rng, const std::string& alphabet) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !m.empty(); ++e) {
    const size_t at = rng() % m.size();
    switch (rng() % 4) {
      case 0: m[at] = alphabet[rng() % alphabet.size()]; break;
      case 1: m.erase(at, std::min<size_t>(m.size() - at, 1 + rng() % 12)); break;
      case 2: {
        const size_t nl = m.rfind('\n', at);
        const size_t bol = nl == std::string::npos ? 0 : nl + 1;
        const size_t next = m.find('\n', at);
        const size_t eol = next == std::string::npos ? m.size() : next + 1;
        m.insert(eol, m.substr(bol, eol - bol));
        break;
      }
      default: m.resize(at); break;
    }
  }
  return m;
}

}  // namespace keel::testing_util
