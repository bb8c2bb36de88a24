// ABI cases: the plugin as a shared library speaking kiln/plugin_api.h, driven by hand with host
// tables and structs the suite controls (harness.h): what it exports, how it negotiates versions,
// how it reads structs of other sizes, what it does with NULL optional host functions, what its
// errors look like, and whether loading it over and over leaks.
#include <elf.h>
#include <malloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <thread>

#include <ATen/ATen.h>

#include "harness.h"

namespace kiln::conformance {
namespace {

namespace fs = std::filesystem;

// ---- ELF: the dynamic symbols a library defines and exports ----

struct Export {
  std::string name;
  unsigned type;  // STT_*
};

std::vector<Export> exported_symbols(const std::string& path, std::string* error) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<Export> out;
  if (data.size() < sizeof(Elf64_Ehdr) || std::memcmp(data.data(), ELFMAG, SELFMAG) != 0) {
    *error = "not an ELF file";
    return out;
  }
  if (data[EI_CLASS] != ELFCLASS64) {
    *error = "not a 64-bit ELF file";
    return out;
  }
  Elf64_Ehdr eh;
  std::memcpy(&eh, data.data(), sizeof eh);
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, data.data() + eh.e_shoff + i * eh.e_shentsize, sizeof sh);
    return sh;
  };
  if (eh.e_shoff == 0 || eh.e_shoff + static_cast<size_t>(eh.e_shnum) * eh.e_shentsize > data.size()) {
    *error = "no section headers";
    return out;
  }
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_DYNSYM) continue;
    const Elf64_Shdr strtab = section(sh.sh_link);
    for (size_t k = 1; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym;
      std::memcpy(&sym, data.data() + sh.sh_offset + k * sizeof(Elf64_Sym), sizeof sym);
      const unsigned bind = ELF64_ST_BIND(sym.st_info), type = ELF64_ST_TYPE(sym.st_info);
      if (sym.st_shndx == SHN_UNDEF) continue;  // imported
      if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) continue;
      if (type == STT_SECTION || type == STT_FILE) continue;
      const char* name = data.data() + strtab.sh_offset + sym.st_name;
      if (*name) out.push_back({name, type});
    }
  }
  return out;
}

// ---- Functions over a raw context ----

// The availability answer with every struct exact-size and guarded, or padded.
struct AvailabilityAnswer {
  bool called = false;  // false: `available` is NULL
  RawContext::Status status;
  int32_t available = 0;
  std::string reason;
};

AvailabilityAnswer ask_available(const RawContext& ctx, const std::vector<PluginDevice>& devices, StructLayout layout) {
  AvailabilityAnswer a;
  const KilnPluginApi* api = ctx.api();
  if (!api->available) return a;
  a.called = true;
  Arena arena;
  DeviceInfoArray infos(devices);
  const size_t extra = layout == StructLayout::Padded ? 64 : 0;
  std::vector<const KilnDeviceInfo*> ptrs;
  for (size_t i = 0; i < infos.size(); ++i) {
    auto* d = static_cast<char*>(arena.guarded(KILN_DEVICE_INFO_STRUCT_SIZE + extra));
    std::memcpy(d, infos.data()[i], KILN_DEVICE_INFO_STRUCT_SIZE);
    std::memset(d + KILN_DEVICE_INFO_STRUCT_SIZE, 0xA5, extra);
    reinterpret_cast<KilnDeviceInfo*>(d)->struct_size = KILN_DEVICE_INFO_STRUCT_SIZE + extra;
    ptrs.push_back(reinterpret_cast<KilnDeviceInfo*>(d));
  }
  auto* out = static_cast<char*>(arena.guarded(KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE + extra));
  std::memset(out, 0, KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE + extra);
  auto* av = reinterpret_cast<KilnPluginAvailableArgs*>(out);
  av->struct_size = KILN_PLUGIN_AVAILABLE_ARGS_STRUCT_SIZE + extra;
  av->plugin_ctx = api->plugin_ctx;
  av->devices = ptrs.data();
  av->num_devices = ptrs.size();
  av->reason_capacity = 256;
  av->reason = static_cast<char*>(arena.guarded(256));
  std::memset(av->reason, 0, 256);
  a.status = ctx.status_of(api->available(av));
  a.available = av->available;
  a.reason.assign(av->reason, strnlen(av->reason, 256));
  return a;
}

