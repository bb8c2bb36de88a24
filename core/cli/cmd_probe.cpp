// `kiln probe [--json] [--explain] [--sysfs-root DIR] [--plugins-dir DIR]... [--backend NAME]`:
// the devices found, the backend kiln would use on them, and why.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/config.h"
#include "kiln/hardware_probe.h"
#include "kiln/internal/host_services.h"
#include "kiln/log.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/internal/selection.h"

namespace kiln::cli {

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: kiln probe [--json] [--explain] [--sysfs-root DIR] [--plugins-dir DIR]... "
               "[--backend NAME]\n\n"
               "Shows the devices of this machine and the backend kiln picks for them, with why.\n\n"
               "  --json            one JSON object: devices, default_backend, reasons, plugins, warnings\n"
               "  --explain         every reason, the plugins found and whether each can run here\n"
               "  --sysfs-root DIR  describe the machine in DIR instead of this one (also KILN_SYSFS_ROOT,\n"
               "                    the probe's test seam); see docs/hardware-probe.md for the layout\n"
               "  --plugins-dir DIR look for plugins only in DIR (repeatable); default: KILN_PLUGIN_PATH,\n"
               "                    then the install's plugin folder\n"
               "  --backend NAME    check a named backend instead of \"auto\" (default: KILN_BACKEND or auto)\n");
}

}  // namespace

int cmd_probe(int argc, char** argv) {
  bool json = false, explain = false;
  std::string root, backend;
  std::vector<std::string> plugin_dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* opt) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kiln probe: %s needs a value\n", opt);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") json = true;
    else if (a == "--explain") explain = true;
    else if (a == "--sysfs-root") root = value("--sysfs-root");
    else if (a == "--plugins-dir") plugin_dirs.push_back(value("--plugins-dir"));
    else if (a == "--backend") backend = value("--backend");
    else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "kiln probe: unknown option '%s'\n\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  // The report already says what the info log would; keep the terminal to one account of it
  // unless KILN_LOG_LEVEL asks for more.
  TrainingArguments args;
  args.log_level = "warn";
  try {
    args.apply_env();
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "kiln probe: %s\n", e.what());
    return 2;
  }
  set_log_level(args.log_level);
  if (backend.empty()) backend = args.torch_compile_backend;

  ProbeReport report;
  hw::ProbeOptions options;
  options.root = root;  // empty: KILN_SYSFS_ROOT, else "/"
  report.probe = hw::probe(options);

  PluginSearchOptions search;
  search.dirs = args.runtime.plugin_dirs;
  if (!plugin_dirs.empty()) {
    search.dirs = plugin_dirs;
    search.use_builtin = false;
  }
  auto registry = PluginRegistry::load(search, HostServices::basic(args));
  report.plugins = plugin_candidates(registry, report.probe.devices);
  std::string searched;
  for (const auto& d : registry.searched_dirs()) searched += (searched.empty() ? "" : ", ") + d;
  report.plugin_notes.push_back("searched: " + (searched.empty() ? std::string("no directory") : searched));
  for (const auto& f : registry.failures()) report.plugin_notes.push_back(f.path + ": " + f.message);

  try {
    report.choice = select_backend(report.probe.devices, report.plugins, backend);
  } catch (const BackendSelectionError& e) {
    std::fprintf(stderr, "kiln probe: %s\n", e.what());
    return 1;
  }
  const std::string text = json ? probe_report_json(report) : probe_report_text(report, explain);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace kiln::cli
