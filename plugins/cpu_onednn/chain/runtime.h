// plugins/cpu_onednn/chain/runtime.h — (internal) a claimed chain as the core holds it: the Chain (its recipe,
// plans and profile) and the kernel entry points of a claim (chain_compute, chain_release). A claim is re-entrant
// (KEEL_KERNEL_FLAG_REENTRANT): several runs may compute one Chain at once — plans are read-only once built, each
// run binds its own memory objects (RunBinding), and what changes (the plans by thread count, the profile) is
// guarded by the Chain's mutexes. Its destructor logs the profile when one was taken.
#pragma once

#include "chain/builder.h"

namespace keel::onednn::chain {

// ------------------------------------------------------------------------------------------- the claim's state

const char* kind_name(dnnl::primitive::kind k);
// The kind of a step for logs and the profile: the primitive's; for the plugin's own steps their own_kind, else
// "eltwise".
inline const char* step_kind(const Exec& e) {
  return e.own ? (e.own_kind ? e.own_kind : "eltwise") : kind_name(e.prim.get_kind());
}

struct Chain {
  const Instance* instance = nullptr;  // the environment's plugin state it was claimed for (its entries' scope)
  Recipe recipe;
  std::mutex mu;                               // guards plan and plans
  std::shared_ptr<Plan> plan;                  // the plan the latest run used (the claim's, before the first)
  std::map<int, std::shared_ptr<Plan>> plans;  // by OpenMP thread count
  std::mutex profile_mu;                       // guards the KEEL_ONEDNN_PROFILE members below
  // KEEL_ONEDNN_PROFILE=1: time per primitive kind and implementation, and each step's fastest run (robust on a
  // busy machine), logged (info) when the session goes.
  std::map<std::string, std::pair<double, int64_t>> profile;
  std::vector<double> step_min;
  std::vector<std::vector<double>> step_ms;  // every run's time per step (the medians)
  int64_t runs = 0;
  ~Chain() {
    if (profile.empty() || runs == 0) return;
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto& [k, v] : profile) rows.emplace_back(v.first, k), total += v.first;
    std::sort(rows.rbegin(), rows.rend());
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(3);
    os << recipe.name << ": " << total / runs << " ms per run in primitives (" << runs << " runs)";
    for (auto& [ms, k] : rows)
      os << "\n  " << ms / runs << " ms  " << 100.0 * ms / total << "%  x" << profile[k].second / runs << "  " << k;
    if (plan && step_min.size() == plan->execs.size()) {
      std::vector<double> med(step_min.size(), 0.0);
      for (size_t k = 0; k < step_ms.size() && k < med.size(); ++k)
        if (!step_ms[k].empty()) {
          auto& v = step_ms[k];
          std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
          med[k] = v[v.size() / 2];
        }
      double sum = 0, msum = 0;
      for (size_t k = 0; k < step_min.size(); ++k) sum += step_min[k], msum += med[k];
      os << "\n  steps, fastest / median run of each (sums " << sum << " / " << msum << " ms):";
      for (size_t k = 0; k < step_min.size(); ++k)
        os << "\n  " << std::setw(3) << k << " " << std::setw(8) << step_min[k] << " " << std::setw(8) << med[k]
           << " ms  " << (plan->execs[k].single ? "1t " : "   ") << step_kind(plan->execs[k]) << " " << plan->impls[k]
           << "  " << plan->what[k];
    }
    host_log(KEEL_LOG_INFO, os.str());
  }
};

// Runs the chain's plan on the context's inputs and outputs (rebuilding it for a new thread count).
void run_chain(Chain& ch, Ctx& c);
keel_status_t status_of(int32_t code, const std::string& msg);
// The claim's compute and release entries (keel_subgraph_def_t).
keel_status_t chain_compute(void* state, keel_kernel_context_t* ctx);
void chain_release(void* state);

}  // namespace keel::onednn::chain
