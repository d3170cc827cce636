#include "tools/keel/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace keel::cli {
namespace {

std::string format_seconds(double s) {
  char buf[32];
  if (s < 0 || s > 360000) return "--:--";
  int total = static_cast<int>(s + 0.5);
  if (total >= 3600) std::snprintf(buf, sizeof buf, "%d:%02d:%02d", total / 3600, total / 60 % 60, total % 60);
  else std::snprintf(buf, sizeof buf, "%02d:%02d", total / 60, total % 60);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, bool enabled)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 0)),
      enabled_(enabled),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
  if (!finished_) finish(message_);
}

double ProgressBar::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressBar::tick(int64_t steps, const std::string& message) {
  if (finished_) return;
  done_ += steps;
  if (!message.empty()) message_ = message;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (tty_) {
    if (now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    draw(false);
  } else if (total_ > 0) {
    int decile = static_cast<int>(10 * done_ / total_);
    if (decile > last_decile_ && decile < 10) {
      last_decile_ = decile;
      draw(false);
    }
  }
}

void ProgressBar::finish(const std::string& message) {
  if (finished_) return;
  finished_ = true;
  if (!message.empty()) message_ = message;
  if (enabled_) draw(true);
}

void ProgressBar::draw(bool final_line) {
  double secs = elapsed_seconds();
  double rate = secs > 0 ? static_cast<double>(done_) / secs : 0.0;
  std::string line = label_ + " ";
  if (total_ > 0) {
    constexpr int kWidth = 24;
    int filled = static_cast<int>(kWidth * std::min<int64_t>(done_, total_) / total_);
    line += "[" + std::string(filled, '#') + std::string(kWidth - filled, '.') + "] ";
    line += std::to_string(done_) + "/" + std::to_string(total_);
  } else {
    line += std::to_string(done_);
  }
  char buf[96];
  std::snprintf(buf, sizeof buf, "  %.1f %s/s", rate, unit_.c_str());
  line += buf;
  if (final_line) {
    line += "  " + format_seconds(secs);
  } else if (total_ > 0 && rate > 0) {
    line += "  eta " + format_seconds(static_cast<double>(total_ - done_) / rate);
  }
  if (!message_.empty()) line += "  " + message_;
  if (tty_) {
    std::fprintf(stderr, "\r%s\033[K%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace keel::cli
