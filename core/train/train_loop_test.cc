// End-to-end training on synthetic data: loss falls, gradient accumulation equals a big batch, a checkpointed and
// resumed run matches the uninterrupted one bit for bit, and a traced model runs in a Session like in eager mode.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/runtime/session.h"
#include "core/train/data.h"
#include "core/train/nn.h"
#include "core/train/optim.h"
#include "core/train/trainer.h"

namespace keel::train {
namespace {

using namespace keel::train::nn;

// Four classes of 1×8×8 images: a bright 4×4 quadrant (which one = the class) on noise.
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

std::shared_ptr<Sequential> small_cnn(bool dropout) {
  auto net = std::make_shared<Sequential>();
  net->push_back(std::make_shared<Conv2D>(1, 4, 3))
      .push_back(std::make_shared<ReLU>())
      .push_back(std::make_shared<MaxPool2D>(2));
  net->push_back(std::make_shared<Flatten>());
  if (dropout) net->push_back(std::make_shared<Dropout>(0.2f));
  net->push_back(std::make_shared<Linear>(4 * 3 * 3, 4));
  return net;
}

TEST(TrainLoop, LossFallsOnASyntheticDataset) {
  eager::manual_seed(0);
  auto net = small_cnn(false);
  SGD opt(net->parameters(), SGDOptions{0.05, 0.9});
  DataLoaderOptions o;
  o.batch_size = 16;
  auto loader = DataLoader::create(quadrants(256, 1), o).value();
  CrossEntropyLoss ce;
  double first = 0, last = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    ASSERT_TRUE(loader->start_epoch(epoch).is_ok());
    double sum = 0;
    int n = 0;
    for (;;) {
      auto b = loader->next();
      ASSERT_TRUE(b.is_ok());
      if (!b->has_value()) break;
      Tensor loss = ce((*net)(Tensor((*b)->data)), Tensor((*b)->target));
      opt.zero_grad();
      loss.backward();
      opt.step();
      sum += loss.item();
      ++n;
    }
    (epoch == 0 ? first : last) = sum / n;
  }
  EXPECT_LT(last, 0.5 * first) << "first epoch " << first << ", last " << last;
  // Accuracy on fresh data.
  net->eval();
  auto test = quadrants(64, 2);
  eager::NoGradGuard ng;
  auto pred = eager::argmax((*net)(Tensor(test->data())), 1).to_vector<int64_t>();
  int correct = 0;
  for (int i = 0; i < 64; ++i) correct += pred[static_cast<size_t>(i)] == test->target().data<int64_t>()[i];
  EXPECT_GE(correct, 56);
}

TEST(TrainLoop, GradientAccumulationEqualsOneBigBatch) {
  eager::manual_seed(5);
  auto net = small_cnn(false);
  auto ds = quadrants(32, 3);
  auto full = ds->get_batch([] {
                  std::vector<int64_t> v(32);
                  for (int i = 0; i < 32; ++i) v[static_cast<size_t>(i)] = i;
                  return v;
                }())
                  .value();
  CrossEntropyLoss ce;
  ce((*net)(Tensor(full.data)), Tensor(full.target)).backward();
  std::vector<std::vector<float>> big;
  for (auto& p : net->parameters()) big.push_back(p.grad().to_vector<float>()), p.zero_grad();
  for (int half = 0; half < 2; ++half) {  // two micro-batches, each loss divided by the number of micro-batches
    std::vector<int64_t> idx;
    for (int i = 0; i < 16; ++i) idx.push_back(half * 16 + i);
    auto b = ds->get_batch(idx).value();
    (ce((*net)(Tensor(b.data)), Tensor(b.target)) / 2.f).backward();
  }
  auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = params[i].grad().to_vector<float>();
    ASSERT_EQ(acc.size(), big[i].size());
    for (size_t k = 0; k < acc.size(); ++k) EXPECT_NEAR(acc[k], big[i][k], 1e-5f) << "param " << i << " elem " << k;
  }
}

// Trains until `progress.global_step == stop`, checkpoint-friendly: the position lives in `progress`.
void run_until(Module& net, Optimizer& opt, LRScheduler& sched, GradScaler& scaler, DataLoader& loader,
               Progress& progress, int64_t stop) {
  CrossEntropyLoss ce;
  while (progress.global_step < stop) {
    ASSERT_TRUE(loader.start_epoch(progress.epoch, progress.batch).is_ok());
    for (;;) {
      if (progress.global_step == stop) return;
      auto b = loader.next();
      ASSERT_TRUE(b.is_ok());
      if (!b->has_value()) break;
      Tensor loss = ce(net(Tensor((*b)->data)), Tensor((*b)->target));
      opt.zero_grad();
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
      sched.step();
      ++progress.global_step;
      progress.batch = (*b)->index + 1;
    }
    ++progress.epoch;
    progress.batch = 0;
  }
}