// What one context does with the sample graphs: claims per graph, compile status per group and,
// for groups that compiled, how far their outputs are from the eager executor's.
struct GraphOutcome {
  RawContext::Status claim;
  std::vector<int64_t> claims;
  std::vector<RawContext::Status> compiles;
  std::vector<std::string> execute_problems;
  size_t executed = 0;
};

// env: the sample's eager values when the caller computed them already (LoadUnloadAndReload...
// computes them once, so that LibTorch's own allocations are not counted as the plugin's).
GraphOutcome drive(const RawContext& ctx, const SampleGraph& s, StructLayout layout,
                   const std::vector<at::Tensor>* given_env = nullptr) {
  GraphOutcome o;
  GraphView full(s.graph);
  {
    Arena arena;
    progress("claim " + s.label);
    o.claim = ctx.claim(copy_view(full.view(), arena, layout), &o.claims);
  }
  if (!o.claim.ok) return o;
  std::vector<at::Tensor> computed;
  const auto& env = given_env ? *given_env : (computed = eager_env(s.graph, s.inputs));
  for (const auto& pg : groups_of(s.graph, o.claims)) {
    GraphView sub(s.graph, pg.nodes, pg.inputs, pg.outputs);
    KilnExecutable* exe = nullptr;
    {
      Arena arena;
      progress("compile a group of " + std::to_string(pg.nodes.size()) + " nodes of " + s.label);
      o.compiles.push_back(ctx.compile(copy_view(sub.view(), arena, layout), KILN_MODE_DEFAULT, {}, &exe));
    }
    if (!o.compiles.back().ok || !exe) continue;
    std::vector<DLTensor> in, out;
    std::vector<at::Tensor> outs;
    for (auto v : pg.inputs) in.push_back(to_dl_tensor(env[v]));
    for (auto v : pg.outputs) outs.push_back(poisoned(s.graph.value(v).meta));
    for (auto& t : outs) out.push_back(to_dl_tensor(t));
    progress("execute a group of " + std::to_string(pg.nodes.size()) + " nodes of " + s.label);
    auto st = ctx.execute(exe, in, out);
    if (!st.ok) {
      o.execute_problems.push_back(s.label + ": execute failed: " + st.message);
    } else {
      ++o.executed;
      for (size_t k = 0; k < pg.outputs.size(); ++k) {
        const double e = rel_err(outs[k], env[pg.outputs[k]]);
        if (!(e <= tolerance(env[pg.outputs[k]].scalar_type(), true)))
          o.execute_problems.push_back(s.label + ": output " + std::to_string(k) + " off by " + std::to_string(e));
      }
    }
    ctx.destroy(exe);
  }
  return o;
}

std::string status_text(const RawContext::Status& s) {
  return s.ok ? "ok" : std::string(error_code_name(s.code)) + ": " + s.message;
}

bool is_coded(const RawContext::Status& s) {
  return s.ok || (s.code >= KILN_ERROR_UNKNOWN && s.code <= KILN_ERROR_ABI_MISMATCH && !s.message.empty());
}

uint32_t plugin_minor() {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  return ctx.ok() ? ctx.api()->abi_minor : KILN_ABI_VERSION_MINOR;
}

