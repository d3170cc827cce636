// keel/tools/serve/server.cc — the KServe v2 REST endpoints over cpp-httplib (see server.h).
#include "tools/serve/server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

namespace keel::serve {

using json = nlohmann::json;

namespace {

// KServe v2 datatype names.
const char* kserve_name(DType t) {
  switch (t) {
    case DType::kBool: return "BOOL";
    case DType::kU8: return "UINT8";
    case DType::kU16: return "UINT16";
    case DType::kU32: return "UINT32";
    case DType::kU64: return "UINT64";
    case DType::kI8: return "INT8";
    case DType::kI16: return "INT16";
    case DType::kI32: return "INT32";
    case DType::kI64: return "INT64";
    case DType::kF16: return "FP16";
    case DType::kF32: return "FP32";
    case DType::kF64: return "FP64";
    case DType::kBF16: return "BF16";
    case DType::kString: return "BYTES";
    default: return "UNDEFINED";
  }
}

std::optional<DType> from_kserve_name(const std::string& s) {
  for (DType t : {DType::kBool, DType::kU8, DType::kU16, DType::kU32, DType::kU64, DType::kI8, DType::kI16,
                  DType::kI32, DType::kI64, DType::kF16, DType::kF32, DType::kF64, DType::kBF16})
    if (s == kserve_name(t)) return t;
  return std::nullopt;
}

// An HTTP error: status code and message.
struct HttpError {
  int code;
  std::string message;
};

int http_code(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

void send_error(httplib::Response& res, int code, const std::string& message) {
  res.status = code;
  if (code == 503) res.set_header("Retry-After", "1");
  res.set_content(json{{"error", message}}.dump(), "application/json");
}

// Nesting depth of a JSON text (brackets outside strings), without parsing it.
int json_depth(std::string_view text, int limit) {
  int depth = 0, worst = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      worst = std::max(worst, ++depth);
      if (worst > limit) return worst;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return worst;
}

bool valid_model_name(const std::string& n) {
  if (n.empty() || n == "." || n == ".." || n.size() > 255) return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return n.find("..") == std::string::npos;
}

// Counts the leaves of (possibly nested) `data`; false when something is neither an array nor a scalar.
bool count_leaves(const json& data, uint64_t& n) {
  if (data.is_array()) {
    for (const auto& e : data)
      if (!count_leaves(e, n)) return false;
    return true;
  }
  if (data.is_number() || data.is_boolean()) {
    ++n;
    return true;
  }
  return false;
}

template <typename T>
bool convert_leaf(const json& v, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) { out = v.get<bool>(); return true; }
    if (v.is_number_integer()) { auto i = v.get<int64_t>(); out = i != 0; return i == 0 || i == 1; }
    return false;
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) return false;
    out = static_cast<T>(v.get<double>());
    return true;
  } else {
    if (v.is_number_unsigned()) {
      uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      out = static_cast<T>(u);
      return true;
    }
    if (v.is_number_integer()) {
      int64_t i = v.get<int64_t>();
      if constexpr (std::is_unsigned_v<T>) {
        if (i < 0 || static_cast<uint64_t>(i) > static_cast<uint64_t>(std::numeric_limits<T>::max())) return false;
      } else {
        if (i < std::numeric_limits<T>::min() || i > std::numeric_limits<T>::max()) return false;
      }
      out = static_cast<T>(i);
      return true;
    }
    return false;
  }
}

template <typename T>
bool fill_leaves(const json& data, T*& dst) {
  if (data.is_array()) {
    for (const auto& e : data)
      if (!fill_leaves(e, dst)) return false;
    return true;
  }
  return convert_leaf(data, *dst++);
}

