// DataParallel, the distributed sampler and the post-accumulate-grad hook. Ranks are threads of this process joined by
// a small in-process collective table (below, wrapped as a CollectiveEntry like a plugin's); every wait in it is
// bounded. Checks: hook order and accumulation; bucket layout and the rebuild from the observed order; 2 ranks × 32
// for 20 steps equal 1 process × 64; no_sync accumulation equals a bigger batch; shards are disjoint and cover the
// data; a parameter shape mismatch is an error naming it; unused parameters do not hang; world size 1 passes through;
// random models, worlds, bucket caps, rebuild settings, micro-batches and frozen parameters equal one process (3,000
// seeds in 27 s: KEEL_RANDOM_DP_COUNT=3000; a bucket left out of the all-reduce fails the second seed).
#include "core/train/data_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "core/train/data.h"
#include "core/train/optim.h"

// --- an in-process collective: ranks are threads ------------------------------------------------------------------
namespace {

struct World {
  explicit World(int n)
      : size(n), sends(static_cast<size_t>(n)), counts(static_cast<size_t>(n)), dtypes(static_cast<size_t>(n)) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const void*> sends;
  std::vector<uint64_t> counts;
  std::vector<int32_t> dtypes;
  int64_t timeout_ms = 60000;

  bool barrier(std::unique_lock<std::mutex>& lk) {
    const uint64_t g = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    return cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return generation != g; });
  }
};

}  // namespace

struct keel_communicator_s {
  World* world;
  int rank;
};

