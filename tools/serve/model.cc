// keel/tools/serve/model.cc — config parsing, instances and the dynamic batcher (see model.h).
#include "tools/serve/model.h"

#include <spdlog/spdlog.h>
#include <toml++/toml.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "core/runtime/onnx_io.h"

namespace keel::serve {

StatusOr<ModelConfig> parse_model_config(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return not_found("cannot read model config " + file.string());
  std::stringstream ss;
  ss << in.rdbuf();
  toml::table root;
  try {
    root = toml::parse(ss.str(), file.string());
  } catch (const toml::parse_error& e) {
    return invalid_argument("model config " + file.string() + ": " + std::string(e.description()));
  }
  ModelConfig c;
  auto int_key = [&](const char* key, int64_t& out, int64_t lo, int64_t hi) -> Status {
    const toml::node* n = root.get(key);
    if (n == nullptr) return Status::ok();
    auto v = n->value<int64_t>();
    if (!v || *v < lo || *v > hi || !n->is_integer())
      return invalid_argument("model config " + file.string() + ": `" + key + "` must be an integer in [" +
                              std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out = *v;
    return Status::ok();
  };
  KEEL_RETURN_IF_ERROR(int_key("max_batch_size", c.max_batch_size, 0, 1 << 20), "");
  KEEL_RETURN_IF_ERROR(int_key("max_queue_delay_us", c.max_queue_delay_us, 0, 60'000'000), "");
  KEEL_RETURN_IF_ERROR(int_key("max_queue_size", c.max_queue_size, 1, 1 << 20), "");
  KEEL_RETURN_IF_ERROR(int_key("instances", c.instances, 1, 256), "");
  KEEL_RETURN_IF_ERROR(int_key("threads", c.threads, 0, 1024), "");
  if (const toml::node* n = root.get("passes")) {
    const toml::array* a = n->as_array();
    if (a == nullptr) return invalid_argument("model config " + file.string() + ": `passes` must be an array of strings");
    for (const auto& e : *a) {
      auto s = e.value<std::string>();
      if (!s) return invalid_argument("model config " + file.string() + ": `passes` must be an array of strings");
      c.passes.push_back(*s);
    }
  }
  if (const toml::node* n = root.get("device")) {
    auto s = n->value<std::string>();
    if (!s) return invalid_argument("model config " + file.string() + ": `device` must be a string");
    c.device = *s;
  }
  for (const auto& [k, v] : root) {
    static const char* known[] = {"max_batch_size", "max_queue_delay_us", "max_queue_size", "instances",
                                  "threads",        "passes",             "device"};
    bool ok = false;
    for (const char* kk : known) ok = ok || k.str() == kk;
    if (!ok) return invalid_argument("model config " + file.string() + ": unknown key `" + std::string(k.str()) + "`");
  }
  return c;
}

namespace {
TensorSpec spec_of(const Graph& g, const std::string& name) {
  TensorSpec s;
  s.name = name;
  if (const ValueInfo* vi = g.info(name)) {
    s.dtype = vi->tensor_dtype();
    if (vi->shape) s.shape = *vi->shape; else s.has_shape = false;
  } else {
    s.has_shape = false;
  }
  return s;
}
}  // namespace

StatusOr<std::unique_ptr<ServedModel>> ServedModel::create(Environment& env, std::string name, int64_t version,
                                                           const std::filesystem::path& file, ModelConfig config,
                                                           int32_t default_threads) {
  std::unique_ptr<ServedModel> m(new ServedModel());
  m->name_ = std::move(name);
  m->version_ = version;
  m->config_ = std::move(config);
  const std::string who = "model " + m->name_ + " version " + std::to_string(version);
  KEEL_ASSIGN_OR_RETURN(Graph graph, load_onnx(file), who);
  // Metadata from the model as given (before the passes): what a client sends and receives.
  for (const auto& in : graph.inputs) m->inputs_.push_back(spec_of(graph, in));
  for (const auto& out : graph.outputs) m->outputs_.push_back(spec_of(graph, out));
  for (const auto& s : m->inputs_) {
    if (s.dtype == DType::kUndefined || s.dtype == DType::kString || dtype_size(s.dtype) == 0)
      return invalid_argument(who + ": input " + s.name + " is not a tensor of a servable dtype");
    if (m->config_.max_batch_size > 0 && (!s.has_shape || s.shape.empty() || s.shape[0] >= 0))
      return invalid_argument(who + ": max_batch_size > 0 needs a dynamic first dim (the batch) on every input; " +
                              s.name + " has " + (s.has_shape ? shape_to_string(s.shape) : std::string("no shape")));
  }
  SessionOptions so;
  if (!m->config_.device.empty()) so.devices = {m->config_.device};
  so.passes = m->config_.passes;
  so.threads = static_cast<int32_t>(m->config_.threads > 0 ? m->config_.threads : default_threads);
  for (int64_t i = 0; i < m->config_.instances; ++i) {
    KEEL_ASSIGN_OR_RETURN(auto session, Session::create(env, graph, so), who + " instance " + std::to_string(i));
    m->sessions_.push_back(std::move(session));
  }
  // Output shapes that the file does not declare: as the first instance inferred them.
  for (auto& s : m->outputs_)
    if (!s.has_shape || s.dtype == DType::kUndefined) s = spec_of(m->sessions_[0]->graph(), s.name);
  for (size_t i = 0; i < m->sessions_.size(); ++i) m->workers_.emplace_back([p = m.get(), i] { p->worker(i); });
  return m;
}

ServedModel::~ServedModel() { shutdown(); }

void ServedModel::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

StatusOr<std::future<ServedModel::Outputs>> ServedModel::submit(std::vector<Tensor> inputs) {
  auto r = std::make_shared<Request>();
  if (config_.max_batch_size > 0) {
    r->rows = inputs.empty() || inputs[0].rank() == 0 ? 1 : inputs[0].shape()[0];
    for (const auto& t : inputs)
      if (t.rank() == 0 || t.shape()[0] != r->rows)
        return invalid_argument("model " + name_ + ": every input must have the same batch size (dim 0)");
    if (r->rows > config_.max_batch_size)
      return invalid_argument("model " + name_ + ": batch size " + std::to_string(r->rows) + " exceeds max_batch_size " +
                              std::to_string(config_.max_batch_size));
  }
  r->inputs = std::move(inputs);
  r->enqueued = std::chrono::steady_clock::now();
  auto fut = r->done.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return unavailable("model " + name_ + " is shutting down");
    if (static_cast<int64_t>(queue_.size()) >= config_.max_queue_size) {
      metrics_.request_rejected++;
      return unavailable("model " + name_ + ": queue full (" + std::to_string(config_.max_queue_size) + " requests)");
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

void ServedModel::worker(size_t instance) {
  Session& session = *sessions_[instance];
  const auto delay = std::chrono::microseconds(config_.max_queue_delay_us);
  for (;;) {
    std::vector<std::shared_ptr<Request>> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to finish
      if (config_.max_batch_size > 0) {
        // Wait for a full batch of requests compatible with the oldest, or for the oldest's deadline.
        for (;;) {
          if (queue_.empty()) break;
          const Request& front = *queue_.front();
          int64_t rows = 0;
          for (const auto& r : queue_)
            if (r == queue_.front() || compatible(front, *r)) rows += r->rows;
          const auto deadline = front.enqueued + delay;
          if (rows >= config_.max_batch_size || stopping_ || std::chrono::steady_clock::now() >= deadline) break;
          cv_.wait_until(lk, deadline);
        }
        if (queue_.empty()) continue;  // another instance took them
      }
      auto front = queue_.front();
      queue_.pop_front();
      int64_t rows = front->rows;
      batch.push_back(front);
      if (config_.max_batch_size > 0) {
        for (auto it = queue_.begin(); it != queue_.end() && rows < config_.max_batch_size;) {
          if (rows + (*it)->rows <= config_.max_batch_size && compatible(*front, **it)) {
            rows += (*it)->rows;
            batch.push_back(*it);
            it = queue_.erase(it);
          } else {
            ++it;
          }
        }
      }
      metrics_.pending -= static_cast<int64_t>(batch.size());
    }
    execute(session, batch);
  }
}

void ServedModel::execute(Session& session, std::vector<std::shared_ptr<Request>>& batch) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (const auto& r : batch)
    metrics_.queue_us += std::chrono::duration_cast<std::chrono::microseconds>(start - r->enqueued).count();
  auto fail = [&](const Status& s) {
    for (auto& r : batch) r->done.set_value(s);
    metrics_.request_failure += batch.size();
  };
  const auto& names = session.input_names();
  std::vector<std::pair<std::string, Tensor>> feeds;
  int64_t total_rows = 0;
  for (const auto& r : batch) total_rows += r->rows;
  // The session's input names are the model's (passes keep graph inputs); bind by our spec order.
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (batch.size() == 1) {
      feeds.emplace_back(inputs_[i].name, batch[0]->inputs[i]);
      continue;
    }
    Shape shape = batch[0]->inputs[i].shape();
    shape[0] = total_rows;
    auto t = Tensor::host(batch[0]->inputs[i].dtype(), shape);
    if (!t.is_ok()) return fail(t.status().with_context("model " + name_ + ": batch input " + inputs_[i].name));
    auto* dst = static_cast<uint8_t*>(t->raw_data());
    for (const auto& r : batch) {
      const uint64_t n = r->inputs[i].byte_size();
      if (n > 0) std::memcpy(dst, r->inputs[i].raw_data(), n);
      dst += n;
    }
    feeds.emplace_back(inputs_[i].name, std::move(t).value());
  }
  (void)names;
  auto out = session.run(feeds);
  const auto end = clock::now();
  metrics_.compute_us += std::chrono::duration_cast<std::chrono::microseconds>(end - start).count();
  metrics_.execution_count++;
  if (!out.is_ok()) {
    spdlog::warn("model {}: run failed: {}", name_, out.status().to_string());
    return fail(out.status().with_context("model " + name_ + " version " + std::to_string(version_)));
  }
  metrics_.inference_count += static_cast<uint64_t>(total_rows);
  if (batch.size() == 1) {
    metrics_.request_success++;
    batch[0]->done.set_value(std::move(out).value());
    return;
  }
  const std::vector<Tensor>& outs = out.value();
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].rank() == 0 || outs[k].shape()[0] != total_rows)
      return fail(internal_error("model " + name_ + ": output " + outputs_[k].name + " of a batch of " +
                                 std::to_string(total_rows) + " has shape " + shape_to_string(outs[k].shape()) +
                                 ": its first dim is not the batch"));
  int64_t row = 0;
  for (auto& r : batch) {
    std::vector<Tensor> mine;
    for (const auto& o : outs) {
      const uint64_t row_bytes = o.byte_size() / static_cast<uint64_t>(total_rows);
      Shape s = o.shape();
      s[0] = r->rows;
      const uint64_t base = static_cast<uint64_t>(static_cast<const uint8_t*>(o.raw_data()) -
                                                  static_cast<const uint8_t*>(o.storage()->data()));
      mine.emplace_back(o.dtype(), s, o.storage(), base + static_cast<uint64_t>(row) * row_bytes);
    }
    row += r->rows;
    metrics_.request_success++;
    r->done.set_value(std::move(mine));
  }
}

}  // namespace keel::serve
