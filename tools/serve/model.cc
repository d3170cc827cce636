// keel/tools/serve/model.cc — config parsing, instances and the dynamic batcher (see model.h).
#include "tools/serve/model.h"

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <fstream>
#include <iomanip>
#include <random>
#include <sstream>

#include "core/base/pass_manager.h"
#include "core/runtime/host_api.h"
#include "core/runtime/kernel_context.h"
#include "core/runtime/onnx_io.h"

namespace keel::serve {

using clock = std::chrono::steady_clock;

const char* failure_name(Failure f) {
  switch (f) {
    case Failure::kBadRequest: return "bad_request";
    case Failure::kQueueFull: return "queue_full";
    case Failure::kUnavailable: return "unavailable";
    case Failure::kTimeout: return "timeout";
    case Failure::kRunFailed: return "run_failed";
    default: return "other";
  }
}

std::vector<int64_t> VersionPolicy::select(std::vector<int64_t> present) const {
  std::sort(present.begin(), present.end());
  std::vector<int64_t> out;
  switch (kind) {
    case Kind::kAll: return present;
    case Kind::kLatest:
      for (size_t i = present.size() > static_cast<size_t>(latest) ? present.size() - static_cast<size_t>(latest) : 0;
           i < present.size(); ++i)
        out.push_back(present[i]);
      return out;
    case Kind::kSpecific:
      for (int64_t v : present)
        if (std::find(specific.begin(), specific.end(), v) != specific.end()) out.push_back(v);
      return out;
  }
  return out;
}

StatusOr<ModelConfig> parse_model_config_text(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return invalid_argument("model config " + origin + ": " + std::string(e.description()));
  }
  const std::string where = "model config " + origin + ": ";
  ModelConfig c;
  auto int_of = [&](const toml::node& n, const std::string& key, int64_t& out, int64_t lo, int64_t hi) -> Status {
    auto v = n.value<int64_t>();
    if (!n.is_integer() || !v || *v < lo || *v > hi)
      return invalid_argument(where + "`" + key + "` must be an integer in [" + std::to_string(lo) + ", " +
                              std::to_string(hi) + "]");
    out = *v;
    return Status::ok();
  };
  auto int_key = [&](const char* key, int64_t& out, int64_t lo, int64_t hi) -> Status {
    const toml::node* n = root.get(key);
    return n == nullptr ? Status::ok() : int_of(*n, key, out, lo, hi);
  };
  auto int_array = [&](const toml::node& n, const std::string& key, std::vector<int64_t>& out, int64_t lo,
                       int64_t hi) -> Status {
    const toml::array* a = n.as_array();
    if (a == nullptr) return invalid_argument(where + "`" + key + "` must be an array of integers");
    for (const auto& e : *a) {
      int64_t v = 0;
      KEEL_RETURN_IF_ERROR(int_of(e, key + "[]", v, lo, hi), "");
      out.push_back(v);
    }
    return Status::ok();
  };
  auto string_key = [&](const char* key, std::string& out) -> Status {
    const toml::node* n = root.get(key);
    if (n == nullptr) return Status::ok();
    auto s = n->value<std::string>();
    if (!n->is_string() || !s) return invalid_argument(where + "`" + key + "` must be a string");
    out = *s;
    return Status::ok();
  };
  KEEL_RETURN_IF_ERROR(int_key("max_batch_size", c.max_batch_size, 0, 1 << 20), "");
  KEEL_RETURN_IF_ERROR(int_key("max_queue_delay_us", c.max_queue_delay_us, 0, 60'000'000), "");
  KEEL_RETURN_IF_ERROR(int_key("max_queue_size", c.max_queue_size, 1, 1 << 20), "");
  KEEL_RETURN_IF_ERROR(int_key("default_timeout_us", c.default_timeout_us, 0, 3'600'000'000), "");
  KEEL_RETURN_IF_ERROR(int_key("instances", c.instances, 1, 256), "");
  KEEL_RETURN_IF_ERROR(int_key("threads", c.threads, 0, 1024), "");
  if (const toml::node* n = root.get("preferred_batch_sizes")) {
    KEEL_RETURN_IF_ERROR(int_array(*n, "preferred_batch_sizes", c.preferred_batch_sizes, 1, 1 << 20), "");
    std::sort(c.preferred_batch_sizes.begin(), c.preferred_batch_sizes.end());
    if (c.max_batch_size == 0 && !c.preferred_batch_sizes.empty())
      return invalid_argument(where + "`preferred_batch_sizes` needs max_batch_size > 0");
    if (!c.preferred_batch_sizes.empty() && c.preferred_batch_sizes.back() > c.max_batch_size)
      return invalid_argument(where + "preferred batch size " + std::to_string(c.preferred_batch_sizes.back()) +
                              " exceeds max_batch_size " + std::to_string(c.max_batch_size));
  }
  if (const toml::node* n = root.get("warmup_batch_sizes")) {
    c.warmup_batch_sizes.emplace();
    KEEL_RETURN_IF_ERROR(int_array(*n, "warmup_batch_sizes", *c.warmup_batch_sizes, 1, 1 << 20), "");
    for (int64_t b : *c.warmup_batch_sizes)
      if (b > std::max<int64_t>(c.max_batch_size, 1))
        return invalid_argument(where + "warmup batch size " + std::to_string(b) + " exceeds max_batch_size " +
                                std::to_string(c.max_batch_size));
  }
  if (const toml::node* n = root.get("dynamic_batch")) {
    if (!n->is_boolean()) return invalid_argument(where + "`dynamic_batch` must be true or false");
    c.dynamic_batch = n->value<bool>().value_or(false);
    if (c.dynamic_batch && c.max_batch_size == 0)
      return invalid_argument(where + "`dynamic_batch` needs max_batch_size > 0");
  }
  if (const toml::node* n = root.get("passes")) {
    if (n->is_string()) {
      const std::string s = *n->value<std::string>();
      if (s == "none") c.passes = std::vector<std::string>{};
      else if (s != "auto") return invalid_argument(where + "`passes` is \"auto\", \"none\" or an array of pass names");
    } else if (const toml::array* a = n->as_array()) {
      c.passes = std::vector<std::string>{};
      for (const auto& e : *a) {
        auto s = e.value<std::string>();
        if (!e.is_string() || !s || s->empty())
          return invalid_argument(where + "`passes` is \"auto\", \"none\" or an array of pass names");
        c.passes->push_back(*s);
      }
    } else {
      return invalid_argument(where + "`passes` is \"auto\", \"none\" or an array of pass names");
    }
  }
  KEEL_RETURN_IF_ERROR(string_key("precision", c.precision), "");
  if (c.precision != "fp32" && c.precision != "fp16" && c.precision != "bf16")
    return invalid_argument(where + "`precision` is fp32, fp16 or bf16, not '" + c.precision + "'");
  KEEL_RETURN_IF_ERROR(string_key("device", c.device), "");
  if (const toml::node* n = root.get("version_policy")) {
    const toml::table* t = n->as_table();
    if (t == nullptr || t->size() != 1)
      return invalid_argument(where +
                              "`version_policy` is a table with one key: latest = N, all = true or "
                              "specific = [versions]");
    auto& p = c.version_policy;
    if (const toml::node* l = t->get("latest")) {
      p.kind = VersionPolicy::Kind::kLatest;
      KEEL_RETURN_IF_ERROR(int_of(*l, "version_policy.latest", p.latest, 1, 1 << 20), "");
    } else if (const toml::node* a = t->get("all")) {
      if (!a->is_boolean() || !a->value<bool>().value_or(false))
        return invalid_argument(where + "`version_policy.all` must be true");
      p.kind = VersionPolicy::Kind::kAll;
    } else if (const toml::node* s = t->get("specific")) {
      p.kind = VersionPolicy::Kind::kSpecific;
      KEEL_RETURN_IF_ERROR(int_array(*s, "version_policy.specific", p.specific, 0, int64_t{1} << 62), "");
      if (p.specific.empty()) return invalid_argument(where + "`version_policy.specific` names no version");
    } else {
      return invalid_argument(where + "`version_policy` has unknown key `" + std::string(t->begin()->first.str()) +
                              "` (latest, all or specific)");
    }
  }
  for (const auto& [k, v] : root) {
    static const char* known[] = {"max_batch_size",
                                  "max_queue_delay_us",
                                  "preferred_batch_sizes",
                                  "max_queue_size",
                                  "default_timeout_us",
                                  "dynamic_batch",
                                  "warmup_batch_sizes",
                                  "instances",
                                  "threads",
                                  "passes",
                                  "precision",
                                  "device",
                                  "version_policy"};
    bool ok = false;
    for (const char* kk : known) ok = ok || k.str() == kk;
    if (!ok) return invalid_argument(where + "unknown key `" + std::string(k.str()) + "`");
  }
  return c;
}

StatusOr<ModelConfig> parse_model_config(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("cannot read model config " + file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_model_config_text(ss.str(), file.string());
}

namespace {
TensorSpec spec_of(const Graph& g, const std::string& name) {
  TensorSpec s;
  s.name = name;
  if (const ValueInfo* vi = g.info(name)) {
    s.dtype = vi->tensor_dtype();
    if (vi->shape) s.shape = *vi->shape;
    else s.has_shape = false;
  } else {
    s.has_shape = false;
  }
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += (s.empty() ? "" : ",") + e;
  return s;
}
}  // namespace

StatusOr<std::unique_ptr<ServedModel>> ServedModel::create(Environment& env, std::string name, int64_t version,
                                                           const std::filesystem::path& file, ModelConfig config,
                                                           const std::vector<std::string>& passes,
                                                           int32_t default_threads, std::string fingerprint) {
  std::unique_ptr<ServedModel> m(new ServedModel());
  m->name_ = std::move(name);
  m->version_ = version;
  m->fingerprint_ = std::move(fingerprint);
  m->config_ = std::move(config);
  const std::string who = "model " + m->name_ + " version " + std::to_string(version);
  KEEL_ASSIGN_OR_RETURN(Graph graph, load_onnx(file), who);
  if (m->config_.dynamic_batch) {
    // A first dim of 1 becomes dynamic; every other value's shape is inferred again from there.
    for (auto& [value, info] : graph.value_info) {
      if (graph.is_graph_input(value)) {
        if (info.shape && !info.shape->empty() && (*info.shape)[0] == 1) (*info.shape)[0] = -1;
      } else if (!graph.is_initializer(value)) {
        info.shape.reset();
      }
    }
  }
  // Metadata from the model as given (before the passes): what a client sends and receives.
  for (const auto& in : graph.inputs) m->inputs_.push_back(spec_of(graph, in));
  for (const auto& out : graph.outputs) m->outputs_.push_back(spec_of(graph, out));
  for (const auto& s : m->inputs_) {
    if (s.dtype == DType::kUndefined || s.dtype == DType::kString || dtype_size(s.dtype) == 0)
      return invalid_argument(who + ": input " + s.name + " is not a tensor of a servable dtype");
    if (m->config_.max_batch_size > 0 && (!s.has_shape || s.shape.empty() || s.shape[0] >= 0))
      return invalid_argument(who + ": max_batch_size > 0 needs a dynamic first dim (the batch) on every input; " +
                              s.name + " has " + (s.has_shape ? shape_to_string(s.shape) : std::string("no shape")) +
                              (s.has_shape && !s.shape.empty() && s.shape[0] == 1 ? " (dynamic_batch = true makes "
                                                                                    "a first dim of 1 dynamic)"
                                                                                  : ""));
  }
  // Every instance is built, warmed up and run on its own worker thread, never on the caller's thread or an HTTP
  // thread: oneDNN's OpenMP gives every thread that starts parallel work a team of threads for the rest of that
  // thread's life, and once a process holds more OpenMP threads than CPUs, GNU OpenMP stops spinning between parallel
  // regions, so that every region pays a sleep and a wake-up (MobileNetV2 at 2 threads ran 5.6 ms a request in the
  // server against 2.5 ms in `keel bench` while HTTP threads ran requests and the loading thread had built). One
  // thread per instance keeps the OpenMP threads at `instances x threads`. (A single-threaded instance starts no
  // team, so submit() lets a caller run it inline.) Instance 0 runs the passes (once, so that every instance is built
  // from one graph and shares its initializers) and builds; the others share its build. Every instance warms up on
  // its own thread before the model is ready.
  const size_t n = static_cast<size_t>(m->config_.instances);
  m->sessions_.resize(n);
  m->busy_.assign(n, false);
  SessionOptions so;
  if (!m->config_.device.empty()) so.devices = {m->config_.device};
  so.threads = static_cast<int32_t>(m->config_.threads > 0 ? m->config_.threads : default_threads);
  m->single_threaded_ = so.threads == 1;  // no OpenMP team: submit() may run a request on the caller's thread
  ServedModel* p = m.get();
  // Zeros at each warm-up batch size (other dynamic dims 1) on instance i, so that the first requests pay neither
  // for building the kernels nor for the shape variant of their size. Instance 0 then runs the first size once more,
  // warm, for the model's typical run time (submit()'s inline choice): a first run's time is mostly building.
  const bool explicit_warmup = m->config_.warmup_batch_sizes.has_value();
  const std::vector<int64_t> warmup_sizes = explicit_warmup ? *m->config_.warmup_batch_sizes : std::vector<int64_t>{1};
  auto warm_up = [&](size_t i) -> Status {
    const std::string instance = who + " instance " + std::to_string(i);
    std::vector<int64_t> sizes = warmup_sizes;
    if (i == 0 && !sizes.empty()) sizes.push_back(sizes.front());
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t rows = sizes[k];
      KEEL_ASSIGN_OR_RETURN(auto feeds, p->zero_feeds(rows), instance + ": warm-up");
      const auto t0 = clock::now();
      auto out = p->sessions_[i]->run(feeds);
      if (!out.is_ok()) {
        if (explicit_warmup)
          return Status(out.status().code(),
                        instance + ": warm-up at batch " + std::to_string(rows) + ": " + out.status().message());
        spdlog::warn("{}: no warm-up (the first request builds instead): a run of zeros at batch {} failed: {}",
                     instance, rows, out.status().to_string());
        return Status::ok();
      }
      const auto took = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
      p->warmup_runs_++;
      if (k + 1 == sizes.size() && i == 0) p->note_run_time(took);
      spdlog::info("{}: warm-up at batch {}: {:.1f} ms", instance, rows, took / 1000.0);
    }
    if (i == 0 && !sizes.empty()) return p->check_batch_dim(*p->sessions_[0], who);
    return Status::ok();
  };
  // Runs on instance i's thread while create() waits for it (so the references stay valid).
  auto build = [&](size_t i) -> Status {
    if (i > 0) {
      SessionOptions shared = so;
      shared.share_weights_with = p->sessions_[0].get();
      KEEL_ASSIGN_OR_RETURN(p->sessions_[i], Session::create(env, graph, shared),
                            who + " instance " + std::to_string(i));
      return warm_up(i);
    }
    if (!passes.empty()) {
      KEEL_RETURN_IF_ERROR(graph.validate(), who);
      KEEL_RETURN_IF_ERROR(infer_shapes(graph), who + ": shape inference");
      std::string target;
      if (!p->config_.device.empty()) {
        KEEL_ASSIGN_OR_RETURN(DeviceSpec spec, env.device(p->config_.device), who);
        target = spec.type;
      } else {
        const auto types = env.registry().device_types();
        target = types.empty() ? "cpu" : types.front();
      }
      KEEL_ASSIGN_OR_RETURN(auto pipeline, parse_pipeline_list(join(passes)), who + ": passes");
      keel_graph_s view;
      view.graph = &graph;
      view.env = &env;
      PassManager pm(env.registry(), graph_api());
      KEEL_ASSIGN_OR_RETURN(auto reports, pm.run(graph, &view, pipeline, target), who + ": passes");
      for (const auto& r : reports)
        spdlog::debug("{}: pass {}: {} -> {} nodes", who, r.pass, r.nodes_before, r.nodes_after);
    }
    KEEL_ASSIGN_OR_RETURN(p->sessions_[0], Session::create(env, graph, so), who + " instance 0");
    KEEL_RETURN_IF_ERROR(warm_up(0), "");
    // Output shapes that the file does not declare: as the first instance inferred them.
    for (auto& s : p->outputs_)
      if (!s.has_shape || s.dtype == DType::kUndefined) s = spec_of(p->sessions_[0]->graph(), s.name);
    return Status::ok();
  };
  for (size_t i = 0; i < n; ++i) {
    std::promise<Status> started;
    std::future<Status> ready = started.get_future();
    m->workers_.emplace_back([p, i, &build, started = std::move(started)]() mutable {
      Status st;
      try {
        st = build(i);
      } catch (const std::exception& e) {  // an exception must not end the server from this thread
        st = internal_error(std::string("building the instance: ") + e.what());
      }
      const bool ok = st.is_ok();
      started.set_value(std::move(st));
      if (ok) p->worker(i);
    });
    // On failure ~ServedModel stops and joins the instances started so far.
    if (Status st = ready.get(); !st.is_ok()) return st;
  }
  return m;
}

ServedModel::~ServedModel() { shutdown(); }

StatusOr<std::vector<std::pair<std::string, Tensor>>> ServedModel::zero_feeds(int64_t rows) const {
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (const auto& spec : inputs_) {
    Shape shape = spec.shape;
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] < 0) shape[d] = d == 0 ? rows : 1;
    KEEL_ASSIGN_OR_RETURN(Tensor t, Tensor::host(spec.dtype, shape), "input " + spec.name);
    feeds.emplace_back(spec.name, std::move(t));
  }
  return feeds;
}

