// `keel serve` end to end: the server is the keel binary, started on 127.0.0.1 with --port 0 (it prints the port),
// on a repository of models generated here (GraphBuilder + serialize_onnx, no files in git). Every endpoint's status
// and body; JSON and binary requests give identical outputs, equal to an in-process Session run; bad requests get
// their 4xx and the server keeps serving; concurrent clients are batched (exec count < inference count) and each gets
// its own result; the queue refuses past max_queue_size (503); SIGTERM under load loses no accepted request.
// Every wait is bounded.
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/base/graph.h"
#include "core/runtime/environment.h"
#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using keel::DType;
using keel::GraphBuilder;
using keel::Tensor;

// mlp: x f32 [N, 4] -> y = x.W + b [N, 3], z = Relu(y). Returns the ONNX bytes.
std::string mlp_model() {
  GraphBuilder g("mlp", 17);
  auto x = g.input("x", DType::kF32, {-1, 4});
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(12), b(3);
  for (auto& v : w) v = d(rng);
  for (auto& v : b) v = d(rng);
  auto y = g.op1("Add", {g.op1("MatMul", {x, g.constant("W", Tensor::f32({4, 3}, w))}), g.constant("b", Tensor::f32({3}, b))});
  auto z = g.op1("Relu", {y});
  g.output(y);
  g.output(z);
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

// ints: a i64 [N, 2] -> a + [10, -20].
std::string int_model() {
  GraphBuilder g("ints", 17);
  auto a = g.input("a", DType::kI64, {-1, 2});
  g.output(g.op1("Add", {a, g.constant("c", Tensor::from_vector<int64_t>(DType::kI64, {2}, {10, -20}))}));
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

// The keel binary serving a repository; killed (SIGKILL) if still running at destruction.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log;  // the server's stdout up to the "listening" line

  bool start(const fs::path& repo, const std::vector<std::string>& extra = {}) {
    int out[2];
    if (pipe(out) != 0) return false;
    std::vector<std::string> args = {KEEL_CLI_BINARY, "--threads", "1", "serve", "--model-repository", repo.string(),
                                     "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = fork();
    if (pid == 0) {
      dup2(out[1], 1);
      close(out[0]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(out[1]);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{out[0], POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[256];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      log.append(buf, static_cast<size_t>(n));
      const auto at = log.find("listening on http://127.0.0.1:");
      if (at != std::string::npos && log.find('\n', at) != std::string::npos) {
        port = std::stoi(log.substr(at + std::strlen("listening on http://127.0.0.1:")));
        close(out[0]);  // the server writes nothing more on stdout
        return true;
      }
    }
    close(out[0]);
    return false;
  }
  // Sends SIGTERM and waits up to `timeout` for the exit; returns the exit status (-1 on timeout or a signal).
  int terminate(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }
  ~ServerProcess() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  std::unique_ptr<httplib::Client> client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_connection_timeout(5, 0);
    c->set_read_timeout(30, 0);
    c->set_write_timeout(30, 0);
    return c;
  }
};

// In-process reference: the same model bytes run through a Session.
std::vector<Tensor> reference_run(const std::string& model, const std::string& input, const Tensor& x) {
  static auto env = keel::Environment::create({}).value();
  auto graph = keel::load_onnx_from_memory(model.data(), model.size(), ".");
  EXPECT_TRUE(graph.is_ok());
  auto session = keel::Session::create(*env, std::move(graph).value());
  EXPECT_TRUE(session.is_ok()) << session.status().to_string();
  auto out = session.value()->run({{input, x}});
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.value();
}

std::vector<float> floats_of(const json& data) {
  std::vector<float> v;
  for (const auto& e : data) v.push_back(e.get<float>());
  return v;
}

json infer_body(const std::vector<float>& x, int64_t rows) {
  return json{{"inputs", json::array({json{{"name", "x"}, {"datatype", "FP32"}, {"shape", {rows, 4}}, {"data", x}}})}};
}

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::signal(SIGPIPE, SIG_IGN);  // a server that closes early must not end the test
    repo_ = fs::temp_directory_path() / ("keel_serve_test_" + std::to_string(getpid()));
    fs::remove_all(repo_);
    mlp_ = mlp_model();
    write(repo_ / "mlp" / "1" / "model.onnx", mlp_);
    write(repo_ / "mlp" / "config.toml", "max_batch_size = 16\nmax_queue_delay_us = 50000\n");
    write(repo_ / "plain" / "1" / "model.onnx", mlp_);
    write(repo_ / "plain" / "3" / "model.onnx", mlp_);
    write(repo_ / "ints" / "1" / "model.onnx", int_model());
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->start(repo_, {"--max-body-mib", "1"})) << server_->log;
  }
  static void TearDownTestSuite() {
    if (server_) {
      EXPECT_EQ(server_->terminate(), 0);
    }
    delete server_;
    server_ = nullptr;
    fs::remove_all(repo_);
  }
  static json get_json(const std::string& path, int expect) {
    auto c = server_->client();
    auto r = c->Get(path.c_str());
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, expect) << path << ": " << r->body;
    auto j = json::parse(r->body, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << path << ": " << r->body;
    return j;
  }
  static httplib::Result post(const std::string& path, const std::string& body,
                              const httplib::Headers& headers = {}, const char* type = "application/json") {
    auto c = server_->client();
    return c->Post(path.c_str(), headers, body, type);
  }
  // Posts and checks the status and that an error body says {"error": ...}.
  static void expect_error(const std::string& path, const std::string& body, int status,
                           const httplib::Headers& headers = {}) {
    auto r = post(path, body, headers);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, status) << body.substr(0, 200) << " -> " << r->body;
    auto j = json::parse(r->body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error") && j["error"].is_string()) << r->body;
  }
  static inline fs::path repo_;
  static inline std::string mlp_;
  static inline ServerProcess* server_ = nullptr;
};

