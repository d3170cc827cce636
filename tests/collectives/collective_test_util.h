// collective_test_util.h — what the collective tests share: the gloo plugin loaded through the core, an in-process
// key-value store (ranks as threads) and a directory-backed one (ranks as processes).
//
// Thread-safety: KvStore may be used from any number of threads; FileStore from any number of processes (one
// object per process), each object from one thread at a time.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "core/runtime/environment.h"
#include "hal/device.h"

namespace keel::testing {

// An in-process rendezvous store (keel_kv_store_t): values never change once set.
struct KvStore {
  keel_kv_store_t c{};
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;

  KvStore() {
    c.struct_size = sizeof c;
    c.core_data = this;
    c.set = [](keel_kv_store_t* self, const char* key, const void* value, size_t size) -> keel_status_t {
      auto* s = static_cast<KvStore*>(self->core_data);
      {
        std::lock_guard<std::mutex> lock(s->mu);
        s->kv[key] = std::string(static_cast<const char*>(value), size);
      }
      s->cv.notify_all();
      return nullptr;
    };
    c.get = [](keel_kv_store_t* self, const char* key, int64_t timeout_ms, const void** out,
               size_t* size) -> keel_status_t {
      auto* s = static_cast<KvStore*>(self->core_data);
      std::unique_lock<std::mutex> lock(s->mu);
      const std::string k(key);
      if (!s->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms),
                          [&] { return s->kv.count(k) > 0; }))
        return make_c_status(KEEL_STATUS_DEADLINE_EXCEEDED, ("key '" + k + "' not set in time").c_str());
      *out = s->kv[k].data();
      *size = s->kv[k].size();
      return nullptr;
    };
  }
};

// A store over a directory shared by several processes: one file per key ('/' becomes '%'), written to a temporary
// name and renamed, so a reader sees a whole value or none. get polls every millisecond up to its timeout.
struct FileStore {
  keel_kv_store_t c{};
  std::string dir;
  std::map<std::string, std::string> values;  // what get handed out, kept until the store goes

  explicit FileStore(std::string directory) : dir(std::move(directory)) {
    c.struct_size = sizeof c;
    c.core_data = this;
    c.set = [](keel_kv_store_t* self, const char* key, const void* value, size_t size) -> keel_status_t {
      auto* s = static_cast<FileStore*>(self->core_data);
      const std::string path = s->path(key), tmp = path + ".tmp." + std::to_string(::getpid());
      {
        std::ofstream f(tmp, std::ios::binary);
        f.write(static_cast<const char*>(value), static_cast<std::streamsize>(size));
        if (!f) return make_c_status(KEEL_STATUS_UNAVAILABLE, ("cannot write " + tmp).c_str());
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0)
        return make_c_status(KEEL_STATUS_UNAVAILABLE, ("cannot rename to " + path).c_str());
      return nullptr;
    };
    c.get = [](keel_kv_store_t* self, const char* key, int64_t timeout_ms, const void** out,
               size_t* size) -> keel_status_t {
      auto* s = static_cast<FileStore*>(self->core_data);
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
      const std::string path = s->path(key);
      for (;;) {
        std::ifstream f(path, std::ios::binary);
        if (f) {
          std::stringstream ss;
          ss << f.rdbuf();
          std::string& v = s->values[key];
          v = ss.str();
          *out = v.data();
          *size = v.size();
          return nullptr;
        }
        if (std::chrono::steady_clock::now() >= deadline)
          return make_c_status(KEEL_STATUS_DEADLINE_EXCEEDED,
                               ("key '" + std::string(key) + "' not set in time").c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    };
  }
  std::string path(const std::string& key) const {
    std::string k = key;
    for (char& ch : k)
      if (ch == '/') ch = '%';
    return dir + "/" + k;
  }
};

// The environment with the plugins of the build tree, and the gloo collective entry (NULL with the reason).
struct Gloo {
  std::unique_ptr<Environment> env;
  const CollectiveEntry* entry = nullptr;
  std::string why;  // empty when usable
};

inline Gloo& gloo() {
  static Gloo g = [] {
    Gloo r;
    auto env = Environment::create();
    if (!env.is_ok()) {
      r.why = env.status().to_string();
      return r;
    }
    r.env = std::move(env).value();
    for (const auto& c : r.env->registry().collectives())
      if (c->backend == "gloo") r.entry = c.get();
    if (!r.entry) {
      r.why = "the gloo plugin is not loaded (not built: no libgloo-dev)";
      for (const auto& p : r.env->plugins())
        if (p.name == "gloo") r.why = "gloo plugin " + std::string(p.reason.empty() ? "not loaded" : p.reason);
    }
    return r;
  }();
  return g;
}

}  // namespace keel::testing
