// keel/core/train/run_plot.h — several training runs on one page (`keel plot RUN...`): their records side by side,
// every scalar curve with one line per run, and the parameter and gradient histograms of every epoch (VisualDL's
// "parameter distributions": one ridge line per epoch, later epochs darker).
//
// A run is given as a directory (holding run.json), a run.json, or a scalar log (.jsonl). run.json names its log
// ("log", relative to run.json's directory when relative); a log alone is a run without a record.
// The page is self-contained HTML with inline SVG (no scripts, no external files).
// Errors: Status naming the path. Thread-safety: thread-safe free functions.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "core/base/status.h"
#include "core/train/scalar_log.h"

namespace keel::train {

struct RunView {
  std::string label;             // the run's directory name, or the log's file name
  std::filesystem::path source;  // what was given
  nlohmann::json record;         // run.json (null when the run has none)
  ParsedLog log;                 // its scalar log (empty when it has none)
  // The log's "histograms" records in order: {"epoch", "params": {name: H}, "grads": {name: H}}.
  std::vector<nlohmann::json> histograms;
};

StatusOr<RunView> load_run(const std::filesystem::path& path);
// The "histograms" records of a log's text.
std::vector<nlohmann::json> parse_histogram_records(const std::string& log_text);
std::string render_runs_html(const std::vector<RunView>& runs, const std::string& title, int columns = 2);

}  // namespace keel::train
