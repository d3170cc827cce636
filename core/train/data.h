// keel/core/train/data.h — datasets and a DataLoader with worker threads and a bounded prefetch queue.
//
// A Dataset hands out examples by index; get_batch() gathers many at once into host tensors (the default stacks
// get(i); datasets override it to gather and normalise in one pass). A DataLoader cuts an epoch into batches in an
// order fixed by (seed, epoch): the same seed gives the same order on every run and every worker count, and training
// resumes mid-epoch by starting the epoch at a batch index. Workers build batches ahead of the consumer, at most
// `prefetch` batches in flight, and hand them out in order.
//
// Thread-safety: Dataset::get / get_batch must be safe to call concurrently (worker threads do). A DataLoader is
// driven by one thread (start_epoch / next); its workers are internal.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/base/status.h"
#include "core/base/tensor.h"

namespace keel::train {

struct Example {
  keel::Tensor data;    // host tensor (one example, no batch dimension)
  keel::Tensor target;  // host tensor (scalar or vector)
};

struct Batch {
  keel::Tensor data;    // [B, ...] host tensor
  keel::Tensor target;  // [B, ...] host tensor
  int64_t index = 0;    // batch index within the epoch
  int64_t size() const { return data.defined() && data.rank() > 0 ? data.shape()[0] : 0; }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual StatusOr<Example> get(int64_t index) const = 0;
  // Stacks get(i) for every index (all examples must share dtype and shape). Override for speed.
  virtual StatusOr<Batch> get_batch(const std::vector<int64_t>& indices) const;
};

// In-memory tensors: example i is data[i] and target[i] (their first dimensions must match).
class TensorDataset : public Dataset {
 public:
  static StatusOr<std::shared_ptr<TensorDataset>> create(keel::Tensor data, keel::Tensor target);
  int64_t size() const override { return data_.shape()[0]; }
  StatusOr<Example> get(int64_t index) const override;
  StatusOr<Batch> get_batch(const std::vector<int64_t>& indices) const override;
  const keel::Tensor& data() const { return data_; }
  const keel::Tensor& target() const { return target_; }

 private:
  TensorDataset(keel::Tensor d, keel::Tensor t) : data_(std::move(d)), target_(std::move(t)) {}
  keel::Tensor data_, target_;
};

// Fashion-MNIST (or MNIST) from IDX files: `dir`/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
// Images stay u8 in memory; batches are f32 [B, 1, 28, 28] normalised as ((x / 255) - mean) / std (the train-set
// statistics PyTorch's examples use: mean 0.2860, std 0.3530); targets are i64 [B].
class FashionMnist : public Dataset {
 public:
  enum class Split { kTrain, kTest };
  static constexpr float kMean = 0.2860f;
  static constexpr float kStd = 0.3530f;
  static constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";

  static StatusOr<std::shared_ptr<FashionMnist>> load(const std::filesystem::path& dir, Split split);
  // From decoded tensors: images u8 [N, H, W], labels u8 [N] with values < 10.
  static StatusOr<std::shared_ptr<FashionMnist>> from_tensors(keel::Tensor images, keel::Tensor labels,
                                                              const std::string& origin);

  int64_t size() const override { return images_.shape()[0]; }
  StatusOr<Example> get(int64_t index) const override;
  StatusOr<Batch> get_batch(const std::vector<int64_t>& indices) const override;
  const keel::Tensor& images() const { return images_; }
  const keel::Tensor& labels() const { return labels_; }

 private:
  FashionMnist(keel::Tensor images, keel::Tensor labels) : images_(std::move(images)), labels_(std::move(labels)) {}
  keel::Tensor images_, labels_;
};

// Shards an epoch's example order over `num_replicas` ranks as torch.utils.data.DistributedSampler does: every rank
// gets the same number of examples, rank r takes positions r, r + R, r + 2R, ... of the (seeded, shared) order, so the
// shards are disjoint and, without drop_last, cover every example (the order is padded by repeating its first
// examples up to a multiple of R); with drop_last the tail that does not divide evenly is dropped instead. Together,
// batch b of every rank holds exactly the examples of batch b of one process with an R times larger batch.
// Thread-safety: const methods may be called from any thread; set_epoch from one.
class DistributedSampler {
 public:
  // num_replicas >= 1 and 0 <= rank < num_replicas (INVALID_ARGUMENT naming the bad value otherwise).
  static StatusOr<DistributedSampler> create(int64_t dataset_size, int64_t num_replicas, int64_t rank,
                                             bool shuffle = true, uint64_t seed = 0, bool drop_last = false);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  int64_t num_samples() const;  // examples per rank per epoch
  // This rank's examples of the current epoch (set_epoch), or of `order` (any shared permutation).
  std::vector<int64_t> indices() const;
  std::vector<int64_t> shard(const std::vector<int64_t>& order) const;

 private:
  DistributedSampler() = default;
  int64_t size_ = 0, replicas_ = 1, rank_ = 0, epoch_ = 0;
  bool shuffle_ = true, drop_last_ = false;
  uint64_t seed_ = 0;
};

// The seeded order of one epoch (the DataLoader's: a permutation of 0..n-1 that depends on (seed, epoch) only).
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;
  int workers = 1;    // threads that build batches; 0 = on the consumer's thread
  int prefetch = 4;   // batches built ahead of the consumer (per loader), >= 1
  uint64_t seed = 0;  // the order of epoch e is a function of (seed, e) only
  // Data-parallel sharding (DistributedSampler): this loader hands out rank `rank`'s shard of every epoch's order;
  // all ranks use the same seed. shard_drop_last drops the uneven tail instead of padding (torch's drop_last).
  int64_t num_replicas = 1;
  int64_t rank = 0;
  bool shard_drop_last = false;
};

class DataLoader {
 public:
  static StatusOr<std::unique_ptr<DataLoader>> create(std::shared_ptr<const Dataset> dataset,
                                                      DataLoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  // The example order of one epoch (a permutation when shuffling, else 0..N-1; this rank's shard when sharded).
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // Starts (or restarts) an epoch at batch `first_batch`; stops any epoch in flight.
  Status start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the epoch, or nullopt at its end. A dataset error is returned as a status.
  StatusOr<std::optional<Batch>> next();
  // Time the consumer spent waiting for data in this epoch (seconds) — ~0 when the workers keep up.
  double wait_seconds() const { return wait_s_; }
  const DataLoaderOptions& options() const { return opts_; }

 private:
  DataLoader(std::shared_ptr<const Dataset> d, DataLoaderOptions o) : dataset_(std::move(d)), opts_(o) {}
  void stop_workers();
  void worker_loop();
  std::vector<int64_t> batch_indices(int64_t b) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions opts_;
  std::vector<int64_t> order_;
  int64_t next_out_ = 0, end_batch_ = 0;
  double wait_s_ = 0;

  std::mutex mu_;
  std::condition_variable cv_produced_, cv_consumed_;
  int64_t next_claim_ = 0;
  bool stop_ = false;
  std::map<int64_t, StatusOr<Batch>> ready_;
  std::vector<std::thread> threads_;
};

}  // namespace keel::train
