// keel/core/runtime/dist/identity.cc — identity_from_env and its parsers (see identity.h).
#include "core/runtime/dist/identity.h"

#include <charconv>
#include <cstdlib>

namespace keel::dist {
namespace {

using Lookup = std::function<const char*(const char*)>;

// Reads an integer variable; `value` untouched when unset.
Status read_int(const Lookup& env, const char* name, int32_t& value, bool& present) {
  present = false;
  const char* v = env(name);
  if (!v) return Status::ok();
  std::string s(v);
  // Tolerate surrounding blanks ("2 " from a shell script), nothing else.
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  if (b == std::string::npos) return invalid_argument(std::string(name) + " is set but empty");
  s = s.substr(b, e - b + 1);
  int64_t x = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec != std::errc() || end != s.data() + s.size())
    return invalid_argument(std::string(name) + "='" + v + "' is not an integer");
  if (x < INT32_MIN || x > INT32_MAX) return invalid_argument(std::string(name) + "='" + v + "' is out of range");
  value = static_cast<int32_t>(x);
  present = true;
  return Status::ok();
}

Status read_int(const Lookup& env, const char* name, int32_t& value) {
  bool present = false;
  return read_int(env, name, value, present);
}

// Tasks on node `node` of Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": nodes 0-2 run 2 tasks, node 3 runs 1).
StatusOr<int32_t> slurm_tasks_on_node(const std::string& spec, int32_t node) {
  int64_t first = 0;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t comma = spec.find(',', pos);
    std::string item = spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() : comma + 1;
    int64_t tasks = 0, repeat = 1;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), tasks);
    if (ec != std::errc()) return invalid_argument("SLURM_TASKS_PER_NODE='" + spec + "' cannot be read");
    std::string rest(end, static_cast<const char*>(item.data() + item.size()));
    if (!rest.empty()) {
      if (rest.size() < 4 || rest.compare(0, 2, "(x") != 0 || rest.back() != ')')
        return invalid_argument("SLURM_TASKS_PER_NODE='" + spec + "' cannot be read");
      auto [e2, ec2] = std::from_chars(rest.data() + 2, rest.data() + rest.size() - 1, repeat);
      if (ec2 != std::errc() || e2 != rest.data() + rest.size() - 1)
        return invalid_argument("SLURM_TASKS_PER_NODE='" + spec + "' cannot be read");
    }
    if (node < first + repeat) return static_cast<int32_t>(tasks);
    first += repeat;
  }
  return invalid_argument("SLURM_NODEID=" + std::to_string(node) + " is past the nodes of SLURM_TASKS_PER_NODE='" +
                          spec + "'");
}

Status validate(const Identity& id, const std::string& rank_var, const std::string& size_var,
                const std::string& local_var) {
  if (id.world_size < 1)
    return invalid_argument(size_var + "=" + std::to_string(id.world_size) + ": the world needs at least one rank");
  if (id.rank < 0 || id.rank >= id.world_size)
    return invalid_argument(rank_var + "=" + std::to_string(id.rank) + " is outside the world of " + size_var + "=" +
                            std::to_string(id.world_size) + " (ranks 0.." + std::to_string(id.world_size - 1) + ")");
  if (id.local_world_size < 1 || id.local_world_size > id.world_size)
    return invalid_argument("local world size " + std::to_string(id.local_world_size) + " is not within 1.." +
                            std::to_string(id.world_size));
  if (id.local_rank < 0 || id.local_rank >= id.local_world_size)
    return invalid_argument(local_var + "=" + std::to_string(id.local_rank) + " is outside the local world of " +
                            std::to_string(id.local_world_size));
  if (id.master_port < 0 || id.master_port > 65535)
    return invalid_argument("MASTER_PORT=" + std::to_string(id.master_port) + " is not a port (1..65535)");
  if (id.world_size > 1 && id.master_port == 0)
    return invalid_argument("MASTER_PORT is not set (a world of " + std::to_string(id.world_size) +
                            " ranks needs the rendezvous port)");
  if (id.master_addr.empty()) return invalid_argument("MASTER_ADDR is set but empty");
  return Status::ok();
}