namespace {

struct OwnedStatus {
  keel_status_s s;
  std::string msg;
};
keel_status_t make_status(int32_t code, std::string msg) {
  auto* o = new OwnedStatus;
  o->msg = std::move(msg);
  o->s.struct_size = sizeof(keel_status_s);
  o->s.code = code;
  o->s.message = o->msg.c_str();
  o->s.release = [](keel_status_s* s) { delete reinterpret_cast<OwnedStatus*>(s); };
  return &o->s;
}

size_t elem_size(int32_t dt) {
  switch (dt) {
    case KEEL_DTYPE_BF16: return 2;
    case KEEL_DTYPE_F32:
    case KEEL_DTYPE_I32: return 4;
    case KEEL_DTYPE_F64:
    case KEEL_DTYPE_I64: return 8;
    default: return 0;
  }
}

template <class T>
void reduce_into(std::vector<T>& acc, const T* x, uint64_t n, int32_t op) {
  for (uint64_t i = 0; i < n; ++i) {
    switch (op) {
      case KEEL_REDUCE_SUM:
      case KEEL_REDUCE_AVG: acc[i] += x[i]; break;
      case KEEL_REDUCE_PROD: acc[i] *= x[i]; break;
      case KEEL_REDUCE_MIN: acc[i] = std::min(acc[i], x[i]); break;
      case KEEL_REDUCE_MAX: acc[i] = std::max(acc[i], x[i]); break;
    }
  }
}

template <class T>
std::vector<T> reduce_all(World& w, uint64_t n, int32_t op) {
  std::vector<T> acc(static_cast<const T*>(w.sends[0]), static_cast<const T*>(w.sends[0]) + n);
  for (int r = 1; r < w.size; ++r) reduce_into(acc, static_cast<const T*>(w.sends[static_cast<size_t>(r)]), n, op);
  if (op == KEEL_REDUCE_AVG)
    for (auto& v : acc) v /= static_cast<T>(w.size);
  return acc;
}

// bf16 as the Gloo plugin reduces it: each value widened to f32, the sum (and the average's quotient) rounded back to
// bf16 (to nearest even) after every step.
float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
std::vector<uint16_t> reduce_bf16(World& w, uint64_t n, int32_t op) {
  std::vector<uint16_t> acc(static_cast<const uint16_t*>(w.sends[0]), static_cast<const uint16_t*>(w.sends[0]) + n);
  for (int r = 1; r < w.size; ++r) {
    const auto* x = static_cast<const uint16_t*>(w.sends[static_cast<size_t>(r)]);
    for (uint64_t i = 0; i < n; ++i) acc[i] = f32_to_bf16(bf16_to_f32(acc[i]) + bf16_to_f32(x[i]));
  }
  if (op == KEEL_REDUCE_AVG)
    for (auto& v : acc) v = f32_to_bf16(bf16_to_f32(v) / static_cast<float>(w.size));
  return acc;
}

// One collective: publish (send, count, dtype), meet, compute the result from every rank's send buffer into a private
// copy, meet again (nobody reads send buffers after that), write recv.
keel_status_t collective(keel_communicator_t c, const void* send, void* recv, uint64_t count, int32_t dtype,
                         const std::function<std::vector<char>(World&)>& compute, const char* what) {
  World& w = *c->world;
  std::unique_lock<std::mutex> lk(w.mu);
  w.sends[static_cast<size_t>(c->rank)] = send;
  w.counts[static_cast<size_t>(c->rank)] = count;
  w.dtypes[static_cast<size_t>(c->rank)] = dtype;
  if (!w.barrier(lk))
    return make_status(KEEL_STATUS_DEADLINE_EXCEEDED, std::string("inproc ") + what + ": a rank never arrived");
  bool same = true;
  for (int r = 0; r < w.size; ++r)
    same = same && w.counts[static_cast<size_t>(r)] == count && w.dtypes[static_cast<size_t>(r)] == dtype;
  lk.unlock();
  std::vector<char> out;
  if (same && elem_size(dtype)) out = compute(w);
  lk.lock();
  if (!w.barrier(lk))
    return make_status(KEEL_STATUS_DEADLINE_EXCEEDED, std::string("inproc ") + what + ": a rank never arrived");
  lk.unlock();
  if (!same)
    return make_status(KEEL_STATUS_INVALID_ARGUMENT,
                       std::string("inproc ") + what + ": count or dtype differs between ranks");
  if (!elem_size(dtype)) return make_status(KEEL_STATUS_UNIMPLEMENTED, "inproc: dtype");
  if (!out.empty()) std::memcpy(recv, out.data(), out.size());
  return nullptr;
}

template <class T>
std::vector<char> bytes_of(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

keel_status_t ip_create(void* ud, keel_kv_store_t*, int32_t rank, int32_t size, int32_t, int64_t,
                        keel_communicator_t* out) {
  auto* w = static_cast<World*>(ud);
  if (size != w->size) return make_status(KEEL_STATUS_INVALID_ARGUMENT, "inproc: world size");
  *out = new keel_communicator_s{w, rank};
  return nullptr;
}
void ip_release(void*, keel_communicator_t c) { delete c; }
int32_t ip_rank(void*, keel_communicator_t c) { return c->rank; }
int32_t ip_size(void*, keel_communicator_t c) { return c->world->size; }
keel_status_t ip_all_reduce(void*, keel_communicator_t c, const void* s, void* r, uint64_t n, int32_t dt, int32_t op,
                            keel_stream_t) {
  return collective(
      c, s, r, n, dt,
      [&](World& w) {
        switch (dt) {
          case KEEL_DTYPE_BF16: return bytes_of(reduce_bf16(w, n, op));
          case KEEL_DTYPE_F32: return bytes_of(reduce_all<float>(w, n, op));
          case KEEL_DTYPE_F64: return bytes_of(reduce_all<double>(w, n, op));
          case KEEL_DTYPE_I32: return bytes_of(reduce_all<int32_t>(w, n, op));
          default: return bytes_of(reduce_all<int64_t>(w, n, op));
        }
      },
      "all_reduce");
}
std::atomic<int> g_broadcasts{0};  // broadcast calls of every rank
keel_status_t ip_broadcast(void*, keel_communicator_t c, const void* s, void* r, uint64_t n, int32_t dt, int32_t root,
                           keel_stream_t) {
  g_broadcasts.fetch_add(1);
  return collective(
      c, s, r, n, dt,
      [&](World& w) {
        const char* p = static_cast<const char*>(w.sends[static_cast<size_t>(root)]);
        return std::vector<char>(p, p + n * elem_size(dt));
      },
      "broadcast");
}
keel_status_t ip_all_gather(void*, keel_communicator_t c, const void* s, void* r, uint64_t n, int32_t dt,
                            keel_stream_t) {
  return collective(
      c, s, r, n, dt,
      [&](World& w) {
        std::vector<char> out;
        for (int k = 0; k < w.size; ++k) {
          const char* p = static_cast<const char*>(w.sends[static_cast<size_t>(k)]);
          out.insert(out.end(), p, p + n * elem_size(dt));
        }
        return out;
      },
      "all_gather");
}
keel_status_t ip_barrier(void*, keel_communicator_t c, keel_stream_t) {
  int32_t x = 0;
  return collective(
      c, &x, &x, 1, KEEL_DTYPE_I32, [](World&) { return std::vector<char>(); }, "barrier");
}

keel::CollectiveEntry inproc_entry(World* w) {
  keel::CollectiveEntry e;
  e.backend = "inproc";
  e.device_type = "cpu";
  e.table.struct_size = sizeof(keel_collective_table_t);
  e.table.backend = "inproc";
  e.table.device_type = "cpu";
  e.table.user_data = w;
  e.table.communicator_create = ip_create;
  e.table.communicator_release = ip_release;
  e.table.rank = ip_rank;
  e.table.size = ip_size;
  e.table.all_reduce = ip_all_reduce;
  e.table.broadcast = ip_broadcast;
  e.table.all_gather = ip_all_gather;
  e.table.barrier = ip_barrier;
  return e;
}

// Runs fn(rank, comm) on `n` threads joined by one in-process world.
void run_ranks(int n, const std::function<void(int, const keel::hal::Communicator&)>& fn) {
  World w(n);
  keel::CollectiveEntry entry = inproc_entry(&w);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = keel::hal::Communicator::create(&entry, nullptr, r, n, 0, 10000);
      ASSERT_TRUE(comm.is_ok()) << comm.status().to_string();
      fn(r, *comm);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

namespace keel::train {
namespace {

using namespace keel::train::nn;

std::shared_ptr<TensorDataset> quadrants(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.3f);
  std::vector<float> x(static_cast<size_t>(n * 64));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % 4;
    y[static_cast<size_t>(i)] = c;
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t q = 0; q < 8; ++q) {
        const bool on = (r / 4) == c / 2 && (q / 4) == c % 2;
        x[static_cast<size_t>(i * 64 + r * 8 + q)] = (on ? 1.f : 0.f) + noise(rng);
      }
  }
  return TensorDataset::create(keel::Tensor::from_vector(DType::kF32, {n, 1, 8, 8}, x),
                               keel::Tensor::from_vector(DType::kI64, {n}, y))
      .value();
}

// The global generator is not synchronised: rank threads build their models under this lock.
std::mutex generator_mu;

std::shared_ptr<Sequential> small_cnn(uint64_t seed) {
  std::lock_guard<std::mutex> lk(generator_mu);
  eager::manual_seed(seed);
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Conv2D>(1, 4, 3))
      .push_back(std::make_shared<ReLU>())
      .push_back(std::make_shared<MaxPool2D>(2));
  net->push_back(std::make_shared<Flatten>());
  net->push_back(std::make_shared<Linear>(4 * 3 * 3, 16)).push_back(std::make_shared<ReLU>());
  net->push_back(std::make_shared<Linear>(16, 4));
  return net;
}

// max |a - b| / max |b| over a tensor.
double rel_diff(const Tensor& a, const Tensor& b) {
  auto x = a.to_vector<float>(), y = b.to_vector<float>();
  double d = 0, m = 1e-12;
  for (size_t i = 0; i < x.size(); ++i)
    d = std::max(d, std::fabs(double(x[i]) - y[i])), m = std::max(m, std::fabs(double(y[i])));
  return d / m;
}

void expect_same_weights(const Module& a, const Module& b, double tol, const std::string& what) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_LE(rel_diff(pa[i].second, pb[i].second), tol) << what << ": " << pa[i].first;
}

