// keel/core/runtime/dist/identity.h — who this process is in a distributed job, read from the environment.
//
// A rank takes its identity from whichever launcher started it:
//   `keel launch`, torchrun, Kubernetes training operators: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//       MASTER_ADDR, MASTER_PORT (RANK and WORLD_SIZE are required together; LOCAL_* default to one node);
//   Open MPI's mpirun: OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK / _LOCAL_SIZE;
//   Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the local task count from SLURM_NTASKS_PER_NODE or
//       SLURM_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID, the master from the first host of SLURM_JOB_NODELIST
//       (or SLURM_NODELIST; "node[01-04,7]" → "node01");
//   none of these: one process (rank 0 of 1).
// Under Open MPI and Slurm, MASTER_ADDR / MASTER_PORT still win when set; otherwise the master address is 127.0.0.1
// (Open MPI) or the job's first host (Slurm), and the port 29500 (Open MPI) or 10000 + SLURM_JOB_ID % 50000 (Slurm,
// so that two jobs sharing a node do not collide). A value that is not an integer, a rank outside the world, a
// missing partner variable: INVALID_ARGUMENT naming the variable and its value.
//
// Pure functions of their input; thread-safe (identity_from_env reads the process environment).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/base/status.h"

namespace keel::dist {

enum class IdentitySource { kSingle, kEnv, kOpenMpi, kSlurm };

// "single process", "env (RANK/WORLD_SIZE)", "Open MPI", "Slurm".
const char* identity_source_name(IdentitySource source);

struct Identity {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t local_rank = 0;
  int32_t local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int32_t master_port = 0;  // 0 = not given (only possible for a single process)
  IdentitySource source = IdentitySource::kSingle;

  // "rank 1 of 4 (local 1 of 2), master 127.0.0.1:29500, from env (RANK/WORLD_SIZE)".
  std::string to_string() const;
};

// Reads the process environment.
StatusOr<Identity> identity_from_env();
// The same over a lookup function (nullptr = unset), for tests and embedders.
StatusOr<Identity> identity_from_lookup(const std::function<const char*(const char*)>& lookup);
// The same over a map of variables.
StatusOr<Identity> identity_from_vars(const std::map<std::string, std::string>& vars);

// The first host of a Slurm node list: "node[01-04,7],gpu5" → "node01"; "a,b" → "a"; "host" → "host".
StatusOr<std::string> first_host_of_nodelist(const std::string& nodelist);

}  // namespace keel::dist