TEST_F(Serve, HealthAndMetadata) {
  EXPECT_EQ(get_json("/v2/health/live", 200)["live"], true);
  EXPECT_EQ(get_json("/v2/health/ready", 200)["ready"], true);
  auto meta = get_json("/v2", 200);
  EXPECT_EQ(meta["name"], "keel");
  EXPECT_TRUE(meta["extensions"].is_array());
  auto m = get_json("/v2/models/mlp", 200);
  EXPECT_EQ(m["name"], "mlp");
  EXPECT_EQ(m["versions"], json::array({"1"}));
  ASSERT_EQ(m["inputs"].size(), 1u);
  EXPECT_EQ(m["inputs"][0]["name"], "x");
  EXPECT_EQ(m["inputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["inputs"][0]["shape"], json::array({-1, 4}));
  ASSERT_EQ(m["outputs"].size(), 2u);
  EXPECT_EQ(m["outputs"][0]["datatype"], "FP32");
  EXPECT_EQ(m["outputs"][0]["shape"], json::array({-1, 3}));
  EXPECT_EQ(get_json("/v2/models/mlp/versions/1", 200)["name"], "mlp");
  EXPECT_EQ(get_json("/v2/models/plain", 200)["versions"], json::array({"3"}));  // the highest version
  EXPECT_EQ(get_json("/v2/models/plain/versions/3/ready", 200)["ready"], true);
  EXPECT_EQ(get_json("/v2/models/mlp/ready", 200)["ready"], true);
  EXPECT_TRUE(get_json("/v2/models/plain/versions/1", 404).contains("error"));
  EXPECT_TRUE(get_json("/v2/models/nope", 404).contains("error"));
  EXPECT_TRUE(get_json("/v2/models/nope/ready", 404).contains("error"));
  EXPECT_TRUE(get_json("/v2/no/such/endpoint", 404).contains("error"));
  EXPECT_EQ(get_json("/v2/models/ints", 200)["inputs"][0]["datatype"], "INT64");
}

TEST_F(Serve, JsonAndBinaryEqualInProcessRun) {
  const std::vector<float> x = {0.5f, -1.f, 2.f, 0.25f, -0.75f, 1.5f, 3.f, -2.f};
  const auto ref = reference_run(mlp_, "x", Tensor::f32({2, 4}, x));
  ASSERT_EQ(ref.size(), 2u);
  // JSON, nested data, id echoed.
  json body = {{"id", "req-42"},
               {"inputs", json::array({json{{"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 4}},
                                            {"data", json::array({json::array({0.5, -1, 2, 0.25}),
                                                                  json::array({-0.75, 1.5, 3, -2})})}}})}};
  for (const char* model : {"mlp", "plain"}) {
    auto r = post(std::string("/v2/models/") + model + "/infer", body.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto j = json::parse(r->body);
    EXPECT_EQ(j["id"], "req-42");
    EXPECT_EQ(j["model_name"], model);
    ASSERT_EQ(j["outputs"].size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(j["outputs"][k]["shape"], json::array({2, 3}));
      const auto got = floats_of(j["outputs"][k]["data"]);
      ASSERT_EQ(got.size(), 6u);
      for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], ref[k].data<float>()[i], 1e-5f) << model << " output " << k;
    }
  }
  // Output selection.
  body["outputs"] = json::array({json{{"name", json::parse(post("/v2/models/mlp/infer", infer_body(x, 2).dump())->body)
                                                              ["outputs"][1]["name"]}}});
  auto sel = json::parse(post("/v2/models/mlp/infer", body.dump())->body);
  ASSERT_EQ(sel["outputs"].size(), 1u);
  const auto json_z = floats_of(sel["outputs"][0]["data"]);
  // The binary extension: input bytes after the JSON header, output z asked for as binary.
  json head = {{"inputs", json::array({json{{"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 4}},
                                            {"parameters", {{"binary_data_size", 32}}}}})},
               {"outputs", json::array({json{{"name", sel["outputs"][0]["name"]}, {"parameters", {{"binary_data", true}}}}})}};
  const std::string h = head.dump();
  std::string bin = h;
  bin.append(reinterpret_cast<const char*>(x.data()), 32);
  auto r = post("/v2/models/mlp/infer", bin, {{"Inference-Header-Content-Length", std::to_string(h.size())}},
                "application/octet-stream");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  ASSERT_TRUE(r->has_header("Inference-Header-Content-Length"));
  const size_t hl = std::stoul(r->get_header_value("Inference-Header-Content-Length"));
  auto rj = json::parse(r->body.substr(0, hl));
  EXPECT_EQ(rj["outputs"][0]["parameters"]["binary_data_size"], 24);
  ASSERT_EQ(r->body.size(), hl + 24);
  std::vector<float> bin_z(6);
  std::memcpy(bin_z.data(), r->body.data() + hl, 24);
  EXPECT_EQ(bin_z, json_z);  // bit-identical
  // binary_data_output for every output.
  json all = infer_body(x, 2);
  all["parameters"] = {{"binary_data_output", true}};
  auto r2 = post("/v2/models/mlp/infer", all.dump());
  ASSERT_TRUE(r2);
  ASSERT_EQ(r2->status, 200);
  EXPECT_EQ(r2->body.size(), std::stoul(r2->get_header_value("Inference-Header-Content-Length")) + 48);
  // INT64.
  json ib = {{"inputs", json::array({json{{"name", "a"}, {"datatype", "INT64"}, {"shape", {1, 2}}, {"data", {1, 2}}}})}};
  auto ri = post("/v2/models/ints/infer", ib.dump());
  ASSERT_TRUE(ri);
  ASSERT_EQ(ri->status, 200) << ri->body;
  EXPECT_EQ(json::parse(ri->body)["outputs"][0]["data"], json::array({11, -18}));
  EXPECT_EQ(json::parse(ri->body)["outputs"][0]["datatype"], "INT64");
}

TEST_F(Serve, BadRequestsGetTheir4xxAndServingGoesOn) {
  const std::string p = "/v2/models/plain/infer";
  const std::vector<float> x(8, 1.f);
  expect_error(p, "{\"inputs\": [", 400);                                   // malformed JSON
  expect_error(p, std::string(100000, '[') + std::string(100000, ']'), 400);  // deep nesting
  expect_error(p, "[]", 400);                                                // not an object
  json wrong_dtype = infer_body(x, 2);
  wrong_dtype["inputs"][0]["datatype"] = "INT64";
  expect_error(p, wrong_dtype.dump(), 400);
  json bad_dtype_name = infer_body(x, 2);
  bad_dtype_name["inputs"][0]["datatype"] = "FLOAT";
  expect_error(p, bad_dtype_name.dump(), 400);
  json short_data = infer_body(std::vector<float>(7, 1.f), 2);  // shape [2,4] with 7 values
  expect_error(p, short_data.dump(), 400);
  json overflow = infer_body(x, 2);
  overflow["inputs"][0]["shape"] = {int64_t{1} << 62, 4};
  expect_error(p, overflow.dump(), 400);
  json negative = infer_body(x, 2);
  negative["inputs"][0]["shape"] = {-2, 4};
  expect_error(p, negative.dump(), 400);
  json wrong_rank = infer_body(x, 2);
  wrong_rank["inputs"][0]["shape"] = {8};
  expect_error(p, wrong_rank.dump(), 400);
  json wrong_dim = infer_body(x, 2);
  wrong_dim["inputs"][0]["shape"] = {4, 2};
  expect_error(p, wrong_dim.dump(), 400);
  json strings = infer_body(x, 2);
  strings["inputs"][0]["data"] = json::array({"a", "b", "c", "d", "e", "f", "g", "h"});
  expect_error(p, strings.dump(), 400);
  json unknown_input = infer_body(x, 2);
  unknown_input["inputs"][0]["name"] = "nope";
  expect_error(p, unknown_input.dump(), 400);
  expect_error(p, json{{"inputs", json::array()}}.dump(), 400);  // missing input
  json unknown_output = infer_body(x, 2);
  unknown_output["outputs"] = json::array({json{{"name", "nope"}}});
  expect_error(p, unknown_output.dump(), 400);
  json fractional = {{"inputs", json::array({json{{"name", "a"}, {"datatype", "INT64"}, {"shape", {1, 2}}, {"data", {1.5, 2}}}})}};
  expect_error("/v2/models/ints/infer", fractional.dump(), 400);
  json bin_size = {{"inputs", json::array({json{{"name", "x"}, {"datatype", "FP32"}, {"shape", {2, 4}},
                                                {"parameters", {{"binary_data_size", 31}}}}})}};
  expect_error(p, bin_size.dump() + std::string(31, '\0'), 400, {{"Inference-Header-Content-Length",
                                                                  std::to_string(bin_size.dump().size())}});
  expect_error(p, infer_body(x, 2).dump(), 400, {{"Inference-Header-Content-Length", "999999"}});
  expect_error("/v2/models/nope/infer", infer_body(x, 2).dump(), 404);
  expect_error("/v2/models/plain/versions/1/infer", infer_body(x, 2).dump(), 404);
  expect_error("/v2/models/plain/versions/abc/infer", infer_body(x, 2).dump(), 404);
  expect_error("/v2/models/a..b/infer", infer_body(x, 2).dump(), 400);
  expect_error("/v2/models/%2E%2E/infer", infer_body(x, 2).dump(), 400);
  json too_many = infer_body(std::vector<float>(17 * 4, 1.f), 17);  // past mlp's max_batch_size 16
  expect_error("/v2/models/mlp/infer", too_many.dump(), 400);
  {
    auto r = post(p, std::string(2u << 20, ' '));  // past --max-body-mib 1
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
  }
  auto r = post(p, infer_body(x, 2).dump());
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto metrics = server_->client()->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("keel_inference_request_failure{model=\"plain\",version=\"3\"}"), std::string::npos);
}

// A counter of /metrics for one model.
uint64_t metric(const std::string& text, const std::string& name, const std::string& model) {
  const std::string key = name + "{model=\"" + model + "\",";
  const auto at = text.find(key);
  if (at == std::string::npos) return 0;
  const auto sp = text.find("} ", at);
  return std::stoull(text.substr(sp + 2));
}

TEST_F(Serve, ConcurrentClientsAreBatchedAndGetTheirOwnResults) {
  auto before = server_->client()->Get("/metrics");
  ASSERT_TRUE(before);
  constexpr int kClients = 8, kRequests = 4;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      auto cli = server_->client();
      for (int i = 0; i < kRequests; ++i) {
        const int64_t rows = 1 + (c + i) % 3;
        std::vector<float> x(static_cast<size_t>(rows) * 4);
        for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(c * 100 + i * 10) + 0.125f * e;
        auto r = cli->Post("/v2/models/mlp/infer", infer_body(x, rows).dump(), "application/json");
        if (!r || r->status != 200) continue;
        const auto ref = reference_run(mlp_, "x", Tensor::f32({rows, 4}, x));
        const auto got = floats_of(json::parse(r->body)["outputs"][0]["data"]);
        bool same = got.size() == static_cast<size_t>(rows * 3);
        for (size_t e = 0; same && e < got.size(); ++e)
          same = std::abs(got[e] - ref[0].data<float>()[e]) <= 1e-4f * (1.f + std::abs(got[e]));
        if (same) ok++;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients * kRequests);
  auto after = server_->client()->Get("/metrics");
  ASSERT_TRUE(after);
  const uint64_t infers = metric(after->body, "keel_inference_count", "mlp") - metric(before->body, "keel_inference_count", "mlp");
  const uint64_t execs = metric(after->body, "keel_inference_exec_count", "mlp") -
                         metric(before->body, "keel_inference_exec_count", "mlp");
  EXPECT_GE(infers, static_cast<uint64_t>(kClients * kRequests));
  EXPECT_LT(execs, static_cast<uint64_t>(kClients * kRequests)) << after->body;
  EXPECT_GE(metric(after->body, "keel_inference_request_success", "mlp"), static_cast<uint64_t>(kClients * kRequests));
}

// A server of its own: requests held in the queue (long batching delay) when SIGTERM comes all complete; a full queue
// refuses with 503 and Retry-After.
TEST(ServeShutdown, SigtermUnderLoadLosesNoAcceptedRequestAndFullQueueIs503) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path repo = fs::temp_directory_path() / ("keel_serve_sigterm_" + std::to_string(getpid()));
  fs::remove_all(repo);
  const std::string mlp = mlp_model();
  write(repo / "held" / "1" / "model.onnx", mlp);
  write(repo / "held" / "config.toml", "max_batch_size = 64\nmax_queue_delay_us = 400000\n");
  write(repo / "small" / "1" / "model.onnx", mlp);
  write(repo / "small" / "config.toml", "max_batch_size = 64\nmax_queue_delay_us = 400000\nmax_queue_size = 2\n");
  ServerProcess server;
  ASSERT_TRUE(server.start(repo)) << server.log;
  {
    // Three at once on a queue of two: one is refused.
    std::atomic<int> ok{0}, refused{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < 3; ++c)
      threads.emplace_back([&] {
        auto r = server.client()->Post("/v2/models/small/infer", infer_body(std::vector<float>(4, 1.f), 1).dump(),
                                       "application/json");
        if (r && r->status == 200) ok++;
        if (r && r->status == 503 && r->has_header("Retry-After")) refused++;
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 2);
    EXPECT_EQ(refused.load(), 1);
  }
  constexpr int kClients = 8;
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      std::vector<float> x(4, static_cast<float>(c));
      auto r = server.client()->Post("/v2/models/held/infer", infer_body(x, 1).dump(), "application/json");
      if (!r || r->status != 200) {
        failed++;
        return;
      }
      const auto ref = reference_run(mlp, "x", Tensor::f32({1, 4}, x));
      const auto got = floats_of(json::parse(r->body)["outputs"][0]["data"]);
      if (got.size() == 3 && std::abs(got[0] - ref[0].data<float>()[0]) < 1e-4f) ok++;
    });
  // Wait until every request is queued (the batcher holds them for 400 ms), then SIGTERM.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = server.client()->Get("/metrics");
    if (m && metric(m->body, "keel_inference_pending_request_count", "held") == kClients) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server.terminate(), 0);
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_EQ(failed.load(), 0);
  // Not accepting any more.
  EXPECT_FALSE(httplib::Client("127.0.0.1", server.port).Get("/v2/health/live"));
  fs::remove_all(repo);
}

}  // namespace