StatusOr<std::vector<std::pair<std::string, Tensor>>> ServedModel::random_feeds(int64_t rows, uint32_t seed) const {
  KEEL_ASSIGN_OR_RETURN(auto feeds, zero_feeds(rows), "random feeds");
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  for (auto& feed : feeds) {
    Tensor& t = feed.second;
    const int64_t n = t.numel();
    if (t.dtype() == DType::kF32)
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(t.raw_data())[i] = uniform(rng);
    else if (t.dtype() == DType::kF64)
      for (int64_t i = 0; i < n; ++i) static_cast<double*>(t.raw_data())[i] = uniform(rng);
    else if (t.dtype() == DType::kF16)
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(t.raw_data())[i] = f32_to_f16(uniform(rng));
    else if (t.dtype() == DType::kBF16)
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(t.raw_data())[i] = f32_to_bf16(uniform(rng));
    else if (dtype_is_integer(t.dtype()) || t.dtype() == DType::kBool)  // 0 or 1: an id, index or mask that exists
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = rng() & 1;
        std::memcpy(static_cast<char*>(t.raw_data()) + i * dtype_size(t.dtype()), &v, dtype_size(t.dtype()));
      }
  }
  return feeds;
}

namespace {

// The relative L2 error of rows [a_row * n, (a_row + 1) * n) of `a` against rows [b_row * n, ...) of `b` (n elements
// each), relative to the larger of the two norms (a row that is all zeros on one side gives 1, not infinity); -1 when
// either is not a host float tensor of enough elements or holds a non-finite value (not compared).
double row_error(const Tensor& a, int64_t a_row, const Tensor& b, int64_t b_row, int64_t n) {
  for (const Tensor* t : {&a, &b})
    if (!dtype_is_float(t->dtype()) || !t->location().is_host() || t->raw_data() == nullptr) return -1;
  if (a.numel() < (a_row + 1) * n || b.numel() < (b_row + 1) * n) return -1;
  double diff = 0, norm_a = 0, norm_b = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = element_as_double(a, a_row * n + i), y = element_as_double(b, b_row * n + i);
    if (!std::isfinite(x) || !std::isfinite(y)) return -1;
    diff += (x - y) * (x - y);
    norm_a += x * x;
    norm_b += y * y;
  }
  if (diff == 0) return 0;
  return std::sqrt(diff) / std::sqrt(std::max(norm_a, norm_b));  // > 0: diff > 0 needs a non-zero element
}

}  // namespace

