// keel/core/runtime/kernel_dispatch.h — (internal) which registered kernel runs a node: acceptance, ranking and the
// fall-through to the next kernel. Sessions (session.cc: a graph's nodes at build time) and eager ops
// (eager_dispatch.cc: one call at a time, cached) both choose through here, so a kernel is accepted or rejected by
// the same rules wherever it runs.
//
// The rules:
//   - Ranking: the kernels registered for (domain, op type, opset, device type), best first: priority, then
//     registration order (Registry::kernels_for). Devices are tried in the caller's order; this module ranks
//     kernels within one device type.
//   - Acceptance: a kernel with type constraints takes a call only when every input and output dtype the call knows
//     is allowed for the ONNX schema's type parameter at that position (the last formal covers variadic tails). An
//     unknown dtype (kUndefined: an absent slot, or a value whose type is not inferred) is not checked; neither is a
//     node without a schema (custom ops): the kernel's create decides.
//   - Creation: a kernel's create may reject the call with UNIMPLEMENTED ("this kernel cannot do this case"); that
//     is a rejection, not an error, and the next kernel is tried. Any other create failure is an error.
//   - Fall-through: the kernels ranked below the chosen one are its alternatives. When the chosen kernel rejects a
//     case at run time (UNIMPLEMENTED from compute), the next alternative that accepts the call and creates takes
//     over, by exactly the rules above.
//
// Layering. core/runtime (this folder) sits on core/base, hal and ops and is the top of libkeel_core: the plugin
// manager, sessions, ONNX I/O, eager tensors with autograd, the C API. core/train (libkeel_train: modules, losses,
// optimizers, data, checkpoints, DataParallel) sits on core/runtime's public C++ API: it includes
// core/runtime/eager.h, session.h, environment.h, onnx_io.h and dist/, core/base, and hal/device.h (the communicator
// DataParallel all-reduces through); never this header, kernel_context.h, the eager_* internals, ops/ or a plugin
// header. Nothing in core/runtime includes core/train. Tools sit on both.
//
// Thread-safety: the functions are stateless; the registry is read-only after start-up. The candidate list passed to
// take_kernel belongs to the caller (sessions guard a step's alternatives with its mutex, eager its run mutex).
#pragma once

#include <keel/plugin.h>

#include <functional>
#include <string>
#include <vector>

#include "core/base/dtype.h"
#include "core/base/graph.h"
#include "core/base/registry.h"
#include "core/base/status.h"

namespace keel::dispatch {

// The dtypes of a call's input and output slots in the node's order; kUndefined where a slot is absent (or an output
// not wanted) or its dtype is not known.
struct CallTypes {
  std::vector<DType> inputs;
  std::vector<DType> outputs;
};

// The slot dtypes of `node` as graph `g` knows them: initializers, then value info.
CallTypes call_types(const Node& node, const Graph& g);

// Whether kernel `k` takes the call's dtypes (see "Acceptance" above). On false, *why says which dtype it refused.
bool kernel_accepts(const KernelEntry& k, const Node& node, int32_t opset, const CallTypes& types, std::string* why);

// The candidate kernels for `node` on `device_type`, best first (see "Ranking" above).
std::vector<const KernelEntry*> ranked_kernels(const Registry& reg, const Node& node, int32_t opset,
                                               const std::string& device_type);

// A kernel chosen for a call, with the state its create made.
struct KernelChoice {
  const KernelEntry* kernel = nullptr;  // nullptr: every candidate rejected the call
  void* state = nullptr;                // what create returned, or the kernel's user_data when it has no create

  explicit operator bool() const { return kernel != nullptr; }
  // What frees `state` (nullptr when the kernel has no create: its user_data is not the call's to free).
  void (*release() const)(void*) { return kernel->def.create ? kernel->def.release : nullptr; }
  // Whether compute may run on `state` from several threads at once (KEEL_KERNEL_FLAG_REENTRANT, or no per-call
  // state at all).
  bool reentrant() const { return !kernel->def.create || (kernel->def.flags & KEEL_KERNEL_FLAG_REENTRANT) != 0; }
};

// Fills a create-phase context for the call (node, opset, device index, input views, output dtypes): the caller
// knows its inputs (a graph's value info and constants, or an eager call's tensors).
using FillCreateContext = std::function<void(keel_kernel_context_t&)>;

// Takes kernels from the front of `candidates` until one accepts the call and creates (see "Acceptance" and
// "Creation" above); on return `candidates` holds what was not tried, the chosen kernel's alternatives. Every
// rejection appends its reason to `rejections` (which may be nullptr). Returns an empty choice when the candidates
// ran out, and the failure of a create that failed other than UNIMPLEMENTED (with the context "`who` kernel NAME").
StatusOr<KernelChoice> take_kernel(std::vector<const KernelEntry*>& candidates, const Node& node, int32_t opset,
                                   const CallTypes& types, const FillCreateContext& fill, const std::string& who,
                                   std::vector<std::string>* rejections);

}  // namespace keel::dispatch
