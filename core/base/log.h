// keel/core/base/log.h — Keel's own log: messages are routed to the environment they belong to.
//
// Keel's code logs through keel::log (never spdlog's free functions). A message goes to the log target of the
// environment the logging thread is working for — set with a log::Scope by the C API's entry points (environment
// and session creation, runs, ...) and by the plugin host table for a plugin's messages — when that target has a
// callback; then nothing else sees it (no spdlog logger is touched). Without one (no scope on the thread, or an
// environment without a callback: the `keel` command line, C++ tools), the message goes to spdlog's default logger,
// as before, at its level.
//
// Thread-safety: everything here may be called from any thread. A Target's callback is called one call at a time
// (the target's mutex), from the thread that logs.
#pragma once

#include <spdlog/spdlog.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace keel::log {

// One environment's log target: a callback and the lowest level it receives (keel_log_level_t: 0 trace .. 4 error).
class Target {
 public:
  using Callback = std::function<void(int32_t level, const std::string& message)>;
  Target(Callback fn, int32_t min_level) : fn_(std::move(fn)), min_level_(min_level) {}
  bool has_callback() const { return static_cast<bool>(fn_); }
  int32_t min_level() const { return min_level_; }
  // Calls the callback (serialised) when level >= min_level; exceptions of the callback are swallowed.
  void write(int32_t level, const std::string& message) const;

 private:
  Callback fn_;
  int32_t min_level_;
  mutable std::mutex mu_;
};

// While a Scope lives, the thread's messages go to `target` (nullptr: to spdlog's default logger). Scopes nest.
class Scope {
 public:
  explicit Scope(const Target* target);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const Target* previous_;
};

// The calling thread's target (nullptr when none).
const Target* current();
// spdlog's default logger (spdlog::default_logger_raw()), its registry first built under a guard of Keel's own code:
// libspdlog holds the registry in a function-local static whose guard check is inlined there, uninstrumented, so under
// ThreadSanitizer a thread that found the registry built by another read the logger with no happens-before TSan could
// see (a false data race on the logger's level, two ranks' first warnings at once, 2026-12-05).
spdlog::logger* default_logger();
// Whether a message of `level` would go anywhere (cheap; check before formatting).
bool enabled(spdlog::level::level_enum level);
// Routes one formatted message: to `target` (or current()) when it has a callback, else to spdlog's default logger.
void write(spdlog::level::level_enum level, std::string_view message, const Target* target = nullptr);

template <typename... Args>
void log(spdlog::level::level_enum level, spdlog::format_string_t<Args...> fmt, Args&&... args) {
  if (!enabled(level)) return;
  write(level, fmt::format(fmt, std::forward<Args>(args)...));
}
template <typename... Args>
void trace(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  log(spdlog::level::trace, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  log(spdlog::level::debug, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  log(spdlog::level::info, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  log(spdlog::level::warn, fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  log(spdlog::level::err, fmt, std::forward<Args>(args)...);
}

}  // namespace keel::log
