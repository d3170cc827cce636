// plugins/cpu_onednn/onednn_conv_select.cc — timing oneDNN's convolution implementations against each other
// (onednn_conv_select.h).
#include "onednn_conv_select.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <unordered_map>

namespace keel::onednn {

std::vector<dnnl::convolution_forward::primitive_desc> conv_alternatives(
    const dnnl::convolution_forward::primitive_desc& pd, const char* name_part) {
  std::vector<dnnl::convolution_forward::primitive_desc> out;
  // A copy shares pd's implementation iterator but holds its own current implementation: walking the copy leaves
  // pd's implementation as it is (only a later pd.next_impl() would notice; the plugin never calls it on pd).
  dnnl::convolution_forward::primitive_desc it = pd;
  const dnnl::memory::desc src = pd.src_desc(), dst = pd.dst_desc();
  const std::string own = pd.impl_info_str();
  while (it.next_impl()) {
    const std::string name = it.impl_info_str();
    if (name == own || name.find(name_part) == std::string::npos || it.src_desc() != src || it.dst_desc() != dst)
      continue;
    dnnl_primitive_desc_t c = nullptr;
    if (dnnl_primitive_desc_clone(&c, it.get()) != dnnl_success) continue;
    out.emplace_back(c);
  }
  return out;
}

size_t fastest_conv(const std::vector<dnnl::convolution_forward::primitive_desc>& cands,
                    const std::vector<double>& margins, dnnl::engine& eng, dnnl::stream& strm) {
  if (cands.size() < 2 || margins.size() != cands.size()) return 0;
  struct Run {
    dnnl::convolution_forward prim;
    std::unordered_map<int, dnnl::memory> args;
  };
  std::vector<Run> runs;
  for (const auto& pd : cands) {
    Run r{dnnl::convolution_forward(pd), {}};
    const std::pair<int, dnnl::memory::desc> mds[] = {{DNNL_ARG_SRC, pd.src_desc()},
                                                      {DNNL_ARG_WEIGHTS, pd.weights_desc()},
                                                      {DNNL_ARG_BIAS, pd.query_md(dnnl::query::weights_md, 1)},
                                                      {DNNL_ARG_DST, pd.dst_desc()},
                                                      {DNNL_ARG_SCRATCHPAD, pd.scratchpad_desc()}};
    for (const auto& [arg, md] : mds) {
      if (md.is_zero()) continue;
      dnnl::memory m(md, eng);
      std::memset(m.get_data_handle(), 0, md.get_size());
      r.args[arg] = m;
    }
    runs.push_back(std::move(r));
  }
  auto time = [&](Run& r) {
    const auto t0 = std::chrono::steady_clock::now();
    r.prim.execute(strm, r.args);
    strm.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (Run& r : runs) time(r);
  std::vector<double> best(runs.size(), 1e30);
  for (int k = 0; k < 5; ++k)
    for (size_t c = 0; c < runs.size(); ++c) best[c] = std::min(best[c], time(runs[c]));
  size_t pick = 0;
  for (size_t c = 1; c < runs.size(); ++c)
    if (best[c] < (1.0 - margins[c]) * best[0] && best[c] < best[pick]) pick = c;
  return pick;
}

}  // namespace keel::onednn
