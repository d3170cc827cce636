// keel/tools/keel/progress.h — a progress bar for long work (calibration, training epochs, conformance).
//
// On a terminal it redraws one line on stderr: `label [#######.......]  i/n  rate/s  eta  message`, at most every
// 100 ms. When stderr is not a terminal (logs, CI), it prints a plain line at every 10% and at the end instead, so
// logs stay readable. Disabled bars (quiet mode) print nothing.
//
// Thread-safety: one thread drives a bar; tick() and finish() are not synchronised.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace keel::cli {

class ProgressBar {
 public:
  // `total` steps (0 = unknown: shows a count and rate only); `unit` names a step in the rate ("img", "batch").
  ProgressBar(std::string label, int64_t total, std::string unit = "it", bool enabled = true);
  ~ProgressBar();  // finishes the line if finish() was not called
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Advances by `steps` and sets the text shown after the bar (e.g. "loss 0.412 acc 0.871").
  void tick(int64_t steps = 1, const std::string& message = {});
  void set_message(const std::string& message) { message_ = message; }
  // Draws the final state and ends the line. Further ticks are ignored.
  void finish(const std::string& message = {});

  int64_t done() const { return done_; }
  double elapsed_seconds() const;

 private:
  void draw(bool final_line);

  std::string label_, unit_, message_;
  int64_t total_ = 0, done_ = 0;
  bool enabled_ = true, tty_ = false, finished_ = false;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace keel::cli
