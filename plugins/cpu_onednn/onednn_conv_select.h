// plugins/cpu_onednn/onednn_conv_select.h — (internal) choosing among oneDNN's convolution implementations for the
// same layouts by timing them when a chain's plan is built (onednn_subgraph.cc, Builder::conv). oneDNN 2.6 ranks its
// implementations by a fixed order, not by this machine: for ResNet-50's 3x3s at 56x56 (64 -> 64 channels) it offers
// Winograd F(2,3) first while its F(4,3) kernel, second in the list, runs 16% faster at one thread (PERFORMANCE.md,
// "(r50d)"). Thread-compatible: one Builder at a time per engine and stream.
#pragma once

#include <dnnl.hpp>

#include <vector>

namespace keel::onednn {

// The implementations oneDNN offers after `pd`'s own for the same descriptor whose name contains `name_part` and
// whose source and destination layouts are pd's (so choosing one changes nothing around the convolution), in
// oneDNN's order. pd keeps its implementation; do not call pd.next_impl() afterwards (the iterator is shared). Call it
// while the operation descriptor pd was made from is alive: oneDNN 2.6's iterator refers to it.
std::vector<dnnl::convolution_forward::primitive_desc> conv_alternatives(
    const dnnl::convolution_forward::primitive_desc& pd, const char* name_part);

// The index of the fastest of `cands` on the calling thread's current OpenMP team, each run over its own zeroed
// memory (fastest of 5 interleaved runs after a warm one). Candidate 0 is the default; candidate c > 0 is chosen
// only when it is faster than the default by the fraction margins[c] (0.05: 5%), and then the fastest such one.
// Returns 0 when there is a single candidate. margins.size() must be cands.size().
size_t fastest_conv(const std::vector<dnnl::convolution_forward::primitive_desc>& cands,
                    const std::vector<double>& margins, dnnl::engine& eng, dnnl::stream& strm);

}  // namespace keel::onednn
