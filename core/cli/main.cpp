// `kiln`: shows the machine and the plugins, runs the conformance suite and the benchmarks.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/config.h"
#include "kiln/internal/command_line.h"
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
    {"plugins", kiln::cli::cmd_plugins, "list the backend plugins found, with availability (--json, --plugin-dir DIR)"},
    {"conformance", kiln::cli::cmd_conformance, "run the plugin conformance suite on PLUGIN.so"},
    {"bench", kiln::cli::cmd_bench, "benchmark a reference workload: eager vs kiln (mlp, cnn, gpt, gpt-medium)"},
    {"cache", kiln::cli::cmd_cache, "show or empty the compile cache (ls, clear)"},
};

std::string commands_text() {
  std::string text = "commands:\n";
  for (const auto& c : kCommands) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-12s %s\n", c.name, c.summary);
    text += line;
  }
  return text + "\nRun 'kiln <command> --help' for a command's options.";
}

}  // namespace

namespace kiln::cli {
int not_available_yet(const char* name, const char* what) {
  std::fprintf(stderr, "kiln %s: not available yet (%s)\n", name, what);
  return 3;
}
}  // namespace kiln::cli

int main(int argc, char** argv) {
  // The top level takes its own options (--help, --version) up to the command's name; the command
  // and everything after it, --help included, are the command's to parse (CLI11's prefix_command).
  CLI::App app;
  kiln::cli::setup_command(
      app, "kiln", "usage: kiln [--version] [--help] <command> [<args>]",
      std::string("kiln ") + KILN_VERSION_STRING + ": torch.compile for training, for LibTorch programs");
  app.footer(commands_text());
  app.prefix_command();
  bool version = false;
  app.add_flag("-V,--version", version, "print kiln's and LibTorch's versions and exit");
  std::vector<std::string> rest;
  try {
    app.parse(argc, argv);
    rest = app.remaining();
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    return kiln::cli::usage_error(app, e.what());
  }
  if (version) {
    std::printf("kiln %s (LibTorch %s, plugin ABI see `kiln plugins`)\n", KILN_VERSION_STRING,
                KILN_TORCH_VERSION_STRING);
    return 0;
  }
  if (rest.empty()) {
    std::fputs(app.help().c_str(), stderr);
    return 2;
  }
  const std::string name = rest.front();
  if (name == "help") {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (name != c.name) continue;
    std::vector<char*> args;  // the command's own argv: its name, then its arguments
    for (auto& a : rest) args.push_back(a.data());
    args.push_back(nullptr);
    try {
      return c.run(static_cast<int>(rest.size()), args.data());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  if (name.size() > 1 && name[0] == '-') return kiln::cli::usage_error(app, kiln::cli::unknown_argument(app, name));
  std::vector<std::string> names;
  for (const auto& c : kCommands) names.push_back(c.name);
  const auto near = kiln::nearest_name(name, names);
  return kiln::cli::usage_error(app,
                                "unknown command '" + name + "'" + (near ? "; did you mean '" + *near + "'?" : ""));
}
