// `keel train` — the full loop of the README's first command: train PaddlePaddle's introductory SimpleCNN (one input
// channel: Conv2D(1,32,3) → ReLU → MaxPool2D(2) → Flatten → Linear(32·13·13,10)) on Fashion-MNIST with eager tensors
// and autograd, trace it to graph IR, save it as ONNX, run the saved model through a Session (fp32 test accuracy and
// latency), then quantize it to INT8 and report the same.
//
// The training step is PyTorch's: SGD(lr, momentum) by default, batch 64, cross-entropy, shuffled every epoch
// (seeded), optional autocast (bf16 | fp16 with a dynamic loss scaler), gradient accumulation, clipping, an LR
// schedule. --checkpoint writes a safetensors checkpoint after every epoch (and --checkpoint-every N steps);
// --resume continues a run exactly where it stopped. --log writes JSON Lines scalars that `keel plot` draws.
// --model lenet trains the LeNet-like network of ../shared/peers/train_torch_fmnist.py instead.
//
// Data-parallel: when the environment names more than one rank (WORLD_SIZE from `keel launch`, torchrun, mpirun or
// srun: core/runtime/dist/identity.h) every rank creates the process group (gloo on the CPU, nccl on cuda), wraps the
// model in DataParallel (core/train/data_parallel.h), trains on its shard of every epoch (per-rank batch = --batch)
// and the epoch's metrics and the test accuracy are summed over ranks; rank 0 alone prints, logs, checkpoints and
// exports. `keel train --nproc N` re-executes the same command line through `keel launch --nproc-per-node N`.
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <optional>
#include <sstream>

#include "core/base/device_spec.h"
#include "core/base/thread_pool.h"
#include "core/runtime/dist/process_group.h"
#include "core/runtime/eager.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "core/train/data.h"
#include "core/train/data_parallel.h"
#include "core/train/nn.h"
#include "core/train/onnx_module.h"
#include "core/train/optim.h"
#include "core/train/run_plot.h"
#include "core/train/run_record.h"
#include "core/train/scalar_log.h"
#include "core/train/trainer.h"
#include "tools/calibration/quantize.h"
#include "tools/keel/commands.h"
#include "tools/keel/progress.h"

namespace keel::cli {
namespace {

using namespace keel::train;
using Clock = std::chrono::steady_clock;
using Feeds = std::vector<std::pair<std::string, keel::Tensor>>;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// PaddlePaddle's introductory SimpleCNN for one input channel (28×28 → 10 classes).
class SimpleCNN : public nn::Module {
 public:
  SimpleCNN() : nn::Module("SimpleCNN") {
    // Conv2D(1, 32, 3) -> ReLU -> MaxPool2D(2) as one module (one kernel on the CPU: Conv2DOptions::max_pool).
    conv = register_module("conv",
                           std::make_shared<nn::Conv2D>(nn::Conv2DOptions(1, 32, {3, 3}).with_relu().with_max_pool(2)));
    fc = register_module("fc", std::make_shared<nn::Linear>(32 * 13 * 13, 10));
  }
  eager::Tensor forward(const eager::Tensor& x) override { return fc->forward(eager::flatten(conv->forward(x), 1)); }
  std::shared_ptr<nn::Conv2D> conv;
  std::shared_ptr<nn::Linear> fc;
};

// The LeNet-like model of ../shared/peers/train_torch_fmnist.py: Conv2d(1,32,3) → ReLU → Conv2d(32,64,3) → ReLU →
// MaxPool2d(2) → Dropout(0.25) → Flatten → Linear(9216,128) → ReLU → Dropout(0.5) → Linear(128,10); 1.2 M parameters.
class LeNet : public nn::Module {
 public:
  LeNet() : nn::Module("LeNet") {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2D>(nn::Conv2DOptions(1, 32, {3, 3}).with_relu()));
    conv2 = register_module(
        "conv2", std::make_shared<nn::Conv2D>(nn::Conv2DOptions(32, 64, {3, 3}).with_relu().with_max_pool(2)));
    drop1 = register_module("drop1", std::make_shared<nn::Dropout>(0.25f));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(64 * 12 * 12, 128));
    drop2 = register_module("drop2", std::make_shared<nn::Dropout>(0.5f));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(128, 10));
  }
  eager::Tensor forward(const eager::Tensor& x) override {
    // The convolutions' ReLUs fused (Conv2DOptions::relu), and conv2's max pooling (Conv2DOptions::max_pool).
    auto h = conv2->forward(conv1->forward(x));
    h = eager::flatten(drop1->forward(h), 1);
    h = drop2->forward(eager::relu(fc1->forward(h)));
    return fc2->forward(h);
  }
  std::shared_ptr<nn::Conv2D> conv1, conv2;
  std::shared_ptr<nn::Dropout> drop1, drop2;
  std::shared_ptr<nn::Linear> fc1, fc2;
};

// Data-parallel context of a run: the process group and this rank's place (world 1: no group).
struct Ranks {
  std::unique_ptr<dist::ProcessGroup> pg;
  int32_t rank = 0, world = 1;
  bool lead() const { return rank == 0; }
  // Sums metrics over the ranks (identity in one process); throws eager::Error on a communication failure.
  std::vector<double> sum(std::vector<double> v) const {
    if (!pg) return v;
    auto r = all_reduce_sum(pg->comm(), std::move(v));
    if (!r.is_ok()) throw eager::Error(r.status());
    return *r;
  }
};

struct TrainArgs {
  int epochs = 2;
  std::string model = "simple";
  int nproc = 0;
  double dist_timeout_s = 120;
  int64_t batch = 64;
  std::string amp = "none";
  double lr = 0.01, momentum = 0.9, weight_decay = 0;
  std::string lr_scaling = "auto";     // data-parallel: how --lr grows with the world size (lr_scale_for)
  std::string grad_compress = "none";  // data-parallel: the dtype gradients are all-reduced in (none: their own)
  std::string optimizer = "sgd";
  std::string scheduler = "none";
  int64_t warmup = 0;
  int accumulate = 1;
  double clip = 0;
  uint64_t seed = 0;
  std::string data = FashionMnist::kDefaultDir;
  int64_t limit = 0;
  int workers = -1;  // -1: see run_train
  std::string device = "cpu";
  std::string log, checkpoint, resume;
  int64_t checkpoint_every = 0;
  int64_t log_every = 50;
  std::string output = "simple_cnn_fmnist.onnx";
  bool quantize = true;
  int64_t calibration_batches = 8;
  bool quiet = false;
  std::string init, freeze;         // fine-tuning (issue 28): start from MODEL.onnx, freeze parameters by regex
  int64_t replace_head = 0;         // a new classifier with N outputs (0 = keep the model's)
  std::string run_record = "auto";  // run.json (issue 28): "auto" = beside the log / checkpoint / model, "" = none
  int histogram_bins = 30;          // parameter and gradient histograms per epoch in the log (0 = none)
  // Knowledge distillation (issue 28): a teacher ONNX model run forward only (a Session) on every batch; the loss is
  // weight * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - weight) * cross-entropy.
  std::string teacher;
  double distill_temperature = 4.0, distill_weight = 0.9;
  bool distill_options_given = false;  // --distill-temperature / --distill-weight on the command line
  std::string evaluate;  // evaluate this ONNX model on the test set through a Session and stop (no training)
};

// Where run.json goes: beside the log, else the checkpoint (written or resumed from), else the ONNX output, else the
// current directory.
std::filesystem::path run_record_path(const TrainArgs& a) {
  if (a.run_record != "auto") return a.run_record;
  for (const std::string* p : {&a.log, &a.checkpoint, &a.resume, &a.output})
    if (!p->empty()) return std::filesystem::path(*p).parent_path() / "run.json";
  return "run.json";
}

// The memory pool of the training device as the environment counts it (core/base/allocator.h): "cuda:0" for a card;
// devices that compute in host memory share the "cpu:0" pool. Empty key when the pool does not exist yet.
struct PoolStats {
  std::string key;
  AllocatorStats stats;
};
PoolStats training_pool_stats(const Environment& env, const std::string& device) {
  const auto pools = env.memory_stats();
  auto spec = DeviceSpec::parse(device);
  for (const std::string& key : {spec.is_ok() ? spec->to_string() : device, std::string("cpu:0")})
    if (auto it = pools.find(key); it != pools.end()) return {key, it->second};
  return {};
}

std::string mib(uint64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / 1048576.0 << " MiB";
  return os.str();
}

// {"device": "cuda:0", "in_use_bytes": ..., "reserved_bytes": ..., "peak_in_use_bytes": ..., "peak_reserved_bytes":
// ..., "segments": ..., "raw_allocations": ..., "raw_frees": ...} for the run record.
nlohmann::json pool_json(const PoolStats& p) {
  return {{"device", p.key},
          {"in_use_bytes", p.stats.in_use_bytes},
          {"reserved_bytes", p.stats.reserved_bytes},
          {"peak_in_use_bytes", p.stats.peak_in_use_bytes},
          {"peak_reserved_bytes", p.stats.peak_reserved_bytes},
          {"segments", p.stats.segments},
          {"raw_allocations", p.stats.raw_allocations},
          {"raw_frees", p.stats.raw_frees}};
}