std::optional<std::string> ServedModel::mixed_rows(Session& session, const std::string& who) const {
  const bool fp32 = config_.precision == "fp32";
  auto name_of = [&](size_t k) { return k < outputs_.size() ? outputs_[k].name : std::to_string(k); };
  // Two batches that share row 0 (b's row 1 drawn from another seed).
  auto a = random_feeds(2, 1), b = random_feeds(2, 2);
  if (!a.is_ok() || !b.is_ok()) return std::nullopt;
  for (size_t i = 0; i < a->size(); ++i) {
    const Tensor& from = (*a)[i].second;
    if (from.byte_size() > 0) std::memcpy((*b)[i].second.raw_data(), from.raw_data(), from.byte_size() / 2);
  }
  auto ra = session.run(*a);
  if (!ra.is_ok()) {
    spdlog::info("{}: rows not checked for mixing: a batch of 2 rows of random values does not run: {}", who,
                 ra.status().message());
    return std::nullopt;
  }
  auto again = session.run(*a), rb = session.run(*b);
  if (!again.is_ok() || again->size() != ra->size() || !rb.is_ok() || rb->size() != ra->size()) return std::nullopt;
  for (size_t k = 0; k < ra->size(); ++k)
    if (row_error((*again)[k], 0, (*ra)[k], 0, (*ra)[k].numel()) > (fp32 ? 1e-3 : 3e-2)) {
      spdlog::info("{}: rows not checked for mixing: two runs of the same batch differ (output {})", who, name_of(k));
      return std::nullopt;
    }
  // Row 0 must not change when only row 1 does: the same kernels at the same batch size, so without mixing the row
  // is the same to the bit at any precision (fuzz_serve's bounds leave room for kernels that are not).
  bool compared = false;
  std::ostringstream what;
  what << std::setprecision(3);
  for (size_t k = 0; k < ra->size(); ++k) {
    const double tol = fp32 ? 1e-3 : 3e-2, e = row_error((*ra)[k], 0, (*rb)[k], 0, (*ra)[k].numel() / 2);
    compared = compared || e >= 0;
    if (e > tol) {
      what << "output " << name_of(k) << "'s row 0 of a batch of 2 changes when only row 1 does (relative error " << e
           << " > " << tol << ")";
      return what.str();
    }
  }
  // And each row alone must give its row of the batch (an output scaled by the batch size mixes nothing but the
  // batch's size). Other kernels at batch 1 round differently: in bf16 / fp16 a row of a random chain came out 5.7%
  // off with nothing mixed, so there only a gross difference counts.
  for (int64_t row = 0; row < 2; ++row) {
    std::vector<std::pair<std::string, Tensor>> alone;
    for (const auto& [name, t] : *a) {
      Shape shape = t.shape();
      shape[0] = 1;
      auto one = Tensor::host_uninitialized(t.dtype(), shape);
      if (!one.is_ok()) return std::nullopt;
      const uint64_t bytes = one->byte_size();
      if (bytes > 0) std::memcpy(one->raw_data(), static_cast<const char*>(t.raw_data()) + row * bytes, bytes);
      alone.emplace_back(name, std::move(*one));
    }
    auto out = session.run(alone);
    if (!out.is_ok() || out->size() != ra->size()) return std::nullopt;
    for (size_t k = 0; k < ra->size(); ++k) {
      const double tol = fp32 ? 1e-3 : 0.5, e = row_error((*ra)[k], row, (*out)[k], 0, (*out)[k].numel());
      compared = compared || e >= 0;
      if (e > tol) {
        what << "output " << name_of(k) << "'s row " << row << " of a batch of 2 differs from that row run alone "
             << "(relative error " << e << " > " << tol << ")";
        return what.str();
      }
    }
  }
  if (!compared) {
    spdlog::info("{}: rows not checked for mixing (no float output without NaN or infinity to compare)", who);
    return std::nullopt;
  }
  return "";
}

