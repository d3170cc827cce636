// `keel conformance` — runs the ONNX backend test suites (model.onnx + test_data_set_*/{input,output}_K.pb) and
// compares every output: floats within rtol 1e-3 + atol 1e-5 with NaN positions equal, integers and bools exact.
//
// Statuses: pass; fail (wrong numbers, dtype or shape); error (the model or a data set does not load, or the run
// fails, or the worker crashed / timed out); unsupported (some node has no kernel on any device — Session::create
// or run answers UNIMPLEMENTED —, the model holds something the IR cannot (string tensors, TYPE_PROTO attributes),
// or a test that draws random numbers (Bernoulli, RandomNormal/Uniform[Like], Multinomial, training-mode Dropout)
// did not match).
//
// Crash isolation: tests run in worker processes forked before any thread exists; each worker runs its share of
// the tests in-process and reports one line per test over a pipe. A worker that dies (signal) or overruns
// --timeout has its current test marked "error" and is restarted after it. --no-fork runs everything in-process.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "core/runtime/onnx_io.h"
#include "core/runtime/session.h"
#include "tools/keel/commands.h"

namespace keel::cli {
namespace {
namespace fs = std::filesystem;

constexpr double kRtol = 1e-3;
constexpr double kAtol = 1e-5;

enum class Outcome { kPass, kFail, kError, kUnsupported };
const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::kPass: return "pass";
    case Outcome::kFail: return "fail";
    case Outcome::kError: return "error";
    case Outcome::kUnsupported: return "unsupported";
  }
  return "?";
}
Outcome outcome_from_name(const std::string& s) {
  if (s == "pass") return Outcome::kPass;
  if (s == "fail") return Outcome::kFail;
  if (s == "unsupported") return Outcome::kUnsupported;
  return Outcome::kError;
}

struct ConfArgs {
  std::string data = "/usr/share/libonnx-testdata/data";
  std::vector<std::string> suites = {"node", "pytorch-converted", "pytorch-operator", "simple"};
  std::string filter;
  std::string report;
  std::string expected;
  std::string write_expected;
  int jobs = 1;
  double timeout_s = 120;
  bool no_fork = false;
  bool verbose = false;
  bool roundtrip = false;
};

struct TestCase {
  std::string suite, name;
  fs::path dir;
  std::string id() const { return suite + "/" + name; }
};

struct Result {
  Outcome outcome = Outcome::kError;
  std::string message;
  double ms = 0;
  bool done = false;
};

std::string one_line(std::string s, size_t max = 400) {
  for (auto& c : s)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

// ----------------------------------------------------------------------------------------------------------------
// Comparison

bool same_integer(const Tensor& a, const Tensor& e, int64_t i) {
  const size_t es = dtype_size(a.dtype());
  const auto* pa = static_cast<const unsigned char*>(a.raw_data()) + i * es;
  const auto* pe = static_cast<const unsigned char*>(e.raw_data()) + i * es;
  if (a.dtype() == DType::kBool) return (*pa != 0) == (*pe != 0);
  return std::memcmp(pa, pe, es) == 0;
}

std::string integer_text(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kI8: return std::to_string(t.data<int8_t>()[i]);
    case DType::kU8: return std::to_string(t.data<uint8_t>()[i]);
    case DType::kI16: return std::to_string(t.data<int16_t>()[i]);
    case DType::kU16: return std::to_string(t.data<uint16_t>()[i]);
    case DType::kI32: return std::to_string(t.data<int32_t>()[i]);
    case DType::kU32: return std::to_string(t.data<uint32_t>()[i]);
    case DType::kI64: return std::to_string(t.data<int64_t>()[i]);
    case DType::kU64: return std::to_string(t.data<uint64_t>()[i]);
    case DType::kBool: return t.data<uint8_t>()[i] ? "true" : "false";
    default: return "?";
  }
}

