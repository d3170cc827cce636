// What libkeel.so exports, read from its ELF file (no binutils needed):
//  - every defined dynamic symbol is a function that sdk/include/keel/keel.h declares with KEEL_API (or a version
//    node of core/libkeel.map): no C++ symbol of Keel, and none of the onnx / protobuf / spdlog / fmt / Boost / std::
//    template code instantiated inside it;
//  - every function keel.h declares is exported, under the version node KEEL_0.1;
//  - libkeel.so needs no other Keel library, and no binary of the build tree has two copies of the core (libkeel.so
//    and libkeel_core.so, directly or through a library it needs); plugins need neither.
// The paths come from CMake (tests/abi/CMakeLists.txt).
#include <cxxabi.h>
#include <elf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace keel {
namespace {

namespace fs = std::filesystem;

// A C++ symbol as a person reads it ("keel::Session::run(...)"); other names unchanged.
std::string demangle(const std::string& name) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> out(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && out ? std::string(out.get()) : name;
}

struct DynamicSymbol {
  std::string name;
  std::string version;  // the version node's name; empty when unversioned
  unsigned char type = 0;
  bool absolute = false;
};

// The dynamic part of a 64-bit ELF file: SONAME, NEEDED, the version nodes it defines, its defined global symbols.
struct ElfDynamic {
  std::string error;  // empty when read
  std::string soname;
  std::vector<std::string> needed;
  std::set<std::string> version_nodes;
  std::vector<DynamicSymbol> defined;
};

bool is_elf(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, ELFMAG, SELFMAG) == 0;
}

ElfDynamic read_elf_dynamic(const fs::path& path) {
  ElfDynamic out;
  std::ifstream in(path, std::ios::binary);
  auto read_at = [&](uint64_t offset, void* dst, uint64_t size) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(offset));
    return static_cast<bool>(in.read(static_cast<char*>(dst), static_cast<std::streamsize>(size)));
  };
  Elf64_Ehdr eh{};
  if (!in || !read_at(0, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) {
    out.error = path.string() + ": not an ELF file";
    return out;
  }
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr)) {
    out.error = path.string() + ": not a 64-bit ELF file";
    return out;
  }
  uint64_t count = eh.e_shnum;
  Elf64_Shdr first{};
  if (count == 0 && eh.e_shoff != 0 && read_at(eh.e_shoff, &first, sizeof first)) count = first.sh_size;
  std::vector<Elf64_Shdr> sh(count);
  if (count == 0 || !read_at(eh.e_shoff, sh.data(), count * sizeof(Elf64_Shdr))) {
    out.error = path.string() + ": no section headers";
    return out;
  }
  auto section = [&](uint64_t index) {
    std::string bytes;
    if (index >= sh.size() || sh[index].sh_type == SHT_NOBITS) return bytes;
    bytes.resize(sh[index].sh_size);
    if (!read_at(sh[index].sh_offset, bytes.data(), bytes.size())) bytes.clear();
    return bytes;
  };
  auto string_at = [](const std::string& table, uint64_t offset) {
    return offset < table.size() ? std::string(table.c_str() + offset) : std::string();
  };

  std::map<uint16_t, std::string> version_of_index;
  for (uint64_t i = 0; i < sh.size(); ++i) {
    if (sh[i].sh_type == SHT_DYNAMIC) {
      std::string dyn = section(i), strings = section(sh[i].sh_link);
      for (size_t off = 0; off + sizeof(Elf64_Dyn) <= dyn.size(); off += sizeof(Elf64_Dyn)) {
        Elf64_Dyn d;
        std::memcpy(&d, dyn.data() + off, sizeof d);
        if (d.d_tag == DT_NEEDED) out.needed.push_back(string_at(strings, d.d_un.d_val));
        if (d.d_tag == DT_SONAME) out.soname = string_at(strings, d.d_un.d_val);
      }
    } else if (sh[i].sh_type == SHT_GNU_verdef) {
      std::string defs = section(i), strings = section(sh[i].sh_link);
      for (size_t off = 0, n = 0; off + sizeof(Elf64_Verdef) <= defs.size() && n < sh[i].sh_info; ++n) {
        Elf64_Verdef vd;
        std::memcpy(&vd, defs.data() + off, sizeof vd);
        Elf64_Verdaux aux;
        if (off + vd.vd_aux + sizeof aux > defs.size()) break;
        std::memcpy(&aux, defs.data() + off + vd.vd_aux, sizeof aux);
        std::string name = string_at(strings, aux.vda_name);
        version_of_index[vd.vd_ndx] = name;
        if ((vd.vd_flags & VER_FLG_BASE) == 0) out.version_nodes.insert(name);
        if (vd.vd_next == 0) break;
        off += vd.vd_next;
      }
    }
  }
  for (uint64_t i = 0; i < sh.size(); ++i) {
    if (sh[i].sh_type != SHT_DYNSYM) continue;
    std::string syms = section(i), strings = section(sh[i].sh_link), versym;
    for (uint64_t j = 0; j < sh.size(); ++j)
      if (sh[j].sh_type == SHT_GNU_versym && sh[j].sh_link == i) versym = section(j);
    for (size_t k = 0; (k + 1) * sizeof(Elf64_Sym) <= syms.size(); ++k) {
      Elf64_Sym s;
      std::memcpy(&s, syms.data() + k * sizeof s, sizeof s);
      unsigned char bind = ELF64_ST_BIND(s.st_info);
      if (s.st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE)) continue;
      DynamicSymbol d{string_at(strings, s.st_name), "", static_cast<unsigned char>(ELF64_ST_TYPE(s.st_info)),
                      s.st_shndx == SHN_ABS};
      if ((k + 1) * sizeof(Elf64_Half) <= versym.size()) {
        Elf64_Half v;
        std::memcpy(&v, versym.data() + k * sizeof v, sizeof v);
        auto it = version_of_index.find(v & 0x7fff);
        if (it != version_of_index.end()) d.version = it->second;
      }
      out.defined.push_back(std::move(d));
    }
  }
  return out;
}

