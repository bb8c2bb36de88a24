// `kiln` and each of its subcommands as a user meets them: --help on stdout with exit 0; a command
// line that cannot run is exit 2 with one line on stderr that names the flag and the value (a
// misspelt option with the nearest one), and nothing on stdout.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../cli_run.h"

namespace {

using kiln::test::CliRun;

CliRun kiln_cli(const std::string& args) {
  return kiln::test::run_command(
      "env -u KILN_BACKEND -u KILN_PLUGIN_PATH " + kiln::test::shell_quote(KILN_CLI) + " " + args, "kiln_cli");
}

// A usage error: exit 2, nothing on stdout, and stderr holds each of `parts`.
void expect_usage_error(const std::string& args, const std::vector<std::string>& parts) {
  const CliRun r = kiln_cli(args);
  EXPECT_EQ(r.status, 2) << "kiln " << args << "\nstderr: " << r.err;
  EXPECT_TRUE(r.out.empty()) << "kiln " << args << "\nstdout: " << r.out;
  for (const auto& p : parts)
    EXPECT_NE(r.err.find(p), std::string::npos) << "kiln " << args << ": no '" << p << "' in\n" << r.err;
}

struct Help {
  std::string command;                // the arguments before --help
  std::vector<std::string> contains;  // what the help must say
};

TEST(Cli, HelpOfEveryCommandIsOnStdoutWithExitZero) {
  const std::vector<Help> helps = {
      {"",
       {"usage: kiln [--version] [--help] <command> [<args>]", "probe", "plugins", "conformance", "bench", "cache",
        "Run 'kiln <command> --help' for a command's options."}},
      {"probe", {"usage: kiln probe [--json]", "--explain", "--sysfs-root DIR", "--plugin-dir DIR", "--backend NAME"}},
      {"plugins",
       {"usage: kiln plugins [--json] [--plugin-dir DIR]... [--no-default-dirs]", "--plugin-dir DIR",
        "--no-default-dirs"}},
      {"conformance",
       {"usage: kiln conformance PLUGIN.so", "--filter PATTERN", "--jobs N", "--seed N", "--list",
        "docs/conformance.md"}},
      {"bench", {"usage: kiln bench WORKLOAD", "--steps N", "--tolerance X", "--kernels", "kiln_k<N>", "--json"}},
      {"cache", {"usage: kiln cache ls [--dir DIR]", "kiln cache clear [--dir DIR]", "--dir DIR"}},
  };
  for (const auto& h : helps) {
    for (const char* flag : {"--help", "-h"}) {
      const std::string args = h.command.empty() ? flag : h.command + " " + flag;
      const CliRun r = kiln_cli(args);
      EXPECT_EQ(r.status, 0) << "kiln " << args << "\nstderr: " << r.err;
      EXPECT_EQ(r.out.rfind("usage: kiln", 0), 0u) << "kiln " << args << ":\n" << r.out;
      for (const auto& c : h.contains)
        EXPECT_NE(r.out.find(c), std::string::npos) << "kiln " << args << ": no '" << c << "' in\n" << r.out;
    }
  }
  EXPECT_EQ(kiln_cli("help").out, kiln_cli("--help").out);
}

TEST(Cli, WithoutACommandTheUsageGoesToStderrWithExitTwo) {
  const CliRun r = kiln_cli("");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_EQ(r.err.rfind("usage: kiln", 0), 0u) << r.err;
}

TEST(Cli, VersionNamesKilnAndLibTorch) {
  for (const char* flag : {"--version", "-V"}) {
    const CliRun r = kiln_cli(flag);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out.rfind("kiln ", 0), 0u) << r.out;
    EXPECT_NE(r.out.find("LibTorch "), std::string::npos) << r.out;
  }
}