// Claims and compile results must not depend on how the host laid out its structs.
void expect_same(const GraphOutcome& a, const GraphOutcome& b, const std::string& what) {
  EXPECT_EQ(a.claim.ok, b.claim.ok) << what << ": claim " << status_text(a.claim) << " vs " << status_text(b.claim);
  EXPECT_EQ(a.claims, b.claims) << what << ": claims differ";
  ASSERT_EQ(a.compiles.size(), b.compiles.size()) << what;
  for (size_t i = 0; i < a.compiles.size(); ++i)
    EXPECT_EQ(a.compiles[i].ok ? 0 : a.compiles[i].code, b.compiles[i].ok ? 0 : b.compiles[i].code)
        << what << ": compile of group " << i << ": " << status_text(a.compiles[i]) << " vs "
        << status_text(b.compiles[i]);
  for (const auto& p : b.execute_problems) ADD_FAILURE() << what << ": " << p;
}

// ---- Cases ----

TEST(ABI, ExportsOnlyTheEntrySymbol) {
  std::string error;
  const auto syms = exported_symbols(settings().plugin_path, &error);
  ASSERT_TRUE(error.empty()) << settings().plugin_path << ": " << error;
  bool entry = false;
  std::vector<std::string> extra;
  for (const auto& s : syms) {
    if (s.name == KILN_PLUGIN_INIT_SYMBOL) {
      entry = true;
      EXPECT_EQ(s.type, static_cast<unsigned>(STT_FUNC))
          << KILN_PLUGIN_INIT_SYMBOL " is exported but is not a function";
    } else {
      extra.push_back(s.name);
    }
  }
  EXPECT_TRUE(entry) << "the library does not export " KILN_PLUGIN_INIT_SYMBOL;
  std::string list;
  for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
  EXPECT_TRUE(extra.empty()) << extra.size() << " other symbols exported (" << list << (extra.size() > 8 ? ", ..." : "")
                             << "); hide them with a version script (kiln_add_plugin does)";
  note("exports " KILN_PLUGIN_INIT_SYMBOL " only");
}

TEST(ABI, InitReturnsAWellFormedTable) {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << "kiln_plugin_init refused a host of ABI " << KILN_ABI_VERSION_MAJOR << "."
                        << KILN_ABI_VERSION_MINOR << ": " << ctx.error();
  const KilnPluginApi* api = ctx.api();
  EXPECT_GE(api->struct_size, KILN_PLUGIN_API_STRUCT_SIZE)
      << "table smaller than the ABI " << KILN_ABI_VERSION_MAJOR << ".0 layout";
  EXPECT_EQ(api->abi_major, static_cast<uint32_t>(KILN_ABI_VERSION_MAJOR));
  EXPECT_TRUE(api->error_code && api->error_message && api->error_destroy) << "error functions are required";
  EXPECT_NE(api->descriptor, nullptr) << "descriptor is required";
  EXPECT_NE(api->claim, nullptr) << "claim is required";
  EXPECT_NE(api->compile, nullptr) << "compile is required";
  EXPECT_NE(api->execute, nullptr) << "execute is required";
  EXPECT_NE(api->executable_destroy, nullptr) << "executable_destroy is required";
  // kiln's own loader agrees.
  std::shared_ptr<LoadedPlugin> p;
  try {
    p = loaded_plugin();
  } catch (const std::exception& e) {
    FAIL() << "kiln's loader rejects the plugin: " << e.what();
  }
  note(p->name() + " " + p->version() + " by " + p->vendor() + ", ABI " + p->abi_version() + "; available " +
       (api->available ? "implemented" : "NULL") + ", shutdown " + (api->shutdown ? "implemented" : "NULL"));
}

