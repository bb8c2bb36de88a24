// The loader: every bad file is reported with its path and exact reason, nothing a plugin returns is
// trusted, libraries stay loaded while their objects live, and the search never touches the working
// directory unless asked. Also the five in-tree backends' descriptors and availability reasons.
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "graph_builder.h"
#include "kiln/internal/plugin_crash.h"
#include "kiln/internal/plugin_registry.h"

namespace fs = std::filesystem;
using kiln::test::GraphBuilder;

namespace {

const std::string kCorpus = KILN_BAD_CORPUS;
const std::string kGood = KILN_GOOD_DIR;
const std::string kBuiltin = KILN_BUILTIN_PLUGIN_DIR;

std::shared_ptr<kiln::HostServices> test_host() {
  return kiln::HostServices::basic("/tmp/kiln-loader-test-cache", {{"c_identity", {{"block", "128"}}}});
}

kiln::PluginSearchOptions only(std::vector<std::string> dirs) {
  kiln::PluginSearchOptions o;
  o.dirs = std::move(dirs);
  o.use_builtin = false;
  return o;
}

// The message for the file named `filename`, or "<not reported>".
std::string failure_for(const kiln::PluginRegistry& reg, const std::string& filename) {
  for (const auto& f : reg.failures())
    if (fs::path(f.path).filename() == filename) return f.message;
  return "<not reported>";
}

// A fresh empty directory under the test's temp dir.
fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("kiln_loader_test_" + std::to_string(getpid())) / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A graph of three float32 elementwise nodes over [4] tensors.
void three_node_graph(GraphBuilder& g) {
  int64_t a = g.value({4}), b = g.value({4}), c = g.value({4}), d = g.value({4}), e = g.value({4});
  g.node("aten::mul.Tensor", {GraphBuilder::tensor("self", a), GraphBuilder::tensor("other", b)}, {c});
  g.node("aten::relu", {GraphBuilder::tensor("self", c)}, {d});
  g.node("aten::neg", {GraphBuilder::tensor("self", d)}, {e});
  g.inputs({a, b});
  g.outputs({e});
}

bool library_is_loaded(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (h) dlclose(h);
  return h != nullptr;
}

class EnvGuard {
 public:
  explicit EnvGuard(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v;
  }
  ~EnvGuard() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

// ---- the bad-plugin corpus ----------------------------------------------------------------------

TEST(Loader, ReportsEmptyFile) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_empty.so"),
            "not a loadable library: file too short for an ELF header (0 bytes, at least 64 needed)");
}

TEST(Loader, ReportsTextFileNamedSo) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_text.so"),
            "not a loadable library: not an ELF file (no \\x7fELF magic at its start)");
}

// ---- files that must never reach dlopen ---------------------------------------------------------