// The functions keel.h declares: `KEEL_API <return type> keel_name(`.
std::set<std::string> declared_c_api() {
  std::ifstream in(KEEL_H_FILE);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  static const std::regex decl(R"(KEEL_API\s+[^;{}()#]*?\b(keel_\w+)\s*\()");
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), decl); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1].str());
  return out;
}

// Demangled prefixes of a C++ API exported on purpose, each matching a version node of core/libkeel.map (the map's
// header shows the form, e.g. "keel::train::" and "typeinfo for keel::train::"). Empty: only the C API is exported.
const std::vector<std::string> kDeliberateCppExports = {};

bool deliberately_exported(const DynamicSymbol& s) {
  std::string readable = demangle(s.name);
  return std::any_of(kDeliberateCppExports.begin(), kDeliberateCppExports.end(),
                     [&](const std::string& prefix) { return readable.rfind(prefix, 0) == 0; });
}

class LibkeelSymbols : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = declared_c_api();
    ASSERT_GE(api_.size(), 40u) << "keel.h (" << KEEL_H_FILE << ") declares only " << api_.size()
                                << " KEEL_API functions: the parser no longer understands it";
    ASSERT_TRUE(api_.count("keel_version_string") && api_.count("keel_session_run"));
    lib_ = read_elf_dynamic(KEEL_LIBRARY_FILE);
    ASSERT_EQ(lib_.error, "");
  }
  std::set<std::string> api_;
  ElfDynamic lib_;
};

TEST_F(LibkeelSymbols, ExportsOnlyTheCApi) {
  std::vector<std::string> unexpected;
  for (const auto& s : lib_.defined) {
    if (s.absolute && lib_.version_nodes.count(s.name)) continue;  // the version node's own marker symbol
    if (api_.count(s.name) || deliberately_exported(s)) continue;
    unexpected.push_back(demangle(s.name));
  }
  std::sort(unexpected.begin(), unexpected.end());
  std::string listing;
  for (size_t i = 0; i < unexpected.size() && i < 40; ++i) listing += "\n  " + unexpected[i];
  EXPECT_TRUE(unexpected.empty()) << KEEL_LIBRARY_FILE << " exports " << unexpected.size()
                                  << " symbols that keel.h does not declare (core/libkeel.map decides):" << listing;
}

