// keel/core/base/pass_manager.h — ordered pipelines of graph passes.
//
// A pipeline is a list of (pass name, options). It comes from code, from CLI flags ("a,b:key=value,c") or from TOML:
//
//   [[pass]]
//   name = "fold_constants"
//   [pass.options]
//   max_bytes = 1048576
//
// PassManager::run looks every pass up in the Registry (passes are plugins), runs them in order on the graph
// through the C graph API, and returns one report per pass (nodes before/after, counters, notes, status). A pass
// that fails stops the pipeline; the graph is then restored to what it was before that pass.
// Thread-safety: run() mutates only the graph it is given; separate graphs may be processed concurrently.
#pragma once

#include <keel/plugin.h>

#include <map>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/options.h"
#include "core/base/registry.h"
#include "core/base/status.h"

namespace keel {

struct PassSpec {
  std::string name;
  Options options;
};

struct PassReport {
  std::string pass;
  size_t nodes_before = 0;
  size_t nodes_after = 0;
  std::map<std::string, int64_t> counters;
  std::vector<std::string> notes;
  Status status;
  double milliseconds = 0;
};

// "a,b,c" -> three specs; "a:key=value:key2=value2,b" gives `a` options (true/false, integers and numbers are typed,
// anything else is a string). Empty names and options that are not key=value are errors.
StatusOr<std::vector<PassSpec>> parse_pipeline_list(const std::string& list);
// Parses the TOML form above (from text; `origin` names it in errors).
StatusOr<std::vector<PassSpec>> parse_pipeline_toml(const std::string& text, const std::string& origin);

class PassManager {
 public:
  // `api` is the C graph API the passes see (the runtime's, with evaluation support).
  PassManager(const Registry& registry, const keel_graph_api_t* api) : registry_(registry), api_(api) {}

  // Runs the pipeline on `graph` through `view` (a keel_graph_t wrapping `graph`). Unknown pass names fail before
  // anything runs, naming the passes that exist.
  StatusOr<std::vector<PassReport>> run(Graph& graph, keel_graph_t* view, const std::vector<PassSpec>& pipeline,
                                        const std::string& target_device) const;

 private:
  const Registry& registry_;
  const keel_graph_api_t* api_;
};

}  // namespace keel
