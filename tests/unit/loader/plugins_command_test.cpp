// `kiln plugins`: the command's own code (core/cli/cmd_plugins.cpp) run in-process on the in-tree
// backends and on the bad-plugin corpus, checking the JSON and the table it prints.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/hardware_probe.h"

namespace kiln::cli {
int cmd_plugins(int argc, char** argv);
}

namespace {

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

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t p = haystack.find(needle); p != std::string::npos; p = haystack.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace

TEST(PluginsCommand, JsonListsAllFiveBackendsWithAvailabilityAndReason) {
  Result r = run({"--json", "--no-default-dirs", "--dir", KILN_BUILTIN_PLUGIN_DIR});
  ASSERT_EQ(r.rc, 0);
  EXPECT_EQ(r.out.front(), '[');
  EXPECT_EQ(count(r.out, "\"loaded\": true"), 5u) << r.out;
  EXPECT_EQ(count(r.out, "\"loaded\": false"), 0u) << r.out;
  const std::string dir = KILN_BUILTIN_PLUGIN_DIR;
  EXPECT_NE(r.out.find("{\"loaded\": true, \"name\": \"ipex\", \"version\": \"0.1.0\", \"vendor\": \"kiln\", "
                       "\"description\": \"oneDNN kernels with fused post-ops for x86 CPUs, bf16 on "
                       "AVX-512-BF16/AMX\", \"abi_version\": \"2.1\", \"device_kinds\": [\"cpu\"], \"modes\": "
                       "[\"default\", \"max-autotune-no-cudagraphs\"], \"concurrent_execution_safe\": false, "
                       "\"available\": "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"path\": \"" + dir + "/libkiln_neuron.so\"}"), std::string::npos) << r.out;
  if (kiln::hw::probe().count(kiln::hw::DeviceKind::cuda) == 0) {
    EXPECT_NE(r.out.find("\"available\": false, \"reason\": \"needs a CUDA device; none found\", \"path\": \"" + dir +
                         "/libkiln_cudagraphs.so\""),
              std::string::npos)
        << r.out;
  }
  EXPECT_NE(r.out.find("\"name\": \"inductor\""), std::string::npos);
  EXPECT_NE(r.out.find("\"name\": \"hpu_backend\""), std::string::npos);
  EXPECT_EQ(count(r.out, "\"reason\": "), 5u);
}

TEST(PluginsCommand, JsonReportsEveryFailedFileWithPathAndError) {
  const std::string corpus = KILN_BAD_CORPUS;
  Result r = run({"--json", "--no-default-dirs", "--dir", corpus});
  ASSERT_EQ(r.rc, 0);
  EXPECT_EQ(count(r.out, "\"loaded\": false"), 9u) << r.out;
  EXPECT_NE(r.out.find("{\"loaded\": false, \"path\": \"" + corpus +
                       "/libkiln_empty.so\", \"error\": \"not a loadable "
                       "library: " +
                       corpus + "/libkiln_empty.so: file too short\"}"),
            std::string::npos)
      << r.out;
  EXPECT_NE(
      r.out.find("{\"loaded\": false, \"path\": \"" + corpus +
                 "/libkiln_bad_abi_major.so\", \"error\": \"plugin "
                 "was built for kiln plugin ABI 3.1; this kiln speaks 2.1 — rebuild it against the kiln 2.x SDK\"}"),
      std::string::npos)
      << r.out;
}

TEST(PluginsCommand, TableShowsEachPluginAndEachFailure) {
  const std::string corpus = KILN_BAD_CORPUS;
  Result r = run({"--no-default-dirs", "--dir", KILN_GOOD_DIR, "--dir", corpus});
  ASSERT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("searched: " KILN_GOOD_DIR " " + corpus + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("c_identity           1.2.3     kiln tests   2.1  cpu              default,max-autotune"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("not loaded:\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  " + corpus + "/libkiln_no_entry.so\n    not a kiln plugin: no symbol 'kiln_plugin_init'\n"),
            std::string::npos)
      << r.out;
}

TEST(PluginsCommand, RejectsUnknownArgumentsWithUsage) {
  testing::internal::CaptureStderr();
  Result r = run({"--jsn"});
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(err.rfind("kiln plugins: unknown argument '--jsn'\n", 0), 0u) << err;
}
