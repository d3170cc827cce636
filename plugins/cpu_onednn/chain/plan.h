// plugins/cpu_onednn/chain/plan.h — (internal) a chain's plan: buffers, memory binds and steps (Exec), the
// weights' arena, and the plugin's own steps (chain/own_steps.cc) that a plan runs besides oneDNN's primitives.
// A Plan is built once per OpenMP thread count (chain/builder.cc) and is read-only once built: runs, several at once,
// each take a RunBinding of their own (the memory objects rebound to that run's inputs, outputs and workspace) from
// the plan's pool (chain/runtime.cc).
#pragma once

#include <functional>
#include <mutex>

#include "chain/recipe.h"
#include "common/host_memory.h"

namespace keel::onednn::chain {

// ------------------------------------------------------------------------------------------------------ the plan

// Where a memory object's data lives.
enum class BufKind { kWorkspace, kInput, kOutput, kOwned };
struct Buf {
  BufKind kind = BufKind::kWorkspace;
  int index = -1;  // input/output index
  uint64_t bytes = 0;
  int first = 1 << 30, last = -1;  // exec steps that touch it
  uint64_t offset = 0;             // in the workspace
  int values = 0;                  // values living in it (views included)
};

struct Bind {
  dnnl::memory mem;
  int buf;
  uint64_t offset;  // bytes from the buffer's start
};

struct Exec {
  dnnl::primitive prim;
  std::unordered_map<int, dnnl::memory> args;
  bool single = false;  // runs on one OpenMP thread (a small memory-bound step: see Builder::exec)
  // A step of the plugin's own instead of a primitive (prim is then empty), run with the exec itself.
  void (*own)(const Exec&) = nullptr;
  std::shared_ptr<const void> params;  // an own step's parameters (run_conv_pool: its ConvPoolShape)
  const char* own_kind = nullptr;      // an own step's kind in profiles ("eltwise" when null)
  bool scratchpad_bound = false;       // args holds DNNL_ARG_SCRATCHPAD in the run's workspace (bind_scratchpads)
  uint64_t run_scratch = 0;     // an own step's scratch bytes per thread, in the own steps' region (bind_scratchpads)
  uint64_t scratch_stride = 0;  // bytes from one thread's part of that region to the next, the same for every own step
};

// The pooled output of a SiLU step that also computes squeeze-excite's GlobalAveragePool (run_silu_mean).
constexpr int kArgPooled = DNNL_ARG_DST_1;
constexpr int kArgScale = DNNL_ARG_SRC_1, kArgMap = DNNL_ARG_SRC_2;
struct Int8QuantizeStep {
  enum class Kind { kSame, kToNhwc, kBlocked, kBlockedF32 } kind = Kind::kSame;
  QuantizeSpec q;
  int64_t n = 0, N = 1, C = 1, S = 1;
};

// The plugin's own steps (Exec::own), defined in chain/own_steps.cc.
void run_silu(const Exec& e);
void run_gelu(const Exec& e);
void run_gelu_tanh(const Exec& e);
void run_silu_mean(const Exec& e);
void run_scale_weights(const Exec& e);
void run_scale_weights16(const Exec& e);
void run_conv_pool(const Exec& e);
void run_dw_silu(const Exec& e);
void run_dw_ln(const Exec& e);
void run_se(const Exec& e);
void run_grouped4(const Exec& e);
void run_wino4(const Exec& e);
void run_pointwise(const Exec& e);
void run_expand_dw(const Exec& e);
void run_int8_pool(const Exec& e);
void run_max_pool16(const Exec& e);
void run_int8_stem(const Exec& e);
void run_to_phases(const Exec& e);
void run_from_phases(const Exec& e);
void run_attention(const Exec& e);
void run_int8_depthwise(const Exec& e);
void run_int8_expand_dw(const Exec& e);
void run_int8_quantize(const Exec& e);
void run_merged_source(const Exec& e);
void run_bilinear(const Exec& e);
void run_narrow_gemm(const Exec& e);
void run_skinny_gemm(const Exec& e);
void run_im2row(const Exec& e);
// Runs one step: its primitive on `s`, or its own function.
void run_step(Exec& e, dnnl::stream& s);

// Weights in the primitives' layouts, packed into 2 MiB-aligned chunks that the kernel may back with huge pages
// (madvise): a batch-1 network streams its weights from memory on every run (ResNet-50: 100 MB), and with 4 KiB
// pages every 4 KiB of that stream is a TLB miss and a stop for the hardware prefetcher.
class WeightArena {
 public:
  WeightArena() = default;
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;
  ~WeightArena() {
    for (auto& [p, n] : chunks_) std::free(p);
  }
  void* alloc(uint64_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (chunks_.empty() || used_ + bytes > chunks_.back().second) {
      const uint64_t n = std::max<uint64_t>(kChunk, (bytes + kHugePage - 1) / kHugePage * kHugePage);
      void* p = alloc_host(n, 0);  // in huge pages (common/host_memory.h)
      if (!p) throw std::bad_alloc();
      chunks_.emplace_back(p, n);
      used_ = 0;
    }
    void* r = static_cast<char*>(chunks_.back().first) + used_;
    used_ += bytes;
    return r;
  }

 private:
  static constexpr uint64_t kChunk = 16u << 20;
  std::vector<std::pair<void*, uint64_t>> chunks_;
  uint64_t used_ = 0;
};

// A convolution whose implementation a claim-time plan took untimed (Builder's time_convs off): the candidates and
// margins fastest_conv_remembered would have timed, or, for a choice among the chain's own steps, `own`, the timed
// and remembered pick itself (Builder::wino_few_tiles_pick); the plan took the first (index 0).
struct DeferredPick {
  std::vector<dnnl::convolution_forward::primitive_desc> cands;
  std::vector<double> margins;
  std::function<size_t()> own;
};

// One run's memory objects: a copy of the plan's binds (new dnnl::memory objects over the same descriptors) and of its
// steps with their args pointing at those copies (primitives and parameters shared). The weights' memory objects are
// the plan's own (never rebound).
struct RunBinding {
  std::vector<Bind> binds;
  std::vector<Exec> execs;
  std::vector<void*> last_base;  // per buffer, the pointer its binds were last set to
};

struct Plan {
  int threads = 0;
  std::vector<DeferredPick> deferred;  // a claim-time plan's untimed picks (see run_chain)
  WeightArena weights;                 // declared before `owned` and the steps: freed after them
  double flops = 0;                    // of the convolutions and matmuls
  std::vector<Buf> bufs;
  std::vector<Bind> binds;
  std::vector<Exec> execs;
  std::vector<dnnl::memory> owned;  // weights and constants in the primitives' layouts
  uint64_t ws_bytes = 0;
  std::vector<Dims> out_dims;
  std::vector<const ConstT*> out_consts;  // outputs that are constants (copied each run)
  std::vector<void*> last_base;           // per buffer, the pointer its binds were last set to
  std::vector<std::string> impls;         // for logs
  std::vector<std::string> what;          // per exec: the node it runs and its shapes (for the profile)
  // Per exec, for the session profile (plugin ABI 1.3 profile_step): the ONNX op type it computes ("" for a layout
  // reorder of the chain's own) and the graph nodes it covers (that node first, the nodes fused into it after).
  // The strings belong to the Recipe the plan was built from.
  std::vector<const char*> step_op;
  std::vector<std::vector<const char*>> step_nodes;
  // Run bindings not in use (as many were made as runs were ever in progress at once on this plan).
  std::mutex bindings_mu;
  std::vector<std::unique_ptr<RunBinding>> free_bindings;
};

}  // namespace keel::onednn::chain
