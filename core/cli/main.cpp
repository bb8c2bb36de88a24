// `kiln`: shows the machine and the plugins, runs the conformance suite and the benchmarks.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "kiln/version.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};

const Command kCommands[] = {
    {"probe", kiln::cli::cmd_probe,
     "show the devices found and the default backend (--json, --explain, --sysfs-root DIR)"},
    {"plugins", kiln::cli::cmd_plugins, "list the backend plugins found, with availability (--json, --dir DIR)"},
    {"conformance", kiln::cli::cmd_conformance, "run the plugin conformance suite on PLUGIN.so"},
    {"bench", kiln::cli::cmd_bench, "benchmark a reference workload: eager vs kiln (mlp, cnn, gpt)"},
    {"cache", kiln::cli::cmd_cache, "show or empty the compile cache (ls, clear)"},
};

void usage(FILE* out) {
  std::fprintf(out,
               "kiln %s: torch.compile for training, for LibTorch programs\n\n"
               "usage: kiln [--version] [--help] <command> [<args>]\n\ncommands:\n",
               KILN_VERSION_STRING);
  for (const auto& c : kCommands) std::fprintf(out, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(out, "\nRun 'kiln <command> --help' for a command's options.\n");
}

}  // namespace

namespace kiln::cli {
int not_available_yet(const char* name, const char* what) {
  std::fprintf(stderr, "kiln %s: not available yet (%s)\n", name, what);
  return 3;
}
}  // namespace kiln::cli

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    usage(stdout);
    return 0;
  }
  if (first == "--version" || first == "-V") {
    std::printf("kiln %s (LibTorch %s, plugin ABI see `kiln plugins`)\n", KILN_VERSION_STRING,
                KILN_TORCH_VERSION_STRING);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (first == c.name) {
      try {
        return c.run(argc - 1, argv + 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kiln %s: error: %s\n", c.name, e.what());
        return 1;
      }
    }
  }
  std::fprintf(stderr, "kiln: unknown command '%s'\n\n", first.c_str());
  usage(stderr);
  return 2;
}
