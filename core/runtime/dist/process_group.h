// keel/core/runtime/dist/process_group.h — a group of ranks: the rendezvous store plus a collective communicator.
//
// ProcessGroup::create() is what a data-parallel program calls once per process:
//   auto id = keel::dist::identity_from_env();                      // RANK/WORLD_SIZE/... (identity.h)
//   auto pg = keel::dist::ProcessGroup::create(*env, *id, "", id->local_rank, 60000);
//   pg.value()->comm().all_reduce(...);
// With more than one rank, rank 0 serves the TCP store at MASTER_ADDR:MASTER_PORT unless KEEL_STORE_SERVED=1 says
// the launcher (`keel launch`) already serves it; every rank connects to it as a client (under torchrun, whose agent
// serves its own store at MASTER_PORT when TORCHELASTIC_USE_AGENT_STORE is set, at MASTER_PORT + 1). Keys of a group
// live under "keel/pg/<attempt>/<n>/" (attempt: KEEL_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT, so that a
// restarted job never reads the keys of the attempt before; n counts the groups this process created, so every rank
// must create its groups in the same order).
//
// The rendezvous check (rendezvous_check below) runs before the communicator is created: a wrong world size between
// ranks, a duplicate rank or a rank that never arrives within the timeout is an error naming what and who, on every
// rank that can tell.
//
// Thread-safety: a ProcessGroup may be shared across threads as far as its Communicator allows (collectives of one
// communicator must be issued in the same order on every rank, so one thread at a time issues them).
// Lifetime: it must not outlive the Environment it was created from (the collective plugin lives there).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/base/status.h"
#include "core/runtime/dist/identity.h"
#include "core/runtime/dist/store.h"
#include "core/runtime/environment.h"
#include "hal/device.h"

namespace keel::dist {

class ProcessGroup {
 public:
  // backend: "gloo", "nccl", or "" = by device (nccl when an nccl collective is registered and its device type has
  // devices, else gloo, else any collective whose device type has devices). device_index: the card the
  // communicator works on (its LOCAL_RANK for GPUs; ignored by gloo). timeout_ms bounds reaching the store, the
  // rendezvous and the communicator's own set-up (<= 0: 5 minutes).
  // Errors: NOT_FOUND when the backend is not registered (naming those that are), OUT_OF_RANGE for a device index
  // the backend's device type does not have, the store's errors (port in use, server unreachable: naming the
  // address), the rendezvous check's errors, then the collective plugin's.
  static StatusOr<std::unique_ptr<ProcessGroup>> create(Environment& env, const Identity& id,
                                                        const std::string& backend, int32_t device_index,
                                                        int64_t timeout_ms);
  // The same over a store the caller provides (shared by ranks in one process, e.g. threads in tests). The store's
  // keys are used as they are: give each group its own PrefixStore.
  static StatusOr<std::unique_ptr<ProcessGroup>> create_with_store(Environment& env, std::shared_ptr<Store> store,
                                                                   int32_t rank, int32_t size,
                                                                   const std::string& backend, int32_t device_index,
                                                                   int64_t timeout_ms);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int32_t rank() const { return rank_; }
  int32_t size() const { return size_; }
  const std::string& backend() const { return backend_; }
  // The communicator (owned; valid while the group lives).
  hal::Communicator& comm() { return comm_; }
  // The group's store (keys under the group's prefix); usable for small exchanges of the program's own.
  Store& store() { return *store_; }

 private:
  ProcessGroup() = default;
  // Declared in teardown order, last first: the communicator goes before the store and the server under it.
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
  hal::Communicator comm_;
  std::string backend_;
  int32_t rank_ = 0, size_ = 1;
};

// The rendezvous check on `store`: registers (rank, size) and waits until ranks 0..size-1 have registered, within
// timeout_ms. Errors (on this rank): INVALID_ARGUMENT when this rank's world size differs from rank 0's (naming
// both) or when rank 0 found that of another rank to differ; ALREADY_EXISTS when another process registered the same
// rank; DEADLINE_EXCEEDED naming the ranks that never arrived. Rank 0 checks every rank's world size and
// registration count and publishes its verdict, which the others wait for, so one bad rank fails them all.
Status rendezvous_check(Store& store, int32_t rank, int32_t size, int64_t timeout_ms);

// The collective entry for `backend` ("" = by device, as in ProcessGroup::create); NOT_FOUND naming the registered
// backends otherwise.
StatusOr<const CollectiveEntry*> find_collective(const Environment& env, const std::string& backend);

}  // namespace keel::dist
