// `kiln probe [--json] [--explain] [--sysfs-root DIR] [--plugin-dir DIR]... [--backend NAME]`:
// the devices found, the backend kiln would use on them, and why.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/config.h"
#include "kiln/hardware_probe.h"
#include "kiln/internal/command_line.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/internal/selection.h"
#include "kiln/log.h"

namespace kiln::cli {

int cmd_probe(int argc, char** argv) {
  bool json = false, explain = false;
  std::string root, backend;
  std::vector<std::string> plugin_dirs;
  CLI::App app;
  setup_command(app, "kiln probe",
                "usage: kiln probe [--json] [--explain] [--sysfs-root DIR] [--plugin-dir DIR]... [--backend NAME]",
                "Shows the devices of this machine and the backend kiln picks for them, with why.");
  app.add_flag("--json", json, "one JSON object: devices, default_backend, reasons, plugins, warnings");
  app.add_flag("--explain", explain, "every reason, the plugins found and whether each can run here");
  app.add_option("--sysfs-root", root,
                 "describe the machine in DIR instead of this one (also KILN_SYSFS_ROOT,\n"
                 "the probe's test seam); see docs/hardware-probe.md for the layout")
      ->type_name("DIR");
  app.add_option("--plugin-dir", plugin_dirs,
                 "look for plugins only in DIR (repeatable); default: KILN_PLUGIN_PATH,\n"
                 "then the install's plugin folder")
      ->option_text("DIR")
      ->allow_extra_args(false);
  // The flag's older name: still accepted, not shown by --help (`kiln plugins` and `kiln bench`
  // call it --plugin-dir).
  std::vector<std::string> old_plugin_dirs;
  app.add_option("--plugins-dir", old_plugin_dirs)->allow_extra_args(false)->group("");
  app.add_option("--backend", backend, "check a named backend instead of \"auto\" (default: KILN_BACKEND or auto)")
      ->type_name("NAME");
  if (auto status = parse_command_line(app, argc, argv)) return *status;
  plugin_dirs.insert(plugin_dirs.end(), old_plugin_dirs.begin(), old_plugin_dirs.end());

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
    report.choice = select_backend(report.probe.devices, report.plugins, backend, refused_plugins(registry));
  } catch (const BackendSelectionError& e) {
    std::fprintf(stderr, "kiln probe: %s\n", e.what());
    return 1;
  }
  const std::string text = json ? probe_report_json(report) : probe_report_text(report, explain);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace kiln::cli