namespace {

// The first `n` bytes of a real plugin (all of it when n is 0), with `patch` applied, as `name` in
// a fresh directory.
fs::path copy_of_plugin(const std::string& dir, const std::string& name, size_t n = 0,
                        std::function<void(std::string&)> patch = {}) {
  std::ifstream in(kBuiltin + "/libkiln_neuron.so", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (n) bytes.resize(n);
  if (patch) patch(bytes);
  const fs::path p = fresh_dir(dir) / name;
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

std::string load_error(const fs::path& p) {
  try {
    kiln::PluginRegistry::load_file(p.string(), test_host());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<loaded>";
}

}  // namespace

TEST(Loader, ALibraryCutShortIsReportedNotMapped) {
  // An interrupted copy: dlopen would map its segments past the end of the file (SIGBUS on first
  // touch, in `kiln plugins` and in every program that scans the folder).
  const fs::path p = copy_of_plugin("cut", "libkiln_x.so", 3000);
  auto reg = kiln::PluginRegistry::load(only({p.parent_path().string()}), test_host());
  EXPECT_TRUE(reg.names().empty());
  const std::string why = failure_for(reg, "libkiln_x.so");
  EXPECT_EQ(why.rfind("not a loadable library: truncated: loadable segment ", 0), 0u) << why;
  EXPECT_NE(why.find(", the file has 3000 bytes (an interrupted copy?)"), std::string::npos) << why;
  // So short that the program headers are cut too.
  const fs::path q = copy_of_plugin("cut_headers", "libkiln_y.so", 100);
  EXPECT_NE(load_error(q).find("truncated: the program headers end at byte"), std::string::npos) << load_error(q);
  // The whole file loads.
  const fs::path whole = copy_of_plugin("whole", "libkiln_whole.so");
  EXPECT_EQ(load_error(whole), "<loaded>");
}

TEST(Loader, OtherMachinesClassesAndKindsOfFileAreReportedByName) {
  const fs::path arm = copy_of_plugin("arm", "libkiln_arm.so", 0, [](std::string& b) {
    const uint16_t m = 183;  // EM_AARCH64
    std::memcpy(&b[18], &m, 2);
  });
  EXPECT_NE(load_error(arm).find("not a loadable library: built for AArch64; this host is x86-64"), std::string::npos)
      << load_error(arm);
  const fs::path c32 = copy_of_plugin("c32", "libkiln_c32.so", 0, [](std::string& b) { b[4] = 1; });
  EXPECT_NE(load_error(c32).find("a 32-bit ELF file; this host loads 64-bit libraries"), std::string::npos);
  const fs::path obj = copy_of_plugin("obj", "libkiln_obj.so", 0, [](std::string& b) { b[16] = 1; });  // ET_REL
  EXPECT_NE(load_error(obj).find("an object file (.o), not a shared library"), std::string::npos);

  const fs::path dir = fresh_dir("kinds");
  fs::create_directory(dir / "libkiln_dir.so");
  EXPECT_NE(load_error(dir / "libkiln_dir.so").find("not a loadable library: a directory"), std::string::npos);
  ASSERT_EQ(mkfifo((dir / "libkiln_fifo.so").c_str(), 0600), 0);
  EXPECT_NE(load_error(dir / "libkiln_fifo.so").find("not a loadable library: a FIFO"), std::string::npos);
  fs::create_symlink(dir / "libkiln_b.so", dir / "libkiln_a.so");
  fs::create_symlink(dir / "libkiln_a.so", dir / "libkiln_b.so");
  EXPECT_NE(load_error(dir / "libkiln_a.so").find("a loop of symbolic links"), std::string::npos)
      << load_error(dir / "libkiln_a.so");
  EXPECT_NE(load_error(dir / "libkiln_none.so").find("cannot be read: No such file or directory"), std::string::npos);
  // A scan of that folder reports the loop and loads nothing (the FIFO and the folder are not
  // regular files: a scan passes over them).
  auto reg = kiln::PluginRegistry::load(only({dir.string()}), test_host());
  EXPECT_TRUE(reg.names().empty());
}

TEST(Loader, RejectsLibraryWithoutEntrySymbol) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_no_entry.so"), "not a kiln plugin: no symbol 'kiln_plugin_init'");
}

TEST(Loader, RejectsPluginWithNewerMajorAbi) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  // A 3.x table's layout past the frozen fields is unknown here, so the plugin cannot be named.
  EXPECT_EQ(failure_for(reg, "libkiln_bad_abi_major.so"),
            "plugin was built for kiln plugin ABI 3." + std::to_string(KILN_ABI_VERSION_MINOR) +
                "; this kiln speaks 2." + std::to_string(KILN_ABI_VERSION_MINOR) +
                " — rebuild it against the kiln 2.x SDK");
}

TEST(Loader, RefusesPluginBuiltForAbi1) {
  const std::string path = kCorpus + "/libkiln_abi1_plugin.so";
  try {
    kiln::PluginRegistry::load_file(path, test_host());
    FAIL() << "a 1.2 plugin was loaded";
  } catch (const kiln::PluginError& e) {
    // Nothing past the frozen fields is read, so not the name in its 1.x descriptor either: the
    // path names it.
    EXPECT_EQ(std::string(e.what()), path + ": plugin was built for kiln plugin ABI 1.2; this kiln speaks 2." +
                                         std::to_string(KILN_ABI_VERSION_MINOR) +
                                         " — rebuild it against the kiln 2.x SDK");
    EXPECT_EQ(e.code(), KILN_ERROR_UNAVAILABLE);
  }
}

// A 2.x table whose version says 1.2: the slot where a 1.x table keeps shutdown holds its
// executable_destroy, and its descriptor points nowhere. Every slot past the frozen fields is a
// trap that aborts the process, so refusing it must touch none of them - loading it directly, in
// a folder scan, and again (the library stays mapped; a second init finds it so).
TEST(Loader, RefusesTableThatClaimsAnotherMajorWithoutTouchingItsSlots) {
  const std::string path = kCorpus + "/libkiln_bad_reports_abi1.so";
  for (int round = 0; round < 2; ++round) {
    try {
      kiln::PluginRegistry::load_file(path, test_host());
      FAIL() << "loaded";
    } catch (const kiln::PluginError& e) {
      EXPECT_EQ(std::string(e.what()), path + ": plugin was built for kiln plugin ABI 1.2; this kiln speaks 2." +
                                           std::to_string(KILN_ABI_VERSION_MINOR) +
                                           " — rebuild it against the kiln 2.x SDK");
    }
  }
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_NE(failure_for(reg, "libkiln_bad_reports_abi1.so").find("built for kiln plugin ABI 1.2"), std::string::npos);
}

TEST(Loader, ReportsInitFailureWithPluginMessage) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_bad_init_fails.so"),
            "kiln_plugin_init failed (unavailable): license server license.example:27000 unreachable");
}

TEST(Loader, RejectsUndersizedFunctionTable) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_bad_undersized.so"),
            "function table too small: struct_size 40, ABI 2." + std::to_string(KILN_ABI_VERSION_MINOR) + " needs 136");
}

TEST(Loader, RejectsNullDescriptorName) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_bad_null_name.so"), "descriptor.name is NULL");
}

