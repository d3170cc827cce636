// `keel run MODEL.onnx` — loads a model, binds inputs from files (TensorProto .pb or .npy) or random data, runs it,
// prints every output (name, dtype, shape, first values) and the run time, and optionally writes output_K.pb files.
// `keel run --batch LIST` (for fuzzers, hidden from --help): runs every model that LIST names, in turn, in this one
// process and one environment, each framed by status lines on stderr (see add_run_command).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "core/base/device_spec.h"
#include "core/runtime/dist/identity.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/keel/commands.h"

namespace keel::cli {

void add_precision_option(CLI::App* cmd, std::string& precision) {
  cmd->add_option("--precision", precision,
                  "Compute precision: fp32 (as the model is), fp16 or bf16 (appends the convert_precision pass: "
                  "mixed precision with fp32 inputs/outputs and an fp32 keep-list)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
}

Status append_precision_pass(const std::string& precision, bool auto_passes, const Environment& env,
                             std::vector<std::string>& passes) {
  if (precision.empty() || precision == "fp32") return Status::ok();
  if (precision != "fp16" && precision != "bf16")
    return invalid_argument("--precision '" + precision + "': expected fp32, fp16 or bf16");
  const std::string pass = "convert_" + precision;
  if (!env.registry().pass(pass))
    return not_found("--precision " + precision + " needs the '" + pass +
                     "' pass (the precision pass plugin); it is not installed (see `keel plugins`)");
  // Conv + BN + bias + residual + activation fused before the conversion, for the dtype they will run in (the fusion
  // pass produces keel.FusedConv only where a kernel takes it in bf16 at Conv's rank: the oneDNN plugin; the reference
  // fused kernels are f32-only), and only where no claim hook takes the cpu graph: the oneDNN chains claim bf16
  // Conv+bias+residual+activation themselves and keep layouts between them (pre-fused FusedConv nodes would split the
  // chains: measured 1.5x slower on mobilenet_v2).
  const bool chains = !env.registry().claimers_for("cpu").empty();
  if (auto_passes && precision == "bf16" && !chains)
    for (const char* f : {"fuse_conv_bn", "fuse_conv_activation:dtype=bf16"}) {
      const std::string name = std::string(f).substr(0, std::string(f).find(':'));
      bool listed = false;
      for (const auto& p : passes) listed = listed || p.substr(0, p.find(':')) == name;
      if (env.registry().pass(name) && !listed) passes.push_back(f);
    }
  passes.push_back(pass);
  return Status::ok();
}

// Declared in commands.h: random data for a graph input (shared by run, bench, quantize).
StatusOr<std::string> device_option(const Environment& env, const std::string& device) {
  if (device.empty()) return std::string();
  KEEL_ASSIGN_OR_RETURN(DeviceSpec spec, env.device(device), "");
  return spec.explicit_index ? spec.to_string() : spec.type;
}

StatusOr<std::string> device_for_local_rank(const std::string& device) {
  KEEL_ASSIGN_OR_RETURN(DeviceSpec spec, DeviceSpec::parse(device), "");
  if (spec.explicit_index || spec.type == "cpu") return device;
  KEEL_ASSIGN_OR_RETURN(dist::Identity id, dist::identity_from_env(), "");
  if (id.world_size <= 1) return device;
  spec.index = id.local_rank;
  return spec.to_string();
}

StatusOr<Tensor> random_input(DType dtype, const Shape& shape, std::mt19937& rng) {
  KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(dtype, shape), "random input");
  const int64_t n = t.numel();
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> small(0, 4);
  for (int64_t i = 0; i < n; ++i) {
    switch (dtype) {
      case DType::kF32: t.data<float>()[i] = normal(rng); break;
      case DType::kF64: t.data<double>()[i] = normal(rng); break;
      case DType::kF16: t.data<uint16_t>()[i] = f32_to_f16(normal(rng)); break;
      case DType::kBF16: t.data<uint16_t>()[i] = f32_to_bf16(normal(rng)); break;
      case DType::kI8: t.data<int8_t>()[i] = static_cast<int8_t>(small(rng)); break;
      case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(small(rng)); break;
      case DType::kI16: t.data<int16_t>()[i] = static_cast<int16_t>(small(rng)); break;
      case DType::kU16: t.data<uint16_t>()[i] = static_cast<uint16_t>(small(rng)); break;
      case DType::kI32: t.data<int32_t>()[i] = small(rng); break;
      case DType::kU32: t.data<uint32_t>()[i] = static_cast<uint32_t>(small(rng)); break;
      case DType::kI64: t.data<int64_t>()[i] = small(rng); break;
      case DType::kU64: t.data<uint64_t>()[i] = static_cast<uint64_t>(small(rng)); break;
      case DType::kBool: t.data<uint8_t>()[i] = static_cast<uint8_t>(small(rng) & 1); break;
      default: return unimplemented(std::string("cannot make random data of dtype ") + dtype_name(dtype));
    }
  }
  return t;
}

namespace {

struct RunArgs {
  std::string model;
  std::string batch;  // --batch LIST: a file of model paths
  std::string passes = "auto";
  std::string precision = "fp32";
  std::vector<std::string> inputs;  // NAME=FILE
  std::string output_dir;
  std::string device;
  int iterations = 1;
  int warmup = 0;
  int print_values = 8;
  uint32_t seed = 0;
  int shape_variants = SessionOptions{}.shape_variants;
};

std::string first_values(const Tensor& t, int count) {
  std::ostringstream os;
  os << "[";
  const int64_t n = std::min<int64_t>(t.numel(), count);
  for (int64_t i = 0; i < n; ++i) {
    if (i) os << ", ";
    double v = element_as_double(t, i);
    if (dtype_is_float(t.dtype())) {
      os << std::setprecision(6) << v;
    } else if (t.dtype() == DType::kBool) {
      os << (v != 0 ? "true" : "false");
    } else if (t.dtype() == DType::kU64) {
      os << t.data<uint64_t>()[i];
    } else if (t.dtype() == DType::kI64) {
      os << t.data<int64_t>()[i];
    } else {
      os << static_cast<int64_t>(v);
    }
  }
  if (t.numel() > n) os << ", ...";
  os << "]";
  return os.str();
}

// Runs a.model; `shared_env` (may be null: one is made from the globals) is the batch mode's one environment.
int run_model(const RunArgs& a, Globals& g, Environment* shared_env = nullptr) {
  namespace fs = std::filesystem;
  auto loaded = load_onnx(a.model);
  if (!loaded.is_ok()) {
    std::cerr << "keel run: " << loaded.status().to_string() << "\n";
    return 1;
  }
  Graph graph = std::move(loaded).value();

  // Bind the inputs given on the command line.
  std::map<std::string, RunValue> bound;
  for (const auto& spec : a.inputs) {
    auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::cerr << "keel run: --input wants NAME=FILE, got '" << spec << "'\n";
      return 2;
    }
    std::string name = spec.substr(0, eq), file = spec.substr(eq + 1);
    if (std::find(graph.inputs.begin(), graph.inputs.end(), name) == graph.inputs.end()) {
      std::cerr << "keel run: the model has no input '" << name << "' (inputs:";
      for (const auto& n : graph.inputs) std::cerr << " " << n;
      std::cerr << ")\n";
      return 1;
    }
    const ValueInfo* vi = graph.info(name);
    // Sequence and optional inputs come as SequenceProto / OptionalProto files.
    auto t = read_value_file(file, vi);
    if (!t.is_ok()) {
      std::cerr << "keel run: input '" << name << "': " << t.status().to_string() << "\n";
      return 1;
    }
    RunValue value = std::move(t).value();
    if (vi && vi->dtype == DType::kBF16 && value.is_tensor() && value.tensor.dtype() == DType::kU16) {
      // NumPy and the ONNX test data store bfloat16 as uint16: same bits.
      value = Tensor(DType::kBF16, value.tensor.shape(), value.tensor.storage());
    }
    bound[name] = std::move(value);
  }
  // The environment and the device first: a device that is not there is the error, before any input is made.
  std::unique_ptr<Environment> own_env;
  Environment* env = shared_env;
  if (!env) {
    own_env = make_environment(g);
    if (!own_env) return 1;
    env = own_env.get();
  }
  auto device = device_option(*env, a.device);
  if (!device.is_ok()) {
    std::cerr << "keel run: --device: " << device.status().to_string() << "\n";
    return 1;
  }
  // Random data for the rest.
  std::mt19937 rng(a.seed);
  std::vector<std::pair<std::string, RunValue>> inputs;
  for (const auto& name : graph.inputs) {
    auto it = bound.find(name);
    if (it != bound.end()) {
      std::cout << "input  " << name << ": " << it->second.describe() << " (from file)\n";
      inputs.emplace_back(name, it->second);
      continue;
    }
    const ValueInfo* vi = graph.info(name);
    if (!vi || vi->dtype == DType::kUndefined || !vi->is_tensor()) {
      std::cerr << "keel run: input '" << name << "' has no known tensor type"
                << (vi && !vi->is_tensor() ? " (it is " + vi->to_string() + ")" : "") << "; give it with --input "
                << name << "=FILE\n";
      return 1;
    }
    Shape shape = vi->shape.value_or(Shape{});
    bool guessed = false;
    for (auto& d : shape)
      if (d < 0) {
        d = 1;
        guessed = true;
      }
    if (!vi->shape) guessed = true;
    if (guessed) {
      std::cerr << "keel run: warning: input '" << name << "' has unknown dimensions "
                << (vi->shape ? shape_to_string(*vi->shape) : "(unknown rank)") << "; using " << shape_to_string(shape)
                << " (give it with --input " << name << "=FILE)\n";
    }
    auto t = random_input(vi->dtype, shape, rng);
    if (!t.is_ok()) {
      std::cerr << "keel run: input '" << name << "': " << t.status().to_string() << "\n";
      return 1;
    }
    std::cout << "input  " << name << ": " << t->describe() << " (random)\n";
    inputs.emplace_back(name, std::move(t).value());
  }

