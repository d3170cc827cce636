// plugins/cpu_onednn/common/conv_pick.cc — see common/conv_pick.h.
#include "common/conv_pick.h"

#include <immintrin.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/host_memory.h"
#include "common/team.h"

namespace keel::onednn {

std::vector<dnnl::convolution_forward::primitive_desc> conv_impls_like(
    const dnnl::convolution_forward::primitive_desc& first, const dnnl::engine& eng) {
  std::vector<dnnl::convolution_forward::primitive_desc> out{first};
  const_dnnl_op_desc_t op = nullptr;
  const_dnnl_primitive_attr_t attr = nullptr;
  if (dnnl_primitive_desc_query(first.get(), dnnl_query_op_d, 0, &op) != dnnl_success || !op ||
      dnnl_primitive_desc_get_attr(first.get(), &attr) != dnnl_success)
    return out;
  dnnl_primitive_desc_iterator_t it = nullptr;
  if (dnnl_primitive_desc_iterator_create(&it, op, attr, eng.get(), nullptr) != dnnl_success) return out;
  const std::string first_impl = first.impl_info_str();
  do {
    dnnl_primitive_desc_t raw = dnnl_primitive_desc_iterator_fetch(it);
    if (!raw) break;
    dnnl::convolution_forward::primitive_desc pd(raw);  // a clone
    dnnl_primitive_desc_destroy(raw);
    const std::string impl = pd.impl_info_str();
    if (impl.rfind("ref", 0) == 0 || impl == first_impl) continue;
    if (pd.src_desc() != first.src_desc() || pd.dst_desc() != first.dst_desc()) continue;
    out.push_back(pd);
  } while (dnnl_primitive_desc_iterator_next(it) == dnnl_success);
  dnnl_primitive_desc_iterator_destroy(it);
  return out;
}

size_t fastest_conv(const std::vector<dnnl::convolution_forward::primitive_desc>& cands, const dnnl::engine& eng,
                    dnnl::stream& strm, int reps, const std::vector<double>& margins) {
  if (cands.size() < 2) return 0;
  struct Run {
    dnnl::convolution_forward prim;
    std::unordered_map<int, dnnl::memory> args;
    double best = 1e30;
  };
  // The candidates run one after another, so they share one zeroed buffer per argument, as large as the largest of
  // them needs (F(4,3)'s weights for 512 -> 512 channels: 37 MB): each fresh page costs a fault, and allocating
  // and zeroing per candidate doubled what ResNet-50's session creation spent here.
  const int kArgs[] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_BIAS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
  auto desc_of = [](const dnnl::convolution_forward::primitive_desc& pd, int arg) {
    switch (arg) {
      case DNNL_ARG_SRC: return pd.src_desc();
      case DNNL_ARG_WEIGHTS: return pd.weights_desc();
      case DNNL_ARG_BIAS: return pd.query_md(dnnl::query::weights_md, 1);
      case DNNL_ARG_DST: return pd.dst_desc();
      default: return pd.scratchpad_desc();
    }
  };
  std::vector<HostBuffer> shared;
  std::unordered_map<int, void*> base;
  for (int arg : kArgs) {
    size_t bytes = 0;
    for (const auto& pd : cands) bytes = std::max(bytes, desc_of(pd, arg).get_size());
    if (bytes == 0) continue;
    // From 4 MiB on in huge pages (common/host_memory.h): ResNet-50's first run faulted in 250 MB here, 63k of its
    // 147k page faults.
    shared.push_back(zeroed_host(bytes));
    base[arg] = shared.back().get();
  }
  std::vector<Run> runs;
  for (const auto& pd : cands) {
    Run r{dnnl::convolution_forward(pd), {}};
    for (int arg : kArgs) {
      const dnnl::memory::desc md = desc_of(pd, arg);
      if (md.is_zero()) continue;
      r.args[arg] = dnnl::memory(md, eng, base.at(arg));
    }
    runs.push_back(std::move(r));
  }
  // Before each timed run every thread of the team writes twice its L2 cache's size elsewhere: the weights (F(4,3)'s
  // are 4x the plain ones, F(2,3)'s 1.8x) come from the shared cache as in a chain, where the layers in between have
  // evicted them; timed hot, F(4,3) won where in the chain it lost (SqueezeNet's 48->192 at 13x13 at 1 thread: 78
  // vs 85 us alone, 116-121 vs 86-87 us in the chain).
  const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const int team = omp_get_max_threads();
  const int64_t per = 2 * (l2 > 0 ? l2 : (1 << 20));
  // Kept per calling thread between calls: a fresh buffer each time took a page fault per 4 KiB.
  thread_local std::vector<char> evict;
  if (evict.size() < static_cast<size_t>(per * team)) evict.resize(static_cast<size_t>(per * team));
  char* const evict_at = evict.data();  // the team's threads must not name `evict`: each would see its own, empty
  // After each run the team reads the destination back (a byte per cache line, read_lines), as the next step of a chain
  // does, and that read is timed with the run: F(4,3) writes its output with streaming stores, past the cache, and the
  // layer after it waited for memory (SqueezeNet at 1 thread: the squeeze 1x1 and the MaxPool reading 55x55 expands
  // went from 66 and 32 us to 85 and 67 us).
  uint64_t sink = 0;
  auto read_back = [&](const dnnl::memory& m) {
    sink += read_lines(m.get_data_handle(), m.get_desc().get_size(), team);
  };
  int fill = 0;  // a different byte each time, so the writes are never skipped as redundant
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer the team's flush is a race report on every run (OpenMP's ordering is invisible to it; the
  // report is suppressed as libgomp's only after TSan has searched 2 MiB of shadow for it): the ResNet-like
  // SessionThreads case spent more than 15 minutes there. The timings mean nothing under TSan anyway.
  constexpr bool kEvict = false;
#else
  constexpr bool kEvict = true;
#endif
  auto time = [&](Run& r) {
    fill ^= 1;
    if (kEvict) {
      split_over_team(team, team, [&](int64_t, int64_t b, int64_t e) {
        if (e > b) std::memset(evict_at + b * per, fill, static_cast<size_t>((e - b) * per));
      });
    }
    auto t0 = std::chrono::steady_clock::now();
    r.prim.execute(strm, r.args);
    strm.wait();
    read_back(r.args.at(DNNL_ARG_DST));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto& r : runs) time(r);
  for (int k = 0; k < reps; ++k)
    for (auto& r : runs) r.best = std::min(r.best, time(r));
  size_t best = 0;
  for (size_t k = 1; k < runs.size(); ++k)
    if (runs[k].best < (1.0 - (k < margins.size() ? margins[k] : 0.05)) * runs[0].best &&
        runs[k].best < runs[best].best)
      best = k;
  return best;
}

namespace {

// A memory descriptor as text: data type, dims, and for blocked layouts the strides and inner blocks.
void describe(std::ostringstream& k, const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  k << static_cast<int>(d.data_type) << ':' << static_cast<int>(d.format_kind) << ':';
  for (int i = 0; i < d.ndims; ++i) k << d.dims[i] << ',';
  if (d.format_kind == dnnl_blocked) {
    const auto& b = d.format_desc.blocking;
    k << 's';
    for (int i = 0; i < d.ndims; ++i) k << b.strides[i] << ',';
    k << 'b';
    for (int i = 0; i < b.inner_nblks; ++i) k << b.inner_idxs[i] << 'x' << b.inner_blks[i] << ',';
  }
  k << ';';
}

struct Remembered {
  std::mutex mu;
  std::unordered_map<std::string, size_t> picks;
};
Remembered& remembered() {
  static Remembered* r = new Remembered;  // never destroyed: plans may be built during static destruction
  return *r;
}

}  // namespace

size_t fastest_conv_remembered(const std::vector<dnnl::convolution_forward::primitive_desc>& cands,
                               const dnnl::engine& eng, dnnl::stream& strm, const std::vector<double>& margins) {
  if (cands.size() < 2) return 0;
  std::ostringstream k;
  k << omp_get_max_threads() << '|';
  for (const auto& pd : cands) {
    k << pd.impl_info_str() << '|';
    describe(k, pd.src_desc());
    describe(k, pd.weights_desc());
    describe(k, pd.dst_desc());
  }
  for (double m : margins) k << m << ',';
  return remembered_pick(k.str(), [&] { return fastest_conv(cands, eng, strm, 7, margins); });
}

uint64_t read_lines(const void* at, size_t bytes, int team) {
  const auto* p = static_cast<const unsigned char*>(at);
  std::vector<uint64_t> sums(static_cast<size_t>(std::max(team, 1)) * 8);  // a cache line per thread
  split_over_team(static_cast<int64_t>(bytes / 64), team, [&](int64_t t, int64_t b, int64_t e) {
    uint64_t acc = 0;
    for (int64_t l = b; l < e; ++l) acc += p[l * 64];
    sums[static_cast<size_t>(t) * 8] = acc;
  });
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  return total;
}

void flush_lines(const void* at, size_t bytes, int team) {
  const auto* p = static_cast<const char*>(at);
  split_over_team(static_cast<int64_t>((bytes + 63) / 64), team, [&](int64_t, int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) _mm_clflush(p + l * 64);
    _mm_mfence();  // the flushes done before the timed run starts
  });
}