std::string ServedModel::unbatched_output(const std::vector<Tensor>& outs, int64_t rows) const {
  for (size_t k = 0; k < outs.size() && k < outputs_.size(); ++k)
    if (outs[k].rank() == 0 || outs[k].shape()[0] != rows)
      return "output " + outputs_[k].name + " of a batch of " + std::to_string(rows) + " rows has shape " +
             shape_to_string(outs[k].shape()) + ": its first dim is not the batch";
  return "";
}

Status ServedModel::check_batch_dim(Session& session, const std::string& who) const {
  if (config_.max_batch_size < 2) return Status::ok();
  const std::string why = config_.dynamic_batch ? " (dynamic_batch = true made its first dim dynamic, but the graph "
                                                  "fixes the batch inside: export it with a dynamic batch, or set "
                                                  "max_batch_size = 0)"
                                                : " (export it with a batch dim free throughout, or set "
                                                  "max_batch_size = 0)";
  KEEL_ASSIGN_OR_RETURN(auto feeds, zero_feeds(2), who + ": batch check");
  auto out = session.run(feeds);
  if (!out.is_ok())
    return invalid_argument(who + ": max_batch_size " + std::to_string(config_.max_batch_size) +
                            ", but a batch of 2 rows does not run: " + out.status().message() + why);
  if (const std::string bad = unbatched_output(*out, 2); !bad.empty())
    return invalid_argument(who + ": max_batch_size " + std::to_string(config_.max_batch_size) + ", but " + bad + why);
  const std::optional<std::string> mixed = mixed_rows(session, who);
  if (mixed && !mixed->empty())
    return invalid_argument(who + ": max_batch_size " + std::to_string(config_.max_batch_size) +
                            ", but the model mixes the rows of a batch: " + *mixed +
                            ", so a batched answer would depend on the requests batched with it (a "
                            "BatchNormalization exported in training mode, a reduction or normalisation over dim 0?): "
                            "set max_batch_size = 0 to serve it unbatched");
  spdlog::info("{}: batch dim checked (a batch of 2 rows runs and gives 2 rows of every output{})", who,
               mixed ? "; its rows do not mix" : "");
  return Status::ok();
}

