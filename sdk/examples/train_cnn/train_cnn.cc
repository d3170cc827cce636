// train_cnn — PaddlePaddle's introductory SimpleCNN, written as a Keel user writes it against the installed C++
// training API (keel/train.hpp, CMake target keel::train): trains it on Fashion-MNIST with a DataLoader with worker
// threads, autocast (bf16 by default) and a GradScaler, evaluates on the test set after every epoch, saves a
// checkpoint (safetensors, resumable) and exports ONNX, then runs the exported model through a Session.
//
// Started as one of several ranks (`keel launch --nproc-per-node 2 -- train_cnn ...`, or torchrun, mpirun, srun: the
// identity comes from the environment) it trains data-parallel, as `paddle.DataParallel(model)` does: a process group
// over the launcher's store, the model wrapped in DataParallel (rank 0's weights broadcast, gradients averaged during
// backward), each rank on its shard of every epoch, the epoch's metrics summed over the ranks, and rank 0 alone
// printing, saving the checkpoint and exporting.
//
//   train_cnn [--data DIR] [--epochs N] [--limit N] [--batch N] [--lr X] [--workers N] [--threads N]
//             [--amp none|bf16|fp16] [--seed N] [--checkpoint FILE] [--onnx FILE] [--fused 0|1]
//
// The defaults are `keel train`'s (SGD lr 0.01 momentum 0.9, batch 64, seed 0, one loader worker), so with the same
// --amp, --threads and seed both train the same network from the same initial weights in the same data order.
#include <keel/train.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>

namespace nn = keel::train::nn;
using keel::eager::Tensor;

// The model: PaddlePaddle's `class SimpleCNN(nn.Layer)` (Conv2D → ReLU → MaxPool2D → flatten → Linear). `fused`:
// the convolution, its ReLU and the pooling as one module, Conv2DOptions(...).with_relu().with_max_pool(2), which runs
// them as one kernel on the CPU (the convolution's output never stored whole; `keel train`'s SimpleCNN): the same
// parameters in the same order, so the same initial weights. Called apart as below they run as that kernel too on the
// CPU (eager::conv2d defers its computation until a ReLU and a pooling over it join it); --fused also fuses elsewhere.
class SimpleCNN : public nn::Module {
 public:
  explicit SimpleCNN(bool fused = false) : nn::Module("SimpleCNN") {
    if (fused) {
      conv = register_module(
          "conv", std::make_shared<nn::Conv2D>(nn::Conv2DOptions(1, 32, {3, 3}).with_relu().with_max_pool(2)));
    } else {
      conv = register_module("conv", std::make_shared<nn::Conv2D>(1, 32, 3));
      relu = register_module("relu", std::make_shared<nn::ReLU>());
      pool = register_module("pool", std::make_shared<nn::MaxPool2D>(2));
    }
    fc = register_module("fc", std::make_shared<nn::Linear>(32 * 13 * 13, 10));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = pool ? pool->forward(relu->forward(conv->forward(x))) : conv->forward(x);
    return fc->forward(keel::eager::flatten(h, 1));
  }
  std::shared_ptr<nn::Conv2D> conv;
  std::shared_ptr<nn::ReLU> relu;
  std::shared_ptr<nn::MaxPool2D> pool;
  std::shared_ptr<nn::Linear> fc;
};

namespace {

struct Args {
  std::string data = keel::train::FashionMnist::kDefaultDir, checkpoint = "simple_cnn.safetensors",
              onnx = "simple_cnn.onnx", amp = "bf16";
  int epochs = 1, workers = 1, threads = 0;
  bool fused = false;
  int64_t limit = 0, batch = 64;
  double lr = 0.01;
  uint64_t seed = 0;
};

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "train_cnn: " << what << "\n";
  std::exit(1);
}
template <class T>
T check(keel::StatusOr<T> r, const std::string& what) {
  if (!r.is_ok()) fail(what + ": " + r.status().to_string());
  return std::move(r).value();
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) fail("missing value after " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--data") a.data = v;
      else if (k == "--epochs") a.epochs = std::stoi(v);
      else if (k == "--limit") a.limit = std::stoll(v);
      else if (k == "--batch") a.batch = std::stoll(v);
      else if (k == "--lr") a.lr = std::stod(v);
      else if (k == "--workers") a.workers = std::stoi(v);
      else if (k == "--threads") a.threads = std::stoi(v);
      else if (k == "--amp") a.amp = v;
      else if (k == "--seed") a.seed = std::stoull(v);
      else if (k == "--checkpoint") a.checkpoint = v;
      else if (k == "--onnx") a.onnx = v;
      else if (k == "--fused") a.fused = std::stoi(v) != 0;
      else fail("unknown option " + k);
    } catch (const std::logic_error&) {
      fail("bad value '" + v + "' for " + k);
    }
  }
  if (a.amp != "none" && a.amp != "bf16" && a.amp != "fp16") fail("--amp must be none, bf16 or fp16, got " + a.amp);
  if (a.epochs < 0 || a.batch < 1 || a.limit < 0 || a.workers < 0 || a.threads < 0) fail("negative or zero sizes");
  return a;
}