// Empty when equal within tolerance; otherwise a description of the first mismatch and their count.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype()) {
    return std::string("dtype ") + dtype_name(got.dtype()) + ", expected " + dtype_name(want.dtype());
  }
  if (got.shape() != want.shape()) {
    return "shape " + shape_to_string(got.shape()) + ", expected " + shape_to_string(want.shape());
  }
  const int64_t n = want.numel();
  if (n == 0) return "";
  if (!got.raw_data() || !want.raw_data()) return "no data";
  int64_t bad = 0, first = -1;
  double worst = 0;
  const bool is_float = dtype_is_float(want.dtype());
  for (int64_t i = 0; i < n; ++i) {
    bool ok;
    if (is_float) {
      const double g = element_as_double(got, i), w = element_as_double(want, i);
      if (std::isnan(w) || std::isnan(g)) {
        ok = std::isnan(w) && std::isnan(g);
      } else if (std::isinf(w) || std::isinf(g)) {
        ok = g == w;
      } else {
        const double err = std::fabs(g - w);
        ok = err <= kAtol + kRtol * std::fabs(w);
        if (!ok) worst = std::max(worst, err);
      }
    } else {
      ok = same_integer(got, want, i);
    }
    if (!ok) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os << bad << " of " << n << " elements differ; first at " << first << ": got ";
  if (is_float) {
    os << std::setprecision(7) << element_as_double(got, first) << ", expected " << element_as_double(want, first);
    if (worst > 0) os << "; max abs error " << worst;
  } else {
    os << integer_text(got, first) << ", expected " << integer_text(want, first);
  }
  return os.str();
}

Tensor as_bf16_if_stored_as_u16(Tensor t, DType wanted) {
  if (wanted == DType::kBF16 && t.dtype() == DType::kU16) return Tensor(DType::kBF16, t.shape(), t.storage());
  return t;
}

// Tensors as compare() does; sequences item by item; an optional without element only equals another.
std::string compare_values(const RunValue& got, const RunValue& want) {
  if (got.kind != want.kind) return "got " + got.describe() + ", expected " + want.describe();
  if (got.is_tensor()) return compare(got.tensor, as_bf16_if_stored_as_u16(want.tensor, got.tensor.dtype()));
  if (got.is_sequence()) {
    if (got.sequence.size() != want.sequence.size()) {
      return "a sequence of " + std::to_string(got.sequence.size()) + " items, expected " +
             std::to_string(want.sequence.size());
    }
    for (size_t i = 0; i < got.sequence.size(); ++i) {
      std::string d = compare(got.sequence[i], as_bf16_if_stored_as_u16(want.sequence[i], got.sequence[i].dtype()));
      if (!d.empty()) return "item " + std::to_string(i) + ": " + d;
    }
  }
  return "";
}

// ----------------------------------------------------------------------------------------------------------------
// One test

std::string random_op(const Graph& g) {
  static const std::set<std::string> kRandom = {"Bernoulli",     "RandomNormal",      "RandomNormalLike",
                                                "RandomUniform", "RandomUniformLike", "Multinomial"};
  for (NodeId id : g.node_ids()) {
    const Node* n = g.node(id);
    if (n->domain.empty() && kRandom.count(n->op_type)) return n->op_type;
    // Dropout draws a mask in training mode (opset 12+: a third input, training_mode).
    if (n->domain.empty() && n->op_type == "Dropout" && n->inputs.size() >= 3 && !n->inputs[2].empty())
      return "Dropout";
    for (const auto& [k, a] : n->attrs)
      if (a.g) {
        std::string r = random_op(*a.g);
        if (!r.empty()) return r;
      }
  }
  return "";
}

Outcome outcome_for(const Status& s) {
  return s.code() == StatusCode::kUnimplemented ? Outcome::kUnsupported : Outcome::kError;
}

std::vector<fs::path> numbered_files(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (int k = 0;; ++k) {
    fs::path p = dir / (prefix + std::to_string(k) + ".pb");
    std::error_code ec;
    if (!fs::exists(p, ec)) break;
    out.push_back(p);
  }
  return out;
}

