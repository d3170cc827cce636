// Tests of the plugin manager against the fixture plugins built by tests/plugins/CMakeLists.txt: one directory per
// case under KEEL_TEST_PLUGIN_DIR (<build>/test-plugins). Every broken plugin must end up failed or skipped with a
// reason that says why, must leave nothing in the registry, and must not stop the others from loading.
#include "core/runtime/plugin_manager.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/mutate.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

fs::path fixture_root() {
  if (const char* env = std::getenv("KEEL_TEST_PLUGIN_DIR"); env != nullptr && env[0] != '\0') return env;
#ifdef KEEL_TEST_PLUGIN_DIR_DEFAULT
  return KEEL_TEST_PLUGIN_DIR_DEFAULT;
#else
  return {};
#endif
}

std::string core_abi() { return std::to_string(KEEL_PLUGIN_ABI_MAJOR) + "." + std::to_string(KEEL_PLUGIN_ABI_MINOR); }
std::string next_abi() { return std::to_string(KEEL_PLUGIN_ABI_MAJOR + 1) + ".0"; }

// True when a library with this path is loaded in the process (without loading it).
bool is_loaded(const fs::path& lib) {
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) return false;
  dlclose(h);
  return true;
}

class PluginManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fixture_root();
    if (root_.empty() || !fs::is_directory(root_)) {
      GTEST_SKIP() << "fixture plugins not found: set KEEL_TEST_PLUGIN_DIR (got '" << root_.string() << "')";
    }
    manager_ = std::make_unique<PluginManager>(registry_);
  }

  fs::path dir(const std::string& c) const { return root_ / c; }
  void load(const std::string& c) { manager_->load_from({dir(c)}); }

  const PluginRecord* find(const std::string& name) const {
    for (const auto& r : manager_->plugins())
      if (r.name == name) return &r;
    return nullptr;
  }
  const PluginRecord& only() const {
    EXPECT_EQ(manager_->plugins().size(), 1u);
    return manager_->plugins().front();
  }
  // Nothing at all registered (for the cases whose only plugin must not load).
  void expect_registry_empty() const {
    EXPECT_TRUE(registry_.devices().empty());
    EXPECT_TRUE(registry_.kernels().empty());
    EXPECT_TRUE(registry_.passes().empty());
    EXPECT_TRUE(registry_.collectives().empty());
  }

  fs::path root_;
  Registry registry_;
  std::unique_ptr<PluginManager> manager_;
};

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "'" << (haystack) << "' lacks '" << (needle) << "'"

TEST_F(PluginManagerTest, GoodPluginLoadsAndRegistersItsDevice) {
  load("good");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kLoaded) << r.reason;
  EXPECT_EQ(r.reason, "");
  EXPECT_EQ(r.name, "good");
  EXPECT_EQ(r.kind, "device");
  EXPECT_EQ(r.version, "1.2.3");
  EXPECT_EQ(r.vendor, "Keel tests");
  EXPECT_EQ(r.priority, 5);
  EXPECT_EQ(r.abi, "1.0");
  EXPECT_EQ(r.manifest, dir("good") / "good.keel-plugin.toml");
  EXPECT_EQ(r.library, dir("good") / "libkeel_fixture_good.so");
  ASSERT_EQ(r.requirements.count("fake_driver"), 1u);
  EXPECT_EQ(r.requirements.at("fake_driver"), ">=1.0");

  const DeviceEntry* d = registry_.device("fake");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->plugin, r.id);
  EXPECT_EQ(d->priority, 5);
  EXPECT_EQ(d->device_count, 1);
  // The device name comes from the manifest's [options]: options reach the plugin.
  keel_device_properties_t props{};
  props.struct_size = sizeof(props);
  ASSERT_EQ(d->table.get_properties(d->table.user_data, 0, &props), nullptr);
  EXPECT_STREQ(props.name, "Fake host device (from options)");

  auto kernels = registry_.kernels_for("", "Relu", 13, "fake");
  ASSERT_EQ(kernels.size(), 1u);
  EXPECT_EQ(kernels[0]->plugin, r.id);
  EXPECT_EQ(kernels[0]->priority, 5);
  EXPECT_TRUE(is_loaded(r.library));
}