ServedModel::Memory ServedModel::memory() const {
  Memory out;
  std::vector<uint64_t> builds;
  for (const auto& s : sessions_) {
    const SessionMemoryInfo info = s->memory_info();
    if (std::find(builds.begin(), builds.end(), info.build_id) == builds.end()) {
      builds.push_back(info.build_id);
      out.constant_bytes += info.constant_bytes;
      out.arena_bytes += info.arena_bytes;
    }
  }
  out.builds = builds.size();
  return out;
}

void ServedModel::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

StatusOr<std::future<Result>> ServedModel::submit(std::vector<Tensor> inputs, clock::time_point deadline,
                                                  Failure* why) {
  auto r = std::make_shared<Request>();
  if (config_.max_batch_size > 0) {
    r->rows = inputs.empty() || inputs[0].rank() == 0 ? 1 : inputs[0].shape()[0];
    for (const auto& t : inputs)
      if (t.rank() == 0 || t.shape()[0] != r->rows) {
        *why = Failure::kBadRequest;
        return invalid_argument("model " + name_ + ": every input must have the same batch size (dim 0)");
      }
    if (r->rows > config_.max_batch_size) {
      *why = Failure::kBadRequest;
      return invalid_argument("model " + name_ + ": batch size " + std::to_string(r->rows) +
                              " exceeds max_batch_size " + std::to_string(config_.max_batch_size));
    }
  }
  r->inputs = std::move(inputs);
  r->enqueued = clock::now();
  r->deadline = deadline;
  auto fut = r->done.get_future();
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (stopping_) {
      *why = Failure::kUnavailable;
      return unavailable("model " + name_ + " version " + std::to_string(version_) + " is shutting down");
    }
    if (static_cast<int64_t>(queue_.size()) >= config_.max_queue_size) {
      *why = Failure::kQueueFull;
      return unavailable("model " + name_ + ": queue full (" + std::to_string(config_.max_queue_size) + " requests)");
    }
    // A single-threaded instance (no OpenMP team to multiply, see create()) that is idle, with nothing queued and no
    // batching delay to wait for, runs a small model's request on the caller's thread: no hand-off to a worker and
    // back, which costs a small model more than its run (two wake-ups, about 0.1 ms on a virtual machine). Not a
    // larger model's: the hand-off is worth < 1% of its run, and a kernel outside the oneDNN chains keeps a
    // thread-local scratchpad that each HTTP thread would fault in on its first run (ResNet-18 did, at ~630 page
    // faults and 2.5 MiB per thread, a request of 28-34 ms instead of 17, before its chain took the scratchpads
    // into the run's workspace).
    const int64_t typical = typical_run_us_.load(std::memory_order_relaxed);
    if (single_threaded_ && typical >= 0 && typical <= kInlineMaxRunUs && queue_.empty() &&
        (config_.max_batch_size == 0 || config_.max_queue_delay_us == 0)) {
      for (size_t i = 0; i < busy_.size(); ++i) {
        if (busy_[i]) continue;
        busy_[i] = true;
        lk.unlock();
        Batch batch{std::move(r)};
        execute(*sessions_[i], batch);
        lk.lock();
        busy_[i] = false;
        // Only a request queued meanwhile needs a worker now; waking them for nothing costs a small model more than
        // the wake-ups it saves (two context switches a request on two cores).
        const bool waiting = !queue_.empty();
        lk.unlock();
        if (waiting) cv_.notify_all();
        return fut;
      }
    }
    queue_.push_back(std::move(r));
    metrics_.pending++;
  }
  cv_.notify_all();
  return fut;
}

