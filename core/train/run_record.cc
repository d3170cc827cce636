// keel/core/train/run_record.cc — see run_record.h.
#include "core/train/run_record.h"

#include <keel/keel.h>
#include <keel/plugin.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "core/base/thread_pool.h"
#include "core/train/source_revision.h"  // generated: KEEL_SOURCE_REVISION (cmake/source_revision.cmake)

namespace keel::train {
namespace {

// FIPS 180-4 SHA-256.
class Sha256 {
 public:
  void update(const uint8_t* p, size_t n) {
    bits_ += static_cast<uint64_t>(n) * 8;
    while (n > 0) {
      const size_t take = std::min(n, size_t{64} - fill_);
      std::copy(p, p + take, buf_.begin() + static_cast<std::ptrdiff_t>(fill_));
      fill_ += take, p += take, n -= take;
      if (fill_ == 64) block(buf_.data()), fill_ = 0;
    }
  }
  std::string hex() {
    const uint64_t bits = bits_;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (uint32_t w : h_)
      for (int s = 28; s >= 0; s -= 4) out += digits[(w >> s) & 0xf];
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t{p[4 * i]} << 24 | uint32_t{p[4 * i + 1]} << 16 | uint32_t{p[4 * i + 2]} << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += b, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
  std::array<uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> buf_{};
  size_t fill_ = 0;
  uint64_t bits_ = 0;
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
  h.update(static_cast<const uint8_t*>(data), size);
  return h.hex();
}

StatusOr<std::string> sha256_file(const std::filesystem::path& file) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return Status(StatusCode::kNotFound, "cannot open " + file.string() + " to compute its SHA-256");
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    h.update(reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) return Status(StatusCode::kInternal, "reading " + file.string() + " failed");
  return h.hex();
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