Result run_test(Environment& env, const TestCase& tc, bool roundtrip) {
  Result r;
  OnnxLoadOptions lo;
  lo.warn = [](const std::string&) {};
  auto loaded = load_onnx(tc.dir / "model.onnx", lo);
  if (!loaded.is_ok()) {
    r.outcome = outcome_for(loaded.status());
    r.message = "load: " + loaded.status().to_string();
    return r;
  }
  Graph graph = std::move(loaded).value();
  if (roundtrip) {
    // Export and import again: what runs is what save_onnx would have written.
    auto bytes = serialize_onnx(graph);
    if (!bytes.is_ok()) {
      r.outcome = Outcome::kError;
      r.message = "export: " + bytes.status().to_string();
      return r;
    }
    auto again = load_onnx_from_memory(bytes->data(), bytes->size(), tc.dir, lo, "re-imported " + tc.id());
    if (!again.is_ok()) {
      r.outcome = Outcome::kError;
      r.message = "re-import: " + again.status().to_string();
      return r;
    }
    graph = std::move(again).value();
  }
  const std::string random = random_op(graph);
  const std::vector<std::string> graph_inputs = graph.inputs;
  std::map<std::string, ValueInfo> input_types;
  for (const auto& name : graph_inputs) {
    const ValueInfo* vi = graph.info(name);
    if (!vi || vi->dtype == DType::kUndefined) {
      // Maps, sparse tensors, untyped inputs: the IR holds tensors, sequences and optionals.
      r.outcome = Outcome::kUnsupported;
      r.message = "input '" + name + "' has a type Keel does not represent";
      return r;
    }
    input_types[name] = *vi;
  }
  std::vector<ValueInfo> output_types;
  for (const auto& name : graph.outputs) output_types.push_back(graph.info(name) ? *graph.info(name) : ValueInfo{});

  auto session = Session::create(env, std::move(graph), SessionOptions{});
  if (!session.is_ok()) {
    r.outcome = outcome_for(session.status());
    r.message = "session: " + session.status().to_string();
    return r;
  }
  std::vector<fs::path> sets;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tc.dir, ec)) {
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  }
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) {
    r.outcome = Outcome::kError;
    r.message = "no test_data_set_* directory";
    return r;
  }
  for (const auto& set : sets) {
    const std::string set_name = set.filename().string();
    std::vector<std::pair<std::string, RunValue>> inputs;
    auto in_files = numbered_files(set, "input_");
    for (size_t k = 0; k < in_files.size(); ++k) {
      std::string name;
      // The file's kind (tensor, sequence, optional) is what the model declares for that position.
      const ValueInfo* declared = k < graph_inputs.size() ? &input_types[graph_inputs[k]] : nullptr;
      auto t = read_value_file(in_files[k], declared, &name);
      if (!t.is_ok()) {
        r.outcome = outcome_for(t.status());
        r.message = set_name + ": " + t.status().to_string();
        return r;
      }
      // Data files name their value; fall back to graph-input order for unnamed ones.
      if (std::find(graph_inputs.begin(), graph_inputs.end(), name) == graph_inputs.end()) {
        if (k >= graph_inputs.size()) {
          r.outcome = Outcome::kError;
          r.message = set_name + ": more input files than graph inputs";
          return r;
        }
        name = graph_inputs[k];
      }
      // The ONNX test data stores bfloat16 as uint16 (NumPy has no bfloat16): same bits, reinterpret.
      RunValue v = std::move(t).value();
      if (v.is_tensor()) v.tensor = as_bf16_if_stored_as_u16(std::move(v.tensor), input_types[name].dtype);
      inputs.emplace_back(name, std::move(v));
    }
    auto outputs = (*session)->run_values(inputs);
    if (!outputs.is_ok()) {
      r.outcome = outcome_for(outputs.status());
      r.message = set_name + ": run: " + outputs.status().to_string();
      return r;
    }
    auto out_files = numbered_files(set, "output_");
    if (out_files.size() != outputs->size()) {
      r.outcome = Outcome::kFail;
      r.message =
          set_name + ": " + std::to_string(outputs->size()) + " outputs, expected " + std::to_string(out_files.size());
      return r;
    }
    for (size_t k = 0; k < out_files.size(); ++k) {
      auto want = read_value_file(out_files[k], k < output_types.size() ? &output_types[k] : nullptr);
      if (!want.is_ok()) {
        r.outcome = outcome_for(want.status());
        r.message = set_name + ": " + want.status().to_string();
        return r;
      }
      std::string diff = compare_values((*outputs)[k], *want);
      if (!diff.empty()) {
        const auto& names = (*session)->output_names();
        r.outcome = random.empty() ? Outcome::kFail : Outcome::kUnsupported;
        r.message =
            set_name + ": output " + std::to_string(k) + " '" + (k < names.size() ? names[k] : "") + "': " + diff;
        if (!random.empty()) r.message = "draws random numbers (" + random + "); " + r.message;
        return r;
      }
    }
  }
  r.outcome = Outcome::kPass;
  return r;
}

