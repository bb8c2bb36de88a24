// `kiln plugins`: the command's own code (core/cli/cmd_plugins.cpp) run in-process on the in-tree
// backends and on the bad-plugin corpus, checking the JSON and the table it prints.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kiln/hardware_probe.h"
#include "kiln/plugin_api.h"

namespace kiln::cli {
int cmd_plugins(int argc, char** argv);
}

namespace {

// Parsed with the keys in the order the command wrote them.
using Json = nlohmann::ordered_json;

struct Result {
  int rc;
  std::string out;
};

Result run(std::vector<std::string> args) {
  args.insert(args.begin(), "plugins");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  int rc = kiln::cli::cmd_plugins(static_cast<int>(argv.size()), argv.data());
  std::fflush(stdout);
  return {rc, testing::internal::GetCapturedStdout()};
}

// The keys of an object, in the order the command wrote them.
std::vector<std::string> keys(const Json& object) {
  std::vector<std::string> out;
  for (const auto& item : object.items()) out.push_back(item.key());
  return out;
}

// The entry of `list` whose path ends in `/file`.
Json entry(const Json& list, const std::string& file) {
  for (const auto& e : list) {
    const auto path = e.at("path").get<std::string>();
    if (path.size() > file.size() && path.compare(path.size() - file.size() - 1, std::string::npos, "/" + file) == 0)
      return e;
  }
  ADD_FAILURE() << "no entry for " << file << " in " << list.dump(2);
  return Json::object();
}

size_t count_loaded(const Json& list, bool loaded) {
  size_t n = 0;
  for (const auto& e : list) n += e.at("loaded") == loaded;
  return n;
}

}  // namespace

TEST(PluginsCommand, JsonListsAllFiveBackendsWithAvailabilityAndReason) {
  Result r = run({"--json", "--no-default-dirs", "--dir", KILN_BUILTIN_PLUGIN_DIR});
  ASSERT_EQ(r.rc, 0);
  const Json list = Json::parse(r.out);
  ASSERT_TRUE(list.is_array()) << r.out;
  EXPECT_EQ(count_loaded(list, true), 5u) << r.out;
  EXPECT_EQ(count_loaded(list, false), 0u) << r.out;
  const std::string dir = KILN_BUILTIN_PLUGIN_DIR;
  const Json ipex = entry(list, "libkiln_ipex.so");
  EXPECT_EQ(keys(ipex), (std::vector<std::string>{"loaded", "name", "version", "vendor", "description", "abi_version",
                                                  "device_kinds", "modes", "concurrent_execution_safe", "available",
                                                  "reason", "path"}));
  EXPECT_EQ(ipex.at("name"), "ipex");
  EXPECT_EQ(ipex.at("version"), "0.1.0");
  EXPECT_EQ(ipex.at("vendor"), "kiln");
  EXPECT_EQ(ipex.at("description"), "oneDNN kernels with fused post-ops for x86 CPUs, bf16 on AVX-512-BF16/AMX");
  EXPECT_EQ(ipex.at("abi_version"), "2." + std::to_string(KILN_ABI_VERSION_MINOR));
  EXPECT_EQ(ipex.at("device_kinds"), Json::array({"cpu"}));
  EXPECT_EQ(ipex.at("modes"), Json::array({"default", "max-autotune-no-cudagraphs"}));
  EXPECT_EQ(ipex.at("concurrent_execution_safe"), false);
  EXPECT_TRUE(ipex.at("available").is_boolean());
  EXPECT_EQ(entry(list, "libkiln_neuron.so").at("path"), dir + "/libkiln_neuron.so");
  if (kiln::hw::probe().count(kiln::hw::DeviceKind::cuda) == 0) {
    const Json cudagraphs = entry(list, "libkiln_cudagraphs.so");
    EXPECT_EQ(cudagraphs.at("available"), false);
    EXPECT_EQ(cudagraphs.at("reason"), "needs a CUDA device; none found");
    EXPECT_EQ(cudagraphs.at("path"), dir + "/libkiln_cudagraphs.so");
  }
  EXPECT_EQ(entry(list, "libkiln_inductor.so").at("name"), "inductor");
  EXPECT_EQ(entry(list, "libkiln_hpu_backend.so").at("name"), "hpu_backend");
  for (const auto& e : list) EXPECT_TRUE(e.at("reason").is_string()) << e;
}