size_t remembered_pick(const std::string& key, const std::function<size_t()>& pick) {
  Remembered& r = remembered();
  std::lock_guard<std::mutex> lock(r.mu);
  if (auto it = r.picks.find(key); it != r.picks.end()) return it->second;
  const size_t best = pick();
  r.picks.emplace(key, best);
  return best;
}

size_t fastest_run(const std::vector<std::function<void()>>& runs, const std::function<void()>& cool, int reps,
                   const std::vector<double>& margins, std::vector<double>* seconds) {
  std::vector<double> best(runs.size(), 1e30);
  if (runs.size() < 2) {  // nothing to choose: not timed
    if (seconds) *seconds = best;
    return 0;
  }
  auto time = [&](size_t k) {
    if (cool) cool();
    const auto t0 = std::chrono::steady_clock::now();
    runs[k]();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (size_t k = 0; k < runs.size(); ++k) time(k);
  for (int rep = 0; rep < reps; ++rep)
    for (size_t k = 0; k < runs.size(); ++k) best[k] = std::min(best[k], time(k));
  size_t pick = 0;
  for (size_t k = 1; k < runs.size(); ++k)
    if (best[k] < (1.0 - (k < margins.size() ? margins[k] : 0.05)) * best[0] && best[k] < best[pick]) pick = k;
  if (seconds) *seconds = best;
  return pick;
}

size_t remembered_conv_picks() {
  Remembered& r = remembered();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.picks.size();
}

}  // namespace keel::onednn