Result run_test_guarded(Environment& env, const TestCase& tc, bool roundtrip) {
  auto t0 = std::chrono::steady_clock::now();
  Result r;
  try {
    r = run_test(env, tc, roundtrip);
  } catch (const std::exception& e) {
    r.outcome = Outcome::kError;
    r.message = std::string("exception: ") + e.what();
  }
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.message = one_line(r.message);
  r.done = true;
  return r;
}

// ----------------------------------------------------------------------------------------------------------------
// Workers

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(n);
  }
}

// Runs tests[i] for i = first, first + stride, ... and reports "B i" before and "R i\tstatus\tms\tmessage" after.
[[noreturn]] void worker_main(int fd, const std::vector<TestCase>& tests, size_t first, size_t stride, Globals g,
                              bool roundtrip) {
  auto env = make_environment(g);
  if (!env) _exit(4);
  for (size_t i = first; i < tests.size(); i += stride) {
    write_all(fd, "B " + std::to_string(i) + "\n");
    Result r = run_test_guarded(*env, tests[i], roundtrip);
    std::ostringstream os;
    os << "R " << i << "\t" << outcome_name(r.outcome) << "\t" << r.ms << "\t" << r.message << "\n";
    write_all(fd, os.str());
  }
  env.reset();
  _exit(0);
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
  size_t next = 0;  // the next index this worker will run
  size_t stride = 1;
  long inflight = -1;  // index of the test in progress, -1 when none
  std::chrono::steady_clock::time_point started;
  std::string buffer;
};

bool spawn(Worker& w, const std::vector<TestCase>& tests, const Globals& g, bool roundtrip) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  std::cout.flush();
  std::cerr.flush();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return false;
  }
  if (pid == 0) {
    ::close(fds[0]);
    worker_main(fds[1], tests, w.next, w.stride, g, roundtrip);
  }
  ::close(fds[1]);
  w.pid = pid;
  w.fd = fds[0];
  w.inflight = -1;
  w.buffer.clear();
  return true;
}