TEST(Loader, RejectsNullRequiredFunction) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  EXPECT_EQ(failure_for(reg, "libkiln_bad_null_execute.so"), "required function 'execute' is NULL");
}

TEST(Loader, CorpusLoadsOnlyTheWellFormedLibrariesAndReportsEveryOtherFile) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  auto names = reg.names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"bad_claims", "bad_compile_fails", "bad_duplicate_claims"}));
  std::vector<std::string> failed;
  for (const auto& f : reg.failures()) {
    EXPECT_EQ(fs::path(f.path).parent_path(), fs::path(kCorpus)) << f.path;
    failed.push_back(fs::path(f.path).filename().string());
  }
  std::sort(failed.begin(), failed.end());
  EXPECT_EQ(failed, (std::vector<std::string>{
                        "libkiln_abi1_plugin.so", "libkiln_bad_abi_major.so", "libkiln_bad_init_fails.so",
                        "libkiln_bad_null_execute.so", "libkiln_bad_null_name.so", "libkiln_bad_reports_abi1.so",
                        "libkiln_bad_undersized.so", "libkiln_empty.so", "libkiln_no_entry.so", "libkiln_text.so"}));
}

TEST(Loader, LoadFileThrowsWithPathAndReason) {
  try {
    kiln::PluginRegistry::load_file(kCorpus + "/libkiln_no_entry.so", test_host());
    FAIL() << "no exception";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()), kCorpus + "/libkiln_no_entry.so: not a kiln plugin: no symbol 'kiln_plugin_init'");
    EXPECT_EQ(e.code(), KILN_ERROR_UNAVAILABLE);
  }
}

TEST(Loader, RejectsClaimsOfNodesThatDoNotExist) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  auto p = reg.find("bad_claims");
  ASSERT_TRUE(p);
  GraphBuilder g;
  three_node_graph(g);
  try {
    p->claim(*g.view());
    FAIL() << "claims accepted";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()), p->path() +
                                         ": plugin 'bad_claims': claim returned node 7, but the graph has 3 "
                                         "nodes (0..2)");
    EXPECT_EQ(e.code(), KILN_ERROR_INTERNAL);
  }
}

TEST(Loader, RejectsClaimingANodeTwice) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  auto p = reg.find("bad_duplicate_claims");
  ASSERT_TRUE(p);
  GraphBuilder g;
  three_node_graph(g);
  try {
    p->claim(*g.view());
    FAIL() << "claims accepted";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()), p->path() + ": plugin 'bad_duplicate_claims': claim returned node 0 twice");
  }
}

TEST(Loader, ReportsCompileFailureWithPluginCodeAndMessage) {
  auto reg = kiln::PluginRegistry::load(only({kCorpus}), test_host());
  auto p = reg.find("bad_compile_fails");
  ASSERT_TRUE(p);
  GraphBuilder g;
  three_node_graph(g);
  try {
    p->compile(*g.view(), KILN_MODE_DEFAULT);
    FAIL() << "compile succeeded";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()), kCorpus +
                                         "/libkiln_bad_compile_fails.so: plugin 'bad_compile_fails': compile "
                                         "failed (invalid argument): node 0 (aten::mul.Tensor): float64 is not "
                                         "supported");
    EXPECT_EQ(e.code(), KILN_ERROR_INVALID_ARGUMENT);
  }
}

// ---- well-formed plugins ------------------------------------------------------------------------

TEST(Loader, ReadsDescriptorOfCPlugin) {
  auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
  EXPECT_TRUE(reg.failures().empty());
  auto p = reg.find("c_identity");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->version(), "1.2.3");
  EXPECT_EQ(p->vendor(), "kiln tests");
  EXPECT_EQ(p->description(), "a C plugin for the loader tests");
  EXPECT_EQ(p->device_kinds(), KILN_DEVICE_MASK_CPU);
  EXPECT_EQ(kiln::modes_string(p->modes()), "default,max-autotune");
  EXPECT_TRUE(p->concurrent_execution_safe());
  EXPECT_EQ(p->abi_version(), "2." + std::to_string(KILN_ABI_VERSION_MINOR));
  EXPECT_EQ(p->path(), kGood + "/libkiln_c_identity.so");
}

TEST(Loader, NegotiatesMinorVersionDownToTheHosts) {
  auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
  auto p = reg.find("c_newer_minor");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->abi_version(), "2." + std::to_string(KILN_ABI_VERSION_MINOR + 7));
  EXPECT_EQ(p->negotiated_minor(), static_cast<uint32_t>(KILN_ABI_VERSION_MINOR));
  EXPECT_FALSE(p->provides_device_graphs());  // no KILN_CAPABILITY_DEVICE_GRAPHS
}

TEST(Loader, ClaimsAreReturnedInThePluginsOrder) {
  auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
  GraphBuilder g;
  three_node_graph(g);
  EXPECT_EQ(reg.find("c_identity")->claim(*g.view()), (std::vector<int64_t>{0, 1, 2}));
}