// ---------------------------------------------------------------------------------------------- hook

TEST(PostAccumulateGradHook, RunsOncePerLeafAfterAccumulationInReverseOrder) {
  eager::manual_seed(1);
  Linear l1(3, 4), l2(4, 2);
  std::vector<std::string> seen;
  std::vector<float> grad_sums;
  auto hook_for = [&](const std::string& name) {
    return [&, name](const Tensor& p) {
      seen.push_back(name);
      ASSERT_TRUE(p.grad().defined());
      auto g = p.grad().to_vector<float>();
      float s = 0;
      for (float v : g) s += v;
      grad_sums.push_back(s);
    };
  };
  l1.weight().register_post_accumulate_grad_hook(hook_for("l1.w"));
  int64_t h = l2.weight().register_post_accumulate_grad_hook(hook_for("l2.w"));
  // Used twice in one graph: the hook still runs once, after both contributions.
  auto x = eager::ones({2, 3});
  auto h1 = l1(x);
  auto loss = eager::sum(l2(h1) + l2(h1));
  loss.backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], "l2.w");  // the last layer's gradient is ready first
  EXPECT_EQ(seen[1], "l1.w");
  // A second backward accumulates: the hook sees twice the gradient.
  auto loss2 = eager::sum(l2(l1(x)) + l2(l1(x)));
  loss2.backward();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_NEAR(grad_sums[2], 2 * grad_sums[0], 1e-4 * (1 + std::fabs(grad_sums[0])));
  EXPECT_TRUE(l2.weight().remove_post_accumulate_grad_hook(h));
  EXPECT_FALSE(l2.weight().remove_post_accumulate_grad_hook(h));
  eager::sum(l2(l1(x))).backward();
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen.back(), "l1.w");
  // Not on a non-leaf.
  auto y = l1(x);
  EXPECT_THROW(y.register_post_accumulate_grad_hook([](const Tensor&) {}), eager::Error);
}

// ---------------------------------------------------------------------------------------------- sampler

TEST(DistributedSampler, ShardsAreEqualDisjointAndCover) {
  for (bool drop : {false, true}) {
    for (int64_t replicas : {1, 2, 3, 4}) {
      const int64_t n = 10;
      std::vector<int64_t> all;
      std::set<int64_t> distinct;
      for (int64_t r = 0; r < replicas; ++r) {
        auto s = DistributedSampler::create(n, replicas, r, true, 7, drop).value();
        s.set_epoch(3);
        auto idx = s.indices();
        EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples());
        EXPECT_EQ(s.num_samples(), drop ? n / replicas : (n + replicas - 1) / replicas);
        all.insert(all.end(), idx.begin(), idx.end());
        distinct.insert(idx.begin(), idx.end());
      }
      if (drop) {
        EXPECT_EQ(distinct.size(), all.size()) << "disjoint, replicas " << replicas;
      } else {
        EXPECT_EQ(static_cast<int64_t>(distinct.size()), n) << "covering, replicas " << replicas;
        EXPECT_EQ(static_cast<int64_t>(all.size()) - n, (replicas - n % replicas) % replicas) << "padding only";
      }
    }
  }
  // Epochs differ, the same epoch repeats.
  auto s = DistributedSampler::create(100, 2, 1, true, 0).value();
  s.set_epoch(0);
  auto e0 = s.indices();
  s.set_epoch(1);
  EXPECT_NE(e0, s.indices());
  s.set_epoch(0);
  EXPECT_EQ(e0, s.indices());
  EXPECT_FALSE(DistributedSampler::create(10, 2, 2).is_ok());
  EXPECT_FALSE(DistributedSampler::create(10, 0, 0).is_ok());
}

TEST(DistributedSampler, DataLoaderShardsMatchTheSampler) {
  auto ds = quadrants(101, 2);
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 2; ++r) {
    DataLoaderOptions o;
    o.batch_size = 10;
    o.seed = 5;
    o.num_replicas = 2;
    o.rank = r;
    auto loader = DataLoader::create(ds, o).value();
    EXPECT_EQ(loader->batches_per_epoch(), 6);  // 51 examples per rank
    auto s = DistributedSampler::create(101, 2, r, true, 5).value();
    s.set_epoch(4);
    EXPECT_EQ(loader->epoch_order(4), s.indices());
    for (int64_t i : loader->epoch_order(4)) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), 101u);
  DataLoaderOptions bad;
  bad.num_replicas = 2;
  bad.rank = 2;
  EXPECT_FALSE(DataLoader::create(ds, bad).is_ok());
}

// ---------------------------------------------------------------------------------------------- DataParallel