TEST(ABI, DescriptorIsSane) {
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  const KilnPluginDescriptor* d = ctx.api()->descriptor;
  ASSERT_NE(d, nullptr);
  EXPECT_GE(d->struct_size, KILN_PLUGIN_DESCRIPTOR_STRUCT_SIZE);
  ASSERT_NE(d->name, nullptr) << "name is required";
  EXPECT_TRUE(std::regex_match(d->name, std::regex("[a-z0-9_]{1,64}")))
      << "name '" << d->name << "' is not [a-z0-9_]+ (at most 64)";
  ASSERT_NE(d->version, nullptr) << "version is required";
  EXPECT_GT(std::strlen(d->version), 0u) << "version is empty";
  ASSERT_NE(d->vendor, nullptr) << "vendor is required";
  EXPECT_GT(std::strlen(d->vendor), 0u) << "vendor is empty";
  if (d->description) {
    EXPECT_EQ(std::strchr(d->description, '\n'), nullptr) << "description should be one line";
  }
  EXPECT_NE(d->device_kinds, 0u) << "device_kinds names no device";
  EXPECT_EQ(d->device_kinds & ~0xFu, 0u) << "device_kinds has unknown bits: 0x" << std::hex << d->device_kinds;
  EXPECT_TRUE(d->modes & KILN_MODE_BIT(KILN_MODE_DEFAULT)) << "modes must include default";
  EXPECT_EQ(d->modes & ~KILN_MODE_MASK_ALL, 0u) << "modes has unknown bits: 0x" << std::hex << d->modes;
  EXPECT_EQ(d->reserved0, 0u) << "reserved0 must be 0";
  // A second context describes the same plugin.
  RawContext again(lib, {});
  ASSERT_TRUE(again.ok()) << "a second init failed: " << again.error();
  const KilnPluginDescriptor* e = again.api()->descriptor;
  EXPECT_STREQ(d->name, e->name);
  EXPECT_STREQ(d->version, e->version);
  EXPECT_EQ(d->device_kinds, e->device_kinds);
  EXPECT_EQ(d->modes, e->modes);
  EXPECT_EQ(d->capabilities, e->capabilities);
  EXPECT_EQ(d->default_score, e->default_score);
  const bool concurrent = (d->capabilities & KILN_CAPABILITY_CONCURRENT_EXECUTE) != 0;
  note(std::string(d->name) + " " + d->version + ": devices " + device_kinds_string(d->device_kinds) + ", modes " +
       modes_string(d->modes) + ", concurrent execute " + (concurrent ? "safe" : "not safe"));
}

TEST(ABI, NegotiatesWithAHostOneMinorNewer) {
  RawLibrary lib(settings().plugin_path);
  const uint32_t minor = plugin_minor();
  HostTableSpec newer;
  newer.abi_minor = minor + 1;
  newer.struct_size = KILN_HOST_API_STRUCT_SIZE + 16;  // two fields this header does not know
  RawContext ctx(lib, newer);
  const std::string major = std::to_string(KILN_ABI_VERSION_MAJOR) + ".";
  ASSERT_TRUE(ctx.ok()) << "refused a host of ABI " << major << newer.abi_minor << " (one minor newer than its "
                        << major << minor << "): " << ctx.error();
  EXPECT_EQ(ctx.api()->abi_major, static_cast<uint32_t>(KILN_ABI_VERSION_MAJOR));
  EXPECT_EQ(ctx.api()->abi_minor, minor) << "the plugin must say the version it was built for, not the host's";
  RawContext base(lib, {});
  ASSERT_TRUE(base.ok()) << base.error();
  for (const auto& s : sample_graphs())
    expect_same(drive(base, s, StructLayout::Exact), drive(ctx, s, StructLayout::Exact), s.label);
  note("host " + major + std::to_string(newer.abi_minor) + " accepted; effective ABI " + major + std::to_string(minor));
}

