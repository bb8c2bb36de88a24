// `kiln plugins [--json] [--plugin-dir DIR]...`: every plugin file found, what it is, and whether it
// can run on this machine (and why not); every file that failed to load, with the reason.
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/config.h"
#include "kiln/hardware_probe.h"
#include "kiln/internal/command_line.h"
#include "kiln/internal/host_services.h"
#include "kiln/internal/json_text.h"
#include "kiln/internal/plugin_registry.h"
#include "kiln/internal/selection.h"

namespace kiln::cli {

namespace {

// "cpu,cuda" as ["cpu", "cuda"].
Json json_list(const std::string& comma_separated) {
  Json out = Json::array();
  size_t start = 0;
  while (start < comma_separated.size()) {
    size_t end = comma_separated.find(',', start);
    if (end == std::string::npos) end = comma_separated.size();
    out.push_back(comma_separated.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

int cmd_plugins(int argc, char** argv) {
  bool json = false, no_default_dirs = false;
  std::vector<std::string> plugin_dirs, old_dirs;
  PluginSearchOptions search;
  CLI::App app;
  setup_command(app, "kiln plugins", "usage: kiln plugins [--json] [--plugin-dir DIR]... [--no-default-dirs]",
                "Lists the backend plugins (libkiln_*.so) found in --plugin-dir directories, KILN_PLUGIN_PATH\n"
                "and kiln's own plugin folder, with availability on this machine, and every file that failed\n"
                "to load.");
  app.add_flag("--json", json, "a JSON array, one object per file");
  CLI::Option* plugin_dir = app.add_option("--plugin-dir", plugin_dirs, "search DIR first (repeatable)")
                                ->option_text("DIR")
                                ->allow_extra_args(false);
  // The flag's older name, as `kiln bench` calls it --plugin-dir: still accepted, so that scripts
  // keep working, but not shown by --help.
  CLI::Option* dir = app.add_option("--dir", old_dirs)->allow_extra_args(false)->group("");
  app.add_flag("--no-default-dirs", no_default_dirs, "only the --plugin-dir directories");
  if (auto status = parse_command_line(app, argc, argv, "argument")) return *status;
  if (no_default_dirs) search.use_builtin = false;
  // Both names' directories, in the order the command line gives them.
  size_t next_plugin_dir = 0, next_dir = 0;
  for (const CLI::Option* o : app.parse_order()) {
    if (o == plugin_dir && next_plugin_dir < plugin_dir->results().size())
      search.dirs.push_back(plugin_dir->results()[next_plugin_dir++]);
    else if (o == dir && next_dir < dir->results().size()) search.dirs.push_back(dir->results()[next_dir++]);
  }

  TrainingArguments args;
  args.apply_env();      // KILN_CACHE_DIR, and KILN_PLUGIN_PATH in runtime.plugin_dirs
  if (!no_default_dirs)  // after the --plugin-dir directories
    search.dirs.insert(search.dirs.end(), args.runtime.plugin_dirs.begin(), args.runtime.plugin_dirs.end());
  auto host = HostServices::basic(args);
  PluginRegistry reg = PluginRegistry::load(search, host);
  // Availability is asked against the hardware probe's devices (CPU, CUDA, Gaudi, Neuron).
  std::vector<PluginDevice> devices = to_plugin_devices(hw::probe().devices);
  if (devices.empty()) devices = basic_cpu_devices();
  DeviceInfoArray device_array(devices);

  struct Row {
    std::shared_ptr<LoadedPlugin> plugin;
    PluginAvailability availability;
  };
  std::vector<Row> rows;
  for (const auto& p : reg.plugins()) rows.push_back({p, p->available(device_array.data(), device_array.size())});

  if (json) {
    Json list = Json::array();
    for (const auto& r : rows) {
      const auto& p = *r.plugin;
      list.push_back({{"loaded", true},
                      {"name", p.name()},
                      {"version", p.version()},
                      {"vendor", p.vendor()},
                      {"description", p.description()},
                      {"abi_version", p.abi_version()},
                      {"device_kinds", json_list(device_kinds_string(p.device_kinds()))},
                      {"modes", json_list(modes_string(p.modes()))},
                      {"concurrent_execution_safe", p.concurrent_execution_safe()},
                      {"available", r.availability.available},
                      {"reason", r.availability.reason},
                      {"path", p.path()}});
    }
    for (const auto& f : reg.failures()) list.push_back({{"loaded", false}, {"path", f.path}, {"error", f.message}});
    std::printf("%s\n", json_text(list, 2).c_str());
    return 0;
  }

  if (reg.searched_dirs().empty()) {
    std::printf("no plugin directories to search (use --plugin-dir DIR or KILN_PLUGIN_PATH)\n");
  } else {
    std::printf("searched:");
    for (const auto& d : reg.searched_dirs()) std::printf(" %s", d.c_str());
    std::printf("\n\n");
  }
  if (rows.empty()) std::printf("no plugins found\n");
  if (!rows.empty()) {
    std::printf("%-20s %-9s %-12s %-4s %-16s %-63s %s\n", "NAME", "VERSION", "VENDOR", "ABI", "DEVICES", "MODES",
                "AVAILABLE");
    for (const auto& r : rows) {
      const auto& p = *r.plugin;
      std::printf("%-20s %-9s %-12s %-4s %-16s %-63s %s\n", p.name().c_str(), p.version().c_str(), p.vendor().c_str(),
                  p.abi_version().c_str(), device_kinds_string(p.device_kinds()).c_str(),
                  modes_string(p.modes()).c_str(), r.availability.available ? "yes" : "no");
      std::printf("    %s\n", r.availability.reason.c_str());
      std::printf("    %s\n", p.path().c_str());
    }
  }
  if (!reg.failures().empty()) {
    std::printf("\nnot loaded:\n");
    for (const auto& f : reg.failures()) std::printf("  %s\n    %s\n", f.path.c_str(), f.message.c_str());
  }
  return 0;
}

}  // namespace kiln::cli