bool fill_tensor(const json& data, Tensor& t) {
  switch (t.dtype()) {
#define KEEL_SERVE_CASE(D, T) \
  case D: { T* p = t.data<T>(); return fill_leaves<T>(data, p); }
    KEEL_SERVE_CASE(DType::kBool, bool)
    KEEL_SERVE_CASE(DType::kU8, uint8_t)
    KEEL_SERVE_CASE(DType::kU16, uint16_t)
    KEEL_SERVE_CASE(DType::kU32, uint32_t)
    KEEL_SERVE_CASE(DType::kU64, uint64_t)
    KEEL_SERVE_CASE(DType::kI8, int8_t)
    KEEL_SERVE_CASE(DType::kI16, int16_t)
    KEEL_SERVE_CASE(DType::kI32, int32_t)
    KEEL_SERVE_CASE(DType::kI64, int64_t)
    KEEL_SERVE_CASE(DType::kF32, float)
    KEEL_SERVE_CASE(DType::kF64, double)
#undef KEEL_SERVE_CASE
    default: return false;
  }
}

// A tensor's elements as a flat JSON array; false for dtypes without a JSON form (FP16, BF16: use binary_data).
bool to_json_data(const Tensor& t, json& out) {
  out = json::array();
  const int64_t n = t.numel();
  switch (t.dtype()) {
#define KEEL_SERVE_CASE(D, T) \
  case D: { const T* p = t.data<T>(); for (int64_t i = 0; i < n; ++i) out.push_back(p[i]); return true; }
    KEEL_SERVE_CASE(DType::kBool, bool)
    KEEL_SERVE_CASE(DType::kU8, uint8_t)
    KEEL_SERVE_CASE(DType::kU16, uint16_t)
    KEEL_SERVE_CASE(DType::kU32, uint32_t)
    KEEL_SERVE_CASE(DType::kU64, uint64_t)
    KEEL_SERVE_CASE(DType::kI8, int8_t)
    KEEL_SERVE_CASE(DType::kI16, int16_t)
    KEEL_SERVE_CASE(DType::kI32, int32_t)
    KEEL_SERVE_CASE(DType::kI64, int64_t)
    KEEL_SERVE_CASE(DType::kF32, float)
    KEEL_SERVE_CASE(DType::kF64, double)
#undef KEEL_SERVE_CASE
    default: return false;
  }
}

json spec_json(const TensorSpec& s) {
  json shape = json::array();
  if (s.has_shape)
    for (int64_t d : s.shape) shape.push_back(d < 0 ? -1 : d);
  return json{{"name", s.name}, {"datatype", kserve_name(s.dtype)}, {"shape", shape}};
}

bool parse_u64(const std::string& s, uint64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

StatusOr<std::map<std::string, std::unique_ptr<ServedModel>>> load_repository(Environment& env,
                                                                              const ServerOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(options.model_repository, ec))
    return not_found("model repository " + options.model_repository.string() + " is not a directory");
  std::map<std::string, std::unique_ptr<ServedModel>> models;
  for (const auto& entry : fs::directory_iterator(options.model_repository, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (!valid_model_name(name)) {
      spdlog::warn("keel serve: skipping {}: a model name is [A-Za-z0-9_.-]+", entry.path().string());
      continue;
    }
    int64_t best = -1;
    for (const auto& v : fs::directory_iterator(entry.path(), ec)) {
      uint64_t n = 0;
      if (v.is_directory() && parse_u64(v.path().filename().string(), n) && n < (1ull << 62) &&
          fs::is_regular_file(v.path() / "model.onnx"))
        best = std::max<int64_t>(best, static_cast<int64_t>(n));
    }
    if (best < 0) {
      spdlog::warn("keel serve: skipping {}: no <version>/model.onnx inside", entry.path().string());
      continue;
    }
    ModelConfig config;
    if (fs::exists(entry.path() / "config.toml")) {
      KEEL_ASSIGN_OR_RETURN(config, parse_model_config(entry.path() / "config.toml"), "model " + name);
    }
    KEEL_ASSIGN_OR_RETURN(auto model, ServedModel::create(env, name, best, entry.path() / std::to_string(best) /
                                                          "model.onnx", config, options.threads), "");
    spdlog::info("keel serve: model {} version {} ({} instance(s), max_batch_size {})", name, best,
                 config.instances, config.max_batch_size);
    models.emplace(name, std::move(model));
  }
  if (ec) return invalid_argument("model repository " + options.model_repository.string() + ": " + ec.message());
  return models;
}

StatusOr<std::unique_ptr<Server>> Server::create(Environment& env, ServerOptions options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = std::move(options);
  KEEL_ASSIGN_OR_RETURN(s->models_, load_repository(env, s->options_), "keel serve");
  s->http_ = std::make_unique<httplib::Server>();
  s->install_routes();
  return s;
}

Server::~Server() {
  if (http_ && http_->is_running()) http_->stop();
  for (auto& [n, m] : models_) m->shutdown();
}

StatusOr<int> Server::bind() {
  const int port = options_.port == 0 ? http_->bind_to_any_port(options_.host)
                                      : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port <= 0)
    return unavailable("keel serve: cannot bind " + options_.host + ":" + std::to_string(options_.port));
  return port;
}