TEST_F(PluginManagerTest, DestructionUndoesRegistrationsAndKeepsRunCodeMapped) {
  load("good");
  fs::path lib = only().library;
  ASSERT_TRUE(is_loaded(lib));
  manager_.reset();
  EXPECT_TRUE(registry_.devices().empty());
  EXPECT_TRUE(registry_.kernels().empty());
  // A plugin that ran is pinned (RTLD_NODELETE): threads it started may outlive the manager.
  EXPECT_TRUE(is_loaded(lib));
}

TEST_F(PluginManagerTest, BrokenTomlGivesTheParseErrorWithPosition) {
  load("bad_toml");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_EQ(r.name, "broken");  // the file's stem: the manifest could not be read
  EXPECT_CONTAINS(r.reason, "TOML parse error");
  EXPECT_CONTAINS(r.reason, "broken.keel-plugin.toml:3:");
  expect_registry_empty();
}

TEST_F(PluginManagerTest, MissingLibraryNamesTheAbsolutePath) {
  load("missing_library");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_EQ(r.reason, "library not found: " + (dir("missing_library") / "libkeel_fixture_absent.so").string());
  expect_registry_empty();
}

TEST_F(PluginManagerTest, NotASharedLibraryGivesTheLoaderError) {
  load("not_elf");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "invalid ELF header");
  EXPECT_CONTAINS(r.reason, "libnotelf.so");
  expect_registry_empty();
}

TEST_F(PluginManagerTest, AbiMajorMismatchInManifestIsRefusedBeforeLoading) {
  load("abi_major");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "plugin ABI " + next_abi() + ", core ABI " + core_abi());
  EXPECT_CONTAINS(r.reason, "manifest");
  EXPECT_FALSE(is_loaded(dir("abi_major") / "libkeel_fixture_abi_next.so"));
  expect_registry_empty();
}

TEST_F(PluginManagerTest, AbiMajorMismatchInDescriptorIsRefused) {
  load("abi_descriptor");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  // The fixture's descriptor says the next major with this SDK's minor.
  EXPECT_CONTAINS(r.reason, "plugin ABI " + std::to_string(KEEL_PLUGIN_ABI_MAJOR + 1) + "." +
                                std::to_string(KEEL_PLUGIN_ABI_MINOR) + ", core ABI " + core_abi());
  EXPECT_CONTAINS(r.reason, "descriptor");
  EXPECT_FALSE(is_loaded(r.library));  // unloaded again
  expect_registry_empty();
}

TEST_F(PluginManagerTest, MissingEntrySymbol) {
  load("no_entry");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "entry symbol keel_plugin_entry not found in " + r.library.string());
  expect_registry_empty();
}

TEST_F(PluginManagerTest, InitErrorIsRecordedAndUndone) {
  load("init_error");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "FAILED_PRECONDITION");
  EXPECT_CONTAINS(r.reason, "fixture: the accelerator firmware is too old");
  expect_registry_empty();
  // Its init ran, so its library stays mapped (an exit handler or thread it started must find its code): the CUDA
  // plugin without a device is such a case, and under ThreadSanitizer its runtime's exit handler crashed the process.
  EXPECT_TRUE(is_loaded(r.library));
}

TEST_F(PluginManagerTest, InitThatThrowsIsCaught) {
  load("init_throws");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "init threw: fixture: C++ exception from init");
  expect_registry_empty();
}

TEST_F(PluginManagerTest, MissingDependencyGivesTheLoaderError) {
  load("missing_dep");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "libkeel_fixture_dep.so: cannot open shared object file");
  expect_registry_empty();
}

TEST_F(PluginManagerTest, WrongTypedKeyNamesKeyTypeAndFile) {
  load("wrong_type");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_EQ(r.name, "wrong_type");
  EXPECT_CONTAINS(r.reason, "'priority'");
  EXPECT_CONTAINS(r.reason, "an integer");
  EXPECT_CONTAINS(r.reason, "a string");
  EXPECT_CONTAINS(r.reason, (dir("wrong_type") / "wrong_type.keel-plugin.toml").string());
  expect_registry_empty();
}

