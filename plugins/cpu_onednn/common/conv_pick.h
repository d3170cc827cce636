// plugins/cpu_onednn/common/conv_pick.h — (internal) picking among oneDNN's implementations of one convolution by
// timing them when the plan is built.
//
// oneDNN takes the first implementation in its list that accepts a convolution. For 3x3 Winograd that is F(2x2,3x3)
// (`jit_fp32_wino_2x3`) wherever it applies, though its F(4x4,3x3) (`jit_wino_4x3`, the next one) is often much
// faster at batch 1 and sometimes much slower; and at 2+ threads its direct kernel sometimes beats both over small
// images. Measured alone here (fastest of 200 runs, 1 thread, nChw16c, with a Relu post-op): SqueezeNet's expands
// 16->64 at 55x55 186 -> 140 us, 32->128 at 27x27 139 -> 119 us, 64->256 at 13x13 192 -> 143 us; GoogLeNet's
// 96->208 at 14x14 504 -> 155 us (direct 337 us); but ResNet's 512->512 at 7x7 781 -> 1583 us. No rule by shape picks
// the winner, so the chain times the candidates over the same memory layouts (the choice changes nothing around the
// convolution). Timed alone, F(4,3) also looks better than it is in a chain: it writes its output past the cache
// (streaming stores) and the layer after it then waits for memory (SqueezeNet at 1 thread: the 1x1 and the MaxPool
// reading the 55x55 expands took 70 -> 80 and 29 -> 71 us, the gain of the expands themselves gone), so the chain
// asks another Winograd implementation to win by a third. See docs/ONEDNN_PERFORMANCE.md, "(sqz)".
#pragma once

#include <dnnl.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace keel::onednn {

// `first` and oneDNN's further implementations of the same convolution (same operation descriptor and attributes)
// that read and write the same memory layouts as `first`, skipping its reference ones; `first` comes first.
std::vector<dnnl::convolution_forward::primitive_desc> conv_impls_like(
    const dnnl::convolution_forward::primitive_desc& first, const dnnl::engine& eng);

// The index of the candidate that runs fastest on the calling thread's OpenMP team: all run over one zeroed buffer
// per argument, one after another (one warm run, then the fastest of `reps` runs, interleaved across the candidates,
// each after the team evicted its L2 and timed with reading its output back); candidate 0 is kept unless
// candidate k is faster than it by margins[k] (a fraction: 0.05 is 5%; a candidate without an entry: 0.05).
// Candidates must be convolutions with the same arguments.
size_t fastest_conv(const std::vector<dnnl::convolution_forward::primitive_desc>& cands, const dnnl::engine& eng,
                    dnnl::stream& strm, int reps = 7, const std::vector<double>& margins = {});

// fastest_conv with the answer remembered for the rest of the process, per team size, candidate implementations (in
// order), their source / weights / destination memory descriptors and margins: a plan is rebuilt after a node was
// left out of a claim or for another team, a network repeats shapes, and another session over the same shapes asks
// the same questions (ResNet-50 at 1 thread: 26 timings became 20; the claim's own plan no longer times at all, see
// chain/runtime.cc run_chain). Thread-safe (one mutex; the timing itself runs under it, so two plans never time at
// once).
size_t fastest_conv_remembered(const std::vector<dnnl::convolution_forward::primitive_desc>& cands,
                               const dnnl::engine& eng, dnnl::stream& strm, const std::vector<double>& margins);

// How many answers fastest_conv_remembered and remembered_pick hold together (for tests).
size_t remembered_conv_picks();

// Reads a byte of every 64-byte line of `bytes` bytes from `at`, split over `team` threads, as a reader brings them
// into its caches (a timing's stand-in for what a step's neighbours read); returns their sum, so that the reads stay.
uint64_t read_lines(const void* at, size_t bytes, int team);

// Writes back and evicts every 64-byte line of `bytes` bytes from `at` from every cache level (clflush), split over
// `team` threads, and waits for it: before a timed run, weights that a network reads from memory at every run (their
// layer's neighbours evict them between runs) come from memory in the timing too, whatever the last-level cache's
// size and replacement policy would have kept of them.
void flush_lines(const void* at, size_t bytes, int team);

// The answer `pick` gives to the question `key`, remembered for the rest of the process: `pick` runs once per key,
// under the mutex fastest_conv_remembered times under (two plans never time at once). For choices among the chain's
// own steps (Builder::wino_few_tiles_pick): the key names everything the answer depends on, the team included.
size_t remembered_pick(const std::string& key, const std::function<size_t()>& pick);

// The index of the fastest of `runs` (each a whole computation, on the team it chooses): one warm run each, then the
// fastest of `reps` runs, interleaved across them, each after `cool` ran untimed (what happens to the caches between
// two runs of it in a network: its source read, its weights flushed; may be empty); run 0 is kept unless run k is
// faster than it by margins[k] (a fraction; a run without an entry: 0.05). `seconds`, when given, receives each run's
// fastest (one run alone is not timed: 1e30).
size_t fastest_run(const std::vector<std::function<void()>>& runs, const std::function<void()>& cool, int reps,
                   const std::vector<double>& margins = {}, std::vector<double>* seconds = nullptr);

}  // namespace keel::onednn
