// plugins/cpu_onednn/common/scratchpad.h — (internal) user-managed scratchpads for the plugin's oneDNN primitives.
//
// Why: Debian's oneDNN (2.6) is built without DNNL_ENABLE_CONCURRENT_EXEC. A primitive created with the default
// (library) scratchpad mode whose implementation asks for the "global" scratchpad (the AVX-512 Winograd F(4,3)
// convolution, the GEMM-based convolutions, RNNs) then keeps its scratchpad in a thread_local buffer of oneDNN's
// that only the thread which created the primitive has grown. Executed from any other thread it works in a null or
// too-small buffer: ResNet-18's session died with SIGSEGV in jit_wino_4x3 whenever keel_session_run came from a
// thread other than the one that created the session.
//
// So every convolution, deconvolution, matmul and backward primitive of the plugin is created with
// `user_scratchpad(attr)`, and executed through `execute()`, which hands it a scratchpad from the *executing*
// thread's own buffer. Ownership: the buffer is thread_local, grows to the largest scratchpad that thread has
// needed and is freed when the thread exits. Thread-safety: any thread may call these; one primitive must not run
// on two threads at once with the same `args` map (the plugin's kernels are serialised per session).
// The chains (chain/builder.cc, bind_scratchpads) do not use it: their steps' scratchpads live in each run's workspace,
// so that a host's threads keep no buffer of their own; the standalone kernels and the claim-time timing runs do.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <unordered_map>

namespace keel::onednn {

// `attr` with scratchpad_mode::user (every other setting kept).
dnnl::primitive_attr user_scratchpad(dnnl::primitive_attr attr = {});

// Executes `prim` on `s` with `args`, plus DNNL_ARG_SCRATCHPAD from the calling thread's buffer when the primitive
// needs one (the entry is added to, or rebound in, `args`).
void execute(const dnnl::primitive& prim, dnnl::stream& s, std::unordered_map<int, dnnl::memory>& args);
inline void execute(const dnnl::primitive& prim, dnnl::stream& s, std::unordered_map<int, dnnl::memory>&& args) {
  execute(prim, s, args);
}

}  // namespace keel::onednn