TEST(ABI, NegotiatesWithAHostOneMinorOlder) {
  const uint32_t minor = plugin_minor();
  if (minor == 0)
    GTEST_SKIP() << "the plugin is at ABI " << KILN_ABI_VERSION_MAJOR << ".0: no host older than minor 0 exists";
  RawLibrary lib(settings().plugin_path);
  HostTableSpec older;
  older.abi_minor = std::min<uint32_t>(minor - 1, KILN_ABI_VERSION_MINOR);
  RawContext ctx(lib, older);
  ASSERT_TRUE(ctx.ok()) << "refused a host of ABI " << KILN_ABI_VERSION_MAJOR << "." << older.abi_minor << ": "
                        << ctx.error();
  EXPECT_EQ(ctx.api()->abi_major, static_cast<uint32_t>(KILN_ABI_VERSION_MAJOR));
  // Each struct lies against a guard page, so reading past what the host wrote faults. A 2.3 host
  // writes the graph view, the compile args and the execute args without 2.4's fields (symbols,
  // symbolic_accepted, symbol_values): a plugin that touches them without KILN_HAS_FIELD crashes
  // here.
  const StructLayout layout = older.abi_minor < 4 ? StructLayout::Minor3 : StructLayout::Exact;
  RawContext base(lib, {});
  ASSERT_TRUE(base.ok()) << base.error();
  size_t executed = 0;
  for (const auto& s : sample_graphs()) {
    auto o = drive(ctx, s, layout);
    expect_same(
        drive(base, s, StructLayout::Exact), o,
        s.label + " (host " + std::to_string(KILN_ABI_VERSION_MAJOR) + "." + std::to_string(older.abi_minor) + ")");
    executed += o.executed;
  }
  note("host " + std::to_string(KILN_ABI_VERSION_MAJOR) + "." + std::to_string(older.abi_minor) +
       " with its own struct layout accepted; same claims and compiles; " + std::to_string(executed) +
       " groups executed");
}

TEST(ABI, RefusesAHostOfAnotherMajor) {
  RawLibrary lib(settings().plugin_path);
  for (uint32_t major :
       {static_cast<uint32_t>(KILN_ABI_VERSION_MAJOR + 1), static_cast<uint32_t>(KILN_ABI_VERSION_MAJOR - 1)}) {
    HostTableSpec other;
    other.abi_major = major;
    other.abi_minor = 0;
    progress("init with a host of ABI " + std::to_string(major) + ".0");
    RawContext ctx(lib, other);
    EXPECT_FALSE(ctx.ok()) << "accepted a host of ABI " << major << ".0";
    if (ctx.ok()) continue;
    EXPECT_EQ(ctx.error_code(), KILN_ERROR_ABI_MISMATCH)
        << "host " << major << ".0 refused, but not with KILN_ERROR_ABI_MISMATCH: " << ctx.error();
    EXPECT_NE(ctx.error().find(std::to_string(major)), std::string::npos)
        << "the message should name the host's version " << major << ".0: " << ctx.error();
  }
  note("hosts " + std::to_string(KILN_ABI_VERSION_MAJOR + 1) + ".0 and " + std::to_string(KILN_ABI_VERSION_MAJOR - 1) +
       ".0 refused with KILN_ERROR_ABI_MISMATCH");
}

TEST(ABI, AcceptsStructsLargerThanItsOwn) {
  RawLibrary lib(settings().plugin_path);
  RawContext base(lib, {});
  ASSERT_TRUE(base.ok()) << base.error();
  HostTableSpec larger;
  larger.struct_size = KILN_HOST_API_STRUCT_SIZE + 64;
  RawContext big(lib, larger);
  ASSERT_TRUE(big.ok()) << "refused a host table 64 bytes larger than its own: " << big.error();
  auto a = ask_available(base, probe_devices(), StructLayout::Exact);
  auto b = ask_available(big, probe_devices(), StructLayout::Padded);
  EXPECT_EQ(a.status.ok, b.status.ok) << status_text(a.status) << " vs " << status_text(b.status);
  EXPECT_EQ(a.available, b.available) << "availability depends on the device and availability struct sizes";
  EXPECT_EQ(a.reason, b.reason);
  size_t executed = 0;
  for (const auto& s : sample_graphs()) {
    auto exact = drive(base, s, StructLayout::Exact);
    auto padded = drive(big, s, StructLayout::Padded);
    expect_same(exact, padded, s.label + " (structs +64 bytes)");
    executed += padded.executed;
  }
  note("host table, devices, availability, graph, values, nodes, args +64 bytes: same answers; " +
       std::to_string(executed) + " groups executed");
}