void run_forked(const std::vector<TestCase>& tests, std::vector<Result>& results, const ConfArgs& a, Globals g,
                const std::function<void(size_t)>& on_result) {
  const size_t n = std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(std::max(a.jobs, 1)), tests.size()));
  if (n > 1 && g.threads == 0) g.threads = 1;  // parallel workers: one kernel thread each
  std::vector<Worker> workers(n);
  for (size_t w = 0; w < n; ++w) {
    workers[w].next = w;
    workers[w].stride = n;
  }
  auto start_worker = [&](Worker& w) {
    while (w.next < tests.size()) {
      if (spawn(w, tests, g, a.roundtrip)) return;
      // fork failed: record it and move on rather than stop the run
      results[w.next].outcome = Outcome::kError;
      results[w.next].message = "could not start a worker process";
      results[w.next].done = true;
      on_result(w.next);
      w.next += w.stride;
    }
  };
  for (auto& w : workers) start_worker(w);
  auto handle_line = [&](Worker& w, const std::string& line) {
    if (line.rfind("B ", 0) == 0) {
      w.inflight = std::stol(line.substr(2));
      w.started = std::chrono::steady_clock::now();
    } else if (line.rfind("R ", 0) == 0) {
      std::istringstream is(line.substr(2));
      std::string idx, status, ms, msg;
      std::getline(is, idx, '\t');
      std::getline(is, status, '\t');
      std::getline(is, ms, '\t');
      std::getline(is, msg);
      size_t i = std::stoul(idx);
      if (i < results.size()) {
        results[i].outcome = outcome_from_name(status);
        results[i].ms = std::atof(ms.c_str());
        results[i].message = msg;
        results[i].done = true;
        w.next = i + w.stride;
        on_result(i);
      }
      w.inflight = -1;
    }
  };
  while (true) {
    std::vector<pollfd> pfds;
    std::vector<Worker*> live;
    for (auto& w : workers)
      if (w.fd >= 0) {
        pfds.push_back({w.fd, POLLIN, 0});
        live.push_back(&w);
      }
    if (pfds.empty()) break;
    int rc = ::poll(pfds.data(), pfds.size(), 1000);
    if (rc < 0 && errno != EINTR) break;
    for (size_t k = 0; k < live.size(); ++k) {
      Worker& w = *live[k];
      bool ended = false;
      std::string why;
      if (rc > 0 && (pfds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[65536];
        ssize_t got = ::read(w.fd, buf, sizeof buf);
        if (got > 0) {
          w.buffer.append(buf, static_cast<size_t>(got));
          size_t pos;
          while ((pos = w.buffer.find('\n')) != std::string::npos) {
            handle_line(w, w.buffer.substr(0, pos));
            w.buffer.erase(0, pos + 1);
          }
        } else if (got == 0 || (got < 0 && errno != EINTR)) {
          ended = true;
        }
      }
      if (!ended && w.inflight >= 0 &&
          std::chrono::duration<double>(std::chrono::steady_clock::now() - w.started).count() > a.timeout_s) {
        ::kill(w.pid, SIGKILL);
        why = "timed out after " + std::to_string(static_cast<int>(a.timeout_s)) + " s";
        ended = true;
      }
      if (!ended) continue;
      ::close(w.fd);
      w.fd = -1;
      int wstatus = 0;
      ::waitpid(w.pid, &wstatus, 0);
      if (why.empty()) {
        if (WIFSIGNALED(wstatus)) why = std::string("crashed: ") + strsignal(WTERMSIG(wstatus));
        else if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
          why = "worker exited with status " + std::to_string(WEXITSTATUS(wstatus));
      }
      if (w.inflight >= 0) {
        size_t i = static_cast<size_t>(w.inflight);
        results[i].outcome = Outcome::kError;
        results[i].message = why.empty() ? "worker ended during the test" : why;
        results[i].ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w.started).count();
        results[i].done = true;
        on_result(i);
        w.next = i + w.stride;
        w.inflight = -1;
        start_worker(w);
      } else if (w.next < tests.size()) {
        // Died between tests (e.g. the environment could not start): mark the rest of its share.
        for (size_t i = w.next; i < tests.size(); i += w.stride) {
          results[i].outcome = Outcome::kError;
          results[i].message = "worker failed: " + (why.empty() ? std::string("no result") : why);
          results[i].done = true;
          on_result(i);
        }
        w.next = tests.size();
      }
    }
  }
}

// ----------------------------------------------------------------------------------------------------------------

