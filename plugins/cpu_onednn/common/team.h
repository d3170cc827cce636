// plugins/cpu_onednn/common/team.h — (internal) how the plugin's own loops split their work over an OpenMP team
// (the int8 quantization and depthwise loops, the fused stem convolution + pooling).
#pragma once

#include <omp.h>

#include <cstdint>

namespace keel::onednn {

// Calls f(t, begin, end) once per thread t of a team of `team` OpenMP threads, with contiguous ranges [begin, end)
// that cover [0, n) in the order of t; team <= 1: f(0, 0, n) on the calling thread. Thread-safe as f is for
// disjoint ranges.
template <class F>
void split_over_team(int64_t n, int team, F&& f) {
  if (team <= 1) return f(int64_t{0}, int64_t{0}, n);
#pragma omp parallel num_threads(team)
  {
    const int64_t t = omp_get_thread_num(), k = omp_get_num_threads();
    f(t, n * t / k, n * (t + 1) / k);
  }
}

}  // namespace keel::onednn