// A number as `%g` prints it (the report streams are set to fixed notation).
std::string shortest(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The factor on --lr for a data-parallel step, which averages world × --batch images: the rate given is the one for
// one process at --batch. `linear` is the linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD";
// Horovod's advice), `sqrt` the square-root rule adaptive optimisers follow (Malladi et al. 2022), `auto` the first
// for SGD and the second for Adam/AdamW. Measured on the LeNet-like model (docs/PERFORMANCE_HISTORY.md, data-parallel):
// 2 ranks at the unscaled rate end 1 epoch about 2 points below one process, at the linearly scaled rate within 0.3
// points.
double lr_scale_for(const TrainArgs& a, int world) {
  const std::string& how = a.lr_scaling == "auto" ? (a.optimizer == "sgd" ? "linear" : "sqrt") : a.lr_scaling;
  if (how == "linear") return world;
  if (how == "sqrt") return std::sqrt(static_cast<double>(world));
  return 1;
}

// Every hyper-parameter of the run (the parsed command line, defaults included).
nlohmann::json hyperparameters(const TrainArgs& a, int threads) {
  return {{"model", a.model},
          {"epochs", a.epochs},
          {"batch", a.batch},
          {"optimizer", a.optimizer},
          {"lr", a.lr},
          {"lr_scaling", a.lr_scaling},
          {"grad_compress", a.grad_compress},
          {"momentum", a.momentum},
          {"weight_decay", a.weight_decay},
          {"scheduler", a.scheduler},
          {"warmup", a.warmup},
          {"accumulate", a.accumulate},
          {"clip", a.clip},
          {"amp", a.amp},
          {"seed", a.seed},
          {"limit", a.limit},
          {"workers", a.workers},
          {"device", a.device},
          {"threads", threads},
          {"nproc", a.nproc},
          {"log_every", a.log_every},
          {"checkpoint_every", a.checkpoint_every},
          {"resume", a.resume},
          {"quantize", a.quantize},
          {"calibration_batches", a.calibration_batches},
          {"init", a.init},
          {"freeze", a.freeze},
          {"replace_head", a.replace_head},
          {"teacher", a.teacher},
          {"distill_temperature", a.distill_temperature},
          {"distill_weight", a.distill_weight}};
}

StatusOr<std::shared_ptr<FashionMnist>> first_n(const std::shared_ptr<FashionMnist>& ds, int64_t n) {
  if (n <= 0 || n >= ds->size()) return ds;
  const auto& im = ds->images();
  Shape s = im.shape();
  s[0] = n;
  KEEL_ASSIGN_OR_RETURN(keel::Tensor images, keel::Tensor::host(DType::kU8, s), "limit");
  KEEL_ASSIGN_OR_RETURN(keel::Tensor labels, keel::Tensor::host(DType::kU8, {n}), "limit");
  std::memcpy(images.raw_data(), im.raw_data(), images.byte_size());
  std::memcpy(labels.raw_data(), ds->labels().raw_data(), static_cast<size_t>(n));
  return FashionMnist::from_tensors(images, labels, "limit");
}

int64_t count_correct(const eager::Tensor& logits, const keel::Tensor& target) {
  auto pred = eager::argmax(logits, 1).to_vector<int64_t>();
  const int64_t* y = target.data<int64_t>();
  int64_t c = 0;
  for (size_t i = 0; i < pred.size(); ++i) c += pred[i] == y[i];
  return c;
}

// Test-set accuracy of the eager model (eval mode, no grad, the training autocast). Data-parallel: each rank
// evaluates every world-th chunk of --batch images and the counts are summed over ranks.
double evaluate_eager(nn::Module& model, const FashionMnist& test, const TrainArgs& a, double* seconds,
                      const Ranks& ranks) {
  auto t0 = Clock::now();
  model.eval();
  eager::NoGradGuard ng;
  std::optional<eager::AutocastGuard> ac;
  if (a.amp == "bf16") ac.emplace(DType::kBF16);
  if (a.amp == "fp16") ac.emplace(DType::kF16);
  int64_t correct = 0, count = 0;
  // At the training batch: activations of 1000 images (233 MB for LeNet) ran from memory, not cache; SimpleCNN's
  // test set took 0.99 s at 1000 images a batch, 0.46 s at 256 and 0.24 s at 64 (1 thread).
  const int64_t bs = a.batch;
  for (int64_t i = ranks.rank * bs; i < test.size(); i += bs * ranks.world) {
    std::vector<int64_t> idx(static_cast<size_t>(std::min(bs, test.size() - i)));
    std::iota(idx.begin(), idx.end(), i);
    auto b = test.get_batch(idx);
    if (!b.is_ok()) throw eager::Error(b.status());
    eager::Tensor x(b->data);
    if (a.device != "cpu") x = x.to(a.device);
    correct += count_correct(model(x), b->target);
    count += static_cast<int64_t>(idx.size());
  }
  model.train();
  auto total = ranks.sum({static_cast<double>(correct), static_cast<double>(count)});
  if (seconds) *seconds = seconds_since(t0);
  return total[1] > 0 ? total[0] / total[1] : 0;
}

// Accuracy of a graph run through a Session on the whole test set, plus latency at batch 1 (median of runs).
struct GraphEval {
  double accuracy = 0, latency_ms = 0, batch_ms = 0;
  int64_t eval_batch = 0;
};

StatusOr<GraphEval> evaluate_graph(Environment& env, const Graph& graph, const FashionMnist& test, int threads,
                                   const std::string& device, std::vector<std::string> passes = {}) {
  SessionOptions so;
  so.devices = {device};
  so.threads = threads;
  so.passes = std::move(passes);
  KEEL_ASSIGN_OR_RETURN(auto session, Session::create(env, graph, so), "session");
  const std::string input = session->input_names().at(0);
  const auto* info = graph.info(input);
  int64_t fixed_batch = 0;  // 0: dynamic batch
  if (info && info->shape && !info->shape->empty() && (*info->shape)[0] > 0) fixed_batch = (*info->shape)[0];
  const int64_t bs = fixed_batch ? fixed_batch : 1000;
  GraphEval r;
  r.eval_batch = bs;
  int64_t correct = 0, seen = 0;
  double total_ms = 0;
  int runs = 0;
  // A fixed batch runs whole batches only; a dynamic one takes the remainder too. One untimed run first: the first run
  // at a batch size builds the session's plan for it (a shape variant and its kernels' plans), which the timing of
  // 10 batches used to include (SimpleCNN: 15.1 ms per batch of 1000 reported, the first run ~110 ms; now 5.3, the
  // steady runs 4.5-5.6 ms as `keel bench` shows).
  if (test.size() >= bs) {
    std::vector<int64_t> idx(static_cast<size_t>(bs));
    std::iota(idx.begin(), idx.end(), int64_t{0});
    KEEL_ASSIGN_OR_RETURN(Batch b, test.get_batch(idx), "test data");
    KEEL_RETURN_IF_ERROR(session->run({{input, b.data}}).status(), "warm-up run");
  }
  for (int64_t i = 0; fixed_batch ? i + bs <= test.size() : i < test.size(); i += bs) {
    const int64_t n = std::min(bs, test.size() - i);
    std::vector<int64_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), i);
    KEEL_ASSIGN_OR_RETURN(Batch b, test.get_batch(idx), "test data");
    auto t0 = Clock::now();
    KEEL_ASSIGN_OR_RETURN(auto out, session->run({{input, b.data}}), "run");
    total_ms += seconds_since(t0) * 1e3;
    ++runs;
    const keel::Tensor& logits = out.at(0);
    const int64_t classes = logits.shape().back();
    const float* l = logits.data<float>();
    for (int64_t k = 0; k < n; ++k) {
      const float* row = l + k * classes;
      correct += (std::max_element(row, row + classes) - row) == b.target.data<int64_t>()[k];
    }
    seen += n;
  }
  r.accuracy = seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0;
  r.batch_ms = runs ? total_ms / runs : 0;
  // Latency: one image at a time (when the batch is dynamic or traced at 1).
  if (!fixed_batch || fixed_batch == 1) {
    KEEL_ASSIGN_OR_RETURN(Batch one, test.get_batch({0}), "test data");
    std::vector<double> ms;
    for (int i = 0; i < 200; ++i) {
      auto t0 = Clock::now();
      KEEL_ASSIGN_OR_RETURN(auto out, session->run({{input, one.data}}), "run");
      if (i >= 20) ms.push_back(seconds_since(t0) * 1e3);
    }
    std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
    r.latency_ms = ms[ms.size() / 2];
  }
  return r;
}

