// launch_test_prog — the program that launch_test runs under `keel launch` (and mpirun). One mode per first argument:
//   env                    print RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT KEEL_STORE_SERVED
//   identity               print identity_from_env() (or its error, exit 1)
//   exit CODE RANK         rank RANK prints a line and exits CODE at once; the others sleep (up to 60 s)
//   kill RANK              rank RANK SIGKILLs itself; the others sleep
//   sleep                  every rank writes its pid to $LAUNCH_TEST_PID_DIR/<rank>.pid and sleeps (up to 60 s)
//   flaky CODE             exits CODE on the first attempt (KEEL_RESTART_COUNT=0) at rank 1, succeeds afterwards
//   store                  every rank connects to the launcher's store, adds to a counter and waits for the others
//   pg                     ProcessGroup::create over gloo, all-reduce of rank+1, prints the sum (exit 77: no gloo;
//                          the rendezvous timeout from $LAUNCH_TEST_TIMEOUT_MS, default 20 s)
//   cpus                   print "cpus <RANK> <list>": the CPUs this rank may run on (its affinity mask)
// Sleeps are bounded so that a broken launcher never leaves processes behind for long.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "core/runtime/dist/identity.h"
#include "core/runtime/dist/process_group.h"
#include "core/runtime/dist/store.h"
#include "core/runtime/environment.h"

namespace {

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

int rank() { return std::atoi(env_or("RANK", "0")); }

void sleep_bounded() {
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "env";
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (mode == "cpus") {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 1;
    std::string list;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) list += (list.empty() ? "" : ",") + std::to_string(c);
    std::printf("cpus %d %s\n", rank(), list.c_str());
    return 0;
  }
  if (mode == "env") {
    std::printf(
        "RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s KEEL_STORE_SERVED=%s\n",
        env_or("RANK", "-"), env_or("WORLD_SIZE", "-"), env_or("LOCAL_RANK", "-"), env_or("LOCAL_WORLD_SIZE", "-"),
        env_or("MASTER_ADDR", "-"), env_or("MASTER_PORT", "-"), env_or("KEEL_STORE_SERVED", "-"));
    std::fprintf(stderr, "to stderr from %s\n", env_or("RANK", "-"));
    return 0;
  }
  if (mode == "identity") {
    auto id = keel::dist::identity_from_env();
    if (!id.is_ok()) {
      std::printf("error: %s\n", id.status().to_string().c_str());
      return 1;
    }
    std::printf("identity: %s\n", id->to_string().c_str());
    return 0;
  }
  if (mode == "exit" && argc > 3) {
    if (rank() == std::atoi(argv[3])) {
      std::printf("rank %d giving up with %s\n", rank(), argv[2]);
      return std::atoi(argv[2]);
    }
    sleep_bounded();
    return 0;
  }
  if (mode == "kill" && argc > 2) {
    if (rank() == std::atoi(argv[2])) {
      std::printf("rank %d about to be killed\n", rank());
      std::fflush(stdout);
      raise(SIGKILL);
    }
    sleep_bounded();
    return 0;
  }
  if (mode == "sleep") {
    const std::string dir = env_or("LAUNCH_TEST_PID_DIR", ".");
    {
      std::ofstream f(dir + "/" + std::to_string(rank()) + ".pid.tmp");
      f << getpid() << "\n";
    }
    std::rename((dir + "/" + std::to_string(rank()) + ".pid.tmp").c_str(),
                (dir + "/" + std::to_string(rank()) + ".pid").c_str());
    std::printf("rank %d sleeping\n", rank());
    sleep_bounded();
    return 0;
  }
  if (mode == "flaky" && argc > 2) {
    if (std::string(env_or("KEEL_RESTART_COUNT", "0")) == "0" && rank() == 1) {
      std::printf("rank 1 fails on the first attempt\n");
      return std::atoi(argv[2]);
    }
    std::printf("rank %d ok on attempt %s\n", rank(), env_or("KEEL_RESTART_COUNT", "?"));
    return 0;
  }
  if (mode == "store") {
    auto id = keel::dist::identity_from_env();
    if (!id.is_ok()) return std::printf("error: %s\n", id.status().to_string().c_str()), 1;
    auto store = keel::dist::TcpStore::connect(id->master_addr, id->master_port, 10000);
    if (!store.is_ok()) return std::printf("error: %s\n", store.status().to_string().c_str()), 1;
    const std::string attempt = env_or("KEEL_RESTART_COUNT", "0");
    auto n = (*store)->add("test/" + attempt + "/count", 1);
    if (!n.is_ok()) return std::printf("error: %s\n", n.status().to_string().c_str()), 1;
    if (*n == id->world_size) (void)(*store)->set("test/" + attempt + "/all", "1");
    auto all = (*store)->get("test/" + attempt + "/all", 10000);
    if (!all.is_ok()) return std::printf("error: %s\n", all.status().to_string().c_str()), 1;
    std::printf("rank %d saw all %d ranks\n", id->rank, id->world_size);
    return 0;
  }
  if (mode == "late") {  // node 0's ranks end at once; the other nodes' ranks use the store a second later
    auto id = keel::dist::identity_from_env();
    if (!id.is_ok()) return std::printf("error: %s\n", id.status().to_string().c_str()), 1;
    if (std::string(env_or("GROUP_RANK", "0")) == "0") return std::printf("rank %d ended\n", id->rank), 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    auto store = keel::dist::TcpStore::connect(id->master_addr, id->master_port, 10000);
    if (!store.is_ok()) return std::printf("error: %s\n", store.status().to_string().c_str()), 1;
    auto n = (*store)->add("test/late", 1);
    if (!n.is_ok()) return std::printf("error: %s\n", n.status().to_string().c_str()), 1;
    std::printf("rank %d used the store after node 0's ranks ended\n", id->rank);
    return 0;
  }
  if (mode == "pg") {
    auto id = keel::dist::identity_from_env();
    if (!id.is_ok()) return std::printf("error: %s\n", id.status().to_string().c_str()), 1;
    auto env = keel::Environment::create();
    if (!env.is_ok()) return std::printf("error: %s\n", env.status().to_string().c_str()), 1;
    auto entry = keel::dist::find_collective(**env, "gloo");
    if (!entry.is_ok()) return std::printf("skip: %s\n", entry.status().to_string().c_str()), 77;
    auto pg =
        keel::dist::ProcessGroup::create(**env, *id, "gloo", 0, std::atoi(env_or("LAUNCH_TEST_TIMEOUT_MS", "20000")));
    if (!pg.is_ok()) return std::printf("error: %s\n", pg.status().to_string().c_str()), 1;
    float v = static_cast<float>(id->rank + 1), out = 0;
    keel::Status s = (*pg)->comm().all_reduce(&v, &out, 1, keel::DType::kF32, KEEL_REDUCE_SUM);
    if (!s.is_ok()) return std::printf("error: %s\n", s.to_string().c_str()), 1;
    std::printf("rank %d sum %g\n", id->rank, out);
    return 0;
  }
  std::fprintf(stderr, "launch_test_prog: unknown mode '%s'\n", mode.c_str());
  return 2;
}
