// Which backend compiles the step: loads the plugins (once per process for a given plugin
// search path, cache directory and plugin options), probes the hardware, and applies the
// selection rule (selection.h) to the user's choice. The Trainer, compile_step and `kiln bench`
// all go through here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/config.h"
#include "kiln/plugin_api.h"
#include "kiln/internal/selection.h"

namespace kiln {

class LoadedPlugin;

struct ResolvedBackend {
  std::shared_ptr<const LoadedPlugin> plugin;  // null when the step runs eagerly ("eager")
  BackendChoice choice;
  KilnMode mode = KILN_MODE_DEFAULT;
  // Backends that take what `plugin` leaves ("ipex+inductor": inductor), in order, each with the
  // mode it compiles in (the step's mode, or "default" where it lacks it).
  std::vector<std::shared_ptr<const LoadedPlugin>> then;
  std::vector<KilnMode> then_modes;
  std::string name;                // what runs the step: eager, inductor, ipex+inductor
  std::vector<std::string> notes;  // mode adjustments, plugin load failures worth a word
  // Whole-step CUDA graphs (docs/backends/cudagraphs.md): asked for by mode reduce-overhead or
  // max-autotune, or by a backend with KILN_CAPABILITY_WHOLE_STEP_GRAPH, on a machine with a CUDA
  // device. graph_plugin records them: the chosen backend when it has KILN_CAPABILITY_DEVICE_GRAPHS,
  // else the available plugin with that capability and the highest score; null when there is none
  // (then cuda_graphs_reason says why and steps run uncaptured).
  bool cuda_graphs = false;
  std::shared_ptr<const LoadedPlugin> graph_plugin;
  std::string cuda_graphs_reason;
};

// Throws BackendSelectionError (a named backend that cannot run here) or ConfigError (an unknown
// mode). Thread-safe.
ResolvedBackend resolve_backend(const TrainingArguments& args);

// "reduce-overhead" -> KILN_MODE_REDUCE_OVERHEAD; throws std::invalid_argument listing the modes.
KilnMode mode_from_string(const std::string& mode);
const char* mode_to_string(KilnMode mode);

}  // namespace kiln
