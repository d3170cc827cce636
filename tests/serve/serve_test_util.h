// keel/tests/serve/serve_test_util.h — what the `keel serve` tests share: models generated in code, a repository on
// disk, the keel binary as a server process on 127.0.0.1 (a free port, read from its stdout), an in-process reference
// run, and /metrics parsing. Every wait is bounded.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
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

namespace keel_serve_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using keel::DType;
using keel::GraphBuilder;
using keel::Tensor;

// mlp: x f32 [N, 4] -> y = x.W + b [N, 3], z = Relu(y). Returns the ONNX bytes.
inline std::string mlp_model() {
  GraphBuilder g("mlp", 17);
  auto x = g.input("x", DType::kF32, {-1, 4});
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> w(12), b(3);
  for (auto& v : w) v = d(rng);
  for (auto& v : b) v = d(rng);
  auto y = g.op1("Add",
                 {g.op1("MatMul", {x, g.constant("W", Tensor::f32({4, 3}, w))}), g.constant("b", Tensor::f32({3}, b))});
  auto z = g.op1("Relu", {y});
  g.output(y);
  g.output(z);
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

// ints: a i64 [N, 2] -> a + [10, -20].
inline std::string int_model() {
  GraphBuilder g("ints", 17);
  auto a = g.input("a", DType::kI64, {-1, 2});
  g.output(g.op1("Add", {a, g.constant("c", Tensor::from_vector<int64_t>(DType::kI64, {2}, {10, -20}))}));
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

// halves: h f16 [N, 2] -> h + h (f16).
inline std::string f16_model() {
  GraphBuilder g("halves", 17);
  auto h = g.input("h", DType::kF16, {-1, 2});
  g.output(g.op1("Add", {h, h}));
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

// picky: x f32 [N, M] -> Reshape(x, [2, 2]): runs only when N * M = 4 (not on a warm-up's ones-everywhere shape).
inline std::string reshape_model() {
  GraphBuilder g("picky", 17);
  auto x = g.input("x", DType::kF32, {-1, -1});
  g.output(g.op1("Reshape", {x, g.constant("shape", Tensor::from_vector<int64_t>(DType::kI64, {2}, {2, 2}))}));
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

// mlp with a fixed batch of 1 (x f32 [1, 4]) and the scale `k` on its weights, so that versions differ.
inline std::string fixed_mlp_model(float k = 1.f) {
  GraphBuilder g("fixed", 17);
  auto x = g.input("x", DType::kF32, {1, 4});
  std::vector<float> w(12);
  for (size_t i = 0; i < w.size(); ++i) w[i] = k * (0.1f * static_cast<float>(i) - 0.5f);
  g.output(g.op1("MatMul", {x, g.constant("W", Tensor::f32({4, 3}, w))}));
  auto s = keel::serialize_onnx(g.take());
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? s.value() : "";
}

inline void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
}

// The keel binary serving a repository; killed (SIGKILL) if still running at destruction.
struct ServerProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log;    // the server's stdout up to the "listening" line
  std::string token;  // sent as `Authorization: Bearer` by client() when not empty

  bool start(const fs::path& repo, const std::vector<std::string>& extra = {}) {
    int out[2];
    if (pipe(out) != 0) return false;
    std::vector<std::string> args = {KEEL_CLI_BINARY,      "--threads",   "1",      "serve",
                                     "--model-repository", repo.string(), "--port", "0"};
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
      const auto at = log.find("listening on http://");
      const auto eol = at == std::string::npos ? std::string::npos : log.find('\n', at);
      if (eol != std::string::npos) {  // http://HOST:PORT, HOST an address or [an IPv6 address]
        port = std::stoi(log.substr(log.rfind(':', eol) + 1));
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
    if (!token.empty()) c->set_bearer_token_auth(token.c_str());
    return c;
  }
};

// In-process reference: the same model bytes run through a Session.
inline std::vector<Tensor> reference_run(const std::string& model, const std::string& input, const Tensor& x) {
  static auto env = keel::Environment::create({}).value();
  auto graph = keel::load_onnx_from_memory(model.data(), model.size(), ".");
  EXPECT_TRUE(graph.is_ok());
  auto session = keel::Session::create(*env, std::move(graph).value());
  EXPECT_TRUE(session.is_ok()) << session.status().to_string();
  auto out = session.value()->run({{input, x}});
  EXPECT_TRUE(out.is_ok()) << out.status().to_string();
  return out.value();
}

inline std::vector<float> floats_of(const json& data) {
  std::vector<float> v;
  for (const auto& e : data) v.push_back(e.get<float>());
  return v;
}

inline json infer_body(const std::vector<float>& x, int64_t rows) {
  return json{{"inputs", json::array({json{{"name", "x"}, {"datatype", "FP32"}, {"shape", {rows, 4}}, {"data", x}}})}};
}

// A sample of /metrics: the first line that starts with `prefix` (a name and the start of its labels, e.g.
// `keel_inference_count{model="mlp",`); its value, 0 when absent.
inline uint64_t metric(const std::string& text, const std::string& prefix) {
  size_t at = 0;
  while ((at = text.find(prefix, at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') {
      const size_t end = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, end - at);
      return std::stoull(line.substr(line.rfind(' ') + 1));
    }
    at += prefix.size();
  }
  return 0;
}
inline uint64_t metric(const std::string& text, const std::string& name, const std::string& model) {
  return metric(text, name + "{model=\"" + model + "\",");
}

}  // namespace keel_serve_test
