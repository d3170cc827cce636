#include "core/base/log.h"

#include <algorithm>

namespace keel::log {
namespace {
thread_local const Target* t_current = nullptr;

int32_t keel_level(spdlog::level::level_enum level) {
  return std::clamp(static_cast<int32_t>(level), 0, 4);  // trace..err; critical counts as error
}
}  // namespace

void Target::write(int32_t level, const std::string& message) const {
  if (!fn_ || level < min_level_) return;
  std::lock_guard<std::mutex> lock(mu_);
  try {
    fn_(level, message);
  } catch (...) {
    // A host callback must not throw through Keel; drop the message.
  }
}

Scope::Scope(const Target* target) : previous_(t_current) { t_current = target; }
Scope::~Scope() { t_current = previous_; }

const Target* current() { return t_current; }

spdlog::logger* default_logger() {
  static const bool built = (spdlog::default_logger_raw() != nullptr);
  (void)built;
  return spdlog::default_logger_raw();
}

bool enabled(spdlog::level::level_enum level) {
  if (const Target* t = t_current; t != nullptr && t->has_callback()) return keel_level(level) >= t->min_level();
  return default_logger()->should_log(level);
}

void write(spdlog::level::level_enum level, std::string_view message, const Target* target) {
  if (target == nullptr) target = t_current;
  if (target != nullptr && target->has_callback()) {
    target->write(keel_level(level), std::string(message));
    return;
  }
  default_logger()->log(level, "{}", message);
}

}  // namespace keel::log
