// plugins/cpu_onednn/plugin.cc — the cpu_onednn plugin: oneDNN kernels for the reference "cpu" device.
//
// It registers no device table: the built-in reference plugin provides the "cpu" device type (host memory), and
// these kernels serve it beside the reference kernels with the manifest's higher priority (50), so a node goes
// to oneDNN when a kernel here accepts it and to the reference kernel otherwise (a rejection at create time).
//
// State: one Instance per environment (ABI 1.5 init_instance; common.h): the options that environment gave and its
// log. Every entry runs inside an InstanceScope of its instance (kernels and chains remember theirs).
//
// Threads: Debian's oneDNN runs on GNU OpenMP. Before running a primitive a kernel sets OpenMP's thread count on
// the calling thread to the environment's thread count (host kernel API thread_count: `--threads`,
// EnvironmentOptions.threads, default all cores); omp_set_num_threads is called only when the value changes.
// OMP_NUM_THREADS is thereby overridden; OMP_WAIT_POLICY etc. still apply.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "common/bf16_speed.h"
#include "common/common.h"
#include "steps/attention.h"

namespace keel::onednn {

std::atomic<const keel_kernel_api_t*> g_kernel_api{nullptr};

namespace {
using StatusCreateFn = keel_status_t (*)(int32_t, const char*);
std::atomic<StatusCreateFn> g_status_create{nullptr};
thread_local const Instance* t_instance = nullptr;
}  // namespace

keel_status_t make_status(int32_t code, const std::string& msg) {
  return g_status_create.load(std::memory_order_acquire)(code, msg.c_str());
}

InstanceScope::InstanceScope(const Instance* instance) : previous_(t_instance) { t_instance = instance; }
InstanceScope::~InstanceScope() { t_instance = previous_; }
const Options& options() {
  static const Options defaults;
  return t_instance ? t_instance->options : defaults;
}
void host_log(int32_t level, const std::string& msg) {
  if (const Instance* i = t_instance; i && i->host->log) i->host->log(i->handle, level, msg.c_str());
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}
void set_threads(int32_t n) {
  // Never more than OMP_THREAD_LIMIT allows: OpenMP would give a smaller team than omp_get_max_threads() reports,
  // and oneDNN primitives (which split their work for the count they were created with) would skip part of it.
  // The limit is fixed for the process; this runs before every kernel, so it is read once.
  static const int32_t limit = std::max(1, omp_get_thread_limit());
  thread_local int32_t current = -1;
  if (n <= 0) {
    if (current != -1) return;  // no count asked for: keep this thread's setting once it is clamped
    n = omp_get_max_threads();
  }
  n = std::min(n, limit);
  if (n != current) {
    omp_set_num_threads(n);
    current = n;
  }
}

dnnl::memory::dims to_dnnl(const Dims& d) { return dnnl::memory::dims(d.begin(), d.end()); }

dnnl::memory::desc plain_md(const Dims& d, dnnl::memory::data_type dt) {
  if (d.empty()) return dnnl::memory::desc({1}, dt, dnnl::memory::format_tag::a);
  dnnl::memory::dims strides(d.size());
  int64_t s = 1;
  for (size_t i = d.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(d[i], 1);
  }
  return dnnl::memory::desc(to_dnnl(d), dt, strides);
}

Dims shape_key(const Ctx& c) {
  Dims k;
  const int n = c.input_count();
  for (int i = 0; i < n; ++i) {
    const keel_tensor_t* t = c.input(i);
    if (!t) {
      k.push_back(-2);
      continue;
    }
    k.push_back(t->ndim);
    for (int j = 0; j < t->ndim; ++j) k.push_back(t->dims[j]);
  }
  k.push_back(omp_get_max_threads());
  return k;
}

namespace {

// The f32 kernels of kernels/conv.cc, kernels/matmul.cc and kernels/misc.cc as one registration table (built once).
const std::vector<TypedKernelInfo>& f32_kernels() {
  static const std::vector<TypedKernelInfo> v = [] {
    std::vector<TypedKernelInfo> r;
    for (auto* list : {&conv_kernels, &matmul_kernels, &misc_kernels})
      for (const auto& k : list())
        r.push_back({k.domain, k.op_type, k.since_version, k.name, {KEEL_DTYPE_F32}, k.make, k.end_version, k.flags});
    return r;
  }();
  return v;
}

}  // namespace

namespace {

// oneDNN's own exceptions at the C edge (sdk::current_outcome's `translate`): "oneDNN: <what>", UNIMPLEMENTED at create
// (oneDNN has no implementation for this case, or refuses its descriptors: the next kernel takes it) and at compute
// when the kernel's table says so (dnnl_error_falls_back), INTERNAL otherwise.
struct DnnlErrors {
  bool falls_back;
  bool operator()(sdk::Stage stage, sdk::Outcome* out) const {
    try {
      throw;
    } catch (const dnnl::error& e) {
      const bool unimplemented = stage == sdk::Stage::kCreate || falls_back;
      *out = {static_cast<int32_t>(unimplemented ? KEEL_STATUS_UNIMPLEMENTED : KEEL_STATUS_INTERNAL),
              std::string("oneDNN: ") + e.what()};
      return true;
    } catch (...) {
      return false;
    }
  }
};

}  // namespace

keel_status_t create_kernel(void* user_data, keel_kernel_context_t* ctx, void** out_state) {
  const KernelEntry* entry = static_cast<const KernelEntry*>(user_data);
  InstanceScope scope(entry->instance);
  return sdk::guard(
      entry->instance->host, sdk::Stage::kCreate,
      [&] {
        std::unique_ptr<Kernel> k(entry->make());
        k->instance = entry->instance;
        Ctx c(ctx);
        k->setup(c);
        for (int i = 0; i < c.input_count(); ++i)  // a bf16 kernel: once per process, where bf16 is slow here
          if (c.has_input(i) && c.dtype(i) == KEEL_DTYPE_BF16) {
            warn_if_bf16_slow();
            break;
          }
        *out_state = k.release();
      },
      std::string(), DnnlErrors{true});
}

namespace {
keel_status_t compute_kernel(void* state, keel_kernel_context_t* ctx, bool dnnl_error_falls_back) {
  Kernel* k = static_cast<Kernel*>(state);
  InstanceScope scope(k->instance);
  return sdk::guard(
      k->instance->host, sdk::Stage::kCompute,
      [&] {
        Ctx c(ctx);
        set_threads(c.thread_count());
        k->run(c);
      },
      std::string(), DnnlErrors{dnnl_error_falls_back});
}
}  // namespace

keel_status_t compute_kernel_falling_back(void* state, keel_kernel_context_t* ctx) {
  return compute_kernel(state, ctx, true);
}
keel_status_t compute_kernel_failing(void* state, keel_kernel_context_t* ctx) {
  return compute_kernel(state, ctx, false);
}

void release_kernel(void* state) {
  Kernel* k = static_cast<Kernel*>(state);
  InstanceScope scope(k->instance);  // a kernel's destructor may log (KEEL_ONEDNN_PROFILE)
  delete k;
}

namespace {

keel_status_t onednn_init_instance(const keel_core_api_t* host, keel_plugin_handle_t* plugin, void** out_instance) {
  if (!KEEL_HAS_MEMBER(host, keel_core_api_t, register_kernel) || host->kernel == nullptr ||
      !KEEL_HAS_MEMBER(host->kernel, keel_kernel_api_t, thread_count))
    return nullptr;  // a core too old to serve us: register nothing
  g_status_create.store(host->status_create, std::memory_order_release);
  g_kernel_api.store(host->kernel, std::memory_order_release);
  auto inst = std::make_unique<Instance>();
  inst->host = host;
  inst->handle = plugin;
  InstanceScope scope(inst.get());
  Options& o = inst->options;
  try {
    // Options: the environment's plugin options first, then the process environment ("0" off, anything else on).
    auto read_flag = [&](const char* key, const char* env, bool& out) {
      int flag = out ? 1 : 0;
      if (host->options && host->plugin_options && host->options->get_bool(host->plugin_options, key, &flag))
        out = flag != 0;
      if (const char* e = std::getenv(env)) out = std::strcmp(e, "0") != 0;
    };
    read_flag("winograd", "KEEL_ONEDNN_WINOGRAD", o.winograd);
    read_flag("claims", "KEEL_ONEDNN_CLAIMS", o.claims);
    read_flag("dw_fusion", "KEEL_ONEDNN_DW_FUSION", o.dw_fusion);
    read_flag("silu_pass", "KEEL_ONEDNN_SILU_PASS", o.silu_pass);
    read_flag("dw_silu", "KEEL_ONEDNN_DW_SILU", o.dw_silu);
    read_flag("gelu_pass", "KEEL_ONEDNN_GELU_PASS", o.gelu_pass);
    read_flag("se_step", "KEEL_ONEDNN_SE_STEP", o.se_step);
    read_flag("wino4", "KEEL_ONEDNN_WINO4", o.wino4);
    read_flag("pointwise", "KEEL_ONEDNN_POINTWISE", o.pointwise);
    read_flag("wino4_streamed", "KEEL_ONEDNN_WINO4_STREAMED", o.wino4_streamed);
    read_flag("wino_few_tiles", "KEEL_ONEDNN_WINO_FEW_TILES", o.wino_few_tiles);
    read_flag("wino4_position_major", "KEEL_ONEDNN_WINO4_POSITION_MAJOR", o.wino4_position_major);
    read_flag("dw_ln", "KEEL_ONEDNN_DW_LN", o.dw_ln);
    read_flag("expand_dw", "KEEL_ONEDNN_EXPAND_DW", o.expand_dw);
    read_flag("expand_dw_project", "KEEL_ONEDNN_EXPAND_DW_PROJECT", o.expand_dw_project);
    read_flag("expand_dw_stem", "KEEL_ONEDNN_EXPAND_DW_STEM", o.expand_dw_stem);
    read_flag("int8_expand_dw", "KEEL_ONEDNN_INT8_EXPAND_DW", o.int8_expand_dw);
    read_flag("view_post_ops", "KEEL_ONEDNN_VIEW_POST_OPS", o.view_post_ops);
    read_flag("permuted_post_ops", "KEEL_ONEDNN_PERMUTED_POST_OPS", o.permuted_post_ops);
    read_flag("skinny_gemm", "KEEL_ONEDNN_SKINNY_GEMM", o.skinny_gemm);
    read_flag("skinny_conv", "KEEL_ONEDNN_SKINNY_CONV", o.skinny_conv);
    read_flag("maxpool_rows", "KEEL_ONEDNN_MAXPOOL_ROWS", o.maxpool_rows);
    // Options that are a flag or "timed" (Options::Choice), from the manifest, then the environment.
    auto read_choice = [&](const char* name, const char* env, Options::Choice& to) {
      auto parse = [&](const std::string& v) {
        if (v == "timed") to = Options::Choice::kTimed;
        else if (v == "0" || v == "false" || v == "off") to = Options::Choice::kOff;
        else if (v == "1" || v == "true" || v == "on") to = Options::Choice::kOn;
        else throw std::invalid_argument(std::string(name) + " must be true, false or \"timed\", not \"" + v + "\"");
      };
      const char* text = nullptr;
      int flag = 0;
      if (host->options && host->plugin_options && host->options->get_bool(host->plugin_options, name, &flag))
        parse(flag ? "1" : "0");
      else if (host->options && host->plugin_options && host->options->get_string(host->plugin_options, name, &text) &&
               text)
        parse(text);
      if (const char* e = std::getenv(env)) parse(e);
    };
    read_choice("int8_winograd", "KEEL_ONEDNN_INT8_WINOGRAD", o.int8_winograd);
    read_choice("wino_few_tiles_f2", "KEEL_ONEDNN_WINO_FEW_TILES_F2", o.wino_few_tiles_f2);
    if (const char* e = std::getenv("KEEL_ONEDNN_PROFILE")) o.profile = std::strcmp(e, "0") != 0;
    (void)engine();  // fails early when oneDNN cannot make a CPU engine
  } catch (const std::invalid_argument& e) {
    return make_status(KEEL_STATUS_INVALID_ARGUMENT, std::string("cpu_onednn options: ") + e.what());
  } catch (const std::exception& e) {
    return make_status(KEEL_STATUS_UNAVAILABLE, std::string("oneDNN CPU engine unavailable: ") + e.what());
  }
  const auto& kernels = f32_kernels();
  if (keel_status_t st = register_kernel_table(*inst, kernels, false)) return st;
  // keel.Attention, f32 and bf16 (kernels/attention.cc).
  if (keel_status_t st = register_kernel_table(*inst, attention_kernels(), false)) return st;
  if (keel_status_t st = register_int8_kernels(*inst)) return st;  // kernels/int8.cc: keel.QConv, keel.QGemm
  if (keel_status_t st = register_bf16_kernels(*inst)) return st;  // kernels/bf16.cc (before train's)
  if (keel_status_t st = register_train_kernels(*inst)) return st;
  if (keel_status_t st = register_claimer(*inst)) return st;
  std::string msg = "cpu_onednn: oneDNN " + std::to_string(dnnl_version()->major) + "." +
                    std::to_string(dnnl_version()->minor) + "." + std::to_string(dnnl_version()->patch) + ", " +
                    std::to_string(kernels.size()) + " kernels for cpu, winograd " + (o.winograd ? "on" : "off") +
                    ", claims " + (o.claims ? "on" : "off");
  host->log(plugin, KEEL_LOG_DEBUG, msg.c_str());
  *out_instance = inst.release();
  return nullptr;
}

void onednn_shutdown_instance(void* instance) { delete static_cast<Instance*>(instance); }

const keel_plugin_t kPlugin = {.struct_size = sizeof(keel_plugin_t),
                               .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                               .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                               .name = "cpu_onednn",
                               .version = "0.1.0",
                               .kind = KEEL_PLUGIN_KIND_DEVICE,
                               .init = nullptr,
                               .shutdown = nullptr,
                               .init_instance = onednn_init_instance,
                               .shutdown_instance = onednn_shutdown_instance};

}  // namespace
}  // namespace keel::onednn

extern "C" KEEL_PLUGIN_EXPORT const keel_plugin_t* keel_plugin_entry(void) { return &keel::onednn::kPlugin; }