TEST(ABI, ReadsNothingPastStructSize) {
  // Every struct ends at a page that faults: reading past struct_size crashes this case.
  RawLibrary lib(settings().plugin_path);
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  auto a = ask_available(ctx, probe_devices(), StructLayout::Exact);
  EXPECT_TRUE(is_coded(a.status)) << status_text(a.status);
  for (const auto& s : sample_graphs()) {
    auto o = drive(ctx, s, StructLayout::Exact);
    EXPECT_TRUE(is_coded(o.claim)) << s.label << ": " << status_text(o.claim);
    for (const auto& p : o.execute_problems) ADD_FAILURE() << p;
  }
  // A host table smaller than the plugin's own (one that ends before call_eager): refused with a
  // coded error, or accepted without reading the missing field.
  HostTableSpec smaller;
  smaller.struct_size = offsetof(KilnHostApi, call_eager);
  progress("init with a host table that ends before call_eager");
  RawContext small(lib, smaller);
  if (!small.ok()) {
    EXPECT_GE(small.error_code(), KILN_ERROR_UNKNOWN) << small.error();
    EXPECT_LE(small.error_code(), KILN_ERROR_ABI_MISMATCH) << small.error();
    note("every struct read within its struct_size; a host table smaller than its own refused: " + small.error());
  } else {
    for (const auto& s : sample_graphs()) drive(small, s, StructLayout::Exact);
    note("every struct read within its struct_size; a host table smaller than its own accepted and respected");
  }
}

TEST(ABI, TreatsNullOptionalHostFunctionsAsUnimplemented) {
  RawLibrary lib(settings().plugin_path);
  HostTableSpec bare;
  bare.null_optionals = true;  // device_alloc, device_free, call_eager
  RawContext ctx(lib, bare);
  if (!ctx.ok()) {
    EXPECT_TRUE(ctx.error_code() >= KILN_ERROR_UNKNOWN && ctx.error_code() <= KILN_ERROR_ABI_MISMATCH) << ctx.error();
    note("refuses a host without device memory and call_eager: " + ctx.error());
    return;
  }
  auto a = ask_available(ctx, probe_devices(), StructLayout::Exact);
  EXPECT_TRUE(is_coded(a.status)) << status_text(a.status);
  size_t executed = 0;
  for (const auto& s : sample_graphs()) {
    auto o = drive(ctx, s, StructLayout::Exact);
    EXPECT_TRUE(is_coded(o.claim)) << s.label << ": claim " << status_text(o.claim);
    for (const auto& c : o.compiles) EXPECT_TRUE(is_coded(c)) << s.label << ": compile " << status_text(c);
    for (const auto& p : o.execute_problems) ADD_FAILURE() << p;
    executed += o.executed;
  }
  note("without device_alloc/device_free/call_eager: no call to them; " + std::to_string(executed) +
       " groups still executed");
}

TEST(ABI, ErrorsCarryACodeAndAMessage) {
  RawLibrary lib(settings().plugin_path);
  size_t seen = 0;
  auto check = [&](const std::string& what, const RawContext::Status& s) {
    if (s.ok) return;
    ++seen;
    EXPECT_GE(s.code, KILN_ERROR_UNKNOWN) << what << ": code " << s.code << " is not a KilnErrorCode";
    EXPECT_LE(s.code, KILN_ERROR_ABI_MISMATCH) << what << ": code " << s.code << " is not a KilnErrorCode";
    EXPECT_FALSE(s.message.empty()) << what << ": empty message (code " << s.code << ")";
  };
  {
    HostTableSpec other;
    other.abi_major = KILN_ABI_VERSION_MAJOR + 1;
    RawContext ctx(lib, other);
    if (!ctx.ok())
      check("init with host " + std::to_string(KILN_ABI_VERSION_MAJOR + 1) + ".0",
            RawContext::Status{false, ctx.error_code(), ctx.error()});
  }
  RawContext ctx(lib, {});
  ASSERT_TRUE(ctx.ok()) << ctx.error();
  for (const auto& s : sample_graphs()) {
    GraphView full(s.graph);
    KilnExecutable* exe = nullptr;
    auto st = ctx.compile(&full.view(), static_cast<KilnMode>(99), {}, &exe);
    check(s.label + ": compile with mode 99", st);
    ctx.destroy(exe);
    exe = nullptr;
    st = ctx.compile(&full.view(), KILN_MODE_DEFAULT, {{"kiln_conformance_no_such_option", "1"}}, &exe);
    check(s.label + ": compile with an unknown option", st);
    ctx.destroy(exe);
  }
  EXPECT_GT(seen, 0u) << "no error could be provoked";
  note(std::to_string(seen) + " errors, each with a KilnErrorCode and a message, freed by error_destroy");
}