std::vector<std::string> read_name_list(const std::string& file, bool& ok) {
  std::vector<std::string> out;
  std::ifstream in(file);
  ok = static_cast<bool>(in);
  std::string line;
  while (std::getline(in, line)) {
    auto hash = line.find('#');
    if (hash != std::string::npos) line.erase(hash);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t b = 0;
    while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
    if (b < line.size()) out.push_back(line.substr(b));
  }
  return out;
}

int conformance(const ConfArgs& a, Globals& g) {
  std::vector<TestCase> tests;
  for (const auto& suite : a.suites) {
    fs::path sdir = fs::path(a.data) / suite;
    std::error_code ec;
    if (!fs::is_directory(sdir, ec)) {
      std::cerr << "keel conformance: no suite '" << suite << "' under " << a.data << "\n";
      return 1;
    }
    std::vector<TestCase> in_suite;
    for (const auto& e : fs::directory_iterator(sdir, ec)) {
      if (!e.is_directory()) continue;
      TestCase tc{suite, e.path().filename().string(), e.path()};
      if (!a.filter.empty() && tc.id().find(a.filter) == std::string::npos) continue;
      if (!fs::exists(e.path() / "model.onnx")) continue;
      in_suite.push_back(std::move(tc));
    }
    std::sort(in_suite.begin(), in_suite.end(), [](const TestCase& x, const TestCase& y) { return x.name < y.name; });
    tests.insert(tests.end(), in_suite.begin(), in_suite.end());
  }
  std::vector<Result> results(tests.size());
  auto t0 = std::chrono::steady_clock::now();
  size_t finished = 0;
  auto on_result = [&](size_t i) {
    ++finished;
    if (a.verbose) {
      std::cout << std::left << std::setw(11) << outcome_name(results[i].outcome) << " " << tests[i].id() << " ("
                << std::fixed << std::setprecision(1) << results[i].ms << " ms)"
                << (results[i].message.empty() ? "" : "  " + results[i].message) << "\n";
    }
  };
  if (a.no_fork) {
    auto env = make_environment(g);
    if (!env) return 1;
    for (size_t i = 0; i < tests.size(); ++i) {
      results[i] = run_test_guarded(*env, tests[i], a.roundtrip);
      on_result(i);
    }
  } else {
    run_forked(tests, results, a, g, on_result);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Report.
  if (!a.report.empty()) {
    std::ofstream out(a.report);
    if (!out) {
      std::cerr << "keel conformance: cannot write '" << a.report << "'\n";
      return 1;
    }
    out << "suite\ttest\tstatus\tmessage\n";
    for (size_t i = 0; i < tests.size(); ++i) {
      out << tests[i].suite << "\t" << tests[i].name << "\t" << outcome_name(results[i].outcome) << "\t"
          << one_line(results[i].message, 2000) << "\n";
    }
  }
  std::vector<std::string> passed;
  for (size_t i = 0; i < tests.size(); ++i)
    if (results[i].outcome == Outcome::kPass) passed.push_back(tests[i].id());
  std::sort(passed.begin(), passed.end());
  if (!a.write_expected.empty()) {
    std::ofstream out(a.write_expected);
    if (!out) {
      std::cerr << "keel conformance: cannot write '" << a.write_expected << "'\n";
      return 1;
    }
    out << "# ONNX backend tests expected to pass (suite/test), generated by `keel conformance --write-expected`.\n"
        << "# CI fails when one of them does not pass; the list only grows.\n";
    for (const auto& p : passed) out << p << "\n";
  }

  // Per-suite table.
  struct Counts {
    int total = 0, pass = 0, fail = 0, error = 0, unsupported = 0;
  };
  std::map<std::string, Counts> per_suite;
  Counts all;
  for (size_t i = 0; i < tests.size(); ++i) {
    for (Counts* c : {&per_suite[tests[i].suite], &all}) {
      c->total++;
      switch (results[i].outcome) {
        case Outcome::kPass: c->pass++; break;
        case Outcome::kFail: c->fail++; break;
        case Outcome::kError: c->error++; break;
        case Outcome::kUnsupported: c->unsupported++; break;
      }
    }
  }
  auto row = [](const std::string& name, const Counts& c) {
    std::cout << std::left << std::setw(20) << name << std::right << std::setw(7) << c.total << std::setw(7) << c.pass
              << std::setw(7) << c.fail << std::setw(7) << c.error << std::setw(13) << c.unsupported << std::setw(9)
              << std::fixed << std::setprecision(1) << (c.total ? 100.0 * c.pass / c.total : 0.0) << "%\n";
  };
  std::cout << std::left << std::setw(20) << "suite" << std::right << std::setw(7) << "tests" << std::setw(7) << "pass"
            << std::setw(7) << "fail" << std::setw(7) << "error" << std::setw(13) << "unsupported" << std::setw(10)
            << "passed"
            << "\n";
  for (const auto& suite : a.suites)
    if (per_suite.count(suite)) row(suite, per_suite[suite]);
  row("all", all);
  std::cout << "time: " << std::fixed << std::setprecision(1) << secs << " s\n";

  int rc = 0;
  if (!a.expected.empty()) {
    bool ok = false;
    auto expected = read_name_list(a.expected, ok);
    if (!ok) {
      std::cerr << "keel conformance: cannot read '" << a.expected << "'\n";
      return 1;
    }
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < tests.size(); ++i) index[tests[i].id()] = i;
    std::vector<std::string> regressions;
    for (const auto& name : expected) {
      const std::string suite = name.substr(0, name.find('/'));
      if (std::find(a.suites.begin(), a.suites.end(), suite) == a.suites.end()) continue;
      if (!a.filter.empty() && name.find(a.filter) == std::string::npos) continue;
      auto it = index.find(name);
      if (it == index.end()) {
        regressions.push_back(name + "\tmissing (no such test in " + a.data + ")");
      } else if (results[it->second].outcome != Outcome::kPass) {
        regressions.push_back(name + "\t" + outcome_name(results[it->second].outcome) + "\t" +
                              results[it->second].message);
      }
    }
    if (!regressions.empty()) {
      std::cout << regressions.size() << " test(s) expected to pass did not (" << a.expected << "):\n";
      for (const auto& r : regressions) std::cout << "  " << r << "\n";
      rc = 3;
    } else {
      std::cout << "all " << expected.size() << " expected tests passed\n";
    }
  }
  std::cout << "conformance: " << all.pass << " passed, " << all.fail << " failed, " << all.error << " errors, "
            << all.unsupported << " unsupported" << std::endl;
  return rc;
}

}  // namespace