// Trains `steps` steps of SGD with momentum: data-parallel over `world` thread ranks (per-rank batch `batch`,
// `micro` micro-batches per step, all but the last under no_sync) and returns rank 0's model; every rank's final
// weights are checked equal to rank 0's.
// The model: small_cnn, or another from `make` (seed -> model: the same seed the same weights); `frozen` names
// parameters (by index) that do not require grad; `dpo` the DataParallel options (bucket_cap_mb = cap_mb).
struct TrainSetup {
  std::function<std::shared_ptr<Sequential>(uint64_t)> make = small_cnn;
  std::vector<size_t> frozen;
  DataParallelOptions dpo;
};
void freeze(Module& m, const std::vector<size_t>& frozen) {
  auto params = m.parameters();
  for (size_t i : frozen) params[i].requires_grad_(false);
}
// What the optimizer trains: the parameters that require grad (as keel train --freeze passes them).
std::vector<Tensor> trainable(const Module& m) {
  std::vector<Tensor> out;
  for (const Tensor& p : m.parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

std::shared_ptr<Sequential> train_dp(int world, int64_t batch, int micro, int steps, double cap_mb,
                                     std::vector<std::vector<std::vector<size_t>>>* layouts = nullptr,
                                     const TrainSetup& setup = {}) {
  auto ds = quadrants(64 * steps, 3);
  std::vector<std::shared_ptr<Sequential>> models;
  for (int r = 0; r < world; ++r) {
    models.push_back(setup.make(100 + r));  // different inits: create() broadcasts rank 0's
    freeze(*models.back(), setup.frozen);
  }
  if (layouts) layouts->assign(static_cast<size_t>(world), {});
  run_ranks(world, [&](int rank, const hal::Communicator& comm) {
    auto& model = *models[static_cast<size_t>(rank)];
    DataParallelOptions dpo = setup.dpo;
    dpo.bucket_cap_mb = cap_mb;
    auto dp_or = DataParallel::create(model, comm, dpo);
    ASSERT_TRUE(dp_or.is_ok()) << dp_or.status().to_string();
    auto& dp = **dp_or;
    SGD opt(trainable(model), SGDOptions{0.05, 0.9});
    DataLoaderOptions o;
    o.batch_size = batch / micro;
    o.seed = 11;
    o.workers = 0;
    o.num_replicas = world;
    o.rank = rank;
    auto loader = DataLoader::create(ds, o).value();
    ASSERT_TRUE(loader->start_epoch(0).is_ok());
    CrossEntropyLoss ce;
    for (int s = 0; s < steps; ++s) {
      for (int m = 0; m < micro; ++m) {
        auto b = loader->next();
        ASSERT_TRUE(b.is_ok() && b->has_value());
        auto run = [&] {
          auto loss = ce(dp(Tensor((*b)->data)), Tensor((*b)->target));
          (micro > 1 ? loss / static_cast<float>(micro) : loss).backward();
        };
        if (m + 1 < micro) {
          auto guard = dp.no_sync();
          run();
        } else {
          run();
        }
      }
      Status st = dp.finish();
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      opt.step();
      opt.zero_grad();
      if (s == 0 && layouts) (*layouts)[static_cast<size_t>(rank)] = dp.bucket_layout();
    }
    EXPECT_EQ(dp.stats().steps, steps);
    EXPECT_GT(dp.stats().all_reduces, 0);
  });
  for (int r = 1; r < world; ++r)
    expect_same_weights(*models[static_cast<size_t>(r)], *models[0], 0, "rank " + std::to_string(r));
  return models[0];
}

std::shared_ptr<Sequential> train_single(int64_t batch, int steps, const TrainSetup& setup = {}) {
  auto ds = quadrants(64 * steps, 3);
  auto model = setup.make(100);
  freeze(*model, setup.frozen);
  SGD opt(trainable(*model), SGDOptions{0.05, 0.9});
  DataLoaderOptions o;
  o.batch_size = batch;
  o.seed = 11;
  o.workers = 0;
  auto loader = DataLoader::create(ds, o).value();
  EXPECT_TRUE(loader->start_epoch(0).is_ok());
  CrossEntropyLoss ce;
  for (int s = 0; s < steps; ++s) {
    auto b = loader->next();
    EXPECT_TRUE(b.is_ok() && b->has_value());
    ce((*model)(Tensor((*b)->data)), Tensor((*b)->target)).backward();
    opt.step();
    opt.zero_grad();
  }
  return model;
}

TEST(DataParallel, TwoRanksOfBatch32EqualOneProcessOfBatch64) {
  auto ref = train_single(64, 20);
  // Small buckets (several per step, started during backward) and one bucket for everything.
  for (double cap : {0.002, 25.0}) {
    auto dp = train_dp(2, 32, 1, 20, cap);
    expect_same_weights(*dp, *ref, 1e-5, "cap " + std::to_string(cap));
  }
}

// Random models, worlds, bucket caps and rebuild settings, micro-batches and frozen parameters: data-parallel over
// thread ranks equals one process of the whole batch (the buckets' layout, their order on every rank, the rebuild
// from the observed order and the zero-filled buckets of frozen or unreached parameters all stay out of the result).
// KEEL_RANDOM_DP_SEED / KEEL_RANDOM_DP_COUNT choose the seeds (default 1 and 24).
std::shared_ptr<Sequential> random_model(uint64_t arch_seed, uint64_t weight_seed) {
  std::mt19937_64 r(arch_seed * 0x9E3779B97F4A7C15ull + 3);
  auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + static_cast<int64_t>(r() % v.size())); };
  std::lock_guard<std::mutex> lk(generator_mu);
  eager::manual_seed(weight_seed);
  auto net = std::make_shared<Sequential>();
  int64_t c = 1, side = 8;
  const int convs = static_cast<int>(r() % 3);
  for (int i = 0; i < convs; ++i) {
    const int64_t m = pick({2, 4, 8, 16}), k = pick({1, 3}), pad = k == 3 ? pick({0, 1}) : 0;
    Conv2DOptions o(c, m, {k, k});
    o.padding = {pad, pad};
    o.bias = r() % 3 != 0;
    o.relu = r() % 2 == 0;
    net->push_back(std::make_shared<Conv2D>(o));
    if (!o.relu) net->push_back(std::make_shared<Tanh>());
    c = m, side = side + 2 * pad - k + 1;
    if (side >= 4 && r() % 2 == 0) net->push_back(std::make_shared<MaxPool2D>(2)), side /= 2;
  }
  net->push_back(std::make_shared<Flatten>());
  int64_t features = c * side * side;
  const int hidden = static_cast<int>(r() % 3);
  for (int i = 0; i < hidden; ++i) {
    const int64_t h = pick({3, 16, 33, 200});
    net->push_back(std::make_shared<Linear>(features, h, r() % 4 != 0));
    net->push_back(std::make_shared<ReLU>());
    features = h;
  }
  net->push_back(std::make_shared<Linear>(features, 4));
  return net;
}