// Integers and numbers are checked before anything runs: a word, a fraction, a value out of range
// or of the wrong sign is a usage error naming the flag and the value.
TEST(Cli, ANumberFlagGivenSomethingElseIsAUsageErrorNamingFlagAndValue) {
  expect_usage_error("bench mlp --steps abc", {"kiln bench: --steps: 'abc' is not an integer", "kiln bench --help"});
  expect_usage_error("bench mlp --steps 12abc", {"--steps: '12abc' is not an integer"});
  expect_usage_error("bench mlp --steps 3", {"--steps: '3' must be at least 4"});
  expect_usage_error("bench mlp --steps 99999999999", {"--steps: '99999999999' must be at most 2147483647"});
  expect_usage_error("bench mlp --batch 1.5", {"--batch: '1.5' is not an integer"});
  expect_usage_error("bench mlp --batch 0", {"--batch: '0' must be at least 1"});
  expect_usage_error("bench mlp --tolerance lots", {"--tolerance: 'lots' is not a non-negative number"});
  expect_usage_error("bench mlp --tolerance -1e-3", {"--tolerance: '-1e-3' is not a non-negative number"});
  expect_usage_error("bench mlp --tolerance nan", {"--tolerance: 'nan' is not a non-negative number"});
  expect_usage_error("conformance x.so --jobs two", {"kiln conformance: --jobs: 'two' is not an integer"});
  expect_usage_error("conformance x.so --jobs 0", {"--jobs: '0' must be at least 1"});
  expect_usage_error("conformance x.so --seed -1", {"--seed: '-1' is not a non-negative integer"});
  expect_usage_error("conformance x.so --steps 2.5", {"--steps: '2.5' is not an integer"});
  expect_usage_error("conformance x.so --timeout 0", {"--timeout: '0' is not a positive number"});
  expect_usage_error("conformance x.so --device tpu", {"--device", "tpu"});
  expect_usage_error("bench mlp --steps", {"--steps"});  // no value at all
}

TEST(Cli, AMisspeltOptionGetsTheNearestOne) {
  expect_usage_error("--verison", {"kiln: unknown option '--verison'; did you mean '--version'?"});
  expect_usage_error("prob", {"kiln: unknown command 'prob'; did you mean 'probe'?"});
  expect_usage_error("probe --jsn", {"kiln probe: unknown option '--jsn'; did you mean '--json'?"});
  expect_usage_error("probe --plugin-dr x", {"unknown option '--plugin-dr'; did you mean '--plugin-dir'?"});
  expect_usage_error("plugins --dirs x", {"kiln plugins: unknown argument '--dirs'; did you mean '--dir'?"});
  expect_usage_error("bench mlp --kernel", {"kiln bench: unknown option '--kernel'; did you mean '--kernels'?"});
  expect_usage_error("bench mlp --tolerence=1e-3", {"unknown option '--tolerence=1e-3'; did you mean '--tolerance'?"});
  expect_usage_error("cache ls --dri x", {"kiln cache: unknown argument '--dri'; did you mean '--dir'?"});
  expect_usage_error("cache lst", {"kiln cache: unknown action 'lst'; did you mean 'ls'?"});
  expect_usage_error("conformance x.so --filtr 'ABI.*'",
                     {"kiln conformance: unknown option '--filtr'; did you mean '--filter'?"});
  // Nothing near: no suggestion.
  const CliRun r = kiln_cli("probe --completely-different");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown option '--completely-different'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("did you mean"), std::string::npos) << r.err;
}

TEST(Cli, ArgumentsACommandDoesNotTakeAreUsageErrors) {
  expect_usage_error("bench mlp cnn", {"kiln bench: unexpected argument 'cnn'"});
  expect_usage_error("bench", {"kiln bench: which workload? (mlp, cnn, gpt, gpt-medium)"});
  expect_usage_error("bench mlpp", {"unknown workload 'mlpp'; valid workloads: mlp, cnn, gpt, gpt-medium"});
  expect_usage_error("bench mlp --device tpu", {"--device 'tpu': use cpu or cuda"});
  expect_usage_error("probe extra", {"kiln probe: unexpected argument 'extra'"});
  expect_usage_error("probe --plugin-dir a b", {"kiln probe: unexpected argument 'b'"});  // one DIR per flag
  expect_usage_error("cache", {"kiln cache: which action? (ls or clear)"});
  expect_usage_error("conformance", {"kiln conformance: which plugin? give the path of its .so"});
}