void add_conformance_command(CLI::App& app, Globals& g) {
  auto a = std::make_shared<ConfArgs>();
  auto* cmd = app.add_subcommand("conformance", "Run the ONNX backend test suites and compare every output");
  cmd->add_option("--data", a->data, "Directory holding the suites")->capture_default_str();
  cmd->add_option("--suite", a->suites, "Suites to run, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--filter", a->filter, "Only tests whose 'suite/test' name contains this");
  cmd->add_option("--report", a->report, "Write a TSV report: suite, test, status, message");
  cmd->add_option("--expected", a->expected, "File of 'suite/test' names expected to pass; exit 3 if one does not");
  cmd->add_option("--write-expected", a->write_expected, "Write the sorted names of the passing tests to this file");
  cmd->add_option("--jobs,-j", a->jobs, "Worker processes")->check(kPositive)->capture_default_str();
  cmd->add_option("--timeout", a->timeout_s, "Seconds one test may take before its worker is killed")
      ->check(kPositive)
      ->capture_default_str();
  cmd->add_flag("--no-fork", a->no_fork, "Run every test in this process (no crash isolation)");
  cmd->add_flag("--verbose,-v", a->verbose, "Print every test's result as it finishes");
  cmd->add_flag("--roundtrip", a->roundtrip, "Export each model to ONNX and import it again before running it");
  cmd->callback([a, &g] {
    int rc = conformance(*a, g);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace keel::cli
