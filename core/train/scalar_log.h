// keel/core/train/scalar_log.h — scalar logs as JSON Lines, and curves drawn from them (SVG / HTML).
//
// Each record is one JSON object on one line: {"kind": "step"|"epoch"|..., "step": global step, "epoch": e,
// <name>: number, ...} ("loss", "accuracy", "lr", "img_per_s", "test_accuracy", ...). Lines are flushed as they are
// written, so a crashed or running job's log is readable, and `keel plot` can follow it.
//
// render_curves() draws one panel per (kind, scalar) with the step (or epoch) on the x axis: a self-contained SVG
// (no scripts, no external files). Lines that are not JSON objects are skipped and counted.
// Thread-safety: ScalarLogger::write is internally synchronised; the rest are thread-safe free functions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.h"

namespace keel::train {

class ScalarLogger {
 public:
  // Opens `file` for appending (append = true, e.g. a resumed run) or truncates it.
  static StatusOr<std::unique_ptr<ScalarLogger>> open(const std::filesystem::path& file, bool append = false);
  ~ScalarLogger();
  // Writes `record` (an object; "kind" is set to `kind`) as one line and flushes.
  Status write(const std::string& kind, nlohmann::json record);

 private:
  explicit ScalarLogger(std::FILE* f) : f_(f) {}
  std::mutex mu_;
  std::FILE* f_;
};

struct ScalarSeries {
  std::string kind, name;  // e.g. "step", "loss"
  std::string x_name;      // "step" or "epoch"
  std::vector<std::pair<double, double>> points;
};

struct ParsedLog {
  std::vector<ScalarSeries> series;  // in first-seen order
  int64_t records = 0, skipped_lines = 0;
};

// Groups the numeric fields of every record by (kind, field); x = "step" when present, else "epoch", else the line.
ParsedLog parse_scalar_log(const std::string& text);
StatusOr<ParsedLog> read_scalar_log(const std::filesystem::path& file);

// An SVG document with one panel per series (grid of `columns`), axes with ticks, the last value in each title.
std::string render_curves_svg(const ParsedLog& log, const std::string& title, int columns = 2);
// The same SVG inside a minimal HTML page.
std::string render_curves_html(const ParsedLog& log, const std::string& title, int columns = 2);

// Shared by the plot renderers (run_plot.cc too): text escaped for SVG/HTML, and a number as an axis or title shows
// it (scientific below 1e-3 and from 1e5, else 0-4 decimals by magnitude).
std::string html_escape(const std::string& text);
std::string plot_number(double v);

}  // namespace keel::train
