// gloo_allreduce_bench — all-reduce bus bandwidth on 2 ranks (threads of this process) over loopback TCP: the gloo
// collective plugin through the core (hal::Communicator) against Gloo driven directly (gloo::allreduce with the
// ring and bcube algorithms, and gloo::AllreduceRingChunked built once per size), f32 SUM in place, 1/4/16/64 MiB.
// Not a test. Built by tests/collectives/CMakeLists.txt beside the tests.
//
//   build/bin/gloo_allreduce_bench [--rounds R] [--seconds S] [--sizes 0.203,1,4,16,64] [--no-check]
//
// Each (size, variant) runs for about S seconds per round (default 0.5), R rounds (default 3) interleaved between
// variants, and prints the minimum and the median time of one all-reduce over all rounds (the minimum is the
// steadier figure on a loaded machine), bus bandwidth = bytes * 2(W-1)/W / time, and each against Gloo's ring.
// --no-check sets KEEL_GLOO_CHECK=0 before the plugin loads (the plugin then skips its argument-header exchange), to
// measure what that exchange costs.
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/collectives/collective_test_util.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWorld = 2;

// Runs op(rank, iteration) on both ranks for about `seconds`; returns the time of each iteration (the slower rank's).
std::vector<double> time_pair(double seconds, const std::function<void(int, int)>& op) {
  // Calibrate with two iterations, then run a fixed count on both ranks.
  std::vector<std::vector<double>> per(kWorld);
  std::barrier sync(kWorld);
  int iters = 2;
  std::vector<double> out;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<std::thread> ts;
    for (int r = 0; r < kWorld; ++r)
      ts.emplace_back([&, r] {
        per[r].assign(static_cast<size_t>(iters), 0.0);
        op(r, 0);  // warm-up
        sync.arrive_and_wait();
        for (int i = 0; i < iters; ++i) {
          const auto t0 = Clock::now();
          op(r, i + 1);
          per[r][static_cast<size_t>(i)] = std::chrono::duration<double>(Clock::now() - t0).count();
        }
      });
    for (auto& t : ts) t.join();
    out.assign(static_cast<size_t>(iters), 0.0);
    for (int r = 0; r < kWorld; ++r)
      for (int i = 0; i < iters; ++i)
        out[static_cast<size_t>(i)] = std::max(out[static_cast<size_t>(i)], per[r][static_cast<size_t>(i)]);
    double total = 0;
    for (double t : out) total += t;
    if (phase == 0) iters = std::max(2, static_cast<int>(seconds / std::max(total / iters, 1e-6)));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  std::vector<double> sizes = {1, 4, 16, 64};  // MiB (0.203 = a SimpleCNN gradient)
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--no-check") setenv("KEEL_GLOO_CHECK", "0", 1);
    else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        sizes.push_back(std::strtod(p, &end));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--rounds R] [--seconds S] [--sizes MiB,...] [--no-check]\n", argv[0]);
      return 2;
    }
  }

  // The plugin, through the core.
  auto& g = keel::testing::gloo();
  if (!g.entry) {
    std::fprintf(stderr, "gloo plugin unavailable: %s\n", g.why.c_str());
    return 1;
  }
  keel::testing::KvStore kv;
  std::vector<keel::hal::Communicator> comms(kWorld);
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < kWorld; ++r)
      ts.emplace_back([&, r] {
        auto c = keel::hal::Communicator::create(g.entry, &kv.c, r, kWorld, 0, 60000);
        if (!c.is_ok()) {
          std::fprintf(stderr, "rank %d: %s\n", r, c.status().to_string().c_str());
          std::exit(1);
        }
        comms[r] = std::move(c).value();
      });
    for (auto& t : ts) t.join();
  }

  // Gloo directly: its own contexts over an in-process HashStore, the same TCP device settings.
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::rendezvous::Context>> ctx(kWorld);
  {
    std::vector<std::thread> ts;
    for (int r = 0; r < kWorld; ++r)
      ts.emplace_back([&, r] {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto c = std::make_shared<gloo::rendezvous::Context>(r, kWorld);
        c->setTimeout(std::chrono::seconds(60));
        c->connectFullMesh(store, dev);
        ctx[r] = c;
      });
    for (auto& t : ts) t.join();
  }

  std::printf(
      "all-reduce f32 sum in place, %d ranks (threads) over 127.0.0.1, %d interleaved rounds of ~%.2f s; per "
      "all-reduce: min and median%s\n",
      kWorld, rounds, seconds, std::getenv("KEEL_GLOO_CHECK") ? " (plugin argument check off)" : "");
  {
    // The plugin's barrier is exactly the header exchange that precedes every collective: its cost per call.
    std::vector<double> all;
    for (int round = 0; round < rounds; ++round) {
      auto t = time_pair(seconds / 4, [&](int r, int) {
        if (!comms[r].barrier().is_ok()) std::exit(1);
      });
      all.insert(all.end(), t.begin(), t.end());
    }
    std::printf("plugin barrier (= the argument-header exchange before each collective): min %.1f us, median %.1f us\n",
                *std::min_element(all.begin(), all.end()) * 1e6, median(all) * 1e6);
  }
  std::printf("%9s  %-26s %11s %11s %9s %9s %9s %9s\n", "size", "variant", "min", "median", "GB/s min", "GB/s med",
              "vs ring", "(median)");
  for (double mib : sizes) {
    const size_t n = std::max<size_t>(1, static_cast<size_t>(mib * (1u << 20)) / sizeof(float));
    char label[32];
    if (mib >= 1) std::snprintf(label, sizeof label, "%g MiB", mib);
    else std::snprintf(label, sizeof label, "%zu KB", n * sizeof(float) / 1000);
    std::vector<std::vector<float>> buf(kWorld, std::vector<float>(n, 1.0f));
    std::vector<std::unique_ptr<gloo::AllreduceRingChunked<float>>> chunked(kWorld);
    for (int r = 0; r < kWorld; ++r)
      chunked[r] = std::make_unique<gloo::AllreduceRingChunked<float>>(ctx[r], std::vector<float*>{buf[r].data()},
                                                                       static_cast<int>(n));
    // The buffers double at every sum and reach inf after ~128 iterations; inf costs the same to add.
    std::vector<std::pair<std::string, std::function<void(int, int)>>> variants = {
        {"gloo::allreduce ring",
         [&](int r, int i) {
           gloo::AllreduceOptions o(ctx[r]);
           o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
           o.setOutput(buf[r].data(), n);
           o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
           o.setTag(static_cast<uint32_t>(i));
           gloo::allreduce(o);
         }},
        {"gloo::allreduce bcube",
         [&](int r, int i) {
           gloo::AllreduceOptions o(ctx[r]);
           o.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
           o.setOutput(buf[r].data(), n);
           o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
           o.setTag(static_cast<uint32_t>(i));
           gloo::allreduce(o);
         }},
        {"gloo::AllreduceRingChunked", [&](int r, int) { chunked[r]->run(); }},
        {"keel gloo plugin",
         [&](int r, int) {
           keel::Status s = comms[r].all_reduce(buf[r].data(), buf[r].data(), n, keel::DType::kF32, KEEL_REDUCE_SUM);
           if (!s.is_ok()) {
             std::fprintf(stderr, "plugin: %s\n", s.to_string().c_str());
             std::exit(1);
           }
         }},
    };
    std::map<std::string, std::vector<double>> times;
    for (int round = 0; round < rounds; ++round)
      for (auto& [name, op] : variants) {
        auto t = time_pair(seconds, op);
        times[name].insert(times[name].end(), t.begin(), t.end());
      }
    const double bytes = static_cast<double>(n * sizeof(float));
    auto bus = [&](double t) { return bytes * 2.0 * (kWorld - 1) / kWorld / t / 1e9; };
    const auto& ring_times = times["gloo::allreduce ring"];
    const double ring_min = *std::min_element(ring_times.begin(), ring_times.end()), ring_med = median(ring_times);
    for (auto& [name, op] : variants) {
      const auto& v = times[name];
      const double tmin = *std::min_element(v.begin(), v.end()), tmed = median(v);
      std::printf("%9s  %-26s %8.3f ms %8.3f ms %9.2f %9.2f %8.1f%% %8.1f%%\n", label, name.c_str(), tmin * 1e3,
                  tmed * 1e3, bus(tmin), bus(tmed), 100.0 * ring_min / tmin, 100.0 * ring_med / tmed);
    }
    chunked.clear();
  }
  comms.clear();
  return 0;
}
