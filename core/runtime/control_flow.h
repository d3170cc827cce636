// keel/core/runtime/control_flow.h — (internal) the ops the executor runs itself: control flow (If, Loop, Scan,
// SequenceMap), sequences (SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceAt, SequenceErase,
// SequenceLength, SplitToSequence, ConcatFromSequence), optionals (Optional, OptionalHasElement,
// OptionalGetElement) and Identity of a sequence or optional.
//
// They route values rather than compute, so they need no device kernel and no plugin ABI: they run on the host,
// between kernel steps (the session copies device inputs to the host first). A nested graph (a branch or a body)
// becomes a child Session built once, at session creation, with the enclosing session's device order, fallback and
// threads: its nodes are placed and run by the same kernels as the main graph. Values the nested graph reads from
// enclosing graphs (its outer-scope reads, graph.h) become inputs of the child session — or initializers, when they
// are constants — and the node's step lists them after its own inputs.
//
// Tensors these ops keep (in a sequence, in a loop's state, in an output) are owned: a view of session memory
// (the liveness-planned arena, Storage::borrow) is copied first, since that memory is reused after the value's
// last reader.
//
// A NativeOp is used by one session run at a time (Session serialises runs).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/base/graph.h"
#include "core/base/status.h"
#include "core/base/value.h"

namespace keel {

class Environment;
struct SessionOptions;

class NativeOp {
 public:
  virtual ~NativeOp() = default;
  // `inputs`: the node's inputs (nullptr where absent), then its implicit inputs (implicit_inputs(node) order).
  // `outputs` has one entry per node output; entries for unused outputs may be left unset.
  virtual Status run(const std::vector<const RunValue*>& inputs, std::vector<RunValue>& outputs) = 0;
};

// Whether the executor runs `node` itself rather than a device kernel.
bool is_native_op(const Node& node, const Graph& graph);

// Builds the op for `node` of `graph` (nested graphs become child sessions on `env` with `options`).
// UNIMPLEMENTED for a node is_native_op does not accept; INVALID_ARGUMENT for malformed attributes or subgraphs.
StatusOr<std::shared_ptr<NativeOp>> make_native_op(const Node& node, const Graph& graph, Environment& env,
                                                   const SessionOptions& options);

// Runs `op` on the values at `inputs` (-1 = absent) and stores its outputs at `outputs` (-1 = unused) in `live`.
Status run_native_step(NativeOp& op, const std::vector<int>& inputs, const std::vector<int>& outputs,
                       std::vector<RunValue>& live);

// Whether `value` may be bound to an input declared as `declared` (nullptr: anything goes): a sequence where a
// sequence is declared, a tensor, sequence or none where an optional is. INVALID_ARGUMENT naming `name` otherwise.
Status check_input_kind(const std::string& name, const RunValue& value, const ValueInfo* declared);

// Host tensor helpers, shared with the conformance runner and tests.
// `t` itself when it owns its memory, else a deep copy (host tensors only).
StatusOr<Tensor> owned_tensor(const Tensor& t);

}  // namespace keel