TEST(PluginsCommand, JsonReportsEveryFailedFileWithPathAndError) {
  const std::string corpus = KILN_BAD_CORPUS;
  Result r = run({"--json", "--no-default-dirs", "--dir", corpus});
  ASSERT_EQ(r.rc, 0);
  const Json list = Json::parse(r.out);
  EXPECT_EQ(count_loaded(list, false), 10u) << r.out;
  const Json empty = entry(list, "libkiln_empty.so");
  EXPECT_EQ(keys(empty), (std::vector<std::string>{"loaded", "path", "error"}));
  EXPECT_EQ(empty.at("path"), corpus + "/libkiln_empty.so");
  EXPECT_EQ(empty.at("error"),
            "not a loadable library: file too short for an ELF header (0 bytes, at least 64 needed)");
  EXPECT_EQ(entry(list, "libkiln_bad_abi_major.so").at("error"),
            "plugin was built for kiln plugin ABI 3." + std::to_string(KILN_ABI_VERSION_MINOR) +
                "; this kiln speaks 2." + std::to_string(KILN_ABI_VERSION_MINOR) +
                " — rebuild it against the kiln 2.x SDK");
}

// A plugin folder whose name needs escaping in JSON (quotes, a backslash, control characters) and
// is not ASCII: the path comes back from the parsed output byte for byte.
TEST(PluginsCommand, JsonPathsRoundTripWhateverTheyHold) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(testing::TempDir()) /
                       ("plugins \"q\" back\\slash \t\x01 caf\xc3\xa9 \xe6\x97\xa5 " + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(fs::path(KILN_GOOD_DIR) / "libkiln_c_identity.so", dir / "libkiln_c_identity.so",
                fs::copy_options::overwrite_existing);
  Result r = run({"--json", "--no-default-dirs", "--dir", dir.string()});
  fs::remove_all(dir);
  ASSERT_EQ(r.rc, 0);
  const Json list = Json::parse(r.out);
  ASSERT_EQ(list.size(), 1u) << r.out;
  EXPECT_EQ(list[0].at("loaded"), true) << r.out;
  EXPECT_EQ(list[0].at("path").get<std::string>(), (dir / "libkiln_c_identity.so").string());
}

TEST(PluginsCommand, TableShowsEachPluginAndEachFailure) {
  const std::string corpus = KILN_BAD_CORPUS;
  Result r = run({"--no-default-dirs", "--dir", KILN_GOOD_DIR, "--dir", corpus});
  ASSERT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("searched: " KILN_GOOD_DIR " " + corpus + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("c_identity           1.2.3     kiln tests   " +
                       ("2." + std::to_string(KILN_ABI_VERSION_MINOR)) + "  cpu              default,max-autotune"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("not loaded:\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  " + corpus + "/libkiln_no_entry.so\n    not a kiln plugin: no symbol 'kiln_plugin_init'\n"),
            std::string::npos)
      << r.out;
}

// A misspelt option is a usage error (exit 2) on one line that names it, offers the nearest option
// and points at --help; nothing is listed.
TEST(PluginsCommand, RejectsUnknownArgumentsWithUsage) {
  testing::internal::CaptureStderr();
  Result r = run({"--jsn"});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(err, "kiln plugins: unknown argument '--jsn'; did you mean '--json'? (see kiln plugins --help)\n");
}

TEST(PluginsCommand, HelpListsEveryOption) {
  Result r = run({"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.rfind("usage: kiln plugins [--json] [--plugin-dir DIR]... [--no-default-dirs]\n", 0), 0u) << r.out;
  for (const char* option : {"--json", "--plugin-dir DIR", "--no-default-dirs", "search DIR first (repeatable)"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option << " in\n" << r.out;
}
