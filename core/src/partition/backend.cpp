#include "kiln/internal/backend.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <stdexcept>

#include <c10/util/StringUtil.h>

#include "kiln/hardware_probe.h"
#include "kiln/internal/host_services.h"
#include "kiln/log.h"
#include "kiln/internal/plugin_registry.h"

namespace kiln {
namespace {

struct LoadedBackends {
  std::shared_ptr<HostServices> host;
  std::shared_ptr<PluginRegistry> registry;
  std::vector<hw::Device> devices;
  std::vector<BackendCandidate> candidates;
  std::vector<RefusedPlugin> refused;  // files found and refused, to say why a named one is missing
};

// Plugins stay loaded for the life of the process: compiled steps hold their executables.
const LoadedBackends& loaded_backends(const TrainingArguments& args) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<LoadedBackends>> cache;
  std::string key = args.runtime.cache_dir + "\n";
  for (const auto& d : args.runtime.plugin_dirs) key += d + ":";
  for (const auto& [plugin, opts] : args.plugin_options)
    for (const auto& [k, v] : opts) key += "\n" + plugin + "." + k + "=" + v;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[key];
  if (!slot) {
    auto lb = std::make_shared<LoadedBackends>();
    lb->host = torch_host_services(args);
    lb->registry = std::make_shared<PluginRegistry>(PluginRegistry::load(args, lb->host));
    for (const auto& f : lb->registry->failures()) log_debug(c10::str("plugin not loaded: ", f.path, ": ", f.message));
    lb->devices = hw::probe({}).devices;
    lb->candidates = plugin_candidates(*lb->registry, lb->devices);
    lb->refused = refused_plugins(*lb->registry);
    slot = lb;
  }
  return *slot;
}

// The plugin that records whole-step graphs for a backend that cannot: of the available plugins
// that record device graphs, the one with the highest score, then the first name in byte order.
std::shared_ptr<const LoadedPlugin> graph_recorder(const LoadedBackends& lb) {
  const BackendCandidate* best = nullptr;
  for (const auto& c : lb.candidates) {
    auto p = lb.registry->find(c.name);
    if (!c.available || !p || !p->provides_device_graphs()) continue;
    if (!best || c.score > best->score || (c.score == best->score && c.name < best->name)) best = &c;
  }
  return best ? lb.registry->find(best->name) : nullptr;
}

}  // namespace

KilnMode mode_from_string(const std::string& mode) {
  if (mode == "default") return KILN_MODE_DEFAULT;
  if (mode == "reduce-overhead") return KILN_MODE_REDUCE_OVERHEAD;
  if (mode == "max-autotune") return KILN_MODE_MAX_AUTOTUNE;
  if (mode == "max-autotune-no-cudagraphs") return KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS;
  throw std::invalid_argument("unknown mode '" + mode +
                              "'; valid modes: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs");
}

const char* mode_to_string(KilnMode mode) {
  switch (mode) {
    case KILN_MODE_REDUCE_OVERHEAD: return "reduce-overhead";
    case KILN_MODE_MAX_AUTOTUNE: return "max-autotune";
    case KILN_MODE_MAX_AUTOTUNE_NO_CUDAGRAPHS: return "max-autotune-no-cudagraphs";
    default: return "default";
  }
}

ResolvedBackend resolve_backend(const TrainingArguments& args) {
  ResolvedBackend r;
  r.mode = mode_from_string(args.torch_compile_mode);
  const LoadedBackends& lb = loaded_backends(args);
  // A name no plugin answers to is a configuration error that says where the name was set
  // (file:line, environment variable or code), with "did you mean".
  if (args.torch_compile_backend != "auto" && args.torch_compile_backend != "eager") {
    auto names = lb.registry->names();
    names.push_back("eager");
    std::map<std::string, std::string> refused;
    for (const auto& f : lb.refused) refused.emplace(f.name, f.path + ": " + f.reason);
    args.validate_backend(names, refused);
  }
  // "a+b": backend a, then b for the nodes a does not claim (each must be available here).
  const std::vector<std::string> parts = split_backends(args.torch_compile_backend);
  r.choice = select_backend(lb.devices, lb.candidates, parts.front(), lb.refused);
  if (r.choice.backend != "eager") r.plugin = lb.registry->find(r.choice.backend);
  for (size_t k = 1; k < parts.size(); ++k) {
    const BackendChoice c = select_backend(lb.devices, lb.candidates, parts[k], lb.refused);
    auto p = lb.registry->find(c.backend);
    if (!p || p == r.plugin || std::find(r.then.begin(), r.then.end(), p) != r.then.end())
      throw BackendSelectionError("backend '" + args.torch_compile_backend + "' names '" + parts[k] + "' twice",
                                  lb.registry->names());
    r.then.push_back(p);
    r.choice.reasons.push_back(c.backend + " takes the nodes the backends before it leave");
  }
  r.name = r.choice.backend;
  for (const auto& p : r.then) r.name += "+" + p->name();
  const bool has_cuda = std::any_of(lb.devices.begin(), lb.devices.end(),
                                    [](const hw::Device& d) { return d.kind == hw::DeviceKind::cuda; });
  if (!has_cuda && r.mode == KILN_MODE_REDUCE_OVERHEAD) {
    r.notes.push_back(
        "mode 'reduce-overhead' wraps the step in a CUDA graph, which needs a CUDA GPU; there is "
        "none here, so it behaves as 'default'");
    r.mode = KILN_MODE_DEFAULT;
  }
  // Whole-step CUDA graphs, whatever the backend does inside the step: asked for by the mode, or by
  // a backend whose descriptor says that choosing it means a whole-step graph.
  const bool backend_asks = r.plugin && r.plugin->asks_whole_step_graph();
  const bool graphs_asked = r.mode == KILN_MODE_REDUCE_OVERHEAD || r.mode == KILN_MODE_MAX_AUTOTUNE || backend_asks;
  if (graphs_asked && has_cuda) {
    if (r.plugin && r.plugin->provides_device_graphs()) r.graph_plugin = r.plugin;
    else r.graph_plugin = graph_recorder(lb);
    r.cuda_graphs = r.graph_plugin != nullptr;
    if (!r.cuda_graphs) {
      r.cuda_graphs_reason =
          "no loaded plugin that is available here records device graphs "
          "(KILN_CAPABILITY_DEVICE_GRAPHS)";
      r.notes.push_back(c10::str(
          backend_asks ? "backend '" + r.plugin->name() + "'" : "mode '" + std::string(mode_to_string(r.mode)) + "'",
          " wraps the step in a CUDA graph, but ", r.cuda_graphs_reason, "; the step runs without one"));
    }
  } else if (backend_asks && !has_cuda) {
    r.cuda_graphs_reason = "no CUDA device";
  }
  for (const auto& p : r.then) {
    KilnMode m = r.mode;
    if (!p->supports_mode(m)) {
      r.notes.push_back(c10::str("backend '", p->name(), "' does not support mode '", mode_to_string(m),
                                 "'; its groups compile in 'default'"));
      m = KILN_MODE_DEFAULT;
    }
    r.then_modes.push_back(m);
  }
  if (r.plugin && !r.plugin->supports_mode(r.mode)) {
    r.notes.push_back(c10::str("backend '", r.plugin->name(), "' does not support mode '", args.torch_compile_mode,
                               "'; using 'default'"));
    r.mode = KILN_MODE_DEFAULT;
  }
  return r;
}

}  // namespace kiln