StatusOr<Graph> trace_at(nn::Module& model, const FashionMnist& test, int64_t batch) {
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  std::iota(idx.begin(), idx.end(), 0);
  KEEL_ASSIGN_OR_RETURN(Batch b, test.get_batch(idx), "trace input");
  eager::Tensor x(b.data);
  eager::Tracer tracer(model.type_name() == "LeNet" ? "lenet_fashion_mnist" : "simple_cnn_fashion_mnist");
  tracer.input(x, "image");
  for (const auto& [n, p] : model.named_parameters()) tracer.name_parameter(p, n);
  for (const auto& [n, p] : model.named_buffers()) tracer.name_parameter(p, n);
  tracer.output(model(x), "logits");
  return tracer.graph();
}

// Traces the model (eval mode, fp32) and makes the batch dimension dynamic when the traced graph allows it (checked
// by running it at another batch); otherwise returns a graph traced at batch 1.
StatusOr<Graph> trace_model(Environment& env, nn::Module& model, const FashionMnist& test) {
  model.eval();
  eager::NoGradGuard ng;
  StatusOr<Graph> traced = trace_at(model, test, 2);
  if (!traced.is_ok()) {
    model.train();
    return traced;
  }
  Graph dynamic = *traced;
  bool ok = false;
  if (auto it = dynamic.value_info.find("image"); it != dynamic.value_info.end() && it->second.shape) {
    (*it->second.shape)[0] = -1;
    for (auto v = dynamic.value_info.begin(); v != dynamic.value_info.end();) {
      if (v->first != "image" && !dynamic.is_graph_output(v->first)) v = dynamic.value_info.erase(v);
      else ++v;
    }
    for (const auto& o : dynamic.outputs)
      if (auto oi = dynamic.value_info.find(o);
          oi != dynamic.value_info.end() && oi->second.shape && !oi->second.shape->empty())
        (*oi->second.shape)[0] = -1;
    // A Reshape traced with a constant target shape that starts with the traced batch keeps the batch instead
    // (ONNX: 0 copies the input's dim), as torch.onnx's dynamic axes do.
    for (NodeId id : dynamic.node_ids()) {
      const Node* n = dynamic.node(id);
      if (n->op_type != "Reshape" || n->inputs.size() < 2 || !dynamic.is_initializer(n->inputs[1])) continue;
      const keel::Tensor& shape = dynamic.initializers.at(n->inputs[1]);
      if (shape.dtype() != DType::kI64 || shape.numel() < 1 || shape.data<int64_t>()[0] != 2) continue;
      auto copy = shape.clone();
      if (!copy.is_ok()) continue;
      copy->data<int64_t>()[0] = 0;
      dynamic.initializers[n->inputs[1]] = *copy;
    }
    if (infer_shapes(dynamic).is_ok() && dynamic.validate().is_ok()) {
      SessionOptions so;
      so.devices = {"cpu"};
      auto session = Session::create(env, dynamic, so);
      auto probe = test.get_batch({0, 1, 2});
      ok = session.is_ok() && probe.is_ok() && (*session)->run({{"image", probe->data}}).is_ok();
    }
  }
  StatusOr<Graph> result = ok ? StatusOr<Graph>(std::move(dynamic)) : trace_at(model, test, 1);
  model.train();
  return result;
}

}  // namespace

// Quantizes `fp32` with `keel quantize`'s calibration (tools/calibration/quantize.h: its default ranges over
// `calibration`, per-channel s8 weights, u8 activations; the last fifth of the batches held out for the error report),
// saves the QDQ model beside `fp32_path` as *.int8.onnx, and evaluates it on the test set through a Session that runs
// the `fuse_qdq` pass, so the oneDNN int8 kernels execute it.
StatusOr<GraphEval> quantize_and_evaluate(Environment& env, const Graph& fp32, const std::vector<Feeds>& calibration,
                                          const FashionMnist& test, int threads,
                                          const std::filesystem::path& fp32_path) {
  QuantizeOptions qo;
  qo.progress = false;
  KEEL_ASSIGN_OR_RETURN(QuantizeResult q, quantize_graph(env, fp32, calibration, qo), "int8");
  std::filesystem::path qpath = fp32_path;
  qpath.replace_extension(".int8.onnx");
  KEEL_RETURN_IF_ERROR(save_onnx(q.graph, qpath), "int8");
  size_t quantized = 0;
  for (const auto& l : q.layers) quantized += l.kept_fp32 ? 0 : 1;
  std::cout << "quantized " << quantized << "/" << q.layers.size() << " layer(s) to INT8 (" << qo.method
            << " calibration on " << calibration.size() - q.heldout_batches << " batches; logits cosine "
            << std::setprecision(5) << q.output_cosine << " on " << q.heldout_batches << " held-out), saved "
            << qpath.string() << "\n";
  return evaluate_graph(env, q.graph, test, threads, "cpu", session_passes("auto", q.graph, env));
}

namespace {

// `keel train --evaluate MODEL.onnx`: the model's test accuracy and batch-1 latency through a Session with the default
// passes (fuse_qdq for a QDQ model: the int8 kernels), as the end of a training run reports them; no training.
int evaluate_only(Environment& env, const std::string& path, const FashionMnist& test) {
  auto graph = load_onnx(path);
  if (!graph.is_ok()) {
    std::cerr << "keel train: --evaluate: " << graph.status().to_string() << "\n";
    return 1;
  }
  auto r = evaluate_graph(env, *graph, test, 0, "cpu", session_passes("auto", *graph, env));
  if (!r.is_ok()) {
    std::cerr << "keel train: --evaluate " << path << ": " << r.status().to_string() << "\n";
    return 1;
  }
  std::error_code ec;
  const auto bytes = std::filesystem::file_size(path, ec);
  std::cout << path << ": test accuracy " << std::fixed << std::setprecision(4) << r->accuracy << " (" << test.size()
            << " images)";
  if (r->latency_ms > 0) std::cout << ", latency " << std::setprecision(3) << r->latency_ms << " ms (batch 1)";
  std::cout << ", " << std::setprecision(2) << r->batch_ms << " ms per batch of " << r->eval_batch << ", "
            << (ec ? 0 : bytes) << " bytes\n";
  return 0;
}

// The teacher of knowledge distillation: an ONNX classifier run forward only through a Session (the inference path:
// no autograd tape, the default passes), on the batches the student trains on.
struct Teacher {
  std::unique_ptr<Session> session;
  std::string input;
  double test_accuracy = 0, seconds = 0;  // seconds: forward time of the current epoch
  nlohmann::json record;

  static StatusOr<Teacher> load(Environment& env, const std::string& path, const FashionMnist& test) {
    KEEL_ASSIGN_OR_RETURN(Graph graph, load_onnx(path), "teacher");
    if (graph.inputs.size() != 1 || graph.outputs.empty())
      return Status(StatusCode::kInvalidArgument, "teacher " + path + ": has " + std::to_string(graph.inputs.size()) +
                                                      " inputs and " + std::to_string(graph.outputs.size()) +
                                                      " outputs; it must take the image alone and give logits first");
    if (const auto* info = graph.info(graph.inputs[0]);
        info && info->shape && !info->shape->empty() && (*info->shape)[0] > 0)
      return Status(StatusCode::kInvalidArgument, "teacher " + path + ": input '" + graph.inputs[0] +
                                                      "' has a fixed batch of " + std::to_string((*info->shape)[0]) +
                                                      "; distillation feeds it every training batch, so its " +
                                                      "first dimension must be dynamic (keel train exports it so)");
    KEEL_ASSIGN_OR_RETURN(GraphEval eval,
                          evaluate_graph(env, graph, test, 0, "cpu", session_passes("auto", graph, env)),
                          "teacher " + path);
    SessionOptions so;
    so.devices = {"cpu"};
    so.passes = session_passes("auto", graph, env);
    Teacher t;
    KEEL_ASSIGN_OR_RETURN(t.session, Session::create(env, graph, so), "teacher " + path);
    t.input = t.session->input_names().at(0);
    t.test_accuracy = eval.accuracy;
    KEEL_ASSIGN_OR_RETURN(std::string sha, sha256_file(path), "teacher");
    std::error_code ec;
    t.record = {{"path", std::filesystem::absolute(path).lexically_normal().string()},
                {"bytes", std::filesystem::file_size(path, ec)},
                {"sha256", sha},
                {"test_accuracy", eval.accuracy}};
    return t;
  }
  // The teacher's logits for a batch (host images), on `device`; throws eager::Error naming the teacher.
  eager::Tensor logits(const keel::Tensor& images, const std::string& device) {
    auto t0 = Clock::now();
    auto out = session->run({{input, images}});
    if (!out.is_ok()) throw eager::Error(out.status().with_context("teacher"));
    seconds += seconds_since(t0);
    eager::Tensor l(out->at(0));
    return device != "cpu" ? l.to(device) : l;
  }
};

// `keel train --nproc N`: this process's command line without --nproc, run by `keel launch --nproc-per-node N`.
int relaunch(int nproc) {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(f, arg, '\0');) args.push_back(arg);
  if (args.empty()) {
    std::cerr << "keel train: --nproc: cannot read this process's command line\n";
    return 1;
  }
  LaunchOptions lo;
  lo.nproc_per_node = nproc;
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  lo.command.push_back(ec ? args[0] : exe.string());
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    lo.command.push_back(args[i]);
  }
  return run_launch(lo);
}

