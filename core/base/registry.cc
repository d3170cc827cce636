#include "core/base/registry.h"

#include <algorithm>
#include <cstring>

namespace keel {

namespace {
std::string str(const char* s) { return s ? s : ""; }

template <typename T>
Status check_header(const T* p, const char* what) {
  if (p == nullptr) return invalid_argument(std::string(what) + " is NULL");
  if (p->struct_size < offsetof(T, abi_minor) + sizeof(p->abi_minor)) {
    return invalid_argument(std::string(what) + " has struct_size " + std::to_string(p->struct_size) +
                            ", too small to hold its ABI version");
  }
  if (p->abi_major != KEEL_PLUGIN_ABI_MAJOR) {
    return Status(StatusCode::kAbiMismatch, std::string(what) + " was built for plugin ABI " +
                                                std::to_string(p->abi_major) + ".x; this core has " +
                                                std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." +
                                                std::to_string(KEEL_PLUGIN_ABI_MINOR));
  }
  return Status::ok();
}

// Copies a struct that may come from an older (smaller) or newer (larger) minor: members beyond what either side
// knows stay zero (= "absent optional entry").
template <typename T>
T copy_sized(const T* src) {
  T dst{};
  std::memcpy(&dst, src, std::min<size_t>(src->struct_size, sizeof(T)));
  dst.struct_size = sizeof(T);
  return dst;
}
}  // namespace

std::string normalize_domain(const std::string& domain) { return domain == "ai.onnx" ? std::string() : domain; }

const std::vector<DType>* KernelEntry::allowed(const std::string& type_param) const {
  for (const auto& c : constraints)
    if (c.name == type_param) return &c.dtypes;
  return nullptr;
}

Status Registry::add_device(PluginId plugin, int32_t priority, const keel_device_table_t* table) {
  KEEL_RETURN_IF_ERROR(check_header(table, "device table"), "register_device");
  auto e = std::make_unique<DeviceEntry>();
  e->plugin = plugin;
  e->priority = priority;
  e->table = copy_sized(table);
  e->device_type = str(table->device_type);
  if (e->device_type.empty()) return invalid_argument("register_device: device_type is empty");
  e->table.device_type = e->device_type.c_str();
  if (!e->table.device_count || !e->table.allocate || !e->table.free || !e->table.copy) {
    return invalid_argument("register_device(" + e->device_type +
                            "): device_count, allocate, free and copy are required");
  }
  for (const auto& d : devices_)
    if (d->device_type == e->device_type) {
      return Status(StatusCode::kAlreadyExists, "device type '" + e->device_type + "' is already provided");
    }
  int32_t count = 0;
  Status st = Status::from_c(e->table.device_count(e->table.user_data, &count));
  if (!st.is_ok()) return st.with_context("device_count(" + e->device_type + ")");
  if (count <= 0) return unavailable("no " + e->device_type + " device present (device_count returned 0)");
  e->device_count = count;
  e->host_memory_known = std::make_unique<std::atomic<int8_t>[]>(static_cast<size_t>(count));  // zeroed: not asked
  devices_.push_back(std::move(e));  // the entry's address (and so its device_type string) is stable from here
  return Status::ok();
}

Status Registry::add_kernel(PluginId plugin, int32_t priority, const keel_kernel_def_t* def) {
  KEEL_RETURN_IF_ERROR(check_header(def, "kernel definition"), "register_kernel");
  auto e = std::make_unique<KernelEntry>();
  e->plugin = plugin;
  e->priority = priority;
  e->def = copy_sized(def);  // fields past the plugin's struct_size are zero (flags of a plugin older than 1.4)
  // KEEL_KERNEL_FLAG_SECONDARY: one below the plugin's other kernels.
  if ((e->def.flags & KEEL_KERNEL_FLAG_SECONDARY) != 0 && priority > INT32_MIN) e->priority = priority - 1;
  e->name = str(def->name);
  e->domain = normalize_domain(str(def->domain));
  e->op_type = str(def->op_type);
  e->device_type = str(def->device_type);
  e->since_version = def->since_version;
  e->end_version = def->end_version;
  if (e->op_type.empty() || e->device_type.empty() || !def->compute) {
    return invalid_argument("register_kernel '" + e->name + "': op_type, device_type and compute are required");
  }
  if (e->end_version != 0 && e->end_version < e->since_version) {
    return invalid_argument("register_kernel '" + e->name + "': end_version < since_version");
  }
  // The constraints' layout follows the definition's minor: before 1.5 without a header (keel_type_constraint_v0_t),
  // from 1.5 with one, stepped through by the first element's struct_size (a newer minor's elements are larger).
  const bool headed = def->abi_minor >= 5;
  size_t stride = sizeof(keel_type_constraint_v0_t);
  if (headed && def->constraint_count > 0 && def->constraints != nullptr) {
    const keel_type_constraint_t& first = def->constraints[0];
    if (first.struct_size < sizeof(keel_type_constraint_t) || first.abi_major != KEEL_PLUGIN_ABI_MAJOR) {
      return invalid_argument("register_kernel '" + e->name + "': type constraint header (struct_size " +
                              std::to_string(first.struct_size) + ", ABI " + std::to_string(first.abi_major) +
                              ") is not that of a 1.x keel_type_constraint_t of at least " +
                              std::to_string(sizeof(keel_type_constraint_t)) +
                              " bytes (fill it with KEEL_TYPE_CONSTRAINT_HEADER)");
    }
    stride = first.struct_size;
  }
  if (def->constraint_count > 0 && def->constraints == nullptr) {
    return invalid_argument("register_kernel '" + e->name + "': constraint_count is " +
                            std::to_string(def->constraint_count) + " but constraints is NULL");
  }
  for (size_t i = 0; i < def->constraint_count; ++i) {
    const char* at = reinterpret_cast<const char*>(def->constraints) + i * stride;
    keel_type_constraint_v0_t c{};
    if (headed) {
      const auto* h = reinterpret_cast<const keel_type_constraint_t*>(at);
      c = {h->name, h->dtypes, h->dtype_count};
    } else {
      std::memcpy(&c, at, sizeof c);
    }
    if (c.dtype_count > 0 && c.dtypes == nullptr) {
      return invalid_argument("register_kernel '" + e->name + "': constraint " + str(c.name) + " has no dtypes array");
    }
    KernelEntry::Constraint kc{str(c.name), {}};
    for (size_t j = 0; j < c.dtype_count; ++j) {
      if (!dtype_is_valid(c.dtypes[j])) {
        return invalid_argument("register_kernel '" + e->name + "': constraint " + kc.name + " has dtype value " +
                                std::to_string(c.dtypes[j]));
      }
      kc.dtypes.push_back(static_cast<DType>(c.dtypes[j]));
    }
    e->constraints.push_back(std::move(kc));
  }
  if (e->name.empty()) e->name = e->device_type + "_" + e->op_type;
  e->def.name = e->name.c_str();
  e->def.domain = e->domain.c_str();
  e->def.op_type = e->op_type.c_str();
  e->def.device_type = e->device_type.c_str();
  e->def.constraints = nullptr;
  e->def.constraint_count = 0;
  kernels_.push_back(std::move(e));
  return Status::ok();
}

Status Registry::add_pass(PluginId plugin, const keel_pass_def_t* def) {
  KEEL_RETURN_IF_ERROR(check_header(def, "pass definition"), "register_pass");
  auto e = std::make_unique<PassEntry>();
  e->plugin = plugin;
  e->def = copy_sized(def);
  e->name = str(def->name);
  e->description = str(def->description);
  if (e->name.empty() || !def->run) return invalid_argument("register_pass: name and run are required");
  if (pass(e->name)) return Status(StatusCode::kAlreadyExists, "pass '" + e->name + "' is already registered");
  e->def.name = e->name.c_str();
  e->def.description = e->description.c_str();
  passes_.push_back(std::move(e));
  return Status::ok();
}

Status Registry::add_collective(PluginId plugin, const keel_collective_table_t* table) {
  KEEL_RETURN_IF_ERROR(check_header(table, "collective table"), "register_collective");
  auto e = std::make_unique<CollectiveEntry>();
  e->plugin = plugin;
  e->table = copy_sized(table);
  e->backend = str(table->backend);
  e->device_type = str(table->device_type);
  e->table.backend = e->backend.c_str();
  e->table.device_type = e->device_type.c_str();
  collectives_.push_back(std::move(e));
  return Status::ok();
}

Status Registry::add_claimer(PluginId plugin, int32_t priority, const keel_claimer_def_t* def) {
  KEEL_RETURN_IF_ERROR(check_header(def, "claimer definition"), "register_claimer");
  auto e = std::make_unique<ClaimerEntry>();
  e->plugin = plugin;
  e->priority = priority;
  e->def = copy_sized(def);
  e->name = str(def->name);
  e->device_type = str(def->device_type);
  if (e->device_type.empty() || !e->def.claim_subgraphs) {
    return invalid_argument("register_claimer '" + e->name + "': device_type and claim_subgraphs are required");
  }
  if (e->name.empty()) e->name = e->device_type + "_claimer";
  e->def.name = e->name.c_str();
  e->def.device_type = e->device_type.c_str();
  claimers_.push_back(std::move(e));
  return Status::ok();
}

void Registry::remove_plugin(PluginId plugin) {
  auto drop = [plugin](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [plugin](const auto& e) { return e->plugin == plugin; }), v.end());
  };
  drop(devices_);
  drop(kernels_);
  drop(passes_);
  drop(collectives_);
  drop(claimers_);
}

