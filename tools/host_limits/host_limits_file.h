// Where keel-host-limits saves its measurements unless told otherwise, and where `keel bench` looks for them:
// $XDG_CACHE_HOME/keel/host_limits.json, else $HOME/.cache/keel/host_limits.json; empty when neither is set.
// Header-only (keel-host-limits links none of Keel's libraries); thread-safe as far as getenv is.
#pragma once

#include <cstdlib>
#include <filesystem>

namespace keel {

inline std::filesystem::path default_host_limits_file() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "keel/host_limits.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache/keel/host_limits.json";
  return {};
}

}  // namespace keel
