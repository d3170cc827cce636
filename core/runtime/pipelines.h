// keel/core/runtime/pipelines.h — the named pass pipelines shared by the C/C++ API and the `keel` command line.
//
// "auto" is what a session runs by default (keel_session_options_set_pipeline, `keel run --passes auto`): fuse_qdq on
// a quantised (QDQ) graph, else the default pipeline — as ONNX Runtime optimises a session by default. "none" runs
// none. Only passes whose plugin is loaded are named. Thread-safe (reads the registry).
#pragma once

#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/registry.h"
#include "core/base/status.h"

namespace keel {

// Every pass of the default pipeline, in order, installed or not: canonicalise, fold BatchNormalization, fuse, clean
// up (what `keel optimize` runs without --passes/--config).
const std::vector<std::string>& default_pipeline_passes();
// The default pipeline's passes registered in `registry`; the others are appended to `missing` when given.
std::vector<std::string> default_pass_pipeline(const Registry& registry, std::vector<std::string>* missing = nullptr);
// The "auto" pipeline for `graph`: fuse_qdq (where installed) when the graph has DequantizeLinear nodes, else the
// default pipeline.
std::vector<std::string> auto_pass_pipeline(const Graph& graph, const Registry& registry);
// "auto" or "none" (INVALID_ARGUMENT naming the value otherwise).
StatusOr<std::vector<std::string>> named_pass_pipeline(const std::string& name, const Graph& graph,
                                                       const Registry& registry);

}  // namespace keel