TEST_F(PluginManagerTest, MissingRequiredKey) {
  load("missing_key");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_EQ(r.name, "missing_key");
  EXPECT_CONTAINS(r.reason, "'library'");
  EXPECT_CONTAINS(r.reason, "missing");
}

TEST_F(PluginManagerTest, DescriptorNameMustMatchManifest) {
  load("name_mismatch");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kFailed);
  EXPECT_CONTAINS(r.reason, "'good'");
  EXPECT_CONTAINS(r.reason, "'name_mismatch'");
  expect_registry_empty();
}

TEST_F(PluginManagerTest, NoDevicePresentIsSkipped) {
  load("no_device");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kSkipped);
  EXPECT_CONTAINS(r.reason, "no nodev device present");
  expect_registry_empty();
}

TEST_F(PluginManagerTest, NoDevicePresentIsSkippedEvenWhenInitIgnoresIt) {
  load("no_device_quiet");
  const PluginRecord& r = only();
  EXPECT_EQ(r.state, PluginState::kSkipped);
  EXPECT_CONTAINS(r.reason, "no device present");
  expect_registry_empty();  // its kernel for "nodev_quiet" is gone too
}

TEST_F(PluginManagerTest, DuplicateNameFirstInSearchOrderWins) {
  manager_->load_from({dir("dup_a"), dir("dup_b")});
  ASSERT_EQ(manager_->plugins().size(), 2u);
  const PluginRecord& a = manager_->plugins()[0];
  const PluginRecord& b = manager_->plugins()[1];
  EXPECT_EQ(a.state, PluginState::kLoaded) << a.reason;
  EXPECT_EQ(b.state, PluginState::kSkipped);
  EXPECT_EQ(b.reason, "duplicate plugin name 'dup': already loaded from " + a.manifest.string() + "; this one is " +
                          b.manifest.string());
  EXPECT_EQ(a.manifest, dir("dup_a") / "dup.keel-plugin.toml");
  const DeviceEntry* d = registry_.device("dupdev");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->plugin, a.id);
  keel_device_properties_t props{};
  props.struct_size = sizeof(props);
  ASSERT_EQ(d->table.get_properties(d->table.user_data, 0, &props), nullptr);
  EXPECT_STREQ(props.name, "Fake host device A");
}

TEST_F(PluginManagerTest, DuplicateNameReversedSearchOrder) {
  manager_->load_from({dir("dup_b"), dir("dup_a")});
  ASSERT_EQ(manager_->plugins().size(), 2u);
  EXPECT_EQ(manager_->plugins()[0].state, PluginState::kLoaded);
  EXPECT_EQ(manager_->plugins()[0].manifest, dir("dup_b") / "dup.keel-plugin.toml");
  EXPECT_EQ(manager_->plugins()[1].state, PluginState::kSkipped);
  EXPECT_CONTAINS(manager_->plugins()[1].reason, (dir("dup_b") / "dup.keel-plugin.toml").string());
  EXPECT_CONTAINS(manager_->plugins()[1].reason, (dir("dup_a") / "dup.keel-plugin.toml").string());
}

TEST_F(PluginManagerTest, DuplicateNameInOneDirectoryLexicalOrderWins) {
  load("dup_same_dir");
  ASSERT_EQ(manager_->plugins().size(), 2u);
  const PluginRecord& a = manager_->plugins()[0];
  const PluginRecord& b = manager_->plugins()[1];
  EXPECT_EQ(a.manifest.filename(), "a_twin.keel-plugin.toml");
  EXPECT_EQ(a.state, PluginState::kLoaded) << a.reason;
  EXPECT_EQ(b.manifest.filename(), "b_twin.keel-plugin.toml");
  EXPECT_EQ(b.state, PluginState::kSkipped);
  EXPECT_CONTAINS(b.reason, "duplicate plugin name 'twin'");
  EXPECT_EQ(registry_.devices().size(), 1u);
}