// The first n examples (n = 0: all) of a decoded Fashion-MNIST split.
std::shared_ptr<keel::train::FashionMnist> first_n(std::shared_ptr<keel::train::FashionMnist> ds, int64_t n) {
  if (n <= 0 || n >= ds->size()) return ds;
  keel::Shape s = ds->images().shape();
  s[0] = n;
  keel::Tensor images = check(keel::Tensor::host(keel::DType::kU8, s), "limit");
  keel::Tensor labels = check(keel::Tensor::host(keel::DType::kU8, {n}), "limit");
  std::memcpy(images.raw_data(), ds->images().raw_data(), images.byte_size());
  std::memcpy(labels.raw_data(), ds->labels().raw_data(), static_cast<size_t>(n));
  return check(keel::train::FashionMnist::from_tensors(images, labels, "first " + std::to_string(n)), "limit");
}

int64_t count_correct(const Tensor& logits, const keel::Tensor& target) {
  auto pred = keel::eager::argmax(logits, 1).to_vector<int64_t>();
  int64_t c = 0;
  for (size_t i = 0; i < pred.size(); ++i) c += pred[i] == target.data<int64_t>()[i];
  return c;
}

// An autocast scope for --amp (none: no scope).
struct Amp {
  explicit Amp(const std::string& amp) {
    if (amp == "bf16") guard.emplace(keel::DType::kBF16);
    if (amp == "fp16") guard.emplace(keel::DType::kF16);
  }
  std::optional<keel::eager::AutocastGuard> guard;
};