int run_train(Globals& g, TrainArgs a) {  // a copy: --device may gain the LOCAL_RANK index
  if (a.nproc > 1 && !std::getenv("WORLD_SIZE")) return relaunch(a.nproc);
  // Eager training runs many short parallel regions: OpenMP threads (oneDNN's) that spin between them starve the
  // training thread on a busy machine. Sleep instead unless the user chose a policy; libgomp reads this when the
  // oneDNN plugin loads it, so before the environment discovers plugins (as eager's default environment does).
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  auto env_u = make_environment(g);
  if (!env_u) return 1;
  std::shared_ptr<Environment> env(std::move(env_u));
  eager::init(env, 0);
  {
    // --device TYPE[:INDEX]; a data-parallel rank given no index takes the card of its LOCAL_RANK.
    auto device = device_for_local_rank(a.device);
    if (!device.is_ok()) {
      std::cerr << "keel train: --device: " << device.status().to_string() << "\n";
      return 2;
    }
    a.device = *device;
  }
  try {
    eager::set_device(a.device);
  } catch (const eager::Error& e) {
    std::cerr << "keel train: " << e.what() << "\n";
    return 1;
  }
  if (a.batch < 1 || a.epochs < 0 || a.accumulate < 1) {
    std::cerr << "keel train: --batch and --accumulate must be >= 1, --epochs >= 0\n";
    return 2;
  }
  // Loader threads by default: one, which decodes the next batch on another core while this one trains (SimpleCNN,
  // 1 thread: 0.79-0.80 s an epoch against 0.81-0.82 on the training thread), but none for a process that may run on
  // one CPU only (a data-parallel rank that keel launch pinned to its core), where that thread only takes turns with
  // the training one (2 ranks x 1 thread: 0.48-0.49 s an epoch against 0.50, four alternated pairs, 2026-12-06).
  if (a.workers < 0) a.workers = available_cpus() > 1 ? 1 : 0;
  // Data-parallel when the environment names more than one rank.
  Ranks ranks;
  {
    auto id = dist::identity_from_env();
    if (!id.is_ok()) {
      std::cerr << "keel train: " << id.status().to_string() << "\n";
      return 2;
    }
    // Any launcher (keel launch, torchrun, mpirun, srun) makes a process group, also of one rank: `keel launch
    // --nproc-per-node 1` then runs the data-parallel path (tools/gpu_check.sh checks it over NCCL on one card).
    if (id->world_size > 1 || id->source != dist::IdentitySource::kSingle) {
      const bool gpu = a.device.rfind("cuda", 0) == 0;
      auto pg =
          dist::ProcessGroup::create(*env, *id, gpu ? "nccl" : "gloo", gpu ? env->device(a.device).value().index : 0,
                                     static_cast<int64_t>(a.dist_timeout_s * 1000));
      if (!pg.is_ok()) {
        std::cerr << "keel train: rank " << id->rank << " of " << id->world_size << ": " << pg.status().to_string()
                  << "\n";
        return 1;
      }
      ranks.pg = std::move(pg).value();
      ranks.rank = ranks.pg->rank();
      ranks.world = ranks.pg->size();
    }
  }
  std::ostream null_out(nullptr);  // ranks other than 0 print nothing but errors
  std::ostream& out = ranks.lead() ? std::cout : null_out;

  // The data files' digests for the run record (rank 0), hashed on a thread of their own while the data decodes.
  std::future<StatusOr<nlohmann::json>> data_files;
  if (!a.run_record.empty() && ranks.lead() && a.evaluate.empty())
    data_files = std::async(std::launch::async, [dir = a.data] { return describe_data_files(dir); });
  // Data: decoded once into memory (u8); batches are gathered and normalised by the loader's worker threads.
  auto t_load = Clock::now();
  // The test split inflates on a thread of its own beside the training split (zlib: about 100 MB/s on the 2-vCPU
  // development host, 0.45 s for the training images alone).
  auto test_load =
      std::async(std::launch::async, [dir = a.data] { return FashionMnist::load(dir, FashionMnist::Split::kTest); });
  auto train_ds = FashionMnist::load(a.data, FashionMnist::Split::kTrain);
  auto test_ds = test_load.get();
  if (!train_ds.is_ok()) test_ds = train_ds;  // the training split's error first
  if (!train_ds.is_ok() || !test_ds.is_ok()) {
    std::cerr << "keel train: " << (train_ds.is_ok() ? test_ds : train_ds).status().to_string() << "\n";
    return 1;
  }
  auto train_set = first_n(*train_ds, a.limit);
  if (!train_set.is_ok()) {
    std::cerr << "keel train: " << train_set.status().to_string() << "\n";
    return 1;
  }
  const auto& train = *train_set;
  const auto& test = *test_ds;
  const double load_s = seconds_since(t_load);
  if (!a.evaluate.empty()) return ranks.lead() ? evaluate_only(*env, a.evaluate, *test) : 0;
  std::optional<Teacher> teacher;
  std::optional<nn::DistillationLoss> distill;
  if (!a.teacher.empty()) {
    auto t = Teacher::load(*env, a.teacher, *test);
    if (!t.is_ok()) {
      std::cerr << "keel train: --teacher: " << t.status().to_string() << "\n";
      return 1;
    }
    teacher.emplace(std::move(t).value());
    try {
      distill.emplace(static_cast<float>(a.distill_temperature), static_cast<float>(a.distill_weight));
    } catch (const eager::Error& e) {
      std::cerr << "keel train: " << e.what() << "\n";
      return 2;
    }
  } else if (a.distill_options_given) {
    std::cerr << "keel train: --distill-temperature and --distill-weight apply to distillation from a --teacher\n";
    return 2;
  }

  eager::manual_seed(a.seed);
  std::shared_ptr<nn::Module> model_owner;
  std::string init_note;
  if (!a.init.empty()) {
    // Fine-tuning an imported model: its initializers become parameters (core/train/onnx_module.h).
    auto m = OnnxModule::load(a.init);
    if (!m.is_ok()) {
      std::cerr << "keel train: --init: " << m.status().to_string() << "\n";
      return 1;
    }
    if (a.replace_head > 0) {
      auto head = (*m)->replace_head(a.replace_head);
      if (!head.is_ok()) {
        std::cerr << "keel train: --replace-head: " << head.status().to_string() << "\n";
        return 2;
      }
      init_note += ", new " + std::to_string(a.replace_head) + "-class head (" + head->front() + ")";
    }
    if (!a.freeze.empty()) {
      auto n = (*m)->freeze(a.freeze);
      if (!n.is_ok()) {
        std::cerr << "keel train: --freeze: " << n.status().to_string() << "\n";
        return 2;
      }
      init_note += ", " + std::to_string(*n) + " parameter tensor(s) frozen";
    }
    init_note = " from " + a.init + init_note;
    model_owner = *m;
  } else if (a.replace_head > 0 || !a.freeze.empty()) {
    std::cerr << "keel train: --replace-head and --freeze apply to a model given with --init\n";
    return 2;
  } else if (a.model == "lenet") {
    model_owner = std::make_shared<LeNet>();
  } else {
    model_owner = std::make_shared<SimpleCNN>();
  }
  nn::Module& model = *model_owner;
  if (a.device != "cpu") model.to(a.device);
  std::vector<eager::Tensor> trainable;  // frozen parameters (--freeze) stay out of the optimizer
  for (const auto& p : model.parameters())
    if (p.requires_grad()) trainable.push_back(p);
  std::unique_ptr<Optimizer> opt;
  const double lr_scale = lr_scale_for(a, ranks.world);
  try {
    if (a.optimizer == "sgd") {
      opt = std::make_unique<SGD>(trainable, SGDOptions{a.lr * lr_scale, a.momentum, 0, a.weight_decay, false});
    } else {
      AdamOptions o;
      o.lr = a.lr * lr_scale;
      o.weight_decay = a.weight_decay;
      opt = std::make_unique<Adam>(trainable, o, a.optimizer == "adamw");
    }
  } catch (const eager::Error& e) {
    std::cerr << "keel train: " << e.what() << "\n";
    return 2;
  }
  DataLoaderOptions lo;
  lo.batch_size = a.batch;
  lo.seed = a.seed;
  lo.workers = a.workers;
  lo.prefetch = 4;
  lo.num_replicas = ranks.world;  // this rank's shard of every epoch (padded to equal sizes)
  lo.rank = ranks.rank;
  auto loader_or = DataLoader::create(train, lo);
  if (!loader_or.is_ok()) {
    std::cerr << "keel train: " << loader_or.status().to_string() << "\n";
    return 2;
  }
  auto loader = std::move(loader_or).value();
  const int64_t steps_per_epoch = (loader->batches_per_epoch() + a.accumulate - 1) / a.accumulate;
  std::shared_ptr<LRScheduler> sched;
  std::shared_ptr<LRScheduler> main_sched;
  const int64_t total_steps = std::max<int64_t>(1, steps_per_epoch * a.epochs - a.warmup);
  if (a.scheduler == "cosine") main_sched = std::make_shared<CosineAnnealingLR>(*opt, total_steps);
  else if (a.scheduler == "step")
    main_sched = std::make_shared<StepLR>(*opt, std::max<int64_t>(1, steps_per_epoch), 0.1);
  if (a.warmup > 0) sched = std::make_shared<LinearWarmupLR>(*opt, a.warmup, 0.1, 1.0, main_sched);
  else sched = main_sched;
  GradScalerOptions so;
  so.enabled = a.amp == "fp16";
  GradScaler scaler(so);

  Progress progress;
  progress.data_seed = a.seed;
  progress.lr_scale = lr_scale;
  if (!a.resume.empty()) {
    auto ckpt = Checkpoint::load(a.resume);
    Status st = ckpt.is_ok() ? restore_checkpoint(*ckpt, model, *opt, sched.get(), &scaler, progress) : ckpt.status();
    if (!st.is_ok()) {
      std::cerr << "keel train: cannot resume from " << a.resume << ": " << st.to_string() << "\n";
      return 1;
    }
    if (progress.data_seed != a.seed) {
      lo.seed = progress.data_seed;
      loader = DataLoader::create(train, lo).value();
    }
    out << "resumed from " << a.resume << " at epoch " << progress.epoch + 1 << ", batch " << progress.batch
        << " (step " << progress.global_step << ")\n";
    // The checkpoint's rates carry the scale of the world size that wrote it: rescale them for this one.
    if (progress.lr_scale != lr_scale) {
      const double ratio = lr_scale / progress.lr_scale;
      for (auto& g : opt->param_groups()) {
        g.lr *= ratio;
        g.initial_lr *= ratio;
      }
      out << "  learning rate x" << shortest(ratio) << " for world size " << ranks.world << " (the checkpoint's scale "
          << shortest(progress.lr_scale) << ", now " << shortest(lr_scale) << ": --lr-scaling " << a.lr_scaling
          << ")\n";
      progress.lr_scale = lr_scale;
    }
  }
  // Resumed or not, every replica starts from rank 0's weights; gradients are averaged from here on.
  std::unique_ptr<DataParallel> dp;
  if (ranks.pg) {
    DataParallelOptions dpo;
    if (a.grad_compress != "none") dpo.grad_compress = a.grad_compress == "bf16" ? DType::kBF16 : DType::kF16;
    auto d = DataParallel::create(model, ranks.pg->comm(), dpo);
    if (!d.is_ok()) {
      std::cerr << "keel train: rank " << ranks.rank << ": " << d.status().to_string() << "\n";
      return 1;
    }
    dp = std::move(d).value();
  }
  std::unique_ptr<ScalarLogger> log;
  if (!a.log.empty() && ranks.lead()) {
    auto l = ScalarLogger::open(a.log, /*append=*/!a.resume.empty());
    if (!l.is_ok()) {
      std::cerr << "keel train: " << l.status().to_string() << "\n";
      return 1;
    }
    log = std::move(l).value();
  }
  auto log_write = [&](const std::string& kind, nlohmann::json rec) {
    if (!log) return;
    Status st = log->write(kind, std::move(rec));
    if (!st.is_ok()) std::cerr << "keel train: warning: " << st.to_string() << "\n";
  };
  auto save_checkpoint = [&]() -> bool {
    if (a.checkpoint.empty() || !ranks.lead()) return true;  // the model and optimizer: the same on every rank
    Status st = capture_checkpoint(model, *opt, sched.get(), &scaler, progress).save(a.checkpoint);
    if (!st.is_ok()) std::cerr << "keel train: checkpoint: " << st.to_string() << "\n";
    return st.is_ok();
  };

  const int threads = env->thread_pool().thread_count();
  out << "keel train: "
      << (!a.init.empty() ? "imported ONNX model"
          : a.model == "lenet"
              ? "LeNet (Conv2D(1,32,3) -> ReLU -> Conv2D(32,64,3) -> ReLU -> MaxPool2D(2) -> Dropout(0.25) -> "
                "Flatten -> Linear(9216,128) -> ReLU -> Dropout(0.5) -> Linear(128,10))"
              : "SimpleCNN (Conv2D(1,32,3) -> ReLU -> MaxPool2D(2) -> Flatten -> Linear(5408,10))")
      << init_note << ", " << model.num_parameters() << " parameters\n"
      << "  data " << a.data << ": " << train->size() << " train / " << test->size() << " test images (decoded in "
      << std::fixed << std::setprecision(2) << load_s << " s)\n"
      << "  " << opt->name() << " lr " << shortest(opt->lr())
      << (lr_scale != 1 ? " (" + shortest(a.lr) + " x " + shortest(lr_scale) + " for " + std::to_string(ranks.world) +
                              " ranks, --lr-scaling " + a.lr_scaling + ")"
                        : std::string())
      << (a.optimizer == "sgd" ? " momentum " + std::to_string(a.momentum).substr(0, 4) : "") << ", batch " << a.batch
      << (a.accumulate > 1 ? " x " + std::to_string(a.accumulate) + " micro-batches" : "") << ", amp " << a.amp << ", "
      << threads << " thread(s), device " << a.device << ", seed " << a.seed << "\n";
  if (teacher) {
    out << "  distillation from " << a.teacher << " (test accuracy " << std::setprecision(4) << teacher->test_accuracy
        << "): loss = " << std::setprecision(2) << a.distill_weight
        << " * T^2 * KL(teacher || student at T = " << a.distill_temperature << ") + " << 1 - a.distill_weight
        << " * cross-entropy\n";
  }
  if (ranks.pg) {
    out << "  data-parallel: world size " << ranks.world << " (" << ranks.pg->backend() << "), batch " << a.batch
        << " per rank = " << a.batch * ranks.world << " per step, " << loader->batches_per_epoch()
        << " batches per rank per epoch"
        << (a.grad_compress != "none" ? ", gradients all-reduced as " + a.grad_compress : std::string())
        << (dp && dp->uses_comm_stream() ? ", all-reduces on a communication stream" : "") << "\n";
  }
  out << std::flush;

  // The experiment record (rank 0): run.json, saved now, after every epoch and at the end (core/train/run_record.h).
  std::optional<RunRecord> record;
  const std::filesystem::path record_path = run_record_path(a);
  auto record_save = [&] {
    if (!record) return;
    Status st = record->save(record_path);
    if (!st.is_ok()) std::cerr << "keel train: warning: " << st.to_string() << "\n";
  };
  if (!a.run_record.empty() && ranks.lead()) {
    record.emplace();
    auto& j = record->json();
    std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
    j["command"] = nlohmann::json::array();
    for (std::string arg; std::getline(cmdline, arg, '\0');) j["command"].push_back(arg);
    j["host"] = environment_info(*env);
    j["host"]["world_size"] = ranks.world;
    j["hyperparameters"] = hyperparameters(a, threads);
    j["seed"] = a.seed;
    auto files = data_files.get();  // started before the data loaded (same condition)
    j["data"] = {{"path", std::filesystem::absolute(a.data).lexically_normal().string()},
                 {"files", files.is_ok() ? *files : nlohmann::json::array()},
                 {"samples", {{"train", train->size()}, {"test", test->size()}, {"train_full", (*train_ds)->size()}}}};
    if (!files.is_ok()) j["data"]["error"] = files.status().to_string();
    j["model"] = {{"name", model.type_name()}, {"parameters", model.num_parameters()}};
    if (!a.init.empty()) {
      auto sha = sha256_file(a.init);
      j["model"]["init"] = {{"path", std::filesystem::absolute(a.init).lexically_normal().string()},
                            {"sha256", sha.is_ok() ? *sha : sha.status().to_string()}};
    }
    if (teacher) {
      j["distillation"] = {{"teacher", teacher->record},
                           {"temperature", a.distill_temperature},
                           {"weight", a.distill_weight},
                           {"loss",
                            "weight * T^2 * KL(softmax(teacher/T) || softmax(student/T)) + (1 - weight) * "
                            "cross_entropy(labels)"}};
    }
    auto rel = [&](const std::string& p) -> nlohmann::json {
      if (p.empty()) return nullptr;
      std::error_code ec;
      auto r = std::filesystem::relative(std::filesystem::absolute(p),
                                         std::filesystem::absolute(record_path).parent_path(), ec);
      return ec || r.empty() ? std::filesystem::absolute(p).string() : r.string();
    };
    j["log"] = rel(a.log);
    j["checkpoint"] = rel(a.checkpoint);
    j["outputs"] = {{"onnx", rel(a.output)}};
    record_save();
  }
  if (a.histogram_bins > 0 && progress.epoch == 0 && progress.batch == 0)
    log_write("histograms", {{"epoch", 0}, {"params", module_histograms(model, false, a.histogram_bins)}});
  nlohmann::json grad_histograms = nlohmann::json::object();

  nn::CrossEntropyLoss ce;
  double final_acc = -1;
  std::vector<double> epoch_seconds;
  try {
    for (int64_t epoch = progress.epoch; epoch < a.epochs; ++epoch) {
      Status st = loader->start_epoch(epoch, progress.batch);
      if (!st.is_ok()) throw eager::Error(st);
      const int64_t shard = (train->size() + ranks.world - 1) / ranks.world;
      const int64_t remaining = shard - std::min(shard, progress.batch * a.batch);
      ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(a.epochs), remaining, "img",
                      !a.quiet && ranks.lead());
      if (dp) dp->reset_stats();
      auto t0 = Clock::now();
      double loss_sum = 0, win_loss = 0, soft_sum = 0, hard_sum = 0;
      if (teacher) teacher->seconds = 0;
      int64_t seen = 0, correct = 0, batches = 0, win_seen = 0, win_correct = 0, win_batches = 0, micro = 0;
      auto win_t0 = Clock::now();
      for (;;) {
        auto next = loader->next();
        if (!next.is_ok()) throw eager::Error(next.status());
        if (!next->has_value()) break;
        Batch& b = **next;
        eager::Tensor x(b.data), y(b.target);
        if (a.device != "cpu") x = x.to(a.device), y = y.to(a.device);
        eager::Tensor logits, loss, soft, hard;
        eager::Tensor teacher_logits = teacher ? teacher->logits(b.data, a.device) : eager::Tensor();
        const bool last_batch = b.index + 1 == loader->batches_per_epoch();
        const bool step_now = micro + 1 == a.accumulate || last_batch;
        {
          // Micro-batches before the step's last accumulate locally; the last one's backward all-reduces.
          std::optional<DataParallel::NoSyncGuard> no_sync;
          if (dp && !step_now) no_sync.emplace(*dp);
          {
            std::optional<eager::AutocastGuard> ac;
            if (a.amp == "bf16") ac.emplace(DType::kBF16);
            if (a.amp == "fp16") ac.emplace(DType::kF16);
            logits = dp ? dp->forward(x) : model(x);
            if (distill) {
              auto parts = distill->parts(logits, teacher_logits, y);
              loss = parts.loss, soft = parts.soft, hard = parts.hard;
            } else {
              loss = ce(logits, y);
            }
          }
          eager::Tensor to_back = a.accumulate > 1 ? loss / static_cast<float>(a.accumulate) : loss;
          scaler.scale(to_back).backward();
        }
        ++micro;
        if (step_now) {
          if (dp) {
            Status fst = dp->finish();
            if (!fst.is_ok()) throw eager::Error(fst);
          }
          if (a.clip > 0) {
            scaler.unscale_(*opt);
            clip_grad_norm_(model.parameters(), a.clip);
          }
          scaler.step(*opt);
          scaler.update();
          if (log && last_batch && a.histogram_bins > 0)
            grad_histograms = module_histograms(model, true, a.histogram_bins);
          opt->zero_grad();
          if (sched) sched->step();
          ++progress.global_step;
          micro = 0;
        }
        progress.batch = b.index + 1;
        const float l = loss.item();
        if (distill) soft_sum += soft.item(), hard_sum += hard.item();
        const int64_t c = count_correct(logits.detach(), b.target);
        loss_sum += l, win_loss += l;
        correct += c, win_correct += c;
        seen += b.size(), win_seen += b.size();
        ++batches, ++win_batches;
        std::ostringstream msg;
        msg << std::fixed << std::setprecision(4) << "loss " << loss_sum / static_cast<double>(batches) << "  acc "
            << static_cast<double>(correct) / static_cast<double>(seen);
        bar.tick(b.size(), msg.str());
        if (a.log_every > 0 && win_batches == a.log_every) {
          const double dt = seconds_since(win_t0);
          log_write("step", {{"step", progress.global_step},
                             {"epoch", epoch + 1},
                             {"loss", win_loss / static_cast<double>(win_batches)},
                             {"accuracy", static_cast<double>(win_correct) / static_cast<double>(win_seen)},
                             {"lr", opt->lr()},
                             {"img_per_s", static_cast<double>(win_seen) / dt},
                             {"loss_scale", scaler.get_scale()}});
          win_loss = 0, win_seen = win_correct = win_batches = 0;
          win_t0 = Clock::now();
        }
        if (a.checkpoint_every > 0 && micro == 0 && progress.global_step % a.checkpoint_every == 0) save_checkpoint();
      }
      // The epoch's metrics over every rank (padding examples of the last shard batch included), and each rank's
      // mean work per step (DataParallelStats::compute_seconds) in its own slot.
      std::vector<double> step_ms(static_cast<size_t>(ranks.world), 0.0);
      {
        std::vector<double> v{
            loss_sum, static_cast<double>(batches), static_cast<double>(correct), static_cast<double>(seen), soft_sum,
            hard_sum};
        v.resize(v.size() + step_ms.size(), 0.0);
        if (dp && dp->stats().compute_steps > 0)
          v[6 + static_cast<size_t>(ranks.rank)] =
              dp->stats().compute_seconds * 1e3 / static_cast<double>(dp->stats().compute_steps);
        auto sums = ranks.sum(std::move(v));
        loss_sum = sums[0], batches = static_cast<int64_t>(sums[1]), correct = static_cast<int64_t>(sums[2]);
        seen = static_cast<int64_t>(sums[3]), soft_sum = sums[4], hard_sum = sums[5];
        std::copy(sums.begin() + 6, sums.end(), step_ms.begin());
      }
      const double dt = seconds_since(t0);
      epoch_seconds.push_back(dt);
      std::ostringstream msg;
      msg << std::fixed << std::setprecision(4) << "loss " << (batches ? loss_sum / static_cast<double>(batches) : 0)
          << "  acc " << (seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0);
      bar.finish(msg.str());
      progress.epoch = epoch + 1;
      progress.batch = 0;
      // KEEL_EAGER_PROFILE=1: this epoch's training ops by kernel and shapes (process CPU time, so a rank's
      // communication thread counts into the ops it ran beside), before evaluation adds its own.
      if (keel::eager::profiling())
        std::cerr << "eager profile of epoch " << epoch + 1 << "'s training (rank " << ranks.rank << "):\n"
                  << keel::eager::profile_report();
      double eval_s = 0;
      final_acc = evaluate_eager(model, *test, a, &eval_s, ranks);
      if (keel::eager::profiling()) (void)keel::eager::profile_report();  // evaluation's ops: not counted
      out << "epoch " << epoch + 1 << "/" << a.epochs << ": " << std::fixed << std::setprecision(2) << dt << " s, "
          << std::setprecision(0) << static_cast<double>(seen) / dt << " img/s, " << std::setprecision(4)
          << "train loss " << (batches ? loss_sum / static_cast<double>(batches) : 0) << ", train accuracy "
          << (seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0) << ", test accuracy " << final_acc
          << " (eval " << std::setprecision(2) << eval_s << " s"
          << (loader->wait_seconds() > 0.05 * dt ? ", waited for data " + std::to_string(loader->wait_seconds()) + " s"
                                                 : "")
          << ")";
      if (teacher) {
        out << ", distillation loss " << std::setprecision(4) << (batches ? soft_sum / static_cast<double>(batches) : 0)
            << ", label loss " << (batches ? hard_sum / static_cast<double>(batches) : 0) << ", teacher "
            << std::setprecision(2) << teacher->seconds << " s";
      }
      // This rank's wait step by step (DataParallelStats::step_wait_ms), for the epoch line and the log.
      const WaitSummary waits = dp ? summarize_waits(dp->stats().step_wait_ms) : WaitSummary{};
      if (dp) {
        const auto& cs = dp->stats();
        // On a card the all-reduces are queued on the communication stream: the time is the queuing's.
        out << ", world size " << ranks.world << (dp->uses_comm_stream() ? ", all-reduce queued in " : ", all-reduce ")
            << std::setprecision(2) << cs.all_reduce_seconds << " s (" << cs.all_reduces << " bucket all-reduces, "
            << std::setprecision(1) << static_cast<double>(cs.bytes) / 1048576.0 << " MiB, "
            << dp->bucket_layout().size() << " bucket(s) per step; waited " << std::setprecision(2) << cs.wait_seconds
            << " s after backward";
        // This rank's wait step by step: the median is what synchronising costs a step, the tail a rank that fell
        // behind (DataParallelStats::step_wait_ms).
        if (!cs.step_wait_ms.empty()) {
          out << ": median " << waits.median << " ms a step, 90th percentile " << waits.p90 << " ms, longest "
              << waits.max << " ms";
        }
        out << ")";
        // Every step waits for the slowest rank: its work per step against the fastest's.
        const auto [lo, hi] = std::minmax_element(step_ms.begin(), step_ms.end());
        if (*hi > 0)
          out << ", work per step " << std::setprecision(2) << *lo << " ms (rank " << lo - step_ms.begin() << ") to "
              << *hi << " ms (rank " << hi - step_ms.begin() << ")";
      }
      out << std::endl;
      // The training device's pool after the epoch (its evaluation included): what the epoch's tensors left in use,
      // what the pool holds (in use + cached), and the peak since the start; reserved stays flat after the first
      // epoch when the steady state allocates nothing new.
      const PoolStats pool = training_pool_stats(*env, a.device);
      if (!pool.key.empty()) {
        out << "  memory " << pool.key << ": in use " << mib(pool.stats.in_use_bytes) << ", reserved "
            << mib(pool.stats.reserved_bytes) << " (" << mib(pool.stats.reserved_bytes - pool.stats.in_use_bytes)
            << " cached), peak in use " << mib(pool.stats.peak_in_use_bytes) << ", peak reserved "
            << mib(pool.stats.peak_reserved_bytes) << std::endl;
      }
      nlohmann::json epoch_record = {
          {"epoch", epoch + 1},
          {"step", progress.global_step},
          {"epoch_seconds", dt},
          {"train_loss", batches ? loss_sum / static_cast<double>(batches) : 0},
          {"train_accuracy", seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0},
          {"test_accuracy", final_acc},
          {"img_per_s", static_cast<double>(seen) / dt},
          {"lr", opt->lr()},
          {"world_size", ranks.world},
          {"all_reduce_seconds", dp ? dp->stats().all_reduce_seconds : 0.0},
          {"wait_seconds", dp ? dp->stats().wait_seconds : 0.0}};
      if (dp) {
        epoch_record["rank_step_ms"] = step_ms;
        epoch_record["wait_median_ms"] = waits.median;  // flat numbers: `keel plot` draws them
        epoch_record["wait_p90_ms"] = waits.p90;
        epoch_record["wait_max_ms"] = waits.max;
      }
      if (teacher) {
        epoch_record["distill_soft_loss"] = batches ? soft_sum / static_cast<double>(batches) : 0;
        epoch_record["distill_label_loss"] = batches ? hard_sum / static_cast<double>(batches) : 0;
      }
      if (!pool.key.empty()) {
        epoch_record["memory_in_use_mib"] = static_cast<double>(pool.stats.in_use_bytes) / 1048576.0;
        epoch_record["memory_reserved_mib"] = static_cast<double>(pool.stats.reserved_bytes) / 1048576.0;
        epoch_record["memory_peak_in_use_mib"] = static_cast<double>(pool.stats.peak_in_use_bytes) / 1048576.0;
      }
      log_write("epoch", std::move(epoch_record));
      if (a.histogram_bins > 0)
        log_write("histograms", {{"epoch", epoch + 1},
                                 {"step", progress.global_step},
                                 {"params", module_histograms(model, false, a.histogram_bins)},
                                 {"grads", grad_histograms}});
      if (record) {
        record->add_epoch({{"epoch", epoch + 1},
                           {"step", progress.global_step},
                           {"seconds", dt},
                           {"img_per_s", static_cast<double>(seen) / dt},
                           {"train_loss", batches ? loss_sum / static_cast<double>(batches) : 0},
                           {"train_accuracy", seen ? static_cast<double>(correct) / static_cast<double>(seen) : 0},
                           {"test_accuracy", final_acc},
                           {"lr", opt->lr()},
                           {"loss_scale", scaler.get_scale()},
                           {"data_wait_seconds", loader->wait_seconds()}});
        if (!pool.key.empty()) record->json()["epochs"].back()["memory"] = pool_json(pool);
        if (teacher) {
          auto& e = record->json()["epochs"].back();
          e["distill_soft_loss"] = batches ? soft_sum / static_cast<double>(batches) : 0;
          e["distill_label_loss"] = batches ? hard_sum / static_cast<double>(batches) : 0;
          e["teacher_seconds"] = teacher->seconds;
        }
        record_save();
      }
      if (!save_checkpoint()) return 1;
    }
    if (final_acc < 0) final_acc = evaluate_eager(model, *test, a, nullptr, ranks);
  } catch (const eager::Error& e) {
    std::cerr << "\nkeel train: " << e.what() << "\n";
    if (record) record->finish({{"test_accuracy", final_acc}}, e.what()), record_save();
    return 1;
  }
  const PoolStats final_pool = training_pool_stats(*env, a.device);
  if (record) {
    if (!final_pool.key.empty()) record->json()["memory"] = pool_json(final_pool);
    const double mean_epoch = epoch_seconds.empty() ? 0
                                                    : std::accumulate(epoch_seconds.begin(), epoch_seconds.end(), 0.0) /
                                                          static_cast<double>(epoch_seconds.size());
    nlohmann::json final_metrics = {{"test_accuracy", final_acc},
                                    {"global_step", progress.global_step},
                                    {"mean_epoch_seconds", mean_epoch},
                                    {"skipped_steps", scaler.skipped_steps()}};
    if (!final_pool.key.empty()) {
      final_metrics["peak_memory_in_use_bytes"] = final_pool.stats.peak_in_use_bytes;
      final_metrics["peak_memory_reserved_bytes"] = final_pool.stats.peak_reserved_bytes;
    }
    record->finish(std::move(final_metrics));
    record_save();
    out << "run record: " << record_path.string() << "\n";
  }
  out << "test accuracy: " << std::fixed << std::setprecision(4) << final_acc << "\n";
  if (!epoch_seconds.empty()) {
    double mean =
        std::accumulate(epoch_seconds.begin(), epoch_seconds.end(), 0.0) / static_cast<double>(epoch_seconds.size());
    out << "mean epoch time: " << std::setprecision(2) << mean << " s\n";
  }
  if (!final_pool.key.empty()) {
    out << "peak memory " << final_pool.key << ": " << mib(final_pool.stats.peak_in_use_bytes) << " in use, "
        << mib(final_pool.stats.peak_reserved_bytes) << " reserved\n";
  }
  out << std::flush;
  if (a.output.empty() || !ranks.lead()) return 0;  // rank 0 alone exports (every replica holds the same weights)

  // Trace → ONNX → Session (the deployed form).
  StatusOr<Graph> traced = Status(StatusCode::kInternal, "not traced");
  try {
    traced = trace_model(*env, model, *test);
  } catch (const eager::Error& e) {
    traced = e.status();
  }
  if (!traced.is_ok()) {
    std::cerr << "keel train: tracing failed: " << traced.status().to_string() << "\n";
    return 1;
  }
  Status st = save_onnx(*traced, a.output);
  if (!st.is_ok()) {
    std::cerr << "keel train: " << st.to_string() << "\n";
    return 1;
  }
  auto reloaded = load_onnx(a.output);
  if (!reloaded.is_ok()) {
    std::cerr << "keel train: the saved model does not load: " << reloaded.status().to_string() << "\n";
    return 1;
  }
  std::cout << "saved " << a.output << " (" << reloaded->node_count() << " nodes)\n";
  auto fp32 = evaluate_graph(*env, *reloaded, *test, 0, "cpu");
  if (!fp32.is_ok()) {
    std::cerr << "keel train: running the saved model: " << fp32.status().to_string() << "\n";
    return 1;
  }
  auto report = [](const char* what, const GraphEval& e) {
    std::cout << what << " test accuracy " << std::fixed << std::setprecision(4) << e.accuracy;
    if (e.latency_ms > 0) std::cout << ", latency " << std::setprecision(3) << e.latency_ms << " ms (batch 1)";
    std::cout << ", " << std::setprecision(2) << e.batch_ms << " ms per batch of " << e.eval_batch << "\n";
  };
  report("fp32 model (Session):", *fp32);
  if (record) {
    record->json()["final"]["onnx_test_accuracy"] = fp32->accuracy;
    record->json()["final"]["onnx_latency_ms"] = fp32->latency_ms;
    record_save();
  }
  if (!a.quantize) return 0;

  std::vector<Feeds> calibration;
  for (int64_t k = 0; k < a.calibration_batches; ++k) {  // calibration from the training set, never the test set
    std::vector<int64_t> idx(static_cast<size_t>(std::min<int64_t>(64, train->size())));
    std::iota(idx.begin(), idx.end(), (k * 64) % std::max<int64_t>(1, train->size() - 64));
    auto b = train->get_batch(idx);
    if (!b.is_ok()) break;
    calibration.push_back({{reloaded->inputs.at(0), b->data}});
  }
  auto i8 = quantize_and_evaluate(*env, *reloaded, calibration, *test, 0, a.output);
  if (!i8.is_ok()) {
    std::cout << "int8: not done: " << i8.status().to_string() << "\n";
    return 0;
  }
  report("int8 model (Session):", *i8);
  if (record) {
    record->json()["final"]["int8_test_accuracy"] = i8->accuracy;
    record->json()["final"]["int8_latency_ms"] = i8->latency_ms;
    record_save();
  }
  std::cout << "int8 - fp32 accuracy: " << std::showpos << std::setprecision(4) << (i8->accuracy - fp32->accuracy)
            << std::noshowpos << "\n";
  return 0;
}

}  // namespace