TEST_F(PluginManagerTest, MixedDirectoryLoadsTheGoodOneAndReportsEveryBadOne) {
  load("mixed");
  const auto& records = manager_->plugins();
  size_t manifests = 0;
  for (const auto& e : fs::directory_iterator(dir("mixed")))
    if (e.path().filename().string().ends_with(".keel-plugin.toml")) ++manifests;
  EXPECT_EQ(records.size(), manifests);
  EXPECT_GE(records.size(), 13u);

  const PluginRecord* good = nullptr;
  for (const auto& r : records) {
    if (r.state == PluginState::kLoaded) {
      EXPECT_EQ(good, nullptr) << "a second plugin loaded: " << r.name;
      good = &r;
      continue;
    }
    EXPECT_FALSE(r.reason.empty()) << r.name;
    EXPECT_EQ(r.reason.find('\n'), std::string::npos) << r.name << ": " << r.reason;
  }
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(good->name, "good");

  // Only the good plugin registered anything.
  ASSERT_EQ(registry_.devices().size(), 1u);
  EXPECT_EQ(registry_.devices()[0]->device_type, "fake");
  for (const auto& k : registry_.kernels()) EXPECT_EQ(k->plugin, good->id) << k->name;

  auto state_of = [&](const std::string& name) -> std::optional<PluginState> {
    for (const auto& r : records)
      if (r.name == name && &r != good) return r.state;
    return std::nullopt;
  };
  EXPECT_EQ(state_of("good"), PluginState::kSkipped);  // zz_duplicate_good
  EXPECT_EQ(state_of("broken"), PluginState::kFailed);
  EXPECT_EQ(state_of("missing_library"), PluginState::kFailed);
  EXPECT_EQ(state_of("not_elf"), PluginState::kFailed);
  EXPECT_EQ(state_of("abi_major"), PluginState::kFailed);
  EXPECT_EQ(state_of("abi_descriptor"), PluginState::kFailed);
  EXPECT_EQ(state_of("no_entry"), PluginState::kFailed);
  EXPECT_EQ(state_of("init_error"), PluginState::kFailed);
  EXPECT_EQ(state_of("init_throws"), PluginState::kFailed);
  EXPECT_EQ(state_of("missing_dep"), PluginState::kFailed);
  EXPECT_EQ(state_of("wrong_type"), PluginState::kFailed);
  EXPECT_EQ(state_of("missing_key"), PluginState::kFailed);
  EXPECT_EQ(state_of("no_device"), PluginState::kSkipped);
  EXPECT_EQ(state_of("no_device_quiet"), PluginState::kSkipped);
}

TEST_F(PluginManagerTest, MissingDirectoriesAreIgnoredAndDirectoriesDeduplicated) {
  manager_->load_from({root_ / "does-not-exist", dir("good"), dir("good"), dir("good") / "." / ""});
  ASSERT_EQ(manager_->plugins().size(), 1u);
  EXPECT_EQ(manager_->plugins()[0].state, PluginState::kLoaded);
}

TEST_F(PluginManagerTest, LoadManifestDirectly) {
  manager_->load_manifest(dir("good") / "good.keel-plugin.toml");
  EXPECT_EQ(only().state, PluginState::kLoaded);
  manager_->load_manifest(dir("init_error") / "init_error.keel-plugin.toml");
  ASSERT_EQ(manager_->plugins().size(), 2u);
  EXPECT_EQ(manager_->plugins()[1].state, PluginState::kFailed);
  EXPECT_EQ(manager_->plugins()[1].id, 1);
  EXPECT_NE(registry_.device("fake"), nullptr);  // the failure of the second did not undo the first
}