double test_accuracy(nn::Module& model, const keel::train::FashionMnist& test, const std::string& amp) {
  model.eval();
  keel::eager::NoGradGuard no_grad;
  Amp autocast(amp);
  int64_t correct = 0;
  for (int64_t i = 0; i < test.size(); i += 1000) {
    std::vector<int64_t> idx(static_cast<size_t>(std::min<int64_t>(1000, test.size() - i)));
    std::iota(idx.begin(), idx.end(), i);
    keel::train::Batch b = check(test.get_batch(idx), "test batch");
    correct += count_correct(model(Tensor(b.data)), b.target);
  }
  model.train();
  return static_cast<double>(correct) / static_cast<double>(test.size());
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  using namespace keel::train;
  auto env = check(init_runtime(a.threads), "runtime");
  auto train = first_n(check(FashionMnist::load(a.data, FashionMnist::Split::kTrain), "train data"), a.limit);
  auto test = check(FashionMnist::load(a.data, FashionMnist::Split::kTest), "test data");
  // One of several ranks: a process group (Gloo on the CPU) over the launcher's store.
  const keel::dist::Identity id = check(keel::dist::identity_from_env(), "rank identity");
  std::unique_ptr<keel::dist::ProcessGroup> group;
  if (id.world_size > 1)
    group = check(keel::dist::ProcessGroup::create(*env, id, "", id.local_rank, 60000), "process group");
  const bool lead = id.rank == 0;  // prints, saves and exports

  keel::eager::manual_seed(a.seed);
  SimpleCNN model(a.fused);
  std::unique_ptr<DataParallel> dp;
  if (group) dp = check(DataParallel::create(model, group->comm()), "DataParallel");
  SGD opt(model.parameters(), SGDOptions{.lr = a.lr, .momentum = 0.9});
  GradScaler scaler(GradScalerOptions{.enabled = a.amp == "fp16"});  // bf16 keeps fp32's range: no scaling needed
  nn::CrossEntropyLoss loss_fn;
  auto loader = check(DataLoader::create(train, {.batch_size = a.batch,
                                                 .workers = a.workers,
                                                 .prefetch = 4,
                                                 .seed = a.seed,
                                                 .num_replicas = id.world_size,
                                                 .rank = id.rank}),
                      "loader");
  if (lead)
    std::cout << "train_cnn: " << model.num_parameters() << " parameters, " << train->size() << " train / "
              << test->size() << " test images, batch " << a.batch << (group ? " per rank" : "") << ", amp " << a.amp
              << ", " << (a.threads ? std::to_string(a.threads) : std::string("all")) << " kernel thread(s), "
              << a.workers << " loader worker(s)"
              << (group ? ", world size " + std::to_string(id.world_size) + " (" + group->backend() + ")" : "") << "\n";

  Progress progress;
  progress.data_seed = a.seed;
  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    if (auto st = loader->start_epoch(epoch); !st.is_ok()) fail(st.to_string());
    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum = 0;
    int64_t seen = 0, correct = 0, batches = 0;
    try {
      while (auto batch = check(loader->next(), "data")) {
        Tensor x(batch->data), y(batch->target), logits, loss;
        {
          Amp autocast(a.amp);
          logits = dp ? dp->forward(x) : model(x);
          loss = loss_fn(logits, y);
        }
        scaler.scale(loss).backward();
        if (dp)  // waits for the gradients' all-reduce that backward started
          if (auto st = dp->finish(); !st.is_ok()) fail(st.to_string());
        scaler.step(opt);
        scaler.update();
        opt.zero_grad();
        ++progress.global_step;
        loss_sum += loss.item();
        correct += count_correct(logits.detach(), batch->target);
        seen += batch->size();
        ++batches;
      }
    } catch (const keel::eager::Error& e) {
      fail(e.what());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress.epoch = epoch + 1;
    if (group) {  // the epoch over every rank's shard
      auto sums = check(all_reduce_sum(group->comm(), {loss_sum, static_cast<double>(seen),
                                                       static_cast<double>(correct), static_cast<double>(batches)}),
                        "metrics");
      loss_sum = sums[0], seen = static_cast<int64_t>(sums[1]), correct = static_cast<int64_t>(sums[2]),
      batches = static_cast<int64_t>(sums[3]);
    }
    if (!lead) continue;  // every rank holds the same weights: rank 0 evaluates them
    const double accuracy = test_accuracy(model, *test, a.amp);
    std::printf("epoch %d/%d: %.2f s, %.0f img/s, train loss %.4f, train accuracy %.4f, test accuracy %.4f\n",
                epoch + 1, a.epochs, s, static_cast<double>(seen) / s, loss_sum / static_cast<double>(batches),
                static_cast<double>(correct) / static_cast<double>(seen), accuracy);
  }

  if (!lead) return 0;
  if (!a.checkpoint.empty()) {
    if (auto st = capture_checkpoint(model, opt, nullptr, &scaler, progress).save(a.checkpoint); !st.is_ok())
      fail(st.to_string());
    std::cout << "saved checkpoint " << a.checkpoint << "\n";
  }
  if (!a.onnx.empty()) {
    Batch example = check(test->get_batch({0}), "example");
    const int64_t nodes =
        check(export_onnx(model, Tensor(example.data), a.onnx,
                          {.graph_name = "simple_cnn", .input_name = "image", .output_name = "logits"}),
              "export");
    // The deployed form: the exported file in a Session (dynamic batch), accuracy on the test set.
    auto session = check(keel::Session::create(*env, check(keel::load_onnx(a.onnx), "reload"), {}), "session");
    std::vector<int64_t> idx(static_cast<size_t>(test->size()));
    std::iota(idx.begin(), idx.end(), 0);
    Batch all = check(test->get_batch(idx), "test batch");
    auto out = check(session->run({{"image", all.data}}), "run");
    const int64_t correct = count_correct(Tensor(out.at(0)), all.target);
    std::printf("exported %s (%lld nodes): Session test accuracy %.4f\n", a.onnx.c_str(), static_cast<long long>(nodes),
                static_cast<double>(correct) / static_cast<double>(test->size()));
  }
  return 0;
}