std::vector<const ClaimerEntry*> Registry::claimers_for(const std::string& device_type) const {
  std::vector<const ClaimerEntry*> out;
  for (const auto& c : claimers_)
    if (c->device_type == device_type) out.push_back(c.get());
  std::stable_sort(out.begin(), out.end(),
                   [](const ClaimerEntry* a, const ClaimerEntry* b) { return a->priority > b->priority; });
  return out;
}

std::vector<const KernelEntry*> Registry::kernels_for(const std::string& domain, const std::string& op_type,
                                                      int32_t opset, const std::string& device_type) const {
  std::string d = normalize_domain(domain);
  std::vector<const KernelEntry*> out;
  for (const auto& k : kernels_)
    if (k->op_type == op_type && k->domain == d && k->device_type == device_type && k->covers_opset(opset))
      out.push_back(k.get());
  std::stable_sort(out.begin(), out.end(),
                   [](const KernelEntry* a, const KernelEntry* b) { return a->priority > b->priority; });
  return out;
}

const DeviceEntry* Registry::device(const std::string& device_type) const {
  for (const auto& d : devices_)
    if (d->device_type == device_type) return d.get();
  return nullptr;
}

std::vector<std::string> Registry::device_types() const {
  std::vector<const DeviceEntry*> v;
  for (const auto& d : devices_) v.push_back(d.get());
  std::stable_sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->priority > b->priority; });
  std::vector<std::string> out;
  for (auto* d : v) out.push_back(d->device_type);
  return out;
}

const PassEntry* Registry::pass(const std::string& name) const {
  for (const auto& p : passes_)
    if (p->name == name) return p.get();
  return nullptr;
}

}  // namespace keel