// MASTER_ADDR / MASTER_PORT over the given defaults.
Status read_master(const Lookup& env, Identity& id) {
  if (const char* a = env("MASTER_ADDR")) id.master_addr = a;
  return read_int(env, "MASTER_PORT", id.master_port);
}

}  // namespace

const char* identity_source_name(IdentitySource source) {
  switch (source) {
    case IdentitySource::kSingle: return "single process";
    case IdentitySource::kEnv: return "env (RANK/WORLD_SIZE)";
    case IdentitySource::kOpenMpi: return "Open MPI";
    case IdentitySource::kSlurm: return "Slurm";
  }
  return "?";
}

std::string Identity::to_string() const {
  std::string s = "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
                  std::to_string(local_rank) + " of " + std::to_string(local_world_size) + "), master " + master_addr +
                  ":" + std::to_string(master_port) + ", from " + identity_source_name(source);
  return s;
}

StatusOr<std::string> first_host_of_nodelist(const std::string& nodelist) {
  // The first entry: up to the first comma outside brackets.
  int depth = 0;
  size_t end = nodelist.size();
  for (size_t i = 0; i < nodelist.size(); ++i) {
    if (nodelist[i] == '[') ++depth;
    else if (nodelist[i] == ']') --depth;
    else if (nodelist[i] == ',' && depth == 0) {
      end = i;
      break;
    }
    if (depth < 0 || depth > 1) return invalid_argument("node list '" + nodelist + "' has unbalanced brackets");
  }
  if (depth != 0) return invalid_argument("node list '" + nodelist + "' has unbalanced brackets");
  const std::string entry = nodelist.substr(0, end);
  // Each bracket group stands for a range list; its first element ("01" of "[01-04,7]") is the first host's part.
  std::string host;
  for (size_t i = 0; i < entry.size();) {
    if (entry[i] != '[') {
      host += entry[i++];
      continue;
    }
    size_t close = entry.find(']', i);
    std::string group = entry.substr(i + 1, close - i - 1);
    size_t stop = group.find_first_of("-,");
    std::string first = group.substr(0, stop);
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
      return invalid_argument("node list '" + nodelist + "': cannot read the range [" + group + "]");
    host += first;
    i = close + 1;
  }
  if (host.empty()) return invalid_argument("node list '" + nodelist + "' is empty");
  return host;
}