  SessionOptions so;
  if (!device->empty()) so.devices = {*device};
  so.shape_variants = a.shape_variants;
  so.passes = session_passes(a.passes, graph, *env);
  if (Status st = append_precision_pass(a.precision, a.passes == "auto", *env, so.passes); !st.is_ok()) {
    std::cerr << "keel run: " << st.to_string() << "\n";
    return 1;
  }
  auto t_create = std::chrono::steady_clock::now();
  std::vector<ValueInfo> output_types;
  for (const auto& o : graph.outputs) output_types.push_back(graph.info(o) ? *graph.info(o) : ValueInfo{});
  auto session = Session::create(*env, std::move(graph), so);
  double create_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_create).count();
  if (!session.is_ok()) {
    std::cerr << "keel run: " << session.status().to_string() << "\n";
    return 1;
  }
  for (const auto& f : (*session)->fallbacks()) {
    std::cerr << "keel run: note: node '" << f.node << "' (" << f.op_type << ") runs on " << (f.to.empty() ? "?" : f.to)
              << " instead of " << f.from << ": " << f.reason << "\n";
  }
  for (int i = 0; i < a.warmup; ++i) {
    auto r = (*session)->run_values(inputs);
    if (!r.is_ok()) {
      std::cerr << "keel run: " << r.status().to_string() << "\n";
      return 1;
    }
  }
  std::vector<double> times;
  StatusOr<std::vector<RunValue>> outputs = internal_error("not run");
  for (int i = 0; i < a.iterations; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    outputs = (*session)->run_values(inputs);
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (!outputs.is_ok()) {
      std::cerr << "keel run: " << outputs.status().to_string() << "\n";
      return 1;
    }
  }
  const auto& names = (*session)->output_names();
  for (size_t k = 0; k < outputs->size(); ++k) {
    const RunValue& v = (*outputs)[k];
    std::cout << "output " << (k < names.size() ? names[k] : "#" + std::to_string(k)) << ": ";
    if (v.is_tensor()) {
      std::cout << dtype_name(v.tensor.dtype()) << " " << shape_to_string(v.tensor.shape()) << " "
                << first_values(v.tensor, a.print_values) << "\n";
    } else {
      std::cout << v.describe() << "\n";
      for (size_t i = 0; i < v.sequence.size(); ++i) {
        std::cout << "  [" << i << "] " << dtype_name(v.sequence[i].dtype()) << " "
                  << shape_to_string(v.sequence[i].shape()) << " " << first_values(v.sequence[i], a.print_values)
                  << "\n";
      }
    }
  }
  std::sort(times.begin(), times.end());
  double sum = 0;
  for (double t : times) sum += t;
  std::cout << std::fixed << std::setprecision(3) << "session created in " << create_ms << " ms; run: ";
  if (times.size() == 1) {
    std::cout << times[0] << " ms\n";
  } else {
    std::cout << "mean " << sum / times.size() << " ms, min " << times.front() << " ms, median "
              << times[times.size() / 2] << " ms over " << times.size() << " iterations\n";
  }
  if (!a.output_dir.empty()) {
    std::error_code ec;
    fs::create_directories(a.output_dir, ec);
    if (ec) {
      std::cerr << "keel run: cannot create '" << a.output_dir << "': " << ec.message() << "\n";
      return 1;
    }
    for (size_t k = 0; k < outputs->size(); ++k) {
      fs::path file = fs::path(a.output_dir) / ("output_" + std::to_string(k) + ".pb");
      Status s = write_value_pb((*outputs)[k], k < output_types.size() ? &output_types[k] : nullptr, file,
                                k < names.size() ? names[k] : "");
      if (!s.is_ok()) {
        std::cerr << "keel run: " << s.to_string() << "\n";
        return 1;
      }
    }
    std::cout << "wrote " << outputs->size() << " output file(s) to " << a.output_dir << "\n";
  }
  return 0;
}

