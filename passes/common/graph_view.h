// keel/passes/common/graph_view.h — the pass plugins' names for the SDK's graph layer.
//
// GraphView, PassError, run_pass, Report, PassOptions, HostTensor and the rest live in <keel/graph.hpp> (namespace
// keel::sdk), so that an out-of-tree pass gets what the in-tree ones use; this header only brings those names into
// keel::passes.
#pragma once

#include <keel/graph.hpp>
#include <keel/shape.hpp>

namespace keel::passes {

using sdk::Attrs;
using sdk::AttrValue;
using sdk::dtype_size;
using sdk::GraphView;
using sdk::HostTensor;
using sdk::numel;
using sdk::PassError;
using sdk::PassOptions;
using sdk::register_pass;
using sdk::Report;
using sdk::run_pass;
using sdk::throw_if_error;
using sdk::ValueType;

}  // namespace keel::passes