TEST_F(LibkeelSymbols, ExportsEveryDeclaredFunctionUnderKeel01) {
  std::map<std::string, const DynamicSymbol*> exported;
  for (const auto& s : lib_.defined) exported[s.name] = &s;
  for (const auto& name : api_) {
    auto it = exported.find(name);
    if (it == exported.end()) {
      ADD_FAILURE() << "keel.h declares " << name << " but " << KEEL_LIBRARY_FILE << " does not export it";
      continue;
    }
    EXPECT_EQ(it->second->type, STT_FUNC) << name;
    EXPECT_EQ(it->second->version, "KEEL_0.1") << name << " is not in core/libkeel.map's version node KEEL_0.1";
  }
  EXPECT_EQ(lib_.soname, "libkeel.so.0");
}

// libkeel_core.so is the same core with its C++ symbols (the in-tree consumers' library): it must export them, or
// the tools and tests would not link; and it is not the product, so it has no version node.
TEST(LibkeelCoreSymbols, ExportsTheCppInternals) {
  ElfDynamic core = read_elf_dynamic(KEEL_CORE_LIBRARY_FILE);
  ASSERT_EQ(core.error, "");
  size_t cpp = 0;
  for (const auto& s : core.defined) cpp += s.name.rfind("_ZN4keel", 0) == 0;
  EXPECT_GT(cpp, 100u) << KEEL_CORE_LIBRARY_FILE << " exports only " << cpp << " keel:: symbols";
  EXPECT_TRUE(core.version_nodes.empty());
}

// The Keel libraries each ELF file of the build tree loads, directly or through the build tree's libraries.
TEST(OneCorePerProcess, NoBinaryLoadsBothLibraries) {
  const fs::path build = KEEL_BUILD_DIR;
  std::map<std::string, std::vector<std::string>> needed_by_soname;  // the build tree's own libraries
  std::vector<std::pair<fs::path, ElfDynamic>> files;
  std::error_code ec;
  for (const fs::path& dir : {build / "bin", build / "lib", build / "test-plugins"}) {
    if (!fs::is_directory(dir, ec)) continue;
    for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::recursive_directory_iterator(); ++it) {
      if (!it->is_regular_file(ec) || it->is_symlink(ec) || !is_elf(it->path())) continue;
      ElfDynamic e = read_elf_dynamic(it->path());
      if (!e.error.empty()) continue;  // object files, 32-bit fixtures
      if (!e.soname.empty()) needed_by_soname[e.soname] = e.needed;
      files.emplace_back(it->path(), std::move(e));
    }
  }
  const std::string libkeel = "libkeel.so.0", core = "libkeel_core.so.0";
  size_t with_core = 0, with_libkeel = 0, plugins = 0;
  for (const auto& [path, elf] : files) {
    std::set<std::string> seen;
    std::vector<std::string> todo = elf.needed;
    while (!todo.empty()) {
      std::string next = todo.back();
      todo.pop_back();
      if (!seen.insert(next).second) continue;
      auto it = needed_by_soname.find(next);
      if (it != needed_by_soname.end()) todo.insert(todo.end(), it->second.begin(), it->second.end());
    }
    bool has_libkeel = seen.count(libkeel) || elf.soname == libkeel;
    bool has_core = seen.count(core) || elf.soname == core;
    with_core += has_core;
    with_libkeel += has_libkeel;
    EXPECT_FALSE(has_libkeel && has_core)
        << path << " loads both " << libkeel << " and " << core << ": two copies of the core in one process";
    bool plugin = path.string().find("/lib/keel/plugins/") != std::string::npos ||
                  path.string().find("/test-plugins/") != std::string::npos;
    if (plugin) {
      ++plugins;
      EXPECT_FALSE(has_libkeel || has_core) << "plugin " << path << " links a Keel library; plugins use sdk/ only";
    }
  }
  EXPECT_GT(with_core, 1u) << "no binary of " << build << " links " << core << ": is the tree built?";
  EXPECT_GE(with_libkeel, 1u);
  EXPECT_GT(plugins, 0u) << "no plugin found under " << build;
}

}  // namespace
}  // namespace keel