TEST(DataParallel, RandomModelsBucketsAndWorldsEqualOneProcess) {
  const char* first_env = std::getenv("KEEL_RANDOM_DP_SEED");
  const char* count_env = std::getenv("KEEL_RANDOM_DP_COUNT");
  const uint64_t first = first_env ? std::strtoull(first_env, nullptr, 10) : 1;
  const uint64_t count = count_env ? std::strtoull(count_env, nullptr, 10) : 24;
  for (uint64_t seed = first; seed < first + count; ++seed) {
    std::mt19937_64 r(seed);
    const int world = static_cast<int>(2 + r() % 2), micro = static_cast<int>(1 + r() % 2);
    const int64_t batch = world == 2 ? 32 : 16;  // per rank (a multiple of micro); one process runs world x batch
    TrainSetup setup;
    setup.make = [seed](uint64_t weights) { return random_model(seed, weights); };
    const double caps[] = {0.0002, 0.002, 0.02, 25.0};
    const double cap = caps[r() % 4];
    setup.dpo.rebuild_buckets = r() % 3 != 0;
    setup.dpo.gap_split = r() % 2 ? 0.15 : 0.0;
    setup.dpo.gap_split_min_mb = r() % 2 ? 0.0 : 1.0;
    const auto probe = random_model(seed, 1);  // the architecture, for the frozen set and the description
    const size_t params = probe->parameters().size();
    for (size_t i = 0; i + 1 < params; ++i)  // the classifier's bias always trains
      if (r() % 5 == 0) setup.frozen.push_back(i);
    std::ostringstream what;
    what << "seed " << seed << ": world " << world << " x batch " << batch << " (" << micro << " micro), cap " << cap
         << " MiB, rebuild " << setup.dpo.rebuild_buckets << ", gap split " << setup.dpo.gap_split << " (min "
         << setup.dpo.gap_split_min_mb << " MiB), " << setup.frozen.size() << " frozen of " << params << ": "
         << probe->to_string();
    auto ref = train_single(world * batch, 4, setup);
    auto dp = train_dp(world, batch, micro, 4, cap, nullptr, setup);
    expect_same_weights(*dp, *ref, 1e-5, what.str());
    if (HasFailure()) break;
  }
}

TEST(DataParallel, NoSyncAccumulationEqualsABiggerBatch) {
  auto ref = train_single(64, 6);
  // 2 ranks × 2 micro-batches of 16, the first under no_sync.
  auto dp = train_dp(2, 32, 2, 6, 25.0);
  expect_same_weights(*dp, *ref, 1e-5, "no_sync");
}

TEST(DataParallel, BucketsFollowReverseOrderThenTheObservedOrder) {
  // Parameters: 0 conv.w [4,1,3,3] 1 conv.b [4] 2 fc1.w [16,36] 3 fc1.b [16] 4 fc2.w [4,16] 5 fc2.b [4].
  std::vector<std::vector<std::vector<size_t>>> layouts(2);
  run_ranks(2, [&](int rank, const hal::Communicator& comm) {
    auto m = small_cnn(1);
    DataParallelOptions o;
    o.bucket_cap_mb = 600.0 / (1024 * 1024);  // 600 bytes: fc1.w (2304 B) alone, the small ones together
    auto dp = DataParallel::create(*m, comm, o).value();
    const std::vector<std::vector<size_t>> initial = {{5, 4, 3}, {2}, {1, 0}};
    EXPECT_EQ(dp->bucket_layout(), initial) << "rank " << rank;
    EXPECT_FALSE(dp->buckets_rebuilt());
    auto x = Tensor(quadrants(8, 1)->data());
    eager::sum((*dp)(x)).backward();
    ASSERT_TRUE(dp->finish().is_ok());
    EXPECT_FALSE(dp->buckets_rebuilt());  // after the second step (the first one's timing is not typical)
    eager::sum((*dp)(x)).backward();
    ASSERT_TRUE(dp->finish().is_ok());
    EXPECT_TRUE(dp->buckets_rebuilt());
    const auto& order = dp->observed_ready_order();
    ASSERT_EQ(order.size(), 6u);
    // Gradients become ready from the output backwards: fc2 before fc1 before conv.
    auto pos = [&](size_t p) { return std::find(order.begin(), order.end(), p) - order.begin(); };
    EXPECT_LT(pos(4), pos(2));
    EXPECT_LT(pos(5), pos(3));
    EXPECT_LT(pos(2), pos(0));
    EXPECT_LT(pos(3), pos(1));
    // Rebuilt in that order (the same on both ranks: rank 0's order), split where backward spent long.
    std::vector<size_t> flat;
    for (const auto& b : dp->bucket_layout()) flat.insert(flat.end(), b.begin(), b.end());
    if (rank == 0) {
      EXPECT_EQ(flat, order);
    }
    layouts[static_cast<size_t>(rank)] = dp->bucket_layout();
    // Every gradient is the average: sum(model(x)) has the same gradient on both ranks (same x, same weights).
    for (const auto& p : m->parameters()) EXPECT_TRUE(p.grad().defined());
    // A forward without finish() after a backward is an error, not a silent desync.
    eager::sum((*dp)(x)).backward();
    EXPECT_THROW((*dp)(x), eager::Error);
    ASSERT_TRUE(dp->finish().is_ok());
  });
  EXPECT_EQ(layouts[0], layouts[1]);
}

