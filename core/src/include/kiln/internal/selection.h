// Backend selection: which plugin compiles the training step, and why. A pure function of the
// probed devices, the installed plugins with their availability, and the user's choice; every
// decision it makes comes back as a sentence, so `kiln probe --explain` and the Trainer's log can
// say exactly why a backend was or was not used. No LibTorch.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/hardware_probe.h"

namespace kiln {

// One installed plugin as the selection sees it: a plain struct, so the rule can be tested (and
// used) without loading anything.
struct BackendCandidate {
  std::string name;
  bool available = true;
  std::string reason;  // the plugin's own words: why it can or cannot run here
  int32_t score = 0;   // its availability score here: "auto" takes the highest positive one
};

// A plugin file the loader refused (a bad table, another ABI major, init failed), by the name its
// file gives it (libkiln_<name>.so): naming that backend says why it cannot be used.
struct RefusedPlugin {
  std::string name;
  std::string path;
  std::string reason;  // the loader's words
};

struct BackendChoice {
  std::string backend;                  // the plugin to use; "eager" when none can run
  std::string requested;                // "auto" or the name the user gave
  std::vector<std::string> reasons;     // one sentence per decision, in the order taken
  std::vector<std::string> runners_up;  // the other available backends, best first
  std::vector<std::string> order;       // the order "auto" ranks the available backends in
};

// A named backend that cannot be used. what() is the whole message; available() lists the
// backends that could have been named instead.
class BackendSelectionError : public std::runtime_error {
 public:
  BackendSelectionError(const std::string& message, std::vector<std::string> available)
      : std::runtime_error(message), available_(std::move(available)) {}
  const std::vector<std::string>& available() const { return available_; }

 private:
  std::vector<std::string> available_;
};

// The order "auto" ranks backends in: the available plugins whose availability score is positive,
// highest score first, equal scores by name. The scores come from the plugins (their `available`
// answer for these devices); kiln knows no plugin by name. A plugin that scores 0 is used only
// when named.
std::vector<std::string> automatic_order(const std::vector<BackendCandidate>& plugins);

// The rule (docs/hardware-probe.md):
//  - "auto" (or ""): the first backend of automatic_order(); each plugin skipped (unavailable, or
//    score 0) adds its reason. If none is left, "eager" (the step runs uncompiled), with why.
//  - "eager": always granted.
//  - a name: used if installed and available. Installed but unavailable: BackendSelectionError
//    with the plugin's reason. Not installed: BackendSelectionError listing the available
//    backends, with "did you mean" when a name is close; when a file of that name was refused at
//    load (`refused`), with its path and the loader's reason instead.
// Logs the choice at info level with the runners-up, and each reason at debug level.
BackendChoice select_backend(const std::vector<hw::Device>& devices, const std::vector<BackendCandidate>& plugins,
                             const std::string& requested = "auto", const std::vector<RefusedPlugin>& refused = {});

// "8 × Intel Gaudi2, 1 × NVIDIA H100 80GB HBM3, CPU Intel(R) Xeon(R) ..." for messages.
std::string describe_devices(const std::vector<hw::Device>& devices);

// ---- The bridge to the plugin loader (core/src/selection/plugin_candidates.cpp) ----

struct PluginDevice;
class PluginRegistry;

// The probe's devices in the form plugins receive (KilnDeviceInfo through PluginDevice).
std::vector<PluginDevice> to_plugin_devices(const std::vector<hw::Device>& devices);
// Asks every loaded plugin whether it can run on `devices`.
std::vector<BackendCandidate> plugin_candidates(const PluginRegistry& registry, const std::vector<hw::Device>& devices);
// The files the registry refused that are named like a plugin (duplicates of a loaded name aside).
std::vector<RefusedPlugin> refused_plugins(const PluginRegistry& registry);

// ---- The `kiln probe` report ----

struct ProbeReport {
  hw::ProbeResult probe;
  std::vector<BackendCandidate> plugins;
  std::vector<std::string> plugin_notes;  // load failures, searched directories
  BackendChoice choice;
};

// {"devices": [...], "default_backend": ..., "reasons": [...], ...}; see docs/hardware-probe.md.
std::string probe_report_json(const ProbeReport& report);
// A table of devices, then the backend and why; `explain` adds every reason, the plugins and
// the probe's warnings.
std::string probe_report_text(const ProbeReport& report, bool explain);

// A composed backend's parts, in order: "ipex+inductor" -> {"ipex", "inductor"}; a name without
// '+' is itself.
std::vector<std::string> split_backends(const std::string& backend);

}  // namespace kiln