StatusOr<Identity> identity_from_lookup(const Lookup& env) {
  Identity id;
  if (env("RANK") || env("WORLD_SIZE")) {
    id.source = IdentitySource::kEnv;
    if (!env("RANK")) return invalid_argument("WORLD_SIZE is set but RANK is not");
    if (!env("WORLD_SIZE")) return invalid_argument("RANK is set but WORLD_SIZE is not");
    KEEL_RETURN_IF_ERROR(read_int(env, "RANK", id.rank), "identity");
    KEEL_RETURN_IF_ERROR(read_int(env, "WORLD_SIZE", id.world_size), "identity");
    // Without LOCAL_* the job is taken to be on one node.
    id.local_rank = id.rank;
    id.local_world_size = id.world_size;
    bool has_local_size = false;
    KEEL_RETURN_IF_ERROR(read_int(env, "LOCAL_RANK", id.local_rank), "identity");
    KEEL_RETURN_IF_ERROR(read_int(env, "LOCAL_WORLD_SIZE", id.local_world_size, has_local_size), "identity");
    if (!has_local_size && env("LOCAL_RANK") && id.local_rank >= id.local_world_size)
      id.local_world_size = id.local_rank + 1;
    KEEL_RETURN_IF_ERROR(read_master(env, id), "identity");
    KEEL_RETURN_IF_ERROR(validate(id, "RANK", "WORLD_SIZE", "LOCAL_RANK"), "identity (RANK/WORLD_SIZE)");
    return id;
  }
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    id.source = IdentitySource::kOpenMpi;
    if (!env("OMPI_COMM_WORLD_RANK") || !env("OMPI_COMM_WORLD_SIZE"))
      return invalid_argument("identity (Open MPI): OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE must both be set");
    KEEL_RETURN_IF_ERROR(read_int(env, "OMPI_COMM_WORLD_RANK", id.rank), "identity (Open MPI)");
    KEEL_RETURN_IF_ERROR(read_int(env, "OMPI_COMM_WORLD_SIZE", id.world_size), "identity (Open MPI)");
    id.local_rank = id.rank;
    id.local_world_size = id.world_size;
    KEEL_RETURN_IF_ERROR(read_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", id.local_rank), "identity (Open MPI)");
    KEEL_RETURN_IF_ERROR(read_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", id.local_world_size), "identity (Open MPI)");
    id.master_port = 29500;
    KEEL_RETURN_IF_ERROR(read_master(env, id), "identity (Open MPI)");
    KEEL_RETURN_IF_ERROR(validate(id, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                         "identity (Open MPI)");
    return id;
  }
  if (env("SLURM_PROCID") && env("SLURM_NTASKS")) {
    id.source = IdentitySource::kSlurm;
    KEEL_RETURN_IF_ERROR(read_int(env, "SLURM_PROCID", id.rank), "identity (Slurm)");
    KEEL_RETURN_IF_ERROR(read_int(env, "SLURM_NTASKS", id.world_size), "identity (Slurm)");
    id.local_rank = 0;
    KEEL_RETURN_IF_ERROR(read_int(env, "SLURM_LOCALID", id.local_rank), "identity (Slurm)");
    bool has = false;
    KEEL_RETURN_IF_ERROR(read_int(env, "SLURM_NTASKS_PER_NODE", id.local_world_size, has), "identity (Slurm)");
    if (!has) {
      if (const char* spec = env("SLURM_TASKS_PER_NODE")) {
        int32_t node = 0;
        KEEL_RETURN_IF_ERROR(read_int(env, "SLURM_NODEID", node), "identity (Slurm)");
        KEEL_ASSIGN_OR_RETURN(id.local_world_size, slurm_tasks_on_node(spec, node), "identity (Slurm)");
      } else {
        id.local_world_size = env("SLURM_LOCALID") ? id.local_rank + 1 : 1;
      }
    }
    const char* nodes = env("SLURM_JOB_NODELIST");
    const char* nodes_var = "SLURM_JOB_NODELIST";
    if (!nodes) nodes = env("SLURM_NODELIST"), nodes_var = "SLURM_NODELIST";
    if (nodes) {
      KEEL_ASSIGN_OR_RETURN(id.master_addr, first_host_of_nodelist(nodes),
                            std::string("identity (Slurm): ") + nodes_var);
    }
    int32_t job = 0;
    bool has_job = false;
    KEEL_RETURN_IF_ERROR(read_int(env, "SLURM_JOB_ID", job, has_job), "identity (Slurm)");
    id.master_port = has_job && job >= 0 ? 10000 + job % 50000 : 29500;
    KEEL_RETURN_IF_ERROR(read_master(env, id), "identity (Slurm)");
    KEEL_RETURN_IF_ERROR(validate(id, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"), "identity (Slurm)");
    return id;
  }
  // One process. MASTER_* are still honoured (a 1-rank job started by hand).
  KEEL_RETURN_IF_ERROR(read_master(env, id), "identity");
  KEEL_RETURN_IF_ERROR(validate(id, "RANK", "WORLD_SIZE", "LOCAL_RANK"), "identity");
  return id;
}

StatusOr<Identity> identity_from_env() {
  return identity_from_lookup([](const char* name) -> const char* { return std::getenv(name); });
}

StatusOr<Identity> identity_from_vars(const std::map<std::string, std::string>& vars) {
  return identity_from_lookup([&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

}  // namespace keel::dist