// Mutated copies of the valid manifest (bytes changed to TOML's own punctuation, control bytes and invalid UTF-8,
// spans deleted, lines duplicated, the file cut short), each loaded by a fresh manager: every one ends loaded or
// failed with a reason, never crashes, and a failed one leaves nothing registered. The seed is printed; a failing
// case reruns with KEEL_MANIFEST_FUZZ_SEED.
TEST_F(PluginManagerTest, MutatedManifestsLoadOrFailWithAReason) {
  std::ifstream in(dir("good") / "good.keel-plugin.toml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string good = ss.str();
  // The library by absolute path, so that the copies may live anywhere.
  const std::string lib = "\"libkeel_fixture_good.so\"";
  ASSERT_NE(good.find(lib), std::string::npos);
  good.replace(good.find(lib), lib.size(), "\"" + (dir("good") / "libkeel_fixture_good.so").string() + "\"");
  const char* env_seed = std::getenv("KEEL_MANIFEST_FUZZ_SEED");
  const uint32_t seed = env_seed ? static_cast<uint32_t>(std::strtoul(env_seed, nullptr, 10)) : 20261204u;
  std::mt19937 rng(seed);
  const std::string alphabet = "[]{}=\"'#.,\n\t\\ 0123456789abcdefxyz-+:\x01\x7f\xc3\xff";
  const fs::path tmp = fs::temp_directory_path() / ("keel_manifest_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(tmp);
  constexpr int kCases = 300;
  int loaded = 0, failed = 0;
  for (int c = 0; c < kCases; ++c) {
    const std::string m = testing_util::mutated(good, rng, alphabet);
    const fs::path file = tmp / "good.keel-plugin.toml";
    std::ofstream(file, std::ios::binary | std::ios::trunc) << m;
    Registry reg;
    {
      PluginManager pm(reg);
      pm.load_manifest(file);
      ASSERT_EQ(pm.plugins().size(), 1u) << "seed " << seed << " case " << c;
      const PluginRecord& r = pm.plugins().front();
      if (r.state == PluginState::kLoaded) {
        ++loaded;
      } else {
        ++failed;
        EXPECT_FALSE(r.reason.empty()) << "seed " << seed << " case " << c;
        EXPECT_TRUE(reg.devices().empty() && reg.kernels().empty())
            << "seed " << seed << " case " << c << ": " << r.reason;
      }
    }
  }
  fs::remove_all(tmp);
  std::printf("%d mutated manifests (seed %u): %d loaded, %d failed with a reason\n", kCases, seed, loaded, failed);
  EXPECT_GT(failed, kCases / 4);  // most mutations break the manifest
}

// A built-in plugin: goes through the same checks and init.
keel_status_t builtin_count(void*, int32_t* n) {
  *n = 2;
  return nullptr;
}
keel_status_t builtin_alloc(void*, int32_t, uint64_t, uint64_t, void** p) {
  *p = nullptr;
  return make_c_status(KEEL_STATUS_UNIMPLEMENTED, "builtin");
}
void builtin_free(void*, int32_t, void*) {}
keel_status_t builtin_copy(void*, int32_t, int32_t, void*, int32_t, const void*, uint64_t, keel_stream_t) {
  return nullptr;
}
keel_status_t builtin_init(const keel_core_api_t* host, keel_plugin_handle_t* plugin) {
  keel_device_table_t t{};
  t.struct_size = sizeof(t);
  t.abi_major = KEEL_PLUGIN_ABI_MAJOR;
  t.abi_minor = KEEL_PLUGIN_ABI_MINOR;
  t.device_type = "builtin_dev";
  t.device_count = builtin_count;
  t.allocate = builtin_alloc;
  t.free = builtin_free;
  t.copy = builtin_copy;
  return host->register_device(plugin, &t);
}
const keel_plugin_t kBuiltin = {.struct_size = sizeof(keel_plugin_t),
                                .abi_major = KEEL_PLUGIN_ABI_MAJOR,
                                .abi_minor = KEEL_PLUGIN_ABI_MINOR,
                                .name = "builtin",
                                .version = "9.9",
                                .kind = KEEL_PLUGIN_KIND_DEVICE,
                                .init = builtin_init,
                                .shutdown = nullptr,
                                .init_instance = nullptr,
                                .shutdown_instance = nullptr};
const keel_plugin_t kBuiltinWrongAbi = {.struct_size = sizeof(keel_plugin_t),
                                        .abi_major = KEEL_PLUGIN_ABI_MAJOR + 1,
                                        .abi_minor = 0,
                                        .name = "builtin_new",
                                        .version = "9.9",
                                        .kind = KEEL_PLUGIN_KIND_DEVICE,
                                        .init = builtin_init,
                                        .shutdown = nullptr,
                                        .init_instance = nullptr,
                                        .shutdown_instance = nullptr};

TEST_F(PluginManagerTest, BuiltinPluginsUseTheSameChecks) {
  manager_->load_builtin(&kBuiltin, 0, "a built-in device");
  manager_->load_builtin(&kBuiltinWrongAbi, 0, "");
  manager_->load_builtin(nullptr, 0, "");
  ASSERT_EQ(manager_->plugins().size(), 3u);
  const PluginRecord& r = manager_->plugins()[0];
  EXPECT_EQ(r.state, PluginState::kLoaded) << r.reason;
  EXPECT_EQ(r.name, "builtin");
  EXPECT_EQ(r.version, "9.9");
  EXPECT_EQ(r.kind, "device");
  EXPECT_EQ(r.description, "a built-in device");
  EXPECT_EQ(r.library, fs::path("(built-in)"));
  ASSERT_NE(registry_.device("builtin_dev"), nullptr);
  EXPECT_EQ(registry_.device("builtin_dev")->device_count, 2);
  EXPECT_EQ(manager_->plugins()[1].state, PluginState::kFailed);
  EXPECT_CONTAINS(manager_->plugins()[1].reason, "plugin ABI " + next_abi() + ", core ABI " + core_abi());
  EXPECT_EQ(manager_->plugins()[2].state, PluginState::kFailed);
  EXPECT_CONTAINS(manager_->plugins()[2].reason, "NULL");
}

#ifdef KEEL_NULL_PLUGIN_DIR
TEST_F(PluginManagerTest, NullSkeletonLoadsAndEveryEntryIsUnimplemented) {
  manager_->load_manifest(fs::path(KEEL_NULL_PLUGIN_DIR) / "null.keel-plugin.toml");
  const PluginRecord& r = only();
  ASSERT_EQ(r.state, PluginState::kLoaded) << r.reason;
  const DeviceEntry* d = registry_.device("null");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->device_count, 1);
  void* p = reinterpret_cast<void*>(1);
  Status s = Status::from_c(d->table.allocate(d->table.user_data, 0, 64, 64, &p));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(p, nullptr);
  s = Status::from_c(d->table.copy(d->table.user_data, KEEL_COPY_HOST_TO_HOST, 0, nullptr, 0, nullptr, 0, nullptr));
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_EQ(registry_.kernels_for("", "Relu", 14, "null").size(), 1u);
}
#endif

// --- search path -------------------------------------------------------------------------------------------------

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

fs::path exe_plugin_dir() {
  return (fs::read_symlink("/proc/self/exe").parent_path() / ".." / "lib" / "keel" / "plugins").lexically_normal();
}

TEST(PluginSearchPath, ApiPathsThenEnvThenUserThenInstall) {
  ScopedEnv path("KEEL_PLUGIN_PATH", "/env/one::/env/two:");
  ScopedEnv home("HOME", "/home/someone");
  auto dirs = PluginManager::search_path({"/api/a", "/api/b"});
  std::vector<fs::path> want = {
      "/api/a", "/api/b", "/env/one", "/env/two", "/home/someone/.local/lib/keel/plugins", exe_plugin_dir()};
  EXPECT_EQ(dirs, want);
}

TEST(PluginSearchPath, WithoutHomeOrEnv) {
  ScopedEnv path("KEEL_PLUGIN_PATH", nullptr);
  ScopedEnv home("HOME", nullptr);
  auto dirs = PluginManager::search_path({});
  ASSERT_EQ(dirs.size(), 1u);
  EXPECT_EQ(dirs[0], exe_plugin_dir());
}

}  // namespace
}  // namespace keel