size_t count_fds() {
  size_t n = 0;
  for (auto it = fs::directory_iterator("/proc/self/fd"); it != fs::directory_iterator(); ++it) ++n;
  return n;
}
size_t count_threads() {
  size_t n = 0;
  for (auto it = fs::directory_iterator("/proc/self/task"); it != fs::directory_iterator(); ++it) ++n;
  return n;
}
size_t count_maps(const std::string& needle) {
  std::ifstream f("/proc/self/maps");
  std::string line;
  size_t n = 0, all = 0;
  while (std::getline(f, line)) {
    ++all;
    if (needle.empty() || line.find(needle) != std::string::npos) ++n;
  }
  return needle.empty() ? all : n;
}

// Whether a shared library carries its own copy of libstdc++: it does not name libstdc++.so among
// the libraries it needs, yet holds libstdc++'s internals (the __gnu_cxx namespace's names).
bool links_libstdcxx_statically(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return bytes.find("libstdc++.so") == std::string::npos && bytes.find("__gnu_cxx") != std::string::npos;
}

TEST(ABI, LoadUnloadAndReloadWithoutLeaks) {
  const std::string real = fs::canonical(settings().plugin_path).string();
  const auto samples = sample_graphs();
  // The reference values are LibTorch's, computed once, outside the measured cycles.
  const auto env = eager_env(samples.front().graph, samples.front().inputs);
  auto cycle = [&] {
    RawLibrary lib(settings().plugin_path);
    RawContext ctx(lib, {});
    ASSERT_TRUE(ctx.ok()) << ctx.error();
    drive(ctx, samples.front(), StructLayout::Exact, &env);
  };
  progress("load/init/claim/compile/execute/shutdown/unload, warm-up");
  cycle();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const size_t fds0 = count_fds(), threads0 = count_threads(), maps0 = count_maps(""), file0 = count_maps(real);
  const size_t heap0 = mallinfo2().uordblks;
  constexpr int kCycles = 20;
  for (int i = 0; i < kCycles; ++i) {
    progress("cycle " + std::to_string(i + 1) + " of " + std::to_string(kCycles));
    cycle();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const size_t heap1 = mallinfo2().uordblks;
  EXPECT_EQ(count_fds(), fds0) << "file descriptors left open after " << kCycles << " cycles";
  EXPECT_LE(count_threads(), threads0) << "threads left running after " << kCycles << " cycles (join them in shutdown)";
  EXPECT_LE(count_maps(""), maps0 + 2) << "memory mappings grew over " << kCycles << " cycles";
  EXPECT_LE(count_maps(real), file0) << "mappings of the library grew over " << kCycles << " cycles";
  double grew_kib = heap1 > heap0 ? static_cast<double>(heap1 - heap0) / 1024 : 0.0;
  // Where the heap goes, when it grows: the same number of cycles that only load and unload, and
  // that also init and shut down (each after one warm-up).
  auto growth_kib = [&](const std::function<void()>& c) {
    c();
    const size_t h0 = mallinfo2().uordblks;
    for (int i = 0; i < kCycles; ++i) c();
    const size_t h1 = mallinfo2().uordblks;
    return h1 > h0 ? static_cast<double>(h1 - h0) / 1024 : 0.0;
  };
  std::string breakdown, runtime_note;
  if (grew_kib >= 256.0 && !std::getenv("GLIBCXX_TUNABLES")) {
    // A plugin with libstdc++ linked in statically (g++ -static-libstdc++, or a toolchain that
    // links it so by default, as the H200 machine's does) gets a new copy of libstdc++ with every
    // load, and that copy allocates its emergency exception pool (~72 KiB with GCC 13), which
    // libstdc++ never frees. That is the C++ runtime's, not the plugin's own: measured again
    // with the pool turned off (read by each copy when it loads), the rest must stay flat.
    ::setenv("GLIBCXX_TUNABLES", "glibcxx.eh_pool.obj_count=0", 1);
    const double without_pool = growth_kib([&] { cycle(); });
    ::unsetenv("GLIBCXX_TUNABLES");
    if (without_pool < 256.0) {
      char b[400];
      std::snprintf(b, sizeof b,
                    "the heap grew by %.1f KiB over %d cycles, all of it libstdc++'s emergency exception pool "
                    "(%+.1f KiB with GLIBCXX_TUNABLES=glibcxx.eh_pool.obj_count=0): the plugin links libstdc++ "
                    "statically, so each load keeps ~%.0f KiB that libstdc++ never frees; link it dynamically "
                    "to avoid that",
                    grew_kib, kCycles, without_pool, (grew_kib - without_pool) / kCycles);
      runtime_note = b;
      grew_kib = without_pool;  // what the plugin itself leaves behind
    }
  }
  if (grew_kib >= 256.0) {
    progress("heap breakdown: load/unload only, then load/init/shutdown/unload");
    const double load_kib = growth_kib([&] { RawLibrary lib(settings().plugin_path); });
    const double init_kib = growth_kib([&] {
      RawLibrary lib(settings().plugin_path);
      RawContext ctx(lib, {});
    });
    char b[200];
    std::snprintf(b, sizeof b,
                  "; of that, %d cycles of dlopen/dlclose alone grow it by %.1f KiB, with init/shutdown %.1f KiB",
                  kCycles, load_kib, init_kib);
    breakdown = b;
    if (links_libstdcxx_statically(settings().plugin_path))
      breakdown +=
          "; the plugin links libstdc++ statically, and each loaded copy allocates libstdc++'s emergency "
          "exception pool (~72 KiB), which it never frees (GCC 13 and later can turn the pool off with "
          "GLIBCXX_TUNABLES=glibcxx.eh_pool.obj_count=0, older ones cannot): link libstdc++ dynamically";
  }
  EXPECT_LT(grew_kib, 256.0) << "the heap grew by " << grew_kib << " KiB over " << kCycles << " cycles (about "
                             << grew_kib / kCycles << " KiB per load/unload)" << breakdown;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%d cycles: fds, threads and mappings flat, heap %+.1f KiB%s; %s after the last unload", kCycles,
                grew_kib, runtime_note.empty() ? "" : " besides libstdc++'s pools",
                count_maps(real) == 0 ? "unmapped" : "still mapped (not unloadable: RTLD_NODELETE or unique symbols)");
  note(buf);
  if (!runtime_note.empty()) note(runtime_note);
}

TEST(ABI, SeveralContextsLiveSideBySide) {
  RawLibrary lib(settings().plugin_path);
  const auto samples = sample_graphs();
  auto first = std::make_unique<RawContext>(lib, HostTableSpec{});
  RawContext second(lib, {});
  ASSERT_TRUE(first->ok()) << first->error();
  ASSERT_TRUE(second.ok()) << "a second init while the first context lives failed: " << second.error();
  auto a = drive(*first, samples.front(), StructLayout::Exact);
  auto b = drive(second, samples.front(), StructLayout::Exact);
  expect_same(a, b, "second context");
  first.reset();  // shutdown of the first leaves the second working
  auto c = drive(second, samples.front(), StructLayout::Exact);
  expect_same(a, c, "second context after the first shut down");
  note("two contexts, same answers; each ends with its own shutdown");
}

}  // namespace
}  // namespace kiln::conformance