// Options take a value as "--flag value" or "--flag=value"; the last of a repeated one wins, and a
// repeatable one gathers every value.
TEST(Cli, OptionValuesAndRepeats) {
  const CliRun r = kiln_cli("plugins --no-default-dirs --dir=/nonexistent/a --dir /nonexistent/b");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("searched: /nonexistent/a /nonexistent/b\n"), std::string::npos) << r.out;
  const std::string dir = ::testing::TempDir() + "kiln_cli_test_no_cache";
  const CliRun c = kiln_cli("cache ls --dir /nonexistent/first --dir " + kiln::test::shell_quote(dir));
  EXPECT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(c.out, "cache " + dir + ": empty (no such directory)\n");
}

// `kiln plugins` and `kiln bench` name a plugin folder alike, --plugin-dir DIR (repeatable).
// `kiln plugins --dir`, the flag's older name, still works in scripts but is not in --help.
TEST(Cli, PluginsAndBenchTakePluginDir) {
  const CliRun r = kiln_cli("plugins --no-default-dirs --plugin-dir /nonexistent/a --plugin-dir=/nonexistent/b");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("searched: /nonexistent/a /nonexistent/b\n"), std::string::npos) << r.out;
  // The old name, mixed with the new: the folders in command-line order.
  const CliRun mixed = kiln_cli(
      "plugins --no-default-dirs --plugin-dir /nonexistent/a --dir /nonexistent/b --plugin-dir /nonexistent/c");
  EXPECT_EQ(mixed.status, 0) << mixed.err;
  EXPECT_NE(mixed.out.find("searched: /nonexistent/a /nonexistent/b /nonexistent/c\n"), std::string::npos) << mixed.out;
  // A plugin is found in the folder named: kiln's own, next to the tool (bin/../plugins).
  const std::string cli = KILN_CLI;
  const std::string plugins = cli.substr(0, cli.rfind("/bin/")) + "/plugins";
  const CliRun found = kiln_cli("plugins --no-default-dirs --plugin-dir " + kiln::test::shell_quote(plugins));
  EXPECT_EQ(found.status, 0) << found.err;
  EXPECT_NE(found.out.find("searched: " + plugins + "\n"), std::string::npos) << found.out;
  EXPECT_NE(found.out.find("    " + plugins + "/libkiln_"), std::string::npos) << found.out;  // a plugin's path
  const CliRun help = kiln_cli("plugins --help");
  EXPECT_NE(help.out.find("--plugin-dir DIR"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("--dir"), std::string::npos) << help.out;
  EXPECT_NE(kiln_cli("bench --help").out.find("--plugin-dir"), std::string::npos);
}

}  // namespace

// A backend named on the command line whose plugin file the loader refused: the loader's reason and
// the file, not "unknown backend". The scan of that folder also meets a table that claims another
// ABI major, which must not bring the tool down.
TEST(Cli, BenchOfABackendRefusedAtLoadGivesTheLoadersReason) {
  const std::string corpus = KILN_BAD_CORPUS;
  CliRun r = kiln_cli("bench mlp --steps 4 --backend bad_reports_abi1 --plugin-dir " + kiln::test::shell_quote(corpus));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("backend 'bad_reports_abi1' was found, but kiln refused its plugin file " + corpus +
                       "/libkiln_bad_reports_abi1.so: plugin was built for kiln plugin ABI 1.2; this kiln speaks 2."),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("unknown backend"), std::string::npos) << r.err;
  r = kiln_cli("bench mlp --steps 4 --backend bad_init_fails --plugin-dir " + kiln::test::shell_quote(corpus));
  EXPECT_NE(r.err.find("libkiln_bad_init_fails.so: kiln_plugin_init failed (unavailable): license server"),
            std::string::npos)
      << r.err;
}