TEST(DataParallel, ParameterShapeMismatchIsAnErrorNamingIt) {
  run_ranks(2, [&](int rank, const hal::Communicator& comm) {
    std::unique_lock<std::mutex> lk(generator_mu);
    Sequential m;
    m.push_back(std::make_shared<Linear>(4, 3)).push_back(std::make_shared<Linear>(3, rank == 0 ? 2 : 5));
    lk.unlock();
    auto dp = DataParallel::create(m, comm);
    ASSERT_FALSE(dp.is_ok());
    const std::string msg = dp.status().to_string();
    EXPECT_NE(msg.find("'1.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0 has f32 [2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 has f32 [5, 3]"), std::string::npos) << msg;
  });
  run_ranks(2, [&](int rank, const hal::Communicator& comm) {
    std::unique_lock<std::mutex> lk(generator_mu);
    Sequential m;
    m.push_back(std::make_shared<Linear>(4, 3));
    if (rank == 1) m.push_back(std::make_shared<Linear>(3, 3));
    lk.unlock();
    auto dp = DataParallel::create(m, comm);
    ASSERT_FALSE(dp.is_ok());
    EXPECT_NE(dp.status().to_string().find("rank 0 has 2 parameters, rank 1 has 4"), std::string::npos)
        << dp.status().to_string();
  });
}

// A module whose second branch only rank 1 uses.
class Branchy : public Module {
 public:
  explicit Branchy(bool use_b) : Module("Branchy"), use_b_(use_b) {
    std::lock_guard<std::mutex> lk(generator_mu);
    eager::manual_seed(3);
    a = register_module("a", std::make_shared<Linear>(4, 2));
    b = register_module("b", std::make_shared<Linear>(4, 2));
  }
  Tensor forward(const Tensor& x) override { return use_b_ ? (*a)(x) + (*b)(x) : (*a)(x); }
  std::shared_ptr<Linear> a, b;
  bool use_b_;
};

TEST(DataParallel, UnusedParametersAreZeroFilledNotHung) {
  std::vector<std::vector<float>> b_grads(2);
  run_ranks(2, [&](int rank, const hal::Communicator& comm) {
    Branchy m(rank == 1);
    auto dp = DataParallel::create(m, comm).value();
    eager::sum(dp->forward(eager::ones({2, 4}))).backward();
    ASSERT_TRUE(dp->finish().is_ok());
    ASSERT_TRUE(m.b->weight().grad().defined());
    b_grads[static_cast<size_t>(rank)] = m.b->weight().grad().to_vector<float>();
  });
  EXPECT_EQ(b_grads[0], b_grads[1]);
  // Rank 1's gradient of b.weight is 2 per element (batch 2, sum): averaged with rank 0's zeros: 1.
  for (float v : b_grads[0]) EXPECT_FLOAT_EQ(v, 1.f);
}

TEST(DataParallel, BuffersComeFromRankZero) {
  std::vector<std::vector<float>> means(2);
  run_ranks(2, [&](int rank, const hal::Communicator& comm) {
    std::unique_lock<std::mutex> lk(generator_mu);
    eager::manual_seed(static_cast<uint64_t>(rank));
    Sequential m;
    m.push_back(std::make_shared<Conv2D>(1, 2, 3)).push_back(std::make_shared<BatchNorm2D>(2));
    lk.unlock();
    auto dp = DataParallel::create(m, comm).value();
    // Different data per rank: running statistics diverge in forward, and the next forward re-syncs them first.
    auto x = eager::full({2, 1, 5, 5}, static_cast<float>(rank + 1));
    eager::sum(dp->forward(x)).backward();
    ASSERT_TRUE(dp->finish().is_ok());
    ASSERT_TRUE(dp->broadcast_buffers().is_ok());
    means[static_cast<size_t>(rank)] = m.named_buffers()[0].second.to_vector<float>();
  });
  EXPECT_EQ(means[0], means[1]);
}

// finish() hands out .grad as views of one averaged buffer per bucket and step: each view starts 64-byte aligned,
// and a .grad the caller keeps from one step still holds that step's values after the next step.
TEST(DataParallel, GradientsOfAStepStayPutAfterTheNextStep) {
  run_ranks(2, [&](int rank, const hal::Communicator& comm) {
    auto m = small_cnn(5);
    auto dp = DataParallel::create(*m, comm).value();
    std::vector<Tensor> kept;
    std::vector<std::vector<float>> values;
    for (int step = 0; step < 3; ++step) {
      for (auto& p : m->parameters()) p.zero_grad();
      auto data = quadrants(8, static_cast<uint32_t>(10 * step + rank));
      eager::sum((*dp)(Tensor(data->data()))).backward();
      ASSERT_TRUE(dp->finish().is_ok());
      for (auto& p : m->parameters()) {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p.grad().data().raw_data()) % 64, 0u) << "step " << step;
      }
      if (step == 0) {
        for (auto& p : m->parameters()) kept.push_back(p.grad()), values.push_back(p.grad().to_vector<float>());
      }
    }
    for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i].to_vector<float>(), values[i]) << "parameter " << i;
    // The later steps saw other data: their gradients differ from the kept ones.
    EXPECT_NE(m->parameters()[0].grad().to_vector<float>(), values[0]);
  });
}

