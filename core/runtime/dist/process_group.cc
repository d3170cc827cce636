// keel/core/runtime/dist/process_group.cc — ProcessGroup and the rendezvous check (see process_group.h).
#include "core/runtime/dist/process_group.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

namespace keel::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kDefaultTimeoutMs = 5 * 60 * 1000;

std::atomic<int64_t> g_groups{0};

int64_t ms_left(Clock::time_point deadline) {
  auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return d > 0 ? d : 0;
}

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string s;
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) s += ", ... (" + std::to_string(ranks.size()) + " in all)";
  return s;
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

Status rendezvous_check(Store& store, int32_t rank, int32_t size, int64_t timeout_ms) {
  if (size < 1 || rank < 0 || rank >= size)
    return invalid_argument("rendezvous: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                            " is out of range");
  if (timeout_ms <= 0) timeout_ms = kDefaultTimeoutMs;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::string me = std::to_string(rank);
  const std::string where = store.describe();

  KEEL_ASSIGN_OR_RETURN(int64_t joins, store.add("rdzv/join/" + me, 1), "rendezvous");
  if (joins > 1)
    return Status(StatusCode::kAlreadyExists, "rendezvous: another process already joined as rank " + me + " of " +
                                                  std::to_string(size) + " (duplicate RANK; " + where + ")");
  KEEL_RETURN_IF_ERROR(store.set("rdzv/size/" + me, std::to_string(size)), "rendezvous");

  if (rank != 0) {
    auto w0 = store.get("rdzv/world_size", ms_left(deadline));
    if (!w0.is_ok()) {
      if (w0.status().code() == StatusCode::kDeadlineExceeded)
        return Status(StatusCode::kDeadlineExceeded,
                      "rendezvous: rank 0 never arrived within " + std::to_string(timeout_ms) + " ms (" + where + ")");
      return w0.status().with_context("rendezvous");
    }
    if (*w0 != std::to_string(size))
      return invalid_argument("rendezvous: world size mismatch: rank " + me + " has world size " +
                              std::to_string(size) + ", rank 0 has " + *w0);
  } else {
    KEEL_RETURN_IF_ERROR(store.set("rdzv/world_size", std::to_string(size)), "rendezvous");
  }

  // Wait for everyone, one key at a time so that a timeout can name all who are missing.
  std::vector<std::string> keys;
  for (int32_t r = 0; r < size; ++r) keys.push_back("rdzv/size/" + std::to_string(r));
  Status all = store.wait(keys, ms_left(deadline));
  if (!all.is_ok()) {
    if (all.code() != StatusCode::kDeadlineExceeded) return all.with_context("rendezvous");
    auto again = store.get("rdzv/join/" + me, 0);
    if (again.is_ok() && *again != "1")
      return Status(StatusCode::kAlreadyExists, "rendezvous: " + *again + " processes joined as rank " + me + " of " +
                                                    std::to_string(size) + " (duplicate RANK; " + where + ")");
    std::vector<int32_t> missing;
    std::string duplicates;
    for (int32_t r = 0; r < size; ++r) {
      auto there = store.check({keys[r]});
      if (there.is_ok() && !*there) missing.push_back(r);
      // A rank that joined twice often explains one that never came.
      auto j = store.get("rdzv/join/" + std::to_string(r), 0);
      if (j.is_ok() && *j != "1" && duplicates.size() < 200)
        duplicates += "; rank " + std::to_string(r) + " joined " + *j + " times (duplicate RANK)";
    }
    return Status(StatusCode::kDeadlineExceeded, "rendezvous: rank" + std::string(missing.size() == 1 ? " " : "s ") +
                                                     rank_list(missing) + " of " + std::to_string(size) +
                                                     " never arrived within " + std::to_string(timeout_ms) + " ms" +
                                                     duplicates + " (" + where + ")");
  }

  if (rank == 0) {
    std::string verdict = "ok";
    for (int32_t r = 0; r < size && verdict == "ok"; ++r) {
      KEEL_ASSIGN_OR_RETURN(std::string w, store.get(keys[r], 0), "rendezvous");
      if (w != std::to_string(size))
        verdict = "world size mismatch: rank " + std::to_string(r) + " has world size " + w + ", rank 0 has " +
                  std::to_string(size);
      KEEL_ASSIGN_OR_RETURN(std::string j, store.get("rdzv/join/" + std::to_string(r), 0), "rendezvous");
      if (verdict == "ok" && j != "1")
        verdict = j + " processes joined as rank " + std::to_string(r) + " (duplicate RANK)";
    }
    KEEL_RETURN_IF_ERROR(store.set("rdzv/verdict", verdict), "rendezvous");
    if (verdict != "ok") return invalid_argument("rendezvous: " + verdict);
    return Status::ok();
  }
  auto verdict = store.get("rdzv/verdict", ms_left(deadline));
  if (!verdict.is_ok()) return verdict.status().with_context("rendezvous: waiting for rank 0's verdict");
  if (*verdict != "ok") return invalid_argument("rendezvous (rank 0 found): " + *verdict);
  return Status::ok();
}

StatusOr<const CollectiveEntry*> find_collective(const Environment& env, const std::string& backend) {
  const Registry& reg = env.registry();
  auto has_devices = [&](const CollectiveEntry& c) {
    const DeviceEntry* d = reg.device(c.device_type);
    return d && d->device_count > 0;
  };
  std::string registered;
  for (const auto& c : reg.collectives()) registered += (registered.empty() ? "" : ", ") + c->backend;
  if (registered.empty()) registered = "none";
  if (!backend.empty()) {
    for (const auto& c : reg.collectives())
      if (c->backend == backend) return c.get();
    // A collective plugin of that name that did not load says why (e.g. an invalid option of the Gloo plugin).
    for (const PluginRecord& p : env.plugins())
      if (p.kind == "collective" && p.name == backend && p.state != PluginState::kLoaded)
        return not_found("collective backend '" + backend + "' is not registered: plugin '" + p.name + "' " +
                         plugin_state_name(p.state) + ": " + p.reason);
    return not_found("collective backend '" + backend + "' is not registered (registered: " + registered +
                     "; `keel plugins` says why a plugin was skipped)");
  }
  for (const char* preferred : {"nccl", "gloo"})
    for (const auto& c : reg.collectives())
      if (c->backend == preferred && has_devices(*c)) return c.get();
  for (const auto& c : reg.collectives())
    if (has_devices(*c)) return c.get();
  return not_found("no usable collective backend (registered: " + registered +
                   "); build plugins/gloo (CPU) or plugins/nccl (GPU)");
}

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::create_with_store(Environment& env, std::shared_ptr<Store> store,
                                                                        int32_t rank, int32_t size,
                                                                        const std::string& backend,
                                                                        int32_t device_index, int64_t timeout_ms) {
  if (!store) return invalid_argument("process group: no store");
  if (timeout_ms <= 0) timeout_ms = kDefaultTimeoutMs;
  KEEL_ASSIGN_OR_RETURN(const CollectiveEntry* entry, find_collective(env, backend), "process group");
  // A host collective (Gloo) works on host memory, whatever rank this is: the index, which a program passes as its
  // LOCAL_RANK for GPUs (the header's example), names no device there.
  if (entry->device_type == "cpu") device_index = 0;
  const DeviceEntry* dev = env.registry().device(entry->device_type);
  if (dev && (device_index < 0 || device_index >= dev->device_count))
    return Status(StatusCode::kOutOfRange, "process group: device " + entry->device_type + ":" +
                                               std::to_string(device_index) + " does not exist (" +
                                               std::to_string(dev->device_count) + " present)");
  const auto start = Clock::now();
  KEEL_RETURN_IF_ERROR(rendezvous_check(*store, rank, size, timeout_ms),
                       "process group (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")");
  const int64_t left = std::max<int64_t>(
      1, timeout_ms - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
  std::unique_ptr<ProcessGroup> pg(new ProcessGroup());
  pg->store_ = std::move(store);
  pg->rank_ = rank;
  pg->size_ = size;
  pg->backend_ = entry->backend;
  auto comm = hal::Communicator::create(entry, pg->store_->c_store(), rank, size, device_index, left);
  if (!comm.is_ok())
    return comm.status().with_context("process group (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                      ", " + entry->backend + ")");
  pg->comm_ = std::move(comm).value();
  return pg;
}

StatusOr<std::unique_ptr<ProcessGroup>> ProcessGroup::create(Environment& env, const Identity& id,
                                                             const std::string& backend, int32_t device_index,
                                                             int64_t timeout_ms) {
  if (timeout_ms <= 0) timeout_ms = kDefaultTimeoutMs;
  const std::string attempt = env_or("KEEL_RESTART_COUNT", env_or("TORCHELASTIC_RESTART_COUNT", "0"));
  const std::string prefix = "keel/pg/" + attempt + "/" + std::to_string(g_groups.fetch_add(1));
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> base;
  if (id.world_size == 1) {
    base = std::make_shared<InProcessStore>();
  } else {
    const bool served = std::string(env_or("KEEL_STORE_SERVED", "0")) == "1";
    // Under torchrun its agent's own store (another protocol) holds MASTER_PORT: ours takes the next port.
    int32_t port = id.master_port;
    if (id.source == IdentitySource::kEnv && std::getenv("TORCHELASTIC_USE_AGENT_STORE") && port < 65535) ++port;
    if (id.rank == 0 && !served) {
      auto s = TcpStoreServer::start(id.master_addr, port);
      if (!s.is_ok())
        return s.status().with_context("process group: rank 0 cannot serve the store at MASTER_ADDR:MASTER_PORT");
      server = std::move(s).value();
    }
    auto client = TcpStore::connect(id.master_addr, port, timeout_ms);
    if (!client.is_ok())
      return client.status().with_context("process group (rank " + std::to_string(id.rank) + " of " +
                                          std::to_string(id.world_size) + ")");
    base = std::shared_ptr<Store>(std::move(client).value());
  }
  auto store = std::make_shared<PrefixStore>(std::move(base), prefix);
  auto created = create_with_store(env, std::move(store), id.rank, id.world_size, backend, device_index, timeout_ms);
  if (!created.is_ok()) return created.status();
  std::unique_ptr<ProcessGroup> pg = std::move(created).value();
  pg->server_ = std::move(server);
  spdlog::debug("keel: process group {} ready: {} ({})", prefix, id.to_string(), pg->backend_);
  return pg;
}

ProcessGroup::~ProcessGroup() = default;

}  // namespace keel::dist