Status Server::serve() {
  if (!stop_requested_) http_->listen_after_bind();  // returns after stop(), once the connection threads have finished
  for (auto& [n, m] : models_) m->shutdown();
  return Status::ok();
}

void Server::stop() {
  stop_requested_ = true;
  // httplib's stop() does nothing before the listening loop runs: wait (bounded) for it to start.
  for (int i = 0; i < 1000; ++i) {
    if (http_->is_running()) {
      http_->stop();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Server::install_routes() {
  httplib::Server& http = *http_;
  const int threads = std::max(1, options_.http_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http.set_payload_max_length(options_.max_body_bytes);
  http.set_read_timeout(options_.io_timeout_s, 0);
  http.set_write_timeout(options_.io_timeout_s, 0);
  http.set_keep_alive_timeout(2);
  http.set_keep_alive_max_count(1000);
  http.set_tcp_nodelay(true);
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (res.body.empty()) {
      const char* what = res.status == 413 ? "request body too large"
                         : res.status == 404 ? "no such endpoint"
                                             : "bad request";
      res.set_content(json{{"error", what}}.dump(), "application/json");
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = std::string("internal error: ") + e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });

  auto ok_json = [](httplib::Response& res, const json& j) {
    res.status = 200;
    res.set_content(j.dump(), "application/json");
  };
  http.Get("/v2/health/live", [ok_json](const httplib::Request&, httplib::Response& res) { ok_json(res, json{{"live", true}}); });
  http.Get("/v2/health/ready", [ok_json](const httplib::Request&, httplib::Response& res) { ok_json(res, json{{"ready", true}}); });
  http.Get("/v2", [ok_json](const httplib::Request&, httplib::Response& res) {
    ok_json(res, json{{"name", "keel"}, {"version", KEEL_VERSION}, {"extensions", json::array({"binary_tensor_data"})}});
  });

  // The model a path names, or an error (400 for a malformed name, 404 for an unknown model or version).
  auto find = [this](const httplib::Request& req, HttpError& err) -> ServedModel* {
    const std::string name = req.matches[1];
    if (!valid_model_name(name)) {
      err = {400, "invalid model name '" + name + "'"};
      return nullptr;
    }
    auto it = models_.find(name);
    if (it == models_.end()) {
      err = {404, "unknown model '" + name + "'"};
      return nullptr;
    }
    if (req.matches.size() > 2 && req.matches[2].matched) {
      const std::string v = req.matches[2];
      uint64_t n = 0;
      if (!parse_u64(v, n) || static_cast<int64_t>(n) != it->second->version()) {
        err = {404, "model '" + name + "' has no version '" + v + "' (serving " +
                        std::to_string(it->second->version()) + ")"};
        return nullptr;
      }
    }
    return it->second.get();
  };

  const std::string model_re = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
  http.Get(model_re, [find, ok_json](const httplib::Request& req, httplib::Response& res) {
    HttpError err;
    ServedModel* m = find(req, err);
    if (!m) return send_error(res, err.code, err.message);
    json in = json::array(), out = json::array();
    for (const auto& s : m->inputs()) in.push_back(spec_json(s));
    for (const auto& s : m->outputs()) out.push_back(spec_json(s));
    ok_json(res, json{{"name", m->name()}, {"versions", json::array({std::to_string(m->version())})},
                      {"platform", "onnx"}, {"inputs", in}, {"outputs", out},
                      {"parameters", {{"max_batch_size", m->config().max_batch_size}}}});
  });
  http.Get(model_re + "/ready", [find, ok_json](const httplib::Request& req, httplib::Response& res) {
    HttpError err;
    ServedModel* m = find(req, err);
    if (!m) return send_error(res, err.code, err.message);
    ok_json(res, json{{"name", m->name()}, {"ready", true}});
  });
  http.Post(model_re + "/infer", [this, find](const httplib::Request& req, httplib::Response& res) {
    const auto t0 = std::chrono::steady_clock::now();
    HttpError err;
    ServedModel* m = find(req, err);
    if (!m) return send_error(res, err.code, err.message);
    auto fail = [&](int code, const std::string& message) {
      m->metrics().request_failure++;
      spdlog::info("infer model={} version={} status={} error=\"{}\"", m->name(), m->version(), code, message);
      send_error(res, code, "model " + m->name() + ": " + message);
    };
    // The JSON header, and the binary tensor data after it (binary tensor-data extension).
    std::string_view body = req.body;
    std::string_view binary;
    if (req.has_header("Inference-Header-Content-Length")) {
      uint64_t n = 0;
      if (!parse_u64(req.get_header_value("Inference-Header-Content-Length"), n) || n > body.size())
        return fail(400, "Inference-Header-Content-Length is not a byte count within the body");
      binary = body.substr(n);
      body = body.substr(0, n);
    }
    if (json_depth(body, options_.max_json_depth) > options_.max_json_depth)
      return fail(400, "JSON nested deeper than " + std::to_string(options_.max_json_depth));
    json j;
    try {
      j = json::parse(body);
    } catch (const json::exception& e) {
      return fail(400, std::string("malformed JSON: ") + e.what());
    }
    if (!j.is_object() || !j.contains("inputs") || !j["inputs"].is_array())
      return fail(400, "the request must be an object with an `inputs` array");
    const auto& specs = m->inputs();
    std::vector<Tensor> inputs(specs.size());
    uint64_t binary_used = 0;
    for (const auto& in : j["inputs"]) {
      if (!in.is_object() || !in.contains("name") || !in["name"].is_string() || !in.contains("datatype") ||
          !in["datatype"].is_string() || !in.contains("shape") || !in["shape"].is_array())
        return fail(400, "every input needs `name`, `datatype` and `shape`");
      const std::string name = in["name"];
      size_t k = 0;
      while (k < specs.size() && specs[k].name != name) ++k;
      if (k == specs.size()) return fail(400, "unknown input '" + name + "'");
      if (inputs[k].defined()) return fail(400, "input '" + name + "' given twice");
      const std::string dt = in["datatype"];
      auto dtype = from_kserve_name(dt);
      if (!dtype || *dtype != specs[k].dtype)
        return fail(400, "input '" + name + "' has datatype " + dt + " but the model takes " +
                             kserve_name(specs[k].dtype));
      Shape shape;
      for (const auto& d : in["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) return fail(400, "input '" + name + "': shape dims must be non-negative integers");
        shape.push_back(d.get<int64_t>());
      }
      if (specs[k].has_shape) {
        bool match = shape.size() == specs[k].shape.size();
        for (size_t i = 0; match && i < shape.size(); ++i) match = specs[k].shape[i] < 0 || specs[k].shape[i] == shape[i];
        if (!match)
          return fail(400, "input '" + name + "' has shape " + shape_to_string(shape) + " but the model takes " +
                               shape_to_string(specs[k].shape));
      }
      auto bytes = checked_byte_size(*dtype, shape, options_.max_tensor_bytes);
      if (!bytes.is_ok()) return fail(400, "input '" + name + "': " + bytes.status().message());
      const uint64_t numel = static_cast<uint64_t>(shape_numel(shape));
      const json* params = in.contains("parameters") && in["parameters"].is_object() ? &in["parameters"] : nullptr;
      if (params && params->contains("binary_data_size")) {
        const json& bs = (*params)["binary_data_size"];
        if (!bs.is_number_unsigned() || bs.get<uint64_t>() != bytes.value())
          return fail(400, "input '" + name + "': binary_data_size must be " + std::to_string(bytes.value()) +
                               " bytes for shape " + shape_to_string(shape));
        if (binary.size() - binary_used < bytes.value())
          return fail(400, "input '" + name + "': the body holds fewer binary bytes than binary_data_size");
        auto t = Tensor::host(*dtype, shape);
        if (!t.is_ok()) return fail(500, t.status().message());
        if (bytes.value() > 0) std::memcpy(t->raw_data(), binary.data() + binary_used, bytes.value());
        binary_used += bytes.value();
        inputs[k] = std::move(t).value();
        continue;
      }
      if (!in.contains("data")) return fail(400, "input '" + name + "' has neither `data` nor binary_data_size");
      uint64_t leaves = 0;
      if (!count_leaves(in["data"], leaves)) return fail(400, "input '" + name + "': `data` must hold numbers or booleans");
      if (leaves != numel)
        return fail(400, "input '" + name + "': shape " + shape_to_string(shape) + " has " + std::to_string(numel) +
                             " elements but `data` has " + std::to_string(leaves));
      auto t = Tensor::host(*dtype, shape);
      if (!t.is_ok()) return fail(500, t.status().message());
      if (!fill_tensor(in["data"], t.value()))
        return fail(400, "input '" + name + "': `data` has a value that is not a " + dt);
      inputs[k] = std::move(t).value();
    }
    if (binary_used != binary.size()) return fail(400, "the body has binary data no input claims");
    for (size_t k = 0; k < specs.size(); ++k)
      if (!inputs[k].defined()) return fail(400, "missing input '" + specs[k].name + "'");
    // Which outputs, and in which form.
    bool binary_default = false;
    if (j.contains("parameters") && j["parameters"].is_object() && j["parameters"].contains("binary_data_output"))
      binary_default = j["parameters"]["binary_data_output"].is_boolean() && j["parameters"]["binary_data_output"].get<bool>();
    std::vector<std::pair<size_t, bool>> wanted;
    if (j.contains("outputs")) {
      if (!j["outputs"].is_array()) return fail(400, "`outputs` must be an array");
      for (const auto& o : j["outputs"]) {
        if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) return fail(400, "every output needs a `name`");
        const std::string name = o["name"];
        size_t k = 0;
        while (k < m->outputs().size() && m->outputs()[k].name != name) ++k;
        if (k == m->outputs().size()) return fail(400, "unknown output '" + name + "'");
        bool bin = binary_default;
        if (o.contains("parameters") && o["parameters"].is_object() && o["parameters"].contains("binary_data"))
          bin = o["parameters"]["binary_data"].is_boolean() && o["parameters"]["binary_data"].get<bool>();
        wanted.emplace_back(k, bin);
      }
    } else {
      for (size_t k = 0; k < m->outputs().size(); ++k) wanted.emplace_back(k, binary_default);
    }
    int64_t rows = m->config().max_batch_size > 0 && inputs[0].rank() > 0 ? inputs[0].shape()[0] : 1;
    auto fut = m->submit(std::move(inputs));
    if (!fut.is_ok()) {
      if (fut.status().code() != StatusCode::kUnavailable) return fail(http_code(fut.status()), fut.status().message());
      spdlog::info("infer model={} version={} status=503 error=\"{}\"", m->name(), m->version(), fut.status().message());
      return send_error(res, 503, fut.status().message());
    }
    if (fut->wait_for(std::chrono::milliseconds(options_.request_timeout_ms)) != std::future_status::ready)
      return fail(504, "no result within " + std::to_string(options_.request_timeout_ms) + " ms");
    auto outs = fut->get();
    if (!outs.is_ok()) {
      res.status = http_code(outs.status()) == 400 ? 400 : 500;
      return send_error(res, res.status, outs.status().to_string());
    }
    json outputs = json::array();
    std::string tail;
    for (const auto& [k, bin] : wanted) {
      const Tensor& t = outs.value()[k];
      json o{{"name", m->outputs()[k].name}, {"datatype", kserve_name(t.dtype())}, {"shape", t.shape()}};
      if (bin) {
        o["parameters"] = {{"binary_data_size", t.byte_size()}};
        tail.append(static_cast<const char*>(t.raw_data()), t.byte_size());
      } else {
        json data;
        if (!to_json_data(t, data))
          return fail(400, "output '" + m->outputs()[k].name + "' is " + kserve_name(t.dtype()) +
                               ": ask for it with binary_data");
        o["data"] = std::move(data);
      }
      outputs.push_back(std::move(o));
    }
    json resp{{"model_name", m->name()}, {"model_version", std::to_string(m->version())}, {"outputs", outputs}};
    if (j.contains("id")) resp["id"] = j["id"];
    std::string head = resp.dump();
    res.status = 200;
    if (tail.empty()) {
      res.set_content(head, "application/json");
    } else {
      res.set_header("Inference-Header-Content-Length", std::to_string(head.size()));
      head += tail;
      res.set_content(head, "application/octet-stream");
    }
    spdlog::info("infer model={} version={} status=200 rows={} us={}", m->name(), m->version(), rows,
                 std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count());
  });

  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::ostringstream os;
    struct Family { const char* name; const char* type; const char* help; };
    auto family = [&](const Family& f, auto get) {
      os << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " " << f.type << "\n";
      for (auto& [n, m] : models_)
        os << f.name << "{model=\"" << n << "\",version=\"" << m->version() << "\"} " << get(m->metrics()) << "\n";
    };
    family({"keel_inference_request_success", "counter", "Successful inference requests"},
           [](ModelMetrics& x) { return x.request_success.load(); });
    family({"keel_inference_request_failure", "counter", "Failed inference requests (bad request or failed run)"},
           [](ModelMetrics& x) { return x.request_failure.load(); });
    family({"keel_inference_request_rejected", "counter", "Requests refused because the queue was full"},
           [](ModelMetrics& x) { return x.request_rejected.load(); });
    family({"keel_inference_count", "counter", "Inferences performed (batch items)"},
           [](ModelMetrics& x) { return x.inference_count.load(); });
    family({"keel_inference_exec_count", "counter", "Model executions (batches run)"},
           [](ModelMetrics& x) { return x.execution_count.load(); });
    family({"keel_inference_queue_duration_us", "counter", "Cumulative time requests waited in the queue"},
           [](ModelMetrics& x) { return x.queue_us.load(); });
    family({"keel_inference_compute_duration_us", "counter", "Cumulative time of model executions"},
           [](ModelMetrics& x) { return x.compute_us.load(); });
    family({"keel_inference_pending_request_count", "gauge", "Requests queued, not yet running"},
           [](ModelMetrics& x) { return x.pending.load(); });
    res.status = 200;
    res.set_content(os.str(), "text/plain; version=0.0.4");
  });
}

}  // namespace keel::serve
