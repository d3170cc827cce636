// `keel serve` with its options: the bearer token, model control (load, unload, index, a new version loaded while
// requests wait on the old one), the slow-client read timeout, queue timeouts and the in-flight memory cap. Each test
// runs its own server process on 127.0.0.1 (a free port) and every wait is bounded.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "tests/serve/serve_test_util.h"
#include "tools/serve/http.h"

namespace {

using namespace keel_serve_test;

fs::path fresh_dir(const std::string& tag) {
  const fs::path d = fs::temp_directory_path() / ("keel_serve_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<float> fixed_reference(float k, const std::vector<float>& x) {
  const auto ref = reference_run(fixed_mlp_model(k), "x", Tensor::f32({1, 4}, x))[0];
  return std::vector<float>(ref.data<float>(), ref.data<float>() + 3);
}

bool near(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-4f * (1.f + std::abs(b[i]))) return false;
  return true;
}

TEST(ServeAuth, BearerTokenOnEveryRouteButTheHealthProbes) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("auth");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", mlp_model());
  write(dir / "token", "  s3cret-token\n");
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--auth-token-file", (dir / "token").string()})) << server.log;
  httplib::Client anon("127.0.0.1", server.port);
  anon.set_read_timeout(30, 0);
  EXPECT_EQ(anon.Get("/v2/health/live")->status, 200);
  EXPECT_EQ(anon.Get("/v2/health/ready")->status, 200);
  const std::string body = infer_body({1, 2, 3, 4}, 1).dump();
  for (const char* path : {"/v2", "/v2/models/mlp", "/v2/models/mlp/ready", "/metrics", "/v2/models/nope"}) {
    auto r = anon.Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->get_header_value("WWW-Authenticate"), "Bearer") << path;
    EXPECT_TRUE(json::parse(r->body, nullptr, false).contains("error")) << r->body;
  }
  {
    auto r = anon.Post("/v2/models/mlp/infer", body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  for (const std::string wrong : {"s3cret-tokem", "s3cret-token2", "s3cret", "", "S3CRET-TOKEN"}) {
    httplib::Client c("127.0.0.1", server.port);
    c.set_read_timeout(30, 0);
    auto r = c.Post("/v2/models/mlp/infer", {{"Authorization", "Bearer " + wrong}}, body, "application/json");
    ASSERT_TRUE(r) << wrong;
    EXPECT_EQ(r->status, 401) << wrong;
  }
  {
    // Basic auth is not a bearer token.
    httplib::Client c("127.0.0.1", server.port);
    c.set_basic_auth("user", "s3cret-token");
    auto r = c.Get("/v2");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
  }
  server.token = "s3cret-token";
  auto c = server.client();
  EXPECT_EQ(c->Get("/v2")->status, 200);
  EXPECT_EQ(c->Get("/v2/models/mlp")->status, 200);
  auto r = c->Post("/v2/models/mlp/infer", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_GE(metric(m->body, "keel_http_responses{code=\"401\"}"), 11u) << m->body;
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

TEST(ServeAuth, AnEmptyTokenFileIsRefused) {
  const fs::path dir = fresh_dir("auth_empty");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", mlp_model());
  write(dir / "token", " \n");
  ServerProcess server;
  EXPECT_FALSE(server.start(dir / "repo", {"--auth-token-file", (dir / "token").string()}));
  fs::remove_all(dir);
}

// Model control: index, unload, load; a new version loaded while requests wait in the old one's queue: every one of
// them is answered by the old version, and new requests go to the new one.
TEST(ServeControl, LoadUnloadIndexAndANewVersionInterruptsNothing) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("control");
  const fs::path repo = dir / "repo";
  write(repo / "m" / "1" / "model.onnx", fixed_mlp_model(1.f));
  write(repo / "m" / "2" / "model.onnx", fixed_mlp_model(2.f));
  write(repo / "m" / "config.toml", "max_batch_size = 16\nmax_queue_delay_us = 600000\ndynamic_batch = true\n");
  write(repo / "other" / "1" / "model.onnx", mlp_model());
  ServerProcess server;
  ASSERT_TRUE(server.start(repo, {"--model-control"})) << server.log;
  auto c = server.client();
  auto index = [&](const std::string& body = "") {
    auto r = c->Post("/v2/repository/index", body, "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? json::parse(r->body, nullptr, false) : json();
  };
  EXPECT_EQ(index(), json::parse(R"([{"name":"m","version":"1","state":"UNAVAILABLE",
                                     "reason":"not selected by the version policy"},
                                    {"name":"m","version":"2","state":"READY"},
                                    {"name":"other","version":"1","state":"READY"}])"));
  EXPECT_EQ(index("{\"ready\": true}").size(), 2u);
  EXPECT_EQ(c->Post("/v2/repository/index", "{\"ready\": 1}", "application/json")->status, 400);
  auto extensions = json::parse(c->Get("/v2")->body)["extensions"];
  EXPECT_NE(std::find(extensions.begin(), extensions.end(), "model_repository"), extensions.end());

  // Requests held by the batcher (600 ms) on version 2 while version 3 is loaded and version 2 goes away.
  const std::vector<float> x = {1, -2, 3, 0.5f};
  constexpr int kClients = 6;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&] {
      auto r = server.client()->Post("/v2/models/m/versions/2/infer", infer_body(x, 1).dump(), "application/json");
      if (r && r->status == 200 && json::parse(r->body)["model_version"] == "2" &&
          near(floats_of(json::parse(r->body)["outputs"][0]["data"]), fixed_reference(2.f, x)))
        ok++;
    });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    auto m = c->Get("/metrics");
    if (m && metric(m->body, "keel_inference_pending_request_count{model=\"m\",version=\"2\"}") == kClients) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  write(repo / "m" / "3" / "model.onnx", fixed_mlp_model(3.f));
  auto load = c->Post("/v2/repository/models/m/load", "", "application/json");
  ASSERT_TRUE(load);
  EXPECT_EQ(load->status, 200) << load->body;
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_EQ(json::parse(c->Get("/v2/models/m")->body)["versions"], json::array({"3"}));
  EXPECT_EQ(c->Get("/v2/models/m/versions/2")->status, 404);
  auto r3 = c->Post("/v2/models/m/infer", infer_body(x, 1).dump(), "application/json");
  ASSERT_TRUE(r3);
  ASSERT_EQ(r3->status, 200) << r3->body;
  EXPECT_TRUE(near(floats_of(json::parse(r3->body)["outputs"][0]["data"]), fixed_reference(3.f, x)));

  // A config that does not parse: the load fails naming it and version 3 keeps serving.
  write(repo / "m" / "config.toml", "max_batch_size = 16\ndynamic_batch = true\nmax_bach_size = 3\n");
  auto bad = c->Post("/v2/repository/models/m/load", "", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_NE(bad->body.find("max_bach_size"), std::string::npos) << bad->body;
  EXPECT_EQ(c->Get("/v2/models/m/versions/3/ready")->status, 200);

  // Unload, then load again (now with every version).
  EXPECT_EQ(c->Post("/v2/repository/models/m/unload", "", "application/json")->status, 200);
  EXPECT_EQ(c->Post("/v2/models/m/infer", infer_body(x, 1).dump(), "application/json")->status, 404);
  EXPECT_EQ(c->Post("/v2/repository/models/m/unload", "", "application/json")->status, 404);
  const json after_unload = index();
  ASSERT_EQ(after_unload.size(), 4u);
  EXPECT_EQ(after_unload[0]["reason"], "unloaded");
  write(repo / "m" / "config.toml", "max_batch_size = 16\ndynamic_batch = true\n[version_policy]\nall = true\n");
  EXPECT_EQ(c->Post("/v2/repository/models/m/load", "", "application/json")->status, 200);
  EXPECT_EQ(json::parse(c->Get("/v2/models/m")->body)["versions"], json::array({"1", "2", "3"}));
  auto r1 = c->Post("/v2/models/m/versions/1/infer", infer_body(x, 1).dump(), "application/json");
  ASSERT_TRUE(r1);
  EXPECT_TRUE(near(floats_of(json::parse(r1->body)["outputs"][0]["data"]), fixed_reference(1.f, x)));

  EXPECT_EQ(c->Post("/v2/repository/models/nope/load", "", "application/json")->status, 404);
  EXPECT_EQ(c->Post("/v2/repository/models/a..b/load", "", "application/json")->status, 400);
  EXPECT_EQ(c->Post("/v2/repository/models/other/infer", "", "application/json")->status, 404);  // no such route
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// Models that a batcher must not take (the batch check refuses each): a fixed batch reshaped inside, an output without
// a batch dim, rows that mix (each minus the batch's mean; a BatchNormalization exported in training mode).
enum Kind { kReshaped, kSummed, kCentred, kTrainingBatchNorm };
std::string unbatchable_model(Kind kind) {
  GraphBuilder g("m", 17);
  auto x = g.input("x", DType::kF32, {kind == kReshaped ? 1 : -1, 4});
  auto axis0 = [&] { return g.constant("axes", Tensor::from_vector<int64_t>(DType::kI64, {1}, {0})); };
  if (kind == kSummed) {
    g.output(g.op1("ReduceSum", {x, axis0()}, {{"keepdims", keel::Attribute::of_int(0)}}));
  } else if (kind == kTrainingBatchNorm) {  // exported in training mode: normalised by the batch's statistics
    auto c = [&](const char* n, float v) { return g.constant(n, Tensor::f32({4}, std::vector<float>(4, v))); };
    g.output(g.op("BatchNormalization", {x, c("scale", 1), c("bias", 0), c("mean", 0), c("var", 1)},
                  {{"training_mode", keel::Attribute::of_int(1)}}, 3)[0]);
  } else if (kind == kCentred) {
    // opset 17's ReduceMean takes its axes as an attribute
    g.output(g.op1("Sub", {x, g.op1("ReduceMean", {x}, {{"axes", keel::Attribute::of_ints({0})}})}));
  } else {
    auto y = g.op1("Relu", {x});
    g.output(g.op1("Reshape", {y, g.constant("shape", Tensor::from_vector<int64_t>(DType::kI64, {2}, {1, 4}))}));
  }
  auto bytes = keel::serialize_onnx(g.take());
  EXPECT_TRUE(bytes.is_ok()) << bytes.status().to_string();
  return bytes.is_ok() ? bytes.value() : "";
}

// With max_batch_size > 0 the batcher concatenates requests along dim 0 and splits every output along it: a model
// that cannot run a batch of 2 rows (a fixed batch reshaped inside, which `dynamic_batch = true` cannot undo), whose
// output has no batch dim, or whose rows mix (each row minus the batch's mean, a BatchNormalization exported in
// training mode: answers that would depend on the requests batched with them), is refused at load naming the node or
// the output, instead of failing (or answering wrongly) only the requests that happen to be batched together under
// load. Without batching all of them load.
TEST(ServeControl, AModelWithoutAFreeBatchDimIsRefusedAtLoadWhenBatching) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("batchdim");
  const fs::path repo = dir / "repo";
  write(repo / "other" / "1" / "model.onnx", mlp_model());
  ServerProcess server;
  ASSERT_TRUE(server.start(repo, {"--model-control"})) << server.log;
  auto c = server.client();
  const std::vector<float> x = {1, -2, 3, 0.5f};
  for (Kind kind : {kReshaped, kSummed, kCentred, kTrainingBatchNorm}) {
    const std::string name = kind == kReshaped  ? "reshaped"
                             : kind == kSummed  ? "summed"
                             : kind == kCentred ? "centred"
                                                : "batchnorm";
    write(repo / name / "1" / "model.onnx", unbatchable_model(kind));
    write(repo / name / "config.toml",
          kind == kReshaped ? "max_batch_size = 4\ndynamic_batch = true\n" : "max_batch_size = 4\n");
    auto r = c->Post(("/v2/repository/models/" + name + "/load").c_str(), "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const char* expected = kind == kReshaped ? "a batch of 2 rows does not run"
                           : kind == kSummed ? "has shape [4]: its first dim is not the batch"
                                             : "mixes the rows of a batch: output ";
    EXPECT_NE(r->body.find(expected), std::string::npos) << r->body;
    if (kind == kReshaped) {
      EXPECT_NE(r->body.find("Reshape"), std::string::npos) << r->body;
    }
    EXPECT_EQ(c->Get(("/v2/models/" + name).c_str())->status, 404);
    // Without batching the same model loads, and runs at its own batch.
    write(repo / name / "config.toml", "max_batch_size = 0\n");
    auto ok = c->Post(("/v2/repository/models/" + name + "/load").c_str(), "", "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200) << ok->body;
    auto run = c->Post(("/v2/models/" + name + "/infer").c_str(), infer_body(x, 1).dump(), "application/json");
    ASSERT_TRUE(run);
    EXPECT_EQ(run->status, 200) << run->body;
  }
  // Random rows that cannot run leave the rows unchecked, never refused: ids of a one-row table (zeros run, the row
  // check's 0 or 1 ids do not) load with batching.
  {
    GraphBuilder g("lookup", 17);
    auto ids = g.input("ids", DType::kI64, {-1, 2});
    g.output(g.op1("Gather", {g.constant("table", Tensor::f32({1, 3}, {0.5f, -1.f, 2.f})), ids}));
    auto bytes = keel::serialize_onnx(g.take());
    ASSERT_TRUE(bytes.is_ok()) << bytes.status().to_string();
    write(repo / "lookup" / "1" / "model.onnx", bytes.value());
    write(repo / "lookup" / "config.toml", "max_batch_size = 4\n");
    auto r = c->Post("/v2/repository/models/lookup/load", "", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  // A model whose rows stay apart loads with batching (the check passes: MLP rows are independent).
  write(repo / "other" / "config.toml", "max_batch_size = 4\n");
  auto mlp = c->Post("/v2/repository/models/other/load", "", "application/json");
  ASSERT_TRUE(mlp);
  EXPECT_EQ(mlp->status, 200) << mlp->body;
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// --exit-on-error false (Triton's flag): a model that fails to load at start is left out, the others serve, and its
// error is the reason its requests' 404 and the repository index give; by default the server does not start.
TEST(ServeControl, ExitOnErrorFalseServesTheOthersAndNamesTheReason) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("exitonerror");
  const fs::path repo = dir / "repo";
  write(repo / "good" / "1" / "model.onnx", mlp_model());
  write(repo / "mixed" / "1" / "model.onnx", unbatchable_model(kCentred));
  write(repo / "mixed" / "config.toml", "max_batch_size = 4\n");
  {
    ServerProcess strict;
    EXPECT_FALSE(strict.start(repo)) << strict.log;
    strict.terminate();
  }
  ServerProcess server;
  ASSERT_TRUE(server.start(repo, {"--exit-on-error", "false", "--model-control"})) << server.log;
  auto c = server.client();
  const std::vector<float> x = {1, -2, 3, 0.5f};
  auto good = c->Post("/v2/models/good/infer", infer_body(x, 1).dump(), "application/json");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  auto meta = c->Get("/v2/models/mixed");
  ASSERT_TRUE(meta);
  EXPECT_EQ(meta->status, 404);
  EXPECT_NE(meta->body.find("failed to load"), std::string::npos) << meta->body;
  EXPECT_NE(meta->body.find("mixes the rows of a batch"), std::string::npos) << meta->body;
  auto index = c->Post("/v2/repository/index", "", "application/json");
  ASSERT_TRUE(index);
  ASSERT_EQ(index->status, 200) << index->body;
  const auto entries = json::parse(index->body);
  bool found = false;
  for (const auto& e : entries)
    if (e["name"] == "mixed") {
      found = true;
      EXPECT_EQ(e["state"], "UNAVAILABLE");
      EXPECT_NE(e["reason"].get<std::string>().find("mixes the rows"), std::string::npos) << e.dump();
    }
  EXPECT_TRUE(found) << index->body;
  auto metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("keel_model_load_failed{model=\"mixed\"} 1"), std::string::npos) << metrics->body;
  EXPECT_EQ(metrics->body.find("keel_model_load_failed{model=\"good\"}"), std::string::npos);
  // Fixed in place and loaded again: it serves, and the reason is gone.
  write(repo / "mixed" / "config.toml", "max_batch_size = 0\n");
  auto load = c->Post("/v2/repository/models/mixed/load", "", "application/json");
  ASSERT_TRUE(load);
  EXPECT_EQ(load->status, 200) << load->body;
  EXPECT_EQ(c->Get("/v2/models/mixed")->status, 200);
  EXPECT_EQ(c->Get("/metrics")->body.find("keel_model_load_failed{model=\"mixed\"}"), std::string::npos);
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// A raw connection to the server.
int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Waits (bounded) until the server answers or closes `fd`; returns what it sent ("" for a plain close) or
// "<timeout>".
std::string wait_for_close(int fd, std::chrono::seconds limit) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
  return "<timeout>";
}

// A client that never finishes its body (or its headers) is cut off after --io-timeout; others are served meanwhile.
TEST(ServeLimits, SlowClientsAreCutOffAndOthersAreServed) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("slow");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", mlp_model());
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--io-timeout", "1", "--http-threads", "4"})) << server.log;
  std::vector<int> slow;
  for (int i = 0; i < 3; ++i) {  // a body that never ends
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0);
    const std::string head =
        "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000\r\n\r\n{\"inputs\": [";
    ASSERT_EQ(send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
    slow.push_back(fd);
  }
  {  // headers that never end
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0);
    const std::string head = "GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    ASSERT_EQ(send(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
    slow.push_back(fd);
  }
  // Served while the slow ones hold all 4 HTTP threads: the read timeout frees one within a second or so.
  auto c = server.client();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = c->Post("/v2/models/mlp/infer", infer_body({1, 2, 3, 4}, 1).dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(8));
  for (int fd : slow) {
    const std::string got = wait_for_close(fd, std::chrono::seconds(10));
    EXPECT_NE(got, "<timeout>");
    EXPECT_TRUE(got.empty() || got.rfind("HTTP/1.1 4", 0) == 0) << got;
    close(fd);
  }
  EXPECT_EQ(c->Get("/v2/health/live")->status, 200);
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// Reads one HTTP answer from `fd` (headers and a Content-Length body), bounded in time; "" on close or timeout.
std::string read_answer(int fd, std::string& pending, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const size_t end = pending.find("\r\n\r\n");
    if (end != std::string::npos) {
      size_t length = 0;
      const size_t at = pending.find("Content-Length: ");
      if (at != std::string::npos && at < end) length = std::stoul(pending.substr(at + 16));
      if (pending.size() >= end + 4 + length) {
        std::string one = pending.substr(0, end + 4 + length);
        pending.erase(0, end + 4 + length);
        return one;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) return "";
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return "";
    pending.append(buf, static_cast<size_t>(n));
  }
}

// User and system CPU time a process has used so far (/proc/PID/stat), in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after the command name
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i)
    if (i == 14 || i == 15) ticks += std::stod(f);  // utime, stime
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

bool send_text(int fd, const std::string& text) {
  return send(fd, text.data(), text.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(text.size());
}

// The HTTP layer's own protocol work on a raw connection: keep-alive and pipelining, `Expect: 100-continue`, a
// chunked body, percent-decoded paths, and malformed request lines (400 with a JSON error, the server serves on).
TEST(ServeHttp, KeepAlivePipeliningContinueChunkedAndMalformed) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("http");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", fixed_mlp_model(1.f));
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--http-threads", "2"})) << server.log;
  const std::vector<float> x{1, 2, 3, 4};
  const std::string body = infer_body(x, 1).dump();
  const std::string post =
      "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n";
  auto expect_result = [&](const std::string& answer) {
    ASSERT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
    const json j = json::parse(answer.substr(answer.find("\r\n\r\n") + 4));
    EXPECT_TRUE(near(floats_of(j["outputs"][0]["data"]), fixed_reference(1.f, x))) << answer;
  };
  {  // two requests in one write, then a third on the same connection
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0);
    const std::string one = post + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_TRUE(send_text(fd, one + one));
    std::string pending;
    expect_result(read_answer(fd, pending, std::chrono::seconds(10)));
    expect_result(read_answer(fd, pending, std::chrono::seconds(10)));
    ASSERT_TRUE(send_text(fd, "GET /v2/health/%6Cive HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));  // %6C = 'l'
    const std::string live = read_answer(fd, pending, std::chrono::seconds(10));
    EXPECT_EQ(live.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << live;
    EXPECT_NE(live.find("Connection: keep-alive"), std::string::npos) << live;
    close(fd);
  }
  {  // Expect: 100-continue, then the body
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(
        send_text(fd, post + "Expect: 100-continue\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n"));
    std::string pending;
    const std::string interim = read_answer(fd, pending, std::chrono::seconds(10));
    EXPECT_EQ(interim, "HTTP/1.1 100 Continue\r\n\r\n");
    ASSERT_TRUE(send_text(fd, body));
    expect_result(read_answer(fd, pending, std::chrono::seconds(10)));
    close(fd);
  }
  {  // a chunked body in three chunks
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0);
    std::string chunked = post + "Transfer-Encoding: chunked\r\n\r\n";
    for (size_t at = 0; at < body.size(); at += 40) {
      const std::string part = body.substr(at, 40);
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", part.size());
      chunked += size + part + "\r\n";
    }
    ASSERT_TRUE(send_text(fd, chunked + "0\r\n\r\n"));
    std::string pending;
    expect_result(read_answer(fd, pending, std::chrono::seconds(10)));
    close(fd);
  }
  for (const std::string bad : {"GARBAGE\r\n\r\n", "GET /v2 HTTP/9.9\r\n\r\n", "GET /v2 HTTP/1.1\r\nNo colon\r\n\r\n",
                                "POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: -5\r\n\r\n"}) {
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_text(fd, bad));
    std::string pending;
    const std::string answer = read_answer(fd, pending, std::chrono::seconds(10));
    EXPECT_EQ(answer.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << bad << " -> " << answer;
    EXPECT_NE(answer.find("{\"error\":"), std::string::npos) << answer;
    EXPECT_EQ(wait_for_close(fd, std::chrono::seconds(10)), "") << bad;  // then the server closes
    close(fd);
  }
  EXPECT_EQ(server.client()->Get("/v2/health/live")->status, 200);
  // Every connection above is closed by its client: the server goes quiet (no worker spins on a closed socket).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double cpu0 = cpu_seconds(server.pid);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_LT(cpu_seconds(server.pid) - cpu0, 0.2);
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// --host ::1: the server binds IPv6 loopback, prints the address in brackets and answers there. Skipped where the
// machine has no IPv6 loopback.
TEST(ServeHttp, BindsIpv6Loopback) {
  const int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const bool v6 = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  if (probe >= 0) close(probe);
  if (!v6) GTEST_SKIP() << "no IPv6 loopback on this machine";
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("ipv6");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", fixed_mlp_model(1.f));
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--host", "::1"})) << server.log;
  EXPECT_NE(server.log.find("listening on http://[::1]:"), std::string::npos) << server.log;
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  addr.sin6_port = htons(static_cast<uint16_t>(server.port));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_TRUE(send_text(fd, "GET /v2/health/live HTTP/1.1\r\nHost: [::1]\r\n\r\n"));
  std::string pending;
  const std::string answer = read_answer(fd, pending, std::chrono::seconds(10));
  close(fd);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  EXPECT_NE(answer.find("{\"live\":true}"), std::string::npos) << answer;
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// The HTTP layer alone, in process: with aligned_body_offset_header set, a Content-Length body is stored so that the
// byte at the header's offset is 64-byte aligned (where KServe's binary tensor data starts, which `keel serve` then
// uses in place), for every offset; a handler holding body_storage keeps the bytes past the request; without the
// header (or with one that is no byte count within the body) the body itself starts aligned.
TEST(ServeHttp, BodyStoredSoThatTheBinaryPartIsAligned) {
  std::signal(SIGPIPE, SIG_IGN);
  namespace http = keel::serve::http;
  http::Options o;
  o.threads = 2;
  o.aligned_body_offset_header = "Inference-Header-Content-Length";
  http::Server server(o);
  std::mutex mu;
  std::vector<std::pair<uintptr_t, size_t>> seen;  // (address of the aligned byte, header offset) per request
  std::vector<std::shared_ptr<char[]>> kept;
  std::vector<std::string_view> bodies;
  server.route("POST", "/x", [&](const http::Request& req, http::Response& res) {
    size_t at = 0;
    if (const std::string* h = req.header("Inference-Header-Content-Length"))
      if (std::from_chars(h->data(), h->data() + h->size(), at).ec != std::errc() || at > req.body.size()) at = 0;
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(reinterpret_cast<uintptr_t>(req.body.data() + at), at);
    kept.push_back(req.body_storage);
    bodies.push_back(req.body);
    res.set_content("{}", "application/json");
  });
  auto port = server.bind("127.0.0.1", 0);
  ASSERT_TRUE(port.is_ok()) << port.status().to_string();
  std::thread serving([&] { (void)server.serve(); });
  const int fd = connect_to(*port);
  ASSERT_GE(fd, 0);
  std::string pending;
  std::vector<std::string> sent;
  for (size_t n : {0, 1, 17, 37, 63, 64, 65, 100, 129}) {
    std::string body(n + 3000, 'j');
    for (size_t i = n; i < body.size(); ++i) body[i] = static_cast<char>('a' + (i * 7 + n) % 26);
    sent.push_back(body);
    ASSERT_TRUE(
        send_text(fd, "POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nInference-Header-Content-Length: " + std::to_string(n) +
                          "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
    const std::string answer = read_answer(fd, pending, std::chrono::seconds(10));
    EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  }
  for (const char* header :
       {"", "Inference-Header-Content-Length: 99999\r\n", "Inference-Header-Content-Length: x7\r\n"}) {
    const std::string body(500, 'q');
    sent.push_back(body);
    ASSERT_TRUE(send_text(
        fd, "POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n" + std::string(header) + "Content-Length: 500\r\n\r\n" + body));
    const std::string answer = read_answer(fd, pending, std::chrono::seconds(10));
    EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
  }
  close(fd);
  server.stop();
  serving.join();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), sent.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first % 64, 0u) << "request " << i << ", offset " << seen[i].second;
    // The bytes are intact after the request and the connection are gone: the handler's copy of body_storage holds
    // them.
    ASSERT_TRUE(kept[i]) << i;
    EXPECT_EQ(std::string(bodies[i]), sent[i]) << i;
  }
}

// More keep-alive clients than HTTP threads: a worker whose client goes quiet while others wait parks that
// connection and serves the next, so every client is served in turn, none waits for another's idle timeout.
TEST(ServeHttp, MoreKeepAliveClientsThanThreadsAreServedInTurn) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("turns");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", fixed_mlp_model(1.f));
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--http-threads", "2"})) << server.log;
  constexpr int kClients = 6, kRounds = 4;
  std::vector<std::unique_ptr<httplib::Client>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(server.client());
    clients.back()->set_keep_alive(true);
  }
  const std::vector<float> x{1, 2, 3, 4};
  const std::string body = infer_body(x, 1).dump();
  for (int round = 0; round < kRounds; ++round) {
    for (int i = 0; i < kClients; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = clients[static_cast<size_t>(i)]->Post("/v2/models/mlp/infer", body, "application/json");
      ASSERT_TRUE(r) << "client " << i << " round " << round;
      EXPECT_EQ(r->status, 200);
      // The server's idle timeout is 5 s: a client starved until another's connection timed out would take that.
      EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3)) << "client " << i << " round " << round;
    }
  }
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// Mutated requests (bytes flipped, cut short, duplicated, garbage lengths and chunk sizes), each on its own connection
// that the client half-closes after sending: the server answers each with a status line or closes it, never hangs,
// and keeps serving. The seed is printed: a failing case reruns with KEEL_HTTP_FUZZ_SEED.
TEST(ServeHttp, MutatedRequestsNeverTakeTheServerDown) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("fuzz");
  write(dir / "repo" / "mlp" / "1" / "model.onnx", fixed_mlp_model(1.f));
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--http-threads", "4", "--io-timeout", "2", "--max-body-mib", "1"}))
      << server.log;
  const char* env_seed = std::getenv("KEEL_HTTP_FUZZ_SEED");
  const uint32_t seed = env_seed ? static_cast<uint32_t>(std::stoul(env_seed)) : 20261203u;
  std::mt19937 rng(seed);
  const std::string body = infer_body({1, 2, 3, 4}, 1).dump();
  const std::vector<std::string> seeds = {
      "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      "POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
          [&] {
            char size[16];
            std::snprintf(size, sizeof size, "%zx\r\n", body.size());
            return std::string(size) + body + "\r\n0\r\n\r\n";
          }(),
      "GET /v2/models/mlp/versions/1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n",
      "GET /v2/health/ready?x=%41%zz HTTP/1.0\r\n\r\n"};
  const std::vector<std::string> tokens = {"\r\n",
                                           "\r\n\r\n",
                                           ":",
                                           "%",
                                           "%00",
                                           std::string(1, '\0'),
                                           "Content-Length: 99999999999999999999\r\n",
                                           "Transfer-Encoding: chunked\r\n",
                                           "ffffffffffffffff\r\n",
                                           " ",
                                           "HTTP/1.1",
                                           "Expect: 100-continue\r\n",
                                           "\xff\xfe",
                                           "Content-Length: 5\r\n"};
  constexpr int kCases = 200;
  int answered = 0, closed = 0;
  for (int i = 0; i < kCases; ++i) {
    std::string req = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !req.empty(); ++e) {
      const size_t at = rng() % req.size();
      switch (rng() % 5) {
        case 0: req[at] = static_cast<char>(rng() % 256); break;                                // flip a byte
        case 1: req.resize(at); break;                                                          // cut short
        case 2: req.insert(at, tokens[rng() % tokens.size()]); break;                           // insert a token
        case 3: req.erase(at, 1 + rng() % 16); break;                                           // drop some bytes
        default: req.insert(at, req.substr(at, std::min<size_t>(64, req.size() - at))); break;  // repeat some
      }
    }
    const int fd = connect_to(server.port);
    ASSERT_GE(fd, 0) << "case " << i << " (seed " << seed << ")";
    send_text(fd, req);
    shutdown(fd, SHUT_WR);
    const std::string got = wait_for_close(fd, std::chrono::seconds(10));
    close(fd);
    ASSERT_NE(got, "<timeout>") << "case " << i << " (seed " << seed << "): " << req;
    if (got.empty()) {
      ++closed;
    } else {
      ++answered;
      EXPECT_EQ(got.rfind("HTTP/1.1 ", 0), 0u) << "case " << i << " (seed " << seed << "): " << req << " -> " << got;
    }
  }
  std::printf("%d mutated requests (seed %u): %d answered, %d closed without an answer\n", kCases, seed, answered,
              closed);
  EXPECT_GT(answered, kCases / 4);  // the mutations leave many requests parseable or answerable with a 4xx
  auto c = server.client();
  EXPECT_EQ(c->Get("/v2/health/live")->status, 200);
  auto r = c->Post("/v2/models/mlp/infer", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

// A request still queued past its timeout gets 504 without running; the in-flight memory cap answers 429 before
// anything is allocated; both are counted by reason.
TEST(ServeLimits, QueueTimeoutIs504AndTheMemoryCapIs429) {
  std::signal(SIGPIPE, SIG_IGN);
  const fs::path dir = fresh_dir("timeout");
  write(dir / "repo" / "slow" / "1" / "model.onnx", mlp_model());
  write(dir / "repo" / "slow" / "config.toml", "max_batch_size = 8\nmax_queue_delay_us = 800000\n");
  write(dir / "repo" / "quick" / "1" / "model.onnx", mlp_model());
  write(dir / "repo" / "quick" / "config.toml",
        "max_batch_size = 8\nmax_queue_delay_us = 800000\n"
        "default_timeout_us = 20000\n");
  ServerProcess server;
  ASSERT_TRUE(server.start(dir / "repo", {"--max-inflight-mib", "1"})) << server.log;
  auto c = server.client();
  json body = infer_body({1, 2, 3, 4}, 1);
  body["parameters"] = {{"timeout", 20000}};
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->Post("/v2/models/slow/infer", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 504) << r->body;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(700));  // not held for the batch delay
  auto rq = c->Post("/v2/models/quick/infer", infer_body({1, 2, 3, 4}, 1).dump(), "application/json");
  ASSERT_TRUE(rq);
  EXPECT_EQ(rq->status, 504) << rq->body;
  body["parameters"] = {{"timeout", -5}};
  EXPECT_EQ(c->Post("/v2/models/slow/infer", body.dump(), "application/json")->status, 400);
  // 2 MiB of input past the 1 MiB cap (the binary form: no JSON to parse).
  const int64_t rows = (2 << 20) / 16;
  json head = {{"inputs", json::array({json{{"name", "x"},
                                            {"datatype", "FP32"},
                                            {"shape", {rows, 4}},
                                            {"parameters", {{"binary_data_size", rows * 16}}}}})}};
  std::string big = head.dump();
  const size_t hl = big.size();
  big.resize(hl + static_cast<size_t>(rows) * 16, '\0');
  auto rb = c->Post("/v2/models/slow/infer", {{"Inference-Header-Content-Length", std::to_string(hl)}}, big,
                    "application/octet-stream");
  ASSERT_TRUE(rb);
  EXPECT_EQ(rb->status, 429) << rb->body;
  EXPECT_TRUE(rb->has_header("Retry-After"));
  auto m = c->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(metric(m->body, "keel_inference_request_failure{model=\"slow\",version=\"1\",reason=\"timeout\"}"), 1u);
  EXPECT_EQ(metric(m->body, "keel_inference_request_failure{model=\"quick\",version=\"1\",reason=\"timeout\"}"), 1u);
  EXPECT_EQ(metric(m->body, "keel_inference_request_failure{model=\"slow\",version=\"1\",reason=\"queue_full\"}"), 1u);
  EXPECT_EQ(metric(m->body, "keel_inference_exec_count", "slow"), 0u);  // the timed-out request never ran
  EXPECT_EQ(metric(m->body, "keel_inflight_input_bytes "), 0u);
  EXPECT_EQ(server.terminate(), 0);
  fs::remove_all(dir);
}

}  // namespace