TEST(Loader, RejectsModeThePluginDoesNotSupport) {
  auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
  GraphBuilder g;
  three_node_graph(g);
  try {
    reg.find("c_identity")->compile(*g.view(), KILN_MODE_REDUCE_OVERHEAD);
    FAIL() << "compile accepted an unsupported mode";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()),
              kGood +
                  "/libkiln_c_identity.so: plugin 'c_identity' does not support mode 'reduce-overhead' (it "
                  "supports default,max-autotune)");
  }
}

TEST(Loader, KeepsLibraryLoadedWhileAnExecutableLives) {
  const std::string path = kGood + "/libkiln_c_identity.so";
  ASSERT_FALSE(library_is_loaded(path));
  std::unique_ptr<kiln::PluginExecutable> exe;
  {
    auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
    GraphBuilder g;
    three_node_graph(g);
    exe = reg.find("c_identity")->compile(*g.view(), KILN_MODE_DEFAULT);
  }  // registry, plugin and host handle gone; only the executable is left
  ASSERT_TRUE(library_is_loaded(path));

  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-10.f, 10.f);
  std::vector<float> in(6), out(6, 0.f);
  for (auto& v : in) v = dist(rng);
  int64_t shape[] = {2, 3};
  DLTensor tin{in.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor tout{out.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, nullptr, 0};
  exe->execute(&tin, 1, &tout, 1);
  EXPECT_EQ(out, in);

  exe.reset();
  EXPECT_FALSE(library_is_loaded(path));
}

TEST(Loader, ReportsExecuteErrorsWithPluginMessage) {
  auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
  GraphBuilder g;
  three_node_graph(g);
  auto exe = reg.find("c_identity")->compile(*g.view(), KILN_MODE_DEFAULT);
  try {
    exe->execute(nullptr, 1, nullptr, 0);
    FAIL() << "no error";
  } catch (const kiln::PluginError& e) {
    EXPECT_EQ(std::string(e.what()),
              kGood +
                  "/libkiln_c_identity.so: plugin 'c_identity': execute failed (invalid argument): inputs and "
                  "outputs differ in count");
  }
}

TEST(Loader, ReportsDuplicateNameAndKeepsTheFirst) {
  fs::path a = fresh_dir("dup_a"), b = fresh_dir("dup_b");
  fs::copy_file(kGood + "/libkiln_c_identity.so", a / "libkiln_c_identity.so");
  fs::copy_file(kGood + "/libkiln_c_identity.so", b / "libkiln_c_identity.so");
  auto reg = kiln::PluginRegistry::load(only({a.string(), b.string()}), test_host());
  ASSERT_EQ(reg.plugins().size(), 1u);
  EXPECT_EQ(reg.plugins()[0]->path(), (a / "libkiln_c_identity.so").string());
  ASSERT_EQ(reg.failures().size(), 1u);
  EXPECT_EQ(reg.failures()[0].path, (b / "libkiln_c_identity.so").string());
  EXPECT_EQ(reg.failures()[0].message, "duplicate plugin name 'c_identity': kept " +
                                           (a / "libkiln_c_identity.so").string() + ", ignored this one");
}

TEST(Loader, LoadsTheSameFileOnceWhenTwoSearchDirsNameIt) {
  auto reg = kiln::PluginRegistry::load(only({kGood, kGood + "/."}), test_host());
  EXPECT_EQ(reg.plugins().size(), 2u);  // c_identity and c_newer_minor, once each
  EXPECT_TRUE(reg.failures().empty());
}

TEST(Loader, ScansOnlyFilesNamedLikePluginsButLoadsANamedFileWhateverItsName) {
  const std::string misnamed = kGood + "/libmisnamed_kiln_plugin.so";
  ASSERT_TRUE(fs::exists(misnamed));
  auto reg = kiln::PluginRegistry::load(only({kGood}), test_host());
  auto names = reg.names();
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"c_identity", "c_newer_minor"}));
  EXPECT_TRUE(reg.failures().empty());
  EXPECT_FALSE(library_is_loaded(misnamed)) << "the scan opened a file not named libkiln_*.so";
  auto p = kiln::PluginRegistry::load_file(misnamed, test_host());
  EXPECT_EQ(p->name(), "misnamed");
}

TEST(Loader, NeverSearchesTheCurrentDirectoryUnlessAsked) {
  fs::path cwd_dir = fresh_dir("cwd");
  fs::copy_file(kGood + "/libkiln_c_identity.so", cwd_dir / "libkiln_c_identity.so");
  fs::path old = fs::current_path();
  fs::current_path(cwd_dir);
  kiln::PluginSearchOptions o;
  o.use_builtin = false;
  auto reg = kiln::PluginRegistry::load(o, test_host());
  EXPECT_FALSE(reg.find("c_identity"));
  EXPECT_TRUE(reg.searched_dirs().empty());
  o.search_current_dir = true;
  auto reg2 = kiln::PluginRegistry::load(o, test_host());
  EXPECT_TRUE(reg2.find("c_identity"));
  fs::current_path(old);
}