// One rank takes the same path as many (as torch DDP): buckets, all-reduces of one rank, gradients unchanged.
TEST(DataParallel, WorldSizeOneTakesTheSamePath) {
  run_ranks(1, [&](int, const hal::Communicator& comm) {
    auto m = small_cnn(4);
    auto dp = DataParallel::create(*m, comm).value();
    EXPECT_EQ(dp->world_size(), 1);
    for (int step = 1; step <= 3; ++step) {
      for (auto& p : m->parameters()) p.set_grad(Tensor());
      eager::sum((*dp)(Tensor(quadrants(4, 1)->data()))).backward();
      std::vector<std::vector<float>> g;
      for (auto& p : m->parameters()) g.push_back(p.grad().to_vector<float>());
      std::this_thread::sleep_for(std::chrono::milliseconds(3));  // this rank's "work" before its finish()
      ASSERT_TRUE(dp->finish().is_ok());
      for (size_t i = 0; i < g.size(); ++i) EXPECT_EQ(m->parameters()[i].grad().to_vector<float>(), g[i]) << i;
      EXPECT_EQ(dp->stats().steps, step);
    }
    EXPECT_GE(dp->stats().all_reduces, 3);
    // One wait per synchronised step, adding up to wait_seconds.
    ASSERT_EQ(dp->stats().step_wait_ms.size(), 3u);
    double sum_ms = 0;
    for (float w : dp->stats().step_wait_ms) sum_ms += w;
    EXPECT_NEAR(sum_ms, dp->stats().wait_seconds * 1e3, 1e-3);
    // The work between steps: counted from the first finish() on (2 intervals of at least the 3 ms slept each).
    EXPECT_EQ(dp->stats().compute_steps, 2);
    EXPECT_GE(dp->stats().compute_seconds, 0.006);
    // A new epoch (reset_stats) starts counting at its first finish(), not at the last one of the epoch before.
    dp->reset_stats();
    eager::sum((*dp)(Tensor(quadrants(4, 1)->data()))).backward();
    ASSERT_TRUE(dp->finish().is_ok());
    EXPECT_EQ(dp->stats().compute_steps, 0);
    EXPECT_EQ(dp->stats().step_wait_ms.size(), 1u);
  });
}

TEST(DataParallel, WaitSummaryTakesMedianTailAndLongest) {
  const WaitSummary none = summarize_waits({});
  EXPECT_EQ(none.median, 0);
  EXPECT_EQ(none.max, 0);
  const WaitSummary one = summarize_waits({2.5f});
  EXPECT_EQ(one.median, 2.5);
  EXPECT_EQ(one.p90, 2.5);
  EXPECT_EQ(one.max, 2.5);
  // 20 steps: 0.1 .. 2.0 ms shuffled, one stall of 30 ms in place of 2.0.
  std::vector<float> ms;
  for (int k = 19; k >= 1; k -= 2) ms.push_back(0.1f * static_cast<float>(k));
  for (int k = 2; k <= 18; k += 2) ms.push_back(0.1f * static_cast<float>(k));
  ms.push_back(30.0f);
  const WaitSummary w = summarize_waits(ms);
  EXPECT_FLOAT_EQ(static_cast<float>(w.median), 1.1f);  // element 10 of 20 in order
  EXPECT_FLOAT_EQ(static_cast<float>(w.p90), 1.9f);     // element 18
  EXPECT_FLOAT_EQ(static_cast<float>(w.max), 30.0f);
}

// broadcast_tensors coalesces: 30 tensors of two dtypes, interleaved, with an empty one, travel as one broadcast per
// dtype (torch DDP's _broadcast_coalesced), and every rank ends with the root's values in every tensor.
TEST(DataParallel, ManyTensorsBroadcastAsOneCollectivePerDtype) {
  g_broadcasts = 0;
  run_ranks(3, [&](int rank, const hal::Communicator& comm) {
    std::vector<Tensor> ts;
    for (int i = 0; i < 30; ++i) {
      const bool ints = i % 3 == 2;
      Tensor t = eager::full({i % 4 + 1, 3}, static_cast<float>(rank * 100 + i), ints ? DType::kI64 : DType::kF32);
      ts.push_back(t);
    }
    ts.push_back(eager::zeros({0}, DType::kF32));
    ASSERT_TRUE(broadcast_tensors(comm, ts, 1).is_ok());
    for (int i = 0; i < 30; ++i) {
      const auto got = ts[static_cast<size_t>(i)].to(DType::kF32).to_vector<float>();
      for (float v : got) ASSERT_EQ(v, static_cast<float>(100 + i)) << "rank " << rank << " tensor " << i;
    }
  });
  EXPECT_EQ(g_broadcasts.load(), 3 * 2) << "one broadcast per dtype and rank";
}

// grad_compress = bf16: the buckets travel as bf16 (about half the bytes), and each rank ends with the average of the
// ranks' gradients to bf16's precision, in f32 (the same step uncompressed is the reference). Other dtypes are an
// error.
TEST(DataParallel, CompressedGradientsAreTheAverageToBf16Precision) {
  auto step = [](DType compress, std::vector<std::vector<float>>* grads, uint64_t* bytes) {
    run_ranks(2, [&](int rank, const hal::Communicator& comm) {
      auto m = small_cnn(20 + rank);
      DataParallelOptions o;
      o.grad_compress = compress;
      auto dp = DataParallel::create(*m, comm, o).value();
      eager::sum((*dp)(Tensor(quadrants(8, 30 + rank)->data()))).backward();
      ASSERT_TRUE(dp->finish().is_ok());
      if (rank != 0) return;
      for (auto& p : m->parameters()) {
        EXPECT_EQ(p.grad().dtype(), DType::kF32);
        grads->push_back(p.grad().to_vector<float>());
      }
      *bytes = dp->stats().bytes;
    });
  };
  std::vector<std::vector<float>> exact, compressed;
  uint64_t exact_bytes = 0, compressed_bytes = 0;
  step(DType::kUndefined, &exact, &exact_bytes);
  step(DType::kBF16, &compressed, &compressed_bytes);
  ASSERT_EQ(exact.size(), compressed.size());
  EXPECT_LT(compressed_bytes * 10, exact_bytes * 6) << "2 bytes an element (each slice padded to 64 bytes)";
  bool any_rounded = false;
  for (size_t i = 0; i < exact.size(); ++i) {
    ASSERT_EQ(exact[i].size(), compressed[i].size());
    float scale = 1e-30f;
    for (float v : exact[i]) scale = std::max(scale, std::fabs(v));
    for (size_t j = 0; j < exact[i].size(); ++j) {
      // Each rank's gradient, their sum and the quotient rounded to 8 significant bits.
      EXPECT_NEAR(compressed[i][j], exact[i][j], std::fabs(exact[i][j]) * 0.012f + scale * 1e-3f) << i << "," << j;
      any_rounded = any_rounded || compressed[i][j] != exact[i][j];
    }
  }
  EXPECT_TRUE(any_rounded) << "the gradients did not travel as bf16";
  run_ranks(1, [&](int, const hal::Communicator& comm) {
    auto m = small_cnn(1);
    DataParallelOptions o;
    o.grad_compress = DType::kI32;
    auto dp = DataParallel::create(*m, comm, o);
    ASSERT_FALSE(dp.is_ok());
    EXPECT_NE(dp.status().message().find("grad_compress must be bf16 or f16"), std::string::npos)
        << dp.status().to_string();
  });
}