TEST(TrainLoop, ResumeFromCheckpointMatchesAnUninterruptedRunBitExactly) {
  auto ds = quadrants(40, 4);
  DataLoaderOptions o;
  o.batch_size = 8;  // 5 batches per epoch: the run below crosses epoch boundaries
  o.seed = 11;
  auto make = [&](uint64_t seed) {
    eager::manual_seed(seed);
    return small_cnn(/*dropout=*/true);  // dropout draws from the global generator: it must be restored too
  };
  const int64_t total = 12, cut = 7;
  std::vector<std::vector<float>> expected;
  {
    auto net = make(9);
    SGD opt(net->parameters(), SGDOptions{0.05, 0.9, 0, 1e-4, true});
    StepLR sched(opt, 3, 0.7);
    GradScaler scaler(GradScalerOptions{256.0, 2.0, 0.5, 2, true});
    auto loader = DataLoader::create(ds, o).value();
    Progress progress;
    progress.data_seed = o.seed;
    run_until(*net, opt, sched, scaler, *loader, progress, total);
    for (auto& p : net->parameters()) expected.push_back(p.to_vector<float>());
  }
  auto file = std::filesystem::temp_directory_path() / ("keel_resume_" + std::to_string(::getpid()) + ".safetensors");
  {
    auto net = make(9);
    SGD opt(net->parameters(), SGDOptions{0.05, 0.9, 0, 1e-4, true});
    StepLR sched(opt, 3, 0.7);
    GradScaler scaler(GradScalerOptions{256.0, 2.0, 0.5, 2, true});
    auto loader = DataLoader::create(ds, o).value();
    Progress progress;
    progress.data_seed = o.seed;
    run_until(*net, opt, sched, scaler, *loader, progress, cut);
    ASSERT_TRUE(capture_checkpoint(*net, opt, &sched, &scaler, progress).save(file).is_ok());
  }
  eager::manual_seed(12345);  // disturb the generator: the checkpoint must restore it
  auto net = make(777);       // other initial weights: the checkpoint must restore them
  SGD opt(net->parameters(), SGDOptions{0.05, 0.9, 0, 1e-4, true});
  StepLR sched(opt, 3, 0.7);
  GradScaler scaler(GradScalerOptions{256.0, 2.0, 0.5, 2, true});
  Progress progress;
  auto ckpt = Checkpoint::load(file);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  ASSERT_TRUE(restore_checkpoint(*ckpt, *net, opt, &sched, &scaler, progress).is_ok());
  EXPECT_EQ(progress.global_step, cut);
  EXPECT_EQ(progress.epoch, 1);
  EXPECT_EQ(progress.batch, 2);
  DataLoaderOptions ro = o;
  ro.seed = progress.data_seed;
  auto loader = DataLoader::create(ds, ro).value();
  run_until(*net, opt, sched, scaler, *loader, progress, total);
  auto params = net->parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto got = params[i].to_vector<float>();
    ASSERT_EQ(got.size(), expected[i].size());
    EXPECT_EQ(std::memcmp(got.data(), expected[i].data(), got.size() * sizeof(float)), 0)
        << "parameter " << i << " differs";
  }
  // A checkpoint of another model is refused with the reason.
  Linear other(3, 3);
  SGD other_opt(other.parameters(), SGDOptions{0.1});
  Progress p2;
  auto st = restore_checkpoint(*ckpt, other, other_opt, nullptr, nullptr, p2);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("missing key(s): weight, bias"), std::string::npos) << st.message();
  std::filesystem::remove(file);
}

// The learning-rate scale of a data-parallel run travels with the checkpoint, so that a run resumed at another world
// size can rescale the rates it restores; checkpoints written before it existed read as 1.
TEST(TrainLoop, CheckpointKeepsTheLearningRateScale) {
  Linear net(2, 2);
  SGD opt(net.parameters(), SGDOptions{0.1});
  Progress p;
  p.lr_scale = 2;
  Checkpoint c = capture_checkpoint(net, opt, nullptr, nullptr, p);
  Progress q;
  ASSERT_TRUE(restore_checkpoint(c, net, opt, nullptr, nullptr, q).is_ok());
  EXPECT_EQ(q.lr_scale, 2);
  State t = *c.require("trainer").value();
  t.values.erase("lr_scale");
  c.put("trainer", t);
  q.lr_scale = 5;
  ASSERT_TRUE(restore_checkpoint(c, net, opt, nullptr, nullptr, q).is_ok());
  EXPECT_EQ(q.lr_scale, 1);
  for (const nlohmann::json& bad : {nlohmann::json(-1.0), nlohmann::json(0.0), nlohmann::json("two")}) {
    t.values["lr_scale"] = bad;
    c.put("trainer", t);
    Status st = restore_checkpoint(c, net, opt, nullptr, nullptr, q);
    ASSERT_FALSE(st.is_ok()) << bad.dump();
    EXPECT_TRUE(st.message().find("learning-rate scale") != std::string::npos ||
                st.message().find("trainer component is malformed") != std::string::npos)
        << st.message();
  }
}

TEST(TrainLoop, TracedModelRunsInASessionLikeEager) {
  eager::manual_seed(2);
  auto net = small_cnn(false);
  net->eval();
  Tensor x = eager::randn({3, 1, 8, 8});
  std::vector<float> eager_out;
  Graph g;
  {
    eager::NoGradGuard ng;
    eager_out = (*net)(x).to_vector<float>();
    eager::Tracer tracer("small_cnn");
    tracer.input(x, "image");
    for (const auto& [n, p] : net->named_parameters()) tracer.name_parameter(p, n);
    tracer.output((*net)(x), "logits");
    auto graph = tracer.graph();
    ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
    g = std::move(graph).value();
  }
  EXPECT_TRUE(g.is_initializer("4.weight"));
  auto session = Session::create(eager::environment(), g);
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  auto out = (*session)->run({{"image", x.data()}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->at(0).numel(), static_cast<int64_t>(eager_out.size()));
  for (size_t i = 0; i < eager_out.size(); ++i) EXPECT_NEAR(out->at(0).data<float>()[i], eager_out[i], 1e-5f);
}

}  // namespace
}  // namespace keel::train
