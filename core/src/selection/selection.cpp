// The backend selection rule. Kept free of plugin loading and of LibTorch so that every branch is
// a unit test over plain structs.
#include "kiln/selection.h"

#include <algorithm>
#include <map>
#include <optional>

#include "kiln/config.h"
#include "kiln/logger.h"

namespace kiln {

namespace {

using hw::Device;
using hw::DeviceKind;

int count(const std::vector<Device>& devices, DeviceKind kind) {
  return static_cast<int>(std::count_if(devices.begin(), devices.end(),
                                        [&](const Device& d) { return d.kind == kind; }));
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

std::string plural(int n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
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
std::vector<std::string> runners_up(const std::vector<std::string>& order,
                                    const std::vector<BackendCandidate>& plugins,
                                    const std::string& chosen) {
  std::vector<std::string> out;
  for (const auto& name : order) {
    const auto* p = find(plugins, name);
    if (p && p->available && name != chosen) out.push_back(name);
  }
  auto rest = available_names(plugins);
  std::sort(rest.begin(), rest.end());
  for (const auto& name : rest)
    if (name != chosen && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  return out;
}

// Why this order, in one sentence.
std::string order_reason(const std::vector<Device>& devices, const std::vector<std::string>& order) {
  const int gaudi = count(devices, DeviceKind::gaudi);
  const int neuron = count(devices, DeviceKind::neuron);
  const int cuda = count(devices, DeviceKind::cuda);
  std::string why;
  if (gaudi > 0) {
    why = "found " + plural(gaudi, "Intel Gaudi device", "Intel Gaudi devices") + " (" +
          group(devices, DeviceKind::gaudi) + "), so hpu_backend comes first";
    if (neuron > 0) why += ", then neuron for the " + group(devices, DeviceKind::neuron);
  } else if (neuron > 0) {
    why = "found " + plural(neuron, "AWS Neuron device", "AWS Neuron devices") + " (" +
          group(devices, DeviceKind::neuron) + "), so neuron comes first";
  } else if (cuda > 0) {
    why = "found " + plural(cuda, "CUDA GPU", "CUDA GPUs") + " (" + group(devices, DeviceKind::cuda) +
          ") and no Gaudi or Neuron device, so inductor comes first";
  } else {
    why = "no CUDA GPU, Gaudi or Neuron device found, so inductor (on the CPU) comes first";
  }
  return why + "; order: " + join(order);
}

void log_choice(const BackendChoice& c) {
  auto log = logger();
  for (const auto& r : c.reasons) log->debug("backend selection: {}", r);
  log->info("backend: {} ({}); runners-up: {}", c.backend,
            c.requested == "auto" ? "chosen automatically" : "named by the user",
            c.runners_up.empty() ? std::string("none") : join(c.runners_up));
}

}  // namespace

std::vector<std::string> default_backend_order(const std::vector<hw::Device>& devices) {
  std::vector<std::string> order;
  if (count(devices, DeviceKind::gaudi) > 0) order.push_back("hpu_backend");
  if (count(devices, DeviceKind::neuron) > 0) order.push_back("neuron");
  order.push_back("inductor");
  // Without inductor, a GPU still gains from replaying the step as a CUDA graph; a CPU from
  // oneDNN's fused kernels.
  order.push_back(count(devices, DeviceKind::cuda) > 0 ? "cudagraphs" : "ipex");
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

BackendChoice select_backend(const std::vector<hw::Device>& devices,
                             const std::vector<BackendCandidate>& plugins, const std::string& requested) {
  BackendChoice c;
  c.requested = requested.empty() ? "auto" : requested;
  c.order = default_backend_order(devices);

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
      c.reasons.push_back(p->name + " was named and is available" +
                          (p->reason.empty() ? "" : ": " + p->reason));
      c.runners_up = runners_up(c.order, plugins, c.backend);
      log_choice(c);
      return c;
    }
    const std::string list = available.empty() ? "none" : join(available);
    if (p) {
      throw BackendSelectionError(
          "backend '" + p->name + "' was named but is unavailable here: " +
              (p->reason.empty() ? "the plugin gave no reason" : p->reason) +
              ". Available backends: " + list + " (or \"auto\" to pick one)",
          available);
    }
    std::vector<std::string> known;
    for (const auto& q : plugins) known.push_back(q.name);
    for (const auto& b : builtin_backends()) known.push_back(b);
    known.push_back("eager");
    std::string msg;
    const bool in_tree = std::find(builtin_backends().begin(), builtin_backends().end(), c.requested) !=
                         builtin_backends().end();
    if (in_tree)
      msg = "backend '" + c.requested + "' is not installed (no plugin of that name was found)";
    else
      msg = "unknown backend '" + c.requested + "'";
    std::optional<std::string> near;
    if (!in_tree) near = nearest_name(c.requested, known);
    msg += near ? "; did you mean '" + *near + "'? " : ". ";
    msg += "Available backends: " + list + " (or \"auto\" to pick one)";
    throw BackendSelectionError(msg, available);
  }

  c.reasons.push_back(order_reason(devices, c.order));
  for (const auto& name : c.order) {
    const auto* p = find(plugins, name);
    if (!p) {
      c.reasons.push_back("skipped " + name + ": not installed (no plugin of that name was found)");
      continue;
    }
    if (!p->available) {
      c.reasons.push_back("skipped " + name + ": installed but unavailable here (" +
                          (p->reason.empty() ? "the plugin gave no reason" : p->reason) + ")");
      continue;
    }
    c.backend = name;
    c.reasons.push_back("chose " + name + ": installed and available" +
                        (p->reason.empty() ? "" : " (" + p->reason + ")"));
    break;
  }
  if (c.backend.empty()) {
    c.backend = "eager";
    c.reasons.push_back("no backend in the order is available, so steps run eagerly (uncompiled); "
                        "install or fix one of: " + join(c.order));
  }
  c.runners_up = runners_up(c.order, plugins, c.backend);
  log_choice(c);
  return c;
}

}  // namespace kiln