// KILN_PLUGIN_PATH reaches the loader only through TrainingArguments::plugin_dirs (the
// configuration merges it there), so a search given its directories sees nothing else.
TEST(Loader, SearchesOnlyTheGivenDirectoriesWhateverKilnPluginPathSays) {
  EnvGuard env("KILN_PLUGIN_PATH");
  setenv("KILN_PLUGIN_PATH", kGood.c_str(), 1);
  kiln::PluginSearchOptions o;
  o.dirs = {kCorpus, "/nonexistent/kiln/plugins"};
  o.use_builtin = false;
  EXPECT_EQ(kiln::plugin_search_dirs(o), (std::vector<std::string>{kCorpus, "/nonexistent/kiln/plugins"}));
  auto reg = kiln::PluginRegistry::load(o, test_host());
  EXPECT_FALSE(reg.find("c_identity"));
  EXPECT_TRUE(reg.find("bad_claims"));
}

TEST(Loader, FindsBuiltinPluginFolderNextToTheExecutable) {
  auto dirs = kiln::builtin_plugin_dirs();
  ASSERT_FALSE(dirs.empty());
  EXPECT_EQ(fs::canonical(dirs[0]), fs::canonical(kBuiltin));
}

// ---- the five in-tree backends ------------------------------------------------------------------

namespace {

kiln::PluginDevice intel_cpu() {
  kiln::PluginDevice d;
  d.kind = KILN_DEVICE_CPU;
  d.name = "Intel(R) Xeon(R) Platinum 8480+";
  d.vendor = "GenuineIntel";
  d.multiprocessor_count = 224;
  d.cpu_isa = KILN_CPU_ISA_AVX2 | KILN_CPU_ISA_AVX512F | KILN_CPU_ISA_AMX_BF16;
  return d;
}

kiln::PluginDevice accelerator(KilnDeviceKind kind, const char* name) {
  kiln::PluginDevice d;
  d.kind = kind;
  d.name = name;
  d.pci_bus_id = "0000:3b:00.0";
  d.compute_capability_major = kind == KILN_DEVICE_CUDA ? 9 : 0;
  return d;
}

const kiln::PluginRegistry& builtin_registry() {
  static auto host = test_host();
  static kiln::PluginRegistry reg = kiln::PluginRegistry::load(only({kBuiltin}), host);
  return reg;
}

std::string availability(const std::string& plugin, const std::vector<kiln::PluginDevice>& devices) {
  auto p = builtin_registry().find(plugin);
  if (!p) return "<not loaded>";
  auto a = p->available(devices);
  return std::string(a.available ? "yes: " : "no: ") + a.reason;
}

}  // namespace

TEST(InTreeBackends, AllFiveLoadWithTheirDescriptors) {
  const auto& reg = builtin_registry();
  for (const auto& f : reg.failures()) ADD_FAILURE() << f.path << ": " << f.message;
  struct Expect {
    const char* name;
    const char* kinds;
    const char* modes;
  } expected[] = {
      {"inductor", "cpu,cuda", "default,reduce-overhead,max-autotune,max-autotune-no-cudagraphs"},
      {"cudagraphs", "cuda", "default,reduce-overhead"},
      {"ipex", "cpu", "default,max-autotune-no-cudagraphs"},
      {"hpu_backend", "cpu,gaudi", "default"},
      {"neuron", "cpu,cuda,neuron", "default"},
  };
  for (const auto& e : expected) {
    auto p = reg.find(e.name);
    ASSERT_TRUE(p) << e.name;
    EXPECT_EQ(kiln::device_kinds_string(p->device_kinds()), e.kinds) << e.name;
    EXPECT_EQ(kiln::modes_string(p->modes()), e.modes) << e.name;
    EXPECT_EQ(p->vendor(), "kiln");
    EXPECT_EQ(p->abi_version(), "2." + std::to_string(KILN_ABI_VERSION_MINOR));
    EXPECT_EQ(fs::path(p->path()).filename(), std::string("libkiln_") + e.name + ".so");
  }
}

// Backends with nothing to compile with here: cudagraphs without CUDA, hpu_backend where
// libSynapse.so does not open, neuron where no PJRT plugin opens (each has its own tests).
TEST(InTreeBackends, CompileAnswersUnimplementedSoNodesRunEagerly) {
  GraphBuilder g;
  three_node_graph(g);
  for (const char* name : {"cudagraphs", "ipex", "hpu_backend", "neuron"}) {
    auto p = builtin_registry().find(name);
    ASSERT_TRUE(p) << name;
    // ipex lowers relu onto oneDNN (docs/backends/ipex.md), not mul or neg; the others claim nothing
    // (neuron: libneuronpjrt.so does not open here).
    const std::vector<int64_t> claimed = p->claim(*g.view());
    if (std::string(name) == "ipex") EXPECT_EQ(claimed, std::vector<int64_t>({1})) << name;
    else EXPECT_TRUE(claimed.empty()) << name;
    try {
      p->compile(*g.view(), KILN_MODE_DEFAULT);
      ADD_FAILURE() << name << " compiled";
    } catch (const kiln::PluginError& e) {
      EXPECT_EQ(e.code(), KILN_ERROR_UNIMPLEMENTED) << name << ": " << e.what();
    }
  }
}

