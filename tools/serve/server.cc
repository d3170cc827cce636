// keel/tools/serve/server.cc — the KServe v2 REST endpoints (see server.h) over tools/serve/http.h.
#include "tools/serve/server.h"

#include <spdlog/spdlog.h>

#include <array>
#include <charconv>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/runtime/onnx_io.h"
#include "tools/serve/tensor_json.h"

namespace keel::serve {

using json = nlohmann::json;
using clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

int http_code(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kUnavailable: return 503;
    case StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

// JSON text of a value that may hold bytes from a request or a model file (a path, a name): invalid UTF-8 is
// replaced (U+FFFD) instead of throwing.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(http::Response& res, int code, const std::string& message) {
  res.status = code;
  if (code == 429 || code == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(json{{"error", message}}), "application/json");
}

// Nesting depth of a JSON text (brackets outside strings), without parsing it.
int json_depth(std::string_view text, int limit) {
  // Only quotes, backslashes and brackets matter; the bulk of a request (numbers, commas, spaces) is skipped by one
  // table lookup per byte (a request of 3,072 numbers: a tenth of the server's time per request before).
  static constexpr auto kSpecial = [] {
    std::array<bool, 256> t{};
    for (char c : std::string_view("\"\\[]{}")) t[static_cast<uint8_t>(c)] = true;
    return t;
  }();
  int depth = 0, worst = 0;
  bool in_string = false;
  const char* p = text.data();
  const char* const end = p + text.size();
  while (p < end) {
    while (p < end && !kSpecial[static_cast<uint8_t>(*p)]) ++p;
    if (p == end) break;
    const char c = *p++;
    if (in_string) {
      if (c == '\\') p += p < end ? 1 : 0;  // the escaped character, whatever it is
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

// Equal strings, in a time that depends on their lengths only (not on where they first differ).
bool constant_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = static_cast<unsigned char>(diff | (x ^ y));
  }
  return diff == 0;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The numbered version folders of a model that hold model.onnx, ascending.
std::vector<int64_t> versions_present(const fs::path& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& v : fs::directory_iterator(dir, ec)) {
    uint64_t n = 0;
    if (v.is_directory() && parse_u64(v.path().filename().string(), n) && n < (1ull << 62) &&
        fs::is_regular_file(v.path() / "model.onnx", ec))
      out.push_back(static_cast<int64_t>(n));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What a version was loaded from: the config text and the file's size and time; equal = nothing to reload.
std::string fingerprint(const std::string& config_text, const fs::path& file) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  const auto time = fs::last_write_time(file, ec).time_since_epoch().count();
  return config_text + "\n#" + std::to_string(size) + ":" + std::to_string(time);
}

// Adds the request's input bytes to the in-flight total and takes them off again when the request is answered.
class InflightReservation {
 public:
  explicit InflightReservation(std::atomic<uint64_t>& total) : total_(total) {}
  ~InflightReservation() { total_ -= bytes_; }
  bool reserve(uint64_t bytes, uint64_t cap) {
    const uint64_t now = total_ += bytes;
    bytes_ += bytes;
    return now <= cap;
  }

 private:
  std::atomic<uint64_t>& total_;
  uint64_t bytes_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::create(Environment& env, ServerOptions options) {
  std::unique_ptr<Server> s(new Server());
  s->env_ = &env;
  s->options_ = std::move(options);
  std::error_code ec;
  const fs::path& repo = s->options_.model_repository;
  if (!fs::is_directory(repo, ec))
    return not_found("keel serve: model repository " + repo.string() + " is not a directory");
  for (const auto& entry : fs::directory_iterator(repo, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (!valid_model_name(name)) {
      spdlog::warn("keel serve: skipping {}: a model name is [A-Za-z0-9_.-]+ without '..'", entry.path().string());
      continue;
    }
    if (versions_present(entry.path()).empty()) {
      spdlog::warn("keel serve: skipping {}: no <version>/model.onnx inside", entry.path().string());
      continue;
    }
    const Status st = s->load_model(name);
    if (!st.is_ok()) {
      if (s->options_.exit_on_error) return st.with_context("keel serve");
      spdlog::error("keel serve: model {} left out (--exit-on-error false): {}", name, st.to_string());
    }
  }
  if (ec) return invalid_argument("keel serve: model repository " + repo.string() + ": " + ec.message());
  http::Options o;
  o.threads = std::max(1, s->options_.http_threads);
  o.max_body_bytes = s->options_.max_body_bytes;
  o.max_header_bytes = s->options_.max_header_bytes;
  o.io_timeout_s = s->options_.io_timeout_s;
  o.idle_timeout_s = s->options_.idle_timeout_s;
  o.aligned_body_offset_header = "Inference-Header-Content-Length";  // binary inputs used in place (handle_infer)
  s->http_ = std::make_unique<http::Server>(o);
  s->install_routes();
  return s;
}

Server::~Server() {
  if (http_) http_->stop();
  std::map<std::string, Versions> models;
  {
    std::unique_lock lk(models_mu_);
    models.swap(models_);
  }
  for (auto& [n, vs] : models)
    for (auto& [v, m] : vs) m->shutdown();
}

Status Server::load_model(const std::string& name) {
  std::lock_guard<std::mutex> control(control_mu_);
  if (!valid_model_name(name)) return invalid_argument("invalid model name '" + name + "'");
  const Status st = load_versions(name);
  std::unique_lock lk(models_mu_);
  if (st.is_ok()) load_errors_.erase(name);
  else load_errors_[name] = st.message();
  return st;
}

Status Server::load_versions(const std::string& name) {
  const fs::path dir = options_.model_repository / name;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("model '" + name + "' is not in the repository");
  const std::vector<int64_t> present = versions_present(dir);
  if (present.empty()) return not_found("model '" + name + "' has no <version>/model.onnx");
  std::string config_text;
  ModelConfig config;
  if (fs::exists(dir / "config.toml", ec)) {
    config_text = read_text(dir / "config.toml");
    KEEL_ASSIGN_OR_RETURN(config, parse_model_config_text(config_text, (dir / "config.toml").string()),
                          "model " + name);
  }
  const std::vector<int64_t> wanted = config.version_policy.select(present);
  if (wanted.empty()) return not_found("model '" + name + "': its version_policy selects none of the versions present");
  Versions current;
  {
    std::shared_lock lk(models_mu_);
    if (auto it = models_.find(name); it != models_.end()) current = it->second;
  }
  Versions next;
  for (int64_t v : wanted) {
    const fs::path file = dir / std::to_string(v) / "model.onnx";
    const std::string fp = fingerprint(config_text, file);
    if (auto it = current.find(v); it != current.end() && it->second->fingerprint() == fp) {
      next.emplace(v, it->second);  // unchanged: keeps serving as it is
      continue;
    }
    std::vector<std::string> passes;
    if (options_.pass_resolver) {
      KEEL_ASSIGN_OR_RETURN(Graph graph, load_onnx(file), "model " + name + " version " + std::to_string(v));
      KEEL_ASSIGN_OR_RETURN(passes, options_.pass_resolver(config, graph, *env_), "model " + name);
    } else {
      passes = config.passes.value_or(std::vector<std::string>{});
      if (config.precision != "fp32") passes.push_back("convert_" + config.precision);
    }
    KEEL_ASSIGN_OR_RETURN(auto model, ServedModel::create(*env_, name, v, file, config, passes, options_.threads, fp),
                          "");
    spdlog::info("keel serve: model {} version {} loaded ({} instance(s), max_batch_size {}, passes {})", name, v,
                 config.instances, config.max_batch_size, passes.size());
    next.emplace(v, std::shared_ptr<ServedModel>(std::move(model)));
  }
  {
    std::unique_lock lk(models_mu_);
    models_[name] = next;
  }
  for (const auto& [v, m] : current)
    if (!next.count(v)) spdlog::info("keel serve: model {} version {} unloaded (finishing what it accepted)", name, v);
  // `current` goes out of scope here: a version no longer served is freed when its last request is answered.
  return Status::ok();
}

Status Server::unload_model(const std::string& name) {
  std::lock_guard<std::mutex> control(control_mu_);
  Versions gone;
  {
    std::unique_lock lk(models_mu_);
    load_errors_.erase(name);
    auto it = models_.find(name);
    if (it == models_.end()) return not_found("model '" + name + "' is not loaded");
    gone.swap(it->second);
    models_.erase(it);
  }
  spdlog::info("keel serve: model {} unloaded ({} version(s) finish what they accepted)", name, gone.size());
  return Status::ok();
}

std::shared_ptr<ServedModel> Server::find(const std::string& name, const std::string* version, int& code,
                                          std::string& message) const {
  if (!valid_model_name(name)) {
    code = 400;
    message = "invalid model name '" + name + "'";
    return nullptr;
  }
  std::shared_lock lk(models_mu_);
  auto it = models_.find(name);
  if (it == models_.end() || it->second.empty()) {
    code = 404;
    const auto failed = load_errors_.find(name);
    message = failed == load_errors_.end()
                  ? "unknown model '" + name + "'"
                  : "model '" + name + "' is not available: it failed to load: " + failed->second;
    return nullptr;
  }
  if (version == nullptr) return it->second.rbegin()->second;
  uint64_t n = 0;
  if (parse_u64(*version, n) && n < (1ull << 62))
    if (auto v = it->second.find(static_cast<int64_t>(n)); v != it->second.end()) return v->second;
  std::string loaded;
  for (const auto& [v, m] : it->second) loaded += (loaded.empty() ? "" : ", ") + std::to_string(v);
  code = 404;
  message = "model '" + name + "' has no version '" + *version + "' (serving " + loaded + ")";
  return nullptr;
}

StatusOr<int> Server::bind() { return http_->bind(options_.host, options_.port); }

Status Server::serve() {
  KEEL_RETURN_IF_ERROR(http_->serve(), "");  // returns after stop(), once the requests in flight are answered
  std::shared_lock lk(models_mu_);
  for (auto& [n, vs] : models_)
    for (auto& [v, m] : vs) m->shutdown();
  return Status::ok();
}

void Server::stop() {
  stop_requested_ = true;
  http_->stop();
}

void Server::install_routes() {
  http::Server& server = *http_;
  server.set_error_formatter(
      [](http::Response& res, const std::string& message) { send_error(res, res.status, message); });
  server.set_logger([this](const http::Request&, const http::Response& res) {
    if (res.status >= 0 && res.status < static_cast<int>(responses_.size()))
      responses_[static_cast<size_t>(res.status)]++;
  });
  // The headers' total size and the bearer token, checked before routing (and before the body is read).
  server.set_pre_routing([this](const http::Request& req, http::Response& res) {
    if (req.header_bytes > options_.max_header_bytes) {
      send_error(res, 431,
                 "request headers too large (" + std::to_string(req.header_bytes) + " bytes; at most " +
                     std::to_string(options_.max_header_bytes) + ")");
      return true;
    }
    if (options_.auth_token.empty() || req.path == "/v2/health/live" || req.path == "/v2/health/ready") return false;
    const std::string* auth = req.header("Authorization");
    if (auth && auth->rfind("Bearer ", 0) == 0 &&
        constant_time_equal(std::string_view(*auth).substr(7), options_.auth_token))
      return false;
    send_error(res, 401, !auth ? "this server needs `Authorization: Bearer <token>`" : "wrong bearer token");
    res.set_header("WWW-Authenticate", "Bearer");
    return true;
  });

  auto ok_json = [](http::Response& res, const json& j) {
    res.status = 200;
    res.set_content(dump(j), "application/json");
  };
  server.route("GET", "/v2/health/live", [ok_json](const http::Request&, http::Response& res) {
    ok_json(res, json{{"live", true}});
  });
  server.route("GET", "/v2/health/ready", [this, ok_json](const http::Request&, http::Response& res) {
    if (stop_requested_) return send_error(res, 503, "shutting down");
    ok_json(res, json{{"ready", true}});
  });
  server.route("GET", "/v2", [this, ok_json](const http::Request&, http::Response& res) {
    json ext = json::array({"binary_tensor_data"});
    if (options_.model_control) ext.push_back("model_repository");
    ok_json(res, json{{"name", "keel"}, {"version", KEEL_VERSION}, {"extensions", ext}});
  });

  auto lookup = [this](const http::Request& req, http::Response& res) -> std::shared_ptr<ServedModel> {
    int code = 0;
    std::string message;
    const std::string& version = req.captures[2];
    auto m = find(req.captures[1], version.empty() ? nullptr : &version, code, message);
    if (!m) send_error(res, code, message);
    return m;
  };
  const std::string model_re = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
  server.route("GET", model_re, [this, lookup, ok_json](const http::Request& req, http::Response& res) {
    auto m = lookup(req, res);
    if (!m) return;
    json versions = json::array();
    {
      std::shared_lock lk(models_mu_);
      if (auto it = models_.find(m->name()); it != models_.end())
        for (const auto& [v, x] : it->second) versions.push_back(std::to_string(v));
    }
    json in = json::array(), out = json::array();
    for (const auto& s : m->inputs()) in.push_back(spec_json(s));
    for (const auto& s : m->outputs()) out.push_back(spec_json(s));
    json meta{{"name", m->name()},  {"versions", versions},
              {"platform", "onnx"}, {"inputs", in},
              {"outputs", out},     {"parameters", {{"max_batch_size", m->config().max_batch_size}}}};
    if (!req.captures[2].empty()) meta["version"] = std::to_string(m->version());
    ok_json(res, meta);
  });
  server.route("GET", model_re + "/ready", [lookup, ok_json](const http::Request& req, http::Response& res) {
    auto m = lookup(req, res);
    if (!m) return;
    ok_json(res, json{{"name", m->name()}, {"version", std::to_string(m->version())}, {"ready", true}});
  });
  server.route("POST", model_re + "/infer",
               [this](const http::Request& req, http::Response& res) { handle_infer(req, res); });

  // Model control (the repository extension).
  auto control_off = [this](http::Response& res) {
    if (options_.model_control) return false;
    send_error(res, 403, "model control is off (start keel serve with --model-control)");
    return true;
  };
  server.route("POST", "/v2/repository/index",
               [this, control_off, ok_json](const http::Request& req, http::Response& res) {
                 if (control_off(res)) return;
                 bool ready_only = false;
                 if (!req.body.empty()) {
                   if (json_depth(req.body, options_.max_json_depth) > options_.max_json_depth)
                     return send_error(res, 400, "JSON nested deeper than " + std::to_string(options_.max_json_depth));
                   auto j = json::parse(req.body, nullptr, false);
                   if (j.is_discarded() || !j.is_object())
                     return send_error(res, 400, "the index request is a JSON object");
                   if (j.contains("ready")) {
                     if (!j["ready"].is_boolean()) return send_error(res, 400, "`ready` must be true or false");
                     ready_only = j["ready"].get<bool>();
                   }
                 }
                 json index = json::array();
                 std::error_code ec;
                 std::map<std::string, Versions> loaded;
                 std::map<std::string, std::string> failed;
                 {
                   std::shared_lock lk(models_mu_);
                   loaded = models_;
                   failed = load_errors_;
                 }
                 std::vector<std::string> names;
                 for (const auto& e : fs::directory_iterator(options_.model_repository, ec))
                   if (e.is_directory() && valid_model_name(e.path().filename().string()))
                     names.push_back(e.path().filename().string());
                 std::sort(names.begin(), names.end());
                 for (const auto& n : names) {
                   const auto it = loaded.find(n);
                   for (int64_t v : versions_present(options_.model_repository / n)) {
                     const bool ready = it != loaded.end() && it->second.count(v);
                     if (ready_only && !ready) continue;
                     json e{{"name", n}, {"version", std::to_string(v)}, {"state", ready ? "READY" : "UNAVAILABLE"}};
                     if (!ready) {
                       const auto f = failed.find(n);
                       e["reason"] = f != failed.end()    ? "failed to load: " + f->second
                                     : it == loaded.end() ? "unloaded"
                                                          : "not selected by the version policy";
                     }
                     index.push_back(std::move(e));
                   }
                 }
                 ok_json(res, index);
               });
  server.route("POST", R"(/v2/repository/models/([^/]+)/(load|unload))",
               [this, control_off, ok_json](const http::Request& req, http::Response& res) {
                 if (control_off(res)) return;
                 const std::string name = req.captures[1];
                 if (!valid_model_name(name)) return send_error(res, 400, "invalid model name '" + name + "'");
                 const Status st = req.captures[2] == "load" ? load_model(name) : unload_model(name);
                 if (!st.is_ok()) return send_error(res, http_code(st), st.message());
                 ok_json(res, json::object());
               });

  server.route("GET", "/metrics", [this](const http::Request&, http::Response& res) {
    res.status = 200;
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
}

void Server::handle_infer(const http::Request& req, http::Response& res) {
  const auto t0 = clock::now();
  int code = 0;
  std::string message;
  const std::string& version = req.captures[2];
  const std::shared_ptr<ServedModel> model = find(req.captures[1], version.empty() ? nullptr : &version, code, message);
  if (!model) return send_error(res, code, message);
  ServedModel& m = *model;
  int64_t batch_rows = 0, queue_us = 0, compute_us = 0;
  auto log = [&](int status, const std::string& error) {
    const auto total = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
    if (error.empty())
      spdlog::info("infer model={} version={} status={} batch={} queue_us={} compute_us={} total_us={}", m.name(),
                   m.version(), status, batch_rows, queue_us, compute_us, total);
    else
      spdlog::info("infer model={} version={} status={} batch={} queue_us={} compute_us={} total_us={} error=\"{}\"",
                   m.name(), m.version(), status, batch_rows, queue_us, compute_us, total, error);
  };
  auto fail = [&](Failure why, int status, const std::string& msg) {
    m.metrics().fail(why);
    log(status, msg);
    // Errors from the model already name it ("model m version 1: ...").
    send_error(res, status, msg.rfind("model " + m.name() + " ", 0) == 0 ? msg : "model " + m.name() + ": " + msg);
  };
  auto bad = [&](const std::string& msg) { fail(Failure::kBadRequest, 400, msg); };
  // The JSON header, and the binary tensor data after it (binary tensor-data extension).
  std::string_view body = req.body;
  std::string_view binary;
  if (const std::string* header_length = req.header("Inference-Header-Content-Length")) {
    uint64_t n = 0;
    if (!parse_u64(*header_length, n) || n > body.size())
      return bad("Inference-Header-Content-Length is not a byte count within the body");
    binary = body.substr(n);
    body = body.substr(0, n);
  }
  // Large numeric `data` arrays are taken out of the text first (tensor_json.h), the rest is parsed as a tree; the
  // depth limit holds for both (the lifter leaves an array that would exceed it in the text).
  const LiftedData lifted = lift_data_arrays(body, options_.max_json_depth);
  if (json_depth(lifted.text, options_.max_json_depth) > options_.max_json_depth)
    return bad("JSON nested deeper than " + std::to_string(options_.max_json_depth));
  json j;
  try {
    j = json::parse(lifted.text);
  } catch (const json::exception& e) {
    return bad(std::string("malformed JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("inputs") || !j["inputs"].is_array())
    return bad("the request must be an object with an `inputs` array");
  // The queue deadline: the request's `timeout` parameter (µs), else the model's default, else the server's.
  int64_t timeout_us =
      m.config().default_timeout_us > 0 ? m.config().default_timeout_us : options_.request_timeout_ms * 1000;
  if (j.contains("parameters")) {
    if (!j["parameters"].is_object()) return bad("`parameters` must be an object");
    if (j["parameters"].contains("timeout")) {
      const json& t = j["parameters"]["timeout"];
      if (!t.is_number_unsigned() || t.get<uint64_t>() == 0 || t.get<uint64_t>() > 3'600'000'000ull)
        return bad("`parameters.timeout` is a number of microseconds in [1, 3600000000]");
      timeout_us = static_cast<int64_t>(t.get<uint64_t>());
    }
  }
  const auto& specs = m.inputs();
  std::vector<Tensor> inputs(specs.size());
  InflightReservation reservation(inflight_bytes_);
  uint64_t binary_used = 0;
  for (const auto& in : j["inputs"]) {
    if (!in.is_object() || !in.contains("name") || !in["name"].is_string() || !in.contains("datatype") ||
        !in["datatype"].is_string() || !in.contains("shape") || !in["shape"].is_array())
      return bad("every input needs `name`, `datatype` and `shape`");
    const std::string name = in["name"];
    size_t k = 0;
    while (k < specs.size() && specs[k].name != name) ++k;
    if (k == specs.size()) return bad("unknown input '" + name + "'");
    if (inputs[k].defined()) return bad("input '" + name + "' given twice");
    const std::string dt = in["datatype"];
    auto dtype = from_kserve_name(dt);
    if (!dtype || *dtype != specs[k].dtype)
      return bad("input '" + name + "' has datatype " + dt + " but the model takes " + kserve_name(specs[k].dtype));
    Shape shape;
    for (const auto& d : in["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        return bad("input '" + name + "': shape dims must be non-negative integers");
      shape.push_back(d.get<int64_t>());
    }
    if (specs[k].has_shape) {
      bool match = shape.size() == specs[k].shape.size();
      for (size_t i = 0; match && i < shape.size(); ++i) match = specs[k].shape[i] < 0 || specs[k].shape[i] == shape[i];
      if (!match)
        return bad("input '" + name + "' has shape " + shape_to_string(shape) + " but the model takes " +
                   shape_to_string(specs[k].shape));
    }
    auto bytes = checked_byte_size(*dtype, shape, options_.max_tensor_bytes);
    if (!bytes.is_ok()) return bad("input '" + name + "': " + bytes.status().message());
    // The memory cap, before anything is allocated.
    if (!reservation.reserve(bytes.value(), options_.max_inflight_bytes))
      return fail(Failure::kQueueFull, 429,
                  "the requests in flight hold the server's input memory cap (" +
                      std::to_string(options_.max_inflight_bytes >> 20) + " MiB); retry later");
    if (in.contains("parameters") && !in["parameters"].is_object())
      return bad("input '" + name + "': `parameters` must be an object");
    const json* params = in.contains("parameters") ? &in["parameters"] : nullptr;
    if (params && params->contains("binary_data_size")) {
      const json& bs = (*params)["binary_data_size"];
      if (!bs.is_number_unsigned() || bs.get<uint64_t>() != bytes.value())
        return bad("input '" + name + "': binary_data_size must be " + std::to_string(bytes.value()) +
                   " bytes for shape " + shape_to_string(shape));
      if (binary.size() - binary_used < bytes.value())
        return bad("input '" + name + "': the body holds fewer binary bytes than binary_data_size");
      const char* at = binary.data() + binary_used;
      binary_used += bytes.value();
      if (req.body_storage && reinterpret_cast<uintptr_t>(at) % 64 == 0) {
        // In place: the tensor keeps the request's body alive (the HTTP layer aligned its binary part), so a run
        // that outlives the request (a 504 answered while it is queued) still reads valid bytes.
        auto storage = std::make_shared<Storage>(const_cast<char*>(at), bytes.value(), Location{},
                                                 [keep = req.body_storage](void*) {});
        inputs[k] = Tensor(*dtype, shape, std::move(storage));
        continue;
      }
      auto t = Tensor::host_uninitialized(*dtype, shape);  // a later input whose bytes are not aligned: a copy
      if (!t.is_ok()) return fail(Failure::kRunFailed, 500, t.status().message());
      if (bytes.value() > 0) std::memcpy(t->raw_data(), at, bytes.value());
      inputs[k] = std::move(t).value();
      continue;
    }
    if (!in.contains("data")) return bad("input '" + name + "' has neither `data` nor binary_data_size");
    auto t = decode_data(in["data"], lifted, *dtype, shape);
    if (!t.is_ok()) {
      if (t.status().code() == StatusCode::kInvalidArgument)
        return bad("input '" + name + "': " + t.status().message());
      return fail(Failure::kRunFailed, 500, t.status().message());
    }
    inputs[k] = std::move(t).value();
  }
  if (binary_used != binary.size()) return bad("the body has binary data no input claims");
  for (size_t k = 0; k < specs.size(); ++k)
    if (!inputs[k].defined()) return bad("missing input '" + specs[k].name + "'");
  // Which outputs, and in which form.
  bool binary_default = false;
  if (j.contains("parameters") && j["parameters"].contains("binary_data_output"))
    binary_default =
        j["parameters"]["binary_data_output"].is_boolean() && j["parameters"]["binary_data_output"].get<bool>();
  std::vector<std::pair<size_t, bool>> wanted;
  if (j.contains("outputs")) {
    if (!j["outputs"].is_array()) return bad("`outputs` must be an array");
    for (const auto& o : j["outputs"]) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string()) return bad("every output needs a `name`");
      const std::string name = o["name"];
      size_t k = 0;
      while (k < m.outputs().size() && m.outputs()[k].name != name) ++k;
      if (k == m.outputs().size()) return bad("unknown output '" + name + "'");
      bool bin = binary_default;
      if (o.contains("parameters") && o["parameters"].is_object() && o["parameters"].contains("binary_data"))
        bin = o["parameters"]["binary_data"].is_boolean() && o["parameters"]["binary_data"].get<bool>();
      wanted.emplace_back(k, bin);
    }
  } else {
    for (size_t k = 0; k < m.outputs().size(); ++k) wanted.emplace_back(k, binary_default);
  }
  const auto deadline = clock::now() + std::chrono::microseconds(timeout_us);
  Failure why = Failure::kBadRequest;
  auto fut = m.submit(std::move(inputs), deadline, &why);
  if (!fut.is_ok()) {
    const int status = why == Failure::kQueueFull ? 429 : why == Failure::kUnavailable ? 503 : 400;
    return fail(why, status, fut.status().message());
  }
  // A request that started running before its deadline gets its result; the wait is still bounded.
  if (fut->wait_until(deadline + std::chrono::milliseconds(options_.request_timeout_ms)) != std::future_status::ready)
    return fail(Failure::kTimeout, 504,
                "no result within " + std::to_string(timeout_us / 1000 + options_.request_timeout_ms) + " ms");
  Result result = fut->get();
  batch_rows = result.batch_rows;
  queue_us = result.queue_us;
  compute_us = result.compute_us;
  if (!result.outputs.is_ok()) {
    const Status& st = result.outputs.status();
    if (st.code() == StatusCode::kDeadlineExceeded) return fail(Failure::kTimeout, 504, st.message());
    if (st.code() == StatusCode::kInvalidArgument) return bad(st.message());
    return fail(Failure::kRunFailed, 500, st.message());
  }
  json outputs = json::array();
  std::string tail;
  for (const auto& [k, bin] : wanted) {
    const Tensor& t = result.outputs.value()[k];
    json o{{"name", m.outputs()[k].name}, {"datatype", kserve_name(t.dtype())}, {"shape", t.shape()}};
    if (bin) {
      o["parameters"] = {{"binary_data_size", t.byte_size()}};
      tail.append(static_cast<const char*>(t.raw_data()), t.byte_size());
    } else {
      o["data"] = to_json_data(t);
    }
    outputs.push_back(std::move(o));
  }
  json resp{{"model_name", m.name()}, {"model_version", std::to_string(m.version())}, {"outputs", outputs}};
  if (j.contains("id")) resp["id"] = j["id"];
  std::string head = dump(resp);
  res.status = 200;
  if (tail.empty()) {
    res.set_content(head, "application/json");
  } else {
    res.set_header("Inference-Header-Content-Length", std::to_string(head.size()));
    head += tail;
    res.set_content(head, "application/octet-stream");
  }
  m.metrics().request_success++;
  log(200, "");
}

std::string Server::metrics_text() {
  std::map<std::string, Versions> models;
  std::vector<std::string> failed;
  {
    std::shared_lock lk(models_mu_);
    models = models_;
    for (const auto& [n, why] : load_errors_) failed.push_back(n);
  }
  std::ostringstream os;
  auto header = [&](const char* name, const char* type, const char* help) {
    os << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  auto family = [&](const char* name, const char* type, const char* help, auto get) {
    header(name, type, help);
    for (auto& [n, vs] : models)
      for (auto& [v, m] : vs) os << name << "{model=\"" << n << "\",version=\"" << v << "\"} " << get(*m) << "\n";
  };
  family("keel_inference_request_success", "counter", "Successful inference requests",
         [](ServedModel& m) { return m.metrics().request_success.load(); });
  header("keel_inference_request_failure", "counter", "Failed inference requests by reason");
  for (auto& [n, vs] : models)
    for (auto& [v, m] : vs)
      for (size_t r = 0; r < static_cast<size_t>(Failure::kCount); ++r)
        os << "keel_inference_request_failure{model=\"" << n << "\",version=\"" << v << "\",reason=\""
           << failure_name(static_cast<Failure>(r)) << "\"} " << m->metrics().request_failure[r].load() << "\n";
  family("keel_inference_count", "counter", "Inferences performed (batch items)",
         [](ServedModel& m) { return m.metrics().inference_count.load(); });
  family("keel_inference_exec_count", "counter", "Model executions (batches run)",
         [](ServedModel& m) { return m.metrics().execution_count.load(); });
  family("keel_inference_queue_duration_us", "counter", "Cumulative time requests waited in the queue",
         [](ServedModel& m) { return m.metrics().queue_us.load(); });
  family("keel_inference_compute_input_duration_us", "counter",
         "Cumulative time the batches of requests took to assemble their inputs (per request)",
         [](ServedModel& m) { return m.metrics().compute_input_us.load(); });
  family("keel_inference_compute_infer_duration_us", "counter", "Cumulative model run time (per request)",
         [](ServedModel& m) { return m.metrics().compute_infer_us.load(); });
  family("keel_inference_compute_output_duration_us", "counter",
         "Cumulative time the outputs took to be split back (per request)",
         [](ServedModel& m) { return m.metrics().compute_output_us.load(); });
  family("keel_inference_pending_request_count", "gauge", "Requests queued, not yet running",
         [](ServedModel& m) { return m.metrics().pending.load(); });
  family("keel_model_instances", "gauge", "Instances (sessions with a worker each) of the model version",
         [](ServedModel& m) { return m.config().instances; });
  family("keel_model_warmup_runs", "gauge", "Warm-up runs made at load over every instance (config warmup_batch_sizes)",
         [](ServedModel& m) { return m.warmup_runs(); });
  family("keel_model_builds", "gauge",
         "Distinct session builds of the instances (1: every instance shares the weights)",
         [](ServedModel& m) { return m.memory().builds; });
  family("keel_model_constant_bytes", "gauge", "Weights (initializers) the model version's builds hold, each once",
         [](ServedModel& m) { return m.memory().constant_bytes; });
  family("keel_model_arena_bytes", "gauge", "Activation arenas of the model version's builds",
         [](ServedModel& m) { return m.memory().arena_bytes; });
  header("keel_model_load_failed", "gauge",
         "1 for a model whose last load failed (left out at start with --exit-on-error false, or a failed reload that "
         "kept its serving versions); the reason is in the repository index and the log");
  for (const auto& n : failed) os << "keel_model_load_failed{model=\"" << n << "\"} 1\n";
  header("keel_memory_pool_bytes", "gauge", "Device memory pools: bytes in use and reserved (held from the device)");
  for (const auto& [dev, st] : env_->memory_stats()) {
    os << "keel_memory_pool_bytes{device=\"" << dev << "\",kind=\"in_use\"} " << st.in_use_bytes << "\n";
    os << "keel_memory_pool_bytes{device=\"" << dev << "\",kind=\"reserved\"} " << st.reserved_bytes << "\n";
  }
  header("keel_inflight_input_bytes", "gauge", "Input bytes of the requests in flight (capped by the server)");
  os << "keel_inflight_input_bytes " << inflight_bytes_.load() << "\n";
  header("keel_http_responses", "counter", "HTTP responses by status code (every route)");
  for (size_t c = 100; c < responses_.size(); ++c)
    if (const uint64_t n = responses_[c].load()) os << "keel_http_responses{code=\"" << c << "\"} " << n << "\n";
  return os.str();
}

}  // namespace keel::serve
