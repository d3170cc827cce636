#include "core/train/data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

namespace keel::train {
namespace {

std::shared_ptr<TensorDataset> counting_dataset(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n * 2));
  std::vector<int64_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(2 * i)] = static_cast<float>(i);
    x[static_cast<size_t>(2 * i + 1)] = -static_cast<float>(i);
    y[static_cast<size_t>(i)] = i;
  }
  return TensorDataset::create(Tensor::from_vector(DType::kF32, {n, 2}, x), Tensor::from_vector(DType::kI64, {n}, y))
      .value();
}

std::vector<int64_t> drain(DataLoader& dl, int64_t epoch, int64_t first = 0, std::vector<int64_t>* sizes = nullptr) {
  EXPECT_TRUE(dl.start_epoch(epoch, first).is_ok());
  std::vector<int64_t> seen;
  for (;;) {
    auto b = dl.next();
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    if (!b.is_ok() || !b->has_value()) break;
    const Batch& batch = **b;
    if (sizes) sizes->push_back(batch.size());
    for (int64_t i = 0; i < batch.size(); ++i) {
      EXPECT_EQ(batch.data.data<float>()[2 * i],
                static_cast<float>(batch.target.data<int64_t>()[i]));  // rows stay paired
      seen.push_back(batch.target.data<int64_t>()[i]);
    }
  }
  return seen;
}

TEST(DataLoader, ShufflesDeterministicallyPerSeedAndEpoch) {
  auto ds = counting_dataset(103);
  DataLoaderOptions o;
  o.batch_size = 10;
  o.seed = 7;
  auto a = DataLoader::create(ds, o).value();
  auto b = DataLoader::create(ds, o).value();
  std::vector<int64_t> sizes;
  auto e0 = drain(*a, 0, 0, &sizes);
  EXPECT_EQ(e0, drain(*b, 0));
  EXPECT_EQ(sizes.size(), 11u);
  EXPECT_EQ(sizes.back(), 3);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 103; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);  // a permutation
  EXPECT_NE(e0, drain(*a, 1));                                                     // another epoch, another order
  o.seed = 8;
  EXPECT_NE(e0, drain(*DataLoader::create(ds, o).value(), 0));  // another seed, another order
  EXPECT_EQ(a->epoch_order(0), e0);
}

TEST(DataLoader, WorkerCountDoesNotChangeTheBatches) {
  auto ds = counting_dataset(257);
  DataLoaderOptions o;
  o.batch_size = 16;
  o.seed = 3;
  o.workers = 0;
  auto ref = drain(*DataLoader::create(ds, o).value(), 2);
  for (int w : {1, 2, 4}) {
    o.workers = w;
    o.prefetch = w;
    EXPECT_EQ(drain(*DataLoader::create(ds, o).value(), 2), ref) << w << " workers";
  }
}

TEST(DataLoader, DropLastAndNoShuffleAndResumeMidEpoch) {
  auto ds = counting_dataset(25);
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.drop_last = true;
  auto dl = DataLoader::create(ds, o).value();
  EXPECT_EQ(dl->batches_per_epoch(), 6);
  auto all = drain(*dl, 0);
  ASSERT_EQ(all.size(), 24u);
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
  o.shuffle = true;
  auto sh = DataLoader::create(ds, o).value();
  auto full = drain(*sh, 5);
  auto tail = drain(*sh, 5, 2);  // resume at batch 2: the same batches as the uninterrupted epoch's tail
  EXPECT_EQ(std::vector<int64_t>(full.begin() + 8, full.end()), tail);
  EXPECT_FALSE(sh->start_epoch(0, 7).is_ok());
}

// A dataset that records how far ahead of the consumer the workers get.
class SlowDataset : public Dataset {
 public:
  int64_t size() const override { return 64; }
  StatusOr<Example> get(int64_t i) const override {
    if (i == 50 && fail) return invalid_argument("example 50 is broken");
    Example e;
    e.data = Tensor::from_vector(DType::kF32, {1}, std::vector<float>{static_cast<float>(i)});
    e.target = Tensor::from_vector(DType::kI64, {}, std::vector<int64_t>{i});
    ++produced;
    return e;
  }
  mutable std::atomic<int64_t> produced{0};
  bool fail = false;
};

TEST(DataLoader, PrefetchIsBoundedAndErrorsArriveInOrder) {
  auto ds = std::make_shared<SlowDataset>();
  DataLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.workers = 2;
  o.prefetch = 3;
  auto dl = DataLoader::create(ds, o).value();
  ASSERT_TRUE(dl->start_epoch(0).is_ok());
  auto first = dl->next();
  ASSERT_TRUE(first.is_ok() && first->has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Consumer took batch 0; workers may hold batches 1..3 (prefetch 3) and no more.
  EXPECT_LE(ds->produced.load(), 4 * 4);
  EXPECT_GE(ds->produced.load(), 4 * 2);
  ds->fail = true;
  ASSERT_TRUE(dl->start_epoch(0).is_ok());
  int good = 0;
  Status err;
  for (;;) {
    auto b = dl->next();
    if (!b.is_ok()) {
      err = b.status();
      break;
    }
    if (!b->has_value()) break;
    ++good;
  }
  EXPECT_EQ(good, 12);  // batches 0..11; batch 12 holds example 50
  EXPECT_NE(err.message().find("example 50 is broken"), std::string::npos) << err.to_string();
}

TEST(DataLoader, RejectsBadOptionsAndMismatchedTensors) {
  auto ds = counting_dataset(4);
  DataLoaderOptions o;
  o.batch_size = 0;
  EXPECT_FALSE(DataLoader::create(ds, o).is_ok());
  o.batch_size = 2;
  o.prefetch = 0;
  EXPECT_FALSE(DataLoader::create(ds, o).is_ok());
  EXPECT_FALSE(DataLoader::create(nullptr, DataLoaderOptions{}).is_ok());
  auto bad = TensorDataset::create(Tensor::f32({3, 2}, std::vector<float>(6)), Tensor::f32({4}, std::vector<float>(4)));
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("3 examples"), std::string::npos);
  auto e = ds->get(9);
  EXPECT_EQ(e.status().code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace keel::train