TEST(InTreeBackends, InductorRunsOnAnyCpuOrCuda) {
  EXPECT_EQ(availability("inductor", {intel_cpu()}), "yes: CPU Intel(R) Xeon(R) Platinum 8480+");
  // On CUDA it says what builds the kernels, or why there are none here (no driver, no NVRTC):
  // that depends on the machine running the test.
  const std::string gpu = availability("inductor", {intel_cpu(), accelerator(KILN_DEVICE_CUDA, "NVIDIA H200")});
  const std::string head = "yes: 1 CUDA device(s), first NVIDIA H200 (sm_90; ";
  const std::string tail = "); CPU Intel(R) Xeon(R) Platinum 8480+";
  ASSERT_EQ(gpu.compare(0, head.size(), head), 0) << gpu;
  ASSERT_GT(gpu.size(), head.size() + tail.size()) << gpu;
  EXPECT_EQ(gpu.compare(gpu.size() - tail.size(), tail.size(), tail), 0) << gpu;
  const std::string kernels = gpu.substr(head.size(), gpu.size() - head.size() - tail.size());
  EXPECT_TRUE(kernels.rfind("CUDA kernels by NVRTC ", 0) == 0 || kernels.rfind("CPU nodes only: ", 0) == 0) << gpu;
  EXPECT_EQ(gpu.find("not built yet"), std::string::npos) << gpu;
  EXPECT_EQ(availability("inductor", {}), "no: no CPU or CUDA device in the device list");
}

// The scores reproduce the automatic order: a device's own compiler, then inductor, then the
// fallbacks that do not fuse; a CPU backend is not chosen automatically where a CUDA GPU is.
TEST(InTreeBackends, ScoresRankDeviceCompilersThenInductorThenFallbacks) {
  auto score = [](const std::string& plugin, const std::vector<kiln::PluginDevice>& devices) {
    auto p = builtin_registry().find(plugin);
    return p ? p->available(devices).score : -1;
  };
  const auto gpu = accelerator(KILN_DEVICE_CUDA, "NVIDIA H200");
  EXPECT_EQ(score("inductor", {intel_cpu()}), 200);
  EXPECT_EQ(score("inductor", {intel_cpu(), gpu}), 200);
  EXPECT_EQ(score("ipex", {intel_cpu()}), 100);
  EXPECT_EQ(score("ipex", {intel_cpu(), gpu}), 0);
  EXPECT_EQ(availability("ipex", {intel_cpu(), gpu}),
            "yes: GenuineIntel CPU, bf16 kernels on (AVX-512-BF16/AMX); a CUDA GPU is present, so only when named");
}

TEST(InTreeBackends, CudagraphsAsksForWholeStepGraphsAndNoOtherDoes) {
  for (const auto& p : builtin_registry().plugins())
    EXPECT_EQ(p->asks_whole_step_graph(), p->name() == "cudagraphs") << p->name();
}

TEST(InTreeBackends, CudagraphsNeedsACudaDevice) {
  EXPECT_EQ(availability("cudagraphs", {intel_cpu()}), "no: needs a CUDA device; none found");
  EXPECT_EQ(availability("cudagraphs", {intel_cpu(), accelerator(KILN_DEVICE_CUDA, "NVIDIA H200")}),
            "yes: 1 CUDA device(s), first NVIDIA H200");
}

TEST(InTreeBackends, IpexNeedsAnX86Cpu) {
  EXPECT_EQ(availability("ipex", {intel_cpu()}), "yes: GenuineIntel CPU, bf16 kernels on (AVX-512-BF16/AMX)");
  auto amd = intel_cpu();
  amd.vendor = "AuthenticAMD";
  amd.cpu_isa = KILN_CPU_ISA_AVX2;
  EXPECT_EQ(availability("ipex", {amd}), "yes: AuthenticAMD CPU, bf16 kernels off (no AVX-512-BF16 or AMX)");
  auto arm = intel_cpu();
  arm.vendor = "ARM implementer 0x41";
  EXPECT_EQ(availability("ipex", {arm}),
            "no: needs an x86 CPU (GenuineIntel or AuthenticAMD); this CPU's vendor is 'ARM implementer 0x41'");
  EXPECT_EQ(availability("ipex", {}), "no: needs an x86 CPU; the device list has no CPU");
}

TEST(InTreeBackends, HpuBackendNamesTheMissingDeviceAndRuntime) {
  // This machine has no Synapse runtime, so the runtime part is always missing here.
  ASSERT_EQ(dlopen("libSynapse.so", RTLD_LAZY | RTLD_NOLOAD), nullptr);
  const std::string no_lib =
      "libSynapse.so cannot be loaded (libSynapse.so: cannot open shared object file: No such file or directory)";
  EXPECT_EQ(availability("hpu_backend", {intel_cpu()}), "no: no Intel Gaudi device found, and " + no_lib);
  EXPECT_EQ(availability("hpu_backend", {intel_cpu(), accelerator(KILN_DEVICE_GAUDI, "Gaudi2")}),
            "no: Intel Gaudi device found, but " + no_lib);
}