bool ServedModel::compatible(const Request& a, const Request& b) const {
  if (a.inputs.size() != b.inputs.size()) return false;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const Tensor& x = a.inputs[i];
    const Tensor& y = b.inputs[i];
    if (x.dtype() != y.dtype() || x.rank() != y.rank() || x.rank() == 0) return false;
    if (!std::equal(x.shape().begin() + 1, x.shape().end(), y.shape().begin() + 1)) return false;
  }
  return true;
}

ServedModel::Batch ServedModel::next_batch(std::unique_lock<std::mutex>& lk, size_t instance) {
  const auto delay = std::chrono::microseconds(config_.max_queue_delay_us);
  const int64_t max_rows = config_.max_batch_size;
  const int64_t preferred = config_.preferred_batch_sizes.empty() ? max_rows : config_.preferred_batch_sizes.back();
  for (;;) {
    // Requests past their deadline are answered without running.
    const auto now = clock::now();
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (now >= (*it)->deadline) {
        Result res;
        res.outputs = Status(StatusCode::kDeadlineExceeded,
                             "model " + name_ + ": the request waited past its timeout in the queue");
        res.queue_us = std::chrono::duration_cast<std::chrono::microseconds>(now - (*it)->enqueued).count();
        (*it)->done.set_value(std::move(res));
        metrics_.pending--;
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (queue_.empty()) {
      if (stopping_) return {};
      cv_.wait(lk);
      continue;
    }
    if (busy_[instance]) {  // a caller runs on this instance (submit's inline path)
      cv_.wait(lk);
      continue;
    }
    const auto front = queue_.front();
    if (max_rows == 0) {
      queue_.pop_front();
      metrics_.pending--;
      busy_[instance] = true;
      return {front};
    }
    int64_t rows = 0;
    for (const auto& r : queue_)
      if (r == front || compatible(*front, *r)) rows += r->rows;
    const auto batch_deadline = front->enqueued + delay;
    const bool late = stopping_ || now >= batch_deadline;
    if (!late && rows < preferred) {
      cv_.wait_until(lk, std::min(batch_deadline, front->deadline));
      continue;
    }
    // A batch of the largest preferred size (before the delay ran out), else as full as max_batch_size allows.
    const int64_t limit = late ? max_rows : preferred;
    Batch batch{front};
    int64_t taken = front->rows;
    queue_.pop_front();
    for (auto it = queue_.begin(); it != queue_.end() && taken < limit;) {
      if (taken + (*it)->rows <= limit && compatible(*front, **it)) {
        taken += (*it)->rows;
        batch.push_back(*it);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    metrics_.pending -= static_cast<int64_t>(batch.size());
    busy_[instance] = true;
    return batch;
  }
}

void ServedModel::worker(size_t instance) {
  Session& session = *sessions_[instance];
  for (;;) {
    Batch batch;
    bool more = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      batch = next_batch(lk, instance);
      more = !queue_.empty();
    }
    if (batch.empty()) return;  // stopping, and nothing left to finish
    // Another worker may be able to start the next batch now.
    if (more) cv_.notify_one();
    execute(session, batch);
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_[instance] = false;
    }
  }
}

void ServedModel::execute(Session& session, Batch& batch) {
  const auto start = clock::now();
  const auto n = static_cast<uint64_t>(batch.size());
  std::vector<int64_t> queue_us;
  for (const auto& r : batch) {
    queue_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(start - r->enqueued).count());
    metrics_.queue_us += static_cast<uint64_t>(queue_us.back());
  }
  int64_t total_rows = 0;
  for (const auto& r : batch) total_rows += r->rows;
  auto finish = [&](size_t i, StatusOr<std::vector<Tensor>> outputs) {
    Result res;
    res.outputs = std::move(outputs);
    res.batch_rows = total_rows;
    res.queue_us = queue_us[i];
    res.compute_us = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - start).count();
    batch[i]->done.set_value(std::move(res));
  };
  auto fail = [&](const Status& s) {
    for (size_t i = 0; i < batch.size(); ++i) finish(i, s);
  };
  auto us = [](clock::time_point a, clock::time_point b) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(b - a).count());
  };
  std::vector<std::pair<std::string, Tensor>> feeds;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (batch.size() == 1) {
      feeds.emplace_back(inputs_[i].name, batch[0]->inputs[i]);
      continue;
    }
    Shape shape = batch[0]->inputs[i].shape();
    shape[0] = total_rows;
    auto t = Tensor::host_uninitialized(batch[0]->inputs[i].dtype(), shape);
    if (!t.is_ok()) return fail(t.status().with_context("model " + name_ + ": batch input " + inputs_[i].name));
    auto* dst = static_cast<uint8_t*>(t->raw_data());
    for (const auto& r : batch) {
      const uint64_t bytes = r->inputs[i].byte_size();
      if (bytes > 0) std::memcpy(dst, r->inputs[i].raw_data(), bytes);
      dst += bytes;
    }
    feeds.emplace_back(inputs_[i].name, std::move(t).value());
  }
  const auto t_input = clock::now();
  auto out = session.run(feeds);
  const auto t_infer = clock::now();
  metrics_.compute_input_us += us(start, t_input) * n;
  metrics_.compute_infer_us += us(t_input, t_infer) * n;
  metrics_.execution_count++;
  note_run_time(us(t_input, t_infer));
  if (!out.is_ok()) {
    spdlog::warn("model {} version {}: run failed: {}", name_, version_, out.status().to_string());
    return fail(out.status().with_context("model " + name_ + " version " + std::to_string(version_)));
  }
  metrics_.inference_count += static_cast<uint64_t>(total_rows);
  // With batching on, every output's first dim is the batch, for a request alone as for a batch (check_batch_dim
  // checked it at load, at 2 rows: this catches a model whose batch dim only some sizes keep).
  const std::vector<Tensor>& outs = out.value();
  if (config_.max_batch_size > 0)
    if (const std::string bad = unbatched_output(outs, total_rows); !bad.empty())
      return fail(internal_error("model " + name_ + ": " + bad));
  if (batch.size() == 1) {
    metrics_.compute_output_us += us(t_infer, clock::now());
    return finish(0, std::move(out).value());
  }
  std::vector<std::vector<Tensor>> split(batch.size());
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (const auto& o : outs) {
      const uint64_t row_bytes = o.byte_size() / static_cast<uint64_t>(total_rows);
      Shape s = o.shape();
      s[0] = batch[i]->rows;
      const uint64_t base = static_cast<uint64_t>(static_cast<const uint8_t*>(o.raw_data()) -
                                                  static_cast<const uint8_t*>(o.storage()->data()));
      split[i].emplace_back(o.dtype(), s, o.storage(), base + static_cast<uint64_t>(row) * row_bytes);
    }
    row += batch[i]->rows;
  }
  metrics_.compute_output_us += us(t_infer, clock::now()) * n;
  for (size_t i = 0; i < batch.size(); ++i) finish(i, std::move(split[i]));
}

}  // namespace keel::serve
