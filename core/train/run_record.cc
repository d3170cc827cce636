// keel/core/train/run_record.cc — see run_record.h.
#include "core/train/run_record.h"

#include <keel/keel.h>
#include <keel/plugin.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/base/thread_pool.h"
#include "core/train/source_revision.h"  // generated: KEEL_SOURCE_REVISION (cmake/source_revision.cmake)

namespace keel::train {
namespace {

// SHA-256 by OpenSSL's libcrypto (its SHA extensions / AVX2 code where the CPU has them: the data files of a `keel
// train` run, 30 MB, took 0.15-0.2 s of a core in the portable code this replaced).
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) ctx_.reset();
  }
  // False where OpenSSL could not set up the digest (out of memory); update() and hex() then do nothing.
  bool ok() const { return ctx_ != nullptr; }
  void update(const void* p, size_t n) {
    if (ctx_ && EVP_DigestUpdate(ctx_.get(), p, n) != 1) ctx_.reset();
  }
  // The digest in lowercase hex, or "" after a failure.
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (!ctx_ || EVP_DigestFinal_ex(ctx_.get(), md, &len) != 1) return "";
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < len; ++i) out += digits[md[i] >> 4], out += digits[md[i] & 0xf];
    return out;
  }

 private:
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx_;
};

const char* state_name(PluginState s) {
  switch (s) {
    case PluginState::kLoaded: return "loaded";
    case PluginState::kSkipped: return "skipped";
    default: return "failed";
  }
}

}  // namespace

std::string sha256_hex(const void* data, size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.hex();
}

StatusOr<std::string> sha256_file(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return Status(StatusCode::kNotFound, "cannot open " + file.string() + " to compute its SHA-256");
  Sha256 h;
  if (!h.ok()) return Status(StatusCode::kOutOfMemory, "SHA-256 of " + file.string() + ": no memory for the digest");
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(buf.data(), static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) return Status(StatusCode::kInternal, "reading " + file.string() + " failed");
  std::string digest = h.hex();
  if (digest.empty()) return Status(StatusCode::kInternal, "SHA-256 of " + file.string() + " failed in OpenSSL");
  return digest;
}

StatusOr<nlohmann::json> describe_data_files(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    if (ec) return Status(StatusCode::kInternal, "listing " + path.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path, ec)) {
    files.push_back(path);
  } else {
    return Status(StatusCode::kNotFound, "data set path " + path.string() + " is neither a file nor a directory");
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : files) {
    KEEL_ASSIGN_OR_RETURN(std::string digest, sha256_file(f), "data set");
    out.push_back({{"name", f.filename().string()}, {"bytes", fs::file_size(f, ec)}, {"sha256", digest}});
  }
  return out;
}

nlohmann::json build_info() {
  return {{"version", KEEL_VERSION_STRING},
          {"source_revision", KEEL_SOURCE_REVISION},
          {"plugin_abi", std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." + std::to_string(KEEL_PLUGIN_ABI_MINOR)}};
}

nlohmann::json environment_info(Environment& env) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = 0;
  nlohmann::json devices = nlohmann::json::array(), plugins = nlohmann::json::array();
  for (const auto& d : env.registry().devices()) {
    std::string plugin = "(built-in)";
    for (const auto& p : env.plugins())
      if (p.id == d->plugin) plugin = p.name;
    devices.push_back({{"type", d->device_type}, {"count", d->device_count}, {"plugin", plugin}});
  }
  for (const auto& p : env.plugins()) {
    nlohmann::json j = {{"name", p.name}, {"version", p.version}, {"kind", p.kind}, {"state", state_name(p.state)}};
    if (!p.reason.empty()) j["reason"] = p.reason;
    plugins.push_back(std::move(j));
  }
  return {
      {"hostname", host}, {"threads", env.thread_pool().thread_count()}, {"devices", devices}, {"plugins", plugins}};
}

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

nlohmann::json Histogram::to_json() const {
  return {{"lo", lo}, {"hi", hi}, {"mean", mean}, {"std", stddev}, {"counts", counts}, {"nonfinite", nonfinite}};
}

Histogram histogram(const eager::Tensor& t, int bins) {
  Histogram h;
  bins = std::max(1, bins);
  h.counts.assign(static_cast<size_t>(bins), 0);
  if (!t.defined() || t.numel() == 0) return h;
  eager::NoGradGuard ng;
  eager::Tensor host = t.detach();
  if (host.device() != "cpu") host = host.to("cpu");
  if (host.dtype() != DType::kF32) host = host.to(DType::kF32);
  const std::vector<float> v = host.to_vector<float>();
  double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
  int64_t n = 0;
  for (float x : v) {
    if (!std::isfinite(x)) {
      ++h.nonfinite;
      continue;
    }
    lo = std::min(lo, static_cast<double>(x)), hi = std::max(hi, static_cast<double>(x));
    sum += x, sq += static_cast<double>(x) * x, ++n;
  }
  if (n == 0) return h;
  h.lo = lo, h.hi = hi, h.mean = sum / static_cast<double>(n);
  h.stddev = std::sqrt(std::max(0.0, sq / static_cast<double>(n) - h.mean * h.mean));
  const double width = (hi - lo) / bins;
  for (float x : v) {
    if (!std::isfinite(x)) continue;
    int b = width > 0 ? static_cast<int>((x - lo) / width) : 0;
    ++h.counts[static_cast<size_t>(std::clamp(b, 0, bins - 1))];
  }
  return h;
}

nlohmann::json module_histograms(const nn::Module& model, bool grads, int bins) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, p] : model.named_parameters()) {
    if (grads) {
      eager::Tensor g = p.grad();
      if (g.defined()) out[name] = histogram(g, bins).to_json();
    } else {
      out[name] = histogram(p, bins).to_json();
    }
  }
  return out;
}

RunRecord::RunRecord() {
  j_ = {{"format", "keel-run/1"},
        {"keel", build_info()},
        {"start_time", utc_now()},
        {"status", "running"},
        {"epochs", nlohmann::json::array()}};
}

void RunRecord::finish(nlohmann::json final_metrics, const std::string& error) {
  j_["end_time"] = utc_now();
  j_["final"] = std::move(final_metrics);
  j_["status"] = error.empty() ? "completed" : "failed";
  if (!error.empty()) j_["error"] = error;
}

Status RunRecord::save(const std::filesystem::path& file) const {
  const std::filesystem::path tmp = file.string() + ".tmp" + std::to_string(getpid());
  if (file.has_parent_path()) {  // a run's own folder (runs/kd/run.json) is created on first save
    std::error_code dir_ec;
    std::filesystem::create_directories(file.parent_path(), dir_ec);
  }
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status(StatusCode::kInvalidArgument, "cannot write the run record " + tmp.string());
    f << j_.dump(2) << "\n";
    if (!f.flush()) return Status(StatusCode::kInternal, "writing the run record " + tmp.string() + " failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Status(StatusCode::kInternal, "cannot rename the run record to " + file.string());
  }
  return Status::ok();
}

StatusOr<RunRecord> RunRecord::load(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return Status(StatusCode::kNotFound, "cannot open the run record " + file.string());
  std::stringstream ss;
  ss << f.rdbuf();
  RunRecord r;
  r.j_ = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (!r.j_.is_object() || !r.j_.contains("format"))
    return Status(StatusCode::kInvalidArgument,
                  file.string() + " is not a Keel run record (JSON object with \"format\")");
  return r;
}

}  // namespace keel::train