TEST(InTreeBackends, NeuronNamesTheMissingDeviceAndRuntime) {
  const std::string no_lib =
      "libnrt.so cannot be loaded (libnrt.so: cannot open shared object file: No such file or directory)";
  EXPECT_EQ(availability("neuron", {intel_cpu()}), "no: no AWS Neuron device found, and " + no_lib);
  EXPECT_EQ(availability("neuron", {intel_cpu(), accelerator(KILN_DEVICE_NEURON, "Trainium2")}),
            "no: AWS Neuron device found, but " + no_lib);
}

// ---- devices and host ---------------------------------------------------------------------------

TEST(Devices, ReadsCpuFromProcFiles) {
  const std::string cpuinfo =
      "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6430\n"
      "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_tile amx_bf16\n\n"
      "processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6430\n"
      "flags\t\t: fpu sse avx2 fma avx512f avx512_bf16 amx_tile amx_bf16\n";
  const std::string meminfo = "MemTotal:       16384000 kB\nMemFree:         1000 kB\n";
  kiln::PluginDevice d = kiln::cpu_device_from_proc(cpuinfo, meminfo);
  EXPECT_EQ(d.kind, KILN_DEVICE_CPU);
  EXPECT_EQ(d.vendor, "GenuineIntel");
  EXPECT_EQ(d.name, "Intel(R) Xeon(R) Gold 6430");
  EXPECT_EQ(d.multiprocessor_count, 2);
  EXPECT_EQ(d.total_memory_bytes, 16384000ull * 1024);
  EXPECT_EQ(d.cpu_isa, KILN_CPU_ISA_AVX2 | KILN_CPU_ISA_FMA | KILN_CPU_ISA_AVX512F | KILN_CPU_ISA_AVX512_BF16 |
                           KILN_CPU_ISA_AMX_TILE | KILN_CPU_ISA_AMX_BF16);
}

TEST(Devices, ConvertsToCStructsWithSizesAndStrings) {
  kiln::DeviceInfoArray arr({intel_cpu(), accelerator(KILN_DEVICE_CUDA, "NVIDIA H200")});
  ASSERT_EQ(arr.size(), 2u);
  EXPECT_EQ(arr.data()[0]->struct_size, KILN_DEVICE_INFO_STRUCT_SIZE);
  EXPECT_STREQ(arr.data()[0]->vendor, "GenuineIntel");
  EXPECT_STREQ(arr.data()[1]->pci_bus_id, "0000:3b:00.0");
  EXPECT_EQ(arr.data()[1]->kind, KILN_DEVICE_CUDA);
  EXPECT_EQ(arr.data()[1]->compute_capability_major, 9);
}

TEST(HostServices, BasicHostServesOptionsCacheDirAndCpuMemory) {
  auto host = test_host();
  const KilnHostApi* api = host->api();
  EXPECT_EQ(api->struct_size, KILN_HOST_API_STRUCT_SIZE);
  auto option = [&](const char* plugin, const char* key) {
    KilnHostGetOptionArgs a{KILN_HOST_GET_OPTION_ARGS_STRUCT_SIZE, api->host_ctx, plugin, key, nullptr};
    api->get_option(&a);
    return a.value;
  };
  EXPECT_STREQ(option("c_identity", "block"), "128");
  EXPECT_EQ(option("c_identity", "missing"), nullptr);
  EXPECT_EQ(option("other", "block"), nullptr);
  KilnHostCacheDirArgs dir{KILN_HOST_CACHE_DIR_ARGS_STRUCT_SIZE, api->host_ctx, nullptr};
  api->cache_dir(&dir);
  EXPECT_STREQ(dir.cache_dir, "/tmp/kiln-loader-test-cache");
  EXPECT_EQ(api->call_eager, nullptr);

  KilnHostDeviceAllocArgs alloc{
      KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE, api->host_ctx, DLDevice{kDLCPU, 0}, 1000, nullptr, nullptr};
  ASSERT_EQ(api->device_alloc(&alloc), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(alloc.ptr) % 64, 0u);
  std::memset(alloc.ptr, 1, 1000);
  KilnHostDeviceFreeArgs release{KILN_HOST_DEVICE_FREE_ARGS_STRUCT_SIZE, api->host_ctx, DLDevice{kDLCPU, 0}, alloc.ptr};
  api->device_free(&release);

  KilnHostDeviceAllocArgs gpu{
      KILN_HOST_DEVICE_ALLOC_ARGS_STRUCT_SIZE, api->host_ctx, DLDevice{kDLCUDA, 0}, 1000, nullptr, nullptr};
  KilnError* err = api->device_alloc(&gpu);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(api->error_code(err), KILN_ERROR_UNAVAILABLE);
  EXPECT_STREQ(api->error_message(err), "device_alloc: this host only allocates CPU memory (device type 2)");
  api->error_destroy(err);
  EXPECT_EQ(gpu.ptr, nullptr);
}