// SyncBatchNorm: two ranks of 4 images each normalise as one BatchNorm2D over the 8 together: the outputs, the input
// gradients, the weight and bias gradients (summed over the ranks: each rank's loss covers its own images) and the
// running statistics. Without the reductions across ranks every one of them differs.
TEST(DataParallel, SyncBatchNormEqualsOneBatchNormOverEveryRanksBatch) {
  constexpr int64_t N = 4, C = 3, H = 5, W = 6, kImage = C * H * W;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.5f, 2.f);
  std::vector<float> xs(static_cast<size_t>(2 * N * kImage)), rs(xs.size());
  for (auto& v : xs) v = dist(rng);
  for (auto& v : rs) v = dist(rng);
  const std::vector<float> gamma = {0.5f, 1.5f, -1.f}, beta = {0.1f, -0.2f, 0.3f};
  struct Result {
    std::vector<float> y, dx, dw, db, mean, var;
  };
  auto run = [&](nn::BatchNorm2D& bn, int64_t first, int64_t images) {
    {
      eager::NoGradGuard ng;
      bn.weight().copy_(eager::from_vector(gamma, {C}));
      bn.bias().copy_(eager::from_vector(beta, {C}));
    }
    const auto from = xs.begin() + first * kImage, to = from + images * kImage;
    const auto r_from = rs.begin() + first * kImage, r_to = r_from + images * kImage;
    Tensor x(keel::Tensor::from_vector(DType::kF32, {images, C, H, W}, std::vector<float>(from, to)), true);
    Tensor y = bn(x);
    eager::sum(y * eager::from_vector(std::vector<float>(r_from, r_to), {images, C, H, W})).backward();
    return Result{y.to_vector<float>(),
                  x.grad().to_vector<float>(),
                  bn.weight().grad().to_vector<float>(),
                  bn.bias().grad().to_vector<float>(),
                  bn.running_mean().to_vector<float>(),
                  bn.running_var().to_vector<float>()};
  };
  nn::BatchNorm2D whole(C);
  const Result ref = run(whole, 0, 2 * N);
  for (bool synced : {true, false}) {
    std::vector<Result> ranks(2);
    run_ranks(2, [&](int rank, const hal::Communicator& comm) {
      nn::BatchNorm2D bn(C);
      if (synced) {
        EXPECT_EQ(sync_batch_norm(bn, comm), 1);
      }
      ranks[static_cast<size_t>(rank)] = run(bn, rank * N, N);
      // Evaluation uses the running statistics, without collectives: rank 0 alone evaluates (a collective here would
      // wait for rank 1 until the in-process timeout).
      if (rank == 0) {
        bn.eval();
        EXPECT_EQ(bn(eager::zeros({1, C, H, W})).shape(), (Shape{1, C, H, W}));
      }
    });
    auto near = [](const std::vector<float>& a, const std::vector<float>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i)
        if (std::fabs(a[i] - b[i]) > 2e-5f * (1.f + std::fabs(b[i]))) return false;
      return true;
    };
    auto joined = [&](std::vector<float> Result::*f) {
      std::vector<float> v = ranks[0].*f;
      v.insert(v.end(), (ranks[1].*f).begin(), (ranks[1].*f).end());
      return v;
    };
    auto summed = [&](std::vector<float> Result::*f) {
      std::vector<float> v = ranks[0].*f;
      for (size_t i = 0; i < v.size(); ++i) v[i] += (ranks[1].*f)[i];
      return v;
    };
    EXPECT_EQ(near(joined(&Result::y), ref.y), synced) << "outputs";
    EXPECT_EQ(near(joined(&Result::dx), ref.dx), synced) << "input gradients";
    EXPECT_EQ(near(summed(&Result::dw), ref.dw), synced) << "weight gradients";
    EXPECT_TRUE(near(summed(&Result::db), ref.db)) << "bias gradients (a sum of the upstream gradient either way)";
    for (const Result& r : ranks) {
      EXPECT_EQ(near(r.mean, ref.mean), synced) << "running mean";
      EXPECT_EQ(near(r.var, ref.var), synced) << "running variance";
    }
  }
}

TEST(DataParallel, MetricsSumOverRanks) {
  run_ranks(3, [&](int rank, const hal::Communicator& comm) {
    auto v = all_reduce_sum(comm, {1.0, static_cast<double>(rank)});
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(*v, (std::vector<double>{3.0, 3.0}));
  });
}

}  // namespace
}  // namespace keel::train
