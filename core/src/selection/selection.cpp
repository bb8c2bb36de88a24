// The backend selection rule. Kept free of plugin loading and of LibTorch so that every branch is
// a unit test over plain structs.
#include "kiln/internal/selection.h"

#include <algorithm>
#include <map>
#include <optional>

#include "kiln/config.h"
#include "kiln/internal/logger.h"

namespace kiln {

namespace {

using hw::Device;
using hw::DeviceKind;

int count(const std::vector<Device>& devices, DeviceKind kind) {
  return static_cast<int>(
      std::count_if(devices.begin(), devices.end(), [&](const Device& d) { return d.kind == kind; }));
}

std::string join(const std::vector<std::string>& v, const std::string& sep = ", ") {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// "8 × Intel Gaudi2" or "Intel Gaudi2, Intel Gaudi" for the devices of one kind.
std::string group(const std::vector<Device>& devices, DeviceKind kind) {
  std::vector<std::pair<std::string, int>> names;
  for (const auto& d : devices) {
    if (d.kind != kind) continue;
    auto it = std::find_if(names.begin(), names.end(), [&](const auto& p) { return p.first == d.name; });
    if (it == names.end()) names.push_back({d.name, 1});
    else ++it->second;
  }
  std::vector<std::string> parts;
  for (const auto& [name, n] : names) parts.push_back(n > 1 ? std::to_string(n) + " × " + name : name);
  return join(parts);
}

const BackendCandidate* find(const std::vector<BackendCandidate>& plugins, const std::string& name) {
  for (const auto& p : plugins)
    if (p.name == name) return &p;  // the loader keeps the first of a name; so does this
  return nullptr;
}

std::vector<std::string> available_names(const std::vector<BackendCandidate>& plugins) {
  std::vector<std::string> out;
  for (const auto& p : plugins)
    if (p.available && std::find(out.begin(), out.end(), p.name) == out.end()) out.push_back(p.name);
  return out;
}

// The other available backends, in the auto order first, then any others by name.
std::vector<std::string> runners_up(const std::vector<std::string>& order, const std::vector<BackendCandidate>& plugins,
                                    const std::string& chosen) {
  std::vector<std::string> out;
  for (const auto& name : order)
    if (name != chosen) out.push_back(name);
  auto rest = available_names(plugins);
  std::sort(rest.begin(), rest.end());
  for (const auto& name : rest)
    if (name != chosen && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  return out;
}

// Why this order, in one sentence.
std::string order_reason(const std::vector<Device>& devices, const std::vector<BackendCandidate>& plugins,
                         const std::vector<std::string>& order) {
  std::vector<std::string> ranked, named_only;
  for (const auto& name : order) ranked.push_back(name + " " + std::to_string(find(plugins, name)->score));
  for (const auto& p : plugins)
    if (find(plugins, p.name) == &p && p.available && p.score <= 0) named_only.push_back(p.name);
  std::string why = "ranked the available backends by the score each gave for " + describe_devices(devices) + ": " +
                    (ranked.empty() ? std::string("none has a positive score") : join(ranked));
  if (!named_only.empty()) why += "; used only when named (score 0): " + join(named_only);
  return why;
}

void log_choice(const BackendChoice& c) {
  auto log = logger();
  for (const auto& r : c.reasons) log->debug("backend selection: {}", r);
  log->info("backend: {} ({}); runners-up: {}", c.backend,
            c.requested == "auto" ? "chosen automatically" : "named by the user",
            c.runners_up.empty() ? std::string("none") : join(c.runners_up));
}

}  // namespace

std::vector<std::string> automatic_order(const std::vector<BackendCandidate>& plugins) {
  std::vector<const BackendCandidate*> ranked;
  for (const auto& p : plugins)
    if (find(plugins, p.name) == &p && p.available && p.score > 0) ranked.push_back(&p);
  // Highest score first; equal scores by name, so the choice never depends on load order.
  std::sort(ranked.begin(), ranked.end(), [](const BackendCandidate* a, const BackendCandidate* b) {
    return a->score != b->score ? a->score > b->score : a->name < b->name;
  });
  std::vector<std::string> order;
  for (const auto* p : ranked) order.push_back(p->name);
  return order;
}

std::string describe_devices(const std::vector<hw::Device>& devices) {
  std::vector<std::string> parts;
  for (DeviceKind k : {DeviceKind::cuda, DeviceKind::gaudi, DeviceKind::neuron})
    if (count(devices, k) > 0) parts.push_back(group(devices, k));
  for (const auto& d : devices)
    if (d.kind == DeviceKind::cpu) parts.push_back("CPU " + d.name);
  return parts.empty() ? "no devices" : join(parts);
}

BackendChoice select_backend(const std::vector<hw::Device>& devices, const std::vector<BackendCandidate>& plugins,
                             const std::string& requested, const std::vector<RefusedPlugin>& refused) {
  BackendChoice c;
  c.requested = requested.empty() ? "auto" : requested;
  c.order = automatic_order(plugins);

  if (c.requested == "eager") {
    c.backend = "eager";
    c.reasons.push_back("eager was named: every step runs uncompiled through ATen");
    c.runners_up = runners_up(c.order, plugins, "");
    log_choice(c);
    return c;
  }

  if (c.requested != "auto") {
    const auto available = available_names(plugins);
    const auto* p = find(plugins, c.requested);
    if (p && p->available) {
      c.backend = p->name;
      c.reasons.push_back(p->name + " was named and is available" + (p->reason.empty() ? "" : ": " + p->reason));
      c.runners_up = runners_up(c.order, plugins, c.backend);
      log_choice(c);
      return c;
    }
    const std::string list = available.empty() ? "none" : join(available);
    if (p) {
      throw BackendSelectionError("backend '" + p->name + "' was named but is unavailable here: " +
                                      (p->reason.empty() ? "the plugin gave no reason" : p->reason) +
                                      ". Available backends: " + list + " (or \"auto\" to pick one)",
                                  available);
    }
    std::vector<std::string> known;
    for (const auto& q : plugins) known.push_back(q.name);
    for (const auto& b : builtin_backends()) known.push_back(b);
    known.push_back("eager");
    std::string msg;
    const bool in_tree =
        std::find(builtin_backends().begin(), builtin_backends().end(), c.requested) != builtin_backends().end();
    const auto bad =
        std::find_if(refused.begin(), refused.end(), [&](const RefusedPlugin& r) { return r.name == c.requested; });
    if (bad != refused.end()) {
      throw BackendSelectionError("backend '" + c.requested + "' was found, but kiln refused its plugin file " +
                                      bad->path + ": " + bad->reason + ". Available backends: " + list +
                                      " (or \"auto\" to pick one)",
                                  available);
    }
    if (in_tree) msg = "backend '" + c.requested + "' is not installed (no plugin of that name was found)";
    else msg = "unknown backend '" + c.requested + "'";
    std::optional<std::string> near;
    if (!in_tree) near = nearest_name(c.requested, known);
    msg += near ? "; did you mean '" + *near + "'? " : ". ";
    msg += "Available backends: " + list + " (or \"auto\" to pick one)";
    throw BackendSelectionError(msg, available);
  }

  c.reasons.push_back(order_reason(devices, plugins, c.order));
  for (const auto& p : plugins) {
    if (find(plugins, p.name) != &p) continue;  // a second plugin of a name is never used
    if (!p.available)
      c.reasons.push_back("skipped " + p.name + ": installed but unavailable here (" +
                          (p.reason.empty() ? "the plugin gave no reason" : p.reason) + ")");
  }
  if (!c.order.empty()) {
    c.backend = c.order.front();
    const auto* p = find(plugins, c.backend);
    c.reasons.push_back("chose " + c.backend + ": installed and available" +
                        (p->reason.empty() ? "" : " (" + p->reason + ")"));
  } else {
    c.backend = "eager";
    c.reasons.push_back(
        "no installed plugin is available here with a positive score, so steps run eagerly "
        "(uncompiled); install or fix a backend for " +
        describe_devices(devices) + ", or name one");
  }
  c.runners_up = runners_up(c.order, plugins, c.backend);
  log_choice(c);
  return c;
}

std::vector<std::string> split_backends(const std::string& backend) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t plus = backend.find('+', start);
    parts.push_back(backend.substr(start, plus == std::string::npos ? std::string::npos : plus - start));
    if (plus == std::string::npos) break;
    start = plus + 1;
  }
  return parts;
}

}  // namespace kiln