namespace {
// Removes the directories fresh_dir made.
class TempCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(fs::temp_directory_path() / ("kiln_loader_test_" + std::to_string(getpid())), ec);
  }
};
const auto* const kTempCleanup = ::testing::AddGlobalTestEnvironment(new TempCleanup);
}  // namespace

// ---- a plugin that crashes ----------------------------------------------------------------------

// What the crash line says, for a call with and without a group and step, a plugin not yet named
// (its init), a crash on a thread of the plugin's own, and a buffer too small for all of it.
TEST(PluginCrash, TheLineNamesPluginFileCallGroupAndStep) {
  char line[1024];
  kiln::PluginCallSite site;
  site.plugin = "vecops";
  site.path = "/opt/p/libkiln_vecops.so";
  site.call = "execute";
  site.group = 2;
  site.step = 17;
  size_t n = kiln::format_plugin_crash(line, sizeof line, SIGSEGV, site);
  EXPECT_EQ(std::string(line, n),
            "kiln: fatal signal SIGSEGV (Segmentation fault) in plugin 'vecops' (/opt/p/libkiln_vecops.so) during "
            "execute of group 2 at step 17; the process cannot continue: the crash is in the plugin's code, which runs "
            "in this process. Rerun with torch_compile_backend = \"eager\" or another backend, and report it to the "
            "plugin's vendor");
  site.group = -1;
  site.step = 0;
  site.call = "claim";
  n = kiln::format_plugin_crash(line, sizeof line, SIGBUS, site);
  EXPECT_EQ(std::string(line, n).rfind(
                "kiln: fatal signal SIGBUS (Bus error) in plugin 'vecops' (/opt/p/libkiln_vecops.so) during claim;", 0),
            0u)
      << line;
  site.plugin = "";
  site.call = "kiln_plugin_init";
  n = kiln::format_plugin_crash(line, sizeof line, SIGABRT, site);
  EXPECT_EQ(std::string(line, n).rfind(
                "kiln: fatal signal SIGABRT (Aborted) in plugin /opt/p/libkiln_vecops.so during kiln_plugin_init;", 0),
            0u)
      << line;
  site.plugin = "vecops";
  site.call = "execute";
  site.group = 0;
  site.step = 3;
  n = kiln::format_plugin_crash(line, sizeof line, SIGFPE, site, false);
  EXPECT_NE(std::string(line, n).find("SIGFPE (Floating-point exception) on a thread kiln did not call the plugin "
                                      "from, while plugin 'vecops' (/opt/p/libkiln_vecops.so) ran execute of group 0 "
                                      "at step 3;"),
            std::string::npos)
      << line;
  n = kiln::format_plugin_crash(line, 20, SIGSEGV, site);
  EXPECT_EQ(n, 19u);
  EXPECT_EQ(std::string(line), "kiln: fatal signal ");
}

namespace {

// In a child: loads the plugin that crashes in its third execute and executes it three times, inside
// the scopes a training step sets (group 2, step 17).
[[noreturn]] void execute_until_the_plugin_crashes() {
  auto reg = kiln::PluginRegistry::load(only({KILN_CRASHING_DIR}), test_host());
  auto plugin = reg.find("crashes_in_execute");
  if (!plugin) std::_Exit(3);
  GraphBuilder g;
  three_node_graph(g);
  auto exe = plugin->compile(*g.view(), KILN_MODE_DEFAULT);
  std::vector<float> in(4, 1.f), out(4, 0.f);
  int64_t shape[] = {4};
  DLTensor tin{in.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  DLTensor tout{out.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, nullptr, 0};
  const kiln::PluginStepScope step(17);
  const kiln::PluginGroupScope group(2);
  for (int i = 0; i < 3; ++i) exe->execute(&tin, 1, &tout, 1);
  std::_Exit(0);
}

// Died of SIGSEGV: by the signal itself, or, under AddressSanitizer (whose handler kiln's hands the
// signal to), by ASan's exit after its report.
bool died_of_the_crash(int status) {
  return (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) ||
         (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3);
}

}  // namespace

// A plugin that crashes inside execute: the process dies of the plugin's signal (handed on, so a
// core dump or debugger sees the original), after one line that names the plugin, its file, the
// call, the group and the step.
TEST(PluginCrash, ACrashInsideExecuteIsNamedThenTheSignalGoesOn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      execute_until_the_plugin_crashes(), died_of_the_crash,
      "kiln: fatal signal SIGSEGV \\(Segmentation fault\\) in plugin 'crashes_in_execute' "
      "\\(.*/libkiln_crashes_in_execute.so\\) during execute of group 2 at step 17; the process cannot continue");
}

// The handler changes nothing for a crash outside plugin calls: no line, and the same signal.
TEST(PluginCrash, ACrashOutsidePluginCallsIsHandedOnUntouched) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  kiln::install_plugin_crash_handler();
  EXPECT_EXIT(
      {
        kiln::install_plugin_crash_handler();
        raise(SIGSEGV);
        std::_Exit(0);
      },
      died_of_the_crash, ::testing::Not(::testing::HasSubstr("kiln: fatal signal")));
}