// --batch: every model of the list in turn (blank lines and lines starting with '#' skipped), with the other options,
// in one environment. Each model is framed on stderr by "keel-batch: start K PATH" and "keel-batch: end K rc=N" (K
// counts from 0 over the models; N is what `keel run PATH` would have exited with), stdout flushed before each frame
// line so that a caller reading both streams through one pipe sees every model's output between its frames. A model
// whose run ends the process (a signal, a sanitizer report) leaves a start line without its end: the caller reruns
// from there. Returns 0 once every model has run, 1 when the list cannot be read.
int run_batch(const RunArgs& a, Globals& g) {
  std::ifstream list(a.batch);
  if (!list) {
    std::cerr << "keel run: cannot read the --batch list '" << a.batch << "'\n";
    return 1;
  }
  auto env = make_environment(g);
  if (!env) return 1;
  std::string line;
  int k = 0;
  while (std::getline(list, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    RunArgs one = a;
    one.model = line;
    one.batch.clear();
    std::cout.flush();
    std::cerr << "keel-batch: start " << k << " " << line << std::endl;
    int rc = 1;
    if (!std::filesystem::is_regular_file(line)) {
      std::cerr << "keel run: model: File does not exist: " << line << "\n";
    } else {
      try {
        rc = run_model(one, g, env.get());
      } catch (const std::exception& e) {  // as main() reports an escaped exception of a single run
        std::cerr << "keel: " << e.what() << "\n";
        rc = 1;
      }
    }
    std::cout.flush();
    std::cerr << "keel-batch: end " << k << " rc=" << rc << std::endl;
    ++k;
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "Run an ONNX model on given or random inputs and print its outputs");
  cmd->add_option("model", a->model, "The model (.onnx)")->check(CLI::ExistingFile);
  // Hidden (an empty group): for tests/fuzz/fuzz_attributes.py, which runs thousands of small models.
  cmd->add_option("--batch", a->batch,
                  "A file listing models (one path a line): run each in turn in this process, framed by "
                  "'keel-batch: start K PATH' / 'keel-batch: end K rc=N' lines on stderr")
      ->check(CLI::ExistingFile)
      ->group("");
  cmd->add_option("--input,-i", a->inputs,
                  "NAME=FILE: an input from a TensorProto .pb or NumPy .npy file (repeatable)");
  cmd->add_option("--output-dir,-o", a->output_dir, "Write output_K.pb (K in graph-output order) into this directory");
  cmd->add_option("--passes", a->passes,
                  "Session passes: auto (the default pipeline of `keel optimize`; fuse_qdq for QDQ models: int8 "
                  "kernels), none, or a comma list (name:key=value gives a pass options)");
  add_precision_option(cmd, a->precision);
  cmd->add_option("--device,-d", a->device,
                  "Preferred device: TYPE or TYPE:INDEX (cpu, cuda, cuda:1, ...); default: every device by priority");
  cmd->add_option("--threads", g.threads, "Worker threads for kernels (0 = all cores)")->check(kNonNegative);
  cmd->add_option("--iterations,-n", a->iterations, "Timed runs")->check(kPositive);
  cmd->add_option("--warmup", a->warmup, "Untimed runs before the timed ones")->check(kNonNegative);
  cmd->add_option("--print", a->print_values, "How many values of each output to print")->check(kNonNegative);
  cmd->add_option("--seed", a->seed, "Seed of the random inputs");
  cmd->add_option("--shape-variants", a->shape_variants,
                  "Shape variants a session builds for a model whose inputs have dynamic dims: each run shape gets "
                  "the graph specialised to it, up to N of them (0 = off)")
      ->check(kNonNegative);
  cmd->callback([a, &g] {
    if (a->model.empty() == a->batch.empty()) {
      std::cerr << "keel run: give a model (or, for fuzzers, --batch LIST), not "
                << (a->model.empty() ? "neither" : "both") << "\n";
      throw CLI::RuntimeError(2);
    }
    int rc = a->batch.empty() ? run_model(*a, g) : run_batch(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