void add_train_command(CLI::App& app, Globals& g) {
  auto* cmd = app.add_subcommand("train",
                                 "Train the SimpleCNN on Fashion-MNIST (data-parallel under `keel launch` or with "
                                 "--nproc), trace it, save ONNX, quantize to INT8");
  auto a = std::make_shared<TrainArgs>();
  cmd->add_option("--epochs", a->epochs, "Epochs")->check(kNonNegative);
  cmd->add_option("--model", a->model, "simple (SimpleCNN) or lenet (the LeNet-like model of the PyTorch peer)")
      ->check(CLI::IsMember({"simple", "lenet"}));
  cmd->add_option("--nproc", a->nproc, "Data-parallel over N processes on this machine (re-runs through `keel launch`)")
      ->check(kPositive);
  cmd->add_option("--dist-timeout", a->dist_timeout_s, "Seconds to wait for the other ranks at start-up")
      ->check(kPositive);
  cmd->add_option("--batch", a->batch, "Batch size")->check(kPositive);
  cmd->add_option("--threads", g.threads, "Worker threads for kernels (0 = all cores)")->check(kNonNegative);
  cmd->add_option("--amp", a->amp, "Autocast: none, bf16, fp16 (fp16 uses a dynamic loss scaler)")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  cmd->add_option("--lr", a->lr, "Learning rate (for one process at --batch)")->check(kPositive);
  cmd->add_option("--lr-scaling", a->lr_scaling,
                  "Data-parallel: the rate for world x --batch images a step: linear (--lr x world size), sqrt, none; "
                  "auto = linear for SGD, sqrt for Adam/AdamW")
      ->check(CLI::IsMember({"auto", "linear", "sqrt", "none"}));
  cmd->add_option("--grad-compress", a->grad_compress,
                  "Data-parallel: all-reduce the gradients as bf16 or fp16 (half the bytes, each rounded to it; "
                  "torch DDP's compress hooks), or none")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}));
  cmd->add_option("--momentum", a->momentum, "SGD momentum")->check(kNonNegative);
  cmd->add_option("--weight-decay", a->weight_decay, "Weight decay (AdamW: decoupled)")->check(kNonNegative);
  cmd->add_option("--optimizer", a->optimizer, "sgd, adam, adamw")->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  cmd->add_option("--scheduler", a->scheduler, "LR schedule per step: none, step (x0.1 per epoch), cosine")
      ->check(CLI::IsMember({"none", "step", "cosine"}));
  cmd->add_option("--warmup", a->warmup, "Linear warmup steps")->check(kNonNegative);
  cmd->add_option("--accumulate", a->accumulate, "Micro-batches per optimizer step (gradient accumulation)")
      ->check(kPositive);
  cmd->add_option("--clip", a->clip, "Clip the gradient norm to this value (0 = off)")->check(kNonNegative);
  cmd->add_option("--seed", a->seed, "Seed (initial weights, data order)");
  cmd->add_option("--data", a->data, "Directory with the Fashion-MNIST IDX files");
  cmd->add_option("--limit", a->limit, "Train on the first N images only (0 = all)")->check(kNonNegative);
  cmd->add_option("--workers", a->workers,
                  "Data loader threads (0 = load on the training thread; default 1, or 0 where the process may use "
                  "one CPU only, as a data-parallel rank pinned to its core)")
      ->check(kNonNegative)
      ->default_str("1");
  cmd->add_option("--device", a->device,
                  "Device to train on: TYPE or TYPE:INDEX (cpu, cuda, cuda:1); data-parallel ranks given no index "
                  "take the card of their LOCAL_RANK");
  cmd->add_option("--log", a->log, "Scalar log (JSON Lines) for `keel plot`");
  cmd->add_option("--log-every", a->log_every, "Batches per step record in the log")->check(kNonNegative);
  cmd->add_option("--checkpoint", a->checkpoint, "Checkpoint file (safetensors), written after every epoch");
  cmd->add_option("--checkpoint-every", a->checkpoint_every, "Also write the checkpoint every N steps")
      ->check(kNonNegative);
  cmd->add_option("--resume", a->resume, "Resume from a checkpoint");
  cmd->add_option("-o,--output", a->output, "Where to save the traced ONNX model ('' = do not trace)");
  cmd->add_flag("--quantize,!--no-quantize", a->quantize,
                "Quantize the saved model to INT8 and evaluate it (default on)");
  cmd->add_option("--calibration-batches", a->calibration_batches, "Batches of 64 training images for INT8 calibration")
      ->check(kPositive);
  cmd->add_flag("-q,--quiet", a->quiet, "No progress bar");
  cmd->add_option("--init", a->init,
                  "Fine-tune: start from this ONNX model (its weights become parameters) instead of --model");
  cmd->add_option("--freeze", a->freeze,
                  "With --init: parameters whose name matches this regular expression are not trained");
  cmd->add_option("--replace-head", a->replace_head,
                  "With --init: a new classifier with N outputs (the Gemm/MatMul behind the output)")
      ->check(kNonNegative);
  cmd->add_option(
      "--run-record", a->run_record,
      "Experiment record (JSON): 'auto' = run.json beside the log, else the checkpoint, else the model; '' = none");
  cmd->add_option("--histogram-bins", a->histogram_bins,
                  "Bins of the per-epoch parameter and gradient histograms in the log (0 = none)")
      ->check(kNonNegative);
  cmd->add_option(
         "--teacher", a->teacher,
         "Knowledge distillation: this ONNX classifier (dynamic batch) runs forward on every batch; loss = W * "
         "T^2 * KL(softmax(teacher/T) || softmax(student/T)) + (1 - W) * cross-entropy")
      ->check(CLI::ExistingFile);
  auto* temperature = cmd->add_option("--distill-temperature", a->distill_temperature,
                                      "With --teacher: the softmax temperature T (default 4)")
                          ->check(kPositive);
  auto* weight = cmd->add_option("--distill-weight", a->distill_weight,
                                 "With --teacher: the weight W of the distillation term, 0..1 (default 0.9)")
                     ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--evaluate", a->evaluate,
                  "Evaluate this ONNX model (fp32 or INT8 QDQ) on the test set through a Session and stop: accuracy, "
                  "batch-1 latency, file size")
      ->check(CLI::ExistingFile);
  cmd->callback([&g, a, temperature, weight] {
    a->distill_options_given = temperature->count() + weight->count() > 0;
    int rc = run_train(g, *a);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

void add_plot_command(CLI::App& app, Globals&) {
  auto* cmd = app.add_subcommand("plot",
                                 "Draw training runs: the curves of scalar logs (`keel train --log`), several runs "
                                 "on one page with their records (run.json) and parameter/gradient histograms");
  auto runs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>("curves.svg");
  auto title = std::make_shared<std::string>();
  auto columns = std::make_shared<int>(2);
  cmd->add_option("runs", *runs, "Runs: scalar logs (.jsonl), run.json files or directories holding run.json")
      ->required();
  cmd->add_option("-o,--output", *out, "Output: .svg (one log: its curves) or .html (every run, records, histograms)");
  cmd->add_option("--title", *title, "Title (default: the log's file name)");
  cmd->add_option("--columns", *columns, "Panels per row")->check(kPositive);
  cmd->callback([runs, out, title, columns] {
    const std::string ext = std::filesystem::path(*out).extension().string();
    if (ext != ".svg" && ext != ".html" && ext != ".htm") {
      std::cerr << "keel plot: the output must end in .svg or .html, got '" << *out << "'\n";
      throw CLI::RuntimeError(2);
    }
    std::vector<RunView> views;
    for (const auto& r : *runs) {
      auto v = load_run(r);
      if (!v.is_ok()) {
        std::cerr << "keel plot: " << v.status().to_string() << "\n";
        throw CLI::RuntimeError(1);
      }
      views.push_back(std::move(v).value());
    }
    const std::string t = !title->empty()     ? *title
                          : views.size() == 1 ? views[0].label
                                              : std::to_string(views.size()) + " runs";
    std::string doc;
    if (ext == ".svg") {
      if (views.size() != 1) {
        std::cerr << "keel plot: comparing " << views.size() << " runs needs an .html output\n";
        throw CLI::RuntimeError(2);
      }
      doc = render_curves_svg(views[0].log, t, *columns);
    } else {
      doc = render_runs_html(views, t, *columns);
    }
    std::ofstream f(*out, std::ios::binary);
    f << doc;
    if (!f) {
      std::cerr << "keel plot: cannot write " << *out << "\n";
      throw CLI::RuntimeError(1);
    }
    size_t curves = 0, histograms = 0;
    int64_t records = 0, skipped = 0;
    for (const auto& v : views)
      curves += v.log.series.size(), records += v.log.records, skipped += v.log.skipped_lines,
          histograms += v.histograms.size();
    std::cout << "keel plot: " << views.size() << " run(s), " << curves << " curve(s) from " << records << " record(s)"
              << (skipped ? " (" + std::to_string(skipped) + " unreadable lines skipped)" : "")
              << (ext != ".svg" && histograms ? ", " + std::to_string(histograms) + " epoch(s) of histograms" : "")
              << " -> " << *out << "\n";
  });
}

}  // namespace keel::cli
